//! The state x command matrix (issue 10, part 1): every record state and
//! every filter shape, through every command that reaches one of the data
//! types' callbacks (`mem_usage`, `digest`, `rdb_save`/`rdb_load`,
//! `aof_rewrite`, `copy`, `free`, `free_effort`).
//!
//! `MEMORY USAGE` of a record done with `RESULT ""` once handed an empty
//! boxed slice's dangling pointer to `RedisModule_MallocSize` and killed
//! the server. No test had put that state through that command. Here every
//! value goes through every such command, and after each one the value must
//! be what it was (`IDEM.GET` / `IDEM.BF.INFO` + `MEXISTS`, `DEBUG
//! DIGEST-VALUE`, `DUMP`, expiry), the dataset digest unchanged, and the
//! server the same process.
//!
//! The values are made once per server (the states that need time, a
//! lapsed lease and shards of several seconds, share one wait); the
//! commands then run over every key.
#[allow(dead_code)] // each test binary uses part of common/
mod common;

#[path = "callbacks/looks.rs"]
mod looks;
#[path = "callbacks/values.rs"]
mod values;

use common::commands::{digest, digest_value, exists};
use common::reply::{as_int, expect_err};
use common::server::{Server, ServerVersion, Shutdown, parse_info};
use looks::{
    Look, assert_intact, assert_sensible_usage, cli_type_summary, debug_object_serialized_length, look, memory_usage,
    redis_cli, scan_type,
};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use values::{
    check_record_states, config_get, config_set, info_field, make_filters, make_records, wait_until_leases_lapsed,
};

/// lease_ms / pttl are relative to "now": they must have gone down by the
/// time elapsed, give or take this (a round trip on a loaded machine).
const TOL_MS: i64 = 2000;

/// `idem.max-result` while the values are made, and the length of the
/// largest RESULT.
const MAX_RESULT: usize = 65_536;

/// `idem.bf-max-bytes` while the filters are made (the default).
const MAX_FILTER_BYTES: i64 = 128 * 1024 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Record,
    Filter,
}

impl Kind {
    fn type_name(self) -> &'static str {
        match self {
            Kind::Record => "idemrecrd",
            Kind::Filter => "idembloom",
        }
    }
}

/// One value of the matrix.
struct Case {
    key: String,
    kind: Kind,
    /// Filters: items added to it (each must answer 1).
    added: Vec<String>,
    /// Filters: items never added (their answers, false positives included,
    /// must not change).
    fresh: Vec<String>,
    /// Records: the state and attempt IDEM.GET must show, and the length
    /// of the stored RESULT (None: no RESULT).
    state: &'static str,
    attempt: i64,
    result: Option<usize>,
    /// Records: the `OWNER` IDEM.GET must show.
    owner: Option<Vec<u8>>,
}

impl Case {
    fn new(key: &str, kind: Kind) -> Case {
        let (added, fresh, owner) = (vec![], vec![], None);
        Case { key: key.to_string(), kind, added, fresh, state: "", attempt: 0, result: None, owner }
    }

    fn record(key: &str, state: &'static str, attempt: i64, result: Option<usize>) -> Case {
        Case { state, attempt, result, ..Case::new(key, Kind::Record) }
    }

    /// The record holds this owner.
    fn owned(self, owner: &[u8]) -> Case {
        Case { owner: Some(owner.to_vec()), ..self }
    }

    fn filter(key: &str, added: Vec<String>) -> Case {
        let fresh = items(&format!("fresh:{key}:"), 0..300);
        Case { added, fresh, ..Case::new(key, Kind::Filter) }
    }

    /// Bytes of RESULT and OWNER that MEMORY USAGE must count.
    fn data_len(&self) -> usize {
        self.result.unwrap_or(0) + self.owner.as_ref().map_or(0, Vec::len)
    }

    fn probes(&self) -> Vec<String> {
        self.added.iter().chain(&self.fresh).cloned().collect()
    }
}

fn items(prefix: &str, range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("{prefix}{i}")).collect()
}

// ---------------------------------------------------------------------------
// The matrix
// ---------------------------------------------------------------------------

