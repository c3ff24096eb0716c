//! The consumer loop beyond clients/conformance/cases.json (which
//! tests/conformance.rs runs): prefixes and codecs, the hook's events in
//! order, a panicking work, the client's own result limit, bad arguments,
//! and the async loop, single and batch.
mod common;

use common::*;
use redis_idem_client::*;
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Receipt {
    order: u32,
    charged: u64,
}

fn events(log: &Arc<Mutex<Vec<String>>>) -> Options {
    let log = log.clone();
    Options::new().on_event(move |event| {
        let name = match event {
            Event::Run { job } => format!("run {:?} {}", job.status(), job.attempt()),
            Event::Replay { .. } => "replay".into(),
            Event::Busy { .. } => "busy".into(),
            Event::Done { result_stored, .. } => format!("done {result_stored}"),
            Event::Release { reason, .. } => format!("release {reason:?}"),
            Event::ResultDropped { reason, .. } => format!("dropped {reason:?}"),
            Event::LeaseLost { .. } => "lost".into(),
            _ => "other".into(),
        };
        log.lock().unwrap().push(name);
    })
}

#[test]
fn prefixes_codecs_and_the_events_in_order() {
    let server = Server::start();
    let log = Arc::new(Mutex::new(Vec::new()));
    let idem = Idem::with_options(server.client(), events(&log).prefix("tenant-a:")).unwrap();
    let first = idem
        .process("order:7", |job: &Job| -> Result<Receipt, String> {
            assert_eq!(
                (job.attempt(), job.status(), job.key(), job.lost()),
                // The caller's key: the prefix is the server's business.
                (1, Granted::New, "order:7", false)
            );
            Ok(Receipt { order: 7, charged: 1250 })
        })
        .unwrap();
    let receipt = Receipt { order: 7, charged: 1250 };
    assert_eq!(
        first,
        Outcome::Completed { value: receipt.clone(), attempt: 1, status: Granted::New, result_stored: true }
    );
    let again =
        idem.process("order:7", |_: &Job| -> Result<Receipt, String> { panic!("a replay runs no work") }).unwrap();
    assert_eq!(again, Outcome::Replayed { value: Some(receipt), attempt: 1 });
    assert!(idem.process("order:8", |_: &Job| Err::<Receipt, _>("refused")).is_err());
    assert_eq!(*log.lock().unwrap(), ["run New 1", "done true", "replay", "run New 1", "release Work"]);
    // The stored result is the JSON of the value, under the prefixed key.
    let record = idem.get("order:7").unwrap().unwrap();
    assert_eq!(record.result.as_deref(), Some(&br#"{"order":7,"charged":1250}"#[..]));
    assert_eq!(redis::cmd("EXISTS").arg("order:7").query::<i64>(&mut server.conn()).unwrap(), 0);

    // Another tenant's instance never sees tenant-a's record.
    let other = Idem::with_options(server.client(), Options::new().prefix("tenant-b:")).unwrap();
    assert!(!other.process("order:7", |j: &Job| Ok::<_, String>(j.attempt())).unwrap().is_replay());

    // A byte codec stores the bytes as they are.
    let bytes = Idem::with_codec(server.client(), Options::new(), BytesCodec).unwrap();
    bytes.process("raw", |_: &Job| Ok::<_, String>("plain text".to_string())).unwrap();
    assert_eq!(bytes.get("raw").unwrap().unwrap().result.as_deref(), Some(&b"plain text"[..]));
    let replay: Outcome<String> = bytes.process("raw", |_: &Job| Err("not run")).unwrap();
    assert_eq!(replay.into_value().as_deref(), Some("plain text"));
}

#[test]
fn a_panicking_work_is_released_at_once_and_the_panic_resumed() {
    let server = Server::start();
    let idem = Idem::new(server.client()).unwrap();
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = idem.process("job", |_: &Job| -> Result<u32, String> { panic!("bug in the work") });
    }));
    assert!(panicked.is_err(), "the panic reaches the caller");
    assert_eq!(idem.get("job").unwrap().unwrap().state, RecordState::Released);
    // In a batch: the panicking key and those not run yet are released.
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = idem.process_many(&["{p}1", "{p}2", "{p}3"], |job: &Job| -> Result<u32, String> {
            if job.key() == "{p}2" {
                panic!("bug in the work");
            }
            Ok(1)
        });
    }));
    assert!(panicked.is_err());
    let states: Vec<RecordState> =
        ["{p}1", "{p}2", "{p}3"].iter().map(|k| idem.get(k).unwrap().unwrap().state).collect();
    assert_eq!(states, [RecordState::Done, RecordState::Released, RecordState::Released]);
    let stats = idem.stats();
    assert_eq!((stats.first_runs, stats.released, stats.completed), (4, 3, 1));
}

/// The client's own limit (`Options::max_result`) on both editions: the
/// result is not sent, the record completed without it.
#[test]
fn a_result_over_the_clients_own_limit_completes_without_it() {
    let server = Server::start();
    let big = "x".repeat(64);
    let lenient = Idem::with_options(server.client(), Options::new().max_result(16)).unwrap();
    let outcome = lenient.process("big1", |_: &Job| Ok::<_, String>(big.clone())).unwrap();
    assert!(matches!(outcome, Outcome::Completed { result_stored: false, .. }), "{outcome:?}");
    let replay = lenient.process("big1", |_: &Job| Err::<String, _>("redo")).unwrap();
    assert_eq!(replay, Outcome::Replayed { value: None, attempt: 1 });
    assert_eq!(lenient.stats().results_dropped, 1);

    let strict = Idem::with_options(server.client(), Options::new().max_result(16).oversize(Oversize::Error)).unwrap();
    let error = strict.process("big2", |_: &Job| Ok::<_, String>(big.clone())).unwrap_err();
    let ProcessError::Completed { value, error: Error::ResultNotStored { .. } } = error else { panic!("{error:?}") };
    assert_eq!(value, big);
    assert_eq!(strict.get("big2").unwrap().unwrap().state, RecordState::Done);
}

