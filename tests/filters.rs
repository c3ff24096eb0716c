//! Filter command behaviour: date-sharded Bloom filters (docs/commands.md,
//! "Date-sharded Bloom filters") against a real server: rotation in real
//! time, adaptive sizing, the false-positive rate, no false negatives,
//! reply shapes, INFO, configs and counters.
//!
//! Shard rotation is tested in real time with 1 s and 2 s shards. Every
//! command whose answer depends on which shard "now" falls in runs in a
//! pipeline between two `TIME` calls, so the test knows the time the module
//! saw; when the machine stalled and a step missed its slot, the scenario
//! is run again (a "hiccup"), it never guesses.
#[allow(dead_code)] // each test binary uses part of common/
mod common;

use common::clock::{align_to_boundary, in_slot, sleep_until, timed, with_retries};
use common::commands::{
    bf_add, bf_counters, bf_info, bf_info_opt, bf_madd, bf_mexists, claim_new, digest_value, done, exists, items,
    madd_all, mexists_all, ones, pexpiretime, reserve, server_ms,
};
use common::reply::{BfInfo, as_str, err_text, int, ints, parse_bf_info, q};
use common::server::Server;
use redis::{RedisResult, Value};
use std::time::Instant;

// ---------------------------------------------------------------------------
// Rotation in real time
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
        let info = parse_bf_info(r[4].clone()).unwrap();
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
        let info = parse_bf_info(r[3].clone()).unwrap();
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
        assert_eq!(parse_bf_info(r[1].clone()).unwrap().shards.len(), 2);

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
        let info = parse_bf_info(r[2].clone()).unwrap();
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
// Adaptive sizing (and the window's FPR over stacked, rotated shards)
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
                "shard {i} should start at the previous shard's volume (+5%, then +3%) and need one filter: {sh:?}"
            );
            assert!(
                (sh.bytes as f64) < 0.8 * first.bytes as f64,
                "shard {i} ({} bytes) should be much smaller than the over-stacked first shard ({} bytes)",
                sh.bytes,
                first.bytes
            );
        }
        // Steady volume: the shards sized by the trend are sized alike;
        // the one sized with a single shard of history has up to 5% of
        // headroom where they have up to 3%.
        assert!(info.shards[3..].iter().all(|sh| sh.bytes == info.shards[2].bytes), "{info:?}");
        let (one, trend) = (info.shards[1].bytes as f64, info.shards[2].bytes as f64);
        assert!(one >= trend && one < 1.1 * trend, "{info:?}");
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
// False-positive rate
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
// No false negatives
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
// Reply shapes, INFO, configs, counters
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
    let info = parse_bf_info(raw).unwrap();
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
    assert_eq!(parse_bf_info(raw).unwrap(), info);
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
