//! A chaos run of `IDEM.CLAIM ... WAIT`: every message is delivered 2 to 4
//! times to concurrent consumers, duplicates arriving while the first copy
//! works; some consumers crash mid-work. With no retry loop in the client
//! (each delivery runs one `CLAIM ... WAIT` and acts on its answer), every
//! message's effect is applied exactly once and every duplicate answers with
//! the result of the copy that applied it.
#[allow(dead_code)] // each test binary uses part of common/
mod common;

use common::commands::{done, get_fields, idem_counters};
use common::reply::{as_bytes, as_token, f_bytes, f_int, f_str, parse_claim};
use common::server::Server;
use redis::Value;
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

const MESSAGES: usize = 150;
const CONSUMERS: usize = 16;
/// The lease a consumer claims: far longer than its work (at most
/// `WORK_MS`), so only a crash lets it lapse.
const LEASE_S: i64 = 2;
const WORK_MS: u64 = 40;
/// Long enough for a duplicate to outwait three crashed copies in a row.
const WAIT_MS: i64 = 15_000;
/// How often a copy's consumer crashes once it holds the claim.
const CRASH_PROBABILITY: f64 = 0.25;

/// One delivery of a message to a consumer.
#[derive(Debug, Clone, Copy)]
struct Delivery {
    msg: usize,
    id: usize,
    /// Its consumer crashes mid-work if it gets the claim.
    crashy: bool,
}

/// What a delivery did.
#[derive(Debug, Clone)]
enum Outcome {
    /// Got the claim (NEW or RETRY), did the work, and DONE stored `result`.
    Applied { attempt: i64, result: String },
    /// Got the claim and crashed mid-work: the connection dropped, no DONE.
    Crashed { attempt: i64 },
    /// Got `DONE`: a duplicate of a message another copy applied.
    Duplicate { attempt: i64, result: Option<Vec<u8>>, waited: Duration },
    /// Anything else: a failure of the test.
    Unexpected(String),
}

fn record_key(msg: usize) -> String {
    format!("msg:{msg}")
}

fn effect_key(msg: usize) -> String {
    format!("effect:{msg}")
}

fn applied_key(msg: usize) -> String {
    format!("applied:{msg}")
}

/// 2 to 4 copies of every message, at least one of them from a consumer
/// that does not crash; copies of a message lie close together in the
/// queue (within about three messages), so they run concurrently.
fn deliveries() -> VecDeque<Delivery> {
    let mut all = Vec::new();
    for msg in 0..MESSAGES {
        let copies = rand::random_range(2..=4);
        let mut crashy: Vec<bool> = (0..copies).map(|_| rand::random_bool(CRASH_PROBABILITY)).collect();
        if crashy.iter().all(|&c| c) {
            crashy[rand::random_range(0..copies)] = false;
        }
        for crashy in crashy {
            let at = msg as f64 + rand::random_range(0.0..3.0);
            all.push((at, Delivery { msg, id: all.len(), crashy }));
        }
    }
    all.sort_by(|a, b| a.0.total_cmp(&b.0));
    all.into_iter().map(|(_, d)| d).collect()
}

/// One delivery: one `IDEM.CLAIM ... WAIT`, then what its answer says.
/// `con` is dropped (a new one made for the next delivery) on a crash.
fn consume(con: &mut Option<redis::Connection>, s: &Server, d: Delivery) -> Outcome {
    let c = con.get_or_insert_with(|| s.conn());
    let key = record_key(d.msg);
    let started = Instant::now();
    let reply = redis::cmd("IDEM.CLAIM").arg(&key).arg(LEASE_S).arg("WAIT").arg(WAIT_MS).query::<Value>(c);
    let waited = started.elapsed();
    let (status, value, attempt) = match reply {
        Ok(reply) => parse_claim(reply),
        Err(e) => return Outcome::Unexpected(format!("{key}: IDEM.CLAIM: {e}")),
    };
    match status.as_str() {
        "NEW" | "RETRY" => {
            let token = as_token(&value);
            let work = Duration::from_millis(rand::random_range(5..=WORK_MS));
            if d.crashy {
                // Halfway through the work, before its effect: the process
                // dies, its connection with it; the lease will lapse.
                thread::sleep(work / 2);
                *con = None;
                return Outcome::Crashed { attempt };
            }
            thread::sleep(work);
            // The effect, keyed by the message: a count and who applied it.
            let count: i64 = redis::cmd("INCR").arg(effect_key(d.msg)).query(c).unwrap();
            let _: i64 = redis::cmd("RPUSH").arg(applied_key(d.msg)).arg(d.id).query(c).unwrap();
            let result = format!("message {} applied by delivery {} (count {count})", d.msg, d.id);
            match done(c, &key, &token, ("RESULT", &result)) {
                Ok(1) => Outcome::Applied { attempt, result },
                other => Outcome::Unexpected(format!("{key}: DONE of delivery {}: {other:?}", d.id)),
            }
        }
        "DONE" => Outcome::Duplicate { attempt, result: as_bytes(&value), waited },
        _ => Outcome::Unexpected(format!("{key}: delivery {}: {status} {value:?} {attempt}", d.id)),
    }
}

