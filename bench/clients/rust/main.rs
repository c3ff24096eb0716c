//! The Rust library's program for `make bench-clients` (bench/clients/README.md):
//! `AsyncIdem::process` against the hand-made `SET NX PX` + `SET XX` pair
//! written with the same client (redis-rs's multiplexed tokio connection),
//! N messages in flight as N tokio tasks sharing one instance and client.
//! Prints `{"seconds": ..., "messages": ...}` as its last line.
use redis_idem_client::{AsyncIdem, Edition, Options, redis};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

struct Args {
    url: String,
    implementation: String,
    scenario: String,
    inflight: usize,
    messages: usize,
    prefix: String,
    edition: Edition,
    batch: Option<bool>,
}

fn args() -> Args {
    let mut args = Args {
        url: "redis://127.0.0.1:6379/".into(),
        implementation: "idem".into(),
        scenario: "first".into(),
        inflight: 1,
        messages: 2000,
        prefix: "bench:".into(),
        edition: Edition::Module,
        batch: None,
    };
    let mut given = std::env::args().skip(1);
    while let (Some(flag), Some(value)) = (given.next(), given.next()) {
        match flag.as_str() {
            "--url" => args.url = value,
            "--impl" => args.implementation = value,
            "--scenario" => args.scenario = value,
            "--inflight" => args.inflight = value.parse().expect("--inflight N"),
            "--messages" => args.messages = value.parse().expect("--messages N"),
            "--prefix" => args.prefix = value,
            "--edition" => args.edition = if value == "functions" { Edition::Functions } else { Edition::Module },
            "--batch" => args.batch = Some(value == "on"),
            other => panic!("unknown flag {other}"),
        }
    }
    args
}

/// One message, by the implementation chosen.
enum Runner {
    Idem(AsyncIdem<redis::Client>),
    Pair(redis::aio::MultiplexedConnection),
}

impl Runner {
    async fn message(&self, key: String, n: usize, replay_only: bool) {
        match self {
            Runner::Idem(idem) => {
                let outcome = idem
                    .process(&key, |_job| async move { Ok::<Value, std::convert::Infallible>(json!({ "n": n })) })
                    .await
                    .expect("process");
                assert!(outcome.value().is_some());
            }
            Runner::Pair(con) => {
                let mut con = con.clone();
                if !replay_only {
                    let token: [u8; 16] = std::array::from_fn(|i| (n as u8).wrapping_add(i as u8) ^ 0x5a);
                    let set: Option<String> = redis::cmd("SET")
                        .arg(&key)
                        .arg(&token[..])
                        .arg("NX")
                        .arg("PX")
                        .arg(30000)
                        .query_async(&mut con)
                        .await
                        .expect("SET NX");
                    if set.is_some() {
                        let result = serde_json::to_vec(&json!({ "n": n })).unwrap();
                        let _: () = redis::cmd("SET")
                            .arg(&key)
                            .arg(result)
                            .arg("XX")
                            .arg("EX")
                            .arg(86400)
                            .query_async(&mut con)
                            .await
                            .expect("SET XX");
                        return;
                    }
                }
                let stored: Vec<u8> = redis::cmd("GET").arg(&key).query_async(&mut con).await.expect("GET");
                let _: Value = serde_json::from_slice(&stored).expect("a stored result");
            }
        }
    }
}

/// `messages` messages, `inflight` at once: the wall time.
async fn run(runner: Arc<Runner>, prefix: String, messages: usize, inflight: usize, replay_only: bool) -> f64 {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..inflight)
        .map(|_| {
            let (runner, next, prefix) = (runner.clone(), next.clone(), prefix.clone());
            tokio::spawn(async move {
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= messages {
                        return;
                    }
                    runner.message(format!("{prefix}{n}"), n, replay_only).await;
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.expect("a worker");
    }
    started.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() {
    let args = args();
    let client = redis::Client::open(args.url.as_str()).expect("--url");
    let runner = Arc::new(match args.implementation.as_str() {
        "idem" => {
            let mut options = Options::new().edition(args.edition);
            if let Some(batch) = args.batch {
                options = options.batch(batch);
            }
            Runner::Idem(AsyncIdem::with_options(client, options).await.expect("AsyncIdem"))
        }
        "pair" => Runner::Pair(client.get_multiplexed_async_connection().await.expect("connect")),
        other => panic!("--impl {other}: this program has idem and pair"),
    });
    let replay_only = args.scenario == "replay";
    run(runner.clone(), format!("{}warm:", args.prefix), 200, args.inflight, false).await;
    let seconds = run(runner, args.prefix, args.messages, args.inflight, replay_only).await;
    println!("{}", json!({ "seconds": seconds, "messages": args.messages }));
}
