//! The example consumer (examples/consumer/) under injected faults: runs its
//! fault-injection script, chaos.py, which starts its own redis-server with
//! the module (AOF, fsync always), a producer and several workers, kills
//! workers and Redis with SIGKILL, publishes duplicates, stalls workers past
//! their lease, and checks every payment took effect exactly once.
//!
//! Needs Python with redis-py: `make pyenv` makes `target/py-venv` (`make
//! test` does it first). `$REDIS_IDEM_PYTHON` names another interpreter.

#[allow(dead_code)] // each test binary uses part of common/
mod common;

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The whole run takes ~20 s; this is the limit on a loaded machine.
const TIMEOUT: Duration = Duration::from_secs(150);

fn python() -> PathBuf {
    match std::env::var_os("REDIS_IDEM_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("target/py-venv/bin/python"),
    }
}

fn check_python(py: &Path) {
    let hint = "run `make pyenv` (or `make test`, which runs it) to create target/py-venv with redis-py, \
                or set REDIS_IDEM_PYTHON to a python that has redis-py";
    if !py.is_file() {
        panic!("no Python at {}: {hint}", py.display());
    }
    let out = Command::new(py)
        .args(["-c", "import redis"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}; {hint}", py.display()));
    if !out.status.success() {
        panic!("{} cannot import redis-py ({}): {hint}", py.display(), String::from_utf8_lossy(&out.stderr).trim());
    }
}

/// The `counts:` table chaos.py prints: `  name   value   note`.
fn counts(output: &str) -> HashMap<String, f64> {
    let mut map = HashMap::new();
    let mut in_table = false;
    for line in output.lines() {
        if line == "counts:" {
            in_table = true;
            continue;
        }
        if in_table {
            if !line.starts_with("  ") {
                break;
            }
            let mut words = line.split_whitespace();
            if let (Some(name), Some(value)) = (words.next(), words.next())
                && let Ok(v) = value.parse::<f64>()
            {
                map.insert(name.to_string(), v);
            }
        }
    }
    map
}

#[test]
fn chaos_run_every_payment_takes_effect_exactly_once() {
    let module = common::server::module_path();
    let py = python();
    check_python(&py);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root.join("target"));
    let target = if target.is_absolute() { target } else { root.join(target) };
    let workdir = target.join("test-servers").join(format!("example-consumer-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&workdir);
    std::fs::create_dir_all(&workdir).expect("create the work directory");
    let out_path = workdir.with_extension("out");
    let out = File::create(&out_path).expect("create the output file");

    let started = Instant::now();
    let mut child = Command::new(&py)
        .arg(root.join("examples/consumer/chaos.py"))
        .args(["--seed", "1", "--progress", "lines"])
        .arg("--module")
        .arg(&module)
        .arg("--workdir")
        .arg(&workdir)
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        // Its own process group: on a timeout, one kill reaches the script,
        // its workers and its redis-server.
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", py.display()));
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for chaos.py") {
            break Some(status);
        }
        if started.elapsed() > TIMEOUT {
            let _ = Command::new("kill").args(["-KILL", &format!("-{}", child.id())]).status();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let output = std::fs::read_to_string(&out_path).unwrap_or_default();
    let Some(status) = status else {
        panic!("chaos.py did not finish within {TIMEOUT:?}; its output:\n{output}");
    };
    assert!(status.success(), "chaos.py failed ({status}); its output:\n{output}");
    assert!(output.contains("\nPASS"), "chaos.py exited 0 without PASS; its output:\n{output}");

    // The run must have injected the faults, not just survived a quiet day.
    let c = counts(&output);
    let at_least = [
        ("messages", 100.0),
        ("effects", 100.0),
        ("kills_before_effect", 1.0),
        ("kills_after_effect", 1.0),
        ("slow_superseded", 1.0),
        ("stale_done", 1.0),
        ("fenced_commits", 1.0),
        ("duplicate_publishes", 1.0),
        ("duplicates_suppressed", 1.0),
        ("retries_after_faults", 1.0),
        ("redis_restarts", 1.0),
        ("dead_letters", 1.0),
    ];
    for (name, min) in at_least {
        let got = c.get(name).copied();
        assert!(
            got.is_some_and(|v| v >= min),
            "count {name}: expected >= {min}, got {got:?}; chaos.py output:\n{output}"
        );
    }
    assert_eq!(c.get("violations").copied(), Some(0.0), "chaos.py output:\n{output}");
    eprintln!("{output}");
    let _ = std::fs::remove_dir_all(&workdir);
    let _ = std::fs::remove_file(&out_path);
}
