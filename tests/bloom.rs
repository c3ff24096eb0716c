//! Date-sharded Bloom filters (SPEC "Date-sharded Bloom filters"), and the
//! BLOOM option of IDEM.CLAIM / IDEM.DONE, against a real server.
//!
//! Shard rotation is tested in real time with 1 s and 2 s shards. Every
//! command whose answer depends on which shard "now" falls in runs in a
//! pipeline between two `TIME` calls, so the test knows the time the module
//! saw; when the machine stalled and a step missed its slot, the scenario
//! is run again (a "hiccup"), it never guesses.
mod common;

use common::*;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

const INFO_FIELDS: [&str; 8] = ["error_rate", "capacity", "window", "shard", "expansion", "items", "bytes", "shards"];
const SHARD_FIELDS: [&str; 4] = ["start", "items", "filters", "bytes"];

#[derive(Debug, Clone, PartialEq)]
struct ShardInfo {
    start: i64,
    items: i64,
    filters: i64,
    bytes: i64,
}

/// `IDEM.BF.INFO`, parsed.
#[derive(Debug, Clone, PartialEq)]
struct BfInfo {
    error_rate: f64,
    capacity: i64,
    window: i64,
    shard: i64,
    expansion: i64,
    items: i64,
    bytes: i64,
    shards: Vec<ShardInfo>,
}

impl BfInfo {
    fn starts(&self) -> Vec<i64> {
        self.shards.iter().map(|s| s.start).collect()
    }
}

/// Field/value pairs of a RESP2 flat array or a RESP3 map, checking the
/// names, their order, and that each is there once.
fn pairs(v: Value, names: &[&str], what: &str) -> Vec<Value> {
    let pairs: Vec<(Value, Value)> = match v {
        Value::Array(items) => {
            assert_eq!(items.len(), 2 * names.len(), "{what}: expected {} field/value pairs: {items:?}", names.len());
            let mut out = Vec::new();
            let mut it = items.into_iter();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                out.push((k, v));
            }
            out
        }
        Value::Map(m) => m,
        other => panic!("{what}: expected a flat array or a map, got {other:?}"),
    };
    let got: Vec<String> = pairs.iter().map(|(k, _)| as_str(k)).collect();
    assert_eq!(got, names, "{what}: field names / order");
    pairs.into_iter().map(|(_, v)| v).collect()
}

fn parse_info(v: Value) -> Option<BfInfo> {
    if v == Value::Nil {
        return None;
    }
    let vals = pairs(v, &INFO_FIELDS, "IDEM.BF.INFO");
    let error_rate = match &vals[0] {
        // RESP2: a double is a bulk string.
        Value::BulkString(b) => std::str::from_utf8(b).unwrap().parse::<f64>().expect("error_rate parses as a float"),
        Value::Double(d) => *d,
        other => panic!("IDEM.BF.INFO error_rate: expected a double (bulk string in RESP2), got {other:?}"),
    };
    let shards = match &vals[7] {
        Value::Array(list) => list
            .iter()
            .map(|s| {
                let f = pairs(s.clone(), &SHARD_FIELDS, "IDEM.BF.INFO shard");
                ShardInfo { start: as_int(&f[0]), items: as_int(&f[1]), filters: as_int(&f[2]), bytes: as_int(&f[3]) }
            })
            .collect(),
        other => panic!("IDEM.BF.INFO shards: expected an array, got {other:?}"),
    };
    Some(BfInfo {
        error_rate,
        capacity: as_int(&vals[1]),
        window: as_int(&vals[2]),
        shard: as_int(&vals[3]),
        expansion: as_int(&vals[4]),
        items: as_int(&vals[5]),
        bytes: as_int(&vals[6]),
        shards,
    })
}

fn bf_info_opt(con: &mut redis::Connection, key: &str) -> Option<BfInfo> {
    let v: Value = q(con, "IDEM.BF.INFO", key).unwrap_or_else(|e| panic!("IDEM.BF.INFO {key}: {e}"));
    parse_info(v)
}

fn bf_info(con: &mut redis::Connection, key: &str) -> BfInfo {
    bf_info_opt(con, key).unwrap_or_else(|| panic!("IDEM.BF.INFO {key}: nil, expected a filter"))
}

fn bf_add(con: &mut redis::Connection, key: &str, item: &str) -> i64 {
    redis::cmd("IDEM.BF.ADD").arg(key).arg(item).query(con).unwrap_or_else(|e| panic!("IDEM.BF.ADD {key} {item}: {e}"))
}

fn bf_exists(con: &mut redis::Connection, key: &str, item: &str) -> i64 {
    redis::cmd("IDEM.BF.EXISTS").arg(key).arg(item).query(con).unwrap_or_else(|e| panic!("IDEM.BF.EXISTS {key}: {e}"))
}

fn bf_madd<S: AsRef<str>>(con: &mut redis::Connection, key: &str, items: &[S]) -> Vec<i64> {
    let items: Vec<&str> = items.iter().map(|s| s.as_ref()).collect();
    redis::cmd("IDEM.BF.MADD").arg(key).arg(&items).query(con).unwrap_or_else(|e| panic!("IDEM.BF.MADD {key}: {e}"))
}

fn bf_mexists<S: AsRef<str>>(con: &mut redis::Connection, key: &str, items: &[S]) -> Vec<i64> {
    let items: Vec<&str> = items.iter().map(|s| s.as_ref()).collect();
    redis::cmd("IDEM.BF.MEXISTS")
        .arg(key)
        .arg(&items)
        .query(con)
        .unwrap_or_else(|e| panic!("IDEM.BF.MEXISTS {key}: {e}"))
}

/// Runs `name key batch` for every batch of `items`, pipelined (`per_pipe`
/// commands per round trip); the replies, concatenated.
fn pipelined(con: &mut redis::Connection, name: &str, key: &str, items: &[String], batch: usize) -> Vec<i64> {
    let per_pipe = 50;
    let mut out = Vec::with_capacity(items.len());
    for chunk in items.chunks(batch * per_pipe) {
        let mut pipe = redis::pipe();
        for b in chunk.chunks(batch) {
            pipe.cmd(name).arg(key).arg(b);
        }
        let replies: Vec<Vec<i64>> = pipe.query(con).unwrap_or_else(|e| panic!("pipelined {name} {key}: {e}"));
        for (r, b) in replies.iter().zip(chunk.chunks(batch)) {
            assert_eq!(r.len(), b.len(), "{name}: one answer per item");
        }
        out.extend(replies.into_iter().flatten());
    }
    out
}

fn madd_all(con: &mut redis::Connection, key: &str, items: &[String]) -> Vec<i64> {
    pipelined(con, "IDEM.BF.MADD", key, items, 1000)
}

fn mexists_all(con: &mut redis::Connection, key: &str, items: &[String]) -> Vec<i64> {
    pipelined(con, "IDEM.BF.MEXISTS", key, items, 1000)
}

fn items(prefix: &str, range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("{prefix}{i}")).collect()
}

fn ones(v: &[i64]) -> usize {
    v.iter().filter(|&&x| x == 1).count()
}

/// Sleeps until the server's clock reads `target_ms` (Unix ms) or later.
fn sleep_until(con: &mut redis::Connection, target_ms: i64) {
    loop {
        let now = server_ms(con);
        if now >= target_ms {
            return;
        }
        std::thread::sleep(Duration::from_millis((target_ms - now) as u64));
    }
}

/// Sleeps until `offset_ms` after the next multiple of `period_ms` of the
/// server's clock; returns that boundary (Unix ms).
fn align_to_boundary(con: &mut redis::Connection, period_ms: i64, offset_ms: i64) -> i64 {
    let now = server_ms(con);
    let boundary = (now / period_ms + 1) * period_ms;
    sleep_until(con, boundary + offset_ms);
    boundary
}

fn time_reply_ms(v: &Value) -> i64 {
    let (s, us): (i64, i64) = redis::from_redis_value(v).expect("TIME reply");
    s * 1000 + us / 1000
}

/// Runs `pipe` between two `TIME`s in one round trip: (server ms before,
/// the replies, server ms after). Every command in between saw a clock in
/// that interval.
fn timed(con: &mut redis::Connection, pipe: &redis::Pipeline) -> (i64, Vec<Value>, i64) {
    let mut p = redis::pipe();
    p.cmd("TIME");
    for c in pipe.cmd_iter() {
        p.add_command(c.clone());
    }
    p.cmd("TIME");
    let mut replies: Vec<Value> = p.query(con).unwrap_or_else(|e| panic!("timed pipeline: {e}"));
    let t1 = time_reply_ms(&replies.pop().unwrap());
    let t0 = time_reply_ms(&replies.remove(0));
    (t0, replies, t1)
}

/// A step ran outside the time slot the scenario needed (machine stalled).
#[derive(Debug)]
struct Hiccup(String);

/// `Ok` when [t0, t1] lies inside [lo, hi) (Unix ms).
fn in_slot(t0: i64, t1: i64, lo: i64, hi: i64, step: &str) -> Result<(), Hiccup> {
    if t0 >= lo && t1 < hi { Ok(()) } else { Err(Hiccup(format!("{step}: ran at [{t0}, {t1}], needed [{lo}, {hi})"))) }
}

/// Runs a timing-sensitive scenario up to 3 times (each with a fresh key
/// suffix) until it runs in its time slots; assertion failures are not
/// retried.
fn with_retries(name: &str, mut scenario: impl FnMut(usize) -> Result<(), Hiccup>) {
    let mut hiccups = Vec::new();
    for attempt in 0..3 {
        match scenario(attempt) {
            Ok(()) => return,
            Err(Hiccup(why)) => {
                eprintln!("{name}: attempt {attempt} missed its time slot, again: {why}");
                hiccups.push(why);
            }
        }
    }
    panic!("{name}: the machine was too slow to run the timed steps 3 times: {hiccups:?}");
}

fn int(v: &Value) -> i64 {
    as_int(v)
}

fn ints(v: &Value) -> Vec<i64> {
    redis::from_redis_value(v).unwrap_or_else(|e| panic!("expected an array of integers, got {v:?}: {e}"))
}

/// Everything observable about a filter key; two snapshots are equal when
/// the filters are identical (same bits, same shards, same expiry).
#[derive(Debug, Clone, PartialEq)]
struct FilterSnap {
    key: String,
    ty: String,
    digest: String,
    info: Option<BfInfo>,
    pexpiretime: i64,
    /// MEXISTS answers for the fixture's probes.
    answers: Vec<i64>,
}

fn filter_snap(con: &mut redis::Connection, key: &str, probes: &[String]) -> FilterSnap {
    let ty: String = redis::cmd("TYPE").arg(key).query(con).unwrap();
    FilterSnap {
        key: key.to_string(),
        digest: digest_value(con, key),
        info: bf_info_opt(con, key),
        pexpiretime: pexpiretime(con, key),
        answers: mexists_all(con, key, probes),
        ty,
    }
}

/// Filters of every shape, made by `populate_filters`.
struct BfFixture {
    keys: Vec<String>,
    /// Items that were added (to some of the filters) and fresh ones.
    probes: Vec<String>,
}

impl BfFixture {
    fn snap(&self, con: &mut redis::Connection) -> Vec<FilterSnap> {
        self.snap_named(con, |k| k.to_string())
    }

    fn snap_named(&self, con: &mut redis::Connection, name: impl Fn(&str) -> String) -> Vec<FilterSnap> {
        self.keys.iter().map(|k| filter_snap(con, &name(k), &self.probes)).collect()
    }
}

/// Asserts two lists of snapshots describe the same filters (key names
/// aside).
fn assert_same_filters(before: &[FilterSnap], after: &[FilterSnap], what: &str) {
    assert_eq!(before.len(), after.len());
    for (b, a) in before.iter().zip(after) {
        assert_eq!(b.ty, a.ty, "{what}: TYPE of {} vs {}", b.key, a.key);
        assert_eq!(b.info, a.info, "{what}: IDEM.BF.INFO of {} vs {}", b.key, a.key);
        assert_eq!(b.pexpiretime, a.pexpiretime, "{what}: PEXPIRETIME of {} vs {}", b.key, a.key);
        assert_eq!(b.digest, a.digest, "{what}: DEBUG DIGEST-VALUE of {} vs {}", b.key, a.key);
        assert!(b.answers == a.answers, "{what}: MEXISTS answers of {} vs {} differ", b.key, a.key);
    }
}

