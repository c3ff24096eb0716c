//! The operator commands (docs/commands.md, "Operator commands"):
//! `IDEM.SCAN` lists exactly the records its filters select, with SCAN's
//! cursor, and bounded work per call; `IDEM.REQUEUE` gives a dead letter
//! back with the fence still rising; both replicate, persist and count.
//! Records written by 0.1 (record format 2) and before `OWNER` (format 3)
//! still load.
#[allow(dead_code)] // each test binary uses part of common/
mod common;

use common::commands::{claim_new, claim_opts, done, extend, get_fields, idem_counters, once, release};
use common::fixtures::{NONE, assert_same_records, snapshot_all};
use common::reply::{as_str, err_text, f_bytes, f_int, f_str};
use common::server::{Server, aof_args, wait_replicas};
use redis::Value;
use std::collections::BTreeSet;
use std::time::Duration;

/// A whole `IDEM.SCAN` iteration with `filters`, `COUNT count`: the keys,
/// each at most once (the test's keys do not change during it).
fn scan_all(con: &mut redis::Connection, count: usize, filters: &[&str]) -> BTreeSet<String> {
    let mut cursor = "0".to_string();
    let mut keys = BTreeSet::new();
    loop {
        let (next, found): (String, Vec<String>) = redis::cmd("IDEM.SCAN")
            .arg(&cursor)
            .arg("COUNT")
            .arg(count)
            .arg(filters)
            .query(con)
            .unwrap_or_else(|e| panic!("IDEM.SCAN {cursor} {filters:?}: {e}"));
        keys.extend(found);
        if next == "0" {
            return keys;
        }
        cursor = next;
    }
}

fn set(keys: &[&str]) -> BTreeSet<String> {
    keys.iter().map(|k| k.to_string()).collect()
}

fn requeue(con: &mut redis::Connection, key: &str) -> Result<i64, String> {
    redis::cmd("IDEM.REQUEUE").arg(key).query(con).map_err(|e| err_text(&e))
}

/// A dead letter: `key` claimed and released `tries` times with
/// `MAXTRIES tries`, so the next such claim answers EXHAUSTED.
fn dead_letter(con: &mut redis::Connection, key: &str, tries: i64) {
    let max = tries.to_string();
    for attempt in 1..=tries {
        let (status, token, got) = claim_opts(con, key, 60, &["MAXTRIES", &max]);
        assert_eq!(got, attempt, "{key}: {status}");
        assert_eq!(release(con, key, &as_str(&token)), 1);
    }
    assert_eq!(claim_opts(con, key, 60, &["MAXTRIES", &max]).0, "EXHAUSTED");
}

