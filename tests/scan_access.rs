//! `IDEM.SCAN` as the server's own `SCAN` would be (issue 35): it lists only
//! the keys its caller may read by its ACL key patterns, a `MATCH` pattern
//! no server can be crashed by (bounded as the servers fixed for
//! CVE-2024-31228 bound their matcher), and a walk leaves every key as a
//! plain `SCAN` does: no LRU/LFU change, no keyspace hit or miss, no `WATCH`
//! broken. On every server `make test` runs.
#[allow(dead_code)] // each test binary uses part of common/
mod common;

use common::commands::{claim_new, done, once};
use common::fixtures::NONE;
use common::reply::err_text;
use common::server::{Server, parse_info, wait_replicas};
use std::collections::BTreeSet;
use std::time::Duration;

/// A whole `IDEM.SCAN` iteration with `args` after the cursor.
fn scan_all(con: &mut redis::Connection, args: &[&str]) -> Result<BTreeSet<String>, String> {
    let mut cursor = "0".to_string();
    let mut keys = BTreeSet::new();
    loop {
        let (next, found): (String, Vec<String>) =
            redis::cmd("IDEM.SCAN").arg(&cursor).arg(args).query(con).map_err(|e| err_text(&e))?;
        keys.extend(found);
        if next == "0" {
            return Ok(keys);
        }
        cursor = next;
    }
}

fn set(keys: &[&str]) -> BTreeSet<String> {
    keys.iter().map(|k| k.to_string()).collect()
}

/// `ACL SETUSER name reset on nopass <rules...>` and a connection as it.
fn user_conn(s: &Server, name: &str, rules: &[&str]) -> redis::Connection {
    let mut admin = s.conn();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(name)
        .arg("reset")
        .arg("on")
        .arg("nopass")
        .arg(rules)
        .query(&mut admin)
        .unwrap_or_else(|e| panic!("ACL SETUSER {name} {rules:?}: {e}"));
    let mut con = s.conn();
    let _: () = redis::cmd("AUTH").arg(name).arg("x").query(&mut con).expect("AUTH");
    con
}

/// Records under `orders:`, `secret:` and `shared:`, and a plain key.
fn records(con: &mut redis::Connection) {
    for key in ["orders:1", "orders:2", "secret:1", "shared:1"] {
        assert_eq!(once(con, key, 600), 1);
    }
    let _: () = redis::cmd("SET").arg("orders:plain").arg("x").query(con).unwrap();
}

#[test]
fn scan_lists_only_the_keys_the_caller_may_read() {
    let s = Server::start();
    records(&mut s.conn());
    let all = set(&["orders:1", "orders:2", "secret:1", "shared:1"]);
    assert_eq!(scan_all(&mut s.conn(), &[]), Ok(all.clone()), "the default user reads every key");
    let orders = set(&["orders:1", "orders:2"]);
    for (user, rules, sees) in [
        ("orders", &["+idem.scan", "~orders:*"][..], orders.clone()),
        ("reads-orders", &["+idem.scan", "%R~orders:*"], orders.clone()),
        ("two-patterns", &["+idem.scan", "~orders:*", "%R~shared:*"], set(&["orders:1", "orders:2", "shared:1"])),
        // Write access alone is not read access.
        ("writes-secrets", &["+idem.scan", "~orders:*", "%W~secret:*"], orders),
        ("no-keys", &["+idem.scan"], BTreeSet::new()),
        ("every-key", &["+idem.scan", "allkeys"], all.clone()),
    ] {
        let mut con = user_conn(&s, user, rules);
        for args in [&[][..], &["COUNT", "1000"], &["MATCH", "*:1"], &["STATE", "done"]] {
            let expected: BTreeSet<String> = match args {
                ["MATCH", _] => sees.iter().filter(|key| key.ends_with(":1")).cloned().collect(),
                _ => sees.clone(),
            };
            assert_eq!(scan_all(&mut con, args), Ok(expected), "{user} ({rules:?}), IDEM.SCAN ... {args:?}");
        }
    }
    // docs/operations.md's reader and operator users, kept to a namespace.
    let mut reader = user_conn(&s, "idem-reader", &["~orders:*", "+idem.get", "+idem.scan"]);
    assert_eq!(scan_all(&mut reader, &["STATE", "done"]), Ok(set(&["orders:1", "orders:2"])));
}

