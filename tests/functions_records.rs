//! What the Functions edition takes for a record (docs/functions.md, "A
//! record"): a string packed exactly as the library writes it. Any other
//! string, a user's or a damaged record, answers `WRONGTYPE` from every
//! function, as the module answers for a key of another type: never a Lua
//! error, a wrong reply, a write into the user's string, or a place in
//! `idem_scan`'s list. (Hash records of earlier builds: tests/functions_upgrade.rs.)
#[allow(dead_code)] // each test binary uses part of common/
mod common;

use common::commands::{pexpiretime, server_ms};
use common::functions::{
    Packed, Stored, TOKEN, assert_refused, fcall, fclaim, fclaim_new, fget, fint, library_server, scan_all, stored,
    write_malformed_hashes,
};
use common::reply::{as_bytes, as_token, f_bytes, f_int, f_str, parse_claim};
use std::collections::BTreeSet;

const FP: &[u8] = b"00112233445566778899aabbccddeeff";

/// One well-formed record of each kind, at `now` (Unix ms): the lease of
/// the processing one runs ten minutes more.
fn valid_records(now: u64) -> Vec<(&'static str, Packed)> {
    let claim = Packed { phase: b'p', attempt: 1, claimed: now - 1000, at: now + 600_000, ..Default::default() };
    vec![
        ("processing", Packed { token: Some(TOKEN.into()), ..claim.clone() }),
        (
            "processing, every option",
            Packed {
                attempt: 3,
                token: Some(TOKEN.into()),
                fp: Some(FP.into()),
                base: Some(1),
                extended: Some(now - 500),
                owner: Some(b"w\0\xff:1".to_vec()),
                ..claim.clone()
            },
        ),
        ("released", Packed { phase: b'r', attempt: 2, at: now - 100, token: Some(TOKEN.into()), ..claim.clone() }),
        ("requeued", Packed { phase: b'r', attempt: 2, at: now - 100, base: Some(2), ..claim.clone() }),
        (
            "done, with a result",
            Packed {
                phase: b'd',
                attempt: 4,
                at: now - 50,
                fp: Some(FP.into()),
                base: Some(1),
                result: Some(b"\0r\xff".to_vec()),
                ..claim.clone()
            },
        ),
        ("done by ONCE", Packed { phase: b'd', attempt: 0, claimed: 0, at: now, ..Default::default() }),
    ]
}

