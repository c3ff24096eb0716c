//! Record command behaviour: IDEM.CLAIM / DONE / RELEASE / EXTEND / GET /
//! ONCE, and their BLOOM option, against a real server.
#[allow(dead_code)] // each test binary uses part of common/
mod common;

#[path = "records/operations.rs"]
mod operations;

use common::clock::{sleep_until, timed};
use common::commands::{
    bf_add, bf_exists, bf_info, claim, claim_new, claim_new_opts, claim_opts, digest_value, done, exists, extend,
    fingerprint_hex, get_fields, get_opt, idem_counters, once, pexpiretime, pttl, release, server_ms,
};
use common::fixtures::{BIN_RESULT, NONE, assert_same_record, snapshot};
use common::reply::{
    as_int, as_token, expect_err, f_bytes, f_int, f_str, fields_from_reply, int, parse_claim, q, random_token,
};
use common::server::Server;
use common::{HISTORY_MS, RETAIN_MS};
use redis::Value;
use std::time::{Duration, Instant};

/// Sleeps until a 1 s lease taken now has surely lapsed.
fn let_one_second_lease_lapse() {
    std::thread::sleep(Duration::from_millis(1150));
}

fn assert_stale(r: Result<i64, String>, what: &str) {
    match r {
        Err(e) if e.starts_with("STALE") => {}
        other => panic!("{what}: expected a STALE error, got {other:?}"),
    }
}

#[test]
fn claim_new_creates_processing_record() {
    let s = Server::start();
    let mut con = s.conn();
    let t0 = server_ms(&mut con);
    let reply: Value = q(&mut con, "IDEM.CLAIM", ("order:1", 30)).unwrap();
    let t1 = server_ms(&mut con);
    // Reply shape: [simple string status, bulk token, integer attempt].
    let Value::Array(items) = &reply else { panic!("CLAIM reply not an array: {reply:?}") };
    assert_eq!(items.len(), 3, "{reply:?}");
    assert_eq!(items[0], Value::SimpleString("NEW".into()), "status is a simple string: {reply:?}");
    let token = as_token(&items[1]);
    assert_eq!(items[2], Value::Int(1));

    let f = get_fields(&mut con, "order:1");
    assert_eq!(f_str(&f, "state"), "processing");
    assert_eq!(f_int(&f, "attempt"), 1);
    let claimed_at = f_int(&f, "claimed_at");
    assert!(t0 <= claimed_at && claimed_at <= t1, "claimed_at {claimed_at} not in [{t0}, {t1}]");
    let lease_ms = f_int(&f, "lease_ms");
    assert!(lease_ms > 28_000 && lease_ms <= 30_000, "lease_ms {lease_ms}");
    assert_eq!(f_int(&f, "done_at"), 0);
    assert_eq!(f["result"], Value::Nil);
    assert_eq!(f["fingerprint"], Value::Nil);
    // The key expires at lease end + history, exactly.
    let expiry = pexpiretime(&mut con, "order:1");
    assert_eq!(expiry, claimed_at + 30_000 + HISTORY_MS, "PEXPIRETIME = claimed_at + lease + history");
    let pttl_field = f_int(&f, "pttl");
    let key_pttl = pttl(&mut con, "order:1");
    assert!((pttl_field - key_pttl).abs() < 1000, "pttl field {pttl_field} vs PTTL {key_pttl}");
    assert!(pttl_field > 30_000 + HISTORY_MS - 2000 && pttl_field <= 30_000 + HISTORY_MS);

    // Tokens are per claim: another key gets another token.
    let other = claim_new(&mut con, "order:2", 30);
    assert_ne!(token, other);
}

#[test]
fn claim_busy_while_lease_is_live() {
    let s = Server::start();
    let mut con = s.conn();
    let token = claim_new(&mut con, "k", 20);
    let before = snapshot(&mut con, "k");
    let (status, value, attempt) = claim(&mut con, "k", 50);
    assert_eq!(status, "BUSY");
    assert_eq!(attempt, 1);
    let left = as_int(&value);
    assert!(left > 18_000 && left <= 20_000, "BUSY ms left: {left}");
    // BUSY changes nothing (not even the lease: the second lease was 50 s).
    assert_same_record(&before, &snapshot(&mut con, "k"), 1000, "after BUSY");
    // Options do not turn BUSY into something else.
    let (status, _, _) = claim_opts(&mut con, "k", 50, &["MAXTRIES", "1"]);
    assert_eq!(status, "BUSY", "BUSY comes before EXHAUSTED");
    let (status, _, _) = claim_opts(&mut con, "k", 50, &["PAYLOAD", "x"]);
    assert_eq!(status, "BUSY", "no fingerprint stored: no MISMATCH");
    // A BUSY claim carrying a PAYLOAD does not store its fingerprint.
    assert_eq!(get_fields(&mut con, "k")["fingerprint"], Value::Nil);
    assert_eq!(done(&mut con, "k", &token, NONE), Ok(1));
}

