//! `IDEM.CLAIM ... WAIT ms`: each way a wait ends (the holder's DONE or
//! RELEASE, the lease's end, EXTEND, the key deleted, time up), several
//! waiters on one key, where it never blocks (MULTI, scripts), and clients
//! that leave (disconnect, CLIENT UNBLOCK), against a real server.
#[allow(dead_code)] // each test binary uses part of common/
mod common;

use common::commands::{
    claim_new, claim_opts, digest_value, done, exists, extend, get_fields, idem_counters, pexpiretime, release,
    server_ms,
};
use common::fixtures::NONE;
use common::reply::{as_bytes, as_int, as_str, as_token, err_text, expect_err, f_int, f_str, parse_claim};
use common::server::{Server, blocked_clients, wait_for_blocked, wait_replicas};
use common::waiters::{claimed, waiter};
use redis::Value;
use std::io::Write;
use std::thread;
use std::time::{Duration, Instant};

fn counter(con: &mut redis::Connection, name: &str) -> i64 {
    idem_counters(con).get(name).copied().unwrap_or_else(|| panic!("INFO idem has no {name}"))
}

#[test]
fn done_answers_the_waiter_with_the_result() {
    let s = Server::start();
    let mut con = s.conn();
    let token = claim_new(&mut con, "k", 30);
    let w = waiter(&s, "k", 30, 10_000, &[]);
    assert_eq!(done(&mut con, "k", &token, ("RESULT", "the answer")), Ok(1));
    let ((status, value, attempt), waited) = claimed(w);
    assert_eq!((status.as_str(), as_bytes(&value), attempt), ("DONE", Some(b"the answer".to_vec()), 1));
    assert!(waited < Duration::from_secs(2), "answered after {waited:?}");
    let counters = idem_counters(&mut con);
    assert_eq!((counters["wait_started"], counters["wait_done"], counters["wait_claimed"]), (1, 1, 0));
    assert_eq!(blocked_clients(&mut con), 0);
}

#[test]
fn release_gives_the_waiter_a_claim_that_done_accepts() {
    let s = Server::start();
    let mut con = s.conn();
    let token = claim_new(&mut con, "k", 30);
    let w = waiter(&s, "k", 30, 10_000, &[]);
    assert_eq!(release(&mut con, "k", &token), 1);
    let ((status, value, attempt), waited) = claimed(w);
    assert_eq!((status.as_str(), attempt), ("RETRY", 2));
    assert!(waited < Duration::from_secs(2), "answered after {waited:?}");
    let retry = as_token(&value);
    assert_eq!(f_str(&get_fields(&mut con, "k"), "state"), "processing");
    assert_eq!(done(&mut con, "k", &retry, NONE), Ok(1));
    assert_eq!(counter(&mut con, "wait_claimed"), 1);
}

#[test]
fn a_lapsing_lease_wakes_the_waiter_at_its_end() {
    let s = Server::start();
    let mut con = s.conn();
    claim_new(&mut con, "k", 1);
    let lease_end = f_int(&get_fields(&mut con, "k"), "claimed_at") + 1000;
    let w = waiter(&s, "k", 30, 10_000, &[]);
    let ((status, _, attempt), _) = claimed(w);
    assert_eq!((status.as_str(), attempt), ("RETRY", 2));
    // Claimed (by the server's clock) at the lease's end: a timer, not
    // polling, and long before the timeout.
    let claimed_at = f_int(&get_fields(&mut con, "k"), "claimed_at");
    assert!((lease_end..lease_end + 500).contains(&claimed_at), "lease end {lease_end}, claimed at {claimed_at}");
}

#[test]
fn extend_keeps_the_waiter_waiting_until_the_new_end() {
    let s = Server::start();
    let mut con = s.conn();
    let token = claim_new(&mut con, "k", 1);
    let w = waiter(&s, "k", 30, 10_000, &[]);
    let extended_at = server_ms(&mut con);
    assert_eq!(extend(&mut con, "k", &token, 2), Ok(1));
    // Past the first lease's end the waiter still waits...
    thread::sleep(Duration::from_millis(1300));
    assert_eq!(blocked_clients(&mut con), 1);
    assert!(!w.is_finished());
    // ...and claims when the extended lease lapses.
    let ((status, _, attempt), _) = claimed(w);
    assert_eq!((status.as_str(), attempt), ("RETRY", 2));
    let claimed_at = f_int(&get_fields(&mut con, "k"), "claimed_at");
    let new_end = extended_at + 2000;
    assert!((new_end..new_end + 600).contains(&claimed_at), "extended at {extended_at}, claimed at {claimed_at}");
}