#[test]
fn bad_arguments_are_errors_before_anything_is_sent() {
    let server = Server::start();
    for options in [
        Options::new().lease(Duration::from_millis(1500)),
        Options::new().lease(Duration::ZERO),
        Options::new().retain(Duration::from_millis(10)),
        Options::new().max_tries(0),
    ] {
        let error = Idem::with_options(server.client(), options).unwrap_err();
        assert!(matches!(error, Error::InvalidArgument(_)), "{error:?}");
    }
    let idem = Idem::new(server.client()).unwrap();
    let half = Duration::from_millis(500);
    assert!(matches!(idem.claim("k", half, &ClaimOptions::new()), Err(Error::InvalidArgument(_))));
    assert!(matches!(idem.extend("k", "t", half), Err(Error::InvalidArgument(_))));
    assert!(matches!(idem.once("k", half), Err(Error::InvalidArgument(_))));
    let one = Duration::from_secs(1);
    let payloads = vec![b"a".to_vec()];
    assert!(matches!(idem.claim_many_with(&["a", "b"], one, Some(&payloads)), Err(Error::InvalidArgument(_))));
    assert!(idem.claim_many(&[], one).unwrap().is_empty());
    if !server.functions {
        let mut con = server.conn();
        let error = con.idem_mclaim(&["a", "b"], one, Some(&payloads), None, None).unwrap_err();
        assert!(matches!(error, Error::InvalidArgument(_)), "{error:?}");
        let none: [&str; 0] = [];
        assert!(matches!(con.idem_mclaim(&none, one, None, None, None), Err(Error::InvalidArgument(_))));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_loop_runs_once_waits_gives_back_and_loses_a_lapsed_lease() {
    let server = Server::start();
    let idem = AsyncIdem::with_options(server.client(), Options::new().prefix("async:")).await.unwrap();
    let first =
        idem.process("o", |job| async move { Ok::<_, String>(Receipt { order: 1, charged: job.attempt() }) }).await;
    assert!(!first.unwrap().is_replay());
    let replay = idem.process("o", |_| async { Err::<Receipt, _>("not run") }).await.unwrap();
    assert_eq!(replay, Outcome::Replayed { value: Some(Receipt { order: 1, charged: 1 }), attempt: 1 });

    // A copy in flight waits for the first one's result.
    let holder = {
        let idem = idem.clone();
        tokio::spawn(async move {
            idem.process("w", |_| {
                let idem = idem.clone();
                async move {
                    while idem.stats().waits == 0 {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Ok::<_, String>("first".to_string())
                }
            })
            .await
        })
    };
    while idem.stats().first_runs < 2 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let copy = idem.process("w", |_| async { Err::<String, _>("the copy must not run") }).await.unwrap();
    assert_eq!(copy.into_value().as_deref(), Some("first"));
    assert!(!holder.await.unwrap().unwrap().is_replay());

    // Failed work is released; the next call is attempt 2.
    assert!(matches!(idem.process("f", |_| async { Err::<u8, _>("no") }).await, Err(ProcessError::Work("no"))));
    let retried = idem.process("f", |job| async move { Ok::<_, String>(job.attempt()) }).await.unwrap();
    assert_eq!(retried.value(), Some(&2));

    // A lapsed lease: taken over, the first worker's DONE refused.
    let options = Options::new().prefix("async:").lease(Duration::from_secs(1)).heartbeat(Duration::ZERO);
    let slow = AsyncIdem::with_options(server.client(), options).await.unwrap();
    let a = {
        let slow = slow.clone();
        tokio::spawn(async move {
            slow.process("t", |_| async move {
                tokio::time::sleep(Duration::from_millis(1500)).await;
                Ok::<_, String>("A".to_string())
            })
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let b = idem.process("t", |job| async move { Ok::<_, String>(format!("B{}", job.attempt())) }).await.unwrap();
    assert_eq!(b.value().map(String::as_str), Some("B2"));
    let a = tokio::time::timeout(Duration::from_secs(8), a).await.expect("A ends").unwrap();
    assert!(matches!(a.unwrap_err().idem(), Some(Error::LeaseLost { attempt: 1, .. })));
    assert_eq!(slow.stats().leases_lost, 1);

    // The batch: one answer per key, in order.
    let items = idem
        .process_many(&["{b}1", "o", "{b}2"], |job| async move {
            if job.key().ends_with('2') { Err("bad".to_string()) } else { Ok(Receipt { order: 9, charged: 0 }) }
        })
        .await
        .unwrap();
    let statuses: Vec<BatchStatus> = items.iter().map(|i| i.status).collect();
    assert_eq!(statuses, [BatchStatus::Processed, BatchStatus::Replayed, BatchStatus::Failed]);
    assert_eq!(items[1].value, Some(Receipt { order: 1, charged: 1 }));
    assert!(matches!(items[2].error, Some(KeyError::Work(ref m)) if m == "bad"));
    assert_eq!(idem.get("{b}2").await.unwrap().unwrap().state, RecordState::Released);
}
