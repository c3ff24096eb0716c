//! The consumer loop, `Idem::process` and `AsyncIdem::process`: a first run
//! and its replays, a copy waiting for the one in flight, a failed or
//! panicking work given back, MISMATCH and EXHAUSTED, a lapsed lease taken
//! over by a second worker, results too large to keep, hooks and counters.
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
            Event::Claimed { granted, .. } => format!("claimed {granted:?}"),
            Event::Replayed { .. } => "replayed".into(),
            Event::Waiting { .. } => "waiting".into(),
            Event::Completed { .. } => "completed".into(),
            Event::Released { .. } => "released".into(),
            Event::ResultOmitted { .. } => "omitted".into(),
            Event::LeaseLost { .. } => "lost".into(),
            _ => "other".into(),
        };
        log.lock().unwrap().push(name);
    })
}

#[test]
fn a_first_run_then_replays_with_hooks_counters_and_prefixes() {
    let server = Server::start();
    let log = Arc::new(Mutex::new(Vec::new()));
    let idem = Idem::with_options(server.client(), events(&log).prefix("tenant-a:")).unwrap();
    let runs = Mutex::new(0);
    let work = |attempt: &Attempt| -> Result<Receipt, String> {
        *runs.lock().unwrap() += 1;
        assert_eq!((attempt.number, attempt.granted, attempt.key.as_str()), (1, Granted::New, "tenant-a:order:7"));
        Ok(Receipt { order: 7, charged: 1250 })
    };
    let first = idem.process("order:7", work).unwrap();
    let Outcome::Completed { value, attempt: 1, granted: Granted::New, done, result_stored: true } = first else {
        panic!("{first:?}")
    };
    assert_eq!((value, done.completed()), (Receipt { order: 7, charged: 1250 }, true));
    for _ in 0..2 {
        let again = idem
            .process("order:7", |_: &Attempt| -> Result<Receipt, String> { panic!("a replay runs no work") })
            .unwrap();
        assert_eq!(again, Outcome::Replayed { value: Some(Receipt { order: 7, charged: 1250 }), attempt: 1 });
        assert!(again.is_replay());
    }
    assert_eq!(*runs.lock().unwrap(), 1);
    let stats = idem.stats();
    assert_eq!((stats.first_runs, stats.replays, stats.completed, stats.retries), (1, 2, 1, 0));
    assert_eq!(*log.lock().unwrap(), ["claimed New", "completed", "replayed", "replayed"]);
    // The stored result is the JSON of the value, under the prefixed key.
    let record = idem.get("order:7").unwrap().unwrap();
    assert_eq!(record.result.as_deref(), Some(&br#"{"order":7,"charged":1250}"#[..]));

    // Another tenant's instance never sees tenant-a's record.
    let other = Idem::with_options(server.client(), Options::new().prefix("tenant-b:")).unwrap();
    let theirs =
        other.process("order:7", |a: &Attempt| Ok::<_, String>(Receipt { order: 7, charged: a.number })).unwrap();
    assert!(!theirs.is_replay(), "{theirs:?}");

    // A byte codec stores the bytes as they are.
    let raw = Idem::with_codec(server.client(), Options::new(), BytesCodec).unwrap();
    raw.process("raw", |_: &Attempt| Ok::<_, String>("plain text".to_string())).unwrap();
    assert_eq!(raw.get("raw").unwrap().unwrap().result.as_deref(), Some(&b"plain text"[..]));
    let replay: Outcome<String> = raw.process("raw", |_: &Attempt| Err("not run")).unwrap();
    assert_eq!(replay.into_value().as_deref(), Some("plain text"));
}

#[test]
fn a_copy_in_flight_waits_for_the_first_ones_result() {
    let server = Server::start();
    let idem = Idem::new(server.client()).unwrap();
    let (first, second) = std::thread::scope(|scope| {
        let first = scope.spawn(|| {
            idem.process("k", |_: &Attempt| {
                // Until the other copy waits: on the server (WAIT) or in its
                // polling (the Functions edition).
                eventually(Duration::from_secs(5), "the copy waits", || idem.stats().waits == 1);
                if !server.functions {
                    eventually(Duration::from_secs(5), "blocked", || {
                        server.info_count("clients", "blocked_clients") == 1
                    });
                }
                Ok::<_, String>("first".to_string())
            })
        });
        eventually(Duration::from_secs(5), "the first claims", || idem.stats().first_runs == 1);
        let second = idem.process("k", |_: &Attempt| Err::<String, _>("the copy must not run"));
        (first.join().unwrap().unwrap(), second.unwrap())
    });
    assert!(!first.is_replay());
    assert_eq!(second, Outcome::Replayed { value: Some("first".to_string()), attempt: 1 });
    if !server.functions {
        assert_eq!(server.info_count("idem", "idem_wait_done"), 1, "the copy waited on the server");
    }
}

#[test]
fn failed_or_panicking_work_is_given_back_and_retried() {
    let server = Server::start();
    let log = Arc::new(Mutex::new(Vec::new()));
    let idem = Idem::with_options(server.client(), events(&log)).unwrap();
    let failed = idem.process("job", |_: &Attempt| Err::<u32, _>("downstream refused")).unwrap_err();
    assert!(matches!(failed, ProcessError::Work("downstream refused")), "{failed:?}");
    assert_eq!(idem.get("job").unwrap().unwrap().state, RecordState::Released);
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = idem.process("job", |_: &Attempt| -> Result<u32, String> { panic!("bug in the work") });
    }));
    assert!(panicked.is_err(), "the panic reaches the caller");
    assert_eq!(idem.get("job").unwrap().unwrap().state, RecordState::Released);
    let third = idem.process("job", |attempt: &Attempt| {
        assert_eq!((attempt.number, attempt.granted), (3, Granted::Retry));
        Ok::<_, String>(attempt.number as u32)
    });
    assert_eq!(third.unwrap().value(), Some(&3));
    let stats = idem.stats();
    assert_eq!((stats.first_runs, stats.retries, stats.released, stats.completed), (1, 2, 2, 1));
    assert_eq!(log.lock().unwrap()[..3], ["claimed New".to_string(), "released".into(), "claimed Retry".into()]);
}