#[test]
fn every_message_applied_once_duplicates_wait_for_its_result_and_crashes_are_taken_over() {
    let s = Arc::new(Server::start());
    let started = Instant::now();
    let queue = deliveries();
    let total = queue.len();
    let queue = Arc::new(Mutex::new(queue));
    let consumers: Vec<_> = (0..CONSUMERS)
        .map(|_| {
            let (s, queue) = (s.clone(), queue.clone());
            thread::spawn(move || {
                let mut con = None;
                let mut outcomes = Vec::new();
                loop {
                    let next = queue.lock().unwrap().pop_front();
                    let Some(d) = next else { return outcomes };
                    outcomes.push((d, consume(&mut con, &s, d)));
                }
            })
        })
        .collect();
    let outcomes: Vec<(Delivery, Outcome)> = consumers.into_iter().flat_map(|c| c.join().unwrap()).collect();
    let elapsed = started.elapsed();
    assert_eq!(outcomes.len(), total);
    let unexpected: Vec<&String> =
        outcomes.iter().filter_map(|(_, o)| if let Outcome::Unexpected(e) = o { Some(e) } else { None }).collect();
    assert!(unexpected.is_empty(), "{} unexpected answers: {unexpected:#?}", unexpected.len());

    let mut by_msg: BTreeMap<usize, Vec<(Delivery, Outcome)>> = BTreeMap::new();
    for (d, o) in outcomes {
        by_msg.entry(d.msg).or_default().push((d, o));
    }
    assert_eq!(by_msg.len(), MESSAGES);
    let mut con = s.conn();
    let (mut crashes, mut duplicates, mut longest_wait) = (0, 0, Duration::ZERO);
    for (msg, copies) in &by_msg {
        // Exactly one copy applied the effect, once.
        let applied: Vec<_> = copies
            .iter()
            .filter_map(
                |(d, o)| if let Outcome::Applied { attempt, result } = o { Some((d, *attempt, result)) } else { None },
            )
            .collect();
        assert_eq!(applied.len(), 1, "message {msg}: {copies:#?}");
        let (applier, attempt, result) = applied[0];
        let count: i64 = redis::cmd("GET").arg(effect_key(*msg)).query(&mut con).unwrap();
        assert_eq!(count, 1, "message {msg}: its effect applied {count} times");
        let by: Vec<usize> = redis::cmd("LRANGE").arg(applied_key(*msg)).arg(0).arg(-1).query(&mut con).unwrap();
        assert_eq!(by, [applier.id], "message {msg}");
        // Every claim before the applier's was a crashed copy's: each
        // crash's lease lapsed and the next copy took over (attempt + 1).
        let crashed = copies.iter().filter(|(_, o)| matches!(o, Outcome::Crashed { .. })).count();
        assert_eq!(attempt, crashed as i64 + 1, "message {msg}: {copies:#?}");
        let mut crash_attempts: Vec<i64> = copies
            .iter()
            .filter_map(|(_, o)| if let Outcome::Crashed { attempt } = o { Some(*attempt) } else { None })
            .collect();
        crash_attempts.sort();
        assert_eq!(crash_attempts, (1..attempt).collect::<Vec<_>>(), "message {msg}");
        crashes += crashed;
        // Every other copy answered DONE with the applier's result.
        for (d, o) in copies {
            if let Outcome::Duplicate { attempt: got, result: r, waited } = o {
                assert_eq!(r.as_deref(), Some(result.as_bytes()), "message {msg}: delivery {}", d.id);
                assert_eq!(*got, attempt, "message {msg}: delivery {}", d.id);
                duplicates += 1;
                longest_wait = longest_wait.max(*waited);
            }
        }
        let record = get_fields(&mut con, &record_key(*msg));
        assert_eq!(f_str(&record, "state"), "done", "message {msg}");
        assert_eq!(f_int(&record, "attempt"), attempt, "message {msg}");
        assert_eq!(f_bytes(&record, "result").as_deref(), Some(result.as_bytes()), "message {msg}");
    }
    assert_eq!(MESSAGES + crashes + duplicates, total);

    // The server's account: one NEW per message, one RETRY per crash, one
    // completion per message; every wait ended with a claim or the result,
    // none with its time up, none abandoned.
    let counters = idem_counters(&mut con);
    let waits = (counters["wait_started"], counters["wait_claimed"], counters["wait_done"]);
    eprintln!(
        "{MESSAGES} messages, {total} deliveries, {crashes} crashes, {duplicates} duplicates answered DONE \
         (longest wait {longest_wait:?}); waits started/claimed/done {waits:?}; {elapsed:?}"
    );
    assert_eq!(counters["claim_new"], MESSAGES as i64, "{counters:?}");
    assert_eq!(counters["claim_retry"], crashes as i64, "{counters:?}");
    assert_eq!(counters["done_completed"], MESSAGES as i64, "{counters:?}");
    assert_eq!(counters["claim_done"], duplicates as i64, "{counters:?}");
    assert_eq!((counters["claim_busy"], counters["wait_timeout"], counters["wait_unblocked"]), (0, 0, 0));
    assert_eq!(waits.0, waits.1 + waits.2, "{counters:?}");
    // The run exercised both ways a wait pays off: duplicates answered with
    // the first copy's result, and crashed copies taken over by a waiter.
    assert!(waits.1 > 0 && waits.2 > 0, "{counters:?}");
}
