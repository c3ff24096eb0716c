//! Workers that die or run long: a worker process killed mid-work (its
//! lease lapses, the next delivery retries with attempt 2), and the
//! heartbeat keeping a long job's claim alive under a short lease.
mod common;

use common::*;
use redis_idem_client::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CHILD_URL: &str = "IDEM_CLIENT_TEST_CHILD_URL";

/// Not a test of its own: the worker process that
/// `a_killed_worker_is_retried_once_its_lease_lapses` starts (this test
/// binary run again with `CHILD_URL` set). Elsewhere it returns at once.
#[test]
fn child_worker() {
    let Ok(url) = std::env::var(CHILD_URL) else { return };
    let idem =
        Idem::with_options(redis::Client::open(url).unwrap(), Options::new().lease(Duration::from_secs(2))).unwrap();
    let _ = idem.process("killed", |attempt: &Job| {
        assert_eq!(attempt.attempt(), 1);
        std::thread::sleep(Duration::from_secs(120)); // until killed
        Ok::<_, String>("the child never finishes".to_string())
    });
    panic!("the child worker should have been killed");
}

#[test]
fn a_killed_worker_is_retried_once_its_lease_lapses() {
    let server = Server::start();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_worker", "--nocapture", "--test-threads", "1"])
        .env(CHILD_URL, server.url())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let idem = Idem::with_options(server.client(), Options::new().wait(Duration::ZERO)).unwrap();
    eventually(Duration::from_secs(10), "the child claims", || {
        idem.get("killed").unwrap().is_some_and(|r| r.state == RecordState::Processing && r.attempt == 1)
    });
    // Past its 2-second lease the child's heartbeat still holds the key.
    std::thread::sleep(Duration::from_millis(2500));
    assert!(matches!(
        idem.claim("killed", Duration::from_secs(2), &ClaimOptions::new()).unwrap(),
        Claim::Busy { attempt: 1, .. }
    ));

    child.kill().unwrap(); // SIGKILL: no RELEASE, no DONE
    child.wait().unwrap();
    // It waits for the dead worker's lease (2 s) to lapse, well within 10 s.
    let next = Idem::with_options(server.client(), Options::new().wait(Duration::from_secs(10))).unwrap();
    let outcome = next
        .process("killed", |attempt: &Job| {
            assert_eq!((attempt.attempt(), attempt.status()), (2, Granted::Retry));
            Ok::<_, String>("done by the next worker".to_string())
        })
        .unwrap();
    assert!(matches!(&outcome, Outcome::Completed { attempt: 2, status: Granted::Retry, .. }), "{outcome:?}");
    assert_eq!(next.stats().waits, 1, "it waited for the dead worker's lease");
}

/// Costs 30 s, so `make test-client-rust` runs it on one server only
/// (`cargo test --workspace`'s Redis 7.0 run): the heartbeat's EXTEND is the
/// same command on every server, which the rest of the suite covers there.
#[test]
fn heartbeat_keeps_a_30_second_job_alive_under_a_2_second_lease() {
    let server = Server::start();
    let idem = Idem::with_options(server.client(), Options::new().lease(Duration::from_secs(2))).unwrap();
    let probe = Idem::with_options(server.client(), Options::new().wait(Duration::ZERO)).unwrap();
    let outcome = idem
        .process("long", |attempt: &Job| {
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(30) {
                std::thread::sleep(Duration::from_secs(1));
                // Another worker finds the key still held, all along.
                let claim = probe.claim("long", Duration::from_secs(2), &ClaimOptions::new()).unwrap();
                assert!(matches!(claim, Claim::Busy { attempt: 1, .. }), "after {:?}: {claim:?}", start.elapsed());
                assert!(!attempt.lost());
            }
            Ok::<_, String>("30 s of work".to_string())
        })
        .unwrap();
    assert!(matches!(outcome, Outcome::Completed { attempt: 1, status: Granted::New, .. }), "{outcome:?}");
    assert!(idem.stats().extends >= 40, "{:?}", idem.stats());
}

/// The tokio heartbeat, on a shorter job: 5 s under a 2-second lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_heartbeat_keeps_a_job_alive() {
    let server = Server::start();
    let idem = AsyncIdem::with_options(server.client(), Options::new().lease(Duration::from_secs(2))).await.unwrap();
    let probe = AsyncIdem::with_options(server.client(), Options::new().wait(Duration::ZERO)).await.unwrap();
    let outcome = idem
        .process("long", |_| async {
            for _ in 0..5 {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let claim = probe.claim("long", Duration::from_secs(2), &ClaimOptions::new()).await.unwrap();
                assert!(matches!(claim, Claim::Busy { attempt: 1, .. }), "{claim:?}");
            }
            Ok::<_, String>("5 s of work".to_string())
        })
        .await
        .unwrap();
    assert!(matches!(outcome, Outcome::Completed { attempt: 1, .. }), "{outcome:?}");
    assert!(idem.stats().extends >= 6, "{:?}", idem.stats());
}
