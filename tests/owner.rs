//! Who holds a claim (docs/commands.md, `OWNER` of `IDEM.CLAIM` and
//! `IDEM.MCLAIM`): a granted claim stores it, replacing the previous
//! holder's (none clears it), a refused one changes nothing; it stays while
//! processing, released or expired and goes with DONE and REQUEUE; only
//! `IDEM.GET` shows it (RESP2 and RESP3); a waiter granted the claim stores
//! its own; replicas, the AOF, RDB, DUMP/RESTORE and COPY keep it.
#[allow(dead_code)] // each test binary uses part of common/
mod common;

use common::commands::{
    claim_new, digest, digest_value, done, extend, get_fields, get_opt, idem_counters, pexpiretime, release,
};
use common::fixtures::{BIN_OWNER, NONE, assert_same_records, claim_owned, snapshot_all};
use common::reply::{as_token, f_bytes, f_str, fields_from_reply, parse_claim};
use common::server::{Server, aof_args, wait_replicas};
use common::waiters::{claimed, waiter};
use redis::Value;
use std::time::Duration;

fn owner(con: &mut redis::Connection, key: &str) -> Option<Vec<u8>> {
    f_bytes(&get_fields(con, key), "owner")
}

/// `IDEM.CLAIM key lease <opts>` as its raw reply.
fn claim_raw(con: &mut redis::Connection, key: &str, lease: i64, opts: &[&[u8]]) -> Value {
    redis::cmd("IDEM.CLAIM").arg(key).arg(lease).arg(opts).query(con).unwrap()
}

fn requeue(con: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("IDEM.REQUEUE").arg(key).query(con).unwrap()
}

#[test]
fn the_owner_is_the_latest_granted_claims_until_done_or_requeue() {
    let s = Server::start();
    let mut con = s.conn();
    let before = idem_counters(&mut con);
    let token = claim_owned(&mut con, "k", 1, &[b"OWNER", b"worker-1"]);
    assert_eq!(owner(&mut con, "k"), Some(b"worker-1".to_vec()));
    // A refused claim (BUSY) changes nothing; its reply is CLAIM's as ever.
    let busy = claim_raw(&mut con, "k", 60, &[b"OWNER", b"worker-2"]);
    let (status, _, attempt) = parse_claim(busy);
    assert_eq!((status.as_str(), attempt), ("BUSY", 1));
    assert_eq!(owner(&mut con, "k"), Some(b"worker-1".to_vec()));
    assert_eq!(extend(&mut con, "k", &token, 1), Ok(1));
    std::thread::sleep(Duration::from_millis(1100));
    let f = get_fields(&mut con, "k");
    assert_eq!((f_str(&f, "state"), f_bytes(&f, "owner")), ("expired".into(), Some(b"worker-1".to_vec())));
    // The next holder's, binary and of the longest length, replaces it.
    let (status, token, attempt) = parse_claim(claim_raw(&mut con, "k", 60, &[b"OWNER", BIN_OWNER]));
    assert_eq!((status.as_str(), attempt), ("RETRY", 2));
    assert_eq!(owner(&mut con, "k").as_deref(), Some(BIN_OWNER));
    assert_eq!(release(&mut con, "k", &as_token(&token)), 1);
    let f = get_fields(&mut con, "k");
    assert_eq!((f_str(&f, "state"), f_bytes(&f, "owner").as_deref()), ("released".into(), Some(BIN_OWNER)));
    // MAXTRIES exhausted: refused, nothing changed.
    let (status, _, _) = parse_claim(claim_raw(&mut con, "k", 60, &[b"MAXTRIES", b"2", b"OWNER", b"x"]));
    assert_eq!(status, "EXHAUSTED");
    assert_eq!(owner(&mut con, "k").as_deref(), Some(BIN_OWNER));
    // A claim without OWNER clears it; a requeue drops the next one's.
    let (status, token, _) = parse_claim(claim_raw(&mut con, "k", 60, &[]));
    assert_eq!(status, "RETRY");
    assert_eq!(owner(&mut con, "k"), None);
    assert_eq!(release(&mut con, "k", &as_token(&token)), 1);
    let (_, token, _) = parse_claim(claim_raw(&mut con, "k", 60, &[b"OWNER", b"w3"]));
    assert_eq!(release(&mut con, "k", &as_token(&token)), 1);
    assert_eq!(owner(&mut con, "k"), Some(b"w3".to_vec()));
    assert_eq!(requeue(&mut con, "k"), 1);
    assert_eq!(owner(&mut con, "k"), None, "requeued: the work is taken back from its holder");
    // DONE drops it; a done record replays as ever.
    let (_, token, attempt) = parse_claim(claim_raw(&mut con, "k", 60, &[b"OWNER", b"w4"]));
    assert_eq!(attempt, 5);
    assert_eq!(done(&mut con, "k", &as_token(&token), ("RESULT", "r")), Ok(1));
    assert_eq!(owner(&mut con, "k"), None);
    let replay = claim_raw(&mut con, "k", 60, &[b"OWNER", b"w5"]);
    assert_eq!(parse_claim(replay), ("DONE".into(), Value::BulkString(b"r".to_vec()), 5));
    assert_eq!(owner(&mut con, "k"), None);
    // No counter of its own: a claim with OWNER counts as one without.
    let after = idem_counters(&mut con);
    let delta = |name: &str| after[name] - before.get(name).copied().unwrap_or(0);
    assert_eq!((delta("claim_new"), delta("claim_retry"), delta("claim_busy")), (1, 4, 1));
}

