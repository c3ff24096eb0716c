//! A replica with `repl-diskless-load swapdb` (issue 35): the module
//! declares that it handles async loading, so a full sync is loaded into a
//! temporary database while the old one serves its records (without the
//! module's declaration the server refuses async loading and answers
//! `LOADING` instead); nothing of the module acts on the database being
//! loaded; when the two are swapped, the waiters whose record changed get
//! their answer, and the replica's records are the primary's. On every
//! server `make test` runs.
#[allow(dead_code)] // each test binary uses part of common/
mod common;

use common::cluster::wait_until;
use common::commands::{claim_new, digest, done, get_fields, get_opt};
use common::fixtures::{NONE, Snap, assert_same_record, populate, snapshot, snapshot_all};
use common::reply::{as_token, f_str, fields_from_reply};
use common::server::{Server, aof_args, parse_info, wait_replicas};
use common::waiters::{claimed, waiter};
use std::thread;
use std::time::{Duration, Instant};

/// Keys that make the primary's full sync last: with `rdb-key-save-delay`
/// at `SAVE_DELAY_US` a key, about 3 s. Each is as large as the chunks the
/// primary sends (16 KB): a loading replica answers clients only as bytes
/// arrive, so they must arrive steadily.
const BALLAST: usize = 200;
const BALLAST_BYTES: usize = 16 * 1024;
const SAVE_DELAY_US: i64 = 15_000;

/// A primary that sends full syncs straight to the socket, and a replica
/// that loads them with `repl-diskless-load swapdb` (plus `replica_args`),
/// synced once, so that their replication ids match: the next full sync is
/// loaded asynchronously.
fn primary_and_swapdb_replica(replica_args: &[&str]) -> (Server, Server) {
    let primary = Server::with_args(&[], &["--repl-diskless-sync", "yes"]);
    // A loading server answers clients between chunks of this many bytes
    // (2 MB by default, more than these tests load).
    let mut args = vec!["--repl-diskless-load", "swapdb", "--loading-process-events-interval-bytes", "1024"];
    args.extend_from_slice(replica_args);
    let replica = Server::with_args(&[], &args);
    replica.replicaof(&primary);
    (primary, replica)
}

/// Records in every state and a filter under `p:`, and the ballast.
fn populate_primary(con: &mut redis::Connection) -> Vec<String> {
    let fixture = populate(con, "p:");
    let _: Vec<i64> = redis::cmd("IDEM.BF.MADD").arg("p:seen").arg(&["a", "b", "c"]).query(con).unwrap();
    let mut pipe = redis::pipe();
    for i in 0..BALLAST {
        pipe.cmd("SET").arg(format!("ballast:{i}")).arg("b".repeat(BALLAST_BYTES)).ignore();
    }
    let _: () = pipe.query(con).unwrap();
    fixture.keys
}

/// Cuts the replica off and overwrites the backlog, so that it must sync
/// again in full, slowly (`SAVE_DELAY_US` a key), after the writes of
/// `changes`, made in the same transaction.
fn force_slow_full_sync(con: &mut redis::Connection, changes: impl FnOnce(&mut redis::Pipeline)) {
    let _: () = redis::cmd("CONFIG").arg("SET").arg("rdb-key-save-delay").arg(SAVE_DELAY_US).query(con).unwrap();
    let mut pipe = redis::pipe();
    pipe.atomic();
    pipe.cmd("CLIENT").arg("KILL").arg("TYPE").arg("replica").ignore();
    pipe.cmd("CONFIG").arg("SET").arg("repl-backlog-size").arg(16384).ignore();
    for i in 0..10 {
        pipe.cmd("SET").arg(format!("backlog:{i}")).arg("A".repeat(16384)).ignore();
    }
    changes(&mut pipe);
    let _: () = pipe.query(con).unwrap();
}

/// The same records (the time left on leases and keys within `tol_ms`),
/// or both missing.
fn assert_same(before: &[Snap], after: &[Snap], tol_ms: i64, what: &str) {
    assert_eq!(before.len(), after.len());
    for (b, a) in before.iter().zip(after) {
        match (&b.fields, &a.fields) {
            (None, None) => {}
            _ => assert_same_record(b, a, tol_ms, what),
        }
    }
}

