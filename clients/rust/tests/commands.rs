//! Every reply and status of every command, through `Idem`'s commands (the
//! edition the server has) and the module's connection traits, sync and
//! async.
mod common;

use common::*;
use redis_idem_client::*;
use std::time::Duration;

const LEASE: Duration = Duration::from_secs(30);

fn token(claim: &Claim) -> String {
    claim.token().unwrap_or_else(|| panic!("a granted claim, not {claim:?}")).to_string()
}

#[test]
fn every_claim_status_done_release_extend_get_once() {
    let server = Server::start();
    let idem = Idem::new(server.client()).unwrap();
    let expected = if server.functions { Edition::Functions } else { Edition::Module };
    assert_eq!(idem.edition(), expected);
    let plain = ClaimOptions::new();

    // NEW, BUSY, DONE with the result, DONE 0 for a second completion.
    let new = idem.claim("k1", LEASE, &plain).unwrap();
    assert!(matches!(new, Claim::New { attempt: 1, .. }), "{new:?}");
    let busy = idem.claim("k1", LEASE, &plain).unwrap();
    let Claim::Busy { lease_left, attempt: 1 } = busy else { panic!("{busy:?}") };
    assert!(lease_left > Duration::from_secs(25) && lease_left <= LEASE, "{lease_left:?}");
    let done = idem.done("k1", &token(&new), &DoneOptions::new().result("r1")).unwrap();
    assert_eq!(done, Done::Completed { result_dropped: false, bloom_dropped: false });
    assert_eq!(idem.claim("k1", LEASE, &plain).unwrap(), Claim::Done { result: Some(b"r1".to_vec()), attempt: 1 });
    assert_eq!(idem.done("k1", &token(&new), &DoneOptions::new()).unwrap(), Done::AlreadyDone);

    // RELEASE 1 then 0, RETRY with attempt 2, STALE for the old token.
    let first = idem.claim("k2", LEASE, &plain).unwrap();
    assert!(idem.release("k2", &token(&first)).unwrap());
    assert!(!idem.release("k2", &token(&first)).unwrap());
    let retry = idem.claim("k2", LEASE, &plain).unwrap();
    assert!(matches!(retry, Claim::Retry { attempt: 2, .. }), "{retry:?}");
    assert!(matches!(idem.done("k2", &token(&first), &DoneOptions::new()), Err(Error::Stale(_))));
    assert!(matches!(idem.extend("k2", &token(&first), LEASE), Err(Error::Stale(_))));
    idem.extend("k2", &token(&retry), Duration::from_secs(100)).unwrap();

    // GET: processing with the extended lease, then done with its result.
    let record = idem.get("k2").unwrap().expect("a record");
    assert_eq!((record.state, record.attempt, record.result.as_deref()), (RecordState::Processing, 2, None));
    assert!(record.lease_left > Duration::from_secs(95), "{record:?}");
    assert!(record.claimed_at.is_some() && record.done_at.is_none() && record.ttl.is_some());
    idem.done("k2", &token(&retry), &DoneOptions::new().result("r2").retain(Duration::from_secs(50))).unwrap();
    let record = idem.get("k2").unwrap().unwrap();
    assert_eq!((record.state, record.result.as_deref()), (RecordState::Done, Some(&b"r2"[..])));
    assert!(record.done_at.is_some() && record.ttl.unwrap() <= Duration::from_secs(50));
    assert_eq!(idem.get("absent").unwrap(), None);

    // MISMATCH with another payload, EXHAUSTED past MAXTRIES, expired.
    let paid = idem.claim("k3", LEASE, &ClaimOptions::new().payload("a").max_tries(1)).unwrap();
    let fingerprint = idem.get("k3").unwrap().unwrap().fingerprint.expect("a fingerprint");
    assert_eq!(fingerprint.len(), 32);
    assert_eq!(idem.claim("k3", LEASE, &ClaimOptions::new().payload("b")).unwrap(), Claim::Mismatch { attempt: 1 });
    idem.release("k3", &token(&paid)).unwrap();
    assert_eq!(idem.get("k3").unwrap().unwrap().state, RecordState::Released);
    assert_eq!(
        idem.claim("k3", LEASE, &ClaimOptions::new().payload("a").max_tries(1)).unwrap(),
        Claim::Exhausted { attempt: 1 }
    );
    let short = idem.claim("k4", Duration::from_secs(1), &plain).unwrap();
    eventually(Duration::from_secs(3), "the lease lapses", || {
        idem.get("k4").unwrap().unwrap().state == RecordState::Expired
    });
    // A lapsed lease nobody claimed since: EXTEND and DONE still work.
    idem.extend("k4", &token(&short), LEASE).unwrap();
    assert!(idem.done("k4", &token(&short), &DoneOptions::new()).unwrap().completed());

    // ONCE 1 then 0; an empty result replays as empty.
    assert!(idem.once("k5", LEASE).unwrap());
    assert!(!idem.once("k5", LEASE).unwrap());
    assert_eq!(idem.get("k5").unwrap().unwrap().claimed_at, None);
    let empty = idem.claim("k6", LEASE, &plain).unwrap();
    idem.done("k6", &token(&empty), &DoneOptions::new().result("")).unwrap();
    assert_eq!(idem.claim("k6", LEASE, &plain).unwrap(), Claim::Done { result: Some(vec![]), attempt: 1 });

    // Another type's key: WRONGTYPE as a redis error.
    let _: () = redis::cmd("SET").arg("plain").arg("x").query(&mut server.conn()).unwrap();
    let wrong = idem.claim("plain", LEASE, &plain).unwrap_err();
    assert!(matches!(&wrong, Error::WrongType(_)), "{wrong:?}");
}