/// Strings that are not records: a user's, and each kind of damage to a
/// well-formed record.
fn malformed_strings(now: u64) -> Vec<(String, Vec<u8>)> {
    let records: Vec<Packed> = valid_records(now).into_iter().map(|(_, p)| p).collect();
    let (live, full, done) = (records[0].clone(), records[1].clone(), records[5].clone());
    let mut cases: Vec<(String, Vec<u8>)> =
        [&b""[..], b"x", b"{\"state\": \"done\"}", b"\x01", b"\x01p", b"\x01d\x00", &[0u8; 24], &[1u8; 64]]
            .iter()
            .map(|s| (format!("a user's string {s:?}"), s.to_vec()))
            .collect();
    // Every cut of records without a result, and one byte too many.
    for (what, record) in [("processing", &live), ("processing with options", &full), ("done", &done)] {
        let bytes = record.bytes();
        for cut in 1..bytes.len() {
            cases.push((format!("{what}, cut to {cut} bytes"), bytes[..cut].to_vec()));
        }
        cases.push((format!("{what}, a byte more"), [bytes.clone(), b"x".to_vec()].concat()));
    }
    let mut damaged = |what: &str, bytes: Vec<u8>| cases.push((what.to_string(), bytes));
    let with = |base: &Packed, change: &dyn Fn(&mut Packed)| {
        let mut p = base.clone();
        change(&mut p);
        p.bytes()
    };
    let mut version = live.bytes();
    version[0] = 2;
    damaged("version 2", version);
    for flag in [64u8, 128] {
        let mut bytes = live.bytes();
        bytes[2] |= flag;
        damaged(&format!("an unknown flag {flag}"), bytes);
    }
    damaged("phase x", with(&live, &|p| p.phase = b'x'));
    damaged("phase P", with(&live, &|p| p.phase = b'P'));
    damaged("attempt 2^53", with(&live, &|p| p.attempt = 1 << 53));
    damaged("claimed_at 2^53", with(&live, &|p| p.claimed = 1 << 53));
    damaged("lease end 2^55", with(&live, &|p| p.at = 1 << 55));
    damaged("an upper-case token", with(&live, &|p| p.token = Some(TOKEN.to_uppercase().into())));
    damaged("a token with a g", with(&live, &|p| p.token = Some(b"g123456789abcdef0123456789abcdef".to_vec())));
    damaged("a fingerprint of text", with(&full, &|p| p.fp = Some(b"not a fingerprint at all, 32 ch.".to_vec())));
    damaged("a tries base above the attempt", with(&full, &|p| p.base = Some(4)));
    damaged("extension time 2^53", with(&full, &|p| p.extended = Some(1 << 53)));
    damaged("an empty owner", with(&full, &|p| p.owner = Some(vec![])));
    damaged("an owner of 65 bytes", with(&full, &|p| p.owner = Some(vec![b'o'; 65])));
    let mut past_end = full.bytes();
    let owner_at = past_end.len() - 6;
    past_end[owner_at] = 7;
    damaged("an owner longer than what follows", past_end);
    damaged("a result while processing", with(&live, &|p| p.result = Some(b"r".to_vec())));
    damaged("attempt 0 while processing", with(&live, &|p| p.attempt = 0));
    damaged("processing without a token", with(&live, &|p| p.token = None));
    damaged("released without a token or a tries base", with(&live, &|p| (p.phase, p.token) = (b'r', None)));
    damaged(
        "requeued with an owner",
        with(&live, &|p| (p.phase, p.token, p.base, p.owner) = (b'r', None, Some(1), Some(b"w".to_vec()))),
    );
    damaged("released, extended", with(&live, &|p| (p.phase, p.extended) = (b'r', Some(now))));
    damaged("released with a result", with(&live, &|p| (p.phase, p.result) = (b'r', Some(vec![]))));
    damaged("done with a token", with(&done, &|p| p.token = Some(TOKEN.into())));
    damaged("done with an owner", with(&done, &|p| p.owner = Some(b"w".to_vec())));
    damaged("done, extended", with(&done, &|p| p.extended = Some(now)));
    cases
}

/// The format as docs/functions.md writes it down is what the library
/// reads: records crafted from it answer as records, every field in place.
#[test]
fn crafted_records_read_as_the_format_says() {
    let server = library_server(&[]);
    let mut con = server.conn();
    let now = server_ms(&mut con) as u64;
    for (what, record) in valid_records(now) {
        let _: () = redis::cmd("SET").arg(what).arg(record.bytes()).query(&mut con).unwrap();
        let fields = fget(&mut con, what).unwrap_or_else(|| panic!("{what}: nil"));
        assert_eq!(f_int(&fields, "attempt") as u64, record.attempt, "{what}");
        assert_eq!(f_int(&fields, "claimed_at") as u64, record.claimed, "{what}");
        assert_eq!(f_int(&fields, "tries") as u64, record.attempt - record.base.unwrap_or(0), "{what}");
        assert_eq!(f_bytes(&fields, "fingerprint"), record.fp, "{what}");
        assert_eq!(f_bytes(&fields, "owner"), record.owner, "{what}");
        assert_eq!(f_bytes(&fields, "result"), record.result, "{what}");
        let state = f_str(&fields, "state");
        assert_eq!(state.as_bytes()[0], record.phase, "{what}: {state}");
        if record.phase == b'd' {
            assert_eq!(f_int(&fields, "done_at") as u64, record.at, "{what}");
        }
    }
    // And the functions act on them.
    assert_eq!(fclaim(&mut con, "processing", 30, &[]).0, "BUSY");
    assert_eq!(fint(&mut con, "idem_done", "processing", TOKEN.to_uppercase()), Ok(1));
    let (status, _, attempt) = fclaim(&mut con, "released", 30, &[]);
    assert_eq!((status.as_str(), attempt), ("RETRY", 3));
    let (status, _, attempt) = fclaim(&mut con, "requeued", 30, &["MAXTRIES", "1"]);
    assert_eq!((status.as_str(), attempt), ("RETRY", 3));
    let (status, result, _) = fclaim(&mut con, "done, with a result", 30, &["PAYLOAD", "other"]);
    assert_eq!((status.as_str(), as_bytes(&result)), ("MISMATCH", None));
    assert_eq!(f_int(&fget(&mut con, "requeued").unwrap(), "tries"), 1);
}