/// The records of `keys` (`IDEM.GET` and `PEXPIRETIME`), the filter's
/// answer for `a` and `d`, an `IDEM.SCAN` page, and whether the replica
/// was still loading after them, in one round trip: a loading server
/// answers between chunks of the sync (Valkey 9.1 some 250 ms apart here),
/// so reads sent one at a time outlasted the load and saw the new database.
/// When the last answer says it still loads, every one before it was
/// served by the old database.
fn read_while_loading(rcon: &mut redis::Connection, keys: &[&str]) -> (Vec<Snap>, Vec<i64>, bool) {
    let mut pipe = redis::pipe();
    for key in keys {
        pipe.cmd("IDEM.GET").arg(*key).cmd("PEXPIRETIME").arg(*key);
    }
    pipe.cmd("IDEM.BF.MEXISTS").arg("p:seen").arg(&["a", "d"]);
    pipe.cmd("IDEM.SCAN").arg(0);
    pipe.cmd("INFO").arg("persistence");
    let mut replies: Vec<redis::Value> = pipe.query(rcon).expect("the reads while loading");
    let info: String = redis::from_redis_value(&replies.pop().unwrap()).unwrap();
    let scan = replies.pop().unwrap();
    assert!(matches!(scan, redis::Value::Array(ref page) if page.len() == 2), "IDEM.SCAN while loading: {scan:?}");
    let seen: Vec<i64> = redis::from_redis_value(&replies.pop().unwrap()).unwrap();
    let snaps = keys
        .iter()
        .zip(replies.chunks(2))
        .map(|(key, pair)| Snap {
            key: key.to_string(),
            fields: fields_from_reply(pair[0].clone()),
            pexpiretime: redis::from_redis_value(&pair[1]).unwrap(),
        })
        .collect();
    (snaps, seen, parse_info(&info)["async_loading"] == "1")
}

fn async_loading(replica: &Server) -> bool {
    let text: String = redis::cmd("INFO").arg("persistence").query(&mut replica.conn()).unwrap();
    parse_info(&text)["async_loading"] == "1"
}

/// The replica caught up after the swap: the link is up, no sync runs,
/// and it has every write of the primary's connection `con`.
fn caught_up(con: &mut redis::Connection, replica: &Server) {
    wait_until("the replica's link up after the full sync", Duration::from_secs(30), || {
        let text: String = redis::cmd("INFO").arg("replication").query(&mut replica.conn()).unwrap();
        let info = parse_info(&text);
        info["master_link_status"] == "up" && info["master_sync_in_progress"] == "0"
    });
    let _: () = redis::cmd("SET").arg("synced").arg(1).query(con).unwrap();
    wait_replicas(con, 1);
}

#[test]
fn the_replica_serves_its_records_while_it_loads_and_equals_the_primary_after() {
    let (primary, replica) = primary_and_swapdb_replica(&[]);
    let mut con = primary.conn();
    let mut keys = populate_primary(&mut con);
    keys.push("p:new".into());
    let token = claim_new(&mut con, "p:new", 600);
    wait_replicas(&mut con, 1);
    let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let old: Vec<Snap> = snapshot_all(&mut replica.conn(), &key_refs);
    let processing = f_str(&get_fields(&mut con, "p:rec:processing"), "state");
    assert_eq!(processing, "processing");

    // The primary changes records while the replica is cut off.
    force_slow_full_sync(&mut con, |pipe| {
        pipe.cmd("DEL").arg("p:rec:released").ignore();
        pipe.cmd("IDEM.DONE").arg("p:new").arg(&token).arg("RESULT").arg("after").ignore();
        pipe.cmd("IDEM.BF.ADD").arg("p:seen").arg("d").ignore();
    });
    wait_until("the replica loading asynchronously", Duration::from_secs(20), || async_loading(&replica));

    // The old database serves, unchanged: reads, the filter, IDEM.SCAN.
    let mut rcon = replica.conn();
    let (during, seen, still_loading) = read_while_loading(&mut rcon, &key_refs);
    assert!(still_loading, "the load ended before the old database was read: make it slower");
    assert_same(&old, &during, 5000, "while the replica loads");
    assert_eq!(seen, vec![1, 0], "the filter as it was before the sync");

    // After the swap: the primary's records, exactly.
    wait_until("the load to end", Duration::from_secs(30), || !async_loading(&replica));
    let _: () = redis::cmd("CONFIG").arg("SET").arg("rdb-key-save-delay").arg(0).query(&mut con).unwrap();
    caught_up(&mut con, &replica);
    assert_eq!(get_opt(&mut rcon, "p:rec:released"), None);
    assert_eq!(f_str(&get_fields(&mut rcon, "p:new"), "state"), "done");
    assert_same(&snapshot_all(&mut con, &key_refs), &snapshot_all(&mut rcon, &key_refs), 1000, "after the swap");
    assert_eq!(digest(&mut rcon), digest(&mut con), "the replica differs from the primary");
}