/// Filters of several shapes, names starting with `prefix`: stacked
/// sub-filters, several shards (1 s shards, a long window), one made from
/// the configs by ADD, an empty one, EXPANSION 1, HOUR shards. Takes up to
/// ~1 s (it waits for a shard boundary).
fn populate_filters(con: &mut redis::Connection, prefix: &str) -> BfFixture {
    let k = |base: &str| format!("{prefix}{base}");
    // Stacked: 3000 items in a shard reserved for 1000.
    reserve(con, &k("bf:day"), "0.01", 1000, &[]);
    madd_all(con, &k("bf:day"), &items("d:", 0..3000));
    // From the configs, by ADD on a missing key.
    assert_eq!(bf_add(con, &k("bf:default"), "first"), 1);
    madd_all(con, &k("bf:default"), &items("d:", 0..500));
    reserve(con, &k("bf:empty"), "0.05", 10, &["WINDOW", "2", "SHARD", "HOUR"]);
    reserve(con, &k("bf:exp1"), "0.01", 100, &["EXPANSION", "1", "shard", "hour", "window", "5"]);
    madd_all(con, &k("bf:exp1"), &items("e:", 0..450));
    // Several shards: 1 s shards, remembered for an hour.
    reserve(con, &k("bf:multi"), "0.001", 100, &["WINDOW", "366", "SHARD", "1", "EXPANSION", "3"]);
    madd_all(con, &k("bf:multi"), &items("m:", 0..150));
    align_to_boundary(con, 1000, 20);
    madd_all(con, &k("bf:multi"), &items("m2:", 0..150));
    madd_all(con, &k("bf:multi"), &items("m:", 0..50)); // seen, and recorded in this shard too
    let info = bf_info(con, &k("bf:multi"));
    assert!(info.shards.len() >= 2, "bf:multi should span 2 shards: {info:?}");

    let mut probes = items("d:", 0..3000);
    probes.extend(items("e:", 0..450));
    probes.extend(items("m:", 0..150));
    probes.extend(items("m2:", 0..150));
    probes.push("first".into());
    probes.extend(items("fresh:", 0..3000));
    BfFixture {
        keys: ["bf:day", "bf:default", "bf:empty", "bf:exp1", "bf:multi"].iter().map(|b| k(b)).collect(),
        probes,
    }
}

/// Redis's counters of the module, as numbers.
fn bf_counters(con: &mut redis::Connection) -> [i64; 4] {
    let c = idem_counters(con);
    ["bf_add_new", "bf_add_seen", "bf_exists_hit", "bf_exists_miss"]
        .map(|n| *c.get(n).unwrap_or_else(|| panic!("INFO idem has no idem_{n}: {c:?}")))
}

fn wait_replicas(con: &mut redis::Connection, n: i64) {
    let acked: i64 = redis::cmd("WAIT").arg(n).arg(10_000).query(con).expect("WAIT");
    assert_eq!(acked, n, "WAIT {n}: only {acked} replica(s) acknowledged");
}

// ---------------------------------------------------------------------------
// 1. Rotation in real time
// ---------------------------------------------------------------------------

/// WINDOW 2 of `period`-second shards, in real time: an item is remembered
/// until its shard leaves the window, to the millisecond, and forgotten
/// then; the key expires when its newest shard leaves.
fn rotation(period: i64) {
    const W: i64 = 2;
    let s = Server::start();
    let mut con = s.conn();
    let p = period * 1000;
    with_retries(&format!("rotation SHARD {period}"), |attempt| {
        let key = format!("rot:{attempt}");
        let key = key.as_str();
        let s0 = align_to_boundary(&mut con, p, 30);
        let start = s0 / 1000; // the first shard's start, Unix seconds

        // Shard `start`: "a" only here, "r" re-added in the next shard.
        let mut pipe = redis::pipe();
        pipe.cmd("IDEM.BF.RESERVE").arg(key).arg("0.01").arg(1000).arg("WINDOW").arg(W).arg("SHARD").arg(period);
        pipe.cmd("IDEM.BF.ADD").arg(key).arg("a");
        pipe.cmd("IDEM.BF.ADD").arg(key).arg("r");
        pipe.cmd("IDEM.BF.ADD").arg(key).arg("a");
        pipe.cmd("IDEM.BF.INFO").arg(key);
        pipe.cmd("PEXPIRETIME").arg(key);
        let (t0, r, t1) = timed(&mut con, &pipe);
        in_slot(t0, t1, s0, s0 + p, "first shard")?;
        assert_eq!(as_str(&r[0]), "OK");
        assert_eq!((int(&r[1]), int(&r[2]), int(&r[3])), (1, 1, 0), "ADD a, ADD r, ADD a again");
        let info = parse_info(r[4].clone()).unwrap();
        assert_eq!((info.window, info.shard), (W, period), "{info:?}");
        assert_eq!(info.starts(), vec![start], "RESERVE allocates the current shard: {info:?}");
        assert_eq!((info.shards[0].items, info.items), (2, 2), "{info:?}");
        assert_eq!(info.shards[0].filters, 1, "{info:?}");
        assert!(info.shards[0].bytes > 0 && info.bytes == info.shards[0].bytes, "{info:?}");
        assert_eq!(int(&r[5]), (start + W * period) * 1000, "PEXPIRETIME = (newest shard start + WINDOW*period)*1000");

        // Next shard: "b" new, "r" seen (answers 0) but recorded here too.
        sleep_until(&mut con, s0 + p + 30);
        let mut pipe = redis::pipe();
        pipe.cmd("IDEM.BF.ADD").arg(key).arg("b");
        pipe.cmd("IDEM.BF.ADD").arg(key).arg("r");
        pipe.cmd("IDEM.BF.EXISTS").arg(key).arg("a");
        pipe.cmd("IDEM.BF.INFO").arg(key);
        pipe.cmd("PEXPIRETIME").arg(key);
        let (t0, r, t1) = timed(&mut con, &pipe);
        in_slot(t0, t1, s0 + p, s0 + 2 * p, "second shard")?;
        assert_eq!((int(&r[0]), int(&r[1]), int(&r[2])), (1, 0, 1), "ADD b, ADD r (seen in the older shard), EXISTS a");
        let info = parse_info(r[3].clone()).unwrap();
        assert_eq!(info.starts(), vec![start, start + period], "{info:?}");
        assert_eq!(
            info.shards.iter().map(|s| s.items).collect::<Vec<_>>(),
            vec![2, 2],
            "r is recorded in the new shard too: {info:?}"
        );
        assert_eq!(info.items, 4, "{info:?}");
        assert_eq!(info.bytes, info.shards.iter().map(|s| s.bytes).sum::<i64>(), "{info:?}");
        assert_eq!(int(&r[4]), (start + period + W * period) * 1000, "PEXPIRETIME moves with the newest shard");

        // Just before the first shard leaves the window: all remembered.
        let leave = (start + W * period) * 1000;
        sleep_until(&mut con, leave - 150);
        let mut pipe = redis::pipe();
        pipe.cmd("IDEM.BF.MEXISTS").arg(key).arg(&["a", "b", "r", "x"]);
        pipe.cmd("IDEM.BF.INFO").arg(key);
        let (t0, r, t1) = timed(&mut con, &pipe);
        in_slot(t0, t1, s0 + p, leave, "just before the first shard leaves")?;
        assert_eq!(ints(&r[0]), vec![1, 1, 1, 0], "MEXISTS a b r x, {} ms before the first shard leaves", leave - t1);
        assert_eq!(parse_info(r[1].clone()).unwrap().shards.len(), 2);

        // Just after: "a" forgotten, "r" kept by its re-add, the list shrinks.
        sleep_until(&mut con, leave + 30);
        let mut pipe = redis::pipe();
        pipe.cmd("IDEM.BF.EXISTS").arg(key).arg("a");
        pipe.cmd("IDEM.BF.MEXISTS").arg(key).arg(&["a", "b", "r", "x"]);
        pipe.cmd("IDEM.BF.INFO").arg(key);
        pipe.cmd("PEXPIRETIME").arg(key);
        let (t0, r, t1) = timed(&mut con, &pipe);
        in_slot(t0, t1, leave, leave + p - 200, "just after the first shard left")?;
        assert_eq!(int(&r[0]), 0, "EXISTS a {} ms after its shard left the window", t0 - leave);
        assert_eq!(ints(&r[1]), vec![0, 1, 1, 0], "MEXISTS a b r x after the first shard left");
        let info = parse_info(r[2].clone()).unwrap();
        assert_eq!(info.starts(), vec![start + period], "only the live shard is listed: {info:?}");
        assert_eq!(info.items, 2, "items counts live shards only: {info:?}");
        assert_eq!(info.bytes, info.shards[0].bytes, "{info:?}");
        assert_eq!(int(&r[3]), (start + period + W * period) * 1000);

        // The key expires exactly when its newest shard leaves.
        let gone = (start + period + W * period) * 1000;
        sleep_until(&mut con, gone - 150);
        let mut pipe = redis::pipe();
        pipe.cmd("IDEM.BF.MEXISTS").arg(key).arg(&["b", "r"]);
        pipe.cmd("EXISTS").arg(key);
        let (t0, r, t1) = timed(&mut con, &pipe);
        in_slot(t0, t1, leave, gone, "just before the newest shard leaves")?;
        assert_eq!(ints(&r[0]), vec![1, 1]);
        assert_eq!(int(&r[1]), 1, "the key still exists");
        sleep_until(&mut con, gone + 30);
        let mut pipe = redis::pipe();
        pipe.cmd("EXISTS").arg(key);
        pipe.cmd("IDEM.BF.INFO").arg(key);
        pipe.cmd("IDEM.BF.MEXISTS").arg(key).arg(&["b", "r"]);
        let (t0, r, _) = timed(&mut con, &pipe);
        assert!(t0 >= gone);
        assert_eq!(int(&r[0]), 0, "the key expired with its newest shard");
        assert_eq!(r[1], Value::Nil);
        assert_eq!(ints(&r[2]), vec![0, 0]);
        Ok(())
    });
}

#[test]
fn rotation_with_one_second_shards() {
    rotation(1);
}

#[test]
fn rotation_with_two_second_shards() {
    rotation(2);
}

// ---------------------------------------------------------------------------
// 2. Adaptive sizing (and the window's FPR over stacked, rotated shards)
// ---------------------------------------------------------------------------

#[test]
fn adaptive_sizing_over_short_shards() {
    const PER_SHARD: usize = 2000;
    const SHARDS: usize = 4;
    const QUERIES: usize = 100_000;
    let s = Server::start();
    let mut con = s.conn();
    with_retries("adaptive sizing", |attempt| {
        let key = format!("adapt:{attempt}");
        let key = key.as_str();
        let batches: Vec<Vec<String>> = (0..SHARDS).map(|i| items(&format!("a{attempt}:{i}:"), 0..PER_SHARD)).collect();
        // Reserved 10x too small: 200 for 2000 a shard.
        let s0 = align_to_boundary(&mut con, 1000, 30);
        let start = s0 / 1000;
        let mut answers = Vec::new();
        for (i, batch) in batches.iter().enumerate() {
            let lo = s0 + 1000 * i as i64;
            sleep_until(&mut con, lo + 30);
            let mut pipe = redis::pipe();
            if i == 0 {
                pipe.cmd("IDEM.BF.RESERVE").arg(key).arg("0.01").arg(200).arg("WINDOW").arg(SHARDS).arg("SHARD").arg(1);
            }
            pipe.cmd("IDEM.BF.MADD").arg(key).arg(batch.as_slice());
            let (t0, r, t1) = timed(&mut con, &pipe);
            in_slot(t0, t1, lo, lo + 1000, &format!("batch {i}"))?;
            answers.push(ints(r.last().unwrap()));
        }
        // Still in the last shard, before the first leaves the window.
        let leave = s0 + 1000 * SHARDS as i64;
        let t0 = server_ms(&mut con);
        let info = bf_info(&mut con, key);
        let fresh = items(&format!("q{attempt}:"), 0..QUERIES);
        let fp = ones(&mexists_all(&mut con, key, &fresh));
        let mut all_added: Vec<String> = batches.concat();
        all_added.sort();
        let found = mexists_all(&mut con, key, &all_added);
        let t1 = server_ms(&mut con);
        in_slot(t0, t1, s0 + 1000 * (SHARDS as i64 - 1), leave, "INFO and queries in the last shard")?;

        eprintln!("adaptive sizing: {info:#?}");
        for (i, a) in answers.iter().enumerate() {
            let new = ones(a);
            assert!(new >= PER_SHARD - 60, "batch {i}: only {new} of {PER_SHARD} fresh items answered 1");
        }
        assert_eq!(info.starts(), (0..SHARDS as i64).map(|i| start + i).collect::<Vec<_>>(), "{info:?}");
        for (i, sh) in info.shards.iter().enumerate() {
            // An item answered 0 because the current shard's filter says
            // it is there (a false positive) is not recorded again.
            assert!(sh.items <= PER_SHARD as i64 && sh.items >= PER_SHARD as i64 - 30, "shard {i} items: {sh:?}");
        }
        let first = &info.shards[0];
        assert!(first.filters > 1, "the first shard, reserved for 200, must stack sub-filters for 2000: {first:?}");
        for (i, sh) in info.shards.iter().enumerate().skip(1) {
            assert_eq!(
                sh.filters, 1,
                "shard {i} should start at the previous shard's volume (+25%) and need one filter: {sh:?}"
            );
            assert!(
                (sh.bytes as f64) < 0.8 * first.bytes as f64,
                "shard {i} ({} bytes) should be much smaller than the over-stacked first shard ({} bytes)",
                sh.bytes,
                first.bytes
            );
        }
        // Steady volume: the later shards are sized alike.
        assert!(info.shards[2..].iter().all(|sh| sh.bytes == info.shards[1].bytes), "{info:?}");
        assert_eq!(info.bytes, info.shards.iter().map(|s| s.bytes).sum::<i64>());
        assert_eq!(info.items, info.shards.iter().map(|s| s.items).sum::<i64>());

        // No false negatives, and the whole window's FPR within error_rate.
        assert_eq!(ones(&found), all_added.len(), "false negatives among the added items");
        let rate = fp as f64 / QUERIES as f64;
        let bound = 0.01 + 4.0 * (0.01f64 * 0.99 / QUERIES as f64).sqrt();
        eprintln!(
            "adaptive sizing: first shard {} B ({} filters) = {:.2} bits/item, later shards {} B = {:.2} bits/item ({:.0}% of the first); window FPR {rate:.5} over {} shards",
            first.bytes,
            first.filters,
            first.bytes as f64 * 8.0 / first.items as f64,
            info.shards[1].bytes,
            info.shards[1].bytes as f64 * 8.0 / info.shards[1].items as f64,
            100.0 * info.shards[1].bytes as f64 / first.bytes as f64,
            SHARDS
        );
        assert!(rate <= bound, "window FPR {rate} > {bound} ({fp} of {QUERIES} fresh items answered 1)");
        Ok(())
    });
}

