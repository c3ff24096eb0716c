//! Server time: sleeping until the server's clock reads a given ms,
//! aligning to shard boundaries, and running commands between two `TIME`s
//! so a test knows the time the module saw. A step that missed its time
//! slot (the machine stalled) is a `Hiccup`: the scenario runs again, it
//! never guesses.
use crate::common::commands::server_ms;
use redis::Value;
use std::time::Duration;

/// Sleeps until the server's clock reads `target_ms` (Unix ms) or later.
pub fn sleep_until(con: &mut redis::Connection, target_ms: i64) {
    loop {
        let now = server_ms(con);
        if now >= target_ms {
            return;
        }
        std::thread::sleep(Duration::from_millis((target_ms - now) as u64));
    }
}

/// Sleeps until `offset_ms` after the next multiple of `period_ms` of the
/// server's clock; returns that boundary (Unix ms).
pub fn align_to_boundary(con: &mut redis::Connection, period_ms: i64, offset_ms: i64) -> i64 {
    let now = server_ms(con);
    let boundary = (now / period_ms + 1) * period_ms;
    sleep_until(con, boundary + offset_ms);
    boundary
}

pub fn time_reply_ms(v: &Value) -> i64 {
    let (s, us): (i64, i64) = redis::from_redis_value(v).expect("TIME reply");
    s * 1000 + us / 1000
}

/// Runs `pipe` between two `TIME`s in one round trip: (server ms before,
/// the replies, server ms after). Every command in between saw a clock in
/// that interval.
pub fn timed(con: &mut redis::Connection, pipe: &redis::Pipeline) -> (i64, Vec<Value>, i64) {
    let mut p = redis::pipe();
    p.cmd("TIME");
    for c in pipe.cmd_iter() {
        p.add_command(c.clone());
    }
    p.cmd("TIME");
    let mut replies: Vec<Value> = p.query(con).unwrap_or_else(|e| panic!("timed pipeline: {e}"));
    let t1 = time_reply_ms(&replies.pop().unwrap());
    let t0 = time_reply_ms(&replies.remove(0));
    (t0, replies, t1)
}

/// A step ran outside the time slot the scenario needed (machine stalled).
#[derive(Debug)]
pub struct Hiccup(pub String);

/// `Ok` when [t0, t1] lies inside [lo, hi) (Unix ms).
pub fn in_slot(t0: i64, t1: i64, lo: i64, hi: i64, step: &str) -> Result<(), Hiccup> {
    if t0 >= lo && t1 < hi { Ok(()) } else { Err(Hiccup(format!("{step}: ran at [{t0}, {t1}], needed [{lo}, {hi})"))) }
}

/// Runs a timing-sensitive scenario up to 3 times (each with a fresh key
/// suffix) until it runs in its time slots; assertion failures are not
/// retried.
pub fn with_retries(name: &str, mut scenario: impl FnMut(usize) -> Result<(), Hiccup>) {
    let mut hiccups = Vec::new();
    for attempt in 0..3 {
        match scenario(attempt) {
            Ok(()) => return,
            Err(Hiccup(why)) => {
                eprintln!("{name}: attempt {attempt} missed its time slot, again: {why}");
                hiccups.push(why);
            }
        }
    }
    panic!("{name}: the machine was too slow to run the timed steps 3 times: {hiccups:?}");
}