#[test]
fn done_records_result_and_claim_replays_it() {
    let s = Server::start();
    let mut con = s.conn();
    let token = claim_new(&mut con, "k", 30);
    let claimed_at = f_int(&get_fields(&mut con, "k"), "claimed_at");
    let t0 = server_ms(&mut con);
    assert_eq!(done(&mut con, "k", &token, ("RESULT", "order-42")), Ok(1));
    let t1 = server_ms(&mut con);

    let f = get_fields(&mut con, "k");
    assert_eq!(f_str(&f, "state"), "done");
    assert_eq!(f_int(&f, "attempt"), 1);
    assert_eq!(f_int(&f, "lease_ms"), 0);
    assert_eq!(f_int(&f, "claimed_at"), claimed_at, "claimed_at kept");
    let done_at = f_int(&f, "done_at");
    assert!(t0 <= done_at && done_at <= t1, "done_at {done_at} not in [{t0}, {t1}]");
    assert_eq!(f_bytes(&f, "result").as_deref(), Some(&b"order-42"[..]));
    assert_eq!(pexpiretime(&mut con, "k"), done_at + RETAIN_MS, "done: done_at + idem.retain");

    let (status, value, attempt) = claim(&mut con, "k", 30);
    assert_eq!((status.as_str(), value, attempt), ("DONE", Value::BulkString(b"order-42".to_vec()), 1));
    // DONE again: 0 whatever the token, nothing changes.
    let before = snapshot(&mut con, "k");
    assert_eq!(done(&mut con, "k", &token, ("RESULT", "other")), Ok(0));
    assert_eq!(done(&mut con, "k", &random_token(), NONE), Ok(0));
    assert_same_record(&before, &snapshot(&mut con, "k"), 50, "DONE on a done record");

    // Without RESULT: CLAIM answers DONE with nil. RETAIN sets the retention.
    let token = claim_new(&mut con, "k2", 30);
    assert_eq!(done(&mut con, "k2", &token, ("RETAIN", 120)), Ok(1));
    let f = get_fields(&mut con, "k2");
    assert_eq!(f["result"], Value::Nil);
    assert_eq!(pexpiretime(&mut con, "k2"), f_int(&f, "done_at") + 120_000, "RETAIN 120");
    let (status, value, attempt) = claim(&mut con, "k2", 30);
    assert_eq!((status.as_str(), value, attempt), ("DONE", Value::Nil, 1));
}

#[test]
fn binary_and_empty_results_round_trip() {
    let s = Server::start();
    let mut con = s.conn();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("bin", BIN_RESULT.to_vec()),
        ("nul", vec![0u8; 5]),
        ("high", (0u8..=255).collect()),
        ("empty", Vec::new()),
        ("big", vec![b'x'; 100_000]),
    ];
    for (key, result) in &cases {
        let token = claim_new(&mut con, key, 30);
        assert_eq!(done(&mut con, key, &token, ("RESULT", result.as_slice())), Ok(1), "{key}");
        let (status, value, _) = claim(&mut con, key, 30);
        assert_eq!(status, "DONE");
        assert_eq!(value, Value::BulkString(result.clone()), "{key}: CLAIM replays the exact bytes");
        let f = get_fields(&mut con, key);
        assert_eq!(f["result"], Value::BulkString(result.clone()), "{key}: GET shows the exact bytes");
    }
}

#[test]
fn max_result_config_bounds_result() {
    let s = Server::with_args(&["max-result", "10"], &[]);
    let mut con = s.conn();
    let cfg: Vec<String> = redis::cmd("CONFIG").arg("GET").arg("idem.max-result").query(&mut con).unwrap();
    assert_eq!(cfg, vec!["idem.max-result", "10"]);
    let token = claim_new(&mut con, "k", 30);
    let before = snapshot(&mut con, "k");
    let e = done(&mut con, "k", &token, ("RESULT", "01234567890")).unwrap_err();
    assert!(e.starts_with("ERR") && e.contains("max-result"), "11 bytes over max-result 10: {e}");
    assert_same_record(&before, &snapshot(&mut con, "k"), 50, "refused RESULT");
    assert_eq!(done(&mut con, "k", &token, ("RESULT", "0123456789")), Ok(1), "exactly max-result");

    let _: () = redis::cmd("CONFIG").arg("SET").arg("idem.max-result").arg(0).query(&mut con).unwrap();
    let token = claim_new(&mut con, "k2", 30);
    let e = done(&mut con, "k2", &token, ("RESULT", "x")).unwrap_err();
    assert!(e.contains("max-result"), "{e}");
    assert_eq!(done(&mut con, "k2", &token, ("RESULT", "")), Ok(1), "empty result with max-result 0");
    let (_, v, _) = claim(&mut con, "k2", 30);
    assert_eq!(v, Value::BulkString(vec![]));
}