#[test]
fn mismatch_exhausted_and_still_busy_are_errors() {
    let server = Server::start();
    let idem = Idem::with_options(server.client(), Options::new().max_tries(2).wait(Duration::ZERO)).unwrap();
    let fail = |_: &Attempt| Err::<u8, _>("no");
    idem.process_with("p", &ProcessOptions::new().payload("amount=10"), |_: &Attempt| Ok::<_, String>(1)).unwrap();
    let reused = idem.process_with("p", &ProcessOptions::new().payload("amount=99"), fail).unwrap_err();
    assert!(matches!(reused.idem(), Some(Error::Mismatch { attempt: 1, .. })), "{reused:?}");
    // The same payload replays.
    assert!(idem.process_with("p", &ProcessOptions::new().payload("amount=10"), fail).unwrap().is_replay());

    assert!(matches!(idem.process("x", fail), Err(ProcessError::Work(_))));
    assert!(matches!(idem.process("x", fail), Err(ProcessError::Work(_))));
    let exhausted = idem.process("x", fail).unwrap_err();
    assert!(matches!(exhausted.idem(), Some(Error::Exhausted { attempt: 2, .. })), "{exhausted:?}");

    let holder = idem.claim("b", Duration::from_secs(30), &ClaimOptions::new()).unwrap();
    let busy = idem.process("b", fail).unwrap_err();
    assert!(matches!(busy.idem(), Some(Error::Busy { attempt: 1, .. })), "{busy:?}");
    assert!(holder.token().is_some());
}

/// Worker A's lease lapses (its heartbeat is slower than its lease), worker
/// B takes the key over (RETRY, attempt 2) and completes it; A's heartbeat
/// finds its claim lost, and A's DONE is refused: A gets `LeaseLost`, the
/// record keeps B's result.
#[test]
fn a_lapsed_lease_is_taken_over_and_the_first_workers_done_refused() {
    let server = Server::start();
    let slow = Idem::with_options(
        server.client(),
        Options::new().lease(Duration::from_secs(1)).heartbeat(Duration::from_millis(2500)),
    )
    .unwrap();
    let other = Idem::with_options(server.client(), Options::new().wait(Duration::from_secs(10))).unwrap();
    let (a, b) = std::thread::scope(|scope| {
        let a = scope.spawn(|| {
            slow.process("t", |attempt: &Attempt| {
                eventually(Duration::from_secs(8), "the heartbeat finds the claim lost", || attempt.lease_lost());
                Ok::<_, String>(format!("A{}", attempt.number))
            })
        });
        eventually(Duration::from_secs(5), "A claims", || slow.stats().first_runs == 1);
        let b = other.process("t", |attempt: &Attempt| {
            assert_eq!((attempt.number, attempt.granted), (2, Granted::Retry));
            Ok::<_, String>(format!("B{}", attempt.number))
        });
        (a.join().unwrap(), b.unwrap())
    });
    assert!(matches!(a.unwrap_err().idem(), Some(Error::LeaseLost { attempt: 1, .. })));
    assert_eq!(b.value().map(String::as_str), Some("B2"));
    assert_eq!(slow.stats().leases_lost, 1);
    let replay = other.process("t", |_: &Attempt| Err::<String, _>("done already")).unwrap();
    assert_eq!(replay.into_value().as_deref(), Some("B2"));
}

