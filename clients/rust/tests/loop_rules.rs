//! The loop's rules that issues 36 and 37 fixed, each where it once broke:
//! a DONE refused with WRONGTYPE is not reported completed, `job.key()` is
//! the caller's key, and an async work that panics has its claim released
//! (tests/heartbeat_thread.rs: one heartbeat thread per instance).
mod common;

use common::*;
use redis_idem_client::*;

/// The work overwrites its own key with a plain string: DONE answers
/// WRONGTYPE, the record was not completed.
#[test]
fn a_done_refused_with_wrongtype_is_unsettled_not_completed() {
    let server = Server::start();
    let idem = Idem::new(server.client()).unwrap();
    let call = idem.process("k", |_job: &Job| {
        let _: () = redis::cmd("SET").arg("k").arg("plain").query(&mut server.conn()).unwrap();
        Ok::<_, String>(7)
    });
    match call {
        Err(ProcessError::Unsettled { value: 7, error: Error::WrongType(_) }) => {}
        other => panic!("expected Unsettled with WrongType, got {other:?}"),
    }
    assert_eq!(idem.stats().completed, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_loop_reports_a_wrongtype_done_as_unsettled_too() {
    let server = Server::start();
    let idem = AsyncIdem::new(server.client()).await.unwrap();
    let mut con = server.client().get_multiplexed_async_connection().await.unwrap();
    let call = idem
        .process("k", |_job| async move {
            let _: () = redis::cmd("SET").arg("k").arg("plain").query_async(&mut con).await.unwrap();
            Ok::<_, String>(7)
        })
        .await;
    assert!(matches!(call, Err(ProcessError::Unsettled { value: 7, error: Error::WrongType(_) })), "{call:?}");
    assert_eq!(idem.stats().completed, 0);
}

#[test]
fn job_key_is_the_callers_key_without_the_prefix() {
    let server = Server::start();
    let idem = Idem::with_options(server.client(), Options::new().prefix("tenant-a:")).unwrap();
    let seen = idem.process("order:1", |job: &Job| Ok::<_, String>(job.key().to_string())).unwrap();
    assert_eq!(seen.into_value().as_deref(), Some("order:1"));
    assert!(idem.get("order:1").unwrap().is_some(), "the record is under the prefix");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_work_that_panics_is_released_and_the_panic_goes_on() {
    let server = Server::start();
    let idem = AsyncIdem::new(server.client()).await.unwrap();
    let call = tokio::spawn({
        let idem = idem.clone();
        async move {
            idem.process("k", |_job| async move {
                if true {
                    panic!("the work's bug");
                }
                Ok::<u32, String>(0)
            })
            .await
        }
    });
    assert!(call.await.unwrap_err().is_panic());
    let record = idem.get("k").await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Released, "released at once, not left to lapse");
    assert_eq!(idem.stats().released, 1);
    // In a batch: the panicking key and those not run yet.
    let batch = tokio::spawn({
        let idem = idem.clone();
        async move {
            idem.process_many(&["a", "b"], |job| async move {
                if job.key() == "a" {
                    panic!("the batch's bug");
                }
                Ok::<u32, String>(1)
            })
            .await
        }
    });
    assert!(batch.await.unwrap_err().is_panic());
    for key in ["a", "b"] {
        assert_eq!(idem.get(key).await.unwrap().unwrap().state, RecordState::Released, "{key}");
    }
}