#[test]
fn scan_lists_exactly_the_records_its_filters_select() {
    let s = Server::start();
    let mut con = s.conn();
    claim_new(&mut con, "live", 600);
    let t = claim_new(&mut con, "lapsed", 1);
    let t2 = claim_new(&mut con, "heartbeat", 1);
    dead_letter(&mut con, "dead", 3);
    let t3 = claim_new(&mut con, "completed", 60);
    assert_eq!(done(&mut con, "completed", &t3, ("RESULT", "r")), Ok(1));
    assert_eq!(once(&mut con, "marked", 60), 1);
    // Not records: a string, a hash, a filter.
    let _: () = redis::cmd("SET").arg("plain").arg("x").query(&mut con).unwrap();
    let _: () = redis::cmd("HSET").arg("hash").arg("s").arg("p").query(&mut con).unwrap();
    let _: () = redis::cmd("IDEM.BF.ADD").arg("filter").arg("x").query(&mut con).unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    // Extended after the wait: its latest change is recent, and it is live.
    assert_eq!(extend(&mut con, "heartbeat", &t2, 600), Ok(1));
    let _ = t;

    let all = set(&["live", "lapsed", "heartbeat", "dead", "completed", "marked"]);
    for count in [1, 2, 1000, 1_000_000] {
        assert_eq!(scan_all(&mut con, count, &[]), all, "COUNT {count}");
    }
    assert_eq!(scan_all(&mut con, 3, &["STATE", "processing"]), set(&["live", "heartbeat"]));
    assert_eq!(scan_all(&mut con, 3, &["STATE", "EXPIRED"]), set(&["lapsed"]));
    assert_eq!(scan_all(&mut con, 3, &["state", "released"]), set(&["dead"]));
    assert_eq!(scan_all(&mut con, 3, &["STATE", "done"]), set(&["completed", "marked"]));
    // The dead letters of a consumer claiming with MAXTRIES 3.
    assert_eq!(scan_all(&mut con, 3, &["STATE", "released", "MINTRIES", "3"]), set(&["dead"]));
    assert_eq!(scan_all(&mut con, 3, &["MINTRIES", "4"]), set(&[]));
    assert_eq!(scan_all(&mut con, 3, &["MINTRIES", "1"]), set(&["live", "lapsed", "heartbeat", "dead", "completed"]));
    // Unchanged for a second: all but the one extended after the wait.
    assert_eq!(scan_all(&mut con, 3, &["IDLE", "1"]), set(&["live", "lapsed", "dead", "completed", "marked"]));
    assert_eq!(scan_all(&mut con, 3, &["IDLE", "3600"]), set(&[]));
    assert_eq!(scan_all(&mut con, 3, &["MATCH", "l*", "STATE", "processing"]), set(&["live"]));

    for (args, error) in [
        (&["x"][..], "ERR invalid cursor"),
        (&["0", "COUNT", "0"], "ERR COUNT must be a positive integer"),
        (&["0", "STATE", "stuck"], "ERR STATE must be one of processing, expired, released, done"),
        (&["0", "MINTRIES", "0"], "ERR MINTRIES must be a positive integer"),
        (&["0", "IDLE", "-1"], "ERR IDLE must be a positive integer (seconds)"),
        (&["0", "TYPE", "string"], "ERR syntax error, unknown option 'TYPE'"),
    ] {
        let e = redis::cmd("IDEM.SCAN").arg(args).query::<Value>(&mut con).unwrap_err();
        assert_eq!(err_text(&e), error, "IDEM.SCAN {args:?}");
    }
}

#[test]
fn a_huge_count_is_bounded_work_per_call() {
    let s = Server::start();
    let mut con = s.conn();
    let mut pipe = redis::pipe();
    for i in 0..5000 {
        pipe.cmd("IDEM.ONCE").arg(format!("k{i}")).arg(600).ignore();
    }
    let _: () = pipe.query(&mut con).unwrap();
    let (cursor, found): (String, Vec<String>) =
        redis::cmd("IDEM.SCAN").arg(0).arg("COUNT").arg(i64::MAX).query(&mut con).unwrap();
    assert_ne!(cursor, "0", "one call walked all 5000 keys");
    assert!(found.len() < 5000, "{} keys in one call", found.len());
    assert_eq!(scan_all(&mut con, usize::MAX >> 1, &[]).len(), 5000);
}

#[test]
fn requeue_gives_a_dead_letter_back_with_a_higher_attempt() {
    let s = Server::start();
    let mut con = s.conn();
    let before = idem_counters(&mut con);
    dead_letter(&mut con, "dead", 2);
    let f = get_fields(&mut con, "dead");
    assert_eq!((f_str(&f, "state"), f_int(&f, "attempt"), f_int(&f, "tries")), ("released".into(), 2, 2));

    assert_eq!(requeue(&mut con, "dead"), Ok(1));
    let f = get_fields(&mut con, "dead");
    assert_eq!((f_str(&f, "state"), f_int(&f, "attempt"), f_int(&f, "tries")), ("released".into(), 2, 0));
    let pttl: i64 = redis::cmd("PTTL").arg("dead").query(&mut con).unwrap();
    assert!(pttl > 3_500_000 && pttl <= 3_600_000, "kept for idem.history: {pttl}");
    // Two more tries, each with a higher attempt than any before.
    let (status, token, attempt) = claim_opts(&mut con, "dead", 60, &["MAXTRIES", "2"]);
    assert_eq!((status.as_str(), attempt), ("RETRY", 3));
    assert_eq!(get_fields(&mut con, "dead")["tries"], Value::Int(1));
    assert_eq!(done(&mut con, "dead", &as_str(&token), ("RESULT", "ok")), Ok(1));

    // A done record: its result is dropped, the next claim redoes it.
    assert_eq!(requeue(&mut con, "dead"), Ok(1));
    let f = get_fields(&mut con, "dead");
    assert_eq!((f_str(&f, "state"), f_bytes(&f, "result"), f_int(&f, "done_at")), ("released".into(), None, 0));
    assert_eq!(claim_opts(&mut con, "dead", 60, &[]).2, 4);

    // A live lease is refused, the record unchanged.
    let live = get_fields(&mut con, "dead");
    let e = requeue(&mut con, "dead").unwrap_err();
    assert!(e.starts_with("ERR the record is processing with a live lease"), "{e}");
    assert_eq!(get_fields(&mut con, "dead")["attempt"], live["attempt"]);
    assert_eq!(get_fields(&mut con, "dead")["state"], live["state"]);
    assert_eq!(requeue(&mut con, "absent"), Ok(0));
    let _: () = redis::cmd("SET").arg("plain").arg("x").query(&mut con).unwrap();
    assert!(requeue(&mut con, "plain").unwrap_err().starts_with("WRONGTYPE"));

    let after = idem_counters(&mut con);
    let delta = |name: &str| after[name] - before.get(name).copied().unwrap_or(0);
    assert_eq!((delta("requeue_ok"), delta("requeue_miss"), delta("requeue_busy")), (2, 1, 1));
}