/// A result over the limit still completes the record (the work is not
/// redone), without the result: by the client's own limit on both editions,
/// by the server's `idem.max-result` on the module.
#[test]
fn a_result_too_large_still_completes_the_record() {
    let server = Server::start();
    let big = "x".repeat(64);
    let client_side = Idem::with_options(server.client(), Options::new().max_result(16)).unwrap();
    let outcome = client_side.process("big1", |_: &Attempt| Ok::<_, String>(big.clone())).unwrap();
    assert!(matches!(outcome, Outcome::Completed { result_stored: false, .. }), "{outcome:?}");
    assert_eq!(
        client_side.process("big1", |_: &Attempt| Err::<String, _>("redo")).unwrap(),
        Outcome::Replayed { value: None, attempt: 1 }
    );
    assert_eq!(client_side.stats().results_omitted, 1);

    let strict =
        Idem::with_options(server.client(), Options::new().max_result(16).oversize(OversizePolicy::CompleteAndError))
            .unwrap();
    let error = strict.process("big2", |_: &Attempt| Ok::<_, String>(big.clone())).unwrap_err();
    assert!(matches!(error.idem(), Some(Error::ResultTooLarge { size: 66, .. })), "{error:?}");
    assert_eq!(strict.get("big2").unwrap().unwrap().state, RecordState::Done);

    if !server.functions {
        server.config_set("idem.max-result", "16");
        let server_side = Idem::new(server.client()).unwrap();
        let outcome = server_side.process("big3", |_: &Attempt| Ok::<_, String>(big.clone())).unwrap();
        assert!(matches!(outcome, Outcome::Completed { result_stored: false, .. }), "{outcome:?}");
        let record = server_side.get("big3").unwrap().unwrap();
        assert_eq!((record.state, record.result), (RecordState::Done, None));
        // A small result is still stored.
        assert!(matches!(
            server_side.process("small", |_: &Attempt| Ok::<_, String>("s".to_string())).unwrap(),
            Outcome::Completed { result_stored: true, .. }
        ));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_loop_runs_once_waits_gives_back_and_loses_a_lapsed_lease() {
    let server = Server::start();
    let idem = AsyncIdem::with_options(server.client(), Options::new().prefix("async:")).await.unwrap();
    let first = idem
        .process("o", |attempt| async move { Ok::<_, String>(Receipt { order: 1, charged: attempt.number }) })
        .await
        .unwrap();
    assert!(!first.is_replay());
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
    let retried = idem.process("f", |attempt| async move { Ok::<_, String>(attempt.number) }).await.unwrap();
    assert_eq!(retried.value(), Some(&2));

    // A lapsed lease: taken over, the first worker's DONE refused.
    let slow = AsyncIdem::with_options(
        server.client(),
        Options::new().prefix("async:").lease(Duration::from_secs(1)).heartbeat(Duration::from_millis(2500)),
    )
    .await
    .unwrap();
    let a = {
        let slow = slow.clone();
        tokio::spawn(async move {
            slow.process("t", |attempt| async move {
                while !attempt.lease_lost() {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Ok::<_, String>("A".to_string())
            })
            .await
        })
    };
    while slow.stats().first_runs == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let b = idem.process("t", |attempt| async move { Ok::<_, String>(format!("B{}", attempt.number)) }).await.unwrap();
    assert_eq!(b.value().map(String::as_str), Some("B2"));
    let a = tokio::time::timeout(Duration::from_secs(8), a).await.expect("A ends").unwrap();
    assert!(matches!(a.unwrap_err().idem(), Some(Error::LeaseLost { attempt: 1, .. })));
}
