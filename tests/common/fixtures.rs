//! Values in every state, and snapshots of them: records (made by
//! `populate`), filters (made by `populate_filters`), and the state of any
//! key, for the persistence, replication, cluster and bad-input tests.
use crate::common::clock::align_to_boundary;
use crate::common::commands::{
    bf_add, bf_info, bf_info_opt, claim, claim_new, claim_new_opts, claim_opts, digest_value, done, extend, get_fields,
    get_opt, items, madd_all, mexists_all, once, pexpiretime, release, reserve,
};
use crate::common::reply::{BfInfo, Fields, as_int, as_token, f_bytes, f_str, parse_claim, random_token};
use redis::Value;
use std::collections::HashMap;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// Records
// ---------------------------------------------------------------------------

/// No extra arguments (for `done(.., NONE)`).
pub const NONE: &[&str] = &[];

pub const BIN_RESULT: &[u8] = b"\x00\xff\xfe bin\r\n\x00\x80 result";

/// A binary `OWNER` of the longest length, 64 bytes.
pub const BIN_OWNER: &[u8] = b"\x00\xff\r\n worker \x80\x01 {host:4242} ---------------------------------- 64";

/// The base names of the records `populate` makes (each prefixed).
pub const FIXTURE_KEYS: [&str; 12] = [
    "rec:expired",
    "rec:processing",
    "rec:processing-nofp",
    "rec:released",
    "rec:retried",
    "rec:done-result",
    "rec:done-noresult",
    "rec:done-empty",
    "rec:done-fp",
    "rec:done-big",
    "rec:once",
    "rec:late-done",
];

/// Records in every state, made by `populate`, with the tokens they hold.
pub struct Fixture {
    pub prefix: String,
    /// Full key names.
    pub keys: Vec<String>,
    /// Latest token of each claimed record, by base name.
    pub tokens: HashMap<&'static str, String>,
    /// The first token of `rec:retried` (superseded by its second claim).
    pub retried_old_token: String,
}

impl Fixture {
    /// Full key name of a base name.
    pub fn key(&self, base: &str) -> String {
        format!("{}{}", self.prefix, base)
    }

    pub fn key_refs(&self) -> Vec<&str> {
        self.keys.iter().map(String::as_str).collect()
    }
}

/// Creates records in every state, key names starting with `prefix`; some
/// with an owner (`rec:expired` a binary one, `rec:processing`), some whose
/// owner a claim without one cleared (`rec:retried`) or DONE dropped
/// (`rec:done-result`). Takes ~1.1 s (a lease must lapse).
pub fn populate(con: &mut redis::Connection, prefix: &str) -> Fixture {
    let k = |base: &str| format!("{prefix}{base}");
    let mut tokens = HashMap::new();
    let started = Instant::now();
    // expired: lease of 1 s, lapsed by the end of this function.
    let claimed = claim_owned(con, &k("rec:expired"), 1, &[b"PAYLOAD", b"exp-payload", b"OWNER", BIN_OWNER]);
    tokens.insert("rec:expired", claimed);
    let claimed = claim_owned(con, &k("rec:processing"), 600, &[b"PAYLOAD", b"payload-1", b"OWNER", b"worker-1"]);
    tokens.insert("rec:processing", claimed);
    tokens.insert("rec:processing-nofp", claim_new(con, &k("rec:processing-nofp"), 700));
    let t = claim_new(con, &k("rec:released"), 600);
    assert_eq!(release(con, &k("rec:released"), &t), 1);
    tokens.insert("rec:released", t);
    let old = claim_new_opts(con, &k("rec:retried"), 600, &["MAXTRIES", "5", "OWNER", "first"]);
    assert_eq!(release(con, &k("rec:retried"), &old), 1);
    let (status, value, attempt) = claim(con, &k("rec:retried"), 800);
    assert_eq!((status.as_str(), attempt), ("RETRY", 2));
    tokens.insert("rec:retried", as_token(&value));
    let t = claim_new_opts(con, &k("rec:done-result"), 600, &["OWNER", "worker-2"]);
    assert_eq!(done(con, &k("rec:done-result"), &t, ("RESULT", BIN_RESULT, "RETAIN", 5000)), Ok(1));
    let t = claim_new(con, &k("rec:done-noresult"), 600);
    assert_eq!(done(con, &k("rec:done-noresult"), &t, NONE), Ok(1));
    let t = claim_new(con, &k("rec:done-empty"), 600);
    assert_eq!(done(con, &k("rec:done-empty"), &t, ("RESULT", "")), Ok(1));
    let t = claim_new_opts(con, &k("rec:done-fp"), 600, &["PAYLOAD", "fp-payload"]);
    assert_eq!(done(con, &k("rec:done-fp"), &t, ("RESULT", "ok", "RETAIN", 9000)), Ok(1));
    let t = claim_new(con, &k("rec:done-big"), 600);
    let big: Vec<u8> = (0..20_000u32).map(|i| (i * 7 % 251) as u8).collect();
    assert_eq!(done(con, &k("rec:done-big"), &t, ("RESULT", big)), Ok(1));
    assert_eq!(once(con, &k("rec:once"), 7000), 1);
    assert_eq!(done(con, &k("rec:late-done"), &random_token(), ("RESULT", "late")), Ok(1));
    let elapsed = started.elapsed();
    let wait = Duration::from_millis(1150);
    if elapsed < wait {
        std::thread::sleep(wait - elapsed);
    }
    let f = get_fields(con, &k("rec:expired"));
    assert_eq!(f_str(&f, "state"), "expired", "rec:expired: {f:?}");
    assert_eq!(f_bytes(&f, "owner").as_deref(), Some(BIN_OWNER), "rec:expired");
    for (base, owner) in [("rec:processing", Some(&b"worker-1"[..])), ("rec:retried", None), ("rec:done-result", None)]
    {
        assert_eq!(f_bytes(&get_fields(con, &k(base)), "owner").as_deref(), owner, "{base}");
    }
    Fixture {
        prefix: prefix.to_string(),
        keys: FIXTURE_KEYS.iter().map(|b| k(b)).collect(),
        tokens,
        retried_old_token: old,
    }
}