#[test]
fn release_then_retry() {
    let s = Server::start();
    let mut con = s.conn();
    let t1 = claim_new(&mut con, "k", 60);
    let claimed_at = f_int(&get_fields(&mut con, "k"), "claimed_at");
    let before = server_ms(&mut con);
    assert_eq!(release(&mut con, "k", &t1), 1);
    let after = server_ms(&mut con);
    let f = get_fields(&mut con, "k");
    assert_eq!(f_str(&f, "state"), "released");
    assert_eq!(f_int(&f, "attempt"), 1);
    assert_eq!(f_int(&f, "lease_ms"), 0);
    assert_eq!(f_int(&f, "claimed_at"), claimed_at);
    assert_eq!(f_int(&f, "done_at"), 0);
    let exp = pexpiretime(&mut con, "k");
    assert!(
        before + HISTORY_MS <= exp && exp <= after + HISTORY_MS,
        "released: PEXPIRETIME {exp} should be release time + history, in [{}, {}]",
        before + HISTORY_MS,
        after + HISTORY_MS
    );
    // Releasing again, or with another token: 0, nothing changes.
    let snap = snapshot(&mut con, "k");
    assert_eq!(release(&mut con, "k", &t1), 0);
    assert_eq!(release(&mut con, "k", &random_token()), 0);
    assert_same_record(&snap, &snapshot(&mut con, "k"), 50, "RELEASE on released");
    // EXTEND on a released record: STALE.
    assert_stale(extend(&mut con, "k", &t1, 30), "EXTEND on released");
    assert_same_record(&snap, &snapshot(&mut con, "k"), 50, "EXTEND on released");

    let (status, value, attempt) = claim(&mut con, "k", 60);
    assert_eq!((status.as_str(), attempt), ("RETRY", 2));
    let t2 = as_token(&value);
    assert_ne!(t1, t2);
    assert_eq!(f_int(&get_fields(&mut con, "k"), "attempt"), 2);
    // The first token is superseded.
    assert_eq!(release(&mut con, "k", &t1), 0);
    assert_stale(done(&mut con, "k", &t1, NONE), "DONE with superseded token");
    assert_stale(extend(&mut con, "k", &t1, 30), "EXTEND with superseded token");
    assert_eq!(release(&mut con, "k", &t2), 1);
    let (status, value, attempt) = claim(&mut con, "k", 60);
    assert_eq!((status.as_str(), attempt), ("RETRY", 3));
    let t3 = as_token(&value);
    assert!(t3 != t1 && t3 != t2);
    assert_eq!(done(&mut con, "k", &t3, NONE), Ok(1));
}

#[test]
fn done_after_release_with_latest_token_completes() {
    let s = Server::start();
    let mut con = s.conn();
    let t = claim_new(&mut con, "k", 60);
    assert_eq!(release(&mut con, "k", &t), 1);
    assert_eq!(done(&mut con, "k", &t, ("RESULT", "late")), Ok(1), "released, nobody claimed since");
    let f = get_fields(&mut con, "k");
    assert_eq!(f_str(&f, "state"), "done");
    assert_eq!(f_int(&f, "attempt"), 1);
}

