//! Idle filters lose their old shards without anyone writing to them, and
//! replicas drop exactly the same shards.
mod common;

use common::*;
use std::thread::sleep;
use std::time::Duration;

fn memory_usage(con: &mut redis::Connection, key: &str) -> Option<i64> {
    redis::cmd("MEMORY").arg("USAGE").arg(key).query(con).unwrap()
}

fn digest(con: &mut redis::Connection, key: &str) -> String {
    redis::cmd("DEBUG").arg("DIGEST-VALUE").arg(key).query::<Vec<String>>(con).unwrap().remove(0)
}

/// Sleeps until `ms` on the server's clock.
fn sleep_until(con: &mut redis::Connection, ms: i64) {
    let left = ms - server_ms(con);
    if left > 0 {
        sleep(Duration::from_millis(left as u64));
    }
}

#[test]
fn idle_filters_drop_old_shards_in_the_background_on_primary_and_replica() {
    let primary = Server::start();
    let replica = Server::start();
    replica.replicaof(&primary);
    let mut pc = primary.conn();
    let mut rc = replica.conn();

    // Start right after a second boundary, so the two adds land in
    // consecutive one-second shards.
    let now = server_ms(&mut pc);
    sleep_until(&mut pc, now - now % 1000 + 1000 + 50);
    let _: () = redis::cmd("IDEM.BF.RESERVE").arg("f").arg(0.01).arg(100_000).arg("WINDOW").arg(6).arg("SHARD").arg(1).query(&mut pc).unwrap();
    let first_start = server_ms(&mut pc) / 1000;
    let _: i64 = redis::cmd("IDEM.BF.ADD").arg("f").arg("old").query(&mut pc).unwrap();
    sleep_until(&mut pc, (first_start + 1) * 1000 + 50);
    let _: i64 = redis::cmd("IDEM.BF.ADD").arg("f").arg("new").query(&mut pc).unwrap();
    let big = memory_usage(&mut pc, "f").unwrap();

    // The first shard leaves the window at first_start + 6 s; the key lives
    // until first_start + 7 s. Nobody touches the key in between.
    sleep_until(&mut pc, (first_start + 6) * 1000 + 600);
    let small = memory_usage(&mut pc, "f").expect("the key is still there");
    assert!(small * 10 < big, "old shard dropped: {big} -> {small} bytes");
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut pc).unwrap();
    assert_eq!(acked, 1);
    assert_eq!(digest(&mut pc, "f"), digest(&mut rc, "f"), "the replica dropped the same shard");
    assert_eq!(memory_usage(&mut rc, "f"), Some(small));
    let seen: Vec<i64> = redis::cmd("IDEM.BF.MEXISTS").arg("f").arg("old").arg("new").query(&mut rc).unwrap();
    assert_eq!(seen, vec![0, 1]);
}