/// Waiters on a writable replica (`replica-read-only no`) wait on its old
/// database while the full sync loads, and get their answer from the
/// swap: `DONE` for a record the primary completed, a claim (`NEW`) of
/// one the primary deleted, at once (on Redis 7.0 the module hears the
/// swap itself), and no answer for one still processing.
#[test]
fn waiters_on_a_replica_get_their_answer_from_the_swap() {
    let (primary, replica) = primary_and_swapdb_replica(&["--replica-read-only", "no"]);
    let mut con = primary.conn();
    populate_primary(&mut con);
    let completed = claim_new(&mut con, "w:completed", 600);
    claim_new(&mut con, "w:deleted", 600);
    claim_new(&mut con, "w:busy", 600);
    wait_replicas(&mut con, 1);
    let waiters: Vec<_> =
        ["w:completed", "w:deleted", "w:busy"].iter().map(|key| waiter(&replica, key, 60, 20_000, &[])).collect();
    force_slow_full_sync(&mut con, |pipe| {
        pipe.cmd("IDEM.DONE").arg("w:completed").arg(&completed).arg("RESULT").arg("r").ignore();
        pipe.cmd("DEL").arg("w:deleted").ignore();
    });
    wait_until("the replica loading asynchronously", Duration::from_secs(20), || async_loading(&replica));
    // At every look while the load lasts, no waiter was answered.
    loop {
        let answered = waiters.iter().any(|w| w.is_finished());
        if !async_loading(&replica) {
            break;
        }
        assert!(!answered, "a waiter was answered from the database being loaded");
        thread::sleep(Duration::from_millis(20));
    }
    let swapped = Instant::now();
    let mut waiters = waiters.into_iter();
    let ((status, result, attempt), _) = claimed(waiters.next().unwrap());
    assert_eq!((status.as_str(), attempt), ("DONE", 1));
    assert_eq!(result, redis::Value::BulkString(b"r".to_vec()));
    let ((status, token, attempt), _) = claimed(waiters.next().unwrap());
    assert_eq!((status.as_str(), attempt), ("NEW", 1), "the waiter on the deleted record");
    assert!(swapped.elapsed() < Duration::from_secs(3), "answered {:?} after the swap", swapped.elapsed());
    let busy = waiters.next().unwrap();
    assert!(!busy.is_finished(), "the waiter on a record still processing was answered");
    // The replica's own claim (a writable replica's write) completes there.
    let mut rcon = replica.conn();
    assert_eq!(done(&mut rcon, "w:deleted", &as_token(&token), NONE), Ok(1));
    let _: () =
        redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("normal").arg("SKIPME").arg("yes").query(&mut rcon).unwrap();
    let _ = busy.join();
    let _: () = redis::cmd("CONFIG").arg("SET").arg("rdb-key-save-delay").arg(0).query(&mut con).unwrap();
    caught_up(&mut con, &replica);
    let same = ["w:completed", "w:busy", "p:rec:done-fp", "p:rec:processing"];
    assert_same(&snapshot_all(&mut con, &same), &snapshot_all(&mut rcon, &same), 1000, "after the swap");
}

/// The wake-ups the swap owes are writes (a waiter's claim): while writes
/// are paused on the replica (`CLIENT PAUSE WRITE`; its AOF is on, so a
/// write would propagate), they wait for the pause to end, and the replica
/// lives.
#[test]
fn the_swaps_wake_ups_wait_for_a_write_pause_to_end() {
    let mut args = vec!["--replica-read-only", "no"];
    args.extend(aof_args());
    let (mut primary, mut replica) = primary_and_swapdb_replica(&args);
    let mut con = primary.conn();
    populate_primary(&mut con);
    claim_new(&mut con, "w:deleted", 600);
    let released = claim_new(&mut con, "w:released", 600);
    wait_replicas(&mut con, 1);
    let deleted = waiter(&replica, "w:deleted", 60, 30_000, &[]);
    let retried = waiter(&replica, "w:released", 60, 30_000, &[]);
    // Paused before the sync starts (a loading server's clock lags).
    let mut rcon = replica.conn();
    let _: () = redis::cmd("CLIENT").arg("PAUSE").arg(9000).arg("WRITE").query(&mut rcon).unwrap();
    let paused = Instant::now();
    force_slow_full_sync(&mut con, |pipe| {
        pipe.cmd("DEL").arg("w:deleted").ignore();
        pipe.cmd("IDEM.RELEASE").arg("w:released").arg(&released).ignore();
    });
    wait_until("the replica loading asynchronously", Duration::from_secs(20), || async_loading(&replica));
    wait_until("the load to end", Duration::from_secs(30), || !async_loading(&replica));
    thread::sleep(Duration::from_millis(300));
    assert!(paused.elapsed() < Duration::from_millis(8500), "the load outlasted the pause: make it faster");
    replica.assert_alive();
    assert!(!deleted.is_finished() && !retried.is_finished(), "a waiter claimed while writes were paused");
    let ((status, _, attempt), _) = claimed(deleted);
    assert_eq!((status.as_str(), attempt), ("NEW", 1));
    let ((status, _, attempt), _) = claimed(retried);
    assert_eq!((status.as_str(), attempt), ("RETRY", 2));
    assert!(paused.elapsed() >= Duration::from_millis(8900), "claimed {:?} into a 9 s pause", paused.elapsed());
    replica.assert_alive();
    primary.assert_alive();
    let _: () = redis::cmd("CONFIG").arg("SET").arg("rdb-key-save-delay").arg(0).query(&mut con).unwrap();
    caught_up(&mut con, &replica);
    // The replica's own claim stands on it; a record the primary did not
    // touch is the primary's.
    assert_eq!(f_str(&get_fields(&mut rcon, "w:released"), "state"), "processing");
    let key = "p:rec:done-fp";
    assert_same(&[snapshot(&mut con, key)], &[snapshot(&mut rcon, key)], 1000, "after the swap");
}
