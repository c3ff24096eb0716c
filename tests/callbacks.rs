//! The state x command matrix (issue 10, part 1): every record state and
//! every filter shape, through every command that reaches one of the data
//! types' callbacks (`mem_usage`, `digest`, `rdb_save`/`rdb_load`,
//! `aof_rewrite`, `copy`, `free`, `free_effort`).
//!
//! `MEMORY USAGE` of a record done with `RESULT ""` once handed an empty
//! boxed slice's dangling pointer to `RedisModule_MallocSize` and killed
//! the server. No test had put that state through that command. Here every
//! value goes through every such command, and after each one the value must
//! be what it was (`IDEM.GET` / `IDEM.BF.INFO` + `MEXISTS`, `DEBUG
//! DIGEST-VALUE`, `DUMP`, expiry), the dataset digest unchanged, and the
//! server the same process.
//!
//! The values are made once per server (the states that need time, a
//! lapsed lease and shards of several seconds, share one wait); the
//! commands then run over every key.
#[allow(dead_code)] // each test binary uses part of common/
mod common;

use common::*;
use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

/// lease_ms / pttl are relative to "now": they must have gone down by the
/// time elapsed, give or take this (a round trip on a loaded machine).
const TOL_MS: i64 = 2000;

/// `idem.max-result` while the values are made, and the length of the
/// largest RESULT.
const MAX_RESULT: usize = 65_536;

/// `idem.bf-max-bytes` while the filters are made (the default).
const MAX_FILTER_BYTES: i64 = 128 * 1024 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Record,
    Filter,
}

impl Kind {
    fn type_name(self) -> &'static str {
        match self {
            Kind::Record => "idemrecrd",
            Kind::Filter => "idembloom",
        }
    }
}

/// One value of the matrix.
struct Case {
    key: String,
    kind: Kind,
    /// Filters: items added to it (each must answer 1).
    added: Vec<String>,
    /// Filters: items never added (their answers, false positives included,
    /// must not change).
    fresh: Vec<String>,
    /// Records: the state and attempt IDEM.GET must show, and the length
    /// of the stored RESULT (None: no RESULT).
    state: &'static str,
    attempt: i64,
    result: Option<usize>,
}

impl Case {
    fn record(key: &str, state: &'static str, attempt: i64, result: Option<usize>) -> Case {
        Case { key: key.to_string(), kind: Kind::Record, added: vec![], fresh: vec![], state, attempt, result }
    }

    fn filter(key: &str, added: Vec<String>) -> Case {
        let fresh = items(&format!("fresh:{key}:"), 0..300);
        Case { key: key.to_string(), kind: Kind::Filter, added, fresh, state: "", attempt: 0, result: None }
    }

    /// Bytes of RESULT that MEMORY USAGE must count.
    fn result_len(&self) -> usize {
        self.result.unwrap_or(0)
    }

    fn probes(&self) -> Vec<String> {
        self.added.iter().chain(&self.fresh).cloned().collect()
    }
}

fn items(prefix: &str, range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("{prefix}{i}")).collect()
}

// ---------------------------------------------------------------------------
// Making the values
// ---------------------------------------------------------------------------

fn config_set(con: &mut redis::Connection, name: &str, value: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query(con)
        .unwrap_or_else(|e| panic!("CONFIG SET {name} {value}: {e}"));
}

fn config_get(con: &mut redis::Connection, name: &str) -> String {
    let v: Vec<String> = redis::cmd("CONFIG").arg("GET").arg(name).query(con).expect("CONFIG GET");
    v.get(1).cloned().unwrap_or_else(|| panic!("CONFIG GET {name}: {v:?}"))
}

