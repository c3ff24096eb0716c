//! Corrupt payloads: one family for records and filters. Every corrupt
//! DUMP payload is refused or restores as a value every command can use;
//! the server survives all of it.

use crate::common::clock::align_to_boundary;
use crate::common::commands::{
    bf_info, bf_madd, claim_new_opts, digest_value, done, exists, items, mexists_all, once, pexpiretime, release,
    reserve, server_ms,
};
use crate::common::dump::{blob_span, crc64_redis, filter_blob, module_payload, reframe, split_dump};
use crate::common::fixtures::{assert_same_records, claim_owned, filter_snap, key_state, snapshot_all};
use crate::common::reply::{BfInfo, err_text};
use crate::common::server::Server;
use redis::{RedisResult, Value};
use std::time::Instant;

// ---------------------------------------------------------------------------
// Corrupt payloads: one family for records and filters
// ---------------------------------------------------------------------------

/// A small deterministic generator: the same corruption on every run.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// How a source's bytes are damaged beyond the cuts and the fields.
enum Damage {
    /// Every byte changed to a few values (small values).
    EveryByte,
    /// Rounds of 1-3 random byte changes, half of them in the first 140
    /// bytes, where the structure is (large values).
    RandomChanges(usize),
}

/// A value whose DUMP payload the family damages.
struct Source {
    key: String,
    /// Its DUMP body (without the footer) and the 2-byte RDB version footer.
    body: Vec<u8>,
    footer: Vec<u8>,
    /// `[start, end)` of the bytes whose tail is cut, one more byte each
    /// time, and how many of them a cut may take and still be accepted:
    /// Redis hands the loader the whole argument, footer included, and does
    /// not check it was all consumed, so a value short by a few bytes can
    /// be completed from what follows it into a valid value.
    cuts: Option<((usize, usize), usize)>,
    /// Bodies whose encoding is invalid field by field: each must be refused.
    must_refuse: Vec<(String, Vec<u8>)>,
    damage: Damage,
    /// Items to ask a filter about (none for a record).
    probes: Vec<String>,
}

impl Source {
    fn new(con: &mut redis::Connection, key: &str, damage: Damage) -> Source {
        let good: Vec<u8> = redis::cmd("DUMP").arg(key).query(con).unwrap();
        let (body, footer) = split_dump(&good);
        Source { key: key.to_string(), body, footer, cuts: None, must_refuse: Vec::new(), damage, probes: Vec::new() }
    }

    fn payload(&self, body: &[u8]) -> Vec<u8> {
        reframe(body, &self.footer)
    }
}

/// Uses a key that a corrupt payload produced, in every way a client
/// could; errors are fine, a crash is not.
fn exercise(con: &mut redis::Connection, key: &str) {
    for args in [
        vec!["IDEM.GET", key],
        vec!["IDEM.CLAIM", key, "10"],
        vec!["IDEM.DONE", key, "00000000000000000000000000000000"],
        vec!["IDEM.BF.INFO", key],
        vec!["IDEM.BF.MEXISTS", key, "x1", "zz"],
        vec!["IDEM.BF.MADD", key, "n1", "n2", "x3"],
        vec!["MEMORY", "USAGE", key],
        vec!["DEBUG", "DIGEST-VALUE", key],
        vec!["DUMP", key],
        vec!["COPY", key, "copy-of-corrupt", "REPLACE"],
        vec!["DEL", key, "copy-of-corrupt"],
    ] {
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        let _: RedisResult<Value> = cmd.query(con);
    }
}

fn restore_bad(con: &mut redis::Connection, payload: &[u8]) -> RedisResult<Value> {
    redis::cmd("RESTORE").arg("bad").arg(0).arg(payload).arg("REPLACE").query(con)
}