#[test]
fn get_decodes_resp2_and_resp3_alike() {
    let server = Server::start();
    let resp2 = Idem::new(server.client()).unwrap();
    resp2.claim("g", LEASE, &ClaimOptions::new().payload("p")).unwrap();
    let resp3 = Idem::new(redis::Client::open(format!("{}?protocol=resp3", server.url())).unwrap()).unwrap();
    let (resp2, resp3) = (resp2.get("g").unwrap().unwrap(), resp3.get("g").unwrap().unwrap());
    assert_eq!((resp2.state, resp2.attempt, &resp2.fingerprint), (resp3.state, resp3.attempt, &resp3.fingerprint));
    assert_eq!(resp2.claimed_at, resp3.claimed_at);
}

#[test]
fn done_codes_decode_with_the_dropped_parts() {
    assert_eq!(Done::from_code(0), Some(Done::AlreadyDone));
    assert_eq!(Done::from_code(1), Some(Done::Completed { result_dropped: false, bloom_dropped: false }));
    assert_eq!(Done::from_code(3), Some(Done::Completed { result_dropped: true, bloom_dropped: false }));
    assert_eq!(Done::from_code(5), Some(Done::Completed { result_dropped: false, bloom_dropped: true }));
    assert_eq!(Done::from_code(7), Some(Done::Completed { result_dropped: true, bloom_dropped: true }));
    assert_eq!(Done::from_code(2), None);
}

/// The module's DONE answers 3, 5 and 7 for real: memory over maxmemory
/// drops the RESULT, a filter key of another type drops the BLOOM add.
/// The Functions edition never drops a result and has no BLOOM: it refuses
/// BLOOM with an error naming the module.
#[test]
fn done_reports_what_it_dropped_and_seen_comes_from_the_filter() {
    let server = Server::start();
    let idem = Idem::new(server.client()).unwrap();
    let plain = ClaimOptions::new();
    if server.functions {
        let refused = idem.claim("s", LEASE, &ClaimOptions::new().bloom("f")).unwrap_err();
        assert!(
            matches!(&refused, Error::ModuleRequired(m) if m.contains("BLOOM needs the redis-idem module")),
            "{refused:?}"
        );
        let refused = idem.claim("s", LEASE, &ClaimOptions::new().wait(Duration::from_secs(1))).unwrap_err();
        assert!(matches!(&refused, Error::ModuleRequired(m) if m.contains("WAIT")), "{refused:?}");
        return;
    }
    let mut con = server.conn();
    let _: () = redis::cmd("SET").arg("not-a-filter").arg("x").query(&mut con).unwrap();
    let claim = con.idem_claim("d5", LEASE, &plain).unwrap();
    let five = con.idem_done("d5", &token(&claim), &DoneOptions::new().result("r").bloom("not-a-filter")).unwrap();
    assert_eq!(five, Done::Completed { result_dropped: false, bloom_dropped: true });

    let (c3, c7) = (con.idem_claim("d3", LEASE, &plain).unwrap(), con.idem_claim("d7", LEASE, &plain).unwrap());
    server.config_set("maxmemory", "1");
    let three = con.idem_done("d3", &token(&c3), &DoneOptions::new().result("r")).unwrap();
    let seven = con.idem_done("d7", &token(&c7), &DoneOptions::new().result("r").bloom("not-a-filter")).unwrap();
    server.config_set("maxmemory", "0");
    assert_eq!(three, Done::Completed { result_dropped: true, bloom_dropped: false });
    assert_eq!(seven, Done::Completed { result_dropped: true, bloom_dropped: true });
    assert_eq!(con.idem_claim("d3", LEASE, &plain).unwrap(), Claim::Done { result: None, attempt: 1 });

    // SEEN: the key's record is gone but the filter remembers it.
    let claim = con.idem_claim("s", LEASE, &ClaimOptions::new().bloom("{f}")).unwrap();
    con.idem_done("s", &token(&claim), &DoneOptions::new().bloom("{f}")).unwrap();
    let _: () = redis::cmd("DEL").arg("s").query(&mut con).unwrap();
    let seen = con.idem_claim("s", LEASE, &ClaimOptions::new().bloom("{f}")).unwrap();
    assert!(matches!(seen, Claim::Seen { attempt: 1, .. }), "{seen:?}");

    // The traits' other commands.
    assert!(con.idem_once("o", LEASE).unwrap());
    assert_eq!(con.idem_get("o").unwrap().unwrap().state, RecordState::Done);
    let c = con.idem_claim("r", LEASE, &plain).unwrap();
    con.idem_extend("r", &token(&c), LEASE).unwrap();
    assert!(con.idem_release("r", &token(&c)).unwrap());
}

