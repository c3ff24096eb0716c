//! Blocked clients: a command (an `IDEM.CLAIM ... WAIT`, or one of the
//! server's own blocking commands) on a connection of its own, in a thread,
//! and its reply once it is answered.
use crate::common::reply::{err_text, parse_claim};
use crate::common::server::{Server, blocked_clients, wait_for_blocked};
use redis::{RedisResult, Value};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// A blocked command's raw reply, and how long the client waited for it.
pub type Waited = (RedisResult<Value>, Duration);

/// `cmd` on a connection of its own, in a thread; returns once the server
/// has one more blocked client.
pub fn blocked(s: &Server, cmd: redis::Cmd) -> JoinHandle<Waited> {
    let mut admin = s.conn();
    let before = blocked_clients(&mut admin);
    let mut con = s.conn();
    let handle = thread::spawn(move || {
        let started = Instant::now();
        let reply = cmd.query::<Value>(&mut con);
        (reply, started.elapsed())
    });
    wait_for_blocked(&mut admin, before + 1);
    handle
}

/// `IDEM.CLAIM key lease <opts> WAIT wait_ms`, blocked (see `blocked`).
pub fn waiter(s: &Server, key: &str, lease: i64, wait_ms: i64, opts: &[&str]) -> JoinHandle<Waited> {
    let mut cmd = redis::cmd("IDEM.CLAIM");
    cmd.arg(key).arg(lease).arg(opts).arg("WAIT").arg(wait_ms);
    blocked(s, cmd)
}

/// A waiter's reply, which must be a CLAIM's triple.
pub fn claimed(handle: JoinHandle<Waited>) -> ((String, Value, i64), Duration) {
    let (reply, waited) = handle.join().unwrap();
    let reply = reply.unwrap_or_else(|e| panic!("the waiter got an error: {e}"));
    (parse_claim(reply), waited)
}

/// A blocked client's reply, which must be an error: its text.
pub fn error_reply(handle: JoinHandle<Waited>) -> (String, Duration) {
    let (reply, waited) = handle.join().unwrap();
    match reply {
        Err(e) => {
            assert!(e.code().is_some(), "expected a server error, got {e}");
            (err_text(&e), waited)
        }
        Ok(v) => panic!("expected an error, got {v:?}"),
    }
}
