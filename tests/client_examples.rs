//! The client examples in examples/clients/ (Python, Node.js, Rust) run
//! against a real server, so they cannot rot. Each delivers 25 messages
//! twice: each is processed once, its other copy is a duplicate, and the 13
//! even ones are delivered to two consumers at once, so that one copy waits
//! (`IDEM.CLAIM ... WAIT`) for the other's `DONE` and gets its result (the
//! server's `idem_wait_done`).
#[allow(dead_code)] // each test binary uses part of common/
mod common;

use common::server::Server;
use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs an example and checks it succeeded and said what it did (a whole
/// line, so that `waited=13` does not match `waited=130`).
fn run(what: &str, mut command: Command, expect: &str) {
    let output = command.output().unwrap_or_else(|e| panic!("{what}: cannot start it: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{what} failed ({}):\n{stdout}\n{stderr}", output.status);
    assert!(stdout.lines().any(|line| line == expect), "{what} printed:\n{stdout}\n{stderr}");
}

#[test]
fn python_example() {
    let server = Server::start();
    let python = std::env::var("REDIS_IDEM_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root().join("target/py-venv/bin/python"));
    assert!(python.exists(), "{} is missing: run `make pyenv` (make test does)", python.display());
    let mut command = Command::new(python);
    command.arg(root().join("examples/clients/python_consumer.py")).arg(server.url()).arg("25");
    run("examples/clients/python_consumer.py", command, "python: processed=25 duplicates=25 waited=13");
}

#[test]
fn node_example() {
    let server = Server::start();
    let dir = root().join("examples/clients/node");
    assert!(dir.join("node_modules/ioredis").exists(), "ioredis is missing: run `make clients` (make test does)");
    let mut command = Command::new("node");
    command.current_dir(&dir).arg("consumer.js").arg(server.url()).arg("25");
    run("examples/clients/node/consumer.js", command, "node: processed=25 duplicates=25 waited=13");
}

#[test]
fn rust_example() {
    let server = Server::start();
    // `cargo test` without filters (and `make test-valkey`) builds the
    // examples next to the test binaries.
    let binary = std::env::current_exe().unwrap().parent().unwrap().parent().unwrap().join("examples/rust_consumer");
    assert!(binary.exists(), "{} is missing: run `cargo build --profile test-release --examples`", binary.display());
    let mut command = Command::new(binary);
    command.arg(server.url()).arg("25");
    run("examples/clients/rust_consumer.rs", command, "rust: processed=25 duplicates=25 waited=13");
}
