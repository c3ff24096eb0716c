//! The loop's decisions on a claim answered DONE under `durable`, without a server.
use super::*;
use crate::codec::BytesCodec;
use crate::many::BatchStatus;
use crate::options::Durable;

fn core() -> Core<BytesCodec> {
    let options = Options::new().durable(Durable::replicas(1).timeout(Duration::from_millis(50)));
    Core::new(options, Edition::Module, BytesCodec, false)
}

fn done() -> Claim {
    Claim::Done { result: Some(b"stored".to_vec()), attempt: 3 }
}

fn step(core: &Core<BytesCodec>, replicas: i64) -> Result<Step<String>, Error> {
    core.on_claim("k", Ok(done()), Some(Ok(Value::Int(replicas))), &mut Backoff::new(Duration::ZERO))
}

#[test]
fn a_replay_the_replicas_did_not_acknowledge_is_not_durable_with_its_stored_value() {
    let core = core();
    let Ok(Step::Undurable { value, attempt, error }) = step(&core, 0) else { panic!("not Undurable") };
    assert_eq!((value.as_deref(), attempt), (Some("stored"), 3));
    assert!(matches!(error, Error::NotDurable { stage: DurableStage::Done, acknowledged: 0, .. }), "{error:?}");
    let stats = core.counters.snapshot();
    assert_eq!((stats.not_durable, stats.replays), (1, 0));
}

#[test]
fn a_replay_the_replicas_acknowledged_replays() {
    let core = core();
    let Ok(Step::Return(Outcome::Replayed { value, attempt })) = step(&core, 1) else { panic!("not a replay") };
    assert_eq!((value.as_deref(), attempt), (Some("stored"), 3));
    let stats = core.counters.snapshot();
    assert_eq!((stats.not_durable, stats.replays), (0, 1));
}

#[test]
fn a_batch_replay_not_acknowledged_is_not_durable_and_releases_nothing() {
    let core = core();
    let claims = vec![(Ok(done()), Some(Ok(Value::Int(0))))];
    let mut many = core.many::<String, String>(&["k"], claims);
    assert!(many.take_jobs().is_empty());
    assert!(many.release_items().is_empty(), "a replay holds no claim");
    let [item] = &many.finish()[..] else { panic!("one key") };
    assert_eq!((item.status, item.value.as_deref(), item.attempt), (BatchStatus::NotDurable, Some("stored"), 3));
    assert!(matches!(&item.error, Some(crate::KeyError::Idem(Error::NotDurable { stage: DurableStage::Done, .. }))));
}