// ---------------------------------------------------------------------------
// 3. False-positive rate
// ---------------------------------------------------------------------------

/// Adds `added` items, checks none is missing, then queries `QUERIES` fresh
/// ones and checks the FPR bound: returns (FPR, bits per item from INFO,
/// INFO).
fn measure_fpr(con: &mut redis::Connection, key: &str, added: usize) -> (f64, f64, BfInfo) {
    const QUERIES: usize = 100_000;
    let inserted = items(&format!("{key}:in:"), 0..added);
    madd_all(con, key, &inserted);
    let found = mexists_all(con, key, &inserted);
    assert_eq!(ones(&found), added, "{key}: false negatives");
    let fresh = items(&format!("{key}:out:"), 0..QUERIES);
    let fp = ones(&mexists_all(con, key, &fresh));
    let rate = fp as f64 / QUERIES as f64;
    let info = bf_info(con, key);
    let bits = info.bytes as f64 * 8.0 / info.items as f64;
    let bound = 0.01 + 4.0 * (0.01f64 * 0.99 / QUERIES as f64).sqrt();
    eprintln!(
        "FPR {key}: {added} added, {fp}/{QUERIES} fresh answered 1 = {rate:.5} (bound {bound:.5}); {} B for {} items = {bits:.2} bits/item; shards {:?}",
        info.bytes, info.items, info.shards
    );
    assert!(
        rate <= bound,
        "{key}: FPR {rate} over {QUERIES} fresh items > {bound} (error_rate 0.01), at {added} items"
    );
    (rate, bits, info)
}

#[test]
fn false_positive_rate_within_error_rate() {
    let s = Server::start();
    let mut con = s.conn();
    // Default window (7 daily shards): one shard holds everything.
    reserve(&mut con, "fpr", "0.01", 10_000, &[]);
    measure_fpr(&mut con, "fpr", 10_000);
    // 10x the capacity: stacked sub-filters keep the bound.
    reserve(&mut con, "fpr10x", "0.01", 10_000, &[]);
    let (_, _, info) = measure_fpr(&mut con, "fpr10x", 100_000);
    assert!(info.shards.iter().map(|s| s.filters).sum::<i64>() > 1, "100k items in a 10k filter must stack: {info:?}");
    // WINDOW 1: the one shard gets the whole budget, the tightest case.
    // (Shards of 10 years: no rotation during the test.)
    let decade = (10 * 365 * 86_400).to_string();
    reserve(&mut con, "fprw1", "0.01", 10_000, &["WINDOW", "1", "SHARD", &decade]);
    measure_fpr(&mut con, "fprw1", 10_000);
    reserve(&mut con, "fprw1x10", "0.01", 10_000, &["WINDOW", "1", "SHARD", &decade]);
    measure_fpr(&mut con, "fprw1x10", 100_000);
}

#[test]
fn false_positive_rate_within_error_rate_when_growing_from_a_tiny_reservation() {
    // "It holds however many items arrive": also when the first sub-filter
    // is tiny and the shard grows by stacking from there.
    let s = Server::start();
    let mut con = s.conn();
    let decade = (10 * 365 * 86_400).to_string();
    let mut failures = Vec::new();
    for (key, capacity, opts, added) in [
        ("cap1", 1, vec!["WINDOW", "1", "SHARD", decade.as_str()], 10_000),
        ("cap10", 10, vec![], 10_000),
        ("cap100x1", 100, vec!["EXPANSION", "1", "WINDOW", "1", "SHARD", decade.as_str()], 3000),
    ] {
        reserve(&mut con, key, "0.01", capacity, &opts);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| measure_fpr(&mut con, key, added)));
        if let Err(e) = r {
            let msg = e.downcast_ref::<String>().cloned().unwrap_or_default();
            failures.push(format!("RESERVE {key} 0.01 {capacity} {opts:?}, {added} items: {msg}"));
            con = s.conn();
        }
    }
    assert!(failures.is_empty(), "FPR above error_rate:\n{}", failures.join("\n"));
}

#[test]
fn false_positive_rate_within_error_rate_at_low_volume() {
    // Filters that see a few items a shard: each new shard is sized from
    // the previous one's count, so every shard is small. Each filter's
    // window FPR must still stay within error_rate. 1 s shards, WINDOW 7,
    // 3 items in each of 6 shards, queried while all 6 are live; 20
    // filters (20 seeds), each held to the bound.
    const W: usize = 7;
    const SHARDS: usize = 6;
    const FILTERS: usize = 20;
    const QUERIES: usize = 10_000;
    let s = Server::start();
    let mut con = s.conn();
    with_retries("low volume", |attempt| {
        let keys: Vec<String> = (0..FILTERS).map(|f| format!("low:{attempt}:{f}")).collect();
        let s0 = align_to_boundary(&mut con, 1000, 20);
        for key in &keys {
            reserve(&mut con, key, "0.01", 3, &["WINDOW", &W.to_string(), "SHARD", "1"]);
        }
        let mut added = Vec::new();
        for i in 0..SHARDS {
            let lo = s0 + 1000 * i as i64;
            sleep_until(&mut con, lo + 20);
            let batch = items(&format!("low{attempt}:{i}:"), 0..3);
            let mut pipe = redis::pipe();
            for key in &keys {
                pipe.cmd("IDEM.BF.MADD").arg(key).arg(batch.as_slice());
            }
            let (t0, _, t1) = timed(&mut con, &pipe);
            in_slot(t0, t1, lo, lo + 1000, &format!("shard {i}"))?;
            added.extend(batch);
        }
        let t0 = server_ms(&mut con);
        let fresh = items(&format!("low{attempt}:out:"), 0..QUERIES);
        let mut rates = Vec::new();
        for key in &keys {
            let info = bf_info(&mut con, key);
            assert_eq!(info.shards.len(), SHARDS, "{info:?}");
            assert_eq!(ones(&mexists_all(&mut con, key, &added)), added.len(), "{key}: false negatives");
            rates.push(ones(&mexists_all(&mut con, key, &fresh)) as f64 / QUERIES as f64);
        }
        let t1 = server_ms(&mut con);
        in_slot(t0, t1, s0 + 1000 * (SHARDS as i64 - 1), s0 + 1000 * W as i64, "queries while all shards are live")?;
        let mean = rates.iter().sum::<f64>() / FILTERS as f64;
        let worst = rates.iter().cloned().fold(0.0, f64::max);
        let bound = 0.01 + 4.0 * (0.01f64 * 0.99 / QUERIES as f64).sqrt();
        let info = bf_info(&mut con, &keys[0]);
        eprintln!(
            "low volume: FPR mean {mean:.5}, worst {worst:.5} (bound {bound:.5}), per filter {rates:?}; {:?}",
            info.shards
        );
        assert!(
            worst <= bound,
            "low volume (RESERVE 0.01 3 WINDOW {W} SHARD 1, 3 items in each of {SHARDS} live shards): worst FPR of {FILTERS} filters {worst:.5} > {bound:.5} (mean {mean:.5}); per filter {rates:?}; shards of one: {:?}",
            info.shards
        );
        Ok(())
    });
}

// ---------------------------------------------------------------------------
// 4. No false negatives
// ---------------------------------------------------------------------------

#[test]
fn no_false_negatives_for_a_million_items() {
    const N: usize = 1_000_000;
    let s = Server::start();
    let mut con = s.conn();
    // Reserved for 100k: the million stacks sub-filters.
    reserve(&mut con, "million", "0.01", 100_000, &[]);
    let all = items("million-item-", 0..N);
    let started = Instant::now();
    let added = madd_all(&mut con, "million", &all);
    let add_time = started.elapsed();
    let new = ones(&added);
    let started = Instant::now();
    let found = mexists_all(&mut con, "million", &all);
    let query_time = started.elapsed();
    let missing: Vec<&String> = found.iter().zip(&all).filter(|(f, _)| **f != 1).map(|(_, i)| i).take(10).collect();
    assert!(missing.is_empty(), "false negatives (first 10): {missing:?}");
    let info = bf_info(&mut con, "million");
    eprintln!(
        "1M items: MADD {add_time:?}, MEXISTS {query_time:?}; {} answered 0 on add (false positives while filling); INFO items {} bytes {} = {:.2} bits/item, shards {:?}",
        N - new,
        info.items,
        info.bytes,
        info.bytes as f64 * 8.0 / info.items as f64,
        info.shards
    );
    // Distinct items: the few answered 0 were false positives.
    assert!(new as f64 >= N as f64 * 0.99, "only {new} of {N} distinct items answered 1 on add");
    assert!(info.items as usize >= new && info.items as usize <= N, "INFO items {} (answered new: {new})", info.items);
    s.conn(); // still answering
}

// ---------------------------------------------------------------------------
// 5. Reply shapes, INFO, configs, counters
// ---------------------------------------------------------------------------

#[test]
fn madd_mexists_shapes_and_repeats() {
    let s = Server::start();
    let mut con = s.conn();
    let c0 = bf_counters(&mut con);
    let v: Value = q(&mut con, "IDEM.BF.MADD", ("f", "a", "b", "a", "c", "b")).unwrap();
    assert_eq!(
        v,
        Value::Array(vec![Value::Int(1), Value::Int(1), Value::Int(0), Value::Int(1), Value::Int(0)]),
        "MADD: in order, a repeat within one call answers 0"
    );
    let v: Value = q(&mut con, "IDEM.BF.MADD", ("f", "single")).unwrap();
    assert_eq!(v, Value::Array(vec![Value::Int(1)]), "MADD with one item: an array of one");
    let v: Value = q(&mut con, "IDEM.BF.ADD", ("f", "a")).unwrap();
    assert_eq!(v, Value::Int(0), "ADD of a known item");
    let v: Value = q(&mut con, "IDEM.BF.ADD", ("f", "d")).unwrap();
    assert_eq!(v, Value::Int(1), "ADD of a new item");
    let v: Value = q(&mut con, "IDEM.BF.MEXISTS", ("f", "a", "zz", "b", "c", "d", "a", "single")).unwrap();
    assert_eq!(v, Value::Array([1, 0, 1, 1, 1, 1, 1].map(Value::Int).to_vec()));
    assert_eq!(q(&mut con, "IDEM.BF.EXISTS", ("f", "c")).unwrap(), Value::Int(1));
    assert_eq!(q(&mut con, "IDEM.BF.EXISTS", ("f", "nope")).unwrap(), Value::Int(0));
    // Binary and empty items.
    assert_eq!(bf_madd(&mut con, "f", &["", "\u{0}bin\r\n"]), vec![1, 1]);
    let v: Value = redis::cmd("IDEM.BF.MEXISTS")
        .arg("f")
        .arg(&b""[..])
        .arg(&b"\x00bin\r\n"[..])
        .arg(&b"\x00bin"[..])
        .query(&mut con)
        .unwrap();
    assert_eq!(v, Value::Array([1, 1, 0].map(Value::Int).to_vec()));
    // Items: a b c single d "" "\0bin\r\n".
    assert_eq!(bf_info(&mut con, "f").items, 7);

    // Missing key: 0 / all zeros / nil, and nothing created.
    assert_eq!(q(&mut con, "IDEM.BF.EXISTS", ("missing", "a")).unwrap(), Value::Int(0));
    assert_eq!(
        q(&mut con, "IDEM.BF.MEXISTS", ("missing", "a", "b", "c")).unwrap(),
        Value::Array([0, 0, 0].map(Value::Int).to_vec())
    );
    assert_eq!(q(&mut con, "IDEM.BF.INFO", "missing").unwrap(), Value::Nil);
    assert!(!exists(&mut con, "missing"), "a read created the key");

    // Counters: MADD 5 (3 new, 2 seen) + 1 new + ADD seen + ADD new + MADD 2 new;
    // MEXISTS 7 (6 hits, 1 miss), EXISTS hit + miss, MEXISTS 3 (2 hits, 1 miss),
    // missing key: EXISTS miss + 3 MEXISTS misses.
    let c1 = bf_counters(&mut con);
    let delta: Vec<i64> = c1.iter().zip(&c0).map(|(a, b)| a - b).collect();
    assert_eq!(
        delta,
        vec![3 + 1 + 1 + 2, 2 + 1, 6 + 1 + 2, 1 + 1 + 1 + 1 + 3],
        "INFO idem bf_add_new, bf_add_seen, bf_exists_hit, bf_exists_miss"
    );
}

