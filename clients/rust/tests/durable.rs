//! `durable`: a replay waits for its replicas too (docs/clients.md,
//! "Durability"). The key is completed with the typed commands, which send
//! no WAIT; the loop's replay (or `claim_many`'s) then finds fewer of the
//! replicas it asks for than it wants: none on a primary without replicas,
//! one of two on a primary with one.
mod common;

use common::*;
use redis_idem_client::*;
use std::time::Duration;

fn durable() -> Options {
    Options::new().durable(Durable::replicas(1).timeout(Duration::from_millis(100)))
}

/// Completes `key` with `result`, without WAIT.
fn complete(idem: &Idem<redis::Client>, key: &str, result: &str) {
    let claim = idem.claim(key, Duration::from_secs(30), &ClaimOptions::default()).unwrap();
    let Claim::New { token, .. } = claim else { panic!("{claim:?}") };
    let done = DoneOptions { result: Some(format!("{result:?}").into_bytes()), ..DoneOptions::default() };
    assert!(matches!(idem.done(key, &token, &done).unwrap(), Done::Completed { .. }));
}

fn is_done_not_durable(error: &Error) -> bool {
    matches!(error, Error::NotDurable { stage: DurableStage::Done, acknowledged: 0, .. })
}

#[test]
fn a_replay_the_replicas_did_not_acknowledge_is_not_durable() {
    let server = Server::start();
    let idem = Idem::with_options(server.client(), durable()).unwrap();
    complete(&idem, "r", "stored");
    let error = idem.process("r", |_: &Job| -> Result<String, String> { panic!("a replay runs no work") }).unwrap_err();
    let ProcessError::Replayed { value, attempt: 1, error } = error else { panic!("{error:?}") };
    assert_eq!(value.as_deref(), Some("stored"));
    assert!(is_done_not_durable(&error), "{error:?}");

    complete(&idem, "b", "kept");
    let items = idem.process_many(&["b"], |_: &Job| -> Result<String, String> { panic!("no work") }).unwrap();
    let [item] = &items[..] else { panic!("one key") };
    assert_eq!((item.status, item.value.as_deref(), item.attempt), (BatchStatus::NotDurable, Some("kept"), 1));
    assert!(matches!(&item.error, Some(KeyError::Idem(e)) if is_done_not_durable(e)), "{item:?}");

    let stats = idem.stats();
    assert_eq!((stats.not_durable, stats.replays, stats.released, stats.first_runs), (2, 0, 0, 0));
    // Nothing was released: the records are still done.
    for key in ["r", "b"] {
        assert_eq!(idem.get(key).unwrap().unwrap().state, RecordState::Done);
    }
}

#[tokio::test]
async fn an_async_replay_the_replicas_did_not_acknowledge_is_not_durable() {
    let server = Server::start();
    complete(&Idem::new(server.client()).unwrap(), "r", "stored");
    complete(&Idem::new(server.client()).unwrap(), "b", "kept");
    let idem = AsyncIdem::with_options(server.client(), durable()).await.unwrap();
    let error = idem.process("r", |_| async { Err::<String, _>("a replay runs no work") }).await.unwrap_err();
    let ProcessError::Replayed { value, attempt: 1, error } = error else { panic!("{error:?}") };
    assert_eq!(value.as_deref(), Some("stored"));
    assert!(is_done_not_durable(&error), "{error:?}");

    let items = idem.process_many(&["b"], |_| async { Err::<String, _>("no work") }).await.unwrap();
    let [item] = &items[..] else { panic!("one key") };
    assert_eq!((item.status, item.value.as_deref(), item.attempt), (BatchStatus::NotDurable, Some("kept"), 1));
    assert!(matches!(&item.error, Some(KeyError::Idem(e)) if is_done_not_durable(e)), "{item:?}");
    assert_eq!((idem.stats().not_durable, idem.stats().replays), (2, 0));
}

/// `claim_many` reads its `WAIT` as the loop reads a claim's (one rule in
/// the core, docs/clients.md's Durability): on a primary with one
/// replica, a key answered done is a replay while the replica acknowledges
/// it, and `NotDurable` at the done stage when two replicas are asked for
/// (nothing released); a key granted in that batch is `NotDurable` at the
/// claim stage and released.
#[test]
fn claim_many_reads_a_replays_wait_as_the_loop_does() {
    let servers = Replicated::start();
    let plain = Idem::new(servers.primary.client()).unwrap();
    complete(&plain, "d", "stored");
    let lease = Duration::from_secs(30);
    let asking = |replicas| {
        let durable = Durable::replicas(replicas).timeout(Duration::from_millis(2000));
        Idem::with_options(servers.primary.client(), Options::new().durable(durable)).unwrap()
    };

    let one = asking(1);
    let claims = one.claim_many(&["d", "n1"], lease).unwrap();
    assert!(matches!(&claims[0], Ok(Claim::Done { result: Some(r), attempt: 1 }) if r == b"\"stored\""), "{claims:?}");
    assert!(matches!(&claims[1], Ok(Claim::New { .. })), "{claims:?}");
    assert_eq!(one.stats().not_durable, 0);

    let two = asking(2);
    let claims = two.claim_many(&["d", "n2"], lease).unwrap();
    let short = |stage| move |c: &Result<Claim, Error>| matches!(c, Err(Error::NotDurable { stage: s, acknowledged: 1, .. }) if *s == stage);
    assert!(short(DurableStage::Done)(&claims[0]), "a replay not acknowledged: {claims:?}");
    assert!(short(DurableStage::Claim)(&claims[1]), "a claim not acknowledged: {claims:?}");
    assert_eq!(two.stats().not_durable, 2);
    assert_eq!(plain.get("d").unwrap().unwrap().state, RecordState::Done, "nothing released");
    assert_eq!(plain.get("n2").unwrap().unwrap().state, RecordState::Released);
}
