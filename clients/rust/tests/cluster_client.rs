//! A 3-node Redis Cluster started by the test: the loop and the commands
//! routed by key, batches split by slot (one IDEM.MCLAIM per slot, which
//! would otherwise answer CROSSSLOT), sync and async, on the suite's edition
//! (the conformance cases' cluster runs are the module's only).
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
        let outcome = idem.process(name, |a: &Job| Ok::<_, String>(format!("{name}/{}", a.attempt()))).unwrap();
        assert!(!outcome.is_replay());
    }
    for name in &names {
        let outcome = idem.process(name, |_: &Job| Err::<String, _>("not run")).unwrap();
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
    let claims = idem.claim_many(&keys, Duration::from_secs(30)).unwrap();
    assert!(claims.iter().all(|c| matches!(c, Ok(Claim::New { attempt: 1, .. }))), "{claims:?}");
    if !functions {
        assert_eq!(calls("idem.mclaim") - before, slots.len() as i64, "one IDEM.MCLAIM per slot");
    }
    let tokens: Vec<String> = claims.iter().map(|c| c.as_ref().unwrap().token().unwrap().to_string()).collect();
    let items: Vec<DoneItem> = keys.iter().zip(&tokens).map(|(k, t)| DoneItem::new(*k, t).result("ok")).collect();
    assert!(idem.done_many(&items).unwrap().iter().all(|d| d.as_ref().unwrap().completed()));
    assert!(
        idem.claim_many(&keys, Duration::from_secs(30)).unwrap().iter().all(|c| matches!(c, Ok(Claim::Done { .. })))
    );
    // Keys sharing a hash tag share a slot: one call.
    let tagged = ["{t}:1", "{t}:2", "{t}:3"];
    let before = calls("idem.mclaim");
    let claims = idem.claim_many(&tagged, Duration::from_secs(30)).unwrap();
    if !functions {
        assert_eq!(calls("idem.mclaim") - before, 1);
    }
    let items: Vec<ReleaseItem> =
        tagged.iter().zip(&claims).map(|(k, c)| ReleaseItem::new(*k, c.as_ref().unwrap().token().unwrap())).collect();
    assert!(idem.release_many(&items).unwrap().into_iter().all(|r| r.unwrap()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_loop_and_batches_on_a_cluster() {
    let cluster = Cluster::start();
    let idem = AsyncIdem::new(cluster.client()).await.unwrap();
    for i in 0..12 {
        let key = format!("a:{i}");
        assert!(!idem.process(&key, |a| async move { Ok::<_, String>(a.attempt()) }).await.unwrap().is_replay());
        assert!(idem.process(&key, |_| async { Err::<u64, _>("not run") }).await.unwrap().is_replay());
    }
    let names: Vec<String> = (0..20).map(|i| format!("ab:{i}")).collect();
    let keys: Vec<&str> = names.iter().map(String::as_str).collect();
    let claims = idem.claim_many(&keys, Duration::from_secs(30)).await.unwrap();
    assert!(claims.iter().all(|c| matches!(c, Ok(Claim::New { .. }))), "{claims:?}");
    let items: Vec<DoneItem> =
        keys.iter().zip(&claims).map(|(k, c)| DoneItem::new(*k, c.as_ref().unwrap().token().unwrap())).collect();
    assert!(idem.done_many(&items).await.unwrap().iter().all(|d| d.as_ref().unwrap().completed()));
    let again = idem.claim_many(&keys, Duration::from_secs(30)).await.unwrap();
    assert!(again.iter().all(|c| matches!(c, Ok(Claim::Done { result: None, .. }))), "{again:?}");
}