/// The server's identity: a restart (crash and supervisor) changes it.
fn identity(con: &mut redis::Connection) -> (String, String) {
    let text: String = redis::cmd("INFO").arg("server").query(con).expect("INFO server");
    let info = parse_info(&text);
    (info["run_id"].clone(), info["process_id"].clone())
}

fn connect_db(s: &Server, db: i64) -> redis::Connection {
    let client = redis::Client::open(format!("redis://127.0.0.1:{}/{db}", s.port)).expect("client");
    let con = client.get_connection().unwrap_or_else(|e| panic!("connect to db {db}: {e}"));
    con.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    con
}

fn answers_ping(port: u16) -> bool {
    let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{port}/")) else { return false };
    let Ok(mut con) = client.get_connection_with_timeout(Duration::from_millis(500)) else { return false };
    let _ = con.set_read_timeout(Some(Duration::from_secs(2)));
    redis::cmd("PING").query::<String>(&mut con).is_ok()
}

/// A server, the values on it as first seen, and what must not change.
struct Matrix {
    server: Server,
    con: redis::Connection,
    /// The same server, db 1.
    con1: redis::Connection,
    cases: Vec<Case>,
    originals: Vec<Look>,
    identity: (String, String),
    dataset: String,
}

impl Matrix {
    fn new(server: Server, con: redis::Connection, cases: Vec<Case>) -> Matrix {
        let mut con = con;
        let con1 = connect_db(&server, 1);
        let originals: Vec<Look> = cases.iter().map(|c| look(&mut con, c, &c.key)).collect();
        for (case, original) in cases.iter().zip(&originals) {
            assert_ne!(original.digest.trim_matches('0'), "", "{}: DEBUG DIGEST-VALUE is all zeros", case.key);
        }
        let identity = identity(&mut con);
        let dataset = digest(&mut con);
        eprintln!("matrix on {}: {} values", ServerVersion::of(&mut con), cases.len());
        Matrix { server, con, con1, cases, originals, identity, dataset }
    }

    /// The server answers, is the same process, and its dataset is as it
    /// was.
    fn assert_same_server(&mut self, what: &str) {
        self.server.assert_alive();
        let _: String = redis::cmd("PING").query(&mut self.con).unwrap_or_else(|e| panic!("{what}: PING: {e}"));
        assert_eq!(identity(&mut self.con), self.identity, "{what}: the server restarted (run_id, process_id)");
        assert_eq!(digest(&mut self.con), self.dataset, "{what}: DEBUG DIGEST of the dataset changed");
    }

    /// After a command on case `i`: the server is the same, the value too.
    fn checkpoint(&mut self, i: usize, command: &str) {
        let what = format!("{} after {command}", self.cases[i].key);
        self.assert_same_server(&what);
        let now = look(&mut self.con, &self.cases[i], &self.cases[i].key);
        assert_intact(&self.originals[i], &now, &what);
    }

    /// Every value is as it was.
    fn assert_all_intact(&mut self, what: &str) {
        for i in 0..self.cases.len() {
            let now = look(&mut self.con, &self.cases[i], &self.cases[i].key);
            assert_intact(&self.originals[i], &now, &format!("{what}: {}", self.cases[i].key));
        }
    }

    fn keys_of(&self, kind: Kind) -> BTreeSet<String> {
        self.cases.iter().filter(|c| c.kind == kind).map(|c| c.key.clone()).collect()
    }

