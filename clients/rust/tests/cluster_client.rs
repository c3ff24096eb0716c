//! A 3-node Redis Cluster started by the test: the loop and the commands
//! routed by key, batches split by slot (one IDEM.MCLAIM per slot, which
//! would otherwise answer CROSSSLOT), WAIT across nodes, sync and async.
mod common;

use common::*;
use redis_idem_client::*;
use std::time::Duration;

#[test]
fn the_loop_and_batches_on_a_cluster() {
    let cluster = Cluster::start();
    let functions = cluster.nodes[0].functions;
    let idem = Idem::with_options(cluster.client(), Options::new().prefix("c:")).unwrap();
    assert_eq!(idem.edition(), if functions { Edition::Functions } else { Edition::Module });

    // Keys on every node: each processed once, then replayed.
    let names: Vec<String> = (0..30).map(|i| format!("order:{i}")).collect();
    let nodes: std::collections::HashSet<u16> = names.iter().map(|n| cluster.node_of(&format!("c:{n}")).port).collect();
    assert_eq!(nodes.len(), 3, "the keys span the three nodes");
    for name in &names {
        let outcome = idem.process(name, |a: &Attempt| Ok::<_, String>(format!("{name}/{}", a.number))).unwrap();
        assert!(!outcome.is_replay());
    }
    for name in &names {
        let outcome = idem.process(name, |_: &Attempt| Err::<String, _>("not run")).unwrap();
        assert_eq!(outcome.into_value(), Some(format!("{name}/1")));
    }

    // A batch over many slots: one IDEM.MCLAIM per slot on the module.
    let batch: Vec<String> = (0..40).map(|i| format!("batch:{i}")).collect();
    let keys: Vec<&str> = batch.iter().map(String::as_str).collect();
    let slots: std::collections::HashSet<i64> = batch
        .iter()
        .map(|k| {
            redis::cmd("CLUSTER").arg("KEYSLOT").arg(format!("c:{k}")).query(&mut cluster.nodes[0].conn()).unwrap()
        })
        .collect();
    let calls = |name: &str| cluster.nodes.iter().map(|n| n.calls(name)).sum::<i64>();
    let before = calls("idem.mclaim");
    let claims = idem.claim_batch(&keys, None).unwrap();
    assert!(claims.iter().all(|c| matches!(c, Ok(Claim::New { attempt: 1, .. }))), "{claims:?}");
    if !functions {
        assert_eq!(calls("idem.mclaim") - before, slots.len() as i64, "one IDEM.MCLAIM per slot");
    }
    let tokens: Vec<String> = claims.iter().map(|c| c.as_ref().unwrap().token().unwrap().to_string()).collect();
    let items: Vec<(&str, &str, Option<Vec<u8>>)> =
        keys.iter().zip(&tokens).map(|(k, t)| (*k, t.as_str(), Some(b"ok".to_vec()))).collect();
    assert!(idem.complete_batch(&items).unwrap().iter().all(|d| d.as_ref().unwrap().completed()));
    assert!(idem.claim_batch(&keys, None).unwrap().iter().all(|c| matches!(c, Ok(Claim::Done { .. }))));
    // Keys sharing a hash tag share a slot: one call.
    let tagged = ["{t}:1", "{t}:2", "{t}:3"];
    let before = calls("idem.mclaim");
    let claims = idem.claim_batch(&tagged, None).unwrap();
    if !functions {
        assert_eq!(calls("idem.mclaim") - before, 1);
    }
    let pairs: Vec<(&str, &str)> =
        tagged.iter().zip(&claims).map(|(k, c)| (*k, c.as_ref().unwrap().token().unwrap())).collect();
    assert!(idem.release_batch(&pairs).unwrap().into_iter().all(|r| r.unwrap()));
}

#[test]
fn a_copy_waits_for_the_holder_on_its_node() {
    let cluster = Cluster::start();
    let idem = Idem::new(cluster.client()).unwrap();
    let (first, copy) = std::thread::scope(|scope| {
        let first = scope.spawn(|| {
            idem.process("w", |_: &Attempt| {
                eventually(Duration::from_secs(5), "the copy waits", || idem.stats().waits == 1);
                std::thread::sleep(Duration::from_millis(100));
                Ok::<_, String>("first".to_string())
            })
        });
        eventually(Duration::from_secs(5), "the first claims", || idem.stats().first_runs == 1);
        let copy = idem.process("w", |_: &Attempt| Err::<String, _>("not run"));
        (first.join().unwrap().unwrap(), copy.unwrap())
    });
    assert!(!first.is_replay());
    assert_eq!(copy.into_value().as_deref(), Some("first"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_loop_and_batches_on_a_cluster() {
    let cluster = Cluster::start();
    let idem = AsyncIdem::new(cluster.client()).await.unwrap();
    for i in 0..12 {
        let key = format!("a:{i}");
        assert!(!idem.process(&key, |a| async move { Ok::<_, String>(a.number) }).await.unwrap().is_replay());
        assert!(idem.process(&key, |_| async { Err::<u64, _>("not run") }).await.unwrap().is_replay());
    }
    let names: Vec<String> = (0..20).map(|i| format!("ab:{i}")).collect();
    let keys: Vec<&str> = names.iter().map(String::as_str).collect();
    let claims = idem.claim_batch(&keys, None).await.unwrap();
    assert!(claims.iter().all(|c| matches!(c, Ok(Claim::New { .. }))), "{claims:?}");
    let items: Vec<(&str, &str, Option<Vec<u8>>)> =
        keys.iter().zip(&claims).map(|(k, c)| (*k, c.as_ref().unwrap().token().unwrap(), None)).collect();
    assert!(idem.complete_batch(&items).await.unwrap().iter().all(|d| d.as_ref().unwrap().completed()));
    let again = idem.claim_batch(&keys, None).await.unwrap();
    assert!(again.iter().all(|c| matches!(c, Ok(Claim::Done { result: None, .. }))), "{again:?}");
}
