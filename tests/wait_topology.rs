//! `IDEM.CLAIM ... WAIT ms` across servers: a waiter's claim as the
//! replica and an AOF replay hold it, waiters on a primary demoted in a
//! failover, waiters on a key whose slot migrates away, and waiters with
//! `BLOOM` on a key that gets deleted.
#[allow(dead_code)] // each test binary uses part of common/
mod common;

use common::clock::sleep_until;
use common::cluster::{Cluster, key_slot, tag_where, wait_until};
use common::commands::{
    bf_add, bf_exists, claim, claim_new, digest_value, done, exists, fingerprint_hex, get_fields, idem_counters,
    release,
};
use common::fixtures::{NONE, assert_same_records, snapshot_all};
use common::reply::{as_bytes, as_token, f_int, f_str};
use common::server::{Server, Shutdown, aof_args, blocked_clients, parse_info, wait_replicas};
use common::waiters::{Waited, blocked, claimed, error_reply, waiter};
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// Relative fields (`lease_ms`, `pttl`) of two snapshots taken this far
/// apart at most; absolute ones must be equal.
const TOL_MS: i64 = 5000;

/// `BLPOP key timeout_s`: one of the server's own blocked clients.
fn blpop(s: &Server, key: &str, timeout_s: i64) -> JoinHandle<Waited> {
    let mut cmd = redis::cmd("BLPOP");
    cmd.arg(key).arg(timeout_s);
    blocked(s, cmd)
}