/// On every server: Redis 7.2+ and Valkey wake the clients blocked on a
/// deleted key; on Redis 7.0 the module hears of the deletion itself
/// (tests/wait_operations.rs has each way a key goes).
#[test]
fn deleting_the_key_answers_new() {
    let s = Server::start();
    let mut con = s.conn();
    claim_new(&mut con, "k", 1);
    let w = waiter(&s, "k", 30, 3000, &[]);
    let _: i64 = redis::cmd("DEL").arg("k").query(&mut con).unwrap();
    let ((status, value, attempt), waited) = claimed(w);
    assert_eq!((status.as_str(), attempt), ("NEW", 1));
    assert!(waited < Duration::from_secs(1), "answered after {waited:?}");
    assert_eq!(done(&mut con, "k", &as_token(&value), NONE), Ok(1));
    assert_eq!(counter(&mut con, "wait_claimed"), 1);
}

#[test]
fn time_up_answers_busy_with_the_lease_left() {
    let s = Server::start();
    let mut con = s.conn();
    claim_new(&mut con, "k", 30);
    let ((status, value, attempt), waited) = claimed(waiter(&s, "k", 30, 200, &[]));
    assert_eq!((status.as_str(), attempt), ("BUSY", 1));
    let left = as_int(&value);
    assert!(left > 28_000 && left <= 30_000, "lease left {left}");
    assert!(waited >= Duration::from_millis(190) && waited < Duration::from_secs(2), "answered after {waited:?}");
    let counters = idem_counters(&mut con);
    assert_eq!((counters["wait_started"], counters["wait_timeout"], counters["claim_busy"]), (1, 1, 1));
}

#[test]
fn of_several_waiters_the_longest_claims_and_the_others_get_its_result() {
    let s = Server::start();
    let mut con = s.conn();
    let token = claim_new(&mut con, "k", 30);
    // Started one after the other: the first has waited longest.
    let first = waiter(&s, "k", 30, 10_000, &[]);
    let others: Vec<_> = (0..2).map(|_| waiter(&s, "k", 30, 10_000, &[])).collect();
    assert_eq!(release(&mut con, "k", &token), 1);
    let ((status, value, attempt), _) = claimed(first);
    assert_eq!((status.as_str(), attempt), ("RETRY", 2));
    // The others found the new claim and wait on it.
    thread::sleep(Duration::from_millis(100));
    assert_eq!(blocked_clients(&mut con), 2);
    assert!(others.iter().all(|other| !other.is_finished()));
    assert_eq!(done(&mut con, "k", &as_token(&value), ("RESULT", "r")), Ok(1));
    for other in others {
        let ((status, value, attempt), _) = claimed(other);
        assert_eq!((status.as_str(), as_bytes(&value), attempt), ("DONE", Some(b"r".to_vec()), 2));
    }
    let counters = idem_counters(&mut con);
    assert_eq!((counters["wait_started"], counters["wait_claimed"], counters["wait_done"]), (3, 1, 2));
}

#[test]
fn multi_scripts_functions_and_wait_0_answer_busy_at_once() {
    let s = Server::start();
    let mut con = s.conn();
    claim_new(&mut con, "k", 30);
    let started = Instant::now();
    let (status, _, attempt) = claim_opts(&mut con, "k", 30, &["WAIT", "0"]);
    assert_eq!((status.as_str(), attempt), ("BUSY", 1));
    let replies: Vec<Value> =
        redis::pipe().atomic().cmd("IDEM.CLAIM").arg("k").arg(30).arg("WAIT").arg(5000).query(&mut con).unwrap();
    assert_eq!(parse_claim(replies[0].clone()).0, "BUSY");
    let script = "return redis.call('IDEM.CLAIM', KEYS[1], 30, 'WAIT', 5000)";
    let reply: Value = redis::cmd("EVAL").arg(script).arg(1).arg("k").query(&mut con).unwrap();
    assert_eq!(parse_claim(reply).0, "BUSY");
    let library = "#!lua name=waits\n\
        redis.register_function('claim_wait', function(keys) \
            return redis.call('IDEM.CLAIM', keys[1], 30, 'WAIT', 5000) end)";
    let _: String = redis::cmd("FUNCTION").arg("LOAD").arg(library).query(&mut con).unwrap();
    let reply: Value = redis::cmd("FCALL").arg("claim_wait").arg(1).arg("k").query(&mut con).unwrap();
    assert_eq!(parse_claim(reply).0, "BUSY");
    assert!(started.elapsed() < Duration::from_secs(1), "took {:?}", started.elapsed());
    assert_eq!(counter(&mut con, "wait_started"), 0);
    assert_eq!(counter(&mut con, "claim_busy"), 4);
}

