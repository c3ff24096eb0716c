//! A replica ends up identical to its primary: records (same tokens,
//! attempts and absolute times; after a failover the old primary's tokens
//! keep working) and filters (same bits, shards and expiry, including the
//! shards the primary drops in the background).
#[allow(dead_code)] // each test binary uses part of common/
mod common;

use common::clock::{align_to_boundary, sleep_until};
use common::commands::{
    bf_add, bf_exists, bf_info, bf_info_opt, bf_mexists, claim, claim_new, claim_new_opts, claim_opts, digest_value,
    done, extend, get_fields, items, once, pexpiretime, release, reserve, server_ms,
};
use common::fixtures::{
    BfFixture, NONE, Snap, assert_same_filters, assert_same_records, check_fixture_tokens, populate, populate_filters,
    snapshot, snapshot_all,
};
use common::reply::{as_token, expect_err, f_str};
use common::server::{Server, wait_replicas};
use redis::Value;
use std::time::Duration;

/// Replica vs primary: exact on everything but the time-relative fields.
fn assert_replica_matches(primary: &[Snap], replica: &[Snap], what: &str) {
    assert_same_records(primary, replica, 2000, what);
}

#[test]
fn replica_matches_primary_then_failover() {
    let primary = Server::start();
    let mut replica = Server::start();
    let mut pc = primary.conn();

    // Before the replica links: these reach it by the full sync (RDB).
    let fx_sync = populate(&mut pc, "sync:");
    replica.replicaof(&primary);
    // After: these reach it as the command stream.
    let fx_stream = populate(&mut pc, "stream:");
    wait_replicas(&mut pc, 1);

    let mut keys = fx_sync.key_refs();
    keys.extend(fx_stream.key_refs());
    let mut rc = replica.conn();
    let p = snapshot_all(&mut pc, &keys);
    let r = snapshot_all(&mut rc, &keys);
    assert_replica_matches(&p, &r, "replica after sync + stream");
    let dbsize_p: i64 = redis::cmd("DBSIZE").query(&mut pc).unwrap();
    let dbsize_r: i64 = redis::cmd("DBSIZE").query(&mut rc).unwrap();
    assert_eq!(dbsize_p, dbsize_r);

    // Reads work on the read-only replica; writes are refused.
    let e = expect_err(&mut rc, "IDEM.CLAIM", ("sync:rec:released", 10));
    assert!(e.starts_with("READONLY"), "IDEM.CLAIM on a replica: {e}");
    let e = expect_err(&mut rc, "IDEM.ONCE", ("new-key", 10));
    assert!(e.starts_with("READONLY"), "IDEM.ONCE on a replica: {e}");

    // More changes on the primary, replicated as they happen: every kind of
    // write, including ones whose outcome depends on the primary's clock.
    let t = claim_new(&mut pc, "live", 600);
    assert_eq!(extend(&mut pc, "live", &t, 900), Ok(1));
    let t2 = claim_new_opts(&mut pc, "live2", 600, &["PAYLOAD", "p"]);
    assert_eq!(release(&mut pc, "live2", &t2), 1);
    let (st, v, _) = claim_opts(&mut pc, "live2", 600, &["PAYLOAD", "p"]);
    assert_eq!(st, "RETRY");
    let live2_token = as_token(&v);
    assert_eq!(once(&mut pc, "live3", 300), 1);
    wait_replicas(&mut pc, 1);
    let live_keys = ["live", "live2", "live3"];
    assert_replica_matches(
        &snapshot_all(&mut pc, &live_keys),
        &snapshot_all(&mut rc, &live_keys),
        "replica after live writes",
    );

    // Failover: the replica becomes a primary.
    let _: () = redis::cmd("REPLICAOF").arg("NO").arg("ONE").query(&mut rc).unwrap();
    replica.assert_alive();
    check_fixture_tokens(&mut rc, &fx_sync, |k| k.to_string());
    check_fixture_tokens(&mut rc, &fx_stream, |k| k.to_string());
    assert_eq!(done(&mut rc, "live", &t, ("RESULT", "after-failover")), Ok(1));
    assert_eq!(extend(&mut rc, "live2", &live2_token, 60), Ok(1));
    assert_eq!(release(&mut rc, "live2", &live2_token), 1);
    let (st, v, attempt) = claim(&mut rc, "live2", 60);
    assert_eq!((st.as_str(), attempt), ("RETRY", 3));
    assert_ne!(as_token(&v), live2_token);
    assert!(done(&mut rc, "live2", &live2_token, NONE).unwrap_err().starts_with("STALE"));
}