#[test]
fn get_shows_the_owner_in_resp2_and_resp3() {
    let s = Server::start();
    let mut con = s.conn();
    claim_owned(&mut con, "owned", 60, &[b"OWNER", b"\x00\xffbin"]);
    claim_new(&mut con, "plain", 60);
    let mut resp3 = s.conn_resp3();
    for key in ["owned", "plain"] {
        let two: Value = redis::cmd("IDEM.GET").arg(key).query(&mut con).unwrap();
        let three: Value = redis::cmd("IDEM.GET").arg(key).query(&mut resp3).unwrap();
        let Value::Array(pairs) = &two else { panic!("RESP2: {two:?}") };
        assert_eq!(pairs[18], Value::SimpleString("owner".into()), "RESP2: owner is the last field");
        let Value::Map(map) = &three else { panic!("RESP3: {three:?}") };
        assert_eq!(map.last().map(|(name, _)| name.clone()), Some(Value::SimpleString("owner".into())));
        let want = if key == "owned" { Value::BulkString(b"\x00\xffbin".to_vec()) } else { Value::Nil };
        assert_eq!(pairs[19], want, "RESP2 {key}");
        assert_eq!(map.last().unwrap().1, want, "RESP3 {key}");
        assert_eq!(fields_from_reply(three).unwrap()["owner"], want);
    }
}

#[test]
fn mclaim_stores_its_owner_on_every_key_it_grants() {
    let s = Server::start();
    let mut con = s.conn();
    let held = claim_owned(&mut con, "held", 60, &[b"OWNER", b"first"]);
    let t = claim_owned(&mut con, "lapsed", 1, &[b"OWNER", b"first"]);
    std::thread::sleep(Duration::from_millis(1100));
    let reply: Vec<Value> = redis::cmd("IDEM.MCLAIM")
        .arg(60)
        .arg(3)
        .arg(&["new", "held", "lapsed"])
        .arg("OWNER")
        .arg("batch-worker")
        .query(&mut con)
        .unwrap();
    let statuses: Vec<String> = reply.into_iter().map(|v| parse_claim(v).0).collect();
    assert_eq!(statuses, ["NEW", "BUSY", "RETRY"]);
    assert_eq!(owner(&mut con, "new"), Some(b"batch-worker".to_vec()));
    assert_eq!(owner(&mut con, "held"), Some(b"first".to_vec()), "BUSY: unchanged");
    assert_eq!(owner(&mut con, "lapsed"), Some(b"batch-worker".to_vec()));
    // Without OWNER a batch clears what it grants.
    assert_eq!(release(&mut con, "held", &held), 1);
    let _: Value = redis::cmd("IDEM.MCLAIM").arg(60).arg(1).arg("held").query(&mut con).unwrap();
    assert_eq!(owner(&mut con, "held"), None);
    assert!(done(&mut con, "lapsed", &t, NONE).unwrap_err().starts_with("STALE"));
}

#[test]
fn a_waiter_granted_the_claim_stores_its_own_owner() {
    let s = Server::start();
    let mut con = s.conn();
    let token = claim_owned(&mut con, "k", 60, &[b"OWNER", b"holder"]);
    let first = waiter(&s, "k", 60, 5_000, &["OWNER", "waiter-1"]);
    let second = waiter(&s, "k", 60, 5_000, &[]);
    assert_eq!(owner(&mut con, "k"), Some(b"holder".to_vec()), "waiting changes nothing");
    assert_eq!(release(&mut con, "k", &token), 1);
    let ((status, token, attempt), _) = claimed(first);
    assert_eq!((status.as_str(), attempt), ("RETRY", 2));
    assert_eq!(owner(&mut con, "k"), Some(b"waiter-1".to_vec()));
    // The other waiter, without OWNER, claims after it: the owner cleared.
    assert_eq!(release(&mut con, "k", &as_token(&token)), 1);
    let ((status, _, attempt), _) = claimed(second);
    assert_eq!((status.as_str(), attempt), ("RETRY", 3));
    assert_eq!(owner(&mut con, "k"), None);
}

