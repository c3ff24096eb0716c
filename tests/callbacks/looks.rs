//! Looking at a value: everything observable about it, and what it must
//! still be after a command.

use super::values::{info_field, info_value, mexists};
use super::{Case, Kind, TOL_MS};
use crate::common::commands::{digest_value, pexpiretime, server_ms};
use crate::common::fixtures::{Snap, snapshot};
use crate::common::reply::as_int;
use redis::Value;
use std::collections::BTreeSet;
use std::process::Command;

// ---------------------------------------------------------------------------
// Looking at a value
// ---------------------------------------------------------------------------

/// Everything observable about a value; equal looks are the same value.
#[derive(Debug, Clone)]
pub(super) struct Look {
    pub(super) name: String,
    pub(super) ty: String,
    pub(super) digest: String,
    pub(super) dump: Vec<u8>,
    pub(super) pexpiretime: i64,
    /// Records: IDEM.GET and PEXPIRETIME, and the server's clock (Unix ms)
    /// just before.
    pub(super) record: Option<Snap>,
    pub(super) at_ms: i64,
    /// Filters: IDEM.BF.INFO and MEXISTS of the case's probes.
    pub(super) info: Option<Value>,
    pub(super) answers: Vec<i64>,
}

/// Looks at `case`'s value under the name `name` (a copy, a renamed key).
pub(super) fn look(con: &mut redis::Connection, case: &Case, name: &str) -> Look {
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
pub(super) fn assert_intact(original: &Look, now: &Look, what: &str) {
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
    for name in ["state", "attempt", "claimed_at", "done_at", "result", "fingerprint", "tries", "owner"] {
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

pub(super) fn memory_usage(con: &mut redis::Connection, key: &str, samples: Option<i64>) -> i64 {
    let mut c = redis::cmd("MEMORY");
    c.arg("USAGE").arg(key);
    if let Some(n) = samples {
        c.arg("SAMPLES").arg(n);
    }
    c.query(con).unwrap_or_else(|e| panic!("MEMORY USAGE {key} {samples:?}: {e}"))
}

/// MEMORY USAGE `usage` is a sensible size for the value: it counts a
/// RESULT and an OWNER, or a filter's bits, and not much more.
pub(super) fn assert_sensible_usage(case: &Case, original: &Look, usage: i64, what: &str) {
    let (lo, hi) = match case.kind {
        // A PAYLOAD is kept as a 16-byte hash: a 200 kB one costs nothing.
        Kind::Record => (case.data_len() as i64 + 16, case.data_len() as i64 + 1024),
        Kind::Filter => {
            let bytes = as_int(&info_field(original.info.as_ref().unwrap(), "bytes"));
            (bytes.max(16), bytes + bytes / 20 + 16_384)
        }
    };
    assert!((lo..=hi).contains(&usage), "{what}: MEMORY USAGE {} is {usage}, expected {lo}..={hi}", case.key);
}

/// `serializedlength` of `DEBUG OBJECT key` (the rdb_save callback's size).
pub(super) fn debug_object_serialized_length(con: &mut redis::Connection, key: &str) -> i64 {
    let text: String =
        redis::cmd("DEBUG").arg("OBJECT").arg(key).query(con).unwrap_or_else(|e| panic!("DEBUG OBJECT {key}: {e}"));
    text.split_whitespace()
        .find_map(|w| w.strip_prefix("serializedlength:"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("DEBUG OBJECT {key}: no serializedlength in {text:?}"))
}

pub(super) fn scan_type(con: &mut redis::Connection, type_name: &str) -> BTreeSet<String> {
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

pub(super) fn redis_cli(port: u16, args: &[&str]) -> String {
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
pub(super) fn cli_type_summary(out: &str, type_name: &str) -> (i64, String) {
    let marker = format!(" {type_name}s with ");
    let line = out
        .lines()
        .find(|l| l.contains(&marker) && l.split_whitespace().next().is_some_and(|w| w.parse::<i64>().is_ok()))
        .unwrap_or_else(|| panic!("no summary line for {type_name} in:\n{out}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    (words[0].parse().unwrap(), words[3].to_string())
}