    /// Runs one step of the matrix. When it fails because the server died
    /// (a connection error is all the client sees), says so, with the
    /// crash report's first lines.
    fn step(&mut self, name: &str, f: impl FnOnce(&mut Matrix)) {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(self)));
        if let Err(panic) = result {
            let deadline = Instant::now() + Duration::from_secs(10);
            while self.server.exited().is_none() && Instant::now() < deadline {
                if answers_ping(self.server.port) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            if let Some(status) = self.server.exited() {
                let log = self.server.log();
                let crash: Vec<&str> = log
                    .lines()
                    .filter(|l| {
                        l.contains("crashed by signal") || l.contains("Symbol:") || l.contains("Accessing address")
                    })
                    .collect();
                panic!("{name}: the server died ({status}): {}", crash.join(" | "));
            }
            std::panic::resume_unwind(panic);
        }
    }

    /// Every per-key command over every value.
    fn run_key_commands(&mut self) {
        for i in 0..self.cases.len() {
            let key = self.cases[i].key.clone();
            self.step(&format!("MEMORY USAGE {key}"), |m| m.memory_usage(i));
            self.step(&format!("DEBUG DIGEST-VALUE / DIGEST / OBJECT {key}"), |m| m.digests_and_debug_object(i));
            self.step(&format!("OBJECT ... {key}"), |m| m.object_subcommands(i));
            self.step(&format!("DUMP + RESTORE {key}"), |m| m.dump_restore(i));
            self.step(&format!("COPY {key}"), |m| m.copy(i));
            self.step(&format!("RENAME {key}"), |m| m.rename(i));
            self.step(&format!("MOVE {key}"), |m| m.move_to_db1_and_back(i));
        }
    }

    fn memory_usage(&mut self, i: usize) {
        let key = self.cases[i].key.clone();
        let usage = memory_usage(&mut self.con, &key, None);
        self.checkpoint(i, "MEMORY USAGE");
        assert_sensible_usage(&self.cases[i], &self.originals[i], usage, "MEMORY USAGE");
        let sampled = memory_usage(&mut self.con, &key, Some(0));
        self.checkpoint(i, "MEMORY USAGE SAMPLES 0");
        assert_eq!(sampled, usage, "{key}: MEMORY USAGE SAMPLES 0 vs without SAMPLES");
        let sampled = memory_usage(&mut self.con, &key, Some(5));
        self.checkpoint(i, "MEMORY USAGE SAMPLES 5");
        assert_eq!(sampled, usage, "{key}: MEMORY USAGE SAMPLES 5 vs without SAMPLES");
    }

    fn digests_and_debug_object(&mut self, i: usize) {
        let key = self.cases[i].key.clone();
        let d = digest_value(&mut self.con, &key);
        self.checkpoint(i, "DEBUG DIGEST-VALUE");
        assert_eq!(d, self.originals[i].digest);
        let _ = digest(&mut self.con);
        self.checkpoint(i, "DEBUG DIGEST");
        let len = debug_object_serialized_length(&mut self.con, &key);
        self.checkpoint(i, "DEBUG OBJECT");
        let dump_len = self.originals[i].dump.len() as i64;
        assert!(len > 0 && len <= dump_len, "{key}: DEBUG OBJECT serializedlength {len}, DUMP is {dump_len} B");
    }

    fn object_subcommands(&mut self, i: usize) {
        let key = self.cases[i].key.clone();
        let encoding: String =
            redis::cmd("OBJECT").arg("ENCODING").arg(&key).query(&mut self.con).expect("OBJECT ENCODING");
        self.checkpoint(i, "OBJECT ENCODING");
        assert_eq!(encoding, "raw", "{key}: OBJECT ENCODING");
        let refcount: i64 =
            redis::cmd("OBJECT").arg("REFCOUNT").arg(&key).query(&mut self.con).expect("OBJECT REFCOUNT");
        self.checkpoint(i, "OBJECT REFCOUNT");
        assert!(refcount >= 1, "{key}: OBJECT REFCOUNT {refcount}");
        let idle: i64 = redis::cmd("OBJECT").arg("IDLETIME").arg(&key).query(&mut self.con).expect("OBJECT IDLETIME");
        self.checkpoint(i, "OBJECT IDLETIME");
        assert!(idle >= 0, "{key}: OBJECT IDLETIME {idle}");
        // Without an LFU policy the server refuses FREQ (object_freq_under_lfu
        // runs it with one).
        let e = expect_err(&mut self.con, "OBJECT", ("FREQ", &key));
        assert!(e.contains("LFU"), "{key}: OBJECT FREQ without LFU: {e}");
        self.checkpoint(i, "OBJECT FREQ (refused)");
    }

    fn dump_restore(&mut self, i: usize) {
        let key = self.cases[i].key.clone();
        let restored = format!("{key}:restored");
        let payload: Vec<u8> = redis::cmd("DUMP").arg(&key).query(&mut self.con).expect("DUMP");
        // The original's expiry (RESTORE's 0 is none).
        let exp = self.originals[i].pexpiretime.max(0);
        for replace in [false, true] {
            let mut c = redis::cmd("RESTORE");
            c.arg(&restored).arg(exp).arg(payload.as_slice()).arg("ABSTTL");
            if replace {
                c.arg("REPLACE");
            }
            let _: () =
                c.query(&mut self.con).unwrap_or_else(|e| panic!("RESTORE {restored} (REPLACE: {replace}): {e}"));
            let what = format!("RESTORE of {key}'s DUMP{}", if replace { " REPLACE" } else { "" });
            self.server.assert_alive();
            let copy = look(&mut self.con, &self.cases[i], &restored);
            assert_intact(&self.originals[i], &copy, &what);
            let usage = memory_usage(&mut self.con, &restored, None);
            assert_sensible_usage(&self.cases[i], &self.originals[i], usage, &what);
        }
        // RESTORE REPLACE over a value of the other type.
        let other = match self.cases[i].kind {
            Kind::Record => self.cases.iter().position(|c| c.kind == Kind::Filter),
            Kind::Filter => self.cases.iter().position(|c| c.kind == Kind::Record),
        };
        if let Some(j) = other {
            let n: i64 =
                redis::cmd("COPY").arg(&self.cases[j].key).arg(&restored).arg("REPLACE").query(&mut self.con).unwrap();
            assert_eq!(n, 1);
            let _: () = redis::cmd("RESTORE")
                .arg(&restored)
                .arg(exp)
                .arg(payload.as_slice())
                .arg("ABSTTL")
                .arg("REPLACE")
                .query(&mut self.con)
                .unwrap_or_else(|e| {
                    panic!("RESTORE {restored} REPLACE over a {}: {e}", self.cases[j].kind.type_name())
                });
            let copy = look(&mut self.con, &self.cases[i], &restored);
            assert_intact(&self.originals[i], &copy, "RESTORE REPLACE over the other type");
        }
        let n: i64 = redis::cmd("UNLINK").arg(&restored).query(&mut self.con).unwrap();
        assert_eq!(n, 1);
        self.checkpoint(i, "DUMP + RESTORE (+ REPLACE) + UNLINK");
    }

    fn copy(&mut self, i: usize) {
        let key = self.cases[i].key.clone();
        let copy = format!("{key}:copy");
        for args in [vec![], vec!["REPLACE"]] {
            let n: i64 = redis::cmd("COPY")
                .arg(&key)
                .arg(&copy)
                .arg(&args)
                .query(&mut self.con)
                .unwrap_or_else(|e| panic!("COPY {key} {copy} {args:?}: {e}"));
            assert_eq!(n, 1, "COPY {key} {copy} {args:?}");
            self.server.assert_alive();
            let seen = look(&mut self.con, &self.cases[i], &copy);
            assert_intact(&self.originals[i], &seen, &format!("COPY {args:?}"));
            let usage = memory_usage(&mut self.con, &copy, None);
            assert_sensible_usage(&self.cases[i], &self.originals[i], usage, "COPY");
        }
        let n: i64 =
            redis::cmd("COPY").arg(&key).arg(&copy).arg("DB").arg(1).query(&mut self.con).expect("COPY ... DB 1");
        assert_eq!(n, 1);
        let seen = look(&mut self.con1, &self.cases[i], &copy);
        assert_intact(&self.originals[i], &seen, "COPY ... DB 1");
        let n: i64 = redis::cmd("DEL").arg(&copy).query(&mut self.con1).unwrap();
        assert_eq!(n, 1);
        let n: i64 = redis::cmd("DEL").arg(&copy).query(&mut self.con).unwrap();
        assert_eq!(n, 1);
        self.checkpoint(i, "COPY, COPY REPLACE, COPY DB 1, DEL");
    }

    fn rename(&mut self, i: usize) {
        let key = self.cases[i].key.clone();
        let renamed = format!("{key}:renamed");
        let _: () = redis::cmd("RENAME").arg(&key).arg(&renamed).query(&mut self.con).expect("RENAME");
        self.server.assert_alive();
        let seen = look(&mut self.con, &self.cases[i], &renamed);
        assert_intact(&self.originals[i], &seen, "RENAME");
        let _: () = redis::cmd("RENAME").arg(&renamed).arg(&key).query(&mut self.con).expect("RENAME back");
        self.checkpoint(i, "RENAME and back");
    }

    fn move_to_db1_and_back(&mut self, i: usize) {
        let key = self.cases[i].key.clone();
        let n: i64 = redis::cmd("MOVE").arg(&key).arg(1).query(&mut self.con).expect("MOVE key 1");
        assert_eq!(n, 1, "MOVE {key} 1");
        assert!(!exists(&mut self.con, &key));
        self.server.assert_alive();
        let seen = look(&mut self.con1, &self.cases[i], &key);
        assert_intact(&self.originals[i], &seen, "MOVE to db 1");
        let n: i64 = redis::cmd("MOVE").arg(&key).arg(0).query(&mut self.con1).expect("MOVE key 0");
        assert_eq!(n, 1, "MOVE {key} 0");
        self.checkpoint(i, "MOVE to db 1 and back");
    }

    /// `SWAPDB 0 1`: every value seen from db 1, then swapped back.
    fn swapdb(&mut self) {
        let _: () = redis::cmd("SWAPDB").arg(0).arg(1).query(&mut self.con).expect("SWAPDB 0 1");
        self.server.assert_alive();
        for i in 0..self.cases.len() {
            let seen = look(&mut self.con1, &self.cases[i], &self.cases[i].key);
            assert_intact(&self.originals[i], &seen, "SWAPDB 0 1");
        }
        let _: () = redis::cmd("SWAPDB").arg(0).arg(1).query(&mut self.con).expect("SWAPDB 0 1 back");
        self.assert_same_server("SWAPDB and back");
        self.assert_all_intact("SWAPDB and back");
    }

    /// `SCAN ... TYPE` with both type names finds exactly the values.
    fn scan_types(&mut self) {
        for kind in [Kind::Record, Kind::Filter] {
            let found = scan_type(&mut self.con, kind.type_name());
            assert_eq!(found, self.keys_of(kind), "SCAN 0 TYPE {}", kind.type_name());
        }
        self.assert_same_server("SCAN ... TYPE");
    }

    /// `OBJECT FREQ` needs an LFU policy: set one for it, then put the
    /// policy back.
    fn object_freq_under_lfu(&mut self) {
        let policy = config_get(&mut self.con, "maxmemory-policy");
        config_set(&mut self.con, "maxmemory-policy", "allkeys-lfu");
        for case in &self.cases {
            let freq: i64 = redis::cmd("OBJECT")
                .arg("FREQ")
                .arg(&case.key)
                .query(&mut self.con)
                .unwrap_or_else(|e| panic!("OBJECT FREQ {} under allkeys-lfu: {e}", case.key));
            assert!(freq >= 0);
        }
        config_set(&mut self.con, "maxmemory-policy", &policy);
        self.assert_same_server("OBJECT FREQ");
        self.assert_all_intact("OBJECT FREQ");
    }

    /// `redis-cli --memkeys` and `--bigkeys` (which call TYPE and MEMORY
    /// USAGE on every key) over the whole keyspace.
    fn cli_memkeys_and_bigkeys(&mut self) {
        let port = self.server.port;
        let usages: Vec<(Kind, i64)> =
            self.cases.iter().map(|c| (c.kind, memory_usage(&mut self.con, &c.key, Some(0)))).collect();
        for args in [&["--memkeys"][..], &["--memkeys-samples", "0"][..], &["--bigkeys"][..]] {
            let out = redis_cli(port, args);
            self.assert_same_server(&format!("redis-cli {args:?}"));
            let sampled = format!("Sampled {} keys", self.cases.len());
            assert!(out.contains(&sampled), "redis-cli {args:?}: expected {sampled:?} in:\n{out}");
            for kind in [Kind::Record, Kind::Filter] {
                let n = self.keys_of(kind).len() as i64;
                if n == 0 {
                    continue;
                }
                let (count, size) = cli_type_summary(&out, kind.type_name());
                assert_eq!(count, n, "redis-cli {args:?}: number of {}s:\n{out}", kind.type_name());
                if args[0] != "--bigkeys" {
                    let total: i64 = usages.iter().filter(|(k, _)| *k == kind).map(|(_, u)| u).sum();
                    assert_eq!(
                        size,
                        total.to_string(),
                        "redis-cli {args:?}: bytes of {}s vs MEMORY USAGE:\n{out}",
                        kind.type_name()
                    );
                }
            }
        }
        self.assert_all_intact("redis-cli --memkeys / --bigkeys");
    }

    /// Every command that reaches a callback without leaving the process.
    fn run_in_memory_matrix(&mut self, what: &str) {
        let started = Instant::now();
        self.run_key_commands();
        self.step("SWAPDB", |m| m.swapdb());
        self.step("SCAN ... TYPE", |m| m.scan_types());
        self.step("OBJECT FREQ", |m| m.object_freq_under_lfu());
        self.step("redis-cli --memkeys / --bigkeys", |m| m.cli_memkeys_and_bigkeys());
        eprintln!("{what}: in-memory matrix over {} values: {:?}", self.cases.len(), started.elapsed());
    }

    /// After a reload or restart: every value as it was, and every command
    /// of the matrix on the values as loaded.
    fn assert_all_intact_after_load(&mut self, what: &str) {
        self.server.assert_alive();
        self.assert_all_intact(what);
        assert_eq!(digest(&mut self.con), self.dataset, "{what}: DEBUG DIGEST of the dataset changed");
        self.run_in_memory_matrix(what);
    }

    /// Stops the server without an RDB, starts it again (it loads its AOF),
    /// and reconnects.
    fn restart_from_aof(&mut self) {
        self.server.restart(Shutdown::NoSave);
        self.con = self.server.conn();
        self.con1 = connect_db(&self.server, 1);
        let id = identity(&mut self.con);
        assert_ne!(id, self.identity, "the server did not restart");
        self.identity = id;
    }

    /// The kind of file (`aof` or `rdb`) of the AOF's base.
    fn aof_base_kind(&self) -> String {
        let dir = self.server.dir.join("appendonlydir");
        let names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{dir:?}: {e}"))
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".base."))
            .collect();
        assert_eq!(names.len(), 1, "one AOF base file expected: {names:?}");
        names[0].rsplit('.').next().unwrap().to_string()
    }

    /// Ends with an asynchronous flush of everything (free_effort, free on
    /// the lazy-free thread).
    fn flushall_async(&mut self) {
        let _: () = redis::cmd("FLUSHALL").arg("ASYNC").query(&mut self.con).expect("FLUSHALL ASYNC");
        self.server.assert_alive();
        let n: i64 = redis::cmd("DBSIZE").query(&mut self.con).unwrap();
        assert_eq!(n, 0);
        let _: String = redis::cmd("PING").query(&mut self.con).unwrap();
        self.server.assert_alive();
    }
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[test]
fn every_record_state_through_every_in_memory_command() {
    let started = Instant::now();
    let server = Server::start();
    let mut con = server.conn();
    let cases = make_records(&mut con);
    wait_until_leases_lapsed(&mut con);
    check_record_states(&mut con, &cases);
    let mut m = Matrix::new(server, con, cases);
    m.run_in_memory_matrix("records");
    check_record_states(&mut m.con, &m.cases);
    m.flushall_async();
    eprintln!("records x in-memory commands: {:?}", started.elapsed());
}