#[test]
fn lapsed_leases() {
    let s = Server::start();
    let mut con = s.conn();
    let keys = ["rel", "late", "ext", "retry", "exh", "exh2"];
    let mut tokens = std::collections::HashMap::new();
    for k in keys {
        tokens.insert(k, claim_new(&mut con, k, 1));
    }
    let claimed_at = f_int(&get_fields(&mut con, "late"), "claimed_at");
    let_one_second_lease_lapse();

    // An expired record.
    let f = get_fields(&mut con, "rel");
    assert_eq!(f_str(&f, "state"), "expired");
    assert_eq!(f_int(&f, "lease_ms"), 0);
    assert_eq!(f_int(&f, "attempt"), 1);
    let exp = pexpiretime(&mut con, "rel");
    let claimed = f_int(&f, "claimed_at");
    assert_eq!(exp, claimed + 1000 + HISTORY_MS, "expired record: lease end + history");

    // RELEASE after the lapse: 0, nothing changes.
    let before = snapshot(&mut con, "rel");
    assert_eq!(release(&mut con, "rel", &tokens["rel"]), 0);
    assert_same_record(&before, &snapshot(&mut con, "rel"), 50, "RELEASE after lapse");
    let (status, _, attempt) = claim(&mut con, "rel", 10);
    assert_eq!((status.as_str(), attempt), ("RETRY", 2));

    // Late DONE, nobody claimed since: recorded.
    assert_eq!(done(&mut con, "late", &tokens["late"], ("RESULT", "r")), Ok(1));
    let f = get_fields(&mut con, "late");
    assert_eq!(f_str(&f, "state"), "done");
    assert_eq!(f_int(&f, "attempt"), 1);
    assert_eq!(f_int(&f, "claimed_at"), claimed_at);
    let (status, value, _) = claim(&mut con, "late", 10);
    assert_eq!((status.as_str(), value), ("DONE", Value::BulkString(b"r".to_vec())));

    // EXTEND after the lapse, nobody claimed since: the lease is live again.
    let t0 = server_ms(&mut con);
    assert_eq!(extend(&mut con, "ext", &tokens["ext"], 40), Ok(1));
    let t1 = server_ms(&mut con);
    let f = get_fields(&mut con, "ext");
    assert_eq!(f_str(&f, "state"), "processing");
    assert_eq!(f_int(&f, "attempt"), 1);
    let lease = f_int(&f, "lease_ms");
    assert!(lease > 38_000 && lease <= 40_000, "lease_ms {lease}");
    let exp = pexpiretime(&mut con, "ext");
    assert!(
        t0 + 40_000 + HISTORY_MS <= exp && exp <= t1 + 40_000 + HISTORY_MS,
        "EXTEND: PEXPIRETIME {exp} = now + lease + history"
    );
    let (status, _, attempt) = claim(&mut con, "ext", 10);
    assert_eq!((status.as_str(), attempt), ("BUSY", 1));

    // Someone else claims: the lapsed holder's token is refused.
    let (status, value, attempt) = claim(&mut con, "retry", 10);
    assert_eq!((status.as_str(), attempt), ("RETRY", 2));
    let new_token = as_token(&value);
    assert_ne!(new_token, tokens["retry"]);
    let before = snapshot(&mut con, "retry");
    assert_stale(done(&mut con, "retry", &tokens["retry"], ("RESULT", "x")), "DONE by lapsed holder");
    assert_stale(extend(&mut con, "retry", &tokens["retry"], 10), "EXTEND by lapsed holder");
    assert_eq!(release(&mut con, "retry", &tokens["retry"]), 0);
    assert_same_record(&before, &snapshot(&mut con, "retry"), 50, "lapsed holder");
    assert_eq!(done(&mut con, "retry", &new_token, NONE), Ok(1));

    // MAXTRIES on an expired record.
    let before = snapshot(&mut con, "exh");
    let (status, value, attempt) = claim_opts(&mut con, "exh", 10, &["MAXTRIES", "1"]);
    assert_eq!((status.as_str(), value, attempt), ("EXHAUSTED", Value::Nil, 1));
    assert_same_record(&before, &snapshot(&mut con, "exh"), 50, "EXHAUSTED");
    let (status, _, attempt) = claim_opts(&mut con, "exh", 10, &["maxtries", "2"]);
    assert_eq!((status.as_str(), attempt), ("RETRY", 2));
    // EXTEND of the expired record by the token works, then EXHAUSTED is not
    // reachable while it is live.
    assert_eq!(extend(&mut con, "exh2", &tokens["exh2"], 30), Ok(1));
    let (status, _, _) = claim_opts(&mut con, "exh2", 10, &["MAXTRIES", "1"]);
    assert_eq!(status, "BUSY");
}

#[test]
fn maxtries_exhausted() {
    let s = Server::start();
    let mut con = s.conn();
    let t = claim_new_opts(&mut con, "k", 30, &["MAXTRIES", "2"]);
    assert_eq!(release(&mut con, "k", &t), 1);
    let (status, value, attempt) = claim_opts(&mut con, "k", 30, &["MAXTRIES", "2"]);
    assert_eq!((status.as_str(), attempt), ("RETRY", 2));
    let t = as_token(&value);
    assert_eq!(release(&mut con, "k", &t), 1);
    let before = snapshot(&mut con, "k");
    let (status, value, attempt) = claim_opts(&mut con, "k", 30, &["MAXTRIES", "2"]);
    assert_eq!((status.as_str(), value, attempt), ("EXHAUSTED", Value::Nil, 2));
    assert_same_record(&before, &snapshot(&mut con, "k"), 50, "EXHAUSTED changes nothing");
    let (status, _, attempt) = claim_opts(&mut con, "k", 30, &["MAXTRIES", "1"]);
    assert_eq!((status.as_str(), attempt), ("EXHAUSTED", 2));
    // A higher limit, or none, lets it retry.
    let (status, value, attempt) = claim_opts(&mut con, "k", 30, &["MAXTRIES", "3"]);
    assert_eq!((status.as_str(), attempt), ("RETRY", 3));
    assert_eq!(release(&mut con, "k", &as_token(&value)), 1);
    let (status, _, attempt) = claim(&mut con, "k", 30);
    assert_eq!((status.as_str(), attempt), ("RETRY", 4));
    // MAXTRIES on an absent key: NEW. On a done record: DONE.
    let t = claim_new_opts(&mut con, "d", 30, &["MAXTRIES", "1"]);
    assert_eq!(done(&mut con, "d", &t, NONE), Ok(1));
    let (status, _, attempt) = claim_opts(&mut con, "d", 30, &["MAXTRIES", "1"]);
    assert_eq!((status.as_str(), attempt), ("DONE", 1), "DONE comes before EXHAUSTED");
}

