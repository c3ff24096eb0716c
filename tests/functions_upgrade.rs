//! Records that earlier builds of the Functions edition kept as hashes,
//! after the library that packs records into strings is loaded over it (`FUNCTION
//! LOAD REPLACE` on a server holding them): each still answers, as it did,
//! and becomes a string when a function next writes it. A hash that is not
//! exactly what those builds wrote answers `WRONGTYPE` and stays as it was.
//! tests/functions_upgrade/idem-hash-records.lua is that library, as main
//! held it at 0caf7dd.
#[allow(dead_code)] // each test binary uses part of common/
mod common;

use common::commands::pexpiretime;
use common::functions::{
    Stored, assert_refused, fcall, fclaim, fint, library_source, scan_all, stored, write_malformed_hashes,
};
use common::reply::{as_bytes, as_int, as_str, as_token};
use common::server::Server;
use common::{HISTORY_MS, RETAIN_MS};
use redis::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

#[test]
fn every_function_answers_wrongtype_for_a_hash_that_is_not_a_record() {
    let server = common::functions::library_server(&[]);
    let mut con = server.conn();
    for (key, what) in write_malformed_hashes(&mut con) {
        assert_refused(&mut con, &key, &what);
    }
}

fn load(con: &mut redis::Connection, source: &str) {
    let name: String = redis::cmd("FUNCTION").arg("LOAD").arg("REPLACE").arg(source).query(con).unwrap();
    assert_eq!(name, "idem");
}

/// idem_get's fields, whichever version answers (the hash library has no `owner`).
fn get(con: &mut redis::Connection, key: &str) -> BTreeMap<String, Value> {
    let reply = fcall(con, "idem_get", key, &[] as &[&str]).unwrap_or_else(|e| panic!("idem_get {key}: {e}"));
    let Value::Array(items) = reply else { panic!("idem_get {key}: {reply:?}") };
    items.chunks(2).map(|pair| (as_str(&pair[0]), pair[1].clone())).collect()
}

/// The fields that do not move with the clock.
fn settled(mut fields: BTreeMap<String, Value>) -> BTreeMap<String, Value> {
    fields.remove("lease_ms");
    fields.remove("pttl");
    fields.entry("owner".into()).or_insert(Value::Nil);
    fields
}

fn claim(con: &mut redis::Connection, key: &str, opts: &[&str]) -> (String, Value, i64) {
    common::functions::fclaim(con, key, 600, opts)
}

fn is_hash(con: &mut redis::Connection, key: &str) -> bool {
    matches!(stored(con, key), Stored::Hash(_))
}