#[test]
fn every_filter_shape_through_every_in_memory_command() {
    let started = Instant::now();
    let server = Server::start();
    let mut con = server.conn();
    let cases = make_filters(&mut con);
    let mut m = Matrix::new(server, con, cases);
    m.run_in_memory_matrix("filters");
    m.flushall_async();
    eprintln!("filters x in-memory commands: {:?}", started.elapsed());
}

/// Every record and filter on a server with the AOF on (`aof_args`), made
/// and looked at: ~3 s. The server starts with idem.max-result 1024 and
/// idem.bf-max-bytes 65536: values made under larger limits (make_records
/// and make_filters raise them) must still load under the smaller ones.
fn matrix_with_aof(aof_args: &[&str]) -> Matrix {
    let mut args = vec!["--appendonly", "yes"];
    args.extend(aof_args);
    let server = Server::with_args(&["max-result", "1024", "bf-max-bytes", "65536"], &args);
    let mut con = server.conn();
    let mut cases = make_records(&mut con);
    cases.extend(make_filters(&mut con)); // ~3 s: the leases lapse meanwhile
    wait_until_leases_lapsed(&mut con);
    check_record_states(&mut con, &cases);
    Matrix::new(server, con, cases)
}

/// Restarted, the server is back at its own (smaller) limits, and every
/// value loaded whatever its size.
fn assert_loaded_under_smaller_limits(m: &mut Matrix) {
    assert_eq!(config_get(&mut m.con, "idem.max-result"), "1024");
    assert_eq!(config_get(&mut m.con, "idem.bf-max-bytes"), "65536");
    check_record_states(&mut m.con, &m.cases);
    let over = m.cases.iter().filter(|c| c.result.unwrap_or(0) > 1024).count();
    assert!(over >= 1, "a record with a RESULT over the smaller idem.max-result");
    let over = m
        .originals
        .iter()
        .filter_map(|o| o.info.as_ref())
        .filter(|info| as_int(&info_field(info, "bytes")) > 65_536)
        .count();
    assert!(over >= 1, "a filter over the smaller idem.bf-max-bytes");
}

