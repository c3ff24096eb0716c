//! Attempts no reply can carry (issue 35): a payload whose attempt is 2^63
//! or more is refused as any corrupt one, and a record at the largest
//! attempt, 2^63-1, is claimed no more: `IDEM.CLAIM` (a waiter's too) and
//! `IDEM.MCLAIM`'s element answer an error instead of a negative attempt
//! or a fence repeated, and the record stays as it was.

use crate::common::commands::{claim, claim_new, done, exists, get_fields, release, server_ms};
use crate::common::dump::{claimed_record_v3, module_payload};
use crate::common::fixtures::{NONE, assert_same_record, snapshot};
use crate::common::reply::{as_str, as_token, err_text, f_int, f_str};
use crate::common::server::Server;
use crate::common::waiters::{error_reply, waiter};
use redis::Value;

/// The largest attempt, what replies can carry.
const MAX_ATTEMPT: u64 = i64::MAX as u64;

const ATTEMPT_LIMIT: &str =
    "ERR the record is at the largest attempt, 9223372036854775807: no claim can be fenced above it";

/// A released record with `attempt`, its token all 0xab, as a DUMP payload
/// framed like `good` (a record's DUMP).
fn released_at(con: &mut redis::Connection, good: &[u8], attempt: u64) -> Vec<u8> {
    let now = server_ms(con);
    module_payload(good, &claimed_record_v3(1, attempt, now - 2_000, now - 1_000, [0xab; 16]))
}

fn restore(con: &mut redis::Connection, key: &str, payload: &[u8]) -> Result<(), String> {
    redis::cmd("RESTORE").arg(key).arg(0).arg(payload).query::<()>(con).map_err(|e| err_text(&e))
}

#[test]
fn payloads_with_attempts_no_reply_can_carry_are_refused() {
    let mut s = Server::start();
    let mut con = s.conn();
    claim_new(&mut con, "framing", 60);
    let good: Vec<u8> = redis::cmd("DUMP").arg("framing").query(&mut con).unwrap();
    // The crafted framing itself is sound: a record below the limit loads.
    let payload = released_at(&mut con, &good, MAX_ATTEMPT - 1);
    restore(&mut con, "edge", &payload).expect("attempt 2^63-2 loads");
    for attempt in [MAX_ATTEMPT + 1, u64::MAX] {
        let payload = released_at(&mut con, &good, attempt);
        let e = restore(&mut con, "huge", &payload).unwrap_err();
        assert!(e.contains("Bad data format"), "attempt {attempt}: {e}");
        assert!(!exists(&mut con, "huge"), "attempt {attempt}");
    }
    s.assert_alive();
}

#[test]
fn a_record_at_the_largest_attempt_is_claimed_no_more() {
    let mut s = Server::start();
    let mut con = s.conn();
    claim_new(&mut con, "framing", 60);
    let good: Vec<u8> = redis::cmd("DUMP").arg("framing").query(&mut con).unwrap();
    let payload = released_at(&mut con, &good, MAX_ATTEMPT - 1);
    restore(&mut con, "edge", &payload).expect("attempt 2^63-2 loads");

    // The next claim is the last one: attempt 2^63-1, a positive integer.
    let f = get_fields(&mut con, "edge");
    assert_eq!((f_int(&f, "attempt"), f_int(&f, "tries")), (MAX_ATTEMPT as i64 - 1, MAX_ATTEMPT as i64 - 1));
    let (status, token, attempt) = claim(&mut con, "edge", 1);
    assert_eq!((status.as_str(), attempt), ("RETRY", MAX_ATTEMPT as i64));
    let token = as_token(&token);

    // A waiter on it gets the error when the lease lapses.
    let (reply, _) = error_reply(waiter(&s, "edge", 60, 5_000, &[]));
    assert_eq!(reply, ATTEMPT_LIMIT);
    assert_eq!(f_str(&get_fields(&mut con, "edge"), "state"), "expired");
    assert_eq!(done(&mut con, "edge", &token, ("RETAIN", 60)).map(|_| ()), Ok(()), "the holder still completes");
    let _: i64 = redis::cmd("DEL").arg("edge").query(&mut con).unwrap();

    // Released at the largest attempt: refused by CLAIM and by MCLAIM's
    // element, nothing changed; what needs no new attempt answers as ever.
    let payload = released_at(&mut con, &good, MAX_ATTEMPT);
    restore(&mut con, "edge", &payload).expect("attempt 2^63-1 loads");
    let before = snapshot(&mut con, "edge");
    let e = redis::cmd("IDEM.CLAIM").arg("edge").arg(60).query::<Value>(&mut con).unwrap_err();
    assert_eq!(err_text(&e), ATTEMPT_LIMIT);
    let e = redis::cmd("IDEM.CLAIM").arg("edge").arg(60).arg("WAIT").arg(1000).query::<Value>(&mut con).unwrap_err();
    assert_eq!(err_text(&e), ATTEMPT_LIMIT, "WAIT: not busy, answered at once");
    let mclaim = redis::cmd("IDEM.MCLAIM").arg(60).arg(2).arg("edge").arg("other").clone();
    let Value::Array(elements) = redis::ConnectionLike::req_command(&mut con, &mclaim).unwrap() else { panic!() };
    match &elements[0] {
        Value::ServerError(e) => assert_eq!(format!("{} {}", e.code(), e.details().unwrap_or_default()), ATTEMPT_LIMIT),
        other => panic!("MCLAIM's element for edge: {other:?}"),
    }
    let Value::Array(other) = &elements[1] else { panic!("{elements:?}") };
    assert_eq!(as_str(&other[0]), "NEW", "the other key is claimed");
    assert_same_record(&before, &snapshot(&mut con, "edge"), 100, "after the refused claims");
    let exhausted = redis::cmd("IDEM.CLAIM").arg("edge").arg(60).arg("MAXTRIES").arg(1).query::<Value>(&mut con);
    assert_eq!(
        exhausted.map(|v| format!("{v:?}")),
        Ok(format!(
            "{:?}",
            Value::Array(vec![Value::SimpleString("EXHAUSTED".into()), Value::Nil, Value::Int(i64::MAX)])
        ))
    );
    assert_eq!(release(&mut con, "edge", &"ab".repeat(16)), 0);
    assert_eq!(done(&mut con, "edge", &"ab".repeat(16), NONE), Ok(1), "the latest token completes it");
    assert_eq!(claim(&mut con, "edge", 60), ("DONE".to_string(), Value::Nil, MAX_ATTEMPT as i64));
    s.assert_alive();
}