/// Records with owners in every state that keeps one, and what dropped or
/// cleared one: written by CLAIM, MCLAIM and a waiter, each replicated as
/// its effect.
fn populate_owned(s: &Server, con: &mut redis::Connection) -> Vec<&'static str> {
    claim_owned(con, "o:processing", 600, &[b"OWNER", b"worker-1"]);
    claim_owned(con, "o:payload", 600, &[b"PAYLOAD", b"p", b"OWNER", BIN_OWNER]);
    let t = claim_owned(con, "o:released", 600, &[b"OWNER", b"w"]);
    assert_eq!(release(con, "o:released", &t), 1);
    let t = claim_owned(con, "o:extended", 600, &[b"OWNER", b"w"]);
    assert_eq!(extend(con, "o:extended", &t, 900), Ok(1));
    let t = claim_owned(con, "o:done", 600, &[b"OWNER", b"w"]);
    assert_eq!(done(con, "o:done", &t, NONE), Ok(1));
    let t = claim_owned(con, "o:requeued", 600, &[b"OWNER", b"w"]);
    assert_eq!(release(con, "o:requeued", &t), 1);
    assert_eq!(requeue(con, "o:requeued"), 1);
    let _: Value =
        redis::cmd("IDEM.MCLAIM").arg(600).arg(2).arg(&["o:m1", "o:m2"]).arg("OWNER").arg("batch").query(con).unwrap();
    let t = claim_owned(con, "o:waited", 600, &[b"OWNER", b"w"]);
    let w = waiter(s, "o:waited", 600, 5_000, &["OWNER", "waiter"]);
    assert_eq!(release(con, "o:waited", &t), 1);
    assert_eq!(claimed(w).0.0, "RETRY");
    vec!["o:processing", "o:payload", "o:released", "o:extended", "o:done", "o:requeued", "o:m1", "o:m2", "o:waited"]
}

#[test]
fn owners_replicate_and_persist() {
    let primary = Server::with_args(&[], &aof_args());
    let replica = Server::start();
    replica.replicaof(&primary);
    let mut pc = primary.conn();
    let keys = populate_owned(&primary, &mut pc);
    let owners: Vec<Option<Vec<u8>>> = keys.iter().map(|k| owner(&mut pc, k)).collect();
    let want: Vec<Option<&[u8]>> = vec![
        Some(b"worker-1"),
        Some(BIN_OWNER),
        Some(b"w"),
        Some(b"w"),
        None,
        None,
        Some(b"batch"),
        Some(b"batch"),
        Some(b"waiter"),
    ];
    assert_eq!(owners.iter().map(Option::as_deref).collect::<Vec<_>>(), want);
    wait_replicas(&mut pc, 1);
    let mut rc = replica.conn();
    let p = snapshot_all(&mut pc, &keys);
    assert_same_records(&p, &snapshot_all(&mut rc, &keys), 2000, "replica");
    assert_eq!(digest(&mut rc), digest(&mut pc), "DEBUG DIGEST: replica");

    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut pc).unwrap();
    assert_same_records(&p, &snapshot_all(&mut pc, &keys), 2000, "DEBUG RELOAD");
    let _: () = redis::cmd("DEBUG").arg("LOADAOF").query(&mut pc).unwrap();
    assert_same_records(&p, &snapshot_all(&mut pc, &keys), 2000, "AOF");
    primary.bgrewriteaof(&mut pc);
    let _: () = redis::cmd("DEBUG").arg("LOADAOF").query(&mut pc).unwrap();
    assert_same_records(&p, &snapshot_all(&mut pc, &keys), 2000, "AOF rewritten");
    for key in &keys {
        let dump: Vec<u8> = redis::cmd("DUMP").arg(*key).query(&mut pc).unwrap();
        let restored = format!("{key}:restored");
        // With the key's expiry: DIGEST-VALUE counts whether it has one.
        let expiry = pexpiretime(&mut pc, key);
        let _: () = redis::cmd("RESTORE").arg(&restored).arg(expiry).arg(dump).arg("ABSTTL").query(&mut pc).unwrap();
        let copied = format!("{key}:copied");
        let _: i64 = redis::cmd("COPY").arg(*key).arg(&copied).query(&mut pc).unwrap();
        for other in [restored, copied] {
            let owner_of = |con: &mut redis::Connection, k: &str| get_opt(con, k).map(|f| f["owner"].clone());
            assert_eq!(owner_of(&mut pc, &other), owner_of(&mut pc, key), "{other}");
            assert_eq!(digest_value(&mut pc, &other), digest_value(&mut pc, key), "DEBUG DIGEST-VALUE {other}");
        }
    }
}
