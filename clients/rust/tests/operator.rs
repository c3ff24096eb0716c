//! The operator's calls, on the suite's edition: `scan` finds the dead
//! letters (and only the records its filters select) on one server and on
//! every primary of a 3-node cluster; `requeue` gives a dead letter back,
//! which then completes on its next delivery with a higher attempt; `tries`
//! in the record; sync and async.
mod common;

use common::*;
use redis_idem_client::*;
use std::collections::HashSet;
use std::time::Duration;

fn failing(_: &Job) -> Result<String, String> {
    Err("the bug".into())
}

fn keys<S: ConnectionSource, C>(idem: &Idem<S, C>, options: &ScanOptions) -> HashSet<String> {
    idem.scan(options).unwrap().collect::<Result<_, _>>().unwrap()
}

fn dead_letters() -> ScanOptions {
    ScanOptions::new().state(RecordState::Released).min_tries(2)
}

#[test]
fn a_dead_letter_is_found_requeued_and_then_completes() {
    let server = Server::start();
    let idem = Idem::with_options(server.client(), Options::new().prefix("shop:").max_tries(2)).unwrap();
    assert_eq!(idem.edition(), if server.functions { Edition::Functions } else { Edition::Module });
    // Two failed tries use up max_tries 2: a dead letter.
    for _ in 0..2 {
        assert!(matches!(idem.process("dead", failing), Err(ProcessError::Work(_))));
    }
    let error = idem.process("dead", failing).unwrap_err();
    assert!(matches!(error.idem(), Some(Error::Exhausted { .. })), "{error:?}");
    // Beside it: one failed try, a completion, a live claim, a dead letter
    // under another prefix.
    assert!(idem.process("once", failing).is_err());
    idem.process("ok", |_: &Job| Ok::<_, String>("fine".to_string())).unwrap();
    assert!(idem.claim("live", Duration::from_secs(30), &ClaimOptions::new()).unwrap().token().is_some());
    let other = Idem::with_options(server.client(), Options::new().prefix("other:").max_tries(2)).unwrap();
    for _ in 0..2 {
        assert!(other.process("dead-elsewhere", failing).is_err());
    }

    let record = idem.get("dead").unwrap().unwrap();
    assert_eq!((record.state, record.attempt, record.tries), (RecordState::Released, 2, Some(2)));
    assert_eq!(keys(&idem, &dead_letters()), HashSet::from(["dead".to_string()]));
    assert_eq!(keys(&idem, &ScanOptions::new().state(RecordState::Released)).len(), 2, "dead and once");
    assert_eq!(keys(&idem, &ScanOptions::new().state(RecordState::Done)), HashSet::from(["ok".to_string()]));
    assert_eq!(keys(&idem, &ScanOptions::new()).len(), 4, "every record under the prefix, none beside it");
    assert_eq!(keys(&idem, &ScanOptions::new().pattern("d*").count(1)), HashSet::from(["dead".to_string()]));
    assert!(keys(&idem, &ScanOptions::new().idle(Duration::from_secs(3600))).is_empty(), "all changed just now");
    assert_eq!(keys(&other, &dead_letters()), HashSet::from(["dead-elsewhere".to_string()]));
    // Without a prefix: every record, with its full name.
    let everyone = Idem::new(server.client()).unwrap();
    let all = HashSet::from(["shop:dead".to_string(), "other:dead-elsewhere".to_string()]);
    assert_eq!(keys(&everyone, &dead_letters()), all);

    // Given back: the attempt kept, the tries restarted.
    assert!(idem.requeue("dead").unwrap());
    let record = idem.get("dead").unwrap().unwrap();
    assert_eq!((record.state, record.attempt, record.tries), (RecordState::Released, 2, Some(0)));
    assert!(keys(&idem, &dead_letters()).is_empty());
    let outcome = idem.process("dead", |job: &Job| Ok::<_, String>(job.attempt())).unwrap();
    assert!(matches!(outcome, Outcome::Completed { value: 3, attempt: 3, status: Granted::Retry, .. }), "{outcome:?}");
    assert_eq!(idem.get("dead").unwrap().unwrap().state, RecordState::Done);

    // No record: false. A live lease: the server's error, nothing changed.
    assert!(!idem.requeue("absent").unwrap());
    let error = idem.requeue("live").unwrap_err();
    assert!(matches!(&error, Error::LiveLease(text) if text.contains("live lease")), "{error:?}");
    assert_eq!(idem.get("live").unwrap().unwrap().state, RecordState::Processing);
}

#[test]
fn scan_options_the_server_would_refuse_are_refused_before_sending() {
    let server = Server::start();
    let idem = Idem::new(server.client()).unwrap();
    for options in [
        ScanOptions::new().idle(Duration::from_millis(1500)),
        ScanOptions::new().idle(Duration::ZERO),
        ScanOptions::new().min_tries(0),
        ScanOptions::new().count(0),
    ] {
        let error = idem.scan(&options).unwrap_err();
        assert!(matches!(error, Error::InvalidArgument(_)), "{options:?}: {error:?}");
    }
    assert!(idem.scan(&ScanOptions::new().idle(Duration::from_secs(1))).unwrap().next().is_none());
}

