//! The module's commands (and a few of Redis's), called the way the tests
//! call them: each wrapper panics on an unexpected error, with the command
//! in the message.
use crate::common::reply::{BfInfo, Fields, as_token, err_text, fields_from_reply, parse_bf_info, parse_claim, q};
use redis::Value;
use std::collections::HashMap;

/// `IDEM.CLAIM key lease` → `(status, value, attempt)`.
pub fn claim(con: &mut redis::Connection, key: &str, lease: i64) -> (String, Value, i64) {
    claim_opts(con, key, lease, &[])
}

/// `IDEM.CLAIM key lease <opts...>` → `(status, value, attempt)`.
pub fn claim_opts(con: &mut redis::Connection, key: &str, lease: i64, opts: &[&str]) -> (String, Value, i64) {
    let v = redis::cmd("IDEM.CLAIM")
        .arg(key)
        .arg(lease)
        .arg(opts)
        .query::<Value>(con)
        .unwrap_or_else(|e| panic!("IDEM.CLAIM {key} {lease} {opts:?}: {e}"));
    parse_claim(v)
}

/// Claims an absent key: asserts NEW / attempt 1, returns the token.
pub fn claim_new(con: &mut redis::Connection, key: &str, lease: i64) -> String {
    claim_new_opts(con, key, lease, &[])
}

pub fn claim_new_opts(con: &mut redis::Connection, key: &str, lease: i64, opts: &[&str]) -> String {
    let (status, value, attempt) = claim_opts(con, key, lease, opts);
    assert_eq!((status.as_str(), attempt), ("NEW", 1), "CLAIM {key}: value {value:?}");
    as_token(&value)
}

/// `IDEM.DONE key token [args...]` → reply integer, or the error text.
pub fn done<A: redis::ToRedisArgs>(
    con: &mut redis::Connection,
    key: &str,
    token: &str,
    args: A,
) -> Result<i64, String> {
    redis::cmd("IDEM.DONE").arg(key).arg(token).arg(args).query::<i64>(con).map_err(|e| err_text(&e))
}

/// `IDEM.RELEASE key token` → 0/1 (panics on an error).
pub fn release(con: &mut redis::Connection, key: &str, token: &str) -> i64 {
    redis::cmd("IDEM.RELEASE")
        .arg(key)
        .arg(token)
        .query::<i64>(con)
        .unwrap_or_else(|e| panic!("IDEM.RELEASE {key}: {e}"))
}

/// `IDEM.EXTEND key token lease` → 1, or the error text.
pub fn extend(con: &mut redis::Connection, key: &str, token: &str, lease: i64) -> Result<i64, String> {
    redis::cmd("IDEM.EXTEND").arg(key).arg(token).arg(lease).query::<i64>(con).map_err(|e| err_text(&e))
}

/// `IDEM.ONCE key retain` → 0/1.
pub fn once(con: &mut redis::Connection, key: &str, retain: i64) -> i64 {
    redis::cmd("IDEM.ONCE").arg(key).arg(retain).query::<i64>(con).unwrap_or_else(|e| panic!("IDEM.ONCE {key}: {e}"))
}
/// `IDEM.GET key` as a map (RESP2 flat array or RESP3 map); `None` for nil.
/// Checks the reply shape: every field once, in the documented order for RESP2.
pub fn get_opt(con: &mut redis::Connection, key: &str) -> Option<Fields> {
    let v: Value = redis::cmd("IDEM.GET").arg(key).query(con).unwrap_or_else(|e| panic!("IDEM.GET {key}: {e}"));
    fields_from_reply(v)
}

/// `IDEM.GET key`, which must exist.
pub fn get_fields(con: &mut redis::Connection, key: &str) -> Fields {
    get_opt(con, key).unwrap_or_else(|| panic!("IDEM.GET {key}: nil, expected a record"))
}

pub fn pexpiretime(con: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("PEXPIRETIME").arg(key).query(con).expect("PEXPIRETIME")
}

pub fn pttl(con: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(con).expect("PTTL")
}

pub fn exists(con: &mut redis::Connection, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query::<i64>(con).expect("EXISTS") == 1
}

/// The server's clock (`TIME`) in Unix ms.
pub fn server_ms(con: &mut redis::Connection) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query(con).expect("TIME");
    s * 1000 + us / 1000
}

/// The fingerprint a PAYLOAD must show in IDEM.GET.
pub fn fingerprint_hex(payload: &[u8]) -> String {
    format!("{:032x}", xxhash_rust::xxh3::xxh3_128(payload))
}