#[test]
fn replica_sees_lapsed_lease_and_retry() {
    // A lease that lapses is seen lapsed on the replica too (same absolute
    // lease end, the primary's), and a claim then is a RETRY there as well.
    let primary = Server::start();
    let replica = Server::start();
    replica.replicaof(&primary);
    let mut pc = primary.conn();
    let mut rc = replica.conn();
    let t = claim_new(&mut pc, "k", 1);
    wait_replicas(&mut pc, 1);
    let f = get_fields(&mut rc, "k");
    assert_eq!(f_str(&f, "state"), "processing");
    std::thread::sleep(Duration::from_millis(1150));
    let f = get_fields(&mut rc, "k");
    assert_eq!(f_str(&f, "state"), "expired", "replica sees the lapsed lease");
    let (st, v, attempt) = claim(&mut pc, "k", 60);
    assert_eq!((st.as_str(), attempt), ("RETRY", 2));
    let t2 = as_token(&v);
    wait_replicas(&mut pc, 1);
    assert_replica_matches(&[snapshot(&mut pc, "k")], &[snapshot(&mut rc, "k")], "after RETRY");
    let _: () = redis::cmd("REPLICAOF").arg("NO").arg("ONE").query(&mut rc).unwrap();
    assert!(done(&mut rc, "k", &t, NONE).unwrap_err().starts_with("STALE"));
    assert_eq!(done(&mut rc, "k", &t2, NONE), Ok(1));
}

#[test]
fn replica_filters_match_primary() {
    let primary = Server::start();
    let replica = Server::start();
    let mut pc = primary.conn();
    // Before the link: full sync. After: the command stream.
    let fx_sync = populate_filters(&mut pc, "sync:");
    replica.replicaof(&primary);
    let fx_stream = populate_filters(&mut pc, "stream:");
    let tok = claim_new_opts(&mut pc, "order:7", 60, &["BLOOM", "stream:bf:day"]);
    assert_eq!(done(&mut pc, "order:7", &tok, ("BLOOM", "stream:bf:day")), Ok(1));
    let tok = claim_new(&mut pc, "order:8", 60);
    assert_eq!(done(&mut pc, "order:8", &tok, ("BLOOM", "stream:bf:created-by-done")), Ok(1));
    // Writes around a shard boundary: the primary's clock decides the
    // shard, on the replica too.
    reserve(&mut pc, "edge", "0.01", 50, &["WINDOW", "366", "SHARD", "1"]);
    let b = align_to_boundary(&mut pc, 1000, 0);
    sleep_until(&mut pc, b + 1000 - 40);
    let mut batches = 0;
    while batches < 20_000 && server_ms(&mut pc) < b + 1000 + 40 {
        let mut pipe = redis::pipe();
        for i in batches..batches + 20 {
            pipe.cmd("IDEM.BF.MADD").arg("edge").arg(items(&format!("edge{i}:"), 0..10));
        }
        let _: Vec<Value> = pipe.query(&mut pc).unwrap();
        batches += 20;
    }
    let edge = bf_info(&mut pc, "edge");
    assert!(
        edge.shards.iter().filter(|s| s.items > 0).count() >= 2,
        "the writes should straddle a shard boundary: {edge:?}"
    );
    wait_replicas(&mut pc, 1);

    let mut rc = replica.conn();
    let mut keys = fx_sync.keys.clone();
    keys.extend(fx_stream.keys.clone());
    keys.extend(["stream:bf:created-by-done".to_string(), "edge".to_string()]);
    let mut probes = fx_sync.probes.clone();
    probes.extend(["order:7".to_string(), "order:8".to_string()]);
    probes.extend(items("edge1:", 0..10));
    probes.extend(items(&format!("edge{}:", batches - 1), 0..10));
    let fx = BfFixture { keys, probes };
    let p = fx.snap(&mut pc);
    let r = fx.snap(&mut rc);
    assert_same_filters(&p, &r, "replica vs primary");
    eprintln!("edge filter: {:?}", p.last().unwrap().info);
    assert_eq!(bf_exists(&mut rc, "stream:bf:day", "order:7"), 1);
    assert_eq!(bf_exists(&mut rc, "stream:bf:created-by-done", "order:8"), 1);

    // Reads work on the read-only replica; writes are refused.
    assert_eq!(bf_mexists(&mut rc, "sync:bf:day", &["d:1", "d:2"]), vec![1, 1]);
    assert!(bf_info_opt(&mut rc, "sync:bf:multi").is_some());
    for (name, args) in [
        ("IDEM.BF.ADD", vec!["sync:bf:day", "x"]),
        ("IDEM.BF.MADD", vec!["sync:bf:day", "x", "y"]),
        ("IDEM.BF.RESERVE", vec!["newf", "0.01", "100"]),
    ] {
        let e = expect_err(&mut rc, name, &args[..]);
        assert!(e.starts_with("READONLY"), "{name} on a replica: {e}");
    }
}

