//! A minimal redis-idem consumer with the `redis-idem-client` crate
//! (clients/rust/) on the `redis` crate.
//!
//! Usage: cargo run --release --example rust_consumer -- redis://127.0.0.1:6379 [messages]
//!
//! Each message is processed once however often it is delivered:
//! `Idem::process` claims it, runs the work (renewing the lease while it
//! runs), records the result to replay, or gives the claim back when the
//! work fails so that a retry can run at once. A copy that arrives while
//! another consumer is still working on the message waits for it (`WAIT`)
//! and gets its result.

use redis_idem_client::redis; // the redis crate's version the client is built on
use redis_idem_client::{Idem, Job, Options, Outcome};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The server's count of waits: (waiting now, ended with the holder's DONE).
fn waits(con: &mut redis::Connection) -> redis::RedisResult<(i64, i64)> {
    let info: String = redis::cmd("INFO").arg("idem").query(con)?;
    let fields: HashMap<&str, i64> = info
        .lines()
        .filter_map(|line| line.split_once(':'))
        .filter_map(|(name, value)| Some((name, value.parse().ok()?)))
        .collect();
    let count = |how: &str| fields.get(format!("idem_wait_{how}").as_str()).copied().unwrap_or(0);
    let ended: i64 = ["claimed", "done", "timeout", "unblocked"].into_iter().map(count).sum();
    Ok((count("started") - ended, count("done")))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args.next().unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let messages: u32 = args.next().map_or(20, |n| n.parse().expect("a number of messages"));
    let client = redis::Client::open(url)?;
    // The consumers' client: a copy in flight waits up to 5 s for the first.
    let idem = Idem::with_options(client.clone(), Options::new().prefix("example:rust:").wait(Duration::from_secs(5)))?;
    let admin = Mutex::new(client.get_connection()?); // for the demo's look at INFO idem
    let worked = Mutex::new(Vec::new());
    // The work; `job.attempt()` is a fencing number for downstream writes.
    let work = |business_id: u32, _job: &Job| -> Result<String, String> {
        worked.lock().unwrap().push(business_id);
        Ok(format!("charged {business_id}"))
    };
    // Slow work: until the other copy waits on the server (checked, so that
    // the demo does not depend on timing), or 5 s if it never does.
    let slow_work = |business_id: u32, job: &Job| -> Result<String, String> {
        let deadline = Instant::now() + Duration::from_secs(5);
        while waits(&mut admin.lock().unwrap()).map_err(|e| e.to_string())?.0 == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        work(business_id, job)
    };
    let handle =
        |business_id: u32, slow: bool| {
            idem.process(&business_id.to_string(), |job: &Job| {
                if slow { slow_work(business_id, job) } else { work(business_id, job) }
            })
        };
    let (mut processed, mut duplicates) = (0, 0);
    let waited_before = waits(&mut admin.lock().unwrap())?.1;
    // Every message is delivered twice, as at-least-once queues do: the odd
    // ones one copy after the other (the second finds it done), the even
    // ones to two consumers at once (one works, the other waits for it).
    for business_id in 0..messages {
        let copies = if business_id % 2 == 1 {
            [handle(business_id, false), handle(business_id, false)]
        } else {
            std::thread::scope(|scope| {
                let concurrent = scope.spawn(|| handle(business_id, true));
                let mine = handle(business_id, true);
                [mine, concurrent.join().expect("the other consumer panicked")]
            })
        };
        for copy in copies {
            // MISMATCH, EXHAUSTED, still BUSY or a lost lease would be an
            // error here: dead-letter it or leave it unacknowledged.
            let outcome: Outcome<String> = copy?;
            if outcome.is_replay() {
                duplicates += 1
            } else {
                processed += 1
            }
            // Both copies of a message answer with the one result.
            assert_eq!(outcome.value(), Some(&format!("charged {business_id}")));
        }
    }
    let waited = waits(&mut admin.lock().unwrap())?.1 - waited_before;
    println!("rust: processed={processed} duplicates={duplicates} waited={waited}");
    let mut worked = worked.into_inner().unwrap();
    worked.sort();
    assert_eq!(worked, (0..messages).collect::<Vec<_>>(), "each message worked on exactly once");
    assert_eq!((processed, duplicates), (messages, messages));
    assert_eq!(waited, i64::from(messages.div_ceil(2)), "each copy that arrived in flight waited for the first one");
    Ok(())
}
