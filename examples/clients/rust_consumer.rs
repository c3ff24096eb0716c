//! A minimal redis-idem consumer loop with the `redis` crate.
//!
//! Usage: cargo run --release --example rust_consumer -- redis://127.0.0.1:6379 [messages]
//!
//! Each message is processed once however often it is delivered: CLAIM
//! before the work, DONE after it (with the result to replay), RELEASE when
//! the work fails so that a retry can run at once.

use redis::{Connection, RedisResult, Value};

enum Outcome {
    Processed,
    Released,
    Duplicate,
    Busy,
    DeadLetter,
}

fn handle(
    con: &mut Connection,
    business_id: u32,
    work: &mut impl FnMut(u32, i64) -> Result<String, String>,
) -> RedisResult<Outcome> {
    let key = format!("example:rust:{business_id}");
    let (status, value, attempt): (String, Value, i64) = redis::cmd("IDEM.CLAIM").arg(&key).arg(30).query(con)?;
    match status.as_str() {
        "NEW" | "RETRY" | "SEEN" => {
            let token: String = redis::from_redis_value(&value)?;
            // `attempt` is a fencing number for downstream writes.
            match work(business_id, attempt) {
                Ok(result) => {
                    let _: i64 = redis::cmd("IDEM.DONE").arg(&key).arg(&token).arg("RESULT").arg(result).query(con)?;
                    Ok(Outcome::Processed)
                }
                Err(_) => {
                    // Give it back: the next delivery retries at once.
                    let _: i64 = redis::cmd("IDEM.RELEASE").arg(&key).arg(&token).query(con)?;
                    Ok(Outcome::Released)
                }
            }
        }
        // Already done: acknowledge; `value` is the stored result.
        "DONE" => Ok(Outcome::Duplicate),
        // Someone is on it: do not acknowledge, it comes back later.
        "BUSY" => Ok(Outcome::Busy),
        // MISMATCH or EXHAUSTED.
        _ => Ok(Outcome::DeadLetter),
    }
}

fn main() -> RedisResult<()> {
    let mut args = std::env::args().skip(1);
    let url = args.next().unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let messages: u32 = args.next().map_or(20, |n| n.parse().expect("a number of messages"));
    let mut con = redis::Client::open(url)?.get_connection()?;
    let mut worked = Vec::new();
    let mut work = |business_id: u32, _attempt: i64| -> Result<String, String> {
        worked.push(business_id);
        Ok(format!("charged {business_id}"))
    };
    let (mut processed, mut duplicates, mut other) = (0, 0, 0);
    // Every message is delivered twice, as at-least-once queues do.
    for business_id in (0..messages).chain(0..messages) {
        match handle(&mut con, business_id, &mut work)? {
            Outcome::Processed => processed += 1,
            Outcome::Duplicate => duplicates += 1,
            Outcome::Released | Outcome::Busy | Outcome::DeadLetter => other += 1,
        }
    }
    println!("rust: processed={processed} duplicates={duplicates}");
    worked.sort();
    assert_eq!(worked, (0..messages).collect::<Vec<_>>(), "each message worked on exactly once");
    assert_eq!((processed, duplicates, other), (messages, messages, 0));
    Ok(())
}