#[test]
fn every_function_answers_wrongtype_for_a_string_that_is_not_a_record() {
    let server = library_server(&[]);
    let mut con = server.conn();
    let now = server_ms(&mut con) as u64;
    let cases = malformed_strings(now);
    assert!(cases.len() > 150, "{} cases", cases.len());
    for (i, (what, bytes)) in cases.iter().enumerate() {
        let key = format!("string:{i}");
        let _: () = redis::cmd("SET").arg(&key).arg(bytes).query(&mut con).unwrap();
        assert_refused(&mut con, &key, what);
    }
    assert_eq!(scan_all(&mut con, &[]), Ok(BTreeSet::new()), "idem_scan listed a string that is no record");
}

/// The records the functions write are records, in every state, through
/// every function: the check turns nothing real away. Each is one string.
#[test]
fn records_in_every_state_pass_the_check() {
    let server = library_server(&[]);
    let mut con = server.conn();
    // processing, with a fingerprint
    let (status, _, _) = fclaim(&mut con, "p", 30, &["PAYLOAD", "x", "OWNER", "w"]);
    assert_eq!(status, "NEW");
    assert_eq!(fclaim(&mut con, "p", 30, &[]).0, "BUSY");
    // released, then claimed again, extended, then done with a result
    let token = fclaim_new(&mut con, "r", 30);
    assert_eq!(fint(&mut con, "idem_release", "r", &token), Ok(1));
    assert_eq!(f_str(&fget(&mut con, "r").unwrap(), "state"), "released");
    let (status, token, attempt) = fclaim(&mut con, "r", 30, &[]);
    assert_eq!((status.as_str(), attempt), ("RETRY", 2));
    let token = as_token(&token);
    assert_eq!(fint(&mut con, "idem_extend", "r", (&token, 60)), Ok(1));
    assert_eq!(fint(&mut con, "idem_done", "r", (&token, "RESULT", "ok")), Ok(1));
    let (status, result, attempt) = fclaim(&mut con, "r", 30, &[]);
    assert_eq!((status.as_str(), as_bytes(&result), attempt), ("DONE", Some(b"ok".to_vec()), 2));
    // requeued, done by ONCE, and by a late DONE on a missing key (attempt 0)
    assert_eq!(fint(&mut con, "idem_requeue", "r", &[] as &[&str]), Ok(1));
    assert_eq!(fint(&mut con, "idem_once", "o", 30), Ok(1));
    assert_eq!(fint(&mut con, "idem_once", "o", 30), Ok(0));
    assert_eq!(fint(&mut con, "idem_done", "late", TOKEN), Ok(1));
    assert_eq!(fint(&mut con, "idem_done", "late", TOKEN), Ok(0));
    assert_eq!(fclaim(&mut con, "late", 30, &[]).0, "DONE");
    for key in ["p", "r", "o", "late"] {
        assert!(fget(&mut con, key).is_some(), "{key}");
        match stored(&mut con, key) {
            Stored::String(bytes) => assert_eq!(bytes[0], 1, "{key}: the format's version"),
            other => panic!("{key}: {other:?}"),
        }
        assert!(pexpiretime(&mut con, key) > 0, "{key} has no expiry");
    }
}

