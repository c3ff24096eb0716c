//! A replica ends up identical to its primary (same tokens, attempts and
//! absolute times); after a failover the old primary's tokens keep working.
mod common;

use common::*;
use std::time::Duration;

fn wait_replicas(con: &mut redis::Connection, n: i64) {
    let acked: i64 = redis::cmd("WAIT").arg(n).arg(10_000).query(con).expect("WAIT");
    assert_eq!(acked, n, "WAIT {n}: only {acked} replica(s) acknowledged");
}

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