#[test]
fn payload_fingerprint_and_mismatch_precedence() {
    let s = Server::start();
    let mut con = s.conn();
    // Stored by the first granted claim carrying a PAYLOAD.
    let t = claim_new_opts(&mut con, "k", 30, &["PAYLOAD", "body-a"]);
    let f = get_fields(&mut con, "k");
    assert_eq!(f_bytes(&f, "fingerprint"), Some(fingerprint_hex(b"body-a").into_bytes()), "xxh3-128 hex");

    // MISMATCH comes before BUSY.
    let before = snapshot(&mut con, "k");
    let (status, value, attempt) = claim_opts(&mut con, "k", 30, &["PAYLOAD", "body-b"]);
    assert_eq!((status.as_str(), value, attempt), ("MISMATCH", Value::Nil, 1));
    assert_same_record(&before, &snapshot(&mut con, "k"), 50, "MISMATCH changes nothing");
    let (status, _, _) = claim_opts(&mut con, "k", 30, &["PAYLOAD", "body-a"]);
    assert_eq!(status, "BUSY", "same payload");
    let (status, _, _) = claim(&mut con, "k", 30);
    assert_eq!(status, "BUSY", "no payload: no check");

    // ... before EXHAUSTED and RETRY.
    assert_eq!(release(&mut con, "k", &t), 1);
    let (status, _, attempt) = claim_opts(&mut con, "k", 30, &["MAXTRIES", "1", "PAYLOAD", "body-b"]);
    assert_eq!((status.as_str(), attempt), ("MISMATCH", 1), "MISMATCH before EXHAUSTED");
    let (status, _, _) = claim_opts(&mut con, "k", 30, &["PAYLOAD", "body-b"]);
    assert_eq!(status, "MISMATCH", "MISMATCH before RETRY");
    let (status, _, _) = claim_opts(&mut con, "k", 30, &["PAYLOAD", "body-a", "MAXTRIES", "1"]);
    assert_eq!(status, "EXHAUSTED");
    // A retry with another payload would be a mismatch; with the same one,
    // or none, it is granted and keeps the first fingerprint.
    let (status, value, attempt) = claim_opts(&mut con, "k", 30, &["PAYLOAD", "body-a"]);
    assert_eq!((status.as_str(), attempt), ("RETRY", 2));
    let t = as_token(&value);
    assert_eq!(done(&mut con, "k", &t, ("RESULT", "res")), Ok(1));
    let f = get_fields(&mut con, "k");
    assert_eq!(f_bytes(&f, "fingerprint"), Some(fingerprint_hex(b"body-a").into_bytes()));

    // ... and before DONE.
    let (status, value, attempt) = claim_opts(&mut con, "k", 30, &["PAYLOAD", "body-b"]);
    assert_eq!((status.as_str(), value, attempt), ("MISMATCH", Value::Nil, 2), "MISMATCH before DONE");
    let (status, value, _) = claim_opts(&mut con, "k", 30, &["PAYLOAD", "body-a"]);
    assert_eq!((status.as_str(), value), ("DONE", Value::BulkString(b"res".to_vec())));

    // A record claimed without payload gets the fingerprint of the first
    // granted claim that carries one; BUSY claims do not store it.
    let t = claim_new(&mut con, "n", 30);
    let (status, _, _) = claim_opts(&mut con, "n", 30, &["PAYLOAD", "p1"]);
    assert_eq!(status, "BUSY");
    assert_eq!(get_fields(&mut con, "n")["fingerprint"], Value::Nil);
    assert_eq!(release(&mut con, "n", &t), 1);
    let (status, _, _) = claim_opts(&mut con, "n", 30, &["PAYLOAD", "p2"]);
    assert_eq!(status, "RETRY", "no fingerprint stored yet");
    let f = get_fields(&mut con, "n");
    assert_eq!(f_bytes(&f, "fingerprint"), Some(fingerprint_hex(b"p2").into_bytes()));
    let (status, _, _) = claim_opts(&mut con, "n", 30, &["PAYLOAD", "p1"]);
    assert_eq!(status, "MISMATCH");

    // Binary payloads, and the empty payload, are fingerprinted too.
    let bin: &[u8] = b"\x00\x01\xff\xfe";
    let v: Value = q(&mut con, "IDEM.CLAIM", ("b", 30, "PAYLOAD", bin)).unwrap();
    assert_eq!(parse_claim(v).0, "NEW");
    assert_eq!(f_bytes(&get_fields(&mut con, "b"), "fingerprint"), Some(fingerprint_hex(bin).into_bytes()));
    let v: Value = q(&mut con, "IDEM.CLAIM", ("e", 30, "PAYLOAD", "")).unwrap();
    assert_eq!(parse_claim(v).0, "NEW");
    assert_eq!(f_bytes(&get_fields(&mut con, "e"), "fingerprint"), Some(fingerprint_hex(b"").into_bytes()));
    // A record with no fingerprint (ONCE) never answers MISMATCH.
    assert_eq!(once(&mut con, "o", 60), 1);
    let (status, _, attempt) = claim_opts(&mut con, "o", 30, &["PAYLOAD", "anything"]);
    assert_eq!((status.as_str(), attempt), ("DONE", 0));
}