#[test]
fn hash_records_still_answer_and_are_packed_when_written() {
    let server = Server::without_module(&[]);
    let mut con = server.conn();
    let old = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/functions_upgrade/idem-hash-records.lua"),
    )
    .unwrap();
    load(&mut con, &old);
    // Records in every state, written by the hash library.
    let token = |con: &mut redis::Connection, key: &str, lease: i64, opts: &[&str]| {
        let (status, token, _) = fclaim(con, key, lease, opts);
        assert_eq!(status, "NEW", "{key}");
        as_token(&token)
    };
    let processing = token(&mut con, "processing", 600, &["PAYLOAD", "p"]);
    let extended = token(&mut con, "extended", 600, &[]);
    assert_eq!(fint(&mut con, "idem_extend", "extended", (&extended, 900)), Ok(1));
    let _ = token(&mut con, "expired", 1, &[]);
    let released = token(&mut con, "released", 600, &[]);
    assert_eq!(fint(&mut con, "idem_release", "released", &released), Ok(1));
    let requeued = token(&mut con, "requeued", 600, &[]);
    assert_eq!(fint(&mut con, "idem_release", "requeued", &requeued), Ok(1));
    assert_eq!(fint(&mut con, "idem_requeue", "requeued", &[] as &[&str]), Ok(1));
    let done = token(&mut con, "done", 600, &["PAYLOAD", "d"]);
    assert_eq!(fint(&mut con, "idem_done", "done", (&done, "RESULT", "r\0\n", "RETAIN", 500)), Ok(1));
    assert_eq!(fint(&mut con, "idem_once", "once", 700), Ok(1));
    assert_eq!(fint(&mut con, "idem_done", "late", common::functions::TOKEN), Ok(1));
    std::thread::sleep(Duration::from_millis(1100));
    let keys = ["processing", "extended", "expired", "released", "requeued", "done", "once", "late"];
    let before: Vec<_> = keys.iter().map(|k| settled(get(&mut con, k))).collect();
    let filters: [&[&str]; 5] =
        [&[], &["STATE", "processing"], &["STATE", "expired"], &["STATE", "released"], &["STATE", "done"]];
    let listed: Vec<_> = filters.iter().map(|f| scan_all(&mut con, f)).collect();
    assert_eq!(listed[0], Ok(keys.iter().map(|k| k.to_string()).collect::<BTreeSet<_>>()));

    // The new library over it: every record reads as it did, and reading
    // changes nothing.
    load(&mut con, &library_source());
    for (key, fields) in keys.iter().zip(&before) {
        assert_eq!(&settled(get(&mut con, key)), fields, "{key}");
        assert!(is_hash(&mut con, key), "{key}: a read converted it");
    }
    for (filter, listed) in filters.iter().zip(&listed) {
        assert_eq!(&scan_all(&mut con, filter), listed, "idem_scan {filter:?}");
    }

    // Refused claims change nothing; every write packs the record.
    assert_eq!(claim(&mut con, "processing", &["PAYLOAD", "p"]).0, "BUSY");
    assert_eq!(claim(&mut con, "processing", &["PAYLOAD", "q"]).0, "MISMATCH");
    assert_eq!(claim(&mut con, "released", &["MAXTRIES", "1"]).0, "EXHAUSTED");
    let (status, result, attempt) = claim(&mut con, "done", &[]);
    assert_eq!((status.as_str(), as_bytes(&result), attempt), ("DONE", Some(b"r\0\n".to_vec()), 1));
    assert_eq!(fint(&mut con, "idem_once", "once", 700), Ok(0));
    assert_eq!(fint(&mut con, "idem_done", "late", common::functions::TOKEN), Ok(0));
    assert!(ferr_stale(&mut con, "extended", &processing));
    for key in keys {
        assert!(is_hash(&mut con, key), "{key}: a refusal converted it");
    }
    assert_eq!(fint(&mut con, "idem_extend", "processing", (&processing, 900)), Ok(1));
    assert!(matches!(stored(&mut con, "processing"), Stored::String(_)), "EXTEND packs it");
    assert_eq!(fint(&mut con, "idem_done", "processing", &processing), Ok(1));
    assert_eq!(fint(&mut con, "idem_release", "extended", &extended), Ok(1));
    let (status, _, attempt) = claim(&mut con, "expired", &["OWNER", "w"]);
    assert_eq!((status.as_str(), attempt), ("RETRY", 2));
    assert_eq!(fint(&mut con, "idem_requeue", "released", &[] as &[&str]), Ok(1));
    assert_eq!(claim(&mut con, "released", &["MAXTRIES", "1"]).0, "RETRY");
    let (status, _, attempt) = claim(&mut con, "requeued", &["MAXTRIES", "1"]);
    assert_eq!((status.as_str(), attempt), ("RETRY", 2));
    assert_eq!(fint(&mut con, "idem_requeue", "done", &[] as &[&str]), Ok(1));

    let now: i64 = common::commands::server_ms(&mut con);
    let after = |con: &mut redis::Connection, key: &str| {
        assert!(matches!(stored(con, key), Stored::String(_)), "{key} was not packed");
        get(con, key)
    };
    let fields = after(&mut con, "processing");
    assert_eq!(as_str(&fields["state"]), "done");
    assert_eq!(fields["fingerprint"], before[0]["fingerprint"], "the fingerprint survives");
    assert_eq!(pexpiretime(&mut con, "processing"), as_int(&fields["done_at"]) + RETAIN_MS);
    let fields = after(&mut con, "extended");
    assert_eq!((as_str(&fields["state"]), as_int(&fields["attempt"])), ("released".into(), 1));
    assert!((pexpiretime(&mut con, "extended") - now - HISTORY_MS).abs() < 5_000);
    let fields = after(&mut con, "expired");
    assert_eq!((as_str(&fields["state"]), as_bytes(&fields["owner"])), ("processing".into(), Some(b"w".to_vec())));
    assert_eq!(as_int(&after(&mut con, "released")["tries"]), 1);
    assert_eq!(as_int(&after(&mut con, "requeued")["tries"]), 1);
    let fields = after(&mut con, "done");
    assert_eq!((as_str(&fields["state"]), &fields["result"]), ("released".into(), &Value::Nil));
    assert_eq!(fields["fingerprint"], before[5]["fingerprint"]);
    // Those nobody wrote are still the hashes it made, and still answer.
    for key in ["once", "late"] {
        assert!(is_hash(&mut con, key), "{key}");
        assert_eq!(claim(&mut con, key, &[]).0, "DONE", "{key}");
    }
}

/// `idem_extend` with another claim's token answers STALE.
fn ferr_stale(con: &mut redis::Connection, key: &str, token: &str) -> bool {
    common::functions::ferr(con, "idem_extend", key, (token, 10)).starts_with("STALE")
}