/// Results and owners are any bytes, kept exactly.
#[test]
fn results_and_owners_are_binary_safe() {
    let server = library_server(&[]);
    let mut con = server.conn();
    let every_byte: Vec<u8> = (0..=255).collect();
    let owner: Vec<u8> = (0..64).map(|i| (i * 4 + 3) as u8).collect();
    let claim = |con: &mut redis::Connection, key: &str| {
        let reply = redis::cmd("FCALL").arg("idem_claim").arg(1).arg(key).arg(30).arg("OWNER").arg(&owner).query(con);
        parse_claim(reply.unwrap())
    };
    let (_, token, _) = claim(&mut con, "job");
    assert_eq!(f_bytes(&fget(&mut con, "job").unwrap(), "owner"), Some(owner.clone()));
    let done = fcall(&mut con, "idem_done", "job", (as_token(&token), "RESULT", &every_byte));
    assert_eq!(done.map_err(|e| e.to_string()), Ok(redis::Value::Int(1)));
    let (status, result, _) = claim(&mut con, "job");
    assert_eq!((status.as_str(), as_bytes(&result)), ("DONE", Some(every_byte.clone())));
    assert_eq!(f_bytes(&fget(&mut con, "job").unwrap(), "result"), Some(every_byte));
    // An empty result is replayed as empty, not as nil.
    let (_, token, _) = claim(&mut con, "empty");
    assert_eq!(fint(&mut con, "idem_done", "empty", (as_token(&token), "RESULT", "")), Ok(1));
    assert_eq!(as_bytes(&claim(&mut con, "empty").1), Some(vec![]));
}

/// idem_scan reads each key through the reader every other function uses
/// (issue 35): a user's string or hash is never listed and never makes it
/// fail, whatever it holds, and every record is listed as its filters say.
#[test]
fn idem_scan_lists_records_only_and_never_fails_on_a_users_key() {
    let server = library_server(&[]);
    let mut con = server.conn();
    let written = write_malformed_hashes(&mut con);
    let now = server_ms(&mut con) as u64;
    for (i, (_, bytes)) in malformed_strings(now).iter().enumerate() {
        let _: () = redis::cmd("SET").arg(format!("string:{i}")).arg(bytes).query(&mut con).unwrap();
    }
    // Long strings: idem_scan reads the part a record without a result
    // would fill, and takes the rest for a result only where flagged.
    let _: () = redis::cmd("SET").arg("user:long").arg(vec![b'x'; 10_000]).query(&mut con).unwrap();
    let record_then_more = [valid_records(now)[1].1.bytes(), vec![b'x'; 500]].concat();
    let _: () = redis::cmd("SET").arg("user:record-then-more").arg(record_then_more).query(&mut con).unwrap();
    let _: () = redis::cmd("RPUSH").arg("user:list").arg("x").query(&mut con).unwrap();
    // One record in each state, one of them claimed twice.
    let _ = fclaim_new(&mut con, "rec:processing", 600);
    let token = fclaim_new(&mut con, "rec:released", 600);
    assert_eq!(fint(&mut con, "idem_release", "rec:released", &token), Ok(1));
    let token = fclaim_new(&mut con, "rec:done", 600);
    let long_result = "r".repeat(5000);
    assert_eq!(fint(&mut con, "idem_done", "rec:done", (&token, "RESULT", &long_result)), Ok(1));
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
    // MATCH on the user's keys alone lists nothing, one at a time.
    for pattern in ["hash:*", "string:*", "user:*"] {
        assert_eq!(scan_all(&mut con, &["MATCH", pattern]), Ok(BTreeSet::new()), "{pattern}");
    }
    for (key, what) in &written {
        assert_eq!(scan_all(&mut con, &["MATCH", key]), Ok(BTreeSet::new()), "{what}");
    }
}