#[test]
fn scan_from_a_script_is_refused_rather_than_unchecked() {
    let s = Server::start();
    records(&mut s.conn());
    let mut con = user_conn(&s, "scripted", &["+idem.scan", "+eval", "~orders:*"]);
    let refused: Result<redis::Value, String> = redis::cmd("EVAL")
        .arg("return redis.call('IDEM.SCAN', '0', 'COUNT', '1000')")
        .arg(0)
        .query(&mut con)
        .map_err(|e| err_text(&e));
    let error = refused.expect_err("IDEM.SCAN inside a script listed keys without the caller's key patterns");
    assert!(error.contains("cannot tell whose key permissions apply"), "{error}");
}

#[test]
fn a_match_deeper_than_the_servers_matcher_goes_is_refused() {
    let mut s = Server::start();
    let mut admin = s.conn();
    // The regression case of Redis's CVE-2024-31228 fix: a long key, and a
    // pattern whose every `*` is a level of recursion.
    let long_key = "a".repeat(50_000);
    let _: () = redis::cmd("SET").arg(&long_key).arg(1).query(&mut admin).unwrap();
    assert_eq!(once(&mut admin, "orders:1", 600), 1);
    // A user allowed IDEM.SCAN but not SCAN.
    let mut con = user_conn(&s, "scanner", &["+idem.get", "+idem.scan", "~*"]);
    for depth in [1001, 50_000] {
        let pattern = "*?".repeat(depth);
        let error = scan_all(&mut con, &["MATCH", &pattern]).expect_err("a pattern deeper than 1000 levels");
        assert_eq!(error, "ERR MATCH pattern has more than 1000 runs of '*', deeper than the server's matcher may go");
    }
    s.assert_alive();
    // The deepest the fixed servers follow is served.
    let deepest = "*?".repeat(1000);
    assert_eq!(scan_all(&mut con, &["MATCH", &deepest]), Ok(BTreeSet::new()));
    assert_eq!(scan_all(&mut con, &["MATCH", "orders:*"]), Ok(set(&["orders:1"])));
    s.assert_alive();
}

fn info_stat(con: &mut redis::Connection, name: &str) -> i64 {
    let text: String = redis::cmd("INFO").arg("stats").query(con).unwrap();
    parse_info(&text)[name].parse().unwrap()
}

fn object(con: &mut redis::Connection, what: &str, key: &str) -> i64 {
    redis::cmd("OBJECT").arg(what).arg(key).query(con).unwrap_or_else(|e| panic!("OBJECT {what} {key}: {e}"))
}

/// Every key `walk` reaches: a record in each state, a plain string, a hash.
fn keys_of_every_kind(con: &mut redis::Connection) -> Vec<&'static str> {
    claim_new(con, "processing", 600);
    let token = claim_new(con, "done", 600);
    assert_eq!(done(con, "done", &token, NONE), Ok(1));
    assert_eq!(once(con, "once", 600), 1);
    let _: () = redis::cmd("SET").arg("plain").arg("x").query(con).unwrap();
    let _: () = redis::cmd("HSET").arg("hash").arg("f").arg("v").query(con).unwrap();
    vec!["processing", "done", "once", "plain", "hash"]
}

/// Walks every key with IDEM.SCAN, as an operator's `ls` does, with and
/// without filters and MATCH.
fn walk(con: &mut redis::Connection) {
    for args in [&[][..], &["STATE", "done"], &["MATCH", "*o*", "IDLE", "1"], &["MINTRIES", "1", "COUNT", "1"]] {
        scan_all(con, args).unwrap_or_else(|e| panic!("IDEM.SCAN {args:?}: {e}"));
    }
}

/// Keyspace hits and misses, unchanged by a walk.
fn assert_walk_counts_nothing(con: &mut redis::Connection, walker: &mut redis::Connection) {
    let before = (info_stat(con, "keyspace_hits"), info_stat(con, "keyspace_misses"));
    walk(walker);
    let after = (info_stat(con, "keyspace_hits"), info_stat(con, "keyspace_misses"));
    assert_eq!(after, before, "keyspace (hits, misses) changed by IDEM.SCAN");
}