/// Records in every state; the two with a 1 s lease lapse about a second
/// later (`wait_until_leases_lapsed`).
fn make_records(con: &mut redis::Connection) -> Vec<Case> {
    config_set(con, "idem.max-result", &MAX_RESULT.to_string());
    let mut cases = Vec::new();

    claim_new(con, "rec:claimed", 600);
    cases.push(Case::record("rec:claimed", "processing", 1, None));

    let t = claim_new(con, "rec:released", 600);
    assert_eq!(release(con, "rec:released", &t), 1);
    cases.push(Case::record("rec:released", "released", 1, None));

    // Packed (no fingerprint) and boxed (with one).
    claim_new(con, "rec:lapsed", 1);
    cases.push(Case::record("rec:lapsed", "expired", 1, None));
    claim_new_opts(con, "rec:lapsed-payload", 1, &["PAYLOAD", "lapsing"]);
    cases.push(Case::record("rec:lapsed-payload", "expired", 1, None));

    let t = claim_new(con, "rec:done-no-result", 600);
    assert_eq!(done(con, "rec:done-no-result", &t, NONE), Ok(1));
    cases.push(Case::record("rec:done-no-result", "done", 1, None));

    let t = claim_new(con, "rec:done-empty-result", 600);
    assert_eq!(done(con, "rec:done-empty-result", &t, ("RESULT", "")), Ok(1));
    cases.push(Case::record("rec:done-empty-result", "done", 1, Some(0)));

    let t = claim_new_opts(con, "rec:done-empty-result-payload", 600, &["PAYLOAD", "body"]);
    assert_eq!(done(con, "rec:done-empty-result-payload", &t, ("RESULT", "", "RETAIN", 5000)), Ok(1));
    cases.push(Case::record("rec:done-empty-result-payload", "done", 1, Some(0)));

    let t = claim_new(con, "rec:done-small-result", 600);
    assert_eq!(done(con, "rec:done-small-result", &t, ("RESULT", BIN_RESULT)), Ok(1));
    cases.push(Case::record("rec:done-small-result", "done", 1, Some(BIN_RESULT.len())));

    let max: Vec<u8> = (0..MAX_RESULT).map(|i| (i * 31 % 251) as u8).collect();
    let t = claim_new(con, "rec:done-max-result", 600);
    assert_eq!(done(con, "rec:done-max-result", &t, ("RESULT", max.as_slice())), Ok(1));
    cases.push(Case::record("rec:done-max-result", "done", 1, Some(MAX_RESULT)));
    // It is the largest: one byte more is refused.
    let t = claim_new(con, "rec:too-big", 600);
    let mut over = max.clone();
    over.push(0);
    assert!(done(con, "rec:too-big", &t, ("RESULT", over)).is_err(), "a RESULT over idem.max-result was accepted");
    let _: i64 = redis::cmd("DEL").arg("rec:too-big").query(con).unwrap();

    claim_new_opts(con, "rec:payload-empty", 600, &["PAYLOAD", ""]);
    cases.push(Case::record("rec:payload-empty", "processing", 1, None));

    let long: String = (0..200_000).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
    claim_new_opts(con, "rec:payload-long", 600, &["PAYLOAD", &long]);
    cases.push(Case::record("rec:payload-long", "processing", 1, None));

    assert_eq!(once(con, "rec:once", 7000), 1);
    cases.push(Case::record("rec:once", "done", 0, None));

    let t = claim_new_opts(con, "rec:exhausted", 600, &["MAXTRIES", "1"]);
    assert_eq!(release(con, "rec:exhausted", &t), 1);
    let (status, value, attempt) = claim_opts(con, "rec:exhausted", 600, &["MAXTRIES", "1"]);
    assert_eq!((status.as_str(), value, attempt), ("EXHAUSTED", Value::Nil, 1));
    cases.push(Case::record("rec:exhausted", "released", 1, None));

    let old = claim_new(con, "rec:retried", 600);
    assert_eq!(release(con, "rec:retried", &old), 1);
    let (status, _, attempt) = claim(con, "rec:retried", 600);
    assert_eq!((status.as_str(), attempt), ("RETRY", 2));
    cases.push(Case::record("rec:retried", "processing", 2, None));

    // Keys whose expiry the user changed: none at all, and a longer one.
    let t = claim_new(con, "rec:persisted", 600);
    assert_eq!(done(con, "rec:persisted", &t, ("RESULT", "kept")), Ok(1));
    let n: i64 = redis::cmd("PERSIST").arg("rec:persisted").query(con).unwrap();
    assert_eq!(n, 1);
    cases.push(Case::record("rec:persisted", "done", 1, Some(4)));
    claim_new(con, "rec:expire-changed", 600);
    let n: i64 = redis::cmd("PEXPIRE").arg("rec:expire-changed").arg(36_000_000).query(con).unwrap();
    assert_eq!(n, 1);
    cases.push(Case::record("rec:expire-changed", "processing", 1, None));

    // Zero lengths everywhere: the key name, the RESULT.
    let t = claim_new(con, "", 600);
    assert_eq!(done(con, "", &t, ("RESULT", "")), Ok(1));
    cases.push(Case::record("", "done", 1, Some(0)));

    assert_eq!(done(con, "rec:late-done", &random_token(), ("RESULT", "late")), Ok(1));
    cases.push(Case::record("rec:late-done", "done", 0, Some(4)));
    assert_eq!(done(con, "rec:late-done-empty-result", &random_token(), ("RESULT", "")), Ok(1));
    cases.push(Case::record("rec:late-done-empty-result", "done", 0, Some(0)));
    cases
}

