//! A record changed under its waiters by something other than this module
//! answers them at once, with what a CLAIM would answer then, on every
//! server: `SWAPDB` (the record swapped away: `NEW`), `SET` over the
//! record (`WRONGTYPE`), `DEL` then a new hash (`NEW`, the waiter claims
//! first and the `HSET` is refused). Redis 7.2+ and Valkey serve these
//! themselves; Redis 7.0 serves no waiter on them, and the module hears of
//! them (keyspace events of every class, the `SWAPDB` event), also when
//! armed at load (`wait-hooks-at-load yes`).
#[allow(dead_code)] // each test binary uses part of common/
mod common;

use common::commands::{claim_new, done, get_fields, get_opt};
use common::fixtures::NONE;
use common::reply::{as_token, f_int, f_str};
use common::server::{Server, blocked_clients};
use common::waiters::{Waited, claimed, error_reply, waiter};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Far longer than any answer takes: an answer within [`WELL_BEFORE`] came
/// from the change, not from the waiter's time running out.
const WAIT_MS: i64 = 10_000;
const WELL_BEFORE: Duration = Duration::from_secs(5);

/// A server with a record `k` claimed for 30 s, its waiter, and the
/// moment `change` was sent.
fn changed_under_a_waiter(change: impl FnOnce(&mut redis::Connection)) -> (Server, JoinHandle<Waited>, Instant) {
    changed_under_a_waiter_of(Server::start(), change)
}

fn changed_under_a_waiter_of(
    s: Server,
    change: impl FnOnce(&mut redis::Connection),
) -> (Server, JoinHandle<Waited>, Instant) {
    let mut con = s.conn();
    claim_new(&mut con, "k", 30);
    let w = waiter(&s, "k", 30, WAIT_MS, &[]);
    let started = Instant::now();
    change(&mut con);
    (s, w, started)
}

fn answered_at_once(started: Instant, what: &str) {
    let after = started.elapsed();
    assert!(after < WELL_BEFORE, "{what}: the waiter was answered after {after:?} of its {WAIT_MS} ms");
}

#[test]
fn a_record_swapped_to_another_database_wakes_its_waiter_with_new() {
    let (s, w, started) = changed_under_a_waiter(|con| {
        let _: () = redis::cmd("SWAPDB").arg(0).arg(5).query(con).unwrap();
    });
    let ((status, value, attempt), _) = claimed(w);
    answered_at_once(started, "SWAPDB");
    assert_eq!((status.as_str(), attempt), ("NEW", 1));
    let mut con = s.conn();
    // The waiter claimed database 0's (missing) key; the record swapped
    // away is untouched in database 5.
    assert_eq!(f_str(&get_fields(&mut con, "k"), "state"), "processing");
    assert_eq!(done(&mut con, "k", &as_token(&value), NONE), Ok(1));
    let _: () = redis::cmd("SELECT").arg(5).query(&mut con).unwrap();
    let swapped = get_fields(&mut con, "k");
    assert_eq!((f_str(&swapped, "state").as_str(), f_int(&swapped, "attempt")), ("processing", 1));
    assert_eq!(blocked_clients(&mut con), 0);
}

#[test]
fn a_string_set_over_a_record_answers_its_waiter_wrongtype() {
    let (s, w, started) = changed_under_a_waiter(|con| {
        let _: () = redis::cmd("SET").arg("k").arg("x").query(con).unwrap();
    });
    let (error, _) = error_reply(w);
    answered_at_once(started, "SET over the record");
    assert!(error.starts_with("WRONGTYPE"), "{error}");
    let mut con = s.conn();
    let value: String = redis::cmd("GET").arg("k").query(&mut con).unwrap();
    assert_eq!(value, "x", "the waiter changed the string");
    assert_eq!(blocked_clients(&mut con), 0);
}

#[test]
fn a_hash_made_where_a_record_was_deleted_comes_after_the_waiters_claim() {
    let mut hset = None;
    let (s, w, started) = changed_under_a_waiter(|con| {
        let _: i64 = redis::cmd("DEL").arg("k").query(con).unwrap();
        hset = Some(redis::cmd("HSET").arg("k").arg("f").arg("v").query::<i64>(con));
    });
    let ((status, value, attempt), _) = claimed(w);
    answered_at_once(started, "DEL then HSET");
    assert_eq!((status.as_str(), attempt), ("NEW", 1));
    // The waiter was served on the deletion, before the next command: the
    // key is its record, so the HSET is refused.
    let error = hset.unwrap().expect_err("the HSET wrote over the waiter's claim");
    assert_eq!(error.code(), Some("WRONGTYPE"), "{error}");
    let mut con = s.conn();
    assert!(get_opt(&mut con, "k").is_some());
    assert_eq!(done(&mut con, "k", &as_token(&value), NONE), Ok(1));
    assert_eq!(blocked_clients(&mut con), 0);
}

/// `wait-hooks-at-load yes` (docs/operations.md): the module hears every
/// data type's writes from the load on, as after a first wait; the
/// answers are the same. Only at load, `yes` or `no`.
#[test]
fn a_server_armed_at_load_answers_its_waiters_the_same() {
    let s = Server::with_args(&["wait-hooks-at-load", "yes"], &[]);
    let mut con = s.conn();
    let armed: Vec<String> = redis::cmd("CONFIG").arg("GET").arg("idem.wait-hooks-at-load").query(&mut con).unwrap();
    assert_eq!(armed, ["idem.wait-hooks-at-load", "yes"]);
    let refused = redis::cmd("CONFIG").arg("SET").arg("idem.wait-hooks-at-load").arg("no").query::<()>(&mut con);
    assert!(refused.is_err(), "wait-hooks-at-load changed at runtime");
    let (s, w, started) = changed_under_a_waiter_of(s, |con| {
        let _: () = redis::cmd("SET").arg("k").arg("x").query(con).unwrap();
    });
    let (error, _) = error_reply(w);
    answered_at_once(started, "SET over the record");
    assert!(error.starts_with("WRONGTYPE"), "{error}");
    drop(s);
    for value in ["maybe", "1", ""] {
        match Server::try_with_args(&["wait-hooks-at-load", value], &[]) {
            Ok(_) => panic!("the module loaded with wait-hooks-at-load {value:?}"),
            Err(msg) => assert!(msg.contains("must be yes or no"), "{value:?}: {msg}"),
        }
    }
}