#[test]
fn a_walk_leaves_idle_times_and_keyspace_hits_as_they_were() {
    let primary = Server::start();
    let replica = Server::start();
    replica.replicaof(&primary);
    let mut con = primary.conn();
    let keys = keys_of_every_kind(&mut con);
    wait_replicas(&mut con, 1);
    // OBJECT IDLETIME counts whole seconds.
    std::thread::sleep(Duration::from_millis(2100));
    for server in [&primary, &replica] {
        let mut con = server.conn();
        let idle: Vec<i64> = keys.iter().map(|key| object(&mut con, "IDLETIME", key)).collect();
        assert!(idle.iter().all(|&seconds| seconds >= 2), "{idle:?}");
        assert_walk_counts_nothing(&mut con, &mut server.conn());
        for (key, before) in keys.iter().zip(&idle) {
            assert!(object(&mut con, "IDLETIME", key) >= *before, "IDEM.SCAN reset {key}'s idle time");
        }
    }
}

#[test]
fn a_walk_leaves_lfu_counters_as_they_were() {
    let s = Server::with_args(&[], &["--maxmemory-policy", "allkeys-lfu"]);
    let mut con = s.conn();
    let keys = keys_of_every_kind(&mut con);
    let freq: Vec<i64> = keys.iter().map(|key| object(&mut con, "FREQ", key)).collect();
    assert_walk_counts_nothing(&mut con, &mut s.conn());
    let after: Vec<i64> = keys.iter().map(|key| object(&mut con, "FREQ", key)).collect();
    assert_eq!(after, freq, "IDEM.SCAN raised LFU counters of {keys:?}");
}

/// Where the module reads keys as if to write them (Redis 7.0, which has
/// no way to read a key without counting a hit), nothing tells `WATCH` or
/// client-side caching that a key changed.
#[test]
fn a_walk_breaks_no_watch() {
    let s = Server::start();
    let mut con = s.conn();
    let keys = keys_of_every_kind(&mut con);
    let _: () = redis::cmd("WATCH").arg(&keys).query(&mut con).unwrap();
    walk(&mut s.conn());
    let _: () = redis::cmd("MULTI").query(&mut con).unwrap();
    let _: () = redis::cmd("SET").arg("after-watch").arg(1).query(&mut con).unwrap();
    let exec: Option<Vec<String>> = redis::cmd("EXEC").query(&mut con).unwrap();
    assert_eq!(exec, Some(vec!["OK".to_string()]), "a walk made a WATCHed transaction fail");
}

/// Keys that expire while writes are paused (`CLIENT PAUSE WRITE`, a
/// replica and an AOF attached): a walk in the pause reads them without
/// deleting them (which would propagate, and abort the server in a pause),
/// lists none of them, and after the pause the replica equals the primary.
#[test]
fn a_walk_during_a_write_pause_lists_no_expired_record_and_writes_nothing() {
    let mut primary = Server::with_args(&[], &common::server::aof_args());
    let replica = Server::start();
    replica.replicaof(&primary);
    let mut con = primary.conn();
    for i in 0..20 {
        assert_eq!(once(&mut con, &format!("short:{i}"), 600), 1);
        let _: i64 = redis::cmd("PEXPIRE").arg(format!("short:{i}")).arg(300).query(&mut con).unwrap();
    }
    assert_eq!(once(&mut con, "long", 600), 1);
    wait_replicas(&mut con, 1);
    let _: () = redis::cmd("CLIENT").arg("PAUSE").arg(1500).arg("WRITE").query(&mut con).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    for server in [&primary, &replica] {
        assert_eq!(scan_all(&mut server.conn(), &["COUNT", "5"]), Ok(set(&["long"])));
    }
    primary.assert_alive();
    std::thread::sleep(Duration::from_millis(1200));
    let _: () = redis::cmd("SET").arg("after-pause").arg(1).query(&mut con).unwrap();
    wait_replicas(&mut con, 1);
    assert_eq!(common::commands::digest(&mut con), common::commands::digest(&mut replica.conn()));
    primary.assert_alive();
}
