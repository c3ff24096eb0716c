//! A real Sentinel failover with work in flight: workers process keys
//! through `Idem` (sync) and `AsyncIdem` made from redis-rs's
//! `SentinelClient` while `SENTINEL FAILOVER` swaps the primary. No work
//! runs twice for a key whose call ended well; every call ends with a
//! completion or an error that says not to acknowledge; a redelivery of
//! every key afterwards replays or finishes it on the new primary.
//!
//! With `durable` (one replica): `SENTINEL FAILOVER` promotes the replica
//! as it is, without waiting for it to catch up, so a completion the old
//! primary acknowledged but had not yet sent would be lost, and its key
//! run again; acknowledged only once the replica holds it, it survives.
mod common;

use common::*;
use redis_idem_client::*;
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const KEYS: usize = 300;

/// Counts each key's runs.
#[derive(Default)]
struct Runs(Mutex<HashMap<String, u32>>);

impl Runs {
    fn ran(&self, key: &str) {
        *self.0.lock().unwrap().entry(key.to_string()).or_default() += 1;
    }
    fn of(&self, key: &str) -> u32 {
        self.0.lock().unwrap().get(key).copied().unwrap_or(0)
    }
}

/// A call's end: acknowledged (a completion or a replay), or not.
fn acknowledged<E: std::fmt::Debug>(call: &Result<Outcome<u32>, ProcessError<u32, E>>) -> bool {
    match call {
        Ok(_) => true,
        // Not to acknowledge: redelivered later.
        Err(ProcessError::Unsettled { error: Error::DoneUnconfirmed { .. }, .. }) => false,
        Err(ProcessError::Idem(Error::Busy { .. } | Error::Redis(_) | Error::NotDurable { .. })) => false,
        Err(ProcessError::Completed { error: Error::NotDurable { .. }, .. }) => false,
        Err(ProcessError::Replayed { .. }) => false,
        Err(other) => panic!("unexpected end of a call across a failover: {other:?}"),
    }
}

/// The redelivery of every key after the failover: a key acknowledged the
/// first time replays; the others run at most once more.
fn redeliver(idem: &Idem<Mutex<redis::sentinel::SentinelClient>>, runs: &Runs, first: &HashMap<String, bool>) {
    for (key, acked) in first {
        let before = runs.of(key);
        let call = idem.process(key, |job: &Job| {
            runs.ran(job.key());
            Ok::<u32, String>(1)
        });
        let outcome = call.unwrap_or_else(|e| panic!("{key}: {e:?}"));
        if *acked {
            assert!(outcome.is_replay(), "{key}: acknowledged, then run again");
            assert_eq!(runs.of(key), before, "{key}");
        }
        assert!(runs.of(key) <= 2, "{key} ran {} times", runs.of(key));
    }
}

#[test]
fn work_in_flight_goes_on_through_a_sentinel_failover() {
    let set = Sentineled::start();
    let options = Options::new().wait(Duration::from_secs(20)).lease(Duration::from_secs(5));
    let durable = options.clone().durable(Durable::replicas(1).timeout(Duration::from_secs(2)));
    let idem = Idem::with_options(Mutex::new(set.client()), durable).unwrap();
    let runs = Runs::default();
    let first: Mutex<HashMap<String, bool>> = Mutex::default();
    let failed_over = AtomicBool::new(false);
    std::thread::scope(|scope| {
        for worker in 0..4 {
            let (idem, runs, first, failed_over) = (&idem, &runs, &first, &failed_over);
            scope.spawn(move || {
                for n in (worker..KEYS).step_by(4) {
                    let key = format!("order:{n}");
                    let call = idem.process(&key, |job: &Job| {
                        runs.ran(job.key());
                        std::thread::sleep(Duration::from_millis(3));
                        Ok::<u32, String>(1)
                    });
                    first.lock().unwrap().insert(key, acknowledged(&call));
                    // The last quarter after the switch.
                    while n > KEYS * 3 / 4 && !failed_over.load(Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
            });
        }
        eventually(Duration::from_secs(30), "work in flight", || first.lock().unwrap().len() > KEYS / 4);
        set.failover();
        failed_over.store(true, Ordering::SeqCst);
    });
    let first = first.into_inner().unwrap();
    assert_eq!(first.len(), KEYS);
    for (key, _) in first.iter().filter(|(_, acked)| **acked) {
        assert_eq!(runs.of(key), 1, "{key}: a completed key ran once");
    }
    // The redelivery reads what the new primary holds (no WAIT to wait out).
    let fresh = Idem::with_options(Mutex::new(set.client()), options).unwrap();
    redeliver(&fresh, &runs, &first);
    // Every key is done on the new primary.
    for n in 0..KEYS {
        let record = fresh.get(&format!("order:{n}")).unwrap().expect("a record");
        assert_eq!(record.state, RecordState::Done, "order:{n}");
    }
    assert_eq!(set.primary().role(), "master");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_loop_goes_on_through_a_sentinel_failover() {
    let set = Sentineled::start();
    let sentinel = tokio::sync::Mutex::new(set.client());
    // No durable here: it checks only that a call that completed ran once,
    // not that its completion outlived the switch.
    let options = Options::new().wait(Duration::from_secs(20)).lease(Duration::from_secs(5));
    let idem = AsyncIdem::with_options(sentinel, options).await.unwrap();
    let runs = std::sync::Arc::new(Runs::default());
    let calls: Vec<_> = (0..KEYS)
        .map(|n| {
            let (idem, runs) = (idem.clone(), runs.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(n as u64 * 8)).await;
                let key = format!("order:{n}");
                let call = idem
                    .process(&key, |job| async move {
                        runs.ran(job.key());
                        Ok::<u32, String>(1)
                    })
                    .await;
                (key, acknowledged(&call))
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(KEYS as u64 * 2)).await;
    let set = tokio::task::spawn_blocking(move || {
        set.failover();
        set
    })
    .await
    .unwrap();
    let mut acked = 0;
    for call in calls {
        let (key, ok) = call.await.unwrap();
        if ok {
            acked += 1;
            assert_eq!(runs.of(&key), 1, "{key}: a completed key ran once");
        }
    }
    assert!(acked >= KEYS / 2, "{acked} of {KEYS} calls completed across the failover");
    assert_eq!(set.primary().role(), "master");
}
