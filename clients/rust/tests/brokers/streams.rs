//! The consumer program of the Rust Streams adapter (`rust-streams`) for
//! brokers/scenario.py (brokers/README.md, "Writing a consumer program"):
//! the README's consumer, configured from the environment, with the
//! scenario's work. Built by `make brokers-consumers-rust`.
use redis_idem_client::streams::{StreamConsumer, StreamOptions};
use redis_idem_client::{Idem, Job, Options, redis};
use serde_json::{Value, json};
use std::time::Duration;

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"))
}

fn env_ms(name: &str) -> Duration {
    Duration::from_millis(env(name).parse().unwrap_or_else(|_| panic!("{name}: not a number")))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let options = Options::new().lease(env_ms("IDEM_LEASE_S") * 1000).max_tries(env("IDEM_MAX_TRIES").parse()?);
    let idem = Idem::with_options(redis::Client::open(env("IDEM_REDIS_URL"))?, options)?;
    let mut side = redis::Client::open(env("SIDE_REDIS_URL"))?.get_connection()?;
    let (start, effect, member) = (env("SIDE_START_SHA"), env("SIDE_EFFECT_SHA"), env("IDEM_MEMBER"));
    let (work, slow_work) = (env_ms("IDEM_WORK_MS"), env_ms("IDEM_SLOW_WORK_MS"));

    let consumer = StreamConsumer::new(&idem, &env("IDEM_SOURCE"), &env("IDEM_GROUP"), StreamOptions::new())?;
    // SIGTERM: the entry in hand is settled, then `run` returns.
    signal_hook::flag::register(signal_hook::consts::SIGTERM, consumer.stop_flag())?;
    consumer.run(|entry, job: &Job| -> Result<Value, String> {
        let body: Value = serde_json::from_slice(entry.field("body").unwrap_or_default()).map_err(|e| e.to_string())?;
        let (kind, account, seq) = (body["kind"].as_str().unwrap_or(""), &body["account"], &body["seq"]);
        let started: String = redis::cmd("EVALSHA")
            .arg(&start)
            .arg(1)
            .arg(job.key())
            .arg(kind)
            .arg(&member)
            .query(&mut side)
            .map_err(|e| e.to_string())?;
        if started == "fail" {
            return Err(format!("{} failed on purpose", job.key()));
        }
        std::thread::sleep(if kind == "slow" { slow_work } else { work });
        redis::cmd("EVALSHA")
            .arg(&effect)
            .arg(1)
            .arg(job.key())
            .arg(job.attempt())
            .arg(account.to_string())
            .arg(seq.to_string())
            .arg(&member)
            .query::<redis::Value>(&mut side)
            .map_err(|e| e.to_string())?;
        Ok(json!({ "n": seq }))
    })?;
    Ok(())
}
