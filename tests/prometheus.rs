//! Prometheus for real (docs/operations.md, "Prometheus"): Debian's
//! `prometheus-redis-exporter` with docs/idem-metrics.lua, against a server
//! with the module, serves every `INFO idem` counter and `idem_waiting` on
//! its /metrics. `make test-prometheus` installs the exporter and sets
//! IDEM_REQUIRE_EXPORTER=1; elsewhere a machine without it skips the test,
//! saying so.
#[allow(dead_code)] // each test binary uses part of common/
mod common;

use common::commands::{claim_new, done, idem_counters};
use common::fixtures::NONE;
use common::reply::random_token;
use common::server::Server;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const EXPORTER: &str = "/usr/bin/prometheus-redis-exporter";

/// The exporter process, stopped when dropped.
struct Exporter(Child);

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `GET /metrics` of 127.0.0.1:`port`, or `None` while nothing answers.
fn scrape(port: u16) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.0 200").then(|| body.to_string()).or_else(|| panic!("/metrics answered {head}"))
}

/// The value of `metric` in a scrape (the line `metric value`).
fn value(metrics: &str, metric: &str) -> Option<f64> {
    metrics.lines().find_map(|line| line.strip_prefix(metric)?.strip_prefix(' ')?.trim().parse().ok())
}

#[test]
fn the_exporter_serves_the_idem_counters() {
    if !Path::new(EXPORTER).exists() {
        assert!(
            std::env::var_os("IDEM_REQUIRE_EXPORTER").is_none(),
            "{EXPORTER} is missing: make test-prometheus installs it (apt-get install prometheus-redis-exporter)"
        );
        eprintln!("skipped: {EXPORTER} is not installed (make test-prometheus installs it)");
        return;
    }
    let s = Server::start();
    let mut con = s.conn();
    let t = claim_new(&mut con, "a", 60);
    claim_new(&mut con, "b", 60);
    assert_eq!(done(&mut con, "a", &t, ("RESULT", "r")), Ok(1));
    assert!(done(&mut con, "b", &random_token(), NONE).is_err_and(|e| e.starts_with("STALE")));
    let counters = idem_counters(&mut con);

    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/idem-metrics.lua");
    let child = Command::new(EXPORTER)
        .args(["-redis.addr", &s.url(), "-script", script, "-web.listen-address", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the exporter");
    let mut exporter = Exporter(child);
    // Until it listens; an exporter that exits instead fails the test.
    let metrics = loop {
        if let Some(metrics) = scrape(port) {
            break metrics;
        }
        if let Some(status) = exporter.0.try_wait().unwrap() {
            panic!("the exporter exited ({status}) before it answered on {port}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(value(&metrics, "redis_up"), Some(1.0), "{metrics}");
    for (name, want) in [("claim_new", 2), ("done_completed", 1), ("done_stale", 1), ("requeue_ok", 0)] {
        assert_eq!(counters[name], want, "INFO idem {name}");
        let metric = format!("redis_script_values{{key=\"idem_{name}\"}}");
        assert_eq!(value(&metrics, &metric), Some(want as f64), "{metric} in:\n{metrics}");
    }
    assert_eq!(value(&metrics, "redis_script_values{key=\"idem_waiting\"}"), Some(0.0), "{metrics}");
}