#[test]
fn options_case_insensitive_any_order() {
    let s = Server::start();
    let mut con = s.conn();
    let v: Value = q(&mut con, "idem.claim", ("k", 30, "maxtries", 3, "payload", "x")).unwrap();
    let (status, _, _) = parse_claim(v);
    assert_eq!(status, "NEW");
    assert_eq!(f_bytes(&get_fields(&mut con, "k"), "fingerprint"), Some(fingerprint_hex(b"x").into_bytes()));
    let v: Value = q(&mut con, "IDEM.CLAIM", ("k", 30, "PaYlOaD", "y", "MaxTries", 3)).unwrap();
    assert_eq!(parse_claim(v).0, "MISMATCH");
    // An option value may spell an option name.
    let v: Value = q(&mut con, "IDEM.CLAIM", ("k2", 30, "PAYLOAD", "MAXTRIES")).unwrap();
    assert_eq!(parse_claim(v).0, "NEW");
    assert_eq!(f_bytes(&get_fields(&mut con, "k2"), "fingerprint"), Some(fingerprint_hex(b"MAXTRIES").into_bytes()));
    let t = {
        let v: Value = q(&mut con, "IDEM.CLAIM", ("k3", 30)).unwrap();
        as_token(&parse_claim(v).1)
    };
    assert_eq!(done(&mut con, "k3", &t, ("retain", 50, "result", "RETAIN")), Ok(1));
    let f = get_fields(&mut con, "k3");
    assert_eq!(f_bytes(&f, "result"), Some(b"RETAIN".to_vec()));
    assert_eq!(pexpiretime(&mut con, "k3"), f_int(&f, "done_at") + 50_000);
}

#[test]
fn late_done_on_missing_key_is_recorded() {
    let s = Server::start();
    let mut con = s.conn();
    let t0 = server_ms(&mut con);
    assert_eq!(done(&mut con, "gone", &random_token(), ("RESULT", "late", "RETAIN", 300)), Ok(1));
    let t1 = server_ms(&mut con);
    let f = get_fields(&mut con, "gone");
    assert_eq!(f_str(&f, "state"), "done");
    assert_eq!(f_int(&f, "attempt"), 0);
    assert_eq!(f_int(&f, "claimed_at"), 0);
    assert_eq!(f_int(&f, "lease_ms"), 0);
    let done_at = f_int(&f, "done_at");
    assert!(t0 <= done_at && done_at <= t1);
    assert_eq!(f_bytes(&f, "result"), Some(b"late".to_vec()));
    assert_eq!(f["fingerprint"], Value::Nil);
    assert_eq!(pexpiretime(&mut con, "gone"), done_at + 300_000);
    let (status, value, attempt) = claim(&mut con, "gone", 30);
    assert_eq!((status.as_str(), value, attempt), ("DONE", Value::BulkString(b"late".to_vec()), 0));
    // Without RETAIN: idem.retain.
    assert_eq!(done(&mut con, "gone2", &random_token(), NONE), Ok(1));
    let f = get_fields(&mut con, "gone2");
    assert_eq!(pexpiretime(&mut con, "gone2"), f_int(&f, "done_at") + RETAIN_MS);
    assert_eq!(f["result"], Value::Nil);
}