#[test]
fn the_latest_token_stops_working_once_requeued() {
    let s = Server::start();
    let mut con = s.conn();
    let token = claim_new(&mut con, "k", 1);
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(get_fields(&mut con, "k")["state"], Value::SimpleString("expired".into()));
    assert_eq!(requeue(&mut con, "k"), Ok(1));
    assert!(done(&mut con, "k", &token, NONE).unwrap_err().starts_with("STALE"));
    assert!(extend(&mut con, "k", &token, 10).unwrap_err().starts_with("STALE"));
    assert_eq!(release(&mut con, "k", &token), 0);
    let zeros = "0".repeat(32);
    assert!(done(&mut con, "k", &zeros, NONE).unwrap_err().starts_with("STALE"), "no token holds it");
    assert_eq!(get_fields(&mut con, "k")["state"], Value::SimpleString("released".into()));
    // A ONCE mark given back: its next claim is attempt 1.
    assert_eq!(once(&mut con, "m", 60), 1);
    assert_eq!(requeue(&mut con, "m"), Ok(1));
    let (status, _, attempt) = claim_opts(&mut con, "m", 60, &[]);
    assert_eq!((status.as_str(), attempt), ("RETRY", 1));
}

/// Requeued and extended records (the boxed, rarer form) in every state.
fn populate_requeued(con: &mut redis::Connection) -> Vec<&'static str> {
    dead_letter(con, "q:released", 2);
    assert_eq!(requeue(con, "q:released"), Ok(1));
    dead_letter(con, "q:claimed", 1);
    assert_eq!(requeue(con, "q:claimed"), Ok(1));
    let (_, token, _) = claim_opts(con, "q:claimed", 600, &[]);
    assert_eq!(extend(con, "q:claimed", &as_str(&token), 900), Ok(1));
    dead_letter(con, "q:done", 1);
    assert_eq!(requeue(con, "q:done"), Ok(1));
    let (_, token, _) = claim_opts(con, "q:done", 600, &[]);
    assert_eq!(done(con, "q:done", &as_str(&token), ("RESULT", "r")), Ok(1));
    let token = claim_new(con, "q:extended", 600);
    assert_eq!(extend(con, "q:extended", &token, 900), Ok(1));
    vec!["q:released", "q:claimed", "q:done", "q:extended"]
}