/// `IDEM.CLAIM key lease <opts>` with binary options, on an absent key:
/// returns the token.
pub fn claim_owned(con: &mut redis::Connection, key: &str, lease: i64, opts: &[&[u8]]) -> String {
    let v: Value = redis::cmd("IDEM.CLAIM")
        .arg(key)
        .arg(lease)
        .arg(opts)
        .query(con)
        .unwrap_or_else(|e| panic!("IDEM.CLAIM {key} {lease} {opts:?}: {e}"));
    let (status, value, attempt) = parse_claim(v);
    assert_eq!((status.as_str(), attempt), ("NEW", 1), "CLAIM {key}: value {value:?}");
    as_token(&value)
}

/// What `IDEM.GET` and `PEXPIRETIME` say about a key.
#[derive(Debug, Clone)]
pub struct Snap {
    pub key: String,
    pub fields: Option<Fields>,
    pub pexpiretime: i64,
}

pub fn snapshot(con: &mut redis::Connection, key: &str) -> Snap {
    Snap { key: key.to_string(), fields: get_opt(con, key), pexpiretime: pexpiretime(con, key) }
}

pub fn snapshot_all(con: &mut redis::Connection, keys: &[&str]) -> Vec<Snap> {
    keys.iter().map(|k| snapshot(con, k)).collect()
}

/// Asserts two snapshots of a record are the same record: every field
/// exact except the time-relative `lease_ms` / `pttl` (within `tol_ms`), and
/// the absolute expiry exact.
pub fn assert_same_record(before: &Snap, after: &Snap, tol_ms: i64, what: &str) {
    let (Some(b), Some(a)) = (&before.fields, &after.fields) else {
        panic!("{what}: {} was {:?}, {} is {:?}", before.key, before.fields, after.key, after.fields);
    };
    for name in ["state", "attempt", "claimed_at", "done_at", "result", "fingerprint", "tries", "owner"] {
        assert_eq!(b[name], a[name], "{what}: field {name} of {} (before) vs {} (after)", before.key, after.key);
    }
    for name in ["lease_ms", "pttl"] {
        let (x, y) = (as_int(&b[name]), as_int(&a[name]));
        assert!(
            (x - y).abs() <= tol_ms,
            "{what}: field {name} of {} was {x}, of {} is {y} (tolerance {tol_ms} ms)",
            before.key,
            after.key
        );
    }
    assert_eq!(before.pexpiretime, after.pexpiretime, "{what}: PEXPIRETIME of {} vs {}", before.key, after.key);
}

pub fn assert_same_records(before: &[Snap], after: &[Snap], tol_ms: i64, what: &str) {
    assert_eq!(before.len(), after.len());
    for (b, a) in before.iter().zip(after) {
        assert_same_record(b, a, tol_ms, what);
    }
}