#[test]
fn info_fields_types_and_defaults() {
    let s = Server::start();
    let mut con = s.conn();
    assert_eq!(bf_info_opt(&mut con, "nothing"), None);

    // RESP2 shape, exactly: flat array, names as strings, error_rate a bulk string.
    reserve(&mut con, "r", "0.001", 5000, &["window", "3", "Shard", "hour", "EXPANSION", "4"]);
    bf_madd(&mut con, "r", &["x", "y"]);
    let t = server_ms(&mut con) / 1000;
    let raw: Value = q(&mut con, "IDEM.BF.INFO", "r").unwrap();
    let Value::Array(flat) = &raw else { panic!("RESP2 INFO: {raw:?}") };
    assert!(matches!(flat[1], Value::BulkString(_)), "error_rate in RESP2 is a bulk string: {raw:?}");
    for i in [3, 5, 7, 9, 11, 13] {
        assert!(matches!(flat[i], Value::Int(_)), "INFO field {} is an integer: {raw:?}", as_str(&flat[i - 1]));
    }
    let info = parse_info(raw).unwrap();
    assert_eq!(
        (info.error_rate, info.capacity, info.window, info.shard, info.expansion, info.items),
        (0.001, 5000, 3, 3600, 4, 2),
        "{info:?}"
    );
    let start = t / 3600 * 3600;
    assert_eq!(info.starts(), vec![start], "{info:?}");
    assert_eq!(
        pexpiretime(&mut con, "r"),
        (start + 3 * 3600) * 1000,
        "PEXPIRETIME = (shard start + WINDOW*period)*1000"
    );
    let ty: String = redis::cmd("TYPE").arg("r").query(&mut con).unwrap();
    assert_eq!(ty, "idembloom");

    // RESP3: a map with a double, shards as maps.
    let mut c3 = s.conn_resp3();
    let raw: Value = q(&mut c3, "IDEM.BF.INFO", "r").unwrap();
    let Value::Map(m) = &raw else { panic!("RESP3 INFO should be a map: {raw:?}") };
    assert_eq!(m[0].1, Value::Double(0.001), "RESP3 error_rate is a double");
    let Value::Array(shards) = &m[7].1 else { panic!("{raw:?}") };
    assert!(matches!(shards[0], Value::Map(_)), "RESP3 shard entries are maps: {raw:?}");
    assert_eq!(parse_info(raw).unwrap(), info);
    assert_eq!(q(&mut c3, "IDEM.BF.INFO", "nothing").unwrap(), Value::Nil);

    // SHARD DAY / seconds, case-insensitive options.
    reserve(&mut con, "d", "0.5", 1, &["SHARD", "day"]);
    let i = bf_info(&mut con, "d");
    assert_eq!((i.error_rate, i.capacity, i.shard, i.expansion, i.items), (0.5, 1, 86_400, 2, 0));
    assert_eq!(i.window, 7, "default WINDOW: config bf-window");
    // RESERVE allocates the current shard at once.
    assert_eq!(i.shards.len(), 1, "{i:?}");
    assert_eq!((i.shards[0].items, i.shards[0].filters), (0, 1), "{i:?}");
    assert!(i.shards[0].bytes > 0 && i.bytes == i.shards[0].bytes, "{i:?}");
    reserve(&mut con, "sec", "0.02", 10, &["SHARD", "60", "WINDOW", "10"]);
    let i = bf_info(&mut con, "sec");
    assert_eq!((i.shard, i.window), (60, 10));
    let t = server_ms(&mut con) / 1000;
    let exp = pexpiretime(&mut con, "sec");
    assert!(exp == (t / 60 * 60 + 600) * 1000 || exp == (t / 60 * 60 + 540) * 1000, "PEXPIRETIME {exp} at {t}");

    // ADD on a missing key: created from the configs.
    assert_eq!(bf_add(&mut con, "auto", "x"), 1);
    let t = server_ms(&mut con) / 1000;
    let i = bf_info(&mut con, "auto");
    assert_eq!(
        (i.error_rate, i.capacity, i.window, i.shard, i.expansion, i.items),
        (0.01, 100_000, 7, 86_400, 2, 1),
        "{i:?}"
    );
    assert_eq!(i.starts(), vec![t / 86_400 * 86_400]);
    assert_eq!(pexpiretime(&mut con, "auto"), (t / 86_400 * 86_400 + 7 * 86_400) * 1000);
    // Bytes in INFO are real: about what capacity and the per-shard error need.
    let ideal_bits = 100_000.0 * -(0.01f64 / 7.0 / 2.0).ln() / std::f64::consts::LN_2.powi(2);
    let bytes = i.bytes as f64;
    assert!(
        bytes > ideal_bits / 8.0 * 0.7 && bytes < ideal_bits / 8.0 * 1.4,
        "INFO bytes {bytes} for 100k at 0.01/7 (ideal {} B)",
        ideal_bits / 8.0
    );
    let mu: i64 = redis::cmd("MEMORY").arg("USAGE").arg("auto").query(&mut con).unwrap();
    assert!(mu >= i.bytes, "MEMORY USAGE {mu} < INFO bytes {}", i.bytes);

    // An ordinary key: SCAN ... TYPE, RENAME.
    let (_, mut found): (i64, Vec<String>) =
        redis::cmd("SCAN").arg(0).arg("COUNT").arg(1000).arg("TYPE").arg("idembloom").query(&mut con).unwrap();
    found.sort();
    assert_eq!(found, vec!["auto", "d", "r", "sec"]);
    let (d, e) = (digest_value(&mut con, "r"), pexpiretime(&mut con, "r"));
    let _: () = redis::cmd("RENAME").arg("r").arg("r2").query(&mut con).unwrap();
    assert_eq!((bf_info(&mut con, "r2"), digest_value(&mut con, "r2"), pexpiretime(&mut con, "r2")), (info, d, e));
    assert_eq!(bf_mexists(&mut con, "r2", &["x", "y"]), vec![1, 1]);
}

#[test]
fn configs_set_get_refuse_and_loadmodule_args() {
    let s = Server::start();
    let mut con = s.conn();
    let get = |con: &mut redis::Connection, name: &str| -> String {
        let v: Vec<String> = redis::cmd("CONFIG").arg("GET").arg(name).query(con).unwrap();
        assert_eq!(v.len(), 2, "CONFIG GET {name}: {v:?}");
        v[1].clone()
    };
    assert_eq!(get(&mut con, "idem.bf-capacity"), "100000");
    assert_eq!(get(&mut con, "idem.bf-window"), "7");
    assert_eq!(get(&mut con, "idem.bf-error-rate").parse::<f64>().unwrap(), 0.01);
    for (name, value) in [("idem.bf-error-rate", "0.001"), ("idem.bf-capacity", "5000"), ("idem.bf-window", "3")] {
        let r: RedisResult<String> = redis::cmd("CONFIG").arg("SET").arg(name).arg(value).query(&mut con);
        assert_eq!(r.map_err(|e| err_text(&e)), Ok("OK".into()), "CONFIG SET {name} {value}");
    }
    assert_eq!(get(&mut con, "idem.bf-error-rate").parse::<f64>().unwrap(), 0.001);
    let bad = [
        ("idem.bf-error-rate", "abc"),
        ("idem.bf-error-rate", "0"),
        ("idem.bf-error-rate", "1"),
        ("idem.bf-error-rate", "-0.5"),
        ("idem.bf-error-rate", "1.5"),
        ("idem.bf-error-rate", "5e-324"),
        ("idem.bf-error-rate", "1e-15"),
        ("idem.bf-error-rate", ""),
        ("idem.bf-capacity", "0"),
        ("idem.bf-capacity", "-1"),
        ("idem.bf-capacity", "abc"),
        ("idem.bf-window", "0"),
        ("idem.bf-window", "367"),
        ("idem.bf-window", "x"),
        ("idem.bf-max-bytes", "4095"),
        ("idem.bf-max-bytes", "535822337"),
    ];
    for (name, value) in bad {
        let r: RedisResult<Value> = redis::cmd("CONFIG").arg("SET").arg(name).arg(value).query(&mut con);
        assert!(r.is_err(), "CONFIG SET {name} {value:?} accepted: {r:?}");
    }
    assert_eq!(
        get(&mut con, "idem.bf-error-rate").parse::<f64>().unwrap(),
        0.001,
        "a refused value changed the config"
    );
    assert_eq!(get(&mut con, "idem.bf-capacity"), "5000");
    assert_eq!(get(&mut con, "idem.bf-window"), "3");
    // New filters from ADD, MADD and DONE ... BLOOM use them.
    bf_add(&mut con, "a1", "x");
    bf_madd(&mut con, "a2", &["x", "y"]);
    let tok = claim_new(&mut con, "rec", 60);
    assert_eq!(done(&mut con, "rec", &tok, ("BLOOM", "a3")), Ok(1));
    for k in ["a1", "a2", "a3"] {
        let i = bf_info(&mut con, k);
        assert_eq!(
            (i.error_rate, i.capacity, i.window, i.shard, i.expansion),
            (0.001, 5000, 3, 86_400, 2),
            "{k}: {i:?}"
        );
    }
    // RESERVE's default WINDOW is the config too.
    reserve(&mut con, "r", "0.1", 10, &[]);
    assert_eq!(bf_info(&mut con, "r").window, 3);

    // As loadmodule arguments.
    let s2 = Server::with_args(&["bf-error-rate", "0.02", "bf-window", "3", "bf-capacity", "777"], &[]);
    let mut c2 = s2.conn();
    assert_eq!(get(&mut c2, "idem.bf-window"), "3");
    bf_add(&mut c2, "f", "x");
    let i = bf_info(&mut c2, "f");
    assert_eq!((i.error_rate, i.capacity, i.window), (0.02, 777, 3), "{i:?}");
    drop(c2);
    drop(s2);
    // Bad loadmodule arguments: the module refuses to load.
    for args in [
        ["bf-error-rate", "2"],
        ["bf-error-rate", "0"],
        ["bf-error-rate", "abc"],
        ["bf-window", "0"],
        ["bf-window", "9000"],
        ["bf-capacity", "0"],
        ["bf-capacity", "-3"],
    ] {
        match Server::try_with_args(&args, &[]) {
            Ok(_) => panic!("the module loaded with bad arguments {args:?}"),
            Err(msg) => assert!(msg.contains("exited at start"), "{args:?}: {msg}"),
        }
    }
}

// ---------------------------------------------------------------------------
// 6. Persistence and replication
// ---------------------------------------------------------------------------

fn aof_args() -> Vec<&'static str> {
    vec!["--appendonly", "yes", "--aof-use-rdb-preamble", "no", "--appendfsync", "always"]
}

#[test]
fn filters_survive_debug_reload() {
    let mut s = Server::start();
    let mut con = s.conn();
    let fx = populate_filters(&mut con, "");
    let before = fx.snap(&mut con);
    let digest_before = digest(&mut con);
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut con).expect("DEBUG RELOAD");
    s.assert_alive();
    assert_same_filters(&before, &fx.snap(&mut con), "DEBUG RELOAD");
    assert_eq!(digest(&mut con), digest_before, "DEBUG DIGEST across DEBUG RELOAD");
    // Still a working filter: a new item, then the digest moves.
    let d = digest_value(&mut con, "bf:day");
    assert_eq!(bf_add(&mut con, "bf:day", "after-reload"), 1);
    assert_ne!(digest_value(&mut con, "bf:day"), d, "DIGEST-VALUE did not change with the filter");
}

#[test]
fn filters_survive_save_and_restart() {
    let mut s = Server::start();
    let mut con = s.conn();
    let fx = populate_filters(&mut con, "");
    let before = fx.snap(&mut con);
    let _: () = redis::cmd("SAVE").query(&mut con).expect("SAVE");
    drop(con);
    s.restart(Shutdown::NoSave);
    let mut con = s.conn();
    assert_same_filters(&before, &fx.snap(&mut con), "SAVE + restart");
    // More items, then SHUTDOWN SAVE.
    madd_all(&mut con, "bf:multi", &items("late:", 0..300));
    madd_all(&mut con, "bf:empty", &items("late:", 0..30));
    let before = fx.snap(&mut con);
    drop(con);
    s.restart(Shutdown::Save);
    let mut con = s.conn();
    assert_same_filters(&before, &fx.snap(&mut con), "SHUTDOWN SAVE + restart");
}

#[test]
fn filters_replay_exactly_from_the_aof() {
    // No rewrite: each write is replayed as the IDEM.BF.APPLY it
    // propagated, at the primary's time, with the filter's seed.
    let mut args = aof_args();
    args.extend(["--auto-aof-rewrite-percentage", "0"]);
    let mut s = Server::with_args(&[], &args);
    let mut con = s.conn();
    let fx = populate_filters(&mut con, "");
    // DONE ... BLOOM writes to a filter too.
    let tok = claim_new(&mut con, "order:1", 60);
    assert_eq!(done(&mut con, "order:1", &tok, ("BLOOM", "bf:day")), Ok(1));
    let before = fx.snap(&mut con);
    let digest_before = digest(&mut con);
    std::thread::sleep(Duration::from_millis(1100)); // replay happens in a later shard of bf:multi
    drop(con);
    s.restart(Shutdown::NoSave);
    let mut con = s.conn();
    assert_same_filters(&before, &fx.snap(&mut con), "AOF replay");
    assert_eq!(digest(&mut con), digest_before, "DEBUG DIGEST across AOF replay");
    assert_eq!(bf_exists(&mut con, "bf:day", "order:1"), 1);
}