#[test]
fn the_raw_commands_on_a_connection() {
    let server = Server::start();
    if server.functions {
        return; // IDEM.* are the module's; Idem speaks both editions
    }
    let mut con = server.conn();
    let claim = con.idem_claim("raw", Duration::from_secs(30), &ClaimOptions::new()).unwrap();
    assert!(con.idem_release("raw", claim.token().unwrap()).unwrap());
    let (mut cursor, mut found) = (0, Vec::new());
    loop {
        let (next, keys) = con.idem_scan(cursor, &ScanOptions::new().state(RecordState::Released)).unwrap();
        found.extend(keys);
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    assert_eq!(found, ["raw"]);
    assert!(con.idem_requeue("raw").unwrap());
    assert!(!con.idem_requeue("absent").unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_scan_and_requeue() {
    let server = Server::start();
    let idem = AsyncIdem::with_options(server.client(), Options::new().prefix("a:").max_tries(2)).await.unwrap();
    for _ in 0..2 {
        assert!(idem.process("dead", |_| async { Err::<u64, _>("the bug") }).await.is_err());
    }
    idem.process("ok", |_| async { Ok::<_, String>(1) }).await.unwrap();
    let mut scan = idem.scan(&dead_letters()).await.unwrap();
    let mut found = Vec::new();
    while let Some(key) = scan.next().await {
        found.push(key.unwrap());
    }
    assert_eq!(found, ["dead"]);
    assert!(idem.requeue("dead").await.unwrap());
    assert!(!idem.requeue("absent").await.unwrap());
    let outcome = idem.process("dead", |job| async move { Ok::<_, String>(job.attempt()) }).await.unwrap();
    assert_eq!((outcome.attempt(), outcome.is_replay()), (3, false));
    assert!(matches!(
        idem.scan(&ScanOptions::new().idle(Duration::from_millis(10))).await,
        Err(Error::InvalidArgument(_))
    ));
}

/// Released records (one failed try each) on keys of every node.
fn released_on_every_node(cluster: &Cluster, prefix: &str) -> HashSet<String> {
    let idem = Idem::with_options(cluster.client(), Options::new().prefix(prefix)).unwrap();
    let names: HashSet<String> = (0..24).map(|i| format!("job:{i}")).collect();
    let nodes: HashSet<u16> = names.iter().map(|n| cluster.node_of(&format!("{prefix}{n}")).port).collect();
    assert_eq!(nodes.len(), 3, "the keys span the three primaries");
    for name in &names {
        assert!(idem.process(name, failing).is_err());
    }
    names
}

#[test]
fn scan_on_a_cluster_finds_the_records_of_every_primary() {
    let cluster = Cluster::start();
    let names = released_on_every_node(&cluster, "c:");
    let idem = Idem::with_options(cluster.client(), Options::new().prefix("c:")).unwrap();
    let found: Vec<String> =
        idem.scan(&ScanOptions::new().state(RecordState::Released).min_tries(1)).unwrap().map(Result::unwrap).collect();
    assert_eq!(found.iter().cloned().collect::<HashSet<_>>(), names);
    assert_eq!(found.len(), names.len(), "each primary walked once");
    assert!(keys(&idem, &ScanOptions::new().state(RecordState::Done)).is_empty());
    // requeue goes to the key's node.
    for name in &names {
        assert!(idem.requeue(name).unwrap());
        assert_eq!(idem.get(name).unwrap().unwrap().tries, Some(0));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_scan_on_a_cluster() {
    let cluster = Cluster::start();
    let names = released_on_every_node(&cluster, "ac:");
    let idem = AsyncIdem::with_options(cluster.client(), Options::new().prefix("ac:")).await.unwrap();
    let mut scan = idem.scan(&ScanOptions::new().state(RecordState::Released).count(5)).await.unwrap();
    let mut found = HashSet::new();
    while let Some(key) = scan.next().await {
        found.insert(key.unwrap());
    }
    assert_eq!(found, names);
    let name = names.iter().next().unwrap();
    assert!(idem.requeue(name).await.unwrap());
}

#[test]
fn a_prefix_with_glob_characters_is_taken_literally() {
    let server = Server::start();
    let starred = Idem::with_options(server.client(), Options::new().prefix("t*[1]:")).unwrap();
    let plain = Idem::with_options(server.client(), Options::new().prefix("tx1:")).unwrap();
    for idem in [&starred, &plain] {
        assert!(idem.process("a", failing).is_err());
    }
    assert_eq!(keys(&starred, &ScanOptions::new()), HashSet::from(["a".to_string()]));
    assert_eq!(keys(&starred, &ScanOptions::new().pattern("?")), HashSet::from(["a".to_string()]));
    assert_eq!(keys(&plain, &ScanOptions::new()), HashSet::from(["a".to_string()]));
}
