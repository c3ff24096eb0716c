//! Many clients at once: claims are exclusive, attempts fence.
#[allow(dead_code)] // each test binary uses part of common/
mod common;

use common::commands::{claim, claim_new, done, get_fields, idem_counters, once, release};
use common::reply::{as_int, as_token, f_int, f_str};
use common::server::Server;
use redis::Value;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex};

const THREADS: usize = 16;

/// One thread's CLAIM reply for a key: key, status, value, attempt.
type Claimed = (String, String, Value, i64);

#[test]
fn one_new_per_key_all_others_busy() {
    let s = Server::start();
    let keys: Vec<String> = (0..200).map(|i| format!("job:{i}")).collect();
    let barrier = Arc::new(Barrier::new(THREADS));
    let results: Arc<Mutex<Vec<Claimed>>> = Arc::default();
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let mut con = s.conn();
            let keys = keys.clone();
            let barrier = barrier.clone();
            let results = results.clone();
            std::thread::spawn(move || {
                barrier.wait();
                let mut mine = Vec::new();
                // Each thread walks the keys from another starting point.
                for i in 0..keys.len() {
                    let key = &keys[(i + t * 13) % keys.len()];
                    let (status, value, attempt) = claim(&mut con, key, 60);
                    mine.push((key.clone(), status, value, attempt));
                }
                results.lock().unwrap().extend(mine);
            })
        })
        .collect();
    for h in handles {
        h.join().expect("client thread panicked");
    }
    let results = results.lock().unwrap();
    assert_eq!(results.len(), THREADS * keys.len());
    let mut per_key: HashMap<&str, (usize, usize)> = HashMap::new();
    let mut tokens = HashSet::new();
    for (key, status, value, attempt) in results.iter() {
        let e = per_key.entry(key.as_str()).or_default();
        match status.as_str() {
            "NEW" => {
                e.0 += 1;
                assert_eq!(*attempt, 1);
                assert!(tokens.insert(as_token(value)), "token issued twice");
            }
            "BUSY" => {
                e.1 += 1;
                assert_eq!(*attempt, 1);
                let left = as_int(value);
                assert!(left > 0 && left <= 60_000, "BUSY {left}");
            }
            other => panic!("{key}: unexpected {other} {value:?}"),
        }
    }
    for key in &keys {
        assert_eq!(per_key[key.as_str()], (1, THREADS - 1), "{key}: (NEW, BUSY) counts");
    }
    let mut con = s.conn();
    let c = idem_counters(&mut con);
    assert_eq!(c.get("claim_new").copied(), Some(keys.len() as i64));
    assert_eq!(c.get("claim_busy").copied(), Some(((THREADS - 1) * keys.len()) as i64));
}

#[test]
fn once_is_exclusive() {
    let s = Server::start();
    let keys: Vec<String> = (0..200).map(|i| format!("msg:{i}")).collect();
    let barrier = Arc::new(Barrier::new(THREADS));
    let wins: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let mut con = s.conn();
            let keys = keys.clone();
            let barrier = barrier.clone();
            let wins = wins.clone();
            std::thread::spawn(move || {
                barrier.wait();
                for i in 0..keys.len() {
                    let key = &keys[(i + t * 7) % keys.len()];
                    if once(&mut con, key, 60) == 1 {
                        *wins.lock().unwrap().entry(key.clone()).or_default() += 1;
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("client thread panicked");
    }
    let wins = wins.lock().unwrap();
    for key in &keys {
        assert_eq!(wins.get(key).copied(), Some(1), "{key}: ONCE answered 1 this many times");
    }
}

#[test]
fn claim_release_loop_is_mutually_exclusive_and_fenced() {
    // Threads race to claim one key; whoever wins holds it alone, then
    // releases it. Every granted claim has a fresh token and the next
    // attempt number: 1, 2, 3, ... without gaps or repeats.
    let s = Server::start();
    const ROUNDS: usize = 60;
    let threads = 8;
    let held = Arc::new(AtomicBool::new(false));
    let granted: Arc<Mutex<Vec<(i64, String)>>> = Arc::default();
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let mut con = s.conn();
            let held = held.clone();
            let granted = granted.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                let mut tries = 0u64;
                loop {
                    if granted.lock().unwrap().len() >= ROUNDS {
                        break;
                    }
                    tries += 1;
                    assert!(tries < 10_000_000, "no progress");
                    let (status, value, attempt) = claim(&mut con, "hot", 30);
                    match status.as_str() {
                        "NEW" | "RETRY" => {
                            assert!(!held.swap(true, Ordering::SeqCst), "two holders at once");
                            let token = as_token(&value);
                            granted.lock().unwrap().push((attempt, token.clone()));
                            held.store(false, Ordering::SeqCst);
                            assert_eq!(release(&mut con, "hot", &token), 1);
                        }
                        "BUSY" => {}
                        other => panic!("unexpected {other}"),
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("client thread panicked");
    }
    let granted = granted.lock().unwrap();
    let mut attempts: Vec<i64> = granted.iter().map(|(a, _)| *a).collect();
    attempts.sort();
    let expected: Vec<i64> = (1..=attempts.len() as i64).collect();
    assert_eq!(attempts, expected, "attempt numbers");
    let tokens: HashSet<&String> = granted.iter().map(|(_, t)| t).collect();
    assert_eq!(tokens.len(), granted.len(), "a token was issued twice");
    let mut con = s.conn();
    let f = get_fields(&mut con, "hot");
    assert_eq!(f_str(&f, "state"), "released");
    assert_eq!(f_int(&f, "attempt"), granted.len() as i64);
}

#[test]
fn concurrent_done_and_claim() {
    // Holders complete while others keep claiming: every claim after a key's
    // DONE answers DONE with its result, never NEW/RETRY.
    let s = Server::start();
    let mut con = s.conn();
    let keys: Vec<String> = (0..100).map(|i| format!("d:{i}")).collect();
    let tokens: Vec<String> = keys.iter().map(|k| claim_new(&mut con, k, 60)).collect();
    let barrier = Arc::new(Barrier::new(THREADS + 1));
    let completer = {
        let mut con = s.conn();
        let keys = keys.clone();
        let barrier = barrier.clone();
        std::thread::spawn(move || {
            barrier.wait();
            for (k, t) in keys.iter().zip(&tokens) {
                assert_eq!(done(&mut con, k, t, ("RESULT", k.as_str())), Ok(1));
            }
        })
    };
    let claimers: Vec<_> = (0..THREADS)
        .map(|_| {
            let mut con = s.conn();
            let keys = keys.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                for _ in 0..3 {
                    for k in &keys {
                        let (status, value, attempt) = claim(&mut con, k, 60);
                        assert_eq!(attempt, 1);
                        match status.as_str() {
                            "BUSY" => {}
                            "DONE" => assert_eq!(value, Value::BulkString(k.clone().into_bytes())),
                            other => panic!("{k}: {other} {value:?}"),
                        }
                    }
                }
            })
        })
        .collect();
    completer.join().expect("completer panicked");
    for h in claimers {
        h.join().expect("claimer panicked");
    }
    for k in &keys {
        let (status, _, _) = claim(&mut con, k, 60);
        assert_eq!(status, "DONE");
    }
}