#[test]
fn every_value_through_debug_reload_and_an_aof_rewrite_with_rdb_preamble() {
    let started = Instant::now();
    let mut m = matrix_with_aof(&[]);
    assert_eq!(config_get(&mut m.con, "aof-use-rdb-preamble"), "yes");

    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut m.con).expect("DEBUG RELOAD");
    m.assert_same_server("DEBUG RELOAD");
    m.assert_all_intact_after_load("DEBUG RELOAD");

    // The default rewrite: an RDB preamble (rdb_save; rdb_load at restart).
    m.server.bgrewriteaof(&mut m.con);
    m.assert_same_server("BGREWRITEAOF (aof-use-rdb-preamble yes)");
    assert_eq!(m.aof_base_kind(), "rdb", "aof-use-rdb-preamble yes: the base should be an RDB");
    m.restart_from_aof();
    m.assert_all_intact_after_load("BGREWRITEAOF (aof-use-rdb-preamble yes) + restart");
    assert_loaded_under_smaller_limits(&mut m);
    m.flushall_async();
    eprintln!("DEBUG RELOAD, AOF rewrite with RDB preamble: {:?}", started.elapsed());
}

#[test]
fn every_value_through_an_aof_rewrite_without_rdb_preamble() {
    let started = Instant::now();
    let mut m = matrix_with_aof(&["--aof-use-rdb-preamble", "no"]);

    // The base is written as commands (the aof_rewrite callbacks: IDEM.APPLY,
    // IDEM.BF.LOAD, then Redis's PEXPIREAT); the restart replays them.
    m.server.bgrewriteaof(&mut m.con);
    m.assert_same_server("BGREWRITEAOF (aof-use-rdb-preamble no)");
    assert_eq!(m.aof_base_kind(), "aof", "aof-use-rdb-preamble no: the base should be a command file");
    m.restart_from_aof();
    m.assert_all_intact_after_load("BGREWRITEAOF (aof-use-rdb-preamble no) + restart");
    assert_loaded_under_smaller_limits(&mut m);

    // And a DEBUG RELOAD of what the AOF loaded.
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut m.con).expect("DEBUG RELOAD");
    m.assert_same_server("DEBUG RELOAD after the AOF restart");
    m.assert_all_intact_after_load("DEBUG RELOAD after the AOF restart");
    m.flushall_async();
    eprintln!("AOF rewrite without RDB preamble: {:?}", started.elapsed());
}
