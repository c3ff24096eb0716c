//! Making the matrix's values: records in every state, filters of every
//! shape.

use super::{Case, Kind, MAX_FILTER_BYTES, MAX_RESULT, items};
use crate::common::commands::{
    claim, claim_new, claim_new_opts, claim_opts, done, get_fields, once, pexpiretime, release, reserve, server_ms,
};
use crate::common::fixtures::{BIN_RESULT, NONE};
use crate::common::reply::{as_int, as_str, as_token, f_bytes, f_int, f_str, parse_claim, q, random_token};
use redis::Value;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// Making the values
// ---------------------------------------------------------------------------

pub(super) fn config_set(con: &mut redis::Connection, name: &str, value: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query(con)
        .unwrap_or_else(|e| panic!("CONFIG SET {name} {value}: {e}"));
}

pub(super) fn config_get(con: &mut redis::Connection, name: &str) -> String {
    let v: Vec<String> = redis::cmd("CONFIG").arg("GET").arg(name).query(con).expect("CONFIG GET");
    v.get(1).cloned().unwrap_or_else(|| panic!("CONFIG GET {name}: {v:?}"))
}

/// Records in every state; the two with a 1 s lease lapse about a second
/// later (`wait_until_leases_lapsed`).
pub(super) fn make_records(con: &mut redis::Connection) -> Vec<Case> {
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

    // The operators' records: requeued (tries base) in each stored phase,
    // a lease extended (extension time), both boxed where plain ones pack.
    let requeue = |con: &mut redis::Connection, key: &str| {
        let n: i64 = redis::cmd("IDEM.REQUEUE").arg(key).query(con).unwrap_or_else(|e| panic!("REQUEUE {key}: {e}"));
        assert_eq!(n, 1, "IDEM.REQUEUE {key}");
    };
    let t = claim_new(con, "rec:requeued", 600);
    assert_eq!(done(con, "rec:requeued", &t, ("RESULT", "dropped")), Ok(1));
    requeue(con, "rec:requeued");
    cases.push(Case::record("rec:requeued", "released", 1, None));
    let t = claim_new(con, "rec:requeued-done", 600);
    assert_eq!(release(con, "rec:requeued-done", &t), 1);
    requeue(con, "rec:requeued-done");
    let (_, t, attempt) = claim(con, "rec:requeued-done", 600);
    assert_eq!(attempt, 2);
    assert_eq!(done(con, "rec:requeued-done", &as_token(&t), NONE), Ok(1));
    cases.push(Case::record("rec:requeued-done", "done", 2, None));
    let t = claim_new(con, "rec:extended", 600);
    assert_eq!(crate::common::commands::extend(con, "rec:extended", &t, 900), Ok(1));
    cases.push(Case::record("rec:extended", "processing", 1, None));

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

    // Records the batch commands wrote (one IDEM.MAPPLY each on the way to
    // the AOF): claimed with payloads, completed with results (one empty,
    // one late), given back.
    let keys = ["rec:mclaimed", "rec:mdone", "rec:mdone-empty", "rec:mreleased"];
    let claimed: Vec<Value> = redis::cmd("IDEM.MCLAIM")
        .arg(600)
        .arg(4)
        .arg(&keys)
        .arg("PAYLOADS")
        .arg(&["a", "", "b", "c"])
        .query(con)
        .unwrap();
    let tokens: Vec<String> = claimed.iter().map(|v| as_token(&parse_claim(v.clone()).1)).collect();
    cases.push(Case::record("rec:mclaimed", "processing", 1, None));
    let completed: Vec<i64> = redis::cmd("IDEM.MDONE")
        .arg(3)
        .arg(&["rec:mdone", &tokens[1], "rec:mdone-empty", &tokens[2], "rec:mdone-late", &random_token()])
        .arg("RESULTS")
        .arg(&["r", "", "late"])
        .query(con)
        .unwrap();
    assert_eq!(completed, [1, 1, 1]);
    cases.push(Case::record("rec:mdone", "done", 1, Some(1)));
    cases.push(Case::record("rec:mdone-empty", "done", 1, Some(0)));
    cases.push(Case::record("rec:mdone-late", "done", 0, Some(4)));
    let released: Vec<i64> = redis::cmd("IDEM.MRELEASE").arg(1).arg(&["rec:mreleased", &tokens[3]]).query(con).unwrap();
    assert_eq!(released, [1]);
    cases.push(Case::record("rec:mreleased", "released", 1, None));
    cases.extend(make_owned_records(con));
    cases
}

/// `IDEM.CLAIM key lease <opts>` on an absent key, with binary options.
fn claim_with(con: &mut redis::Connection, key: &str, lease: i64, opts: &[&[u8]]) -> String {
    crate::common::fixtures::claim_owned(con, key, lease, opts)
}