/// The family, on payloads with a valid checksum: every source's DUMP,
/// re-checksummed after each damage, is refused or restores as a value
/// every command can use; the server survives. Returns what must not have
/// happened (the caller asserts there is nothing, after checking its
/// sources did not change).
fn corrupt_restores(s: &mut Server, con: &mut redis::Connection, sources: &[Source]) -> Vec<String> {
    // A reference string payload checks our CRC against Redis's.
    let _: () = redis::cmd("SET").arg("str").arg("hello").query(con).unwrap();
    let sp: Vec<u8> = redis::cmd("DUMP").arg("str").query(con).unwrap();
    let n = sp.len();
    assert_eq!(crc64_redis(&sp[..n - 8]).to_le_bytes(), sp[n - 8..], "test's CRC64 does not match Redis's");

    let (mut refused, mut accepted) = (0, 0);
    let mut failures = Vec::new();
    for src in sources {
        let (key, body) = (&src.key, &src.body);
        // Sanity: the re-checksummed good payload restores the same value
        // (with an expiry: DIGEST-VALUE counts whether the key has one).
        let _: () = redis::cmd("RESTORE")
            .arg("good")
            .arg(pexpiretime(con, key))
            .arg(src.payload(body))
            .arg("ABSTTL")
            .arg("REPLACE")
            .query(con)
            .unwrap_or_else(|e| panic!("{key}: RESTORE of the re-checksummed good payload: {e}"));
        assert_eq!(digest_value(con, "good"), digest_value(con, key), "{key}: the re-checksummed payload");
        assert_eq!(key_state(con, "good"), key_state(con, key), "{key}: the re-checksummed payload");
        assert_eq!(
            mexists_all(con, "good", &src.probes),
            mexists_all(con, key, &src.probes),
            "{key}: the re-checksummed payload's answers"
        );

        // Flipped checksum: refused by Redis itself.
        let mut flipped = src.payload(body);
        let last = flipped.len() - 1;
        flipped[last] ^= 0xff;
        assert!(restore_bad(con, &flipped).is_err(), "{key}: a payload with a wrong checksum was accepted");

        // Fields of the encoding that make it invalid: each must be refused.
        for (what, x) in &src.must_refuse {
            match restore_bad(con, &src.payload(x)) {
                Err(_) => refused += 1,
                Ok(v) => {
                    let info: RedisResult<Value> = redis::cmd("IDEM.BF.INFO").arg("bad").query(con);
                    failures.push(format!("{key}: {what}: RESTORE accepted ({v:?}); INFO {info:?}"));
                    exercise(con, "bad");
                }
            }
            s.assert_alive();
        }

        // Every cut: refused, unless what follows can complete it.
        if let Some(((start, end), completable)) = src.cuts {
            for cut in 1..end - start {
                let mut x = body.clone();
                x.drain(end - cut..end);
                match restore_bad(con, &src.payload(&x)) {
                    Err(_) => refused += 1,
                    Ok(_) if cut <= completable => {
                        accepted += 1;
                        exercise(con, "bad");
                    }
                    Ok(v) => {
                        failures.push(format!("{key}: truncated by {cut} of {} bytes: accepted ({v:?})", end - start));
                        exercise(con, "bad");
                    }
                }
                if cut % 16 == 0 {
                    s.assert_alive();
                }
            }
            s.assert_alive();
        }

        // A newer encoding version than the module knows: refused.
        // Layout: type byte 7 (module, v2), then 0x81 + 8-byte big-endian
        // module id whose low 10 bits are the encoding version.
        assert_eq!(body[0], 7, "{key}: not a RDB_TYPE_MODULE_2 payload");
        assert_eq!(body[1], 0x81, "{key}: module id not a 64-bit length");
        let id = u64::from_be_bytes(body[2..10].try_into().unwrap());
        let encver = id & 1023;
        if encver < 1023 {
            let mut newer = body.clone();
            newer[2..10].copy_from_slice(&(id + 1).to_be_bytes());
            let r = restore_bad(con, &src.payload(&newer));
            assert!(r.is_err(), "{key}: RESTORE with encoding version {} (module's is {encver}) accepted", encver + 1);
        }

        // Changed bytes, and trailing garbage: refused or accepted as some
        // value, but never a crash.
        let mut try_body = |con: &mut redis::Connection, x: &[u8]| match restore_bad(con, &src.payload(x)) {
            Ok(_) => {
                accepted += 1;
                exercise(con, "bad");
            }
            Err(_) => refused += 1,
        };
        match src.damage {
            Damage::EveryByte => {
                for i in 0..body.len() {
                    for val in [0x00u8, 0xff, 0x80, 0x81, 0x7f, body[i] ^ 0x01, body[i].wrapping_add(1)] {
                        if val == body[i] {
                            continue;
                        }
                        let mut x = body.clone();
                        x[i] = val;
                        try_body(con, &x);
                    }
                    if i % 8 == 0 {
                        s.assert_alive();
                    }
                }
            }
            Damage::RandomChanges(rounds) => {
                let mut rng = Lcg(0x2545_f491_4f6c_dd1d ^ body.len() as u64);
                for round in 0..rounds {
                    let mut x = body.clone();
                    for _ in 0..1 + rng.below(3) {
                        let limit = if round % 2 == 0 { x.len().min(140) } else { x.len() };
                        let at = rng.below(limit);
                        let v = rng.next() as u8;
                        x[at] = if v == x[at] { v ^ 0x5a } else { v };
                    }
                    try_body(con, &x);
                    if round % 25 == 0 {
                        s.assert_alive();
                    }
                }
            }
        }
        let mut longer = body.clone();
        longer.extend_from_slice(b"trailing garbage");
        try_body(con, &longer);
        s.assert_alive();
    }
    eprintln!("corrupt payloads: {refused} refused, {accepted} accepted as some value");
    s.assert_alive();
    // A full DEBUG RELOAD still works (nothing half-loaded left behind).
    let _: i64 = redis::cmd("DEL").arg("bad").arg("good").arg("copy-of-corrupt").query(con).unwrap();
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(con).unwrap();
    s.assert_alive();
    failures
}

