//! A minimal redis-idem consumer loop with the `redis` crate.
//!
//! Usage: cargo run --release --example rust_consumer -- redis://127.0.0.1:6379 [messages]
//!
//! Each message is processed once however often it is delivered: CLAIM
//! before the work, DONE after it (with the result to replay), RELEASE when
//! the work fails so that a retry can run at once. A copy that arrives while
//! another consumer is still working on the message waits for it (`WAIT`)
//! and gets its result, instead of `BUSY`.

use redis::{Client, Connection, RedisResult, Value};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a copy waits for the one in flight. A waiting command holds its
/// connection: each consumer has its own, with no read timeout below this.
const WAIT_MS: u64 = 5000;

enum Outcome {
    Processed(String),
    Released,
    /// Already done, or done while this copy waited: the stored result.
    Duplicate(Option<String>),
    Busy,
    DeadLetter,
}

fn handle(
    con: &mut Connection,
    business_id: u32,
    work: &impl Fn(u32, i64) -> Result<String, String>,
) -> RedisResult<Outcome> {
    let key = format!("example:rust:{business_id}");
    let (status, value, attempt): (String, Value, i64) =
        redis::cmd("IDEM.CLAIM").arg(&key).arg(30).arg("WAIT").arg(WAIT_MS).query(con)?;
    match status.as_str() {
        "NEW" | "RETRY" | "SEEN" => {
            let token: String = redis::from_redis_value(&value)?;
            // `attempt` is a fencing number for downstream writes.
            match work(business_id, attempt) {
                Ok(result) => {
                    // Wakes the copies waiting on the key.
                    let _: i64 = redis::cmd("IDEM.DONE").arg(&key).arg(&token).arg("RESULT").arg(&result).query(con)?;
                    Ok(Outcome::Processed(result))
                }
                Err(_) => {
                    // Give it back: a waiting copy retries at once.
                    let _: i64 = redis::cmd("IDEM.RELEASE").arg(&key).arg(&token).query(con)?;
                    Ok(Outcome::Released)
                }
            }
        }
        // Acknowledge; `value` is the stored result (nil if it was not kept).
        "DONE" => Ok(Outcome::Duplicate(redis::from_redis_value(&value)?)),
        // Still at work after WAIT_MS: do not acknowledge, it comes back later.
        "BUSY" => Ok(Outcome::Busy),
        // MISMATCH or EXHAUSTED.
        _ => Ok(Outcome::DeadLetter),
    }
}

/// The server's count of waits: (waiting now, ended with the holder's DONE).
fn waits(con: &mut Connection) -> RedisResult<(i64, i64)> {
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

fn main() -> RedisResult<()> {
    let mut args = std::env::args().skip(1);
    let url = args.next().unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let messages: u32 = args.next().map_or(20, |n| n.parse().expect("a number of messages"));
    let client = Client::open(url)?;
    let mut con = client.get_connection()?;
    let mut other = client.get_connection()?; // a second consumer, on its own connection
    let admin = Mutex::new(client.get_connection()?); // for the demo's look at INFO idem
    let worked = Mutex::new(Vec::new());
    let work = |business_id: u32, _attempt: i64| -> Result<String, String> {
        worked.lock().unwrap().push(business_id);
        Ok(format!("charged {business_id}"))
    };
    // The work takes a while: here, until the other copy waits on the
    // server (checked, so that the demo does not depend on timing), or
    // WAIT_MS if it never does.
    let slow_work = |business_id: u32, attempt: i64| -> Result<String, String> {
        let deadline = Instant::now() + Duration::from_millis(WAIT_MS);
        while waits(&mut admin.lock().unwrap()).map_err(|e| e.to_string())?.0 == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        work(business_id, attempt)
    };
    let (mut processed, mut duplicates, mut other_outcomes) = (0, 0, 0);
    let waited_before = waits(&mut admin.lock().unwrap())?.1;
    // Every message is delivered twice, as at-least-once queues do: the odd
    // ones one copy after the other (the second finds DONE), the even ones
    // to two consumers at once (one works, the other waits for its result).
    for business_id in 0..messages {
        let copies = if business_id % 2 == 1 {
            [handle(&mut con, business_id, &work)?, handle(&mut con, business_id, &work)?]
        } else {
            std::thread::scope(|scope| -> RedisResult<[Outcome; 2]> {
                let concurrent = scope.spawn(|| handle(&mut other, business_id, &slow_work));
                let mine = handle(&mut con, business_id, &slow_work)?;
                Ok([mine, concurrent.join().expect("the other consumer panicked")?])
            })?
        };
        for copy in copies {
            let result = match copy {
                Outcome::Processed(result) => {
                    processed += 1;
                    Some(result)
                }
                Outcome::Duplicate(result) => {
                    duplicates += 1;
                    result
                }
                Outcome::Released | Outcome::Busy | Outcome::DeadLetter => {
                    other_outcomes += 1;
                    None
                }
            };
            // Both copies of a message answer with the one result.
            assert_eq!(result, Some(format!("charged {business_id}")));
        }
    }
    let waited = waits(&mut admin.lock().unwrap())?.1 - waited_before;
    println!("rust: processed={processed} duplicates={duplicates} waited={waited}");
    let mut worked = worked.into_inner().unwrap();
    worked.sort();
    assert_eq!(worked, (0..messages).collect::<Vec<_>>(), "each message worked on exactly once");
    assert_eq!((processed, duplicates, other_outcomes), (messages, messages, 0));
    assert_eq!(waited, i64::from(messages.div_ceil(2)), "each copy that arrived in flight waited for the first one");
    Ok(())
}