#[test]
fn requeue_replicates_and_persists_its_tries() {
    let primary = Server::with_args(&[], &aof_args());
    let replica = Server::start();
    replica.replicaof(&primary);
    let mut pc = primary.conn();
    let keys = populate_requeued(&mut pc);
    wait_replicas(&mut pc, 1);
    let mut rc = replica.conn();
    let p = snapshot_all(&mut pc, &keys);
    assert_same_records(&p, &snapshot_all(&mut rc, &keys), 2000, "replica");
    for (snap, tries) in p.iter().zip([0, 1, 1, 1]) {
        assert_eq!(snap.fields.as_ref().unwrap()["tries"], Value::Int(tries), "{}", snap.key);
    }
    // Read-only on a replica.
    assert_eq!(scan_all(&mut rc, 10, &["STATE", "released"]), set(&["q:released"]));
    assert!(requeue(&mut rc, "q:released").unwrap_err().starts_with("READONLY"));

    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut pc).unwrap();
    assert_same_records(&p, &snapshot_all(&mut pc, &keys), 2000, "DEBUG RELOAD");
    let _: () = redis::cmd("DEBUG").arg("LOADAOF").query(&mut pc).unwrap();
    assert_same_records(&p, &snapshot_all(&mut pc, &keys), 2000, "AOF");
    for key in &keys {
        let dump: Vec<u8> = redis::cmd("DUMP").arg(*key).query(&mut pc).unwrap();
        let copy = format!("{key}:restored");
        let _: () = redis::cmd("RESTORE").arg(&copy).arg(0).arg(dump).query(&mut pc).unwrap();
        assert_eq!(get_fields(&mut pc, &copy)["tries"], get_fields(&mut pc, key)["tries"], "{key}");
        let copied = format!("{key}:copied");
        let _: i64 = redis::cmd("COPY").arg(*key).arg(&copied).query(&mut pc).unwrap();
        assert_eq!(get_fields(&mut pc, &copied)["tries"], get_fields(&mut pc, key)["tries"], "{key}");
    }
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap()).collect()
}