/// The records again with an owner, in every state that keeps one, and
/// the ones whose owner a claim cleared or DONE or REQUEUE dropped.
fn make_owned_records(con: &mut redis::Connection) -> Vec<Case> {
    let longest: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(73) ^ 0x80).collect();
    let mut cases = Vec::new();
    claim_with(con, "rec:claimed-owner", 600, &[b"OWNER", b"worker-1"]);
    cases.push(Case::record("rec:claimed-owner", "processing", 1, None).owned(b"worker-1"));
    let t = claim_with(con, "rec:released-owner", 600, &[b"OWNER", b"w"]);
    assert_eq!(release(con, "rec:released-owner", &t), 1);
    cases.push(Case::record("rec:released-owner", "released", 1, None).owned(b"w"));
    claim_with(con, "rec:lapsed-owner", 1, &[b"OWNER", &longest]);
    cases.push(Case::record("rec:lapsed-owner", "expired", 1, None).owned(&longest));
    claim_with(con, "rec:payload-owner", 600, &[b"PAYLOAD", b"p", b"OWNER", b"\x00"]);
    cases.push(Case::record("rec:payload-owner", "processing", 1, None).owned(b"\x00"));
    let t = claim_with(con, "rec:extended-owner", 600, &[b"OWNER", b"w"]);
    assert_eq!(crate::common::commands::extend(con, "rec:extended-owner", &t, 900), Ok(1));
    cases.push(Case::record("rec:extended-owner", "processing", 1, None).owned(b"w"));
    let t = claim_with(con, "rec:exhausted-owner", 600, &[b"MAXTRIES", b"1", b"OWNER", b"w"]);
    assert_eq!(release(con, "rec:exhausted-owner", &t), 1);
    let (status, _, _) = claim_opts(con, "rec:exhausted-owner", 600, &["MAXTRIES", "1", "OWNER", "other"]);
    assert_eq!(status, "EXHAUSTED");
    cases.push(Case::record("rec:exhausted-owner", "released", 1, None).owned(b"w"));
    let v: Vec<Value> = redis::cmd("IDEM.MCLAIM")
        .arg(600)
        .arg(1)
        .arg("rec:mclaimed-owner")
        .arg("OWNER")
        .arg("batch")
        .query(con)
        .unwrap();
    assert_eq!(parse_claim(v[0].clone()).0, "NEW");
    cases.push(Case::record("rec:mclaimed-owner", "processing", 1, None).owned(b"batch"));
    // Without one now: cleared by a claim without OWNER, dropped by DONE
    // (packed again) and by REQUEUE.
    let t = claim_with(con, "rec:owner-cleared", 600, &[b"OWNER", b"w"]);
    assert_eq!(release(con, "rec:owner-cleared", &t), 1);
    assert_eq!(claim(con, "rec:owner-cleared", 600).0, "RETRY");
    cases.push(Case::record("rec:owner-cleared", "processing", 2, None));
    let t = claim_with(con, "rec:done-owner", 600, &[b"OWNER", b"w"]);
    assert_eq!(done(con, "rec:done-owner", &t, NONE), Ok(1));
    cases.push(Case::record("rec:done-owner", "done", 1, None));
    let t = claim_with(con, "rec:requeued-owner", 600, &[b"OWNER", b"w"]);
    assert_eq!(release(con, "rec:requeued-owner", &t), 1);
    let n: i64 = redis::cmd("IDEM.REQUEUE").arg("rec:requeued-owner").query(con).unwrap();
    assert_eq!(n, 1);
    cases.push(Case::record("rec:requeued-owner", "released", 1, None));
    cases
}

pub(super) fn wait_until_leases_lapsed(con: &mut redis::Connection) {
    let deadline = Instant::now() + Duration::from_secs(10);
    for key in ["rec:lapsed", "rec:lapsed-payload", "rec:lapsed-owner"] {
        while f_str(&get_fields(con, key), "state") != "expired" {
            assert!(Instant::now() < deadline, "{key}: the 1 s lease did not lapse");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

pub(super) fn check_record_states(con: &mut redis::Connection, cases: &[Case]) {
    for case in cases.iter().filter(|c| c.kind == Kind::Record) {
        let f = get_fields(con, &case.key);
        let (state, attempt) = (f_str(&f, "state"), f_int(&f, "attempt"));
        assert_eq!((state.as_str(), attempt), (case.state, case.attempt), "{:?}: {f:?}", case.key);
        assert_eq!(f_bytes(&f, "result").map(|r| r.len()), case.result, "{:?}: RESULT length", case.key);
        assert_eq!(f_bytes(&f, "owner"), case.owner, "{:?}: OWNER", case.key);
    }
}

fn madd(con: &mut redis::Connection, key: &str, items: &[String]) -> Vec<i64> {
    redis::cmd("IDEM.BF.MADD").arg(key).arg(items).query(con).unwrap_or_else(|e| panic!("IDEM.BF.MADD {key}: {e}"))
}

pub(super) fn mexists(con: &mut redis::Connection, key: &str, items: &[String]) -> Vec<i64> {
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
pub(super) fn make_filters(con: &mut redis::Connection) -> Vec<Case> {
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
pub(super) fn info_value(con: &mut redis::Connection, key: &str) -> Value {
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

pub(super) fn info_field(v: &Value, name: &str) -> Value {
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
