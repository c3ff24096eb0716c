//! The Functions edition (no module, functions/idem.lua loaded), in every
//! run of the suite: the client finds it by asking the server, offers the
//! same API, polls a busy key with backoff instead of WAIT, falls back to
//! single calls for batches, and refuses what a function cannot do with an
//! error naming the module.
mod common;

use common::*;
use redis_idem_client::*;
use std::time::Duration;

#[test]
fn the_same_api_on_the_functions_edition() {
    let server = Server::functions();
    let idem = Idem::new(server.client()).unwrap();
    assert_eq!(idem.edition(), Edition::Functions);
    let outcome =
        idem.process_with("f", &ProcessOptions::new().payload("p"), |a: &Job| Ok::<_, String>(a.attempt())).unwrap();
    assert!(matches!(outcome, Outcome::Completed { value: 1, status: Granted::New, .. }), "{outcome:?}");
    assert!(idem.process("f", |_: &Job| Err::<u64, _>("not run")).unwrap().is_replay());
    let record = idem.get("f").unwrap().unwrap();
    assert_eq!((record.state, record.result.as_deref()), (RecordState::Done, Some(&b"1"[..])));
    // The record is the library's packed string (docs/functions.md, "A
    // record"), not the module's type.
    let kind: String = redis::cmd("TYPE").arg("f").query(&mut server.conn()).unwrap();
    assert_eq!(kind, "string");

    // A copy in flight polls until the holder is done.
    let (first, copy) = std::thread::scope(|scope| {
        let first = scope.spawn(|| {
            idem.process("busy", |_: &Job| {
                eventually(Duration::from_secs(5), "the copy polls", || idem.stats().waits == 1);
                std::thread::sleep(Duration::from_millis(300));
                Ok::<_, String>("first".to_string())
            })
        });
        eventually(Duration::from_secs(5), "the first claims", || idem.stats().first_runs == 2);
        let copy = idem.process("busy", |_: &Job| Err::<String, _>("not run"));
        (first.join().unwrap().unwrap(), copy.unwrap())
    });
    assert!(!first.is_replay());
    assert_eq!(copy.into_value().as_deref(), Some("first"));
    let polls = server.calls("fcall");
    assert!(polls < 40, "polled with backoff, not in a busy loop: {polls} FCALLs");
}

#[test]
fn what_a_function_cannot_do_is_refused_naming_the_module() {
    let server = Server::functions();
    let idem = Idem::new(server.client()).unwrap();
    for (what, error) in [
        ("BLOOM", idem.claim("k", Duration::from_secs(5), &ClaimOptions::new().bloom("f")).unwrap_err()),
        (
            "WAIT",
            idem.claim("k", Duration::from_secs(5), &ClaimOptions::new().wait(Duration::from_secs(1))).unwrap_err(),
        ),
        ("BLOOM", idem.done("k", "t", &DoneOptions::new().bloom("f")).unwrap_err()),
    ] {
        assert!(matches!(&error, Error::ModuleRequired(m) if m.contains(what) && m.contains("module")), "{error:?}");
    }
    let bloom = Idem::with_options(server.client(), Options::new().bloom("f")).unwrap();
    let error = bloom.process("k", |_: &Job| Ok::<_, String>(1)).unwrap_err();
    assert!(matches!(error.idem(), Some(Error::ModuleRequired(_))), "{error:?}");
    // IDEM.MCLAIM is unknown here (ModuleRequired), and the library's batch
    // stub answers an error naming the module.
    let mut con = server.conn();
    let stub = redis::cmd("FCALL").arg("idem_mclaim").arg(1).arg("k").arg(30).to_owned();
    let error =
        redis_idem_client::IdemCommands::idem_mclaim(&mut con, &["k"], Duration::from_secs(5), None, None, None)
            .unwrap_err();
    assert!(matches!(&error, Error::ModuleRequired(_)), "the module's command is unknown here: {error:?}");
    let reply: redis::RedisResult<redis::Value> = stub.query(&mut con);
    assert!(reply.unwrap_err().to_string().contains("needs the redis-idem module"));
    // The helper falls back to single calls.
    let claims = idem.claim_many(&["k1", "k2"], Duration::from_secs(30)).unwrap();
    assert!(claims.iter().all(|c| matches!(c, Ok(Claim::New { .. }))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_client_on_the_functions_edition() {
    let server = Server::functions();
    let idem = AsyncIdem::new(server.client()).await.unwrap();
    assert_eq!(idem.edition(), Edition::Functions);
    assert!(!idem.process("a", |_| async { Ok::<_, String>("x".to_string()) }).await.unwrap().is_replay());
    let replay = idem.process("a", |_| async { Err::<String, _>("not run") }).await.unwrap();
    assert_eq!(replay.into_value().as_deref(), Some("x"));
}