/// `INFO idem` counters, names without an `idem_` prefix.
pub fn idem_counters(con: &mut redis::Connection) -> HashMap<String, i64> {
    let text: String = redis::cmd("INFO").arg("idem").query(con).expect("INFO idem");
    let mut out = HashMap::new();
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        if let Some((k, v)) = line.trim().split_once(':') {
            let k = k.strip_prefix("idem_").unwrap_or(k);
            if let Ok(n) = v.trim().parse::<i64>() {
                out.insert(k.to_string(), n);
            }
        }
    }
    assert!(!out.is_empty(), "INFO idem has no counters:\n{text}");
    out
}

/// `IDEM.BF.RESERVE key error_rate capacity <opts>`, which must answer OK.
pub fn reserve(con: &mut redis::Connection, key: &str, error_rate: &str, capacity: i64, opts: &[&str]) {
    let r: String = redis::cmd("IDEM.BF.RESERVE")
        .arg(key)
        .arg(error_rate)
        .arg(capacity)
        .arg(opts)
        .query(con)
        .unwrap_or_else(|e| panic!("IDEM.BF.RESERVE {key} {error_rate} {capacity} {opts:?}: {e}"));
    assert_eq!(r, "OK");
}

/// `DEBUG DIGEST-VALUE key` as hex.
pub fn digest_value(con: &mut redis::Connection, key: &str) -> String {
    let v: Vec<String> = redis::cmd("DEBUG").arg("DIGEST-VALUE").arg(key).query(con).expect("DEBUG DIGEST-VALUE");
    v.into_iter().next().unwrap()
}

/// `DEBUG DIGEST`: a digest of the whole dataset, expiry times included.
pub fn digest(con: &mut redis::Connection) -> String {
    redis::cmd("DEBUG").arg("DIGEST").query(con).expect("DEBUG DIGEST")
}

// Filters.

pub fn bf_info_opt(con: &mut redis::Connection, key: &str) -> Option<BfInfo> {
    let v: Value = q(con, "IDEM.BF.INFO", key).unwrap_or_else(|e| panic!("IDEM.BF.INFO {key}: {e}"));
    parse_bf_info(v)
}

pub fn bf_info(con: &mut redis::Connection, key: &str) -> BfInfo {
    bf_info_opt(con, key).unwrap_or_else(|| panic!("IDEM.BF.INFO {key}: nil, expected a filter"))
}

pub fn bf_add(con: &mut redis::Connection, key: &str, item: &str) -> i64 {
    redis::cmd("IDEM.BF.ADD").arg(key).arg(item).query(con).unwrap_or_else(|e| panic!("IDEM.BF.ADD {key} {item}: {e}"))
}

pub fn bf_exists(con: &mut redis::Connection, key: &str, item: &str) -> i64 {
    redis::cmd("IDEM.BF.EXISTS").arg(key).arg(item).query(con).unwrap_or_else(|e| panic!("IDEM.BF.EXISTS {key}: {e}"))
}

pub fn bf_madd<S: AsRef<str>>(con: &mut redis::Connection, key: &str, items: &[S]) -> Vec<i64> {
    let items: Vec<&str> = items.iter().map(|s| s.as_ref()).collect();
    redis::cmd("IDEM.BF.MADD").arg(key).arg(&items).query(con).unwrap_or_else(|e| panic!("IDEM.BF.MADD {key}: {e}"))
}

pub fn bf_mexists<S: AsRef<str>>(con: &mut redis::Connection, key: &str, items: &[S]) -> Vec<i64> {
    let items: Vec<&str> = items.iter().map(|s| s.as_ref()).collect();
    redis::cmd("IDEM.BF.MEXISTS")
        .arg(key)
        .arg(&items)
        .query(con)
        .unwrap_or_else(|e| panic!("IDEM.BF.MEXISTS {key}: {e}"))
}

/// Runs `name key batch` for every batch of `items`, pipelined (`per_pipe`
/// commands per round trip); the replies, concatenated.
pub fn pipelined(con: &mut redis::Connection, name: &str, key: &str, items: &[String], batch: usize) -> Vec<i64> {
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

pub fn madd_all(con: &mut redis::Connection, key: &str, items: &[String]) -> Vec<i64> {
    pipelined(con, "IDEM.BF.MADD", key, items, 1000)
}

pub fn mexists_all(con: &mut redis::Connection, key: &str, items: &[String]) -> Vec<i64> {
    pipelined(con, "IDEM.BF.MEXISTS", key, items, 1000)
}

pub fn items(prefix: &str, range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("{prefix}{i}")).collect()
}

pub fn ones(v: &[i64]) -> usize {
    v.iter().filter(|&&x| x == 1).count()
}

/// Redis's counters of the module, as numbers.
pub fn bf_counters(con: &mut redis::Connection) -> [i64; 4] {
    let c = idem_counters(con);
    ["bf_add_new", "bf_add_seen", "bf_exists_hit", "bf_exists_miss"]
        .map(|n| *c.get(n).unwrap_or_else(|| panic!("INFO idem has no idem_{n}: {c:?}")))
}