/// WAIT: a copy blocked on a busy key gets the holder's result.
#[test]
fn wait_gets_the_holders_result_or_refuses_clearly() {
    let server = Server::start();
    let idem = Idem::new(server.client()).unwrap();
    let holder = idem.claim("w", LEASE, &ClaimOptions::new()).unwrap();
    let wait = ClaimOptions::new().wait(Duration::from_secs(10));
    if server.functions {
        assert!(matches!(idem.claim("w", LEASE, &wait), Err(Error::ModuleRequired(_))));
        return;
    }
    std::thread::scope(|scope| {
        let waiter = scope.spawn(|| idem.claim("w", LEASE, &wait).unwrap());
        eventually(Duration::from_secs(5), "the copy waits", || server.info_count("clients", "blocked_clients") == 1);
        idem.done("w", &token(&holder), &DoneOptions::new().result("theirs")).unwrap();
        assert_eq!(waiter.join().unwrap(), Claim::Done { result: Some(b"theirs".to_vec()), attempt: 1 });
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_commands_answer_as_the_sync_ones() {
    let server = Server::start();
    let idem = AsyncIdem::new(server.client()).await.unwrap();
    let plain = ClaimOptions::new();
    let new = idem.claim("a1", LEASE, &plain).await.unwrap();
    assert!(matches!(new, Claim::New { attempt: 1, .. }));
    assert!(matches!(idem.claim("a1", LEASE, &plain).await.unwrap(), Claim::Busy { attempt: 1, .. }));
    idem.extend("a1", &token(&new), LEASE).await.unwrap();
    assert_eq!(idem.get("a1").await.unwrap().unwrap().state, RecordState::Processing);
    assert!(idem.release("a1", &token(&new)).await.unwrap());
    let retry = idem.claim("a1", LEASE, &plain).await.unwrap();
    assert!(matches!(retry, Claim::Retry { attempt: 2, .. }));
    assert!(matches!(idem.done("a1", &token(&new), &DoneOptions::new()).await, Err(Error::Stale(_))));
    assert!(idem.done("a1", &token(&retry), &DoneOptions::new().result("x")).await.unwrap().completed());
    assert_eq!(idem.claim("a1", LEASE, &plain).await.unwrap(), Claim::Done { result: Some(b"x".to_vec()), attempt: 2 });
    assert!(idem.once("a2", LEASE).await.unwrap());
    assert!(!idem.once("a2", LEASE).await.unwrap());

    if server.functions {
        assert!(matches!(
            idem.claim("a3", LEASE, &plain.clone().wait(Duration::from_secs(1))).await,
            Err(Error::ModuleRequired(_))
        ));
        return;
    }
    // The async traits on a multiplexed connection, and a WAIT that does
    // not hold up the shared connection.
    let mut con = server.client().get_multiplexed_async_connection().await.unwrap();
    let held = con.idem_claim("a3", LEASE, &plain).await.unwrap();
    let waiter = {
        let idem = idem.clone();
        tokio::spawn(async move { idem.claim("a3", LEASE, &ClaimOptions::new().wait(Duration::from_secs(10))).await })
    };
    while server.info_count("clients", "blocked_clients") == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(idem.get("a3").await.unwrap().is_some(), "the shared connection answers while a claim waits");
    assert!(con.idem_done("a3", &token(&held), &DoneOptions::new().result("y")).await.unwrap().completed());
    assert_eq!(waiter.await.unwrap().unwrap(), Claim::Done { result: Some(b"y".to_vec()), attempt: 1 });
    assert!(con.idem_once("a4", LEASE).await.unwrap());
    assert_eq!(con.idem_get("a4").await.unwrap().unwrap().attempt, 0);
    let c = con.idem_claim("a5", LEASE, &plain).await.unwrap();
    con.idem_extend("a5", &token(&c), LEASE).await.unwrap();
    assert!(con.idem_release("a5", &token(&c)).await.unwrap());
}

#[test]
fn no_edition_on_the_server_is_a_clear_error() {
    let server = Server::launch(true, &[]);
    let _: () = redis::cmd("FUNCTION").arg("FLUSH").query(&mut server.conn()).unwrap();
    let error = Idem::new(server.client()).unwrap_err();
    assert!(matches!(error, Error::NotInstalled), "{error:?}");
    assert!(error.to_string().contains("FUNCTION LOAD"));
}