#[test]
fn filters_survive_aof_rewrite_and_restart() {
    let mut s = Server::with_args(&[], &aof_args());
    let mut con = s.conn();
    let fx = populate_filters(&mut con, "");
    let before = fx.snap(&mut con);
    s.bgrewriteaof(&mut con);
    s.assert_alive();
    let aofdir = s.dir.join("appendonlydir");
    let names: Vec<String> = std::fs::read_dir(&aofdir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let base = names.iter().find(|n| n.ends_with(".base.aof")).unwrap_or_else(|| panic!("no .base.aof: {names:?}"));
    let text = std::fs::read(aofdir.join(base)).unwrap();
    assert!(text.windows(12).any(|w| w == b"IDEM.BF.LOAD"), "the rewritten AOF should hold IDEM.BF.LOAD commands");
    drop(con);
    s.restart(Shutdown::NoSave);
    let mut con = s.conn();
    assert_same_filters(&before, &fx.snap(&mut con), "AOF rewrite + restart");
    // Writes after the rewrite replay on top of it.
    madd_all(&mut con, "bf:multi", &items("late:", 0..300));
    bf_add(&mut con, "bf:empty", "one");
    bf_add(&mut con, "bf:new", "created after the rewrite");
    let mut keys = fx.keys.clone();
    keys.push("bf:new".into());
    let fx2 = BfFixture { keys, probes: fx.probes.clone() };
    let before = fx2.snap(&mut con);
    let digest_before = digest(&mut con);
    drop(con);
    s.restart(Shutdown::NoSave);
    let mut con = s.conn();
    assert_same_filters(&before, &fx2.snap(&mut con), "AOF rewrite + more writes + restart");
    assert_eq!(digest(&mut con), digest_before);
}

#[test]
fn filters_dump_restore_copy_and_migrate() {
    let mut s = Server::start();
    let mut con = s.conn();
    let fx = populate_filters(&mut con, "");
    let before = fx.snap(&mut con);
    for k in &fx.keys {
        let payload: Vec<u8> = redis::cmd("DUMP").arg(k).query(&mut con).unwrap();
        let exp = pexpiretime(&mut con, k);
        assert!(exp > 0, "{k}: a filter always has an expiry");
        let _: () = redis::cmd("RESTORE")
            .arg(format!("{k}:restored"))
            .arg(exp)
            .arg(payload.as_slice())
            .arg("ABSTTL")
            .query(&mut con)
            .unwrap_or_else(|e| panic!("RESTORE {k}:restored: {e}"));
        let n: i64 = redis::cmd("COPY").arg(k).arg(format!("{k}:copy")).query(&mut con).unwrap();
        assert_eq!(n, 1);
    }
    assert_same_filters(&before, &fx.snap_named(&mut con, |k| format!("{k}:restored")), "DUMP/RESTORE");
    assert_same_filters(&before, &fx.snap_named(&mut con, |k| format!("{k}:copy")), "COPY");
    // Deep copies: changing them leaves the originals as they were.
    for k in &fx.keys {
        madd_all(&mut con, &format!("{k}:copy"), &items("copy-only:", 0..200));
        madd_all(&mut con, &format!("{k}:restored"), &items("restored-only:", 0..200));
    }
    assert_same_filters(&before, &fx.snap(&mut con), "originals after writing to copies");
    assert_eq!(bf_exists(&mut con, "bf:day", "copy-only:1"), 0);
    // And the other way round.
    let copies = fx.snap_named(&mut con, |k| format!("{k}:copy"));
    for k in &fx.keys {
        madd_all(&mut con, k, &items("orig-only:", 0..200));
    }
    assert_eq!(copies, fx.snap_named(&mut con, |k| format!("{k}:copy")), "copies after writing to the originals");
    // RESTORE REPLACE over an existing filter, relative TTL.
    let payload: Vec<u8> = redis::cmd("DUMP").arg("bf:exp1:copy").query(&mut con).unwrap();
    let _: () =
        redis::cmd("RESTORE").arg("bf:day").arg(60_000).arg(payload.as_slice()).arg("REPLACE").query(&mut con).unwrap();
    assert_eq!(digest_value(&mut con, "bf:day"), digest_value(&mut con, "bf:exp1:copy"));
    let ttl = pttl(&mut con, "bf:day");
    assert!(ttl > 55_000 && ttl <= 60_000, "RESTORE with a relative TTL: {ttl}");

    // MIGRATE (COPY) to another server.
    let other = Server::start();
    let mut oc = other.conn();
    let snaps = fx.snap_named(&mut con, |k| format!("{k}:restored"));
    let keys: Vec<String> = fx.keys.iter().map(|k| format!("{k}:restored")).collect();
    migrate_copy(&mut con, other.port, &keys);
    for snap in &snaps {
        let got = filter_snap(&mut oc, &snap.key, &fx.probes);
        assert_eq!(
            (&got.digest, &got.info, &got.answers),
            (&snap.digest, &snap.info, &snap.answers),
            "MIGRATE {}",
            snap.key
        );
        assert!((got.pexpiretime - snap.pexpiretime).abs() < 5000, "MIGRATE TTL of {}", snap.key);
    }
    s.assert_alive();
}

/// Where the filter's own bytes start in a DUMP body (after the module
/// id and the string opcode), and their length.
fn blob_span(body: &[u8]) -> (usize, usize) {
    assert_eq!(body[0], 7, "not a RDB_TYPE_MODULE_2 payload");
    assert_eq!(body[1], 0x81, "module id not a 64-bit length");
    assert_eq!(body[10], 5, "RDB_MODULE_OPCODE_STRING expected");
    let i = 11;
    let (len, n) = match body[i] >> 6 {
        0 => ((body[i] & 0x3f) as usize, 1),
        1 => ((((body[i] & 0x3f) as usize) << 8) | body[i + 1] as usize, 2),
        2 if body[i] == 0x80 => (u32::from_be_bytes(body[i + 1..i + 5].try_into().unwrap()) as usize, 5),
        2 if body[i] == 0x81 => (u64::from_be_bytes(body[i + 1..i + 9].try_into().unwrap()) as usize, 9),
        _ => panic!("the filter's string is compressed or encoded: {:x}", body[i]),
    };
    assert!(i + n + len < body.len(), "blob runs past the body");
    (i + n, len)
}

fn corrupt_filter_restores(server_args: &[&str], structural: bool) {
    let mut s = Server::with_args(&[], server_args);
    let mut con = s.conn();
    // Two shards, stacked sub-filters, small bit arrays: most bytes are
    // structure.
    reserve(&mut con, "src", "0.1", 4, &["WINDOW", "366", "SHARD", "1"]);
    bf_madd(&mut con, "src", &items("x", 0..20));
    align_to_boundary(&mut con, 1000, 10);
    bf_madd(&mut con, "src", &items("y", 0..10));
    let original = filter_snap(&mut con, "src", &items("x", 0..30));
    assert_eq!(original.info.as_ref().unwrap().shards.len(), 2);
    let good: Vec<u8> = redis::cmd("DUMP").arg("src").query(&mut con).unwrap();
    let footer = good[good.len() - 10..good.len() - 8].to_vec();
    let body = good[..good.len() - 10].to_vec();
    let make = |body: &[u8]| -> Vec<u8> {
        let mut p = body.to_vec();
        p.extend_from_slice(&footer);
        p.extend_from_slice(&[0u8; 8]);
        fix_dump_crc(&mut p);
        p
    };
    let restore = |con: &mut redis::Connection, payload: &[u8]| -> RedisResult<Value> {
        redis::cmd("RESTORE").arg("bad").arg(0).arg(payload).arg("REPLACE").query(con)
    };
    // Whatever was accepted must be a usable filter.
    let exercise = |con: &mut redis::Connection| {
        let _: RedisResult<Value> = redis::cmd("IDEM.BF.INFO").arg("bad").query(con);
        let _: RedisResult<Value> = redis::cmd("IDEM.BF.MEXISTS").arg("bad").arg("x1").arg("zz").query(con);
        let _: RedisResult<Value> = redis::cmd("IDEM.BF.MADD").arg("bad").arg("n1").arg("n2").arg("x3").query(con);
        let _: RedisResult<Value> = redis::cmd("MEMORY").arg("USAGE").arg("bad").query(con);
        let _: RedisResult<Value> = redis::cmd("DEBUG").arg("DIGEST-VALUE").arg("bad").query(con);
        let _: RedisResult<Value> = redis::cmd("DUMP").arg("bad").query(con);
        let _: RedisResult<Value> = redis::cmd("COPY").arg("bad").arg("bad2").arg("REPLACE").query(con);
        let _: RedisResult<Value> = redis::cmd("DEL").arg("bad").arg("bad2").query(con);
    };
    // Sanity: the re-checksummed good payload restores the same filter
    // (with an expiry: DIGEST-VALUE counts whether the key has one).
    let _: () = redis::cmd("RESTORE")
        .arg("good")
        .arg(original.pexpiretime)
        .arg(make(&body))
        .arg("ABSTTL")
        .query(&mut con)
        .expect("RESTORE of the re-checksummed good payload");
    assert_eq!(filter_snap(&mut con, "good", &items("x", 0..30)).answers, original.answers);
    assert_eq!(digest_value(&mut con, "good"), original.digest);

    let mut refused = 0;
    let mut accepted = 0;
    let mut failures = Vec::new();
    if structural {
        let (b, len) = blob_span(&body);
        // Fields of the filter's encoding that make it invalid: each must be refused.
        let mut must_refuse: Vec<(String, Vec<u8>)> = Vec::new();
        let mut set = |what: &str, at: usize, bytes: &[u8]| {
            let mut x = body.clone();
            x[b + at..b + at + bytes.len()].copy_from_slice(bytes);
            must_refuse.push((what.to_string(), x));
        };
        set("format version 0", 0, &[0]);
        set("format version 3", 0, &[3]);
        set("error_rate 0", 1, &0.0f64.to_le_bytes());
        set("error_rate 1", 1, &1.0f64.to_le_bytes());
        set("error_rate NaN", 1, &f64::NAN.to_le_bytes());
        set("error_rate -0.5", 1, &(-0.5f64).to_le_bytes());
        set("capacity 0", 9, &0u64.to_le_bytes());
        set("window 0", 17, &0u32.to_le_bytes());
        set("window 8785", 17, &8785u32.to_le_bytes());
        set("period 0", 21, &0i64.to_le_bytes());
        set("period -1", 21, &(-1i64).to_le_bytes());
        set("period 3 (shard starts not multiples)", 21, &3i64.to_le_bytes());
        set("expansion 0", 29, &0u32.to_le_bytes());
        set("expansion 1025", 29, &1025u32.to_le_bytes());
        set("shard count u32::MAX", 65, &u32::MAX.to_le_bytes());
        set("shard count 3 (one more than present)", 65, &3u32.to_le_bytes());
        set("shard count 1 (trailing bytes)", 65, &1u32.to_le_bytes());
        set("first shard start odd -1", 69, &(-1i64).to_le_bytes());
        set("first shard items + 1", 77, &(original.info.as_ref().unwrap().shards[0].items as u64 + 1).to_le_bytes());
        set("first shard sub-filter count 0", 85, &0u32.to_le_bytes());
        set("first shard sub-filter count 33", 85, &33u32.to_le_bytes());
        set("first sub-filter capacity 0", 89, &0u64.to_le_bytes());
        set("first sub-filter items > capacity", 97, &1000u64.to_le_bytes());
        set("first sub-filter error 1.0", 105, &1.0f64.to_le_bytes());
        set("first sub-filter hash count 0", 113, &0u32.to_le_bytes());
        set("first sub-filter hash count 21", 113, &21u32.to_le_bytes());
        set("first sub-filter hash count 1000000", 113, &1_000_000u32.to_le_bytes());
        set("first sub-filter bit length 0", 117, &0u32.to_le_bytes());
        set("first sub-filter bit length huge", 117, &u32::MAX.to_le_bytes());
        set("first sub-filter bit length not whole words", 117, &7u32.to_le_bytes());
        // The second shard starting with, or before, the first.
        let blob = &body[b..b + len];
        let second = {
            let mut at = 69;
            let count = u32::from_le_bytes(blob[at + 16..at + 20].try_into().unwrap());
            at += 20;
            for _ in 0..count {
                // capacity, items, error, hash count, bit length, bits
                let bits = u32::from_le_bytes(blob[at + 28..at + 32].try_into().unwrap()) as usize;
                at += 32 + bits;
            }
            at
        };
        let first_start = i64::from_le_bytes(blob[69..77].try_into().unwrap());
        assert_eq!(i64::from_le_bytes(blob[second..second + 8].try_into().unwrap()), first_start + 1, "blob layout");
        set("second shard start = first's", second, &first_start.to_le_bytes());
        set("second shard start before first's", second, &(first_start - 1).to_le_bytes());
        for (what, x) in must_refuse {
            match restore(&mut con, &make(&x)) {
                Err(_) => refused += 1,
                Ok(v) => {
                    let info: RedisResult<Value> = redis::cmd("IDEM.BF.INFO").arg("bad").query(&mut con);
                    failures.push(format!("{what}: RESTORE accepted ({v:?}); INFO {info:?}"));
                    exercise(&mut con);
                }
            }
            s.assert_alive();
        }
        // Every truncation of the filter's bytes. Redis hands the loader the
        // whole argument, footer included, and does not check it was all
        // consumed: a blob short by <= 11 bytes (the EOF opcode and the
        // 10-byte footer) can be completed from what follows it into a
        // valid filter. Shorter than that it cannot be complete: refused.
        for cut in 1..len {
            let mut x = body.clone();
            x.drain(b + len - cut..b + len);
            match restore(&mut con, &make(&x)) {
                Err(_) => refused += 1,
                Ok(_) if cut <= 11 => {
                    accepted += 1;
                    exercise(&mut con);
                }
                Ok(v) => {
                    failures.push(format!("filter bytes truncated by {cut} of {len}: accepted ({v:?})"));
                    exercise(&mut con);
                }
            }
        }
        s.assert_alive();
        // A newer encoding version than the module's.
        let id = u64::from_be_bytes(body[2..10].try_into().unwrap());
        if id & 1023 < 1023 {
            let mut x = body.clone();
            x[2..10].copy_from_slice(&(id + 1).to_be_bytes());
            if restore(&mut con, &make(&x)).is_ok() {
                failures.push("newer encoding version accepted".into());
            }
        }
    }
    // Random corruption: refused, or accepted as some valid filter, never a crash.
    let mut rng = 0x2545_f491_4f6c_dd1du64 ^ (body.len() as u64);
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for round in 0..400 {
        let mut x = body.clone();
        let flips = 1 + (next() % 3) as usize;
        for _ in 0..flips {
            // Half the time in the first 140 bytes, where the structure is.
            let limit = if round % 2 == 0 { x.len().min(140) } else { x.len() };
            let at = (next() as usize) % limit;
            let v = (next() % 256) as u8;
            x[at] = if v == x[at] { v ^ 0x5a } else { v };
        }
        match restore(&mut con, &make(&x)) {
            Err(_) => refused += 1,
            Ok(_) => {
                accepted += 1;
                exercise(&mut con);
            }
        }
        if round % 25 == 0 {
            s.assert_alive();
        }
    }
    s.assert_alive();
    eprintln!("corrupt filter payloads ({server_args:?}): {refused} refused, {accepted} accepted as some filter");
    let _: i64 = redis::cmd("DEL").arg("bad").arg("bad2").query(&mut con).unwrap();
    assert_eq!(filter_snap(&mut con, "src", &items("x", 0..30)), original, "the source filter changed");
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut con).unwrap();
    s.assert_alive();
    assert!(failures.is_empty(), "{} corrupt payloads accepted:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn corrupt_filter_restores_are_refused() {
    // Uncompressed: every byte reaches the module's decoder.
    corrupt_filter_restores(&["--rdbcompression", "no"], true);
}

#[test]
fn corrupt_compressed_filter_restores_do_not_crash() {
    corrupt_filter_restores(&[], false);
}

/// A filter's bytes in the first encoding (format 1), which the module
/// keeps reading: parameters, then each shard's start, item count and
/// sub-filters (capacity, items, error, hash count, bit array).
fn filter_blob_v1(window: u32, period: i64, shards: &[(i64, Vec<(u64, u64, f64, u32, Vec<u8>)>)]) -> Vec<u8> {
    let mut blob = vec![1u8];
    blob.extend_from_slice(&0.01f64.to_le_bytes());
    blob.extend_from_slice(&1u64.to_le_bytes());
    blob.extend_from_slice(&window.to_le_bytes());
    blob.extend_from_slice(&period.to_le_bytes());
    blob.extend_from_slice(&1u32.to_le_bytes());
    blob.extend_from_slice(&[7u8; 32]);
    blob.extend_from_slice(&(shards.len() as u32).to_le_bytes());
    for (start, subs) in shards {
        blob.extend_from_slice(&start.to_le_bytes());
        blob.extend_from_slice(&subs.iter().map(|s| s.1).sum::<u64>().to_le_bytes());
        blob.extend_from_slice(&(subs.len() as u32).to_le_bytes());
        for (capacity, items, error, hashes, bits) in subs {
            blob.extend_from_slice(&capacity.to_le_bytes());
            blob.extend_from_slice(&items.to_le_bytes());
            blob.extend_from_slice(&error.to_le_bytes());
            blob.extend_from_slice(&hashes.to_le_bytes());
            blob.extend_from_slice(&(bits.len() as u32).to_le_bytes());
            blob.extend_from_slice(bits);
        }
    }
    blob
}

/// A DUMP payload of the filter type holding `blob`, framed like `good`
/// (a real DUMP of a filter), with a valid checksum.
fn filter_payload(good: &[u8], blob: &[u8]) -> Vec<u8> {
    let mut payload = good[..11].to_vec(); // type, module id, string opcode
    payload.push(0x81);
    payload.extend_from_slice(&(blob.len() as u64).to_be_bytes());
    payload.extend_from_slice(blob);
    payload.push(0); // RDB_MODULE_OPCODE_EOF
    payload.extend_from_slice(&good[good.len() - 10..good.len() - 8]);
    payload.extend_from_slice(&[0u8; 8]);
    fix_dump_crc(&mut payload);
    payload
}

/// A filter no command sequence could build: a year of hourly shards,
/// each with 32 stacked sub-filters of capacity 1 (8,784 x 32). It used to
/// load, after which an MEXISTS of 1,000 items held the server for 6-7 s.
#[test]
fn a_filter_commands_could_not_build_is_refused() {
    let mut s = Server::with_args(&[], &["--rdbcompression", "no"]);
    let mut con = s.conn();
    reserve(&mut con, "src", "0.01", 10, &[]);
    let good: Vec<u8> = redis::cmd("DUMP").arg("src").query(&mut con).unwrap();
    // The framing is right: the filter the module itself made loads.
    let mut blob = Vec::new();
    let (start, len) = blob_span(&good[..good.len() - 10]);
    blob.extend_from_slice(&good[start..start + len]);
    let _: () = redis::cmd("RESTORE").arg("copy").arg(0).arg(filter_payload(&good, &blob)).query(&mut con).unwrap();

    let now_hour = server_ms(&mut con) / 1000 / 3600 * 3600;
    let shards: Vec<_> = (0..8784i64)
        .map(|i| (now_hour - (8783 - i) * 3600, (0..32).map(|_| (1u64, 1u64, 1e-12, 1u32, vec![0xffu8; 8])).collect()))
        .collect();
    let huge = filter_payload(&good, &filter_blob_v1(8784, 3600, &shards));
    let e = redis::cmd("RESTORE").arg("huge").arg(0).arg(&huge).query::<()>(&mut con).unwrap_err();
    assert!(err_text(&e).contains("Bad data format"), "{e}");
    assert!(!exists(&mut con, "huge"));
    s.assert_alive();
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

// ---------------------------------------------------------------------------
// 7. IDEM.CLAIM / IDEM.DONE with BLOOM
// ---------------------------------------------------------------------------

#[test]
fn claim_and_done_with_bloom() {
    let mut s = Server::start();
    let mut con = s.conn();
    let c0 = idem_counters(&mut con);

    // Filter missing: NEW, and the claim does not create it.
    let tok = claim_new_opts(&mut con, "k", 10, &["BLOOM", "f"]);
    assert!(!exists(&mut con, "f"), "CLAIM ... BLOOM created the filter");
    // DONE adds the record's key name, creating the filter from the configs.
    assert_eq!(done(&mut con, "k", &tok, ("RETAIN", 1, "BLOOM", "f")), Ok(1));
    let i = bf_info(&mut con, "f");
    assert_eq!((i.error_rate, i.capacity, i.window, i.shard, i.items), (0.01, 100_000, 7, 86_400, 1), "{i:?}");
    assert_eq!(bf_exists(&mut con, "f", "k"), 1);
    // A record exists: the filter is ignored.
    let (st, v, a) = claim_opts(&mut con, "k", 10, &["BLOOM", "f"]);
    assert_eq!((st.as_str(), v, a), ("DONE", Value::Nil, 1));
    // Retention ends; the filter still remembers: SEEN, a real claim.
    let deadline = Instant::now() + Duration::from_secs(5);
    while exists(&mut con, "k") {
        assert!(Instant::now() < deadline, "the done record did not expire after RETAIN 1");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (st, v, a) = claim_opts(&mut con, "k", 10, &["BLOOM", "f"]);
    assert_eq!((st.as_str(), a), ("SEEN", 1), "CLAIM after retention ended, the filter remembering the key");
    let tok2 = as_token(&v);
    assert_ne!(tok2, tok);
    let f = get_fields(&mut con, "k");
    assert_eq!((f_str(&f, "state").as_str(), f_int(&f, "attempt")), ("processing", 1));
    let (st, _, _) = claim_opts(&mut con, "k", 10, &["BLOOM", "f"]);
    assert_eq!(st, "BUSY", "a live SEEN claim is BUSY to others");
    // Completing again: the name is already in the current shard.
    let d = digest_value(&mut con, "f");
    assert_eq!(done(&mut con, "k", &tok2, ("BLOOM", "f")), Ok(1));
    assert_eq!(digest_value(&mut con, "f"), d, "re-adding a name already in the current shard changed the filter");
    assert_eq!(bf_info(&mut con, "f").items, 1);

    // A name the filter never saw: NEW. One that was BF.ADDed directly: SEEN.
    claim_new_opts(&mut con, "other", 10, &["BLOOM", "f"]);
    assert_eq!(bf_add(&mut con, "f", "order:9"), 1);
    let (st, _, a) = claim_opts(&mut con, "order:9", 10, &["PAYLOAD", "p", "BLOOM", "f", "MAXTRIES", "3"]);
    assert_eq!((st.as_str(), a), ("SEEN", 1));
    // Options in any order, case-insensitive.
    assert_eq!(bf_add(&mut con, "f", "order:10"), 1);
    let (st, _, _) = claim_opts(&mut con, "order:10", 10, &["bloom", "f"]);
    assert_eq!(st, "SEEN");

    // DONE answering 0 or an error leaves the filter alone (and creates none).
    let d = digest_value(&mut con, "f");
    assert_eq!(done(&mut con, "k", &random_token(), ("BLOOM", "f2")), Ok(0), "DONE on a done record");
    assert!(!exists(&mut con, "f2"), "DONE answering 0 created the filter");
    let t = claim_new(&mut con, "j", 60);
    let e = done(&mut con, "j", &random_token(), ("BLOOM", "f")).unwrap_err();
    assert!(e.starts_with("STALE"), "{e}");
    let e = done(&mut con, "j", &random_token(), ("BLOOM", "f3")).unwrap_err();
    assert!(e.starts_with("STALE"), "{e}");
    assert!(!exists(&mut con, "f3"), "a STALE DONE created the filter");
    assert_eq!(digest_value(&mut con, "f"), d, "a DONE answering 0 / STALE changed the filter");
    assert_eq!(bf_exists(&mut con, "f", "j"), 0);
    assert_eq!(done(&mut con, "j", &t, ("BLOOM", "f")), Ok(1));
    assert_eq!(bf_exists(&mut con, "f", "j"), 1);
    // A late DONE on a missing key is a completion: recorded in the filter.
    assert_eq!(done(&mut con, "late", &random_token(), ("RESULT", "r", "BLOOM", "f")), Ok(1));
    assert_eq!(bf_exists(&mut con, "f", "late"), 1);

    // A filter that forgot the key (its shard left the window): NEW.
    let mut pipe = redis::pipe();
    pipe.cmd("IDEM.BF.RESERVE").arg("short").arg("0.01").arg(100).arg("WINDOW").arg(1).arg("SHARD").arg(1);
    pipe.cmd("IDEM.BF.ADD").arg("short").arg("y");
    let (_, r, t1) = timed(&mut con, &pipe);
    assert_eq!(int(&r[1]), 1);
    sleep_until(&mut con, (t1 / 1000 + 1) * 1000 + 30);
    let (st, _, _) = claim_opts(&mut con, "y", 10, &["BLOOM", "short"]);
    assert_eq!(st, "NEW", "the filter's window no longer holds y");

    // Counters: SEEN claims are counted as such.
    let c1 = idem_counters(&mut con);
    assert_eq!(c1["claim_seen"] - c0["claim_seen"], 3, "claim_seen");

    // WRONGTYPE filter key: error, nothing changes.
    let _: () = redis::cmd("SET").arg("s").arg("str").arg("PX").arg(100_000).query(&mut con).unwrap();
    let s_exp = pexpiretime(&mut con, "s");
    let e = expect_err(&mut con, "IDEM.CLAIM", ("n", 10, "BLOOM", "s"));
    assert!(e.starts_with("WRONGTYPE"), "CLAIM ... BLOOM <string>: {e}");
    assert!(!exists(&mut con, "n"), "a refused CLAIM created the record");
    let live = claim_new(&mut con, "live", 100);
    let before = snapshot(&mut con, "live");
    let e = expect_err(&mut con, "IDEM.CLAIM", ("live", 10, "BLOOM", "s"));
    assert!(e.starts_with("WRONGTYPE"), "{e}");
    let e = expect_err(&mut con, "IDEM.CLAIM", ("n", 10, "BLOOM", "live"));
    assert!(e.starts_with("WRONGTYPE"), "CLAIM ... BLOOM <record>: {e}");
    assert!(!exists(&mut con, "n"));
    assert_same_record(
        &before,
        &snapshot(&mut con, "live"),
        1000,
        "record after refused CLAIMs with a WRONGTYPE filter",
    );
    // DONE still completes its record: the filter add is best effort
    // (reply 1 + 4, "dropped"), and the string is left as it was.
    let finishing = claim_new(&mut con, "finishing", 100);
    assert_eq!(done(&mut con, "finishing", &finishing, ("BLOOM", "s")), Ok(5), "DONE ... BLOOM <string>");
    assert_eq!(f_str(&get_fields(&mut con, "finishing"), "state"), "done");
    let v: String = redis::cmd("GET").arg("s").query(&mut con).unwrap();
    assert_eq!((v.as_str(), pexpiretime(&mut con, "s")), ("str", s_exp));
    // The filter must be another key than the record.
    let same = "ERR the BLOOM filter must be another key than the record";
    assert_eq!(expect_err(&mut con, "IDEM.CLAIM", ("n", 10, "BLOOM", "n")), same);
    assert_eq!(expect_err(&mut con, "IDEM.DONE", ("live", live.as_str(), "BLOOM", "live")), same);
    assert!(!exists(&mut con, "n"));
    assert_same_record(&before, &snapshot(&mut con, "live"), 1000, "record after BLOOM = record");
    assert_eq!(done(&mut con, "live", &live, ("BLOOM", "f")), Ok(1), "the token still works");

    // Key positions: a value spelling BLOOM is not the option.
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg(&["IDEM.CLAIM", "k", "10", "PAYLOAD", "BLOOM", "BLOOM", "f"])
        .query(&mut con)
        .unwrap();
    assert_eq!(keys, vec!["k", "f"]);
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg(&["IDEM.CLAIM", "k", "10", "PAYLOAD", "BLOOM"])
        .query(&mut con)
        .unwrap();
    assert_eq!(keys, vec!["k"]);
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg(&["IDEM.DONE", "k", tok.as_str(), "RESULT", "BLOOM", "bloom", "g", "RETAIN", "5"])
        .query(&mut con)
        .unwrap();
    assert_eq!(keys, vec!["k", "g"]);
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg(&["IDEM.CLAIM", "k", "10", "MAXTRIES", "2", "BLOOM", "h"])
        .query(&mut con)
        .unwrap();
    assert_eq!(keys, vec!["k", "h"]);
    for name in ["IDEM.CLAIM", "IDEM.DONE"] {
        let v: Value = redis::cmd("COMMAND").arg("INFO").arg(name).query(&mut con).unwrap();
        let Value::Array(list) = &v else { panic!("{v:?}") };
        let Value::Array(info) = &list[0] else { panic!("COMMAND INFO {name}: {v:?}") };
        // [name, arity, flags, first, last, step, acl, tips, key specs, subcommands]
        let Value::Array(specs) = &info[8] else { panic!("COMMAND INFO {name} key specs: {:?}", info[8]) };
        assert_eq!(specs.len(), 2, "COMMAND INFO {name}: 2 key specs: {specs:?}");
    }
    s.assert_alive();
}

// ---------------------------------------------------------------------------
// 8. CROSSSLOT in a cluster
// ---------------------------------------------------------------------------

#[test]
fn bloom_option_is_crossslot_in_cluster_mode() {
    let mut s = Server::start_cluster_node();
    let mut con = s.conn();
    let cross = |con: &mut redis::Connection, name: &str, args: &[&str]| {
        let e = expect_err(con, name, args);
        assert!(e.starts_with("CROSSSLOT"), "{name} {args:?}: {e}");
    };
    cross(&mut con, "IDEM.CLAIM", &["{a}k", "10", "BLOOM", "{b}f"]);
    cross(&mut con, "IDEM.CLAIM", &["{a}k", "10", "PAYLOAD", "BLOOM", "BLOOM", "{b}f"]);
    cross(&mut con, "IDEM.CLAIM", &["{a}k", "10", "MAXTRIES", "3", "bloom", "{b}f"]);
    assert!(!exists(&mut con, "{a}k"), "a CROSSSLOT claim created the record");
    let tok = claim_new_opts(&mut con, "{a}k", 10, &["BLOOM", "{a}f"]);
    cross(&mut con, "IDEM.DONE", &["{a}k", tok.as_str(), "BLOOM", "{b}f"]);
    cross(&mut con, "IDEM.DONE", &["{a}k", tok.as_str(), "RESULT", "BLOOM", "BLOOM", "{b}f"]);
    assert_eq!(f_str(&get_fields(&mut con, "{a}k"), "state"), "processing");
    assert!(!exists(&mut con, "{b}f"));
    // The word BLOOM as a value is no option: no second key, no CROSSSLOT.
    claim_new_opts(&mut con, "{a}k2", 10, &["PAYLOAD", "BLOOM"]);
    claim_new_opts(&mut con, "{a}k3", 10, &["PAYLOAD", "BLOOM", "BLOOM", "{a}f"]);
    assert_eq!(done(&mut con, "{a}k", &tok, ("RESULT", "BLOOM", "BLOOM", "{a}f")), Ok(1));
    assert_eq!(bf_exists(&mut con, "{a}f", "{a}k"), 1);
    // The filter commands themselves work in cluster mode.
    assert_eq!(bf_madd(&mut con, "{b}f", &["x", "y"]), vec![1, 1]);
    s.assert_alive();
}

// ---------------------------------------------------------------------------
// 9. Bad input
// ---------------------------------------------------------------------------

/// Everything observable about a key, for "unchanged" checks.
#[derive(Debug, PartialEq)]
struct KeyState {
    ty: String,
    pexpiretime: i64,
    digest: Option<String>,
    info: Option<BfInfo>,
    record: Option<Vec<(String, Value)>>,
    string: Option<Vec<u8>>,
}

fn key_state(con: &mut redis::Connection, key: &str) -> KeyState {
    let ty: String = redis::cmd("TYPE").arg(key).query(con).unwrap();
    let mut st = KeyState {
        pexpiretime: pexpiretime(con, key),
        digest: None,
        info: None,
        record: None,
        string: None,
        ty: ty.clone(),
    };
    match ty.as_str() {
        "none" => {}
        "string" => st.string = Some(redis::cmd("GET").arg(key).query(con).unwrap()),
        "idembloom" => {
            st.digest = Some(digest_value(con, key));
            st.info = bf_info_opt(con, key);
        }
        _ => {
            st.digest = Some(digest_value(con, key));
            let mut v: Vec<(String, Value)> =
                get_fields(con, key).into_iter().filter(|(k, _)| k != "lease_ms" && k != "pttl").collect();
            v.sort_by(|a, b| a.0.cmp(&b.0));
            st.record = Some(v);
        }
    }
    st
}

#[test]
fn bad_bloom_inputs_are_refused_and_change_nothing() {
    let mut s = Server::start();
    let mut con = s.conn();
    reserve(&mut con, "f", "0.01", 1000, &["WINDOW", "3"]);
    bf_madd(&mut con, "f", &items("i", 0..100));
    // A filter that can take no more than 32 items (32 sub-filters of 1).
    reserve(&mut con, "tiny", "0.01", 1, &["EXPANSION", "1"]);
    bf_madd(&mut con, "tiny", &["t1", "t2"]);
    let _: () = redis::cmd("SET").arg("s").arg("string-value").arg("PX").arg(400_000).query(&mut con).unwrap();
    let r_tok = claim_new(&mut con, "r", 600);
    let r_tok = r_tok.as_str();
    let watched = ["f", "tiny", "s", "r", "m"]; // m: missing

    let float_err = "ERR value is not a valid float";
    let not_int = "ERR value is not an integer or out of range";
    let er = "ERR error_rate must be between 0 and 1";
    let er_low = "ERR error_rate must be at least 1e-9";
    let cap = "ERR capacity must be at least 1";
    let win = "ERR WINDOW must be between 1 and 366";
    let shard = "ERR SHARD must be DAY, HOUR or a number of seconds >= 1";
    let exp = "ERR EXPANSION must be between 1 and 1024";
    let exists_err = "ERR key already exists";
    let arity = |c: &str| format!("ERR wrong number of arguments for '{c}' command");
    // (arguments, exact error | prefix)
    enum W {
        Exact(String),
        Prefix(&'static str),
        NoCase(String),
    }
    use W::*;
    let e = |s: &str| Exact(s.to_string());
    // On an existing filter the arguments may be checked before or after
    // the key: any ERR, as long as nothing changes.
    let ek = |k: &str, s: &str| if k == "m" { Exact(s.to_string()) } else { Prefix("ERR") };
    let mut cases: Vec<(Vec<String>, W)> = Vec::new();
    let mut add = |args: &[&str], w: W| cases.push((args.iter().map(|s| s.to_string()).collect(), w));

    // Arity.
    add(&["IDEM.BF.RESERVE", "m", "0.01"], NoCase(arity("idem.bf.reserve")));
    add(&["IDEM.BF.RESERVE", "m"], NoCase(arity("idem.bf.reserve")));
    add(&["IDEM.BF.ADD", "f"], NoCase(arity("idem.bf.add")));
    add(&["IDEM.BF.ADD", "f", "a", "b"], NoCase(arity("idem.bf.add")));
    add(&["IDEM.BF.MADD", "f"], NoCase(arity("idem.bf.madd")));
    add(&["IDEM.BF.MADD", "m"], NoCase(arity("idem.bf.madd")));
    add(&["IDEM.BF.EXISTS", "f"], NoCase(arity("idem.bf.exists")));
    add(&["IDEM.BF.EXISTS", "f", "a", "b"], NoCase(arity("idem.bf.exists")));
    add(&["IDEM.BF.MEXISTS", "f"], NoCase(arity("idem.bf.mexists")));
    add(&["IDEM.BF.INFO"], NoCase(arity("idem.bf.info")));
    add(&["IDEM.BF.INFO", "f", "x"], NoCase(arity("idem.bf.info")));
    // RESERVE on an existing key, of any type.
    for k in ["f", "s", "r", "tiny"] {
        add(&["IDEM.BF.RESERVE", k, "0.01", "100"], e(exists_err));
    }
    // error_rate.
    for k in ["m", "f"] {
        for bad in ["0", "1", "-0.1", "1.5", "inf", "-inf", "1e10"] {
            add(&["IDEM.BF.RESERVE", k, bad, "100"], ek(k, er));
        }
        for bad in ["5e-324", "1e-15", "9.9e-10"] {
            add(&["IDEM.BF.RESERVE", k, bad, "100"], ek(k, er_low));
        }
        for bad in ["abc", "", "0.01x", "nan"] {
            add(&["IDEM.BF.RESERVE", k, bad, "100"], ek(k, float_err));
        }
        // capacity.
        add(&["IDEM.BF.RESERVE", k, "0.01", "0"], ek(k, cap));
        add(&["IDEM.BF.RESERVE", k, "0.01", "-5"], ek(k, cap));
        add(&["IDEM.BF.RESERVE", k, "0.01", "abc"], ek(k, not_int));
        add(&["IDEM.BF.RESERVE", k, "0.01", "1.5"], ek(k, not_int));
        add(&["IDEM.BF.RESERVE", k, "0.01", "99999999999999999999999"], ek(k, not_int));
        // WINDOW.
        for bad in ["0", "-1", "367", "99999999999"] {
            add(&["IDEM.BF.RESERVE", k, "0.01", "100", "WINDOW", bad], ek(k, win));
        }
        add(&["IDEM.BF.RESERVE", k, "0.01", "100", "WINDOW", "two"], ek(k, not_int));
        // SHARD.
        for bad in ["0", "-1", "WEEK", "1.5", "", "days", "9999999999999999"] {
            add(&["IDEM.BF.RESERVE", k, "0.01", "100", "SHARD", bad], ek(k, shard));
        }
        // EXPANSION.
        for bad in ["0", "-1", "1025", "99999999999"] {
            add(&["IDEM.BF.RESERVE", k, "0.01", "100", "EXPANSION", bad], ek(k, exp));
        }
        add(&["IDEM.BF.RESERVE", k, "0.01", "100", "EXPANSION", "x"], ek(k, not_int));
        // Options: unknown, repeated, missing a value.
        add(
            &["IDEM.BF.RESERVE", k, "0.01", "100", "FOO", "1"],
            if k == "m" { Prefix("ERR syntax error") } else { Prefix("ERR") },
        );
        add(
            &["IDEM.BF.RESERVE", k, "0.01", "100", "WINDOW"],
            if k == "m" { Prefix("ERR syntax error") } else { Prefix("ERR") },
        );
        add(
            &["IDEM.BF.RESERVE", k, "0.01", "100", "WINDOW", "2", "window", "3"],
            if k == "m" { Prefix("ERR syntax error") } else { Prefix("ERR") },
        );
        add(
            &["IDEM.BF.RESERVE", k, "0.01", "100", "SHARD", "DAY", "SHARD", "HOUR"],
            if k == "m" { Prefix("ERR syntax error") } else { Prefix("ERR") },
        );
        add(
            &["IDEM.BF.RESERVE", k, "0.01", "100", "EXPANSION", "2", "EXPANSION", "2"],
            if k == "m" { Prefix("ERR syntax error") } else { Prefix("ERR") },
        );
        add(
            &["IDEM.BF.RESERVE", k, "0.01", "100", "WINDOW", "2", "SHARD"],
            if k == "m" { Prefix("ERR syntax error") } else { Prefix("ERR") },
        );
        add(
            &["IDEM.BF.RESERVE", k, "0.01", "100", "BLOOM", "x"],
            if k == "m" { Prefix("ERR syntax error") } else { Prefix("ERR") },
        );
    }
    // Too large to allocate.
    add(&["IDEM.BF.RESERVE", "m", "1e-9", "1000000000000000"], Prefix("ERR filter too large"));
    add(&["IDEM.BF.RESERVE", "m", "0.01", "1000000000000000"], Prefix("ERR filter too large"));
    add(&["IDEM.BF.RESERVE", "m", "0.000000001", "9223372036854775807"], Prefix("ERR filter too large"));
    add(&["IDEM.BF.RESERVE", "m", "0.01", "300000000", "WINDOW", "366"], Prefix("ERR filter too large"));
    // More items than 32 sub-filters of one hold: refused whole.
    let many: Vec<String> = items("many", 0..40);
    let mut madd_many = vec!["IDEM.BF.MADD", "tiny"];
    madd_many.extend(many.iter().map(String::as_str));
    add(&madd_many, Prefix("ERR filter full"));
    // WRONGTYPE on a string and on a record, for every filter command.
    for k in ["s", "r"] {
        add(&["IDEM.BF.ADD", k, "x"], Prefix("WRONGTYPE"));
        add(&["IDEM.BF.MADD", k, "x", "y"], Prefix("WRONGTYPE"));
        add(&["IDEM.BF.EXISTS", k, "x"], Prefix("WRONGTYPE"));
        add(&["IDEM.BF.MEXISTS", k, "x", "y"], Prefix("WRONGTYPE"));
        add(&["IDEM.BF.INFO", k], Prefix("WRONGTYPE"));
    }
    // ... and record / string commands on a filter.
    add(&["IDEM.GET", "f"], Prefix("WRONGTYPE"));
    add(&["IDEM.CLAIM", "f", "10"], Prefix("WRONGTYPE"));
    add(&["IDEM.ONCE", "f", "10"], Prefix("WRONGTYPE"));
    add(&["GET", "f"], Prefix("WRONGTYPE"));
    add(&["LPUSH", "f", "x"], Prefix("WRONGTYPE"));
    // CLAIM / DONE with a bad BLOOM.
    add(&["IDEM.CLAIM", "m", "10", "BLOOM", "s"], Prefix("WRONGTYPE"));
    add(&["IDEM.CLAIM", "m", "10", "BLOOM", "r"], Prefix("WRONGTYPE"));
    add(&["IDEM.CLAIM", "r", "10", "BLOOM", "s"], Prefix("WRONGTYPE"));
    add(
        &["IDEM.DONE", "r", r_tok, "RESULT", "x", "BLOOM", "r"],
        e("ERR the BLOOM filter must be another key than the record"),
    );
    add(&["IDEM.CLAIM", "m", "10", "BLOOM", "m"], e("ERR the BLOOM filter must be another key than the record"));
    add(&["IDEM.CLAIM", "m", "10", "BLOOM", "f", "BLOOM", "f"], Prefix("ERR syntax error"));
    add(&["IDEM.DONE", "r", r_tok, "BLOOM", "f", "bloom", "f"], Prefix("ERR syntax error"));
    add(&["IDEM.DONE", "r", r_tok, "BLOOM"], Prefix("ERR syntax error"));
    // The internal commands are refused to clients, whatever they carry
    // (their decoders are fuzzed, and fed damaged AOF files in tests/acl.rs).
    let internal = "ERR internal command: only the primary's replication link and AOF loading may run it";
    add(&["IDEM.BF.APPLY", "f", "abc", "x"], e(internal));
    add(&["IDEM.BF.APPLY", "f", "", "x"], e(internal));
    add(&["IDEM.BF.APPLY", "m", "ABCDEFG\0garbage", "x"], e(internal));
    add(&["IDEM.BF.APPLY", "s", "ABCDEFG\0", "x"], e(internal));
    add(&["IDEM.BF.APPLY", "r", "ABCDEFG\0", "x"], e(internal));
    add(&["IDEM.BF.LOAD", "m", "garbage"], e(internal));
    add(&["IDEM.BF.LOAD", "f", ""], e(internal));
    add(&["IDEM.BF.LOAD", "s", "garbage"], e(internal));

    let before: Vec<KeyState> = watched.iter().map(|k| key_state(&mut con, k)).collect();
    let counters_before = bf_counters(&mut con);
    let mut failures = Vec::new();
    for (args, want) in &cases {
        let mut c = redis::cmd(&args[0]);
        for a in &args[1..] {
            c.arg(a);
        }
        let shown: Vec<String> =
            args.iter().map(|a| if a.len() > 40 { format!("<{} bytes>", a.len()) } else { a.clone() }).collect();
        let shown = if shown.len() > 12 {
            format!("{:?}... ({} args)", &shown[..6], shown.len())
        } else {
            format!("{shown:?}")
        };
        match c.query::<Value>(&mut con) {
            Ok(v) => failures.push(format!("{shown}: expected an error, got {v:?}")),
            Err(err) => {
                let got = err_text(&err);
                let ok = match want {
                    Exact(x) => &got == x,
                    Prefix(p) => got.starts_with(p),
                    NoCase(x) => got.eq_ignore_ascii_case(x),
                };
                if !ok {
                    let w = match want {
                        Exact(x) => format!("{x:?}"),
                        Prefix(p) => format!("starting {p:?}"),
                        NoCase(x) => format!("{x:?} (any case)"),
                    };
                    failures.push(format!("{shown}: expected {w}, got {got:?}"));
                }
            }
        }
        let after: Vec<KeyState> = watched.iter().map(|k| key_state(&mut con, k)).collect();
        for (b, a) in before.iter().zip(&after) {
            if b != a {
                failures.push(format!("{shown} changed a key:\n  before {b:?}\n  after  {a:?}"));
            }
        }
        if let Some(st) = s.exited() {
            panic!("server died after {shown}: {st}\n{}", s.log_tail(40));
        }
    }
    assert!(failures.is_empty(), "{} bad-input failures:\n{}", failures.len(), failures.join("\n"));
    s.assert_alive();
    assert_eq!(bf_counters(&mut con)[..2], counters_before[..2], "refused writes counted adds");
    // Everything still works.
    assert_eq!(bf_madd(&mut con, "tiny", &["t3", "t4"]).len(), 2);
    assert_eq!(bf_mexists(&mut con, "tiny", &["t1", "t2", "t3", "t4"]), vec![1, 1, 1, 1]);
    assert_eq!(bf_add(&mut con, "f", "i1"), 0);
    assert_eq!(done(&mut con, "r", r_tok, ("BLOOM", "f")), Ok(1));
    reserve(&mut con, "m", "0.01", 100, &["WINDOW", "366", "SHARD", "HOUR", "EXPANSION", "1024"]);
    reserve(&mut con, "m2", "0.999", 1, &["WINDOW", "1", "SHARD", "1", "EXPANSION", "1"]);
    s.assert_alive();
}

#[test]
fn garbage_arguments_do_not_crash() {
    let mut s = Server::start();
    let mut con = s.conn();
    reserve(&mut con, "f", "0.01", 100, &[]);
    let garbage: Vec<Vec<u8>> = vec![
        vec![],
        vec![0],
        vec![0xff; 64],
        b"-0".to_vec(),
        b"1e-320".to_vec(),
        b"4.9e-324".to_vec(),
        b"0.9999999999999999999".to_vec(),
        b"-9223372036854775808".to_vec(),
        b"9223372036854775807".to_vec(),
        b"WINDOW".to_vec(),
        b"SHARD".to_vec(),
        "é".repeat(20).into_bytes(),
        vec![b'a'; 10_000],
    ];
    for name in [
        "IDEM.BF.RESERVE",
        "IDEM.BF.ADD",
        "IDEM.BF.MADD",
        "IDEM.BF.EXISTS",
        "IDEM.BF.MEXISTS",
        "IDEM.BF.INFO",
        "IDEM.BF.APPLY",
        "IDEM.BF.LOAD",
    ] {
        for key in ["f", "new"] {
            for g in &garbage {
                for n in 1..=7 {
                    let mut c = redis::cmd(name);
                    c.arg(key);
                    for i in 1..n {
                        if name == "IDEM.BF.RESERVE" && i == 1 && n % 2 == 0 {
                            c.arg("0.01");
                        } else {
                            c.arg(g.as_slice());
                        }
                    }
                    let _ = c.query::<Value>(&mut con);
                    let _: RedisResult<i64> = redis::cmd("DEL").arg("new").query(&mut con);
                }
            }
        }
        s.assert_alive();
    }
    let _ = bf_info_opt(&mut con, "f");
    s.assert_alive();
}

// ---------------------------------------------------------------------------
// 10. Large filters: memory accounting and freeing
// ---------------------------------------------------------------------------

fn used_memory(s: &Server, con: &mut redis::Connection) -> i64 {
    s.info(con, "memory")["used_memory"].parse().unwrap()
}

#[test]
fn large_filter_memory_usage_and_unlink() {
    let mut s = Server::start();
    let mut con = s.conn();
    let m0 = used_memory(&s, &mut con);
    reserve(&mut con, "big", "0.01", 5_000_000, &[]);
    let m1 = used_memory(&s, &mut con);
    madd_all(&mut con, "big", &items("b", 0..20_000));
    let info = bf_info(&mut con, "big");
    let usage: i64 = redis::cmd("MEMORY").arg("USAGE").arg("big").query(&mut con).unwrap();
    eprintln!("capacity 5M at 0.01/7: INFO bytes {}, MEMORY USAGE {usage}, used_memory grew {}", info.bytes, m1 - m0);
    assert!(info.bytes > 5_000_000, "INFO bytes {} for 5M items", info.bytes);
    assert!(usage >= info.bytes, "MEMORY USAGE {usage} < INFO bytes {}", info.bytes);
    assert!(usage <= info.bytes + info.bytes / 20 + 16_384, "MEMORY USAGE {usage} far above INFO bytes {}", info.bytes);
    let grew = m1 - m0;
    assert!(
        (grew - usage).abs() <= usage / 10 + 65_536,
        "MEMORY USAGE {usage} is not the real size: used_memory grew by {grew} when the filter was made"
    );
    // Smaller ones too: MEMORY USAGE covers the bits.
    for (k, cap) in [("small", 10i64), ("mid", 50_000)] {
        reserve(&mut con, k, "0.01", cap, &[]);
        let b = bf_info(&mut con, k).bytes;
        let u: i64 = redis::cmd("MEMORY").arg("USAGE").arg(k).query(&mut con).unwrap();
        assert!(u >= b, "{k}: MEMORY USAGE {u} < INFO bytes {b}");
    }

    // UNLINK: answered at once, freed (in the background), server fine.
    let c2 = redis::cmd("COPY").arg("big").arg("big2").query::<i64>(&mut con).unwrap();
    assert_eq!(c2, 1);
    let before_free = used_memory(&s, &mut con);
    let started = Instant::now();
    let n: i64 = redis::cmd("UNLINK").arg("big").query(&mut con).unwrap();
    let took = started.elapsed();
    assert_eq!(n, 1);
    assert!(took < Duration::from_millis(500), "UNLINK of a {} B filter took {took:?}", info.bytes);
    let _: String = redis::cmd("PING").query(&mut con).unwrap();
    assert!(!exists(&mut con, "big"));
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let m = used_memory(&s, &mut con);
        if before_free - m >= info.bytes * 9 / 10 {
            break;
        }
        assert!(Instant::now() < deadline, "memory not freed after UNLINK: {before_free} -> {m}");
        std::thread::sleep(Duration::from_millis(20));
    }
    // DEL of the copy, FLUSHALL ASYNC of the rest.
    let n: i64 = redis::cmd("DEL").arg("big2").query(&mut con).unwrap();
    assert_eq!(n, 1);
    reserve(&mut con, "big3", "0.001", 3_000_000, &[]);
    let _: () = redis::cmd("FLUSHALL").arg("ASYNC").query(&mut con).unwrap();
    s.assert_alive();
    let dbsize: i64 = redis::cmd("DBSIZE").query(&mut con).unwrap();
    assert_eq!(dbsize, 0);
    let deadline = Instant::now() + Duration::from_secs(5);
    while used_memory(&s, &mut con) > m0 + 1_000_000 {
        assert!(Instant::now() < deadline, "memory not freed after FLUSHALL ASYNC");
        std::thread::sleep(Duration::from_millis(20));
    }
    s.assert_alive();
}
