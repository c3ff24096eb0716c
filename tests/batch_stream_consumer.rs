//! A batch consumer on Redis Streams (README, "A batch consumer"): each
//! worker reads up to 100 messages (`XREADGROUP ... COUNT 100`, or
//! `XAUTOCLAIM` for messages a dead worker left pending), claims them in one
//! `IDEM.MCLAIM`, and completes them inside the script that applies their
//! effects, so an effect is applied exactly when its claim completes: one
//! `IDEM.DONE` per key there, the batch commands being refused in scripts
//! (docs/commands.md). Workers die mid-batch (before the claim, after it),
//! stall past their lease, give a failed batch back in one `IDEM.MRELEASE`,
//! and orders are published twice: every order's
//! effect is applied exactly once.
#[allow(dead_code)] // each test binary uses part of common/
mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::commands::{get_fields, idem_counters};
use common::reply::{as_int, as_str, as_token, f_str};
use common::rng::Rng;
use common::server::Server;
use redis::Value;

const ORDERS: usize = 1000;
const DUPLICATES: usize = 200;
const LEASE_S: u64 = 3;
/// A pending message is taken over once idle this long: past the lease, so
/// a dead worker's claims have lapsed and answer RETRY.
const MIN_IDLE_MS: u64 = LEASE_S * 1000 + 500;
const WORKERS: usize = 4;
/// What happens to the worker of the nth batch taken (0-based), so every
/// fault is met in every run: it dies before its claim, dies after it, or
/// stalls past its lease (other workers take its messages over meanwhile).
fn fault_of(batch: usize) -> Option<Fault> {
    match batch {
        1 | 9 => Some(Fault::DieBeforeClaim),
        3 | 6 | 12 => Some(Fault::DieAfterClaim),
        4 => Some(Fault::Stall),
        7 => Some(Fault::GiveBack),
        _ => None,
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Fault {
    DieBeforeClaim,
    DieAfterClaim,
    Stall,
    /// Its processing fails: it gives the batch's claims back in one
    /// IDEM.MRELEASE and leaves the messages pending for a retry.
    GiveBack,
}

/// Completes the batch's claims, one IDEM.DONE a key, and, for each key
/// whose claim this call completed (1), applies its effect and acknowledges its
/// message; an already done key (0) is acknowledged; a stale one (a newer
/// claim holds it) is left to that claim's holder.
/// ARGV: n, then n triples (record key, token, message id), then the ids
/// of messages to acknowledge only (their records answered DONE).
const COMPLETE: &str = r"
local n = tonumber(ARGV[1])
local applied = 0
if n > 0 then
  for i = 1, n do
    -- pcall: a stale token's error is this key's answer, not the script's.
    local r = redis.pcall('IDEM.DONE', ARGV[3 * i - 1], ARGV[3 * i])
    if r == 1 then
      redis.call('INCR', 'effect:' .. ARGV[3 * i - 1])
      applied = applied + 1
    end
    if r == 0 or r == 1 then
      redis.call('XACK', KEYS[1], 'g', ARGV[3 * i + 1])
    end
  end
end
for i = 3 * n + 2, #ARGV do
  redis.call('XACK', KEYS[1], 'g', ARGV[i])
end
return applied
";

#[derive(Default)]
struct Counts {
    started: AtomicUsize,
    deaths_before_claim: AtomicUsize,
    deaths_after_claim: AtomicUsize,
    stalls: AtomicUsize,
    given_back: AtomicUsize,
    batches: AtomicUsize,
    takeovers: AtomicUsize,
}

/// Stream entries `(id, order)` from an XREADGROUP or XAUTOCLAIM reply.
fn entries(reply: &Value) -> Vec<(String, String)> {
    let list = match reply {
        Value::Nil => return Vec::new(),
        // XREADGROUP: [[stream, entries]]; XAUTOCLAIM: [cursor, entries, deleted]
        Value::Array(items) => match &items[..] {
            [Value::Array(stream)] => &stream[1],
            [_, entries, ..] => entries,
            _ => return Vec::new(),
        },
        other => panic!("unexpected stream reply {other:?}"),
    };
    let Value::Array(list) = list else { panic!("entries: {list:?}") };
    list.iter()
        .filter_map(|entry| {
            let Value::Array(entry) = entry else { return None };
            let Value::Array(fields) = &entry[1] else { return None };
            Some((as_str(&entry[0]), as_str(&fields[1])))
        })
        .collect()
}

/// One worker, until `done` or it dies (returns early, leaving its claims
/// and pending messages behind as a killed process would).
fn worker(url: String, name: String, counts: Arc<Counts>, done: Arc<AtomicUsize>) {
    let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
    let script = redis::Script::new(COMPLETE);
    while done.load(Ordering::SeqCst) == 0 {
        let mut reply: Value = redis::cmd("XAUTOCLAIM")
            .arg(&["s", "g", &name])
            .arg(MIN_IDLE_MS)
            .arg(&["0-0", "COUNT", "100"])
            .query(&mut con)
            .unwrap();
        if entries(&reply).is_empty() {
            reply = redis::cmd("XREADGROUP")
                .arg(&["GROUP", "g", &name, "COUNT", "100", "BLOCK", "100", "STREAMS", "s", ">"])
                .query(&mut con)
                .unwrap();
        } else {
            counts.takeovers.fetch_add(1, Ordering::SeqCst);
        }
        let batch = entries(&reply);
        if batch.is_empty() {
            continue;
        }
        let fault = fault_of(counts.started.fetch_add(1, Ordering::SeqCst));
        if fault == Some(Fault::DieBeforeClaim) {
            counts.deaths_before_claim.fetch_add(1, Ordering::SeqCst);
            return;
        }
        let keys: Vec<String> = batch.iter().map(|(_, order)| format!("order:{order}")).collect();
        let claimed = match redis::ConnectionLike::req_command(
            &mut con,
            redis::cmd("IDEM.MCLAIM").arg(LEASE_S).arg(keys.len()).arg(&keys),
        )
        .unwrap()
        {
            Value::Array(items) => items,
            other => panic!("MCLAIM: {other:?}"),
        };
        if fault == Some(Fault::DieAfterClaim) {
            counts.deaths_after_claim.fetch_add(1, Ordering::SeqCst);
            return;
        }
        if fault == Some(Fault::Stall) {
            counts.stalls.fetch_add(1, Ordering::SeqCst);
            thread::sleep(Duration::from_millis(LEASE_S * 1000 + 1500));
        }
        let mut complete = Vec::new();
        let mut ack_only = Vec::new();
        for ((id, _), (key, reply)) in batch.iter().zip(keys.iter().zip(&claimed)) {
            let Value::Array(items) = reply else { panic!("{key}: {reply:?}") };
            match as_str(&items[0]).as_str() {
                "NEW" | "RETRY" | "SEEN" => complete.push([key.clone(), as_token(&items[1]), id.clone()]),
                "DONE" => ack_only.push(id.clone()),
                // Another worker holds it (a duplicate, or a takeover of
                // a live claim): left pending, taken over later.
                "BUSY" => {}
                other => panic!("{key}: unexpected {other}"),
            }
        }
        if fault == Some(Fault::GiveBack) && !complete.is_empty() {
            let mut give_back = redis::cmd("IDEM.MRELEASE");
            give_back.arg(complete.len());
            for [key, token, _] in &complete {
                give_back.arg(key).arg(token);
            }
            let released: Vec<i64> = give_back.query(&mut con).unwrap();
            assert!(released.iter().all(|&r| r == 1), "{released:?}");
            counts.given_back.fetch_add(released.len(), Ordering::SeqCst);
            continue;
        }
        let mut call = script.key("s");
        call.arg(complete.len());
        for triple in &complete {
            call.arg(triple);
        }
        call.arg(&ack_only);
        let _: i64 = call.invoke(&mut con).unwrap();
        counts.batches.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn a_batch_consumer_applies_every_message_once_though_workers_die_mid_batch() {
    let s = Server::start();
    let mut con = s.conn();
    let mut rng = Rng(2021);
    let _: () = redis::cmd("XGROUP").arg(&["CREATE", "s", "g", "0", "MKSTREAM"]).query(&mut con).unwrap();
    let mut published: Vec<usize> = (0..ORDERS).collect();
    published.extend((0..DUPLICATES).map(|_| rng.index(ORDERS)));
    // Some duplicates right after their original: twice in one batch.
    for i in 0..50 {
        published.insert(i * 20 + 1, i * 20);
    }
    let mut pipe = redis::pipe();
    for order in &published {
        pipe.cmd("XADD").arg(&["s", "*", "order"]).arg(order).ignore();
    }
    let _: () = pipe.query(&mut con).unwrap();

    let counts = Arc::new(Counts::default());
    let done = Arc::new(AtomicUsize::new(0));
    let spawn = |n: usize| {
        let (url, counts, done) = (s.url(), counts.clone(), done.clone());
        thread::spawn(move || worker(url, format!("w{n}"), counts, done))
    };
    let mut workers: Vec<_> = (0..WORKERS).map(spawn).collect();
    let mut next = WORKERS;
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        // A dead worker is replaced by a new one under a new name, as a
        // supervisor restarts a killed process.
        for slot in workers.iter_mut() {
            if slot.is_finished() {
                let old = std::mem::replace(slot, spawn(next));
                old.join().expect("a worker panicked");
                next += 1;
            }
        }
        let groups: Value = redis::cmd("XINFO").arg(&["GROUPS", "s"]).query(&mut con).unwrap();
        let Value::Array(groups) = groups else { panic!() };
        let group = pairs_of(&groups[0]);
        let length: i64 = redis::cmd("XLEN").arg("s").query(&mut con).unwrap();
        // `entries-read` is nil until the group's first read.
        let read = match &group["entries-read"] {
            Value::Int(n) => *n,
            _ => 0,
        };
        if as_int(&group["pending"]) == 0 && read == length {
            break;
        }
        assert!(Instant::now() < deadline, "the stream did not drain in 180 s: {group:?}");
        thread::sleep(Duration::from_millis(200));
    }
    done.store(1, Ordering::SeqCst);
    for w in workers {
        w.join().expect("a worker panicked");
    }

    for order in 0..ORDERS {
        let applied: Option<i64> = redis::cmd("GET").arg(format!("effect:order:{order}")).query(&mut con).unwrap();
        assert_eq!(applied, Some(1), "order {order}: its effect applied {applied:?} times");
        assert_eq!(f_str(&get_fields(&mut con, &format!("order:{order}")), "state"), "done");
    }
    let c = idem_counters(&mut con);
    let faults = (
        counts.deaths_before_claim.load(Ordering::SeqCst),
        counts.deaths_after_claim.load(Ordering::SeqCst),
        counts.stalls.load(Ordering::SeqCst),
    );
    eprintln!("faults (before claim, after claim, stalls) {faults:?}, counters {c:?}");
    assert_eq!(faults, (2, 3, 1), "every fault of the schedule happened");
    assert!(counts.takeovers.load(Ordering::SeqCst) >= 1, "dead workers' messages were taken over");
    let given_back = counts.given_back.load(Ordering::SeqCst) as i64;
    assert!(given_back >= 1 && c["release_ok"] == given_back, "a failed batch was given back: {c:?}");
    assert!(c["claim_retry"] >= 1, "a dead worker's lapsed claim answers RETRY: {c:?}");
    assert!(c["claim_busy"] >= 1, "a duplicate in flight answers BUSY: {c:?}");
    assert!(c["claim_done"] >= DUPLICATES as i64 / 2, "duplicates are answered DONE: {c:?}");
    assert_eq!(c["done_completed"], ORDERS as i64, "every order completed once: {c:?}");
}

/// `XINFO GROUPS` entry as a map.
fn pairs_of(v: &Value) -> std::collections::HashMap<String, Value> {
    match v {
        Value::Array(items) => items.chunks(2).map(|p| (as_str(&p[0]), p[1].clone())).collect(),
        Value::Map(items) => items.iter().map(|(k, v)| (as_str(k), v.clone())).collect(),
        other => panic!("{other:?}"),
    }
}