/// Every file of the server's multi-part AOF, concatenated.
fn aof_bytes(s: &Server) -> Vec<u8> {
    let dir = s.dir.join("appendonlydir");
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    names.sort();
    names.iter().flat_map(|path| std::fs::read(path).unwrap()).collect()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn a_waiters_claim_reaches_the_replica_and_replays_from_the_aof_as_the_primary_made_it() {
    // A command-by-command AOF, never rewritten: the restart replays the
    // very writes the waiters made.
    let mut args = aof_args();
    args.extend(["--auto-aof-rewrite-percentage", "0"]);
    let mut primary = Server::with_args(&[], &args);
    let replica = Server::start();
    replica.replicaof(&primary);
    let (mut pc, mut rc) = (primary.conn(), replica.conn());

    // Two ways a waiter claims: the holder's RELEASE (the waiter runs in
    // the reply callback of RELEASE's signal) and the lease's end (the
    // waiter runs from a timer's signal).
    let holder = claim_new(&mut pc, "released", 30);
    claim_new(&mut pc, "lapsed", 1);
    let on_release = waiter(&primary, "released", 30, 10_000, &["PAYLOAD", "p"]);
    let on_lapse = waiter(&primary, "lapsed", 45, 10_000, &["MAXTRIES", "5"]);
    assert_eq!(release(&mut pc, "released", &holder), 1);
    let mut tokens = Vec::new();
    for handle in [on_release, on_lapse] {
        let ((status, value, attempt), _) = claimed(handle);
        assert_eq!((status.as_str(), attempt), ("RETRY", 2));
        tokens.push(as_token(&value));
    }
    let keys = ["released", "lapsed"];
    let made = snapshot_all(&mut pc, &keys);
    for (snap, lease_ms) in made.iter().zip([30_000, 45_000]) {
        let fields = snap.fields.as_ref().unwrap();
        assert_eq!((f_str(fields, "state"), f_int(fields, "attempt")), ("processing".to_string(), 2));
        let lease = f_int(fields, "lease_ms");
        assert!(lease > lease_ms - 5000 && lease <= lease_ms, "{}: lease_ms {lease}", snap.key);
    }
    assert_eq!(f_str(made[0].fields.as_ref().unwrap(), "fingerprint"), fingerprint_hex(b"p"));
    let digests: Vec<String> = keys.iter().map(|k| digest_value(&mut pc, k)).collect();

    // The replica holds what the primary holds: same times, same digest.
    wait_replicas(&mut pc, 1);
    assert_same_records(&made, &snapshot_all(&mut rc, &keys), TOL_MS, "replica");
    for (key, digest) in keys.iter().zip(&digests) {
        assert_eq!(&digest_value(&mut rc, key), digest, "DEBUG DIGEST-VALUE of {key} on the replica");
    }

    // The AOF holds the claims as their effects (IDEM.APPLY), never as a
    // CLAIM to run again: a replay neither blocks nor draws new tokens.
    let aof = aof_bytes(&primary);
    assert!(contains(&aof, b"IDEM.APPLY"), "the AOF has no IDEM.APPLY");
    assert!(!contains(&aof, b"IDEM.CLAIM"), "the AOF holds an IDEM.CLAIM");

    // Restarted from the AOF alone, the primary holds the same records.
    drop(pc);
    primary.restart(Shutdown::NoSave);
    let mut pc = primary.conn();
    assert_same_records(&made, &snapshot_all(&mut pc, &keys), TOL_MS, "AOF replay");
    for (key, digest) in keys.iter().zip(&digests) {
        assert_eq!(&digest_value(&mut pc, key), digest, "DEBUG DIGEST-VALUE of {key} after the AOF replay");
    }
    // ...with the waiters' tokens holding the claims (IDEM.GET never shows
    // a token: DONE tells), and the first holder's stale.
    assert!(done(&mut pc, "released", &holder, NONE).unwrap_err().starts_with("STALE"));
    for (key, token) in keys.iter().zip(&tokens) {
        assert_eq!(done(&mut pc, key, token, ("RESULT", "r")), Ok(1), "DONE {key} with its waiter's token");
    }
}

/// How a primary is demoted.
#[derive(Clone, Copy, Debug)]
enum Demotion {
    /// `REPLICAOF NO ONE` on its replica, then `REPLICAOF <replica>` on it.
    Replicaof,
    /// `FAILOVER` on it (Redis 6.2+, Valkey): it pauses writes, waits for
    /// its replica, hands over and becomes the replica.
    Failover,
}

fn role(con: &mut redis::Connection) -> String {
    let text: String = redis::cmd("INFO").arg("replication").query(con).unwrap();
    parse_info(&text)["role"].clone()
}

/// The clients whose last command was one of `names` (`CLIENT LIST`'s
/// `cmd=`, in any case).
fn clients_running(con: &mut redis::Connection, names: &[&str]) -> usize {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(con).unwrap();
    let ran =
        |field: &str| field.strip_prefix("cmd=").is_some_and(|cmd| names.iter().any(|n| cmd.eq_ignore_ascii_case(n)));
    list.lines().filter(|line| line.split(' ').any(ran)).count()
}

/// A primary with two waiters (and a BLPOP client: one of the server's own
/// blocked clients) on a key a third client holds for `lease` s is demoted.
/// The waiters get the error the server gives its own blocked clients, at
/// once, and leave nothing behind; the promoted replica serves the key's
/// later claims and waiters.
fn waiters_on_a_demoted_primary(how: Demotion, lease: i64) {
    let old = Server::start();
    let new = Server::start();
    new.replicaof(&old);
    let (mut oc, mut nc) = (old.conn(), new.conn());
    let holder = claim_new(&mut oc, "k", lease);
    let lease_end = f_int(&get_fields(&mut oc, "k"), "claimed_at") + lease * 1000;
    wait_replicas(&mut oc, 1);
    let waiters: Vec<_> = (0..2).map(|_| waiter(&old, "k", 30, 20_000, &[])).collect();
    let own = blpop(&old, "list", 20);
    assert_eq!(clients_running(&mut oc, &["idem.claim", "blpop"]), 3);
    let counters_before = idem_counters(&mut oc);

    match how {
        Demotion::Replicaof => {
            let _: () = redis::cmd("REPLICAOF").arg("NO").arg("ONE").query(&mut nc).unwrap();
            let _: () = redis::cmd("REPLICAOF").arg("127.0.0.1").arg(new.port).query(&mut oc).unwrap();
        }
        Demotion::Failover => {
            let _: () = redis::cmd("FAILOVER").query(&mut oc).unwrap();
        }
    }
    // The server's own blocked client gets an error; the waiters get the
    // same one, at once.
    let (own_error, _) = error_reply(own);
    assert!(own_error.starts_with("UNBLOCKED"), "{how:?}: BLPOP got {own_error}");
    for handle in waiters {
        let (error, waited) = error_reply(handle);
        assert_eq!(error, own_error, "{how:?}: the waiter's error");
        assert!(waited < Duration::from_secs(10), "{how:?}: answered after {waited:?}");
    }
    wait_until("the demoted primary is a replica", Duration::from_secs(30), || role(&mut oc) == "slave");
    wait_until("the replica is promoted", Duration::from_secs(30), || role(&mut nc) == "master");
    old.replicaof(&new);

    // Nothing left behind on the demoted primary: no blocked client, the
    // waiters' connections closed (the server closes them after the error),
    // each wait counted as unblocked, and no claim made for them.
    assert_eq!(blocked_clients(&mut oc), 0);
    wait_until("the waiters' connections close", Duration::from_secs(5), || {
        clients_running(&mut oc, &["idem.claim", "blpop"]) == 0
    });
    let counters = idem_counters(&mut oc);
    assert_eq!(counters["wait_unblocked"] - counters_before["wait_unblocked"], 2, "{how:?}: {counters:?}");
    for name in ["wait_claimed", "wait_done", "wait_timeout", "claim_retry", "claim_busy"] {
        assert_eq!(counters[name], counters_before[name], "{how:?}: {name}: {counters:?}");
    }
    let mut holder = (holder, 1);
    if lease <= 5 {
        // Past the lease's end (the waiters' wake-up time) the demoted node
        // made no claim for them...
        sleep_until(&mut oc, lease_end + 300);
        assert_eq!(idem_counters(&mut oc), counters, "{how:?}: INFO idem of the demoted node");
        // ...and the new primary grants the lapsed key to a new holder.
        let (status, value, attempt) = claim(&mut nc, "k", 30);
        assert_eq!((status.as_str(), attempt), ("RETRY", 2), "{how:?}: CLAIM on the new primary");
        holder = (as_token(&value), 2);
    }

    // The new primary serves the key: a waiter blocks there and gets the
    // holder's outcome; the demoted node replicates it.
    let w = waiter(&new, "k", 30, 10_000, &[]);
    assert_eq!(done(&mut nc, "k", &holder.0, ("RESULT", "r")), Ok(1));
    let ((status, value, attempt), _) = claimed(w);
    assert_eq!((status.as_str(), as_bytes(&value), attempt), ("DONE", Some(b"r".to_vec()), holder.1), "{how:?}");
    wait_replicas(&mut nc, 1);
    assert_eq!(digest_value(&mut oc, "k"), digest_value(&mut nc, "k"), "{how:?}");
    assert_eq!(f_str(&get_fields(&mut oc, "k"), "state"), "done");
}

#[test]
fn waiters_on_a_primary_demoted_by_replicaof_get_the_servers_unblocked_error() {
    // A short lease: its end, past the demotion, must wake nobody.
    waiters_on_a_demoted_primary(Demotion::Replicaof, 2);
}

#[test]
fn waiters_on_a_primary_demoted_by_failover_get_the_servers_unblocked_error() {
    // A lease that outlasts the FAILOVER's write pause (see the known
    // limitation in docs/commands.md).
    waiters_on_a_demoted_primary(Demotion::Failover, 30);
}

fn setslot(con: &mut redis::Connection, slot: u16, how: &str, node_id: &str) {
    let r: String = redis::cmd("CLUSTER").arg("SETSLOT").arg(slot).arg(how).arg(node_id).query(con).unwrap();
    assert_eq!(r, "OK", "CLUSTER SETSLOT {slot} {how} {node_id}");
}

fn keys_in_slot(con: &mut redis::Connection, slot: u16) -> i64 {
    redis::cmd("CLUSTER").arg("COUNTKEYSINSLOT").arg(slot).query(con).unwrap()
}

#[test]
fn a_waiter_on_a_key_whose_slot_migrates_away_gets_the_servers_redirect() {
    let cluster = Cluster::start();
    let topo = cluster.topology();
    let primaries = topo.primaries();
    let (src, dst) = (primaries[0].clone(), primaries[1].clone());
    let tag = tag_where("wait-", |s| src.owns(s));
    let slot = key_slot(&tag);
    let (key, list) = (format!("{{{tag}}}:k"), format!("{{{tag}}}:list"));
    let source = cluster.server(src.port);
    let (mut sc, mut dc) = (cluster.conn(src.port), cluster.conn(dst.port));
    let holder = claim_new(&mut sc, &key, 30);
    let w = waiter(source, &key, 30, 20_000, &[]);
    // One of the server's own blocked clients, on a key of the same slot.
    let own = blpop(source, &list, 20);
    let counters_before = idem_counters(&mut sc);

    // The slot moves as `redis-cli --cluster reshard` moves it: MIGRATE
    // deletes the record on the source (which wakes its waiters where a
    // deletion does), then both nodes hand the slot over.
    setslot(&mut dc, slot, "IMPORTING", &src.id);
    setslot(&mut sc, slot, "MIGRATING", &dst.id);
    let moved: String = redis::cmd("MIGRATE")
        .arg("127.0.0.1")
        .arg(dst.port)
        .arg(&key)
        .arg(0)
        .arg(5000)
        .query(&mut sc)
        .expect("MIGRATE");
    assert_eq!(moved, "OK");
    // The record left the source, and no waiter's claim took its place
    // there: a claim on a node that gave the record away would be granted
    // twice (the record, busy, lives on the destination).
    thread::sleep(Duration::from_millis(200));
    assert_eq!(keys_in_slot(&mut sc, slot), 0, "the source holds a key of the migrating slot");
    setslot(&mut dc, slot, "NODE", &dst.id);
    setslot(&mut sc, slot, "NODE", &dst.id);

    // The server redirects its own blocked client (-MOVED), and the waiter
    // gets the same redirect.
    let (own_error, _) = error_reply(own);
    assert_eq!(own_error, format!("MOVED {slot} 127.0.0.1:{}", dst.port), "BLPOP's error");
    let (error, waited) = error_reply(w);
    assert_eq!(error, own_error, "the waiter's error");
    assert!(waited < Duration::from_secs(10), "answered after {waited:?}");
    assert_eq!(blocked_clients(&mut sc), 0);
    let counters = idem_counters(&mut sc);
    assert_eq!(counters["wait_unblocked"] - counters_before["wait_unblocked"], 1, "{counters:?}");
    for name in ["wait_claimed", "wait_done", "wait_timeout", "claim_new", "claim_retry"] {
        assert_eq!(counters[name], counters_before[name], "{name}: {counters:?}");
    }

    // The destination holds the record as it was: the holder's claim, on
    // which a waiter blocks there until the holder's DONE.
    let w = waiter(cluster.server(dst.port), &key, 30, 10_000, &[]);
    assert_eq!(done(&mut dc, &key, &holder, ("RESULT", "r")), Ok(1));
    let ((status, value, attempt), _) = claimed(w);
    assert_eq!((status.as_str(), as_bytes(&value), attempt), ("DONE", Some(b"r".to_vec()), 1));

    // In cluster mode a deletion wakes no waiter, on any server: a node
    // cannot tell a DEL from a record leaving with its slot. The waiter
    // waits on, and on the key's next holder.
    let other = format!("{{{tag}}}:deleted");
    claim_new(&mut dc, &other, 30);
    let w = waiter(cluster.server(dst.port), &other, 30, 10_000, &[]);
    let _: i64 = redis::cmd("DEL").arg(&other).query(&mut dc).unwrap();
    thread::sleep(Duration::from_millis(300));
    assert!(!w.is_finished(), "the deletion woke the waiter");
    assert!(!exists(&mut dc, &other), "the deletion woke a waiter that claimed the key");
    let next = claim_new(&mut dc, &other, 30);
    thread::sleep(Duration::from_millis(100));
    assert!(!w.is_finished(), "the waiter did not wait on the new holder");
    assert_eq!(done(&mut dc, &other, &next, ("RESULT", "next")), Ok(1));
    let ((status, value, attempt), _) = claimed(w);
    assert_eq!((status.as_str(), as_bytes(&value), attempt), ("DONE", Some(b"next".to_vec()), 1));
}

#[test]
fn a_deleted_key_answers_its_bloom_waiter_seen_or_new_as_the_filter_says() {
    let s = Server::start();
    let mut con = s.conn();
    // The filter has seen "seen" (a completion recorded there), not "fresh".
    assert_eq!(bf_add(&mut con, "f", "seen"), 1);
    assert_eq!(bf_exists(&mut con, "f", "fresh"), 0);
    let holders: Vec<String> = ["seen", "fresh"].iter().map(|key| claim_new(&mut con, key, 30)).collect();
    let waiters: Vec<_> = ["seen", "fresh"].iter().map(|key| waiter(&s, key, 30, 10_000, &["BLOOM", "f"])).collect();
    let deleted: i64 = redis::cmd("DEL").arg("seen").arg("fresh").query(&mut con).unwrap();
    assert_eq!(deleted, 2);
    let replies: Vec<_> = waiters.into_iter().map(claimed).collect();
    // On every server (on Redis 7.0 the module hears of the deletion),
    // each waiter claims the deleted key at once, as a CLAIM with the
    // filter answers: SEEN where the filter holds the key, NEW otherwise.
    for (((status, value, attempt), waited), (key, want)) in
        replies.into_iter().zip([("seen", "SEEN"), ("fresh", "NEW")])
    {
        assert_eq!((status.as_str(), attempt), (want, 1), "{key}");
        assert!(waited < Duration::from_secs(2), "{key}: answered after {waited:?}");
        let token = as_token(&value);
        assert!(!holders.contains(&token), "{key}: the holder's token again");
        assert_eq!(f_str(&get_fields(&mut con, key), "state"), "processing", "{key}");
        assert_eq!(done(&mut con, key, &token, ("BLOOM", "f")), Ok(1), "{key}");
    }
    let counters = idem_counters(&mut con);
    let got = (counters["wait_claimed"], counters["claim_seen"], counters["claim_new"]);
    // claim_new: the two holders and the "fresh" waiter.
    assert_eq!(got, (2, 1, 3), "{counters:?}");
    // Both keys are now in the filter.
    assert_eq!(bf_exists(&mut con, "f", "fresh"), 1);
    assert_eq!(blocked_clients(&mut con), 0);
}