/// Records to damage: done with a binary result and a fingerprint,
/// processing with a fingerprint (its token returned), ONCE, and released
/// with a binary owner.
fn record_sources(con: &mut redis::Connection) -> (Vec<Source>, String) {
    let t = claim_new_opts(con, "src1", 600, &["PAYLOAD", "body"]);
    assert_eq!(done(con, "src1", &t, ("RESULT", "a-result\x00bin")), Ok(1));
    let processing = claim_new_opts(con, "src2", 600, &["PAYLOAD", "body2"]);
    assert_eq!(once(con, "src3", 600), 1);
    let t = claim_owned(con, "src4", 600, &[b"OWNER", b"\x00\xff owner \r\n"]);
    assert_eq!(release(con, "src4", &t), 1);
    let sources = ["src1", "src2", "src3", "src4"]
        .iter()
        .map(|k| {
            let mut src = Source::new(con, k, Damage::EveryByte);
            // The record's bytes end the body (then the EOF opcode and the
            // 10-byte footer follow).
            src.cuts = Some(((0, src.body.len()), 10));
            src
        })
        .collect();
    (sources, processing)
}

fn corrupt_record_restores(server_args: &[&str]) {
    let mut s = Server::with_args(&[], server_args);
    let mut con = s.conn();
    let (sources, _) = record_sources(&mut con);
    let keys = ["src1", "src2", "src3", "src4"];
    let originals = snapshot_all(&mut con, &keys);
    let started = Instant::now();
    let failures = corrupt_restores(&mut s, &mut con, &sources);
    // The sources are untouched: every field and the absolute expiry exact,
    // the time-relative ones within the time the RESTOREs took (a fixed 5 s
    // was outrun by a loaded machine's 7 s), and a second for the reads.
    let tol_ms = i64::try_from(started.elapsed().as_millis()).unwrap() + 1000;
    assert_same_records(&originals, &snapshot_all(&mut con, &keys), tol_ms, "sources after corrupt RESTOREs");
    assert!(failures.is_empty(), "{} corrupt record payloads accepted:\n{}", failures.len(), failures.join("\n"));
}

/// A filter to damage: two shards, stacked sub-filters, small bit arrays
/// (most bytes are structure). `structural`: the filter's own bytes are
/// uncompressed in the payload, so its fields can be damaged one by one.
fn filter_source(con: &mut redis::Connection, structural: bool) -> Source {
    reserve(con, "src", "0.1", 4, &["WINDOW", "366", "SHARD", "1"]);
    bf_madd(con, "src", &items("x", 0..20));
    align_to_boundary(con, 1000, 10);
    bf_madd(con, "src", &items("y", 0..10));
    let info = bf_info(con, "src");
    assert_eq!(info.shards.len(), 2);
    let mut src = Source::new(con, "src", Damage::RandomChanges(400));
    src.probes = items("x", 0..30);
    if structural {
        let (b, len) = blob_span(&src.body);
        // The blob's bytes, then the EOF opcode and the footer.
        src.cuts = Some(((b, b + len), 11));
        src.must_refuse = filter_fields_that_must_be_refused(&src.body, &info);
    }
    src
}

/// Fields of the filter's encoding that make it invalid.
fn filter_fields_that_must_be_refused(body: &[u8], info: &BfInfo) -> Vec<(String, Vec<u8>)> {
    let (b, len) = blob_span(body);
    let mut must_refuse: Vec<(String, Vec<u8>)> = Vec::new();
    let mut set = |what: &str, at: usize, bytes: &[u8]| {
        let mut x = body.to_vec();
        x[b + at..b + at + bytes.len()].copy_from_slice(bytes);
        must_refuse.push((what.to_string(), x));
    };
    set("format version 0", 0, &[0]);
    set("format version 5", 0, &[5]);
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
    set("first shard items + 1", 77, &(info.shards[0].items as u64 + 1).to_le_bytes());
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
    set("first sub-filter folded 27 times", 121, &27u32.to_le_bytes());
    set("first sub-filter folded once, its bits not", 121, &1u32.to_le_bytes());
    // The second shard starting with, or before, the first.
    let blob = &body[b..b + len];
    let second = {
        let mut at = 69;
        let count = u32::from_le_bytes(blob[at + 16..at + 20].try_into().unwrap());
        at += 20;
        for _ in 0..count {
            // capacity, items, error, hash count, bit length, folds, bits
            let bits = u32::from_le_bytes(blob[at + 28..at + 32].try_into().unwrap()) as usize;
            at += 36 + bits;
        }
        at
    };
    let first_start = i64::from_le_bytes(blob[69..77].try_into().unwrap());
    assert_eq!(i64::from_le_bytes(blob[second..second + 8].try_into().unwrap()), first_start + 1, "blob layout");
    set("second shard start = first's", second, &first_start.to_le_bytes());
    set("second shard start before first's", second, &(first_start - 1).to_le_bytes());
    must_refuse
}