#[test]
fn replica_follows_background_shard_drops() {
    // An idle filter whose oldest shard left the window: the primary drops
    // the shard in the background (no command touches the key) and the
    // replica drops the same one.
    let primary = Server::start();
    let replica = Server::start();
    replica.replicaof(&primary);
    let mut pc = primary.conn();
    let mut rc = replica.conn();
    let start = align_to_boundary(&mut pc, 1000, 20) / 1000;
    reserve(&mut pc, "sweep", "0.01", 100, &["WINDOW", "4", "SHARD", "1"]);
    assert_eq!(bf_add(&mut pc, "sweep", "old"), 1);
    sleep_until(&mut pc, (start + 3) * 1000 + 20);
    assert_eq!(bf_add(&mut pc, "sweep", "new"), 1);
    let full = digest_value(&mut pc, "sweep");
    let full_usage: i64 = redis::cmd("MEMORY").arg("USAGE").arg("sweep").query(&mut pc).unwrap();
    // "old"'s shard leaves at start + 4, the key expires at start + 7.
    let leave = (start + 4) * 1000;
    sleep_until(&mut pc, leave + 10);
    let deadline = leave + 2500;
    let dropped_at = loop {
        let now = server_ms(&mut pc);
        if digest_value(&mut pc, "sweep") != full {
            break now;
        }
        assert!(
            now < deadline,
            "the idle filter's old shard was not dropped in the background within 2.5 s of leaving the window"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    eprintln!("background drop {} ms after the shard left the window", dropped_at - leave);
    let usage: i64 = redis::cmd("MEMORY").arg("USAGE").arg("sweep").query(&mut pc).unwrap();
    assert!(usage < full_usage, "MEMORY USAGE after the drop {usage} vs {full_usage} before");
    wait_replicas(&mut pc, 1);
    assert_eq!(
        digest_value(&mut rc, "sweep"),
        digest_value(&mut pc, "sweep"),
        "DEBUG DIGEST-VALUE after the background drop: replica vs primary"
    );
    assert_eq!(bf_info(&mut pc, "sweep"), bf_info(&mut rc, "sweep"));
    assert_eq!(bf_info(&mut rc, "sweep").starts(), vec![start + 3]);
    assert_eq!(pexpiretime(&mut pc, "sweep"), (start + 7) * 1000);
    assert_eq!(pexpiretime(&mut rc, "sweep"), (start + 7) * 1000);
    assert_eq!(bf_mexists(&mut rc, "sweep", &["old", "new"]), vec![0, 1]);
}