fn wait_until_leases_lapsed(con: &mut redis::Connection) {
    let deadline = Instant::now() + Duration::from_secs(10);
    for key in ["rec:lapsed", "rec:lapsed-payload"] {
        while f_str(&get_fields(con, key), "state") != "expired" {
            assert!(Instant::now() < deadline, "{key}: the 1 s lease did not lapse");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn check_record_states(con: &mut redis::Connection, cases: &[Case]) {
    for case in cases.iter().filter(|c| c.kind == Kind::Record) {
        let f = get_fields(con, &case.key);
        let (state, attempt) = (f_str(&f, "state"), f_int(&f, "attempt"));
        assert_eq!((state.as_str(), attempt), (case.state, case.attempt), "{:?}: {f:?}", case.key);
        assert_eq!(f_bytes(&f, "result").map(|r| r.len()), case.result, "{:?}: RESULT length", case.key);
    }
}

fn madd(con: &mut redis::Connection, key: &str, items: &[String]) -> Vec<i64> {
    redis::cmd("IDEM.BF.MADD").arg(key).arg(items).query(con).unwrap_or_else(|e| panic!("IDEM.BF.MADD {key}: {e}"))
}

fn mexists(con: &mut redis::Connection, key: &str, items: &[String]) -> Vec<i64> {
    if items.is_empty() {
        return vec![];
    }
    redis::cmd("IDEM.BF.MEXISTS")
        .arg(key)
        .arg(items)
        .query(con)
        .unwrap_or_else(|e| panic!("IDEM.BF.MEXISTS {key}: {e}"))
}

/// A shard period (seconds) whose current shard has at least `room`
/// seconds left, so that a WINDOW 1 filter does not expire mid-test (near
/// a UTC midnight a DAY shard would).
fn period_with_room(con: &mut redis::Connection, room: i64) -> i64 {
    let now = server_ms(con) / 1000;
    *[86_400i64, 90_000, 100_000].iter().find(|&&p| p - now % p >= room).expect("one of three periods has room")
}

/// Sleeps until `offset_ms` past the server clock's next whole second.
fn sleep_past_next_second(con: &mut redis::Connection, offset_ms: i64) {
    let target = (server_ms(con) / 1000 + 1) * 1000 + offset_ms;
    loop {
        let now = server_ms(con);
        if now >= target {
            return;
        }
        std::thread::sleep(Duration::from_millis((target - now) as u64));
    }
}

/// Filters of every shape. Takes ~3 s: one of them gets shards of four
/// successive seconds.
fn make_filters(con: &mut redis::Connection) -> Vec<Case> {
    config_set(con, "idem.bf-max-bytes", &MAX_FILTER_BYTES.to_string());
    let mut cases = Vec::new();

    reserve(con, "bf:empty", "0.01", 100, &[]);
    cases.push(Case::filter("bf:empty", vec![]));

    let mut added = items("one:", 0..200);
    added.push(String::new()); // a zero-length item
    reserve(con, "bf:one-shard", "0.01", 1000, &[]);
    madd(con, "bf:one-shard", &added);
    cases.push(Case::filter("bf:one-shard", added));

    // Capacity 50, 600 items: sub-filters stacked in one shard.
    let added = items("stacked:", 0..600);
    reserve(con, "bf:stacked", "0.01", 50, &["EXPANSION", "2"]);
    madd(con, "bf:stacked", &added);
    cases.push(Case::filter("bf:stacked", added));

    // EXPANSION 1: every stacked sub-filter as large as the first.
    let added = items("exp1:", 0..120);
    reserve(con, "bf:expansion-1", "0.01", 20, &["EXPANSION", "1"]);
    madd(con, "bf:expansion-1", &added);
    cases.push(Case::filter("bf:expansion-1", added));

    let added = items("w1:", 0..50);
    let period = period_with_room(con, 600).to_string();
    reserve(con, "bf:window-1", "0.01", 100, &["WINDOW", "1", "SHARD", &period]);
    madd(con, "bf:window-1", &added);
    cases.push(Case::filter("bf:window-1", added));

    let added = items("wmax:", 0..50);
    reserve(con, "bf:max-window", "0.01", 100, &["WINDOW", "366"]);
    madd(con, "bf:max-window", &added);
    cases.push(Case::filter("bf:max-window", added));

    let added = items("s1:", 0..50);
    reserve(con, "bf:shard-1", "0.01", 100, &["SHARD", "1", "WINDOW", "366"]);
    madd(con, "bf:shard-1", &added);
    cases.push(Case::filter("bf:shard-1", added));

    // Keys whose expiry the user changed: none at all (PERSIST, or a RESTORE
    // with TTL 0), and a later one. Redis keeps a key's expiry as it is
    // through every way of persisting it; so must the module.
    let added = items("persisted:", 0..50);
    reserve(con, "bf:persisted", "0.01", 100, &[]);
    madd(con, "bf:persisted", &added);
    let n: i64 = redis::cmd("PERSIST").arg("bf:persisted").query(con).unwrap();
    assert_eq!(n, 1);
    cases.push(Case::filter("bf:persisted", added));
    let added = items("expire-changed:", 0..50);
    reserve(con, "bf:expire-changed", "0.01", 100, &[]);
    madd(con, "bf:expire-changed", &added);
    let n: i64 = redis::cmd("EXPIRE").arg("bf:expire-changed").arg(30 * 86_400).query(con).unwrap();
    assert_eq!(n, 1);
    cases.push(Case::filter("bf:expire-changed", added));

    // Made by an ADD on a missing key, from the bf-* configs.
    let added = items("cfg:", 0..100);
    madd(con, "bf:from-configs", &added);
    cases.push(Case::filter("bf:from-configs", added));

    // Many shards: 1 s shards, items added in four successive seconds. The
    // window is long enough for the key to outlive the test (WINDOW 5 would
    // drop a shard every second, and the key 5 s after the last add).
    // Reserved for 400: the first shard, closed with 40, folds its array.
    reserve(con, "bf:many-shards", "0.01", 400, &["SHARD", "1", "WINDOW", "366"]);
    let reserved = filter_shards(&info_value(con, "bf:many-shards"))[0].2;
    let mut added = Vec::new();
    for second in 0..4 {
        if second > 0 {
            sleep_past_next_second(con, 30);
        }
        let batch = items(&format!("many{second}:"), 0..40);
        madd(con, "bf:many-shards", &batch);
        added.extend(batch);
    }
    cases.push(Case::filter("bf:many-shards", added));

    let shards = filter_shards(&info_value(con, "bf:many-shards"));
    assert!(shards.len() >= 3, "bf:many-shards should have 4 shards (3 at least on a stalled machine): {shards:?}");
    assert!(shards[0].2 * 4 <= reserved, "bf:many-shards's closed first shard should fold: {reserved} then {shards:?}");
    let shards = filter_shards(&info_value(con, "bf:stacked"));
    assert!(shards.iter().any(|s| s.1 >= 3), "bf:stacked should have stacked sub-filters: {shards:?}");
    for case in &cases {
        assert!(mexists(con, &case.key, &case.added).iter().all(|&x| x == 1), "{}: an added item is missing", case.key);
        if case.key != "bf:persisted" {
            assert!(pexpiretime(con, &case.key) > 0, "{}: a filter made by commands has an expiry", case.key);
        }
    }
    cases
}

/// `IDEM.BF.INFO key`, raw (it holds no time-relative field).
fn info_value(con: &mut redis::Connection, key: &str) -> Value {
    q(con, "IDEM.BF.INFO", key).unwrap_or_else(|e| panic!("IDEM.BF.INFO {key}: {e}"))
}

/// Field/value pairs of a RESP2 flat array or a RESP3 map.
fn info_pairs(v: &Value) -> Vec<(String, Value)> {
    match v {
        Value::Array(items) => items.chunks(2).map(|p| (as_str(&p[0]), p[1].clone())).collect(),
        Value::Map(m) => m.iter().map(|(k, v)| (as_str(k), v.clone())).collect(),
        other => panic!("IDEM.BF.INFO: expected a flat array or a map, got {other:?}"),
    }
}

fn info_field(v: &Value, name: &str) -> Value {
    info_pairs(v)
        .into_iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("IDEM.BF.INFO has no {name}: {v:?}"))
}

/// `(start, filters, bytes)` of each shard in an `IDEM.BF.INFO` reply.
fn filter_shards(v: &Value) -> Vec<(i64, i64, i64)> {
    let Value::Array(shards) = info_field(v, "shards") else { panic!("IDEM.BF.INFO shards: {v:?}") };
    shards
        .iter()
        .map(|s| (as_int(&info_field(s, "start")), as_int(&info_field(s, "filters")), as_int(&info_field(s, "bytes"))))
        .collect()
}

// ---------------------------------------------------------------------------
// Looking at a value
// ---------------------------------------------------------------------------

/// Everything observable about a value; equal looks are the same value.
#[derive(Debug, Clone)]
struct Look {
    name: String,
    ty: String,
    digest: String,
    dump: Vec<u8>,
    pexpiretime: i64,
    /// Records: IDEM.GET and PEXPIRETIME, and the server's clock (Unix ms)
    /// just before.
    record: Option<Snap>,
    at_ms: i64,
    /// Filters: IDEM.BF.INFO and MEXISTS of the case's probes.
    info: Option<Value>,
    answers: Vec<i64>,
}

/// Looks at `case`'s value under the name `name` (a copy, a renamed key).
fn look(con: &mut redis::Connection, case: &Case, name: &str) -> Look {
    let ty: String = redis::cmd("TYPE").arg(name).query(con).expect("TYPE");
    assert_eq!(ty, case.kind.type_name(), "TYPE {name} ({})", case.key);
    let dump: Vec<u8> = redis::cmd("DUMP").arg(name).query(con).unwrap_or_else(|e| panic!("DUMP {name}: {e}"));
    let at_ms = server_ms(con);
    let (record, info, answers) = match case.kind {
        Kind::Record => (Some(snapshot(con, name)), None, vec![]),
        Kind::Filter => (None, Some(info_value(con, name)), mexists(con, name, &case.probes())),
    };
    Look {
        name: name.to_string(),
        ty,
        digest: digest_value(con, name),
        dump,
        pexpiretime: pexpiretime(con, name),
        record,
        at_ms,
        info,
        answers,
    }
}

/// `now` is the same value as `original`.
fn assert_intact(original: &Look, now: &Look, what: &str) {
    let (o, n) = (&original.name, &now.name);
    assert_eq!(original.ty, now.ty, "{what}: TYPE of {o} vs {n}");
    assert_eq!(original.pexpiretime, now.pexpiretime, "{what}: PEXPIRETIME of {o} vs {n}");
    if let (Some(b), Some(a)) = (&original.record, &now.record) {
        assert_same_record_fields(b, a, now.at_ms - original.at_ms, what);
    }
    assert_eq!(original.info, now.info, "{what}: IDEM.BF.INFO of {o} vs {n}");
    assert!(original.answers == now.answers, "{what}: IDEM.BF.MEXISTS answers of {o} vs {n} differ");
    assert_eq!(original.digest, now.digest, "{what}: DEBUG DIGEST-VALUE of {o} vs {n}");
    assert!(
        original.dump == now.dump,
        "{what}: DUMP payload of {o} ({} B) vs {n} ({} B) differ",
        original.dump.len(),
        now.dump.len()
    );
}

/// `IDEM.GET` of the same record, `elapsed_ms` later: the same fields, and
/// the times left (`lease_ms`, `pttl`) shorter by the time elapsed.
fn assert_same_record_fields(before: &Snap, after: &Snap, elapsed_ms: i64, what: &str) {
    let (Some(b), Some(a)) = (&before.fields, &after.fields) else {
        panic!("{what}: {} was {:?}, {} is {:?}", before.key, before.fields, after.key, after.fields);
    };
    for name in ["state", "attempt", "claimed_at", "done_at", "result", "fingerprint"] {
        assert_eq!(b[name], a[name], "{what}: field {name} of {} (before) vs {} (after)", before.key, after.key);
    }
    for name in ["lease_ms", "pttl"] {
        let (was, is) = (as_int(&b[name]), as_int(&a[name]));
        let expected = if was > 0 { (was - elapsed_ms).max(0) } else { was };
        assert!(
            (is - expected).abs() <= TOL_MS,
            "{what}: field {name} of {} was {was}, {elapsed_ms} ms later it is {is} (expected {expected} +- {TOL_MS})",
            before.key
        );
    }
}

fn memory_usage(con: &mut redis::Connection, key: &str, samples: Option<i64>) -> i64 {
    let mut c = redis::cmd("MEMORY");
    c.arg("USAGE").arg(key);
    if let Some(n) = samples {
        c.arg("SAMPLES").arg(n);
    }
    c.query(con).unwrap_or_else(|e| panic!("MEMORY USAGE {key} {samples:?}: {e}"))
}

/// MEMORY USAGE `usage` is a sensible size for the value: it counts a
/// RESULT, or a filter's bits, and not much more.
fn assert_sensible_usage(case: &Case, original: &Look, usage: i64, what: &str) {
    let (lo, hi) = match case.kind {
        // A PAYLOAD is kept as a 16-byte hash: a 200 kB one costs nothing.
        Kind::Record => (case.result_len() as i64 + 16, case.result_len() as i64 + 1024),
        Kind::Filter => {
            let bytes = as_int(&info_field(original.info.as_ref().unwrap(), "bytes"));
            (bytes.max(16), bytes + bytes / 20 + 16_384)
        }
    };
    assert!((lo..=hi).contains(&usage), "{what}: MEMORY USAGE {} is {usage}, expected {lo}..={hi}", case.key);
}

/// `serializedlength` of `DEBUG OBJECT key` (the rdb_save callback's size).
fn debug_object_serialized_length(con: &mut redis::Connection, key: &str) -> i64 {
    let text: String =
        redis::cmd("DEBUG").arg("OBJECT").arg(key).query(con).unwrap_or_else(|e| panic!("DEBUG OBJECT {key}: {e}"));
    text.split_whitespace()
        .find_map(|w| w.strip_prefix("serializedlength:"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("DEBUG OBJECT {key}: no serializedlength in {text:?}"))
}

fn scan_type(con: &mut redis::Connection, type_name: &str) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    let mut cursor = "0".to_string();
    loop {
        let (next, batch): (String, Vec<String>) = redis::cmd("SCAN")
            .arg(&cursor)
            .arg("TYPE")
            .arg(type_name)
            .arg("COUNT")
            .arg(100)
            .query(con)
            .unwrap_or_else(|e| panic!("SCAN {cursor} TYPE {type_name}: {e}"));
        keys.extend(batch);
        if next == "0" {
            return keys;
        }
        cursor = next;
    }
}

fn redis_cli(port: u16, args: &[&str]) -> String {
    let cli = std::env::var("REDIS_CLI").unwrap_or_else(|_| "redis-cli".to_string());
    let out = Command::new(&cli)
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cli}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{cli} {args:?} failed ({}): {stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// From a `--bigkeys` / `--memkeys` summary line `"<n> <type>s with <size>
/// <unit> (...)"`: `(n, size)`.
fn cli_type_summary(out: &str, type_name: &str) -> (i64, String) {
    let marker = format!(" {type_name}s with ");
    let line = out
        .lines()
        .find(|l| l.contains(&marker) && l.split_whitespace().next().is_some_and(|w| w.parse::<i64>().is_ok()))
        .unwrap_or_else(|| panic!("no summary line for {type_name} in:\n{out}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    (words[0].parse().unwrap(), words[3].to_string())
}

// ---------------------------------------------------------------------------
// The matrix
// ---------------------------------------------------------------------------

/// The server's identity: a restart (crash and supervisor) changes it.
fn identity(con: &mut redis::Connection) -> (String, String) {
    let text: String = redis::cmd("INFO").arg("server").query(con).expect("INFO server");
    let info = parse_info(&text);
    (info["run_id"].clone(), info["process_id"].clone())
}

fn connect_db(s: &Server, db: i64) -> redis::Connection {
    let client = redis::Client::open(format!("redis://127.0.0.1:{}/{db}", s.port)).expect("client");
    let con = client.get_connection().unwrap_or_else(|e| panic!("connect to db {db}: {e}"));
    con.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    con
}

fn answers_ping(port: u16) -> bool {
    let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{port}/")) else { return false };
    let Ok(mut con) = client.get_connection_with_timeout(Duration::from_millis(500)) else { return false };
    let _ = con.set_read_timeout(Some(Duration::from_secs(2)));
    redis::cmd("PING").query::<String>(&mut con).is_ok()
}

/// A server, the values on it as first seen, and what must not change.
struct Matrix {
    server: Server,
    con: redis::Connection,
    /// The same server, db 1.
    con1: redis::Connection,
    cases: Vec<Case>,
    originals: Vec<Look>,
    identity: (String, String),
    dataset: String,
}

impl Matrix {
    fn new(server: Server, con: redis::Connection, cases: Vec<Case>) -> Matrix {
        let mut con = con;
        let con1 = connect_db(&server, 1);
        let originals: Vec<Look> = cases.iter().map(|c| look(&mut con, c, &c.key)).collect();
        for (case, original) in cases.iter().zip(&originals) {
            assert_ne!(original.digest.trim_matches('0'), "", "{}: DEBUG DIGEST-VALUE is all zeros", case.key);
        }
        let identity = identity(&mut con);
        let dataset = digest(&mut con);
        eprintln!("matrix on {}: {} values", ServerVersion::of(&mut con), cases.len());
        Matrix { server, con, con1, cases, originals, identity, dataset }
    }

    /// The server answers, is the same process, and its dataset is as it
    /// was.
    fn assert_same_server(&mut self, what: &str) {
        self.server.assert_alive();
        let _: String = redis::cmd("PING").query(&mut self.con).unwrap_or_else(|e| panic!("{what}: PING: {e}"));
        assert_eq!(identity(&mut self.con), self.identity, "{what}: the server restarted (run_id, process_id)");
        assert_eq!(digest(&mut self.con), self.dataset, "{what}: DEBUG DIGEST of the dataset changed");
    }

    /// After a command on case `i`: the server is the same, the value too.
    fn checkpoint(&mut self, i: usize, command: &str) {
        let what = format!("{} after {command}", self.cases[i].key);
        self.assert_same_server(&what);
        let now = look(&mut self.con, &self.cases[i], &self.cases[i].key);
        assert_intact(&self.originals[i], &now, &what);
    }

    /// Every value is as it was.
    fn assert_all_intact(&mut self, what: &str) {
        for i in 0..self.cases.len() {
            let now = look(&mut self.con, &self.cases[i], &self.cases[i].key);
            assert_intact(&self.originals[i], &now, &format!("{what}: {}", self.cases[i].key));
        }
    }

    fn keys_of(&self, kind: Kind) -> BTreeSet<String> {
        self.cases.iter().filter(|c| c.kind == kind).map(|c| c.key.clone()).collect()
    }

    /// Runs one step of the matrix. When it fails because the server died
    /// (a connection error is all the client sees), says so, with the
    /// crash report's first lines.
    fn step(&mut self, name: &str, f: impl FnOnce(&mut Matrix)) {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(self)));
        if let Err(panic) = result {
            let deadline = Instant::now() + Duration::from_secs(10);
            while self.server.exited().is_none() && Instant::now() < deadline {
                if answers_ping(self.server.port) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            if let Some(status) = self.server.exited() {
                let log = self.server.log();
                let crash: Vec<&str> = log
                    .lines()
                    .filter(|l| {
                        l.contains("crashed by signal") || l.contains("Symbol:") || l.contains("Accessing address")
                    })
                    .collect();
                panic!("{name}: the server died ({status}): {}", crash.join(" | "));
            }
            std::panic::resume_unwind(panic);
        }
    }

    /// Every per-key command over every value.
    fn run_key_commands(&mut self) {
        for i in 0..self.cases.len() {
            let key = self.cases[i].key.clone();
            self.step(&format!("MEMORY USAGE {key}"), |m| m.memory_usage(i));
            self.step(&format!("DEBUG DIGEST-VALUE / DIGEST / OBJECT {key}"), |m| m.digests_and_debug_object(i));
            self.step(&format!("OBJECT ... {key}"), |m| m.object_subcommands(i));
            self.step(&format!("DUMP + RESTORE {key}"), |m| m.dump_restore(i));
            self.step(&format!("COPY {key}"), |m| m.copy(i));
            self.step(&format!("RENAME {key}"), |m| m.rename(i));
            self.step(&format!("MOVE {key}"), |m| m.move_to_db1_and_back(i));
        }
    }

    fn memory_usage(&mut self, i: usize) {
        let key = self.cases[i].key.clone();
        let usage = memory_usage(&mut self.con, &key, None);
        self.checkpoint(i, "MEMORY USAGE");
        assert_sensible_usage(&self.cases[i], &self.originals[i], usage, "MEMORY USAGE");
        let sampled = memory_usage(&mut self.con, &key, Some(0));
        self.checkpoint(i, "MEMORY USAGE SAMPLES 0");
        assert_eq!(sampled, usage, "{key}: MEMORY USAGE SAMPLES 0 vs without SAMPLES");
        let sampled = memory_usage(&mut self.con, &key, Some(5));
        self.checkpoint(i, "MEMORY USAGE SAMPLES 5");
        assert_eq!(sampled, usage, "{key}: MEMORY USAGE SAMPLES 5 vs without SAMPLES");
    }

    fn digests_and_debug_object(&mut self, i: usize) {
        let key = self.cases[i].key.clone();
        let d = digest_value(&mut self.con, &key);
        self.checkpoint(i, "DEBUG DIGEST-VALUE");
        assert_eq!(d, self.originals[i].digest);
        let _ = digest(&mut self.con);
        self.checkpoint(i, "DEBUG DIGEST");
        let len = debug_object_serialized_length(&mut self.con, &key);
        self.checkpoint(i, "DEBUG OBJECT");
        let dump_len = self.originals[i].dump.len() as i64;
        assert!(len > 0 && len <= dump_len, "{key}: DEBUG OBJECT serializedlength {len}, DUMP is {dump_len} B");
    }

    fn object_subcommands(&mut self, i: usize) {
        let key = self.cases[i].key.clone();
        let encoding: String =
            redis::cmd("OBJECT").arg("ENCODING").arg(&key).query(&mut self.con).expect("OBJECT ENCODING");
        self.checkpoint(i, "OBJECT ENCODING");
        assert_eq!(encoding, "raw", "{key}: OBJECT ENCODING");
        let refcount: i64 =
            redis::cmd("OBJECT").arg("REFCOUNT").arg(&key).query(&mut self.con).expect("OBJECT REFCOUNT");
        self.checkpoint(i, "OBJECT REFCOUNT");
        assert!(refcount >= 1, "{key}: OBJECT REFCOUNT {refcount}");
        let idle: i64 = redis::cmd("OBJECT").arg("IDLETIME").arg(&key).query(&mut self.con).expect("OBJECT IDLETIME");
        self.checkpoint(i, "OBJECT IDLETIME");
        assert!(idle >= 0, "{key}: OBJECT IDLETIME {idle}");
        // Without an LFU policy the server refuses FREQ (object_freq_under_lfu
        // runs it with one).
        let e = expect_err(&mut self.con, "OBJECT", ("FREQ", &key));
        assert!(e.contains("LFU"), "{key}: OBJECT FREQ without LFU: {e}");
        self.checkpoint(i, "OBJECT FREQ (refused)");
    }

    fn dump_restore(&mut self, i: usize) {
        let key = self.cases[i].key.clone();
        let restored = format!("{key}:restored");
        let payload: Vec<u8> = redis::cmd("DUMP").arg(&key).query(&mut self.con).expect("DUMP");
        // The original's expiry (RESTORE's 0 is none).
        let exp = self.originals[i].pexpiretime.max(0);
        for replace in [false, true] {
            let mut c = redis::cmd("RESTORE");
            c.arg(&restored).arg(exp).arg(payload.as_slice()).arg("ABSTTL");
            if replace {
                c.arg("REPLACE");
            }
            let _: () =
                c.query(&mut self.con).unwrap_or_else(|e| panic!("RESTORE {restored} (REPLACE: {replace}): {e}"));
            let what = format!("RESTORE of {key}'s DUMP{}", if replace { " REPLACE" } else { "" });
            self.server.assert_alive();
            let copy = look(&mut self.con, &self.cases[i], &restored);
            assert_intact(&self.originals[i], &copy, &what);
            let usage = memory_usage(&mut self.con, &restored, None);
            assert_sensible_usage(&self.cases[i], &self.originals[i], usage, &what);
        }
        // RESTORE REPLACE over a value of the other type.
        let other = match self.cases[i].kind {
            Kind::Record => self.cases.iter().position(|c| c.kind == Kind::Filter),
            Kind::Filter => self.cases.iter().position(|c| c.kind == Kind::Record),
        };
        if let Some(j) = other {
            let n: i64 =
                redis::cmd("COPY").arg(&self.cases[j].key).arg(&restored).arg("REPLACE").query(&mut self.con).unwrap();
            assert_eq!(n, 1);
            let _: () = redis::cmd("RESTORE")
                .arg(&restored)
                .arg(exp)
                .arg(payload.as_slice())
                .arg("ABSTTL")
                .arg("REPLACE")
                .query(&mut self.con)
                .unwrap_or_else(|e| {
                    panic!("RESTORE {restored} REPLACE over a {}: {e}", self.cases[j].kind.type_name())
                });
            let copy = look(&mut self.con, &self.cases[i], &restored);
            assert_intact(&self.originals[i], &copy, "RESTORE REPLACE over the other type");
        }
        let n: i64 = redis::cmd("UNLINK").arg(&restored).query(&mut self.con).unwrap();
        assert_eq!(n, 1);
        self.checkpoint(i, "DUMP + RESTORE (+ REPLACE) + UNLINK");
    }

    fn copy(&mut self, i: usize) {
        let key = self.cases[i].key.clone();
        let copy = format!("{key}:copy");
        for args in [vec![], vec!["REPLACE"]] {
            let n: i64 = redis::cmd("COPY")
                .arg(&key)
                .arg(&copy)
                .arg(&args)
                .query(&mut self.con)
                .unwrap_or_else(|e| panic!("COPY {key} {copy} {args:?}: {e}"));
            assert_eq!(n, 1, "COPY {key} {copy} {args:?}");
            self.server.assert_alive();
            let seen = look(&mut self.con, &self.cases[i], &copy);
            assert_intact(&self.originals[i], &seen, &format!("COPY {args:?}"));
            let usage = memory_usage(&mut self.con, &copy, None);
            assert_sensible_usage(&self.cases[i], &self.originals[i], usage, "COPY");
        }
        let n: i64 =
            redis::cmd("COPY").arg(&key).arg(&copy).arg("DB").arg(1).query(&mut self.con).expect("COPY ... DB 1");
        assert_eq!(n, 1);
        let seen = look(&mut self.con1, &self.cases[i], &copy);
        assert_intact(&self.originals[i], &seen, "COPY ... DB 1");
        let n: i64 = redis::cmd("DEL").arg(&copy).query(&mut self.con1).unwrap();
        assert_eq!(n, 1);
        let n: i64 = redis::cmd("DEL").arg(&copy).query(&mut self.con).unwrap();
        assert_eq!(n, 1);
        self.checkpoint(i, "COPY, COPY REPLACE, COPY DB 1, DEL");
    }

    fn rename(&mut self, i: usize) {
        let key = self.cases[i].key.clone();
        let renamed = format!("{key}:renamed");
        let _: () = redis::cmd("RENAME").arg(&key).arg(&renamed).query(&mut self.con).expect("RENAME");
        self.server.assert_alive();
        let seen = look(&mut self.con, &self.cases[i], &renamed);
        assert_intact(&self.originals[i], &seen, "RENAME");
        let _: () = redis::cmd("RENAME").arg(&renamed).arg(&key).query(&mut self.con).expect("RENAME back");
        self.checkpoint(i, "RENAME and back");
    }

    fn move_to_db1_and_back(&mut self, i: usize) {
        let key = self.cases[i].key.clone();
        let n: i64 = redis::cmd("MOVE").arg(&key).arg(1).query(&mut self.con).expect("MOVE key 1");
        assert_eq!(n, 1, "MOVE {key} 1");
        assert!(!exists(&mut self.con, &key));
        self.server.assert_alive();
        let seen = look(&mut self.con1, &self.cases[i], &key);
        assert_intact(&self.originals[i], &seen, "MOVE to db 1");
        let n: i64 = redis::cmd("MOVE").arg(&key).arg(0).query(&mut self.con1).expect("MOVE key 0");
        assert_eq!(n, 1, "MOVE {key} 0");
        self.checkpoint(i, "MOVE to db 1 and back");
    }

    /// `SWAPDB 0 1`: every value seen from db 1, then swapped back.
    fn swapdb(&mut self) {
        let _: () = redis::cmd("SWAPDB").arg(0).arg(1).query(&mut self.con).expect("SWAPDB 0 1");
        self.server.assert_alive();
        for i in 0..self.cases.len() {
            let seen = look(&mut self.con1, &self.cases[i], &self.cases[i].key);
            assert_intact(&self.originals[i], &seen, "SWAPDB 0 1");
        }
        let _: () = redis::cmd("SWAPDB").arg(0).arg(1).query(&mut self.con).expect("SWAPDB 0 1 back");
        self.assert_same_server("SWAPDB and back");
        self.assert_all_intact("SWAPDB and back");
    }

    /// `SCAN ... TYPE` with both type names finds exactly the values.
    fn scan_types(&mut self) {
        for kind in [Kind::Record, Kind::Filter] {
            let found = scan_type(&mut self.con, kind.type_name());
            assert_eq!(found, self.keys_of(kind), "SCAN 0 TYPE {}", kind.type_name());
        }
        self.assert_same_server("SCAN ... TYPE");
    }

    /// `OBJECT FREQ` needs an LFU policy: set one for it, then put the
    /// policy back.
    fn object_freq_under_lfu(&mut self) {
        let policy = config_get(&mut self.con, "maxmemory-policy");
        config_set(&mut self.con, "maxmemory-policy", "allkeys-lfu");
        for case in &self.cases {
            let freq: i64 = redis::cmd("OBJECT")
                .arg("FREQ")
                .arg(&case.key)
                .query(&mut self.con)
                .unwrap_or_else(|e| panic!("OBJECT FREQ {} under allkeys-lfu: {e}", case.key));
            assert!(freq >= 0);
        }
        config_set(&mut self.con, "maxmemory-policy", &policy);
        self.assert_same_server("OBJECT FREQ");
        self.assert_all_intact("OBJECT FREQ");
    }

    /// `redis-cli --memkeys` and `--bigkeys` (which call TYPE and MEMORY
    /// USAGE on every key) over the whole keyspace.
    fn cli_memkeys_and_bigkeys(&mut self) {
        let port = self.server.port;
        let usages: Vec<(Kind, i64)> =
            self.cases.iter().map(|c| (c.kind, memory_usage(&mut self.con, &c.key, Some(0)))).collect();
        for args in [&["--memkeys"][..], &["--memkeys-samples", "0"][..], &["--bigkeys"][..]] {
            let out = redis_cli(port, args);
            self.assert_same_server(&format!("redis-cli {args:?}"));
            let sampled = format!("Sampled {} keys", self.cases.len());
            assert!(out.contains(&sampled), "redis-cli {args:?}: expected {sampled:?} in:\n{out}");
            for kind in [Kind::Record, Kind::Filter] {
                let n = self.keys_of(kind).len() as i64;
                if n == 0 {
                    continue;
                }
                let (count, size) = cli_type_summary(&out, kind.type_name());
                assert_eq!(count, n, "redis-cli {args:?}: number of {}s:\n{out}", kind.type_name());
                if args[0] != "--bigkeys" {
                    let total: i64 = usages.iter().filter(|(k, _)| *k == kind).map(|(_, u)| u).sum();
                    assert_eq!(
                        size,
                        total.to_string(),
                        "redis-cli {args:?}: bytes of {}s vs MEMORY USAGE:\n{out}",
                        kind.type_name()
                    );
                }
            }
        }
        self.assert_all_intact("redis-cli --memkeys / --bigkeys");
    }

    /// Every command that reaches a callback without leaving the process.
    fn run_in_memory_matrix(&mut self, what: &str) {
        let started = Instant::now();
        self.run_key_commands();
        self.step("SWAPDB", |m| m.swapdb());
        self.step("SCAN ... TYPE", |m| m.scan_types());
        self.step("OBJECT FREQ", |m| m.object_freq_under_lfu());
        self.step("redis-cli --memkeys / --bigkeys", |m| m.cli_memkeys_and_bigkeys());
        eprintln!("{what}: in-memory matrix over {} values: {:?}", self.cases.len(), started.elapsed());
    }

    /// After a reload or restart: every value as it was, and every command
    /// of the matrix on the values as loaded.
    fn assert_all_intact_after_load(&mut self, what: &str) {
        self.server.assert_alive();
        self.assert_all_intact(what);
        assert_eq!(digest(&mut self.con), self.dataset, "{what}: DEBUG DIGEST of the dataset changed");
        self.run_in_memory_matrix(what);
    }

    /// Stops the server without an RDB, starts it again (it loads its AOF),
    /// and reconnects.
    fn restart_from_aof(&mut self) {
        self.server.restart(Shutdown::NoSave);
        self.con = self.server.conn();
        self.con1 = connect_db(&self.server, 1);
        let id = identity(&mut self.con);
        assert_ne!(id, self.identity, "the server did not restart");
        self.identity = id;
    }

    /// The kind of file (`aof` or `rdb`) of the AOF's base.
    fn aof_base_kind(&self) -> String {
        let dir = self.server.dir.join("appendonlydir");
        let names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{dir:?}: {e}"))
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".base."))
            .collect();
        assert_eq!(names.len(), 1, "one AOF base file expected: {names:?}");
        names[0].rsplit('.').next().unwrap().to_string()
    }

    /// Ends with an asynchronous flush of everything (free_effort, free on
    /// the lazy-free thread).
    fn flushall_async(&mut self) {
        let _: () = redis::cmd("FLUSHALL").arg("ASYNC").query(&mut self.con).expect("FLUSHALL ASYNC");
        self.server.assert_alive();
        let n: i64 = redis::cmd("DBSIZE").query(&mut self.con).unwrap();
        assert_eq!(n, 0);
        let _: String = redis::cmd("PING").query(&mut self.con).unwrap();
        self.server.assert_alive();
    }
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[test]
fn every_record_state_through_every_in_memory_command() {
    let started = Instant::now();
    let server = Server::start();
    let mut con = server.conn();
    let cases = make_records(&mut con);
    wait_until_leases_lapsed(&mut con);
    check_record_states(&mut con, &cases);
    let mut m = Matrix::new(server, con, cases);
    m.run_in_memory_matrix("records");
    check_record_states(&mut m.con, &m.cases);
    m.flushall_async();
    eprintln!("records x in-memory commands: {:?}", started.elapsed());
}

#[test]
fn every_filter_shape_through_every_in_memory_command() {
    let started = Instant::now();
    let server = Server::start();
    let mut con = server.conn();
    let cases = make_filters(&mut con);
    let mut m = Matrix::new(server, con, cases);
    m.run_in_memory_matrix("filters");
    m.flushall_async();
    eprintln!("filters x in-memory commands: {:?}", started.elapsed());
}

/// Every record and filter on a server with the AOF on (`aof_args`), made
/// and looked at: ~3 s. The server starts with idem.max-result 1024 and
/// idem.bf-max-bytes 65536: values made under larger limits (make_records
/// and make_filters raise them) must still load under the smaller ones.
fn matrix_with_aof(aof_args: &[&str]) -> Matrix {
    let mut args = vec!["--appendonly", "yes"];
    args.extend(aof_args);
    let server = Server::with_args(&["max-result", "1024", "bf-max-bytes", "65536"], &args);
    let mut con = server.conn();
    let mut cases = make_records(&mut con);
    cases.extend(make_filters(&mut con)); // ~3 s: the leases lapse meanwhile
    wait_until_leases_lapsed(&mut con);
    check_record_states(&mut con, &cases);
    Matrix::new(server, con, cases)
}

/// Restarted, the server is back at its own (smaller) limits, and every
/// value loaded whatever its size.
fn assert_loaded_under_smaller_limits(m: &mut Matrix) {
    assert_eq!(config_get(&mut m.con, "idem.max-result"), "1024");
    assert_eq!(config_get(&mut m.con, "idem.bf-max-bytes"), "65536");
    check_record_states(&mut m.con, &m.cases);
    let over = m.cases.iter().filter(|c| c.result_len() > 1024).count();
    assert!(over >= 1, "a record with a RESULT over the smaller idem.max-result");
    let over = m
        .originals
        .iter()
        .filter_map(|o| o.info.as_ref())
        .filter(|info| as_int(&info_field(info, "bytes")) > 65_536)
        .count();
    assert!(over >= 1, "a filter over the smaller idem.bf-max-bytes");
}

#[test]
fn every_value_through_debug_reload_and_an_aof_rewrite_with_rdb_preamble() {
    let started = Instant::now();
    let mut m = matrix_with_aof(&[]);
    assert_eq!(config_get(&mut m.con, "aof-use-rdb-preamble"), "yes");

    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut m.con).expect("DEBUG RELOAD");
    m.assert_same_server("DEBUG RELOAD");
    m.assert_all_intact_after_load("DEBUG RELOAD");

    // The default rewrite: an RDB preamble (rdb_save; rdb_load at restart).
    m.server.bgrewriteaof(&mut m.con);
    m.assert_same_server("BGREWRITEAOF (aof-use-rdb-preamble yes)");
    assert_eq!(m.aof_base_kind(), "rdb", "aof-use-rdb-preamble yes: the base should be an RDB");
    m.restart_from_aof();
    m.assert_all_intact_after_load("BGREWRITEAOF (aof-use-rdb-preamble yes) + restart");
    assert_loaded_under_smaller_limits(&mut m);
    m.flushall_async();
    eprintln!("DEBUG RELOAD, AOF rewrite with RDB preamble: {:?}", started.elapsed());
}

#[test]
fn every_value_through_an_aof_rewrite_without_rdb_preamble() {
    let started = Instant::now();
    let mut m = matrix_with_aof(&["--aof-use-rdb-preamble", "no"]);

    // The base is written as commands (the aof_rewrite callbacks: IDEM.APPLY,
    // IDEM.BF.LOAD, then Redis's PEXPIREAT); the restart replays them.
    m.server.bgrewriteaof(&mut m.con);
    m.assert_same_server("BGREWRITEAOF (aof-use-rdb-preamble no)");
    assert_eq!(m.aof_base_kind(), "aof", "aof-use-rdb-preamble no: the base should be a command file");
    m.restart_from_aof();
    m.assert_all_intact_after_load("BGREWRITEAOF (aof-use-rdb-preamble no) + restart");
    assert_loaded_under_smaller_limits(&mut m);

    // And a DEBUG RELOAD of what the AOF loaded.
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut m.con).expect("DEBUG RELOAD");
    m.assert_same_server("DEBUG RELOAD after the AOF restart");
    m.assert_all_intact_after_load("DEBUG RELOAD after the AOF restart");
    m.flushall_async();
    eprintln!("AOF rewrite without RDB preamble: {:?}", started.elapsed());
}