#[test]
fn token_never_reused_after_del() {
    let s = Server::start();
    let mut con = s.conn();
    let t1 = claim_new(&mut con, "k", 60);
    let _: i64 = redis::cmd("DEL").arg("k").query(&mut con).unwrap();
    assert!(get_opt(&mut con, "k").is_none());
    let t2 = claim_new(&mut con, "k", 60);
    assert_ne!(t1, t2, "a new claim after DEL reused the old token");
    assert_stale(done(&mut con, "k", &t1, NONE), "old token on the new record (DONE)");
    assert_stale(extend(&mut con, "k", &t1, 60), "old token on the new record (EXTEND)");
    assert_eq!(release(&mut con, "k", &t1), 0);
    assert_eq!(f_str(&get_fields(&mut con, "k"), "state"), "processing");
    assert_eq!(done(&mut con, "k", &t2, NONE), Ok(1));
    let _: i64 = redis::cmd("DEL").arg("k").query(&mut con).unwrap();

    // Many claims of one key (with DEL in between) and of many keys: all
    // tokens distinct.
    let mut seen = std::collections::HashSet::new();
    for i in 0..300 {
        let t = claim_new(&mut con, "k", 60);
        assert!(seen.insert(t), "token repeated after {i} claims");
        let _: i64 = redis::cmd("DEL").arg("k").query(&mut con).unwrap();
        let t = claim_new(&mut con, &format!("m{i}"), 60);
        assert!(seen.insert(t), "token repeated");
    }
}

#[test]
fn extend_lease() {
    let s = Server::start();
    let mut con = s.conn();
    let t = claim_new(&mut con, "k", 10);
    let claimed_at = f_int(&get_fields(&mut con, "k"), "claimed_at");
    let t0 = server_ms(&mut con);
    assert_eq!(extend(&mut con, "k", &t, 100), Ok(1));
    let t1 = server_ms(&mut con);
    let f = get_fields(&mut con, "k");
    assert_eq!(f_str(&f, "state"), "processing");
    assert_eq!(f_int(&f, "attempt"), 1);
    assert_eq!(f_int(&f, "claimed_at"), claimed_at, "EXTEND is not a claim");
    let lease = f_int(&f, "lease_ms");
    assert!(lease > 98_000 && lease <= 100_000, "lease_ms {lease}");
    let exp = pexpiretime(&mut con, "k");
    assert!(t0 + 100_000 + HISTORY_MS <= exp && exp <= t1 + 100_000 + HISTORY_MS, "PEXPIRETIME {exp}");
    // Shortening works too: the lease ends `lease` seconds from now.
    assert_eq!(extend(&mut con, "k", &t, 5), Ok(1));
    let lease = f_int(&get_fields(&mut con, "k"), "lease_ms");
    assert!(lease > 3_000 && lease <= 5_000, "lease_ms {lease}");
    let (status, value, _) = claim(&mut con, "k", 10);
    assert_eq!(status, "BUSY");
    assert!(as_int(&value) <= 5_000);

    // Wrong token, released, done, missing: STALE, nothing changes.
    let before = snapshot(&mut con, "k");
    assert_stale(extend(&mut con, "k", &random_token(), 10), "wrong token");
    assert_same_record(&before, &snapshot(&mut con, "k"), 50, "EXTEND with wrong token");
    assert_eq!(done(&mut con, "k", &t, NONE), Ok(1));
    assert_stale(extend(&mut con, "k", &t, 10), "EXTEND on done");
    assert_eq!(f_str(&get_fields(&mut con, "k"), "state"), "done");
    assert_stale(extend(&mut con, "missing", &random_token(), 10), "EXTEND on missing key");
    assert!(!exists(&mut con, "missing"), "EXTEND never creates a record");
    assert_eq!(once(&mut con, "o", 60), 1);
    assert_stale(extend(&mut con, "o", &random_token(), 10), "EXTEND on ONCE record");
}

#[test]
fn once_marks_if_absent() {
    let s = Server::start();
    let mut con = s.conn();
    let t0 = server_ms(&mut con);
    assert_eq!(once(&mut con, "k", 100), 1);
    let t1 = server_ms(&mut con);
    let f = get_fields(&mut con, "k");
    assert_eq!(f_str(&f, "state"), "done");
    assert_eq!(f_int(&f, "attempt"), 0);
    assert_eq!(f_int(&f, "claimed_at"), 0);
    assert_eq!(f_int(&f, "lease_ms"), 0);
    let done_at = f_int(&f, "done_at");
    assert!(t0 <= done_at && done_at <= t1);
    assert_eq!(f["result"], Value::Nil);
    assert_eq!(f["fingerprint"], Value::Nil);
    assert_eq!(pexpiretime(&mut con, "k"), done_at + 100_000);
    let p = f_int(&f, "pttl");
    assert!(p > 98_000 && p <= 100_000, "pttl {p}");

    let before = snapshot(&mut con, "k");
    assert_eq!(once(&mut con, "k", 5000), 0);
    assert_same_record(&before, &snapshot(&mut con, "k"), 50, "ONCE on existing");
    let (status, value, attempt) = claim(&mut con, "k", 30);
    assert_eq!((status.as_str(), value, attempt), ("DONE", Value::Nil, 0));
    assert_eq!(done(&mut con, "k", &random_token(), NONE), Ok(0));

    // Any existing record: 0, unchanged.
    let t = claim_new(&mut con, "p", 30);
    let before = snapshot(&mut con, "p");
    assert_eq!(once(&mut con, "p", 100), 0);
    assert_same_record(&before, &snapshot(&mut con, "p"), 50, "ONCE on processing");
    assert_eq!(release(&mut con, "p", &t), 1);
    let before = snapshot(&mut con, "p");
    assert_eq!(once(&mut con, "p", 100), 0);
    assert_same_record(&before, &snapshot(&mut con, "p"), 50, "ONCE on released");
}

