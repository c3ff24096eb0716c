//! The batch helpers beyond the conformance cases: `IDEM.MCLAIM` /
//! `IDEM.MDONE` / `IDEM.MRELEASE` in chunks of at most 10000 keys on the
//! module, one single call per key on the Functions edition, the same
//! answers either way (STALE, 0, payloads, a key given twice).
mod common;
mod proxy;

use common::*;
use redis_idem_client::*;
use std::time::Duration;

const LEASE: Duration = Duration::from_secs(30);

#[test]
fn a_batch_answers_each_key_as_the_single_command_would() {
    let server = Server::start();
    let idem = Idem::with_options(server.client(), Options::new().prefix("b:")).unwrap();
    let done = idem.claim("done", LEASE, &ClaimOptions::new()).unwrap();
    idem.done("done", done.token().unwrap(), &DoneOptions::new().result("kept")).unwrap();
    let busy = idem.claim("busy", LEASE, &ClaimOptions::new()).unwrap();
    let _: () = redis::cmd("SET").arg("b:string").arg("x").query(&mut server.conn()).unwrap();
    let before = server.calls("idem.mclaim");

    let claims = idem.claim_many(&["n1", "done", "busy", "string", "n2"], LEASE).unwrap();
    assert!(matches!(claims[0], Ok(Claim::New { attempt: 1, .. })), "{claims:?}");
    assert_eq!(claims[1].as_ref().unwrap(), &Claim::Done { result: Some(b"kept".to_vec()), attempt: 1 });
    assert!(matches!(claims[2], Ok(Claim::Busy { attempt: 1, .. })), "{claims:?}");
    assert!(matches!(&claims[3], Err(Error::WrongType(_))), "{claims:?}");
    assert!(matches!(claims[4], Ok(Claim::New { .. })), "{claims:?}");
    if !server.functions {
        assert_eq!(server.calls("idem.mclaim") - before, 1, "one IDEM.MCLAIM for the batch");
    }

    let token = |i: usize| claims[i].as_ref().unwrap().token().unwrap().to_string();
    let (t0, t4, stale) = (token(0), token(4), "0".repeat(32));
    let dones = idem
        .done_many(&[
            DoneItem::new("n1", &t0).result("r1"),
            DoneItem::new("busy", &stale),
            DoneItem::new("n2", &t4),
            DoneItem::new("done", &stale).result("x"),
        ])
        .unwrap();
    assert!(dones[0].as_ref().unwrap().completed(), "{dones:?}");
    assert!(matches!(dones[1], Err(Error::Stale(_))), "{dones:?}");
    assert!(dones[2].as_ref().unwrap().completed(), "{dones:?}");
    assert_eq!(*dones[3].as_ref().unwrap(), Done::AlreadyDone);
    assert_eq!(idem.get("n1").unwrap().unwrap().result.as_deref(), Some(&b"r1"[..]));
    assert_eq!(idem.get("n2").unwrap().unwrap().result, None);

    let released = idem
        .release_many(&[
            ReleaseItem::new("busy", busy.token().unwrap()),
            ReleaseItem::new("busy", busy.token().unwrap()),
        ])
        .unwrap();
    assert_eq!(released.into_iter().map(Result::unwrap).collect::<Vec<_>>(), [true, false]);

    // Payloads, one per key: a reused key with other content is MISMATCH.
    let payloads = vec![b"a".to_vec(), b"b".to_vec()];
    let first = idem.claim_many_with(&["p1", "p2"], LEASE, Some(&payloads)).unwrap();
    assert!(first.iter().all(|c| c.as_ref().unwrap().token().is_some()));
    let swapped = vec![b"b".to_vec(), b"b".to_vec()];
    let again = idem.claim_many_with(&["p1", "p2"], LEASE, Some(&swapped)).unwrap();
    assert_eq!(*again[0].as_ref().unwrap(), Claim::Mismatch { attempt: 1 });
    assert!(matches!(again[1], Ok(Claim::Busy { .. })));
}