/// After a reload/copy/failover, the tokens the fixture holds still work on
/// the records now named `name(full key)`, and wrong tokens still do not.
/// (This changes the records.)
pub fn check_fixture_tokens(con: &mut redis::Connection, fx: &Fixture, name: impl Fn(&str) -> String) {
    let key = |base: &str| name(&fx.key(base));
    let k = key("rec:processing");
    assert!(done(con, &k, &random_token(), NONE).unwrap_err().starts_with("STALE"), "{k}: wrong token");
    assert_eq!(extend(con, &k, &fx.tokens["rec:processing"], 900), Ok(1), "{k}: EXTEND with its token");
    assert_eq!(done(con, &k, &fx.tokens["rec:processing"], ("RESULT", "r")), Ok(1), "{k}: DONE with its token");

    let k = key("rec:processing-nofp");
    assert_eq!(release(con, &k, &fx.tokens["rec:processing-nofp"]), 1, "{k}: RELEASE with its token");
    let (s, _, a) = claim(con, &k, 60);
    assert_eq!((s.as_str(), a), ("RETRY", 2), "{k}");

    // The lapsed lease, nobody claimed since: the token still extends it.
    let k = key("rec:expired");
    assert_eq!(extend(con, &k, &fx.tokens["rec:expired"], 60), Ok(1), "{k}: EXTEND after lapse");
    assert_eq!(f_str(&get_fields(con, &k), "state"), "processing");

    let k = key("rec:retried");
    assert!(
        done(con, &k, &fx.retried_old_token, NONE).unwrap_err().starts_with("STALE"),
        "{k}: superseded token must be STALE"
    );
    assert_eq!(done(con, &k, &fx.tokens["rec:retried"], NONE), Ok(1), "{k}: DONE with the latest token");

    let k = key("rec:released");
    assert_eq!(release(con, &k, &fx.tokens["rec:released"]), 0, "{k}");
    let (s, v, a) = claim(con, &k, 60);
    assert_eq!((s.as_str(), a), ("RETRY", 2), "{k}");
    assert_ne!(as_token(&v), fx.tokens["rec:released"], "{k}: a new claim got an old token");

    let k = key("rec:done-result");
    let (s, v, a) = claim(con, &k, 60);
    assert_eq!((s, v, a), ("DONE".to_string(), Value::BulkString(BIN_RESULT.to_vec()), 1), "{k}");
    let k = key("rec:done-empty");
    let (s, v, _) = claim(con, &k, 60);
    assert_eq!((s.as_str(), v), ("DONE", Value::BulkString(vec![])), "{k}");
    let k = key("rec:done-fp");
    let (s, v, _) = claim_opts(con, &k, 60, &["PAYLOAD", "other"]);
    assert_eq!((s.as_str(), v), ("MISMATCH", Value::Nil), "{k}: fingerprint kept");
    let k = key("rec:once");
    let (s, v, a) = claim(con, &k, 60);
    assert_eq!((s, v, a), ("DONE".to_string(), Value::Nil, 0), "{k}");
}

// ---------------------------------------------------------------------------
// Filters
// ---------------------------------------------------------------------------

/// Everything observable about a filter key; two snapshots are equal when
/// the filters are identical (same bits, same shards, same expiry).
#[derive(Debug, Clone, PartialEq)]
pub struct FilterSnap {
    pub key: String,
    pub ty: String,
    pub digest: String,
    pub info: Option<BfInfo>,
    pub pexpiretime: i64,
    /// MEXISTS answers for the fixture's probes.
    pub answers: Vec<i64>,
}

pub fn filter_snap(con: &mut redis::Connection, key: &str, probes: &[String]) -> FilterSnap {
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
pub struct BfFixture {
    pub keys: Vec<String>,
    /// Items that were added (to some of the filters) and fresh ones.
    pub probes: Vec<String>,
}

impl BfFixture {
    pub fn snap(&self, con: &mut redis::Connection) -> Vec<FilterSnap> {
        self.snap_named(con, |k| k.to_string())
    }

    pub fn snap_named(&self, con: &mut redis::Connection, name: impl Fn(&str) -> String) -> Vec<FilterSnap> {
        self.keys.iter().map(|k| filter_snap(con, &name(k), &self.probes)).collect()
    }
}

/// Asserts two lists of snapshots describe the same filters (key names
/// aside).
pub fn assert_same_filters(before: &[FilterSnap], after: &[FilterSnap], what: &str) {
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
pub fn populate_filters(con: &mut redis::Connection, prefix: &str) -> BfFixture {
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
    let open = bf_info(con, &k("bf:multi"));
    align_to_boundary(con, 1000, 20);
    madd_all(con, &k("bf:multi"), &items("m2:", 0..150));
    madd_all(con, &k("bf:multi"), &items("m:", 0..50)); // seen, and recorded in this shard too
    let info = bf_info(con, &k("bf:multi"));
    assert!(info.shards.len() >= 2, "bf:multi should span 2 shards: {info:?}");
    // The shard that took the first 150 items, closed, folds its sub-filters. It is the newest when they went
    // in: on a loaded machine RESERVE's second had already passed, leaving an empty shard before it.
    let filled = open.shards.last().expect("bf:multi has a shard");
    let closed = info.shards.iter().find(|s| s.start == filled.start);
    assert!(
        closed.is_some_and(|c| c.bytes < filled.bytes) && info.shards.last().unwrap().start > filled.start,
        "bf:multi's first filled shard folds: {open:?} then {info:?}"
    );

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

// ---------------------------------------------------------------------------
// Any key
// ---------------------------------------------------------------------------

/// Everything observable about a key, for "unchanged" checks.
#[derive(Debug, PartialEq)]
pub struct KeyState {
    pub ty: String,
    pub pexpiretime: i64,
    pub digest: Option<String>,
    pub info: Option<BfInfo>,
    pub record: Option<Vec<(String, Value)>>,
    pub string: Option<Vec<u8>>,
}

pub fn key_state(con: &mut redis::Connection, key: &str) -> KeyState {
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