#[test]
fn get_absent_fields_and_never_the_token() {
    let s = Server::start();
    let mut con = s.conn();
    let v: Value = q(&mut con, "IDEM.GET", "nope").unwrap();
    assert_eq!(v, Value::Nil);
    let t = claim_new_opts(&mut con, "k", 30, &["PAYLOAD", "p"]);
    let raw: Value = q(&mut con, "IDEM.GET", "k").unwrap();
    // get_fields checks the RESP2 order; here: the token appears nowhere.
    let text = format!("{raw:?}");
    assert!(!text.contains(&t), "IDEM.GET shows the token: {text}");
    let raw_token: Vec<u8> = (0..16).map(|i| u8::from_str_radix(&t[2 * i..2 * i + 2], 16).unwrap()).collect();
    let Value::Array(items) = &raw else { panic!("{raw:?}") };
    for item in items {
        if let Value::BulkString(b) = item {
            assert!(!b.windows(16).any(|w| w == raw_token.as_slice()), "token bytes in GET: {raw:?}");
        }
    }
    let f = fields_from_reply(raw).unwrap();
    // Integers are integers; state a string.
    for name in ["attempt", "lease_ms", "pttl", "claimed_at", "done_at"] {
        assert!(matches!(f[name], Value::Int(_)), "{name} is {:?}", f[name]);
    }
    assert_eq!(done(&mut con, "k", &t, ("RESULT", "r")), Ok(1));
    let raw: Value = q(&mut con, "IDEM.GET", "k").unwrap();
    assert!(!format!("{raw:?}").contains(&t));
}

#[test]
fn resp3_get_is_a_map() {
    let s = Server::start();
    let mut con2 = s.conn();
    let mut con3 = s.conn_resp3();
    let t = claim_new_opts(&mut con2, "k", 300, &["PAYLOAD", "p"]);
    let v: Value = q(&mut con3, "IDEM.GET", "k").unwrap();
    assert!(matches!(v, Value::Map(_)), "RESP3 IDEM.GET should be a map: {v:?}");
    assert!(!format!("{v:?}").contains(&t));
    let f3 = fields_from_reply(v).unwrap();
    let f2 = get_fields(&mut con2, "k");
    for name in ["state", "attempt", "claimed_at", "done_at", "result", "fingerprint"] {
        assert_eq!(f3[name], f2[name], "{name}");
    }
    assert!((f_int(&f3, "lease_ms") - f_int(&f2, "lease_ms")).abs() < 1000);
    let v: Value = q(&mut con3, "IDEM.GET", "absent").unwrap();
    assert_eq!(v, Value::Nil);
    // CLAIM in RESP3: still a 3-element array.
    let v: Value = q(&mut con3, "IDEM.CLAIM", ("k", 30)).unwrap();
    let (status, value, attempt) = parse_claim(v);
    assert_eq!(status, "BUSY");
    assert!(matches!(value, Value::Int(_)));
    assert_eq!(attempt, 1);
    let v: Value = q(&mut con3, "IDEM.CLAIM", ("k3", 30)).unwrap();
    let (status, value, _) = parse_claim(v);
    assert_eq!(status, "NEW");
    let t3 = as_token(&value);
    assert_eq!(done(&mut con3, "k3", &t3, ("RESULT", "")), Ok(1));
    let v: Value = q(&mut con3, "IDEM.CLAIM", ("k3", 30)).unwrap();
    assert_eq!(parse_claim(v).1, Value::BulkString(vec![]), "empty result, RESP3");
    let f = fields_from_reply(q(&mut con3, "IDEM.GET", "k3").unwrap()).unwrap();
    assert_eq!(f["result"], Value::BulkString(vec![]));
    assert_eq!(f["fingerprint"], Value::Nil);
}

// ---------------------------------------------------------------------------
// The BLOOM option of IDEM.CLAIM / IDEM.DONE
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