#[test]
fn wait_out_of_range_is_an_error_and_claim_is_flagged_blocking() {
    let s = Server::start();
    let mut con = s.conn();
    for bad in ["-1", "3600001", "soon"] {
        let error = expect_err(&mut con, "IDEM.CLAIM", ("k", 30, "WAIT", bad));
        assert_eq!(error, "ERR WAIT must be an integer from 0 to 3600000");
    }
    assert!(!exists(&mut con, "k"));
    let info: Vec<Vec<Value>> = redis::cmd("COMMAND").arg("INFO").arg("IDEM.CLAIM").query(&mut con).unwrap();
    let (Value::Array(flags) | Value::Set(flags)) = &info[0][2] else { panic!("flags {:?}", info[0][2]) };
    let flags: Vec<String> = flags.iter().map(as_str).collect();
    assert!(flags.contains(&"blocking".to_string()), "{flags:?}");
}

#[test]
fn a_waiter_that_disconnects_leaves_nothing_behind() {
    let s = Server::start();
    let mut con = s.conn();
    let token = claim_new(&mut con, "k", 30);
    let clients_before: String = redis::cmd("CLIENT").arg("LIST").query(&mut con).unwrap();
    let mut raw = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    raw.write_all(b"*5\r\n$10\r\nIDEM.CLAIM\r\n$1\r\nk\r\n$2\r\n30\r\n$4\r\nWAIT\r\n$5\r\n60000\r\n").unwrap();
    wait_for_blocked(&mut con, 1);
    drop(raw);
    wait_for_blocked(&mut con, 0);
    let clients_after: String = redis::cmd("CLIENT").arg("LIST").query(&mut con).unwrap();
    assert_eq!(clients_after.lines().count(), clients_before.lines().count(), "{clients_after}");
    assert_eq!(counter(&mut con, "wait_unblocked"), 1);
    // The record is as it was, and completes as usual.
    assert_eq!(done(&mut con, "k", &token, NONE), Ok(1));
    let _: String = redis::cmd("PING").query(&mut con).unwrap();
}

#[test]
fn client_unblock_timeout_answers_busy_and_error_answers_an_error() {
    let s = Server::start();
    let mut con = s.conn();
    claim_new(&mut con, "k", 30);
    for (how, want_busy) in [("TIMEOUT", true), ("ERROR", false)] {
        let mut client = s.conn();
        let id: i64 = redis::cmd("CLIENT").arg("ID").query(&mut client).unwrap();
        let handle = thread::spawn(move || {
            redis::cmd("IDEM.CLAIM").arg("k").arg(30).arg("WAIT").arg(60_000).query::<Value>(&mut client)
        });
        wait_for_blocked(&mut con, 1);
        let unblocked: i64 = redis::cmd("CLIENT").arg("UNBLOCK").arg(id).arg(how).query(&mut con).unwrap();
        assert_eq!(unblocked, 1, "CLIENT UNBLOCK {how}");
        match handle.join().unwrap() {
            Ok(reply) if want_busy => assert_eq!(parse_claim(reply).0, "BUSY"),
            Err(error) if !want_busy => assert!(err_text(&error).starts_with("UNBLOCKED"), "{error}"),
            other => panic!("CLIENT UNBLOCK {how}: {other:?}"),
        }
        wait_for_blocked(&mut con, 0);
    }
    let counters = idem_counters(&mut con);
    assert_eq!((counters["wait_started"], counters["wait_timeout"], counters["wait_unblocked"]), (2, 1, 1));
}

#[test]
fn the_claim_a_waiter_makes_reaches_the_replica() {
    let primary = Server::start();
    let replica = Server::start();
    replica.replicaof(&primary);
    let (mut pc, mut rc) = (primary.conn(), replica.conn());
    let token = claim_new(&mut pc, "k", 30);
    let w = waiter(&primary, "k", 30, 10_000, &["PAYLOAD", "p"]);
    assert_eq!(release(&mut pc, "k", &token), 1);
    let ((status, value, attempt), _) = claimed(w);
    assert_eq!((status.as_str(), attempt), ("RETRY", 2));
    wait_replicas(&mut pc, 1);
    assert_eq!(digest_value(&mut rc, "k"), digest_value(&mut pc, "k"));
    assert_eq!(pexpiretime(&mut rc, "k"), pexpiretime(&mut pc, "k"));
    let on_replica = get_fields(&mut rc, "k");
    assert_eq!((f_str(&on_replica, "state"), f_int(&on_replica, "attempt")), ("processing".to_string(), 2));
    assert_eq!(done(&mut pc, "k", &as_token(&value), NONE), Ok(1));
    wait_replicas(&mut pc, 1);
    assert_eq!(digest_value(&mut rc, "k"), digest_value(&mut pc, "k"));
}
