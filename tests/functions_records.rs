//! What the Functions edition takes for a record (docs/functions.md): a
//! hash whose fields are exactly a record's, each well-formed. Any other
//! hash, a user's or a damaged record, answers `WRONGTYPE` from every
//! function, as the module answers for a key of another type: never a Lua
//! error, a wrong reply, or a write into the user's hash.
#[allow(dead_code)] // each test binary uses part of common/
mod common;

use common::commands::{pexpiretime, server_ms};
use common::functions::{fcall, fclaim, fclaim_new, fget, fint, library_server};
use common::reply::err_text;
use std::collections::{BTreeMap, BTreeSet};

const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
const TOKEN: &str = "0123456789abcdef0123456789abcdef";

/// Malformed hashes: what the hostile probe found, then one defect each
/// in records that are otherwise well-formed (`L` is a lease end in the
/// future, `T` a token).
fn malformed() -> Vec<(&'static str, Vec<(&'static str, String)>)> {
    let live = |extra: &[(&'static str, &str)]| {
        let mut fields = vec![("s", "p".to_string()), ("a", "1".into()), ("c", "1".into()), ("l", "L".into())];
        fields.push(("t", TOKEN.into()));
        for &(name, value) in extra {
            fields.retain(|(n, _)| *n != name);
            if value != "-" {
                fields.push((name, value.into()));
            }
        }
        fields
    };
    let done = |extra: &[(&'static str, &str)]| {
        let mut fields = vec![("s", "d".to_string()), ("a", "1".into()), ("c", "1".into()), ("d", "1".into())];
        for &(name, value) in extra {
            fields.retain(|(n, _)| *n != name);
            if value != "-" {
                fields.push((name, value.into()));
            }
        }
        fields
    };
    let pairs = |fields: &[(&'static str, &str)]| fields.iter().map(|&(n, v)| (n, v.to_string())).collect();
    vec![
        ("s=p alone", pairs(&[("s", "p")])),
        ("an unknown phase", pairs(&[("s", "zz"), ("a", "1")])),
        ("s=d alone", pairs(&[("s", "d")])),
        ("attempt 1e400", live(&[("s", "r"), ("a", "1e400")])),
        ("lease end 1e20", pairs(&[("s", "p"), ("a", "1"), ("l", "1e20"), ("t", TOKEN)])),
        ("a user's hash with s and a", pairs(&[("s", "r"), ("a", "1"), ("name", "bob")])),
        ("a record with a field of the user's", live(&[("name", "bob")])),
        ("a done record with a field of the user's", done(&[("x", "")])),
        ("an empty field name", live(&[("", "v")])),
        ("no phase", live(&[("s", "-")])),
        ("an empty phase", live(&[("s", "")])),
        ("no attempt", live(&[("a", "-")])),
        ("a negative attempt", live(&[("a", "-1")])),
        ("attempt 01", live(&[("a", "01")])),
        ("attempt 1.5", live(&[("a", "1.5")])),
        ("attempt with a space", live(&[("a", " 1")])),
        ("attempt 2^53", live(&[("a", "9007199254740992")])),
        ("attempt 0 while processing", live(&[("a", "0")])),
        ("no lease end while processing", live(&[("l", "-")])),
        ("lease end 2^63", live(&[("l", "9223372036854775808")])),
        ("lease end in hex", live(&[("l", "0x10")])),
        ("no claim time while processing", live(&[("c", "-")])),
        ("a claim time of text", live(&[("c", "yesterday")])),
        ("no token while processing", live(&[("t", "-")])),
        ("an empty token while released", live(&[("s", "r"), ("t", "")])),
        ("a short token", live(&[("t", "abc")])),
        ("an upper-case token", live(&[("t", "0123456789ABCDEF0123456789ABCDEF")])),
        ("a fingerprint of text", live(&[("f", "not a fingerprint at all, 32 ch.")])),
        ("a done time while processing", live(&[("d", "1")])),
        ("a result while processing", live(&[("r", "x")])),
        ("a done record without its done time", done(&[("d", "-")])),
        ("a done record with a live token", done(&[("t", TOKEN)])),
        ("a done record with a bad done time", done(&[("d", "-5")])),
        ("an empty owner", live(&[("o", "")])),
        ("an owner of 65 bytes", live(&[("o", "ooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooo")])),
        ("a done record with an owner", done(&[("o", "w")])),
        // What the hostile probe of issue 35 left for idem_scan.
        ("a user's hash with a lease of text", pairs(&[("s", "p"), ("a", "34"), ("l", "en")])),
        ("a user's hash with a phase and an attempt", pairs(&[("s", "d"), ("a", "5")])),
        ("a done record with attempt 1.5", done(&[("a", "1.5")])),
    ]
}

/// Writes each malformed hash as `hash:<i>` (`L` in a value: a lease end
/// ten minutes ahead); returns the keys with what each is.
fn write_malformed(con: &mut redis::Connection) -> Vec<(String, String)> {
    let lease_end = (server_ms(con) + 600_000).to_string();
    let mut written = Vec::new();
    for (i, (what, fields)) in malformed().into_iter().enumerate() {
        let key = format!("hash:{i}");
        let mut hset = redis::cmd("HSET");
        hset.arg(&key);
        for (name, value) in &fields {
            hset.arg(*name).arg(if value == "L" { lease_end.as_str() } else { value.as_str() });
        }
        let _: i64 = hset.query(con).unwrap();
        written.push((key, format!("{what} {fields:?}")));
    }
    written
}

/// Every function, with arguments that would write if the hash were a
/// record (the token is the hash's, where it has one).
fn calls() -> Vec<(&'static str, Vec<String>)> {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect();
    vec![
        ("idem_claim", s(&["30"])),
        ("idem_claim", s(&["30", "PAYLOAD", "p", "MAXTRIES", "5"])),
        ("idem_done", s(&[TOKEN, "RESULT", "r"])),
        ("idem_release", s(&[TOKEN])),
        ("idem_extend", s(&[TOKEN, "30"])),
        ("idem_once", s(&["30"])),
        ("idem_get", vec![]),
    ]
}

fn hgetall(con: &mut redis::Connection, key: &str) -> BTreeMap<Vec<u8>, Vec<u8>> {
    redis::cmd("HGETALL").arg(key).query(con).unwrap()
}

#[test]
fn every_function_answers_wrongtype_for_a_hash_that_is_not_a_record() {
    let server = library_server(&[]);
    let mut con = server.conn();
    for (key, what) in write_malformed(&mut con) {
        let before = hgetall(&mut con, &key);
        for (function, args) in calls() {
            let reply = fcall(&mut con, function, &key, &args);
            match reply {
                Err(e) => assert_eq!(err_text(&e), WRONGTYPE, "{function} {args:?} on {what}"),
                Ok(v) => panic!("{function} {args:?} on {what} answered {v:?}"),
            }
            assert_eq!(hgetall(&mut con, &key), before, "{function} on {what} changed the hash");
            assert_eq!(pexpiretime(&mut con, &key), -1, "{function} on {what} set an expiry");
        }
        let reply = redis::cmd("FCALL_RO").arg("idem_get").arg(1).arg(&key).query::<redis::Value>(&mut con);
        assert_eq!(reply.map_err(|e| err_text(&e)), Err(WRONGTYPE.to_string()), "FCALL_RO idem_get on {what}");
    }
}

/// The records the functions write are still records, in every state,
/// through every function: the check turns nothing real away.
#[test]
fn records_in_every_state_pass_the_check() {
    let server = library_server(&[]);
    let mut con = server.conn();
    // processing, with a fingerprint
    let (status, _, _) = fclaim(&mut con, "p", 30, &["PAYLOAD", "x"]);
    assert_eq!(status, "NEW");
    assert_eq!(fclaim(&mut con, "p", 30, &[]).0, "BUSY");
    // released, then claimed again, then done with a result
    let token = fclaim_new(&mut con, "r", 30);
    assert_eq!(fint(&mut con, "idem_release", "r", &token), Ok(1));
    assert_eq!(fget(&mut con, "r").map(|f| f["state"].clone()), Some(redis::Value::SimpleString("released".into())));
    let (status, token, attempt) = fclaim(&mut con, "r", 30, &[]);
    assert_eq!((status.as_str(), attempt), ("RETRY", 2));
    let token = common::reply::as_token(&token);
    assert_eq!(fint(&mut con, "idem_extend", "r", (&token, 60)), Ok(1));
    assert_eq!(fint(&mut con, "idem_done", "r", (&token, "RESULT", "ok")), Ok(1));
    let (status, result, attempt) = fclaim(&mut con, "r", 30, &[]);
    assert_eq!((status.as_str(), common::reply::as_bytes(&result), attempt), ("DONE", Some(b"ok".to_vec()), 2));
    // done by ONCE, and by a late DONE on a missing key (attempt 0)
    assert_eq!(fint(&mut con, "idem_once", "o", 30), Ok(1));
    assert_eq!(fint(&mut con, "idem_once", "o", 30), Ok(0));
    assert_eq!(fint(&mut con, "idem_done", "late", TOKEN), Ok(1));
    assert_eq!(fint(&mut con, "idem_done", "late", TOKEN), Ok(0));
    assert_eq!(fclaim(&mut con, "late", 30, &[]).0, "DONE");
    for key in ["p", "r", "o", "late"] {
        assert!(fget(&mut con, key).is_some(), "{key}");
    }
}

/// A whole `FCALL_RO idem_scan 0 cursor COUNT 7 <filters>` iteration: the
/// keys listed, or the first error.
fn scan_all(con: &mut redis::Connection, filters: &[&str]) -> Result<BTreeSet<String>, String> {
    let mut keys = BTreeSet::new();
    let mut cursor = "0".to_string();
    loop {
        let (next, found): (String, Vec<String>) = redis::cmd("FCALL_RO")
            .arg("idem_scan")
            .arg(0)
            .arg(&cursor)
            .arg("COUNT")
            .arg(7)
            .arg(filters)
            .query(con)
            .map_err(|e| err_text(&e))?;
        keys.extend(found);
        if next == "0" {
            return Ok(keys);
        }
        cursor = next;
    }
}

/// idem_scan reads each hash through the reader every other function uses
/// (issue 35): a user's hash is never listed and never makes it fail,
/// whatever it holds, and every record is listed as its filters say.
#[test]
fn idem_scan_lists_records_only_and_never_fails_on_a_hash() {
    let server = library_server(&[]);
    let mut con = server.conn();
    let written = write_malformed(&mut con);
    assert!(written.len() > 30);
    // One record in each state, one of them claimed twice.
    let _ = fclaim_new(&mut con, "rec:processing", 600);
    let token = fclaim_new(&mut con, "rec:released", 600);
    assert_eq!(fint(&mut con, "idem_release", "rec:released", &token), Ok(1));
    let token = fclaim_new(&mut con, "rec:done", 600);
    assert_eq!(fint(&mut con, "idem_done", "rec:done", (&token, "RESULT", "ok")), Ok(1));
    let token = fclaim_new(&mut con, "rec:twice", 600);
    assert_eq!(fint(&mut con, "idem_release", "rec:twice", &token), Ok(1));
    assert_eq!(fclaim(&mut con, "rec:twice", 600, &[]).0, "RETRY");
    assert_eq!(fint(&mut con, "idem_once", "rec:once", 600), Ok(1));
    let set = |keys: &[&str]| keys.iter().map(|k| k.to_string()).collect::<BTreeSet<String>>();
    let cases: [(&[&str], BTreeSet<String>); 7] = [
        (&[], set(&["rec:processing", "rec:released", "rec:done", "rec:twice", "rec:once"])),
        (&["STATE", "processing"], set(&["rec:processing", "rec:twice"])),
        (&["STATE", "released"], set(&["rec:released"])),
        (&["STATE", "done"], set(&["rec:done", "rec:once"])),
        (&["STATE", "expired"], set(&[])),
        (&["MINTRIES", "2"], set(&["rec:twice"])),
        (&["IDLE", "100000"], set(&[])),
    ];
    for (filters, expected) in cases {
        assert_eq!(scan_all(&mut con, filters), Ok(expected), "idem_scan {filters:?}");
    }
    // MATCH on the user's hashes alone lists nothing, one COUNT at a time.
    assert_eq!(scan_all(&mut con, &["MATCH", "hash:*"]), Ok(BTreeSet::new()));
    for (key, what) in &written {
        assert_eq!(scan_all(&mut con, &["MATCH", key]), Ok(BTreeSet::new()), "{what}");
    }
}