fn corrupt_filter_restores(server_args: &[&str], structural: bool) {
    let mut s = Server::with_args(&[], server_args);
    let mut con = s.conn();
    let source = filter_source(&mut con, structural);
    let original = filter_snap(&mut con, "src", &items("x", 0..30));
    let failures = corrupt_restores(&mut s, &mut con, &[source]);
    assert_eq!(filter_snap(&mut con, "src", &items("x", 0..30)), original, "the source filter changed");
    assert!(failures.is_empty(), "{} corrupt filter payloads accepted:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn corrupt_record_payloads_are_refused() {
    // Uncompressed: every changed byte reaches the module's own decoder.
    corrupt_record_restores(&["--rdbcompression", "no"]);
}

#[test]
fn corrupt_compressed_record_payloads_are_refused() {
    corrupt_record_restores(&[]);
}

#[test]
fn corrupt_filter_payloads_are_refused() {
    // Uncompressed: every byte reaches the module's decoder.
    corrupt_filter_restores(&["--rdbcompression", "no"], true);
}

#[test]
fn corrupt_compressed_filter_payloads_do_not_crash() {
    corrupt_filter_restores(&[], false);
}

/// The family's sources again, with Redis's checksum check off: whatever
/// bytes reach the loaders, including a damaged footer and checksum.
#[test]
fn thousands_of_unchecked_corrupt_payloads_are_refused_or_load_as_usable_values() {
    let mut server = Server::start();
    let mut con = server.conn();
    let (mut sources, token) = record_sources(&mut con);
    sources.push(filter_source(&mut con, false));
    let originals: Vec<(String, Vec<u8>, String)> =
        sources.iter().map(|src| (src.key.clone(), src.payload(&src.body), digest_value(&mut con, &src.key))).collect();
    let _: () = redis::cmd("DEBUG").arg("SET-SKIP-CHECKSUM-VALIDATION").arg(1).query(&mut con).unwrap();

    let mut rng = Lcg(0x1de4);
    let (mut refused, mut accepted) = (0, 0);
    for round in 0..3000 {
        let (_, payload, _) = &originals[round % originals.len()];
        let mut corrupt = payload.clone();
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(corrupt.len());
            corrupt[at] = rng.next() as u8;
        }
        if rng.below(10) == 0 {
            corrupt.truncate(rng.below(corrupt.len()));
        }
        match restore_bad(&mut con, &corrupt) {
            Ok(_) => {
                accepted += 1;
                exercise(&mut con, "bad");
            }
            Err(_) => refused += 1,
        }
        if round % 500 == 0 {
            server.assert_alive();
        }
    }
    server.assert_alive();
    assert!(refused > 1000, "most corrupt payloads are refused: {refused} refused, {accepted} accepted");
    // The originals are untouched by all this.
    for (key, payload, original_digest) in &originals {
        assert_eq!(&digest_value(&mut con, key), original_digest, "{key}");
        let now: Vec<u8> = redis::cmd("DUMP").arg(key).query(&mut con).expect("DUMP");
        assert_eq!(&now, payload, "{key}");
    }
    assert_eq!(done(&mut con, "src2", &token, ("RETAIN", 60)), Ok(1));
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
    let _: () = redis::cmd("RESTORE").arg("copy").arg(0).arg(module_payload(&good, &blob)).query(&mut con).unwrap();

    let now_hour = server_ms(&mut con) / 1000 / 3600 * 3600;
    let shards: Vec<_> = (0..8784i64)
        .map(|i| (now_hour - (8783 - i) * 3600, (0..32).map(|_| (1u64, 1u64, 1e-12, 1u32, vec![0xffu8; 8])).collect()))
        .collect();
    let huge = module_payload(&good, &filter_blob(8784, 3600, &shards));
    let e = redis::cmd("RESTORE").arg("huge").arg(0).arg(&huge).query::<()>(&mut con).unwrap_err();
    assert!(err_text(&e).contains("Bad data format"), "{e}");
    assert!(!exists(&mut con, "huge"));
    s.assert_alive();
}