/// (key, payload, state now, attempt, tries, claimed_at, done_at, result,
/// the latest claim's token, which still completes its record).
type Golden =
    (&'static str, &'static str, &'static str, i64, i64, i64, i64, Option<&'static str>, Option<&'static str>);

/// DUMP payloads written by 0.1 (record format 2, RDB encoding version 2)
/// on Redis 7.0.15 (never requeued: tries = attempt).
const FORMAT_2_PAYLOADS: &[Golden] = &[
    (
        "expired",
        "078189d7a6ade72b7402053102000501ab93939ca334939b939ca33400ac0a6060d5e6194bb558eafeb065f727879b441d19e520bedecc62a6b021b95d000a002159b7ead988351a",
        "expired",
        1,
        1,
        1796160670123,
        0,
        None,
        Some("ac0a6060d5e6194bb558eafeb065f727"),
    ),
    (
        "done",
        "078189d7a6ade72b7402052f02020301ab93939ca33400ab93939ca33450392f89945faf7885613a73b65ab0060d636861726765642031322e3530000a006756a5be0efc61f1",
        "done",
        1,
        1,
        1796160670123,
        1796160670123,
        Some("charged 12.50"),
        None,
    ),
    (
        "released",
        "078189d7a6ade72b7402052102010402ac93939ca334ac93939ca33400af2f5899fd77d8953fac55ab497501f2000a0038559335c9a9758b",
        "released",
        2,
        2,
        1796160670124,
        0,
        None,
        Some("af2f5899fd77d8953fac55ab497501f2"),
    ),
    (
        "donepacked",
        "078189d7a6ade72b7402051102020001ac93939ca33400ac93939ca334000a00c440d62d6ef8a05e",
        "done",
        1,
        1,
        1796160670124,
        1796160670124,
        None,
        None,
    ),
    (
        "claimed",
        "078189d7a6ade72b7402052102000401ac93939ca3348ce8969ca334001e99d1688b2aa5bc3a64f9f4fb100cc8000a0071317d8df003e780",
        "expired",
        1,
        1,
        1796160670124,
        0,
        None,
        Some("1e99d1688b2aa5bc3a64f9f4fb100cc8"),
    ),
    (
        "once",
        "078189d7a6ade72b7402050c020200000000ac93939ca334000a00bcd842dfcb6cbb41",
        "done",
        0,
        0,
        0,
        1796160670124,
        None,
        None,
    ),
];

/// DUMP payloads written by the module before `OWNER` (record format 3,
/// RDB encoding version 3) on Redis 7.0.15: a fingerprint, results,
/// packed records, a requeued record (its tries base), an extended one
/// (its extension time), a requeued one completed.
const FORMAT_3_PAYLOADS: &[Golden] = &[
    (
        "expired",
        "078189d7a6ade72b7403053103000501dac3edafa334c2cbedafa3340024d59c19b764baf4aa7f1568afe7093d372e47f572d3a239a55f91c8c66732f5000a00c999e27899437c88",
        "expired",
        1,
        1,
        1796201996762,
        0,
        None,
        Some("24d59c19b764baf4aa7f1568afe7093d"),
    ),
    (
        "done",
        "078189d7a6ade72b7403051f03020201dac3edafa33400dac3edafa3340d636861726765642031322e3530000a008f0664d41262143b",
        "done",
        1,
        1,
        1796201996762,
        1796201996762,
        Some("charged 12.50"),
        None,
    ),
    (
        "released",
        "078189d7a6ade72b7403052103010401dac3edafa334dac3edafa334003300f6922ea940e5317a415f466bdc17000a000a50f15905f61e6b",
        "released",
        1,
        1,
        1796201996762,
        0,
        None,
        Some("3300f6922ea940e5317a415f466bdc17"),
    ),
    (
        "donepacked",
        "078189d7a6ade72b7403051103020001dac3edafa33400dac3edafa334000a00a85d8e3ad652600a",
        "done",
        1,
        1,
        1796201996762,
        1796201996762,
        None,
        None,
    ),
    (
        "once",
        "078189d7a6ade72b7403050c030200000000dac3edafa334000a00ea82612d22ceb37f",
        "done",
        0,
        0,
        0,
        1796201996762,
        None,
        None,
    ),
    (
        "requeued",
        "078189d7a6ade72b7403051203010801dac3edafa334dac3edafa3340001000a002116baa5d0a39371",
        "released",
        1,
        0,
        1796201996762,
        0,
        None,
        None,
    ),
    (
        "extended",
        "078189d7a6ade72b7403052703001401dac3edafa334abd3edafa33400dbc3edafa334074dfe2e8df6e5a433b549e6998bac39000a00f631fccaa68b7b0e",
        "expired",
        1,
        1,
        1796201996762,
        0,
        None,
        Some("074dfe2e8df6e5a433b549e6998bac39"),
    ),
    (
        "requeueddone",
        "078189d7a6ade72b7403051503020a02dbc3edafa33400dbc3edafa33401026f6b000a0085c20c531915b9bf",
        "done",
        2,
        1,
        1796201996763,
        1796201996763,
        Some("ok"),
        None,
    ),
];

/// Restores `payloads`, checks what each holds (no owner: the formats
/// before 4 had none), reloads them through an RDB in today's format, and
/// completes each with its latest claim's token.
fn older_payloads_still_load(payloads: &[Golden]) {
    let s = Server::start();
    let mut con = s.conn();
    for (key, payload, state, attempt, tries, claimed_at, done_at, result, _) in payloads {
        let _: () = redis::cmd("RESTORE").arg(*key).arg(0).arg(unhex(payload)).query(&mut con).expect(key);
        let f = get_fields(&mut con, key);
        assert_eq!(f_str(&f, "state"), *state, "{key}");
        assert_eq!((f_int(&f, "attempt"), f_int(&f, "tries")), (*attempt, *tries), "{key}");
        assert_eq!((f_int(&f, "claimed_at"), f_int(&f, "done_at")), (*claimed_at, *done_at), "{key}");
        assert_eq!(f_bytes(&f, "result"), result.map(|r| r.as_bytes().to_vec()), "{key}");
        assert_eq!(f_bytes(&f, "owner"), None, "{key}");
    }
    // Written again in today's format, through an RDB.
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut con).unwrap();
    for (key, _, _, attempt, tries, _, _, _, token) in payloads {
        let f = get_fields(&mut con, key);
        assert_eq!((f_int(&f, "attempt"), f_int(&f, "tries")), (*attempt, *tries), "{key}");
        if let Some(token) = token {
            // The latest claim's token still completes its record.
            assert_eq!(done(&mut con, key, token, NONE), Ok(1), "{key}");
        }
    }
}

#[test]
fn records_written_by_0_1_still_load() {
    older_payloads_still_load(FORMAT_2_PAYLOADS);
}

#[test]
fn records_written_before_owner_still_load() {
    older_payloads_still_load(FORMAT_3_PAYLOADS);
}