#[test]
fn more_than_10000_keys_go_in_chunks() {
    let server = Server::start();
    let idem = Idem::new(server.client()).unwrap();
    let names: Vec<String> = (0..10_001).map(|i| format!("many:{i}")).collect();
    let keys: Vec<&str> = names.iter().map(String::as_str).collect();
    let before = (server.calls("idem.mclaim"), server.calls("idem.mdone"), server.calls("fcall"));
    let claims = idem.claim_many(&keys, LEASE).unwrap();
    assert_eq!(claims.len(), 10_001);
    let tokens: Vec<String> = claims.iter().map(|c| c.as_ref().unwrap().token().expect("NEW").to_string()).collect();
    let items: Vec<DoneItem> = keys.iter().zip(&tokens).map(|(k, t)| DoneItem::new(*k, t).result(*k)).collect();
    let dones = idem.done_many(&items).unwrap();
    assert!(dones.iter().all(|d| d.as_ref().unwrap().completed()));
    assert_eq!(idem.get("many:10000").unwrap().unwrap().result.as_deref(), Some(&b"many:10000"[..]));
    if server.functions {
        assert_eq!(server.calls("fcall") - before.2, 20_002, "one idem_claim and one idem_done per key");
    } else {
        assert_eq!(
            (server.calls("idem.mclaim") - before.0, server.calls("idem.mdone") - before.1),
            (2, 2),
            "10000 + 1"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_batches_answer_as_the_sync_ones() {
    let server = Server::start();
    let idem = AsyncIdem::new(server.client()).await.unwrap();
    let claims = idem.claim_many(&["a", "b", "a"], LEASE).await.unwrap();
    assert!(matches!(claims[0], Ok(Claim::New { .. })));
    assert!(matches!(claims[1], Ok(Claim::New { .. })));
    // A key given twice: its second occurrence sees the first's claim.
    assert!(matches!(claims[2], Ok(Claim::Busy { .. })), "{claims:?}");
    let ta = claims[0].as_ref().unwrap().token().unwrap();
    let tb = claims[1].as_ref().unwrap().token().unwrap();
    let dones = idem.done_many(&[DoneItem::new("a", ta).result("ra")]).await.unwrap();
    assert!(dones[0].as_ref().unwrap().completed());
    let released = idem.release_many(&[ReleaseItem::new("b", tb)]).await.unwrap();
    assert!(released[0].as_ref().unwrap());
    let claims = idem.claim_many(&["a", "b"], LEASE).await.unwrap();
    assert_eq!(*claims[0].as_ref().unwrap(), Claim::Done { result: Some(b"ra".to_vec()), attempt: 1 });
    assert!(matches!(claims[1], Ok(Claim::Retry { attempt: 2, .. })));
}

/// The connection cut after the server ran a batch's DONE, before its
/// reply: the DONE is sent again, answers 0, and IDEM.GET shows this job's
/// attempt: processed, not lost.
#[test]
fn a_batch_done_whose_reply_is_lost_is_its_own_completion() {
    let server = Server::start();
    let proxy = proxy::Proxy::start(server.port);
    let idem = Idem::new(redis::Client::open(proxy.url()).unwrap()).unwrap();
    proxy.arm("mdone", server.functions, true, Some(1));
    let items = idem.process_many(&["{c}1", "{c}2"], |job: &Job| Ok::<_, String>(job.key().to_string())).unwrap();
    // Sent again after the cut, then checked.
    if server.functions {
        // The two DONEs go pipelined in one write: both replies are lost.
        assert_eq!(server.calls("fcall_ro"), 3, "idem_edition, then one idem_get per key");
    } else {
        assert_eq!((server.calls("idem.mdone"), server.calls("idem.get")), (2, 2), "both keys checked");
    }
    for item in &items {
        assert_eq!((item.status, item.result_stored), (BatchStatus::Processed, true), "{item:?}");
        let record = idem.get(&item.key).unwrap().unwrap();
        assert_eq!((record.state, record.result), (RecordState::Done, Some(format!("\"{}\"", item.key).into_bytes())));
    }
    let stats = idem.stats();
    assert_eq!((stats.completed, stats.leases_lost), (2, 0));
}
