//! Test harness shared by the integration tests: a real `redis-server` with
//! the module loaded, plus small helpers to call the module's commands.
//!
//! Every test starts its own server(s) on a free port, in its own directory
//! under `target/test-servers/`. The module is loaded from
//! `target/release/libredis_idem.so` (build it with `cargo build --release`
//! first; `make test` does), or from `$REDIS_IDEM_MODULE` when set.
//! `$REDIS_SERVER` overrides the server binary (default `redis-server`).
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub use redis::{RedisError, RedisResult, Value};

pub mod cluster;
pub mod model;

/// Default `idem.history` and `idem.retain`, in ms (SPEC "Configuration").
pub const HISTORY_MS: i64 = 3_600_000;
pub const RETAIN_MS: i64 = 86_400_000;

// ---------------------------------------------------------------------------
// The server
// ---------------------------------------------------------------------------

/// Path of the module under test. Panics when it has not been built.
pub fn module_path() -> PathBuf {
    let path = match std::env::var_os("REDIS_IDEM_MODULE") {
        Some(p) => PathBuf::from(p),
        None => {
            let target = std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
            target.join("release").join("libredis_idem.so")
        }
    };
    let path = if path.is_absolute() { path } else { Path::new(env!("CARGO_MANIFEST_DIR")).join(path) };
    if !path.is_file() {
        panic!("module not found at {}: run `cargo build --release` first (or `make test`)", path.display());
    }
    path
}

fn redis_server_bin() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_string())
}

fn test_servers_root() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let target = if target.is_absolute() { target } else { Path::new(env!("CARGO_MANIFEST_DIR")).join(target) };
    target.join("test-servers")
}

/// A port nobody listens on right now. Another process may take it before
/// the server binds it: `Server` then retries with another port, and checks
/// the server it talks to is its own (by pid).
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().unwrap().port()
}

static NEXT_ID: AtomicUsize = AtomicUsize::new(0);

/// How `restart` stops the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shutdown {
    /// `SHUTDOWN SAVE`: write an RDB first.
    Save,
    /// `SHUTDOWN NOSAVE`: no RDB (the AOF, when on, is still flushed).
    NoSave,
}

enum StartError {
    /// The port was taken: try another one.
    PortTaken,
    /// Anything else: give up with this message.
    Fatal(String),
}

/// A `redis-server` child process with the module loaded.
pub struct Server {
    pub port: u16,
    pub dir: PathBuf,
    module_args: Vec<String>,
    extra_args: Vec<String>,
    child: Option<Child>,
}

impl Server {
    /// A server with the module's default configuration.
    pub fn start() -> Server {
        Server::with_args(&[], &[])
    }

    /// `module_args` follow `--loadmodule <path>` (config name/value pairs,
    /// e.g. `["retain", "100"]`); `extra_args` are more server options, e.g.
    /// `["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]`. They come
    /// after the defaults, so they override them.
    pub fn with_args(module_args: &[&str], extra_args: &[&str]) -> Server {
        Server::try_with_args(module_args, extra_args).unwrap_or_else(|msg| panic!("{msg}"))
    }

    /// Like `with_args`, but a server that exits at start (e.g. a refused
    /// module argument) is an `Err` with its log instead of a panic.
    pub fn try_with_args(module_args: &[&str], extra_args: &[&str]) -> Result<Server, String> {
        module_path(); // fail early and clearly
        let id = NEXT_ID.fetch_add(1, Ordering::SeqCst);
        let dir = test_servers_root().join(format!("{}-{}", std::process::id(), id));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the server's directory");
        let mut server = Server {
            port: 0,
            dir,
            module_args: module_args.iter().map(|s| s.to_string()).collect(),
            extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
            child: None,
        };
        let mut last = String::new();
        for _ in 0..30 {
            server.port = free_port();
            match server.spawn_and_wait() {
                Ok(()) => return Ok(server),
                Err(StartError::PortTaken) => {
                    last = format!("port {} taken", server.port);
                    continue;
                }
                Err(StartError::Fatal(msg)) => return Err(msg),
            }
        }
        panic!("could not start redis-server on a free port ({last})");
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join("redis.log")
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read(self.log_path())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_else(|e| format!("<no log: {e}>"))
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(self.log_path()) {
            let len = f.metadata().map(|m| m.len()).unwrap_or(0);
            let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
            let mut buf = Vec::new();
            let _ = f.read_to_end(&mut buf);
            text = String::from_utf8_lossy(&buf).into_owned();
        }
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    fn args(&self) -> Vec<String> {
        let mut args: Vec<String> = vec![
            "--port".into(),
            self.port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--dir".into(),
            self.dir.display().to_string(),
            "--logfile".into(),
            self.log_path().display().to_string(),
            "--daemonize".into(),
            "no".into(),
            "--save".into(),
            "".into(),
            "--appendonly".into(),
            "no".into(),
            "--enable-debug-command".into(),
            "yes".into(),
            // Full syncs start at once instead of waiting 5 s for more replicas.
            "--repl-diskless-sync-delay".into(),
            "0".into(),
            "--loglevel".into(),
            "verbose".into(),
            "--loadmodule".into(),
            module_path().display().to_string(),
        ];
        args.extend(self.module_args.iter().cloned());
        args.extend(self.extra_args.iter().cloned());
        args
    }

    /// Starts the process on `self.port` and waits until it answers PING.
    fn spawn_and_wait(&mut self) -> Result<(), StartError> {
        let mut child = Command::new(redis_server_bin())
            .args(self.args())
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| StartError::Fatal(format!("cannot run {}: {e}", redis_server_bin())))?;
        let pid = child.id();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let log = self.log_tail(60);
                if log.contains("Address already in use")
                    || log.contains("Could not create server TCP listening socket")
                {
                    return Err(StartError::PortTaken);
                }
                return Err(StartError::Fatal(format!(
                    "redis-server on port {} exited at start ({status}); its log:\n{log}",
                    self.port
                )));
            }
            if let Some(their_pid) = ping_pid(self.port) {
                if their_pid == pid {
                    self.child = Some(child);
                    return Ok(());
                }
                // Someone else's server has this port: ours will exit.
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(StartError::Fatal(format!(
                    "redis-server on port {} did not answer PING within 10 s; its log:\n{}",
                    self.port,
                    self.log_tail(60)
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A new RESP2 connection.
    pub fn conn(&self) -> redis::Connection {
        self.connect(&self.url())
    }

    /// A new RESP3 connection.
    pub fn conn_resp3(&self) -> redis::Connection {
        self.connect(&format!("{}?protocol=resp3", self.url()))
    }

    fn connect(&self, url: &str) -> redis::Connection {
        let client = redis::Client::open(url).expect("client");
        let con = client
            .get_connection()
            .unwrap_or_else(|e| panic!("connect to {url}: {e}; server log:\n{}", self.log_tail(40)));
        con.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        con.set_write_timeout(Some(Duration::from_secs(60))).unwrap();
        con
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Has the process exited? (reaps it when it has)
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        match self.child.as_mut() {
            Some(child) => child.try_wait().ok().flatten(),
            None => None,
        }
    }

    /// Panics, with the server's log, if the server died or does not answer.
    pub fn assert_alive(&mut self) {
        if let Some(status) = self.exited() {
            panic!("redis-server on port {} died ({status}); its log:\n{}", self.port, self.log_tail(80));
        }
        match ping_pid(self.port) {
            Some(pid) if Some(pid) == self.pid() => {}
            _ => {
                std::thread::sleep(Duration::from_millis(200));
                let status = self.exited();
                panic!(
                    "redis-server on port {} does not answer PING (exit status: {status:?}); its log:\n{}",
                    self.port,
                    self.log_tail(80)
                );
            }
        }
    }

    /// Stops the server (SHUTDOWN SAVE or NOSAVE) and waits for the process.
    pub fn stop(&mut self, how: Shutdown) {
        let Some(mut child) = self.child.take() else { return };
        if let Ok(client) = redis::Client::open(self.url()) {
            if let Ok(mut con) = client.get_connection_with_timeout(Duration::from_secs(5)) {
                let arg = match how {
                    Shutdown::Save => "SAVE",
                    Shutdown::NoSave => "NOSAVE",
                };
                // The connection closes: the reply is an I/O error on success.
                let r: RedisResult<Value> = redis::cmd("SHUTDOWN").arg(arg).query(&mut con);
                if let Err(e) = &r {
                    if e.kind() != redis::ErrorKind::IoError && !e.is_connection_dropped() {
                        let _ = child.kill();
                        let _ = child.wait();
                        panic!("SHUTDOWN {arg} failed: {e}; server log:\n{}", self.log_tail(40));
                    }
                }
            }
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                _ if Instant::now() > deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("redis-server did not shut down in 20 s; log:\n{}", self.log_tail(40));
                }
                _ => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// Stops the server and starts it again on the same port and directory,
    /// with the same arguments (so it loads its RDB / AOF).
    pub fn restart(&mut self, how: Shutdown) {
        self.stop(how);
        self.start_again();
    }

    /// Starts a stopped server again on its port (retrying while the port is
    /// still busy).
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "server still running");
        for _ in 0..100 {
            match self.spawn_and_wait() {
                Ok(()) => return,
                Err(StartError::PortTaken) => std::thread::sleep(Duration::from_millis(100)),
                Err(StartError::Fatal(msg)) => panic!("restart: {msg}"),
            }
        }
        panic!("restart: port {} stayed taken", self.port);
    }

    /// Makes this server a replica of `primary` and waits for the full sync.
    pub fn replicaof(&self, primary: &Server) {
        let mut con = self.conn();
        let _: () = redis::cmd("REPLICAOF").arg("127.0.0.1").arg(primary.port).query(&mut con).expect("REPLICAOF");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let info = self.info(&mut con, "replication");
            if info.get("master_link_status").map(String::as_str) == Some("up")
                && info.get("master_sync_in_progress").map(String::as_str) == Some("0")
            {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "replica on port {} did not sync with {} in 30 s: {info:?}\nreplica log:\n{}\nprimary log:\n{}",
                    self.port,
                    primary.port,
                    self.log_tail(40),
                    primary.log_tail(40)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `INFO <section>` as a map of its `name:value` lines.
    pub fn info(&self, con: &mut redis::Connection, section: &str) -> HashMap<String, String> {
        let text: String = redis::cmd("INFO").arg(section).query(con).expect("INFO");
        parse_info(&text)
    }

    /// A one-node Redis Cluster that owns every slot, with the module
    /// loaded (`CROSSSLOT` checks need cluster mode).
    pub fn start_cluster_node() -> Server {
        let server = Server::with_args(&[], &["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]);
        let mut con = server.conn();
        let _: () = redis::cmd("CLUSTER")
            .arg("ADDSLOTSRANGE")
            .arg(0)
            .arg(16383)
            .query(&mut con)
            .expect("CLUSTER ADDSLOTSRANGE 0 16383");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let text: String = redis::cmd("CLUSTER").arg("INFO").query(&mut con).expect("CLUSTER INFO");
            if parse_info(&text).get("cluster_state").map(String::as_str) == Some("ok") {
                return server;
            }
            if Instant::now() > deadline {
                panic!("one-node cluster not ok in 20 s:\n{text}\nlog:\n{}", server.log_tail(40));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts `BGREWRITEAOF` and waits until the rewrite has finished.
    pub fn bgrewriteaof(&self, con: &mut redis::Connection) {
        let _: Value = redis::cmd("BGREWRITEAOF").query(con).expect("BGREWRITEAOF");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            std::thread::sleep(Duration::from_millis(50));
            let info = self.info(con, "persistence");
            if info.get("aof_rewrite_in_progress").map(String::as_str) == Some("0")
                && info.get("aof_rewrite_scheduled").map(String::as_str) == Some("0")
            {
                assert_eq!(
                    info.get("aof_last_bgrewrite_status").map(String::as_str),
                    Some("ok"),
                    "AOF rewrite failed; server log:\n{}",
                    self.log_tail(40)
                );
                return;
            }
            if Instant::now() > deadline {
                panic!("AOF rewrite did not finish in 30 s; log:\n{}", self.log_tail(40));
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- redis-server on port {} (dir {}), last log lines:\n{}\n---",
                self.port,
                self.dir.display(),
                self.log_tail(30)
            );
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::env::var_os("KEEP_TEST_SERVERS").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The pid of the server answering on `port`, if one answers PING.
fn ping_pid(port: u16) -> Option<u32> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
    let mut con = client.get_connection_with_timeout(Duration::from_millis(500)).ok()?;
    con.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let pong: String = redis::cmd("PING").query(&mut con).ok()?;
    if pong != "PONG" {
        return None;
    }
    let text: String = redis::cmd("INFO").arg("server").query(&mut con).ok()?;
    parse_info(&text).get("process_id")?.parse().ok()
}

pub fn parse_info(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

// ---------------------------------------------------------------------------
// Replies and errors
// ---------------------------------------------------------------------------

/// An error reply as the server sent it: `"CODE detail"`.
pub fn err_text(e: &RedisError) -> String {
    match (e.code(), e.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        (Some(code), None) => code.to_string(),
        _ => format!("<not a server error: {e}>"),
    }
}

/// Runs a command that must fail; returns the error text.
pub fn expect_err<A: redis::ToRedisArgs>(con: &mut redis::Connection, name: &str, args: A) -> String {
    let mut c = redis::cmd(name);
    c.arg(args);
    match c.query::<Value>(con) {
        Ok(v) => panic!("{name}: expected an error, got {v:?}"),
        Err(e) => {
            assert!(e.code().is_some(), "{name}: expected a server error, got {e}");
            err_text(&e)
        }
    }
}

/// Runs any command, returns its raw reply.
pub fn q<A: redis::ToRedisArgs>(con: &mut redis::Connection, name: &str, args: A) -> RedisResult<Value> {
    let mut c = redis::cmd(name);
    c.arg(args);
    c.query(con)
}

/// A string from a simple or bulk string reply.
pub fn as_str(v: &Value) -> String {
    match v {
        Value::SimpleString(s) => s.clone(),
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::Okay => "OK".into(),
        Value::VerbatimString { text, .. } => text.clone(),
        other => panic!("expected a string reply, got {other:?}"),
    }
}

pub fn as_int(v: &Value) -> i64 {
    match v {
        Value::Int(i) => *i,
        other => panic!("expected an integer reply, got {other:?}"),
    }
}

pub fn as_bytes(v: &Value) -> Option<Vec<u8>> {
    match v {
        Value::Nil => None,
        Value::BulkString(b) => Some(b.clone()),
        other => panic!("expected a bulk string or nil, got {other:?}"),
    }
}

/// Checks a token is 32 lowercase hex digits and returns it.
pub fn as_token(v: &Value) -> String {
    let t = match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).expect("token is UTF-8"),
        other => panic!("expected a token (bulk string), got {other:?}"),
    };
    assert_eq!(t.len(), 32, "token {t:?} is not 32 characters");
    assert!(t.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)), "token {t:?} is not lowercase hex");
    t
}

/// A random well-formed token (32 lowercase hex digits) that no claim issued.
pub fn random_token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// `(status, value, attempt)` from a CLAIM reply.
pub fn parse_claim(v: Value) -> (String, Value, i64) {
    match v {
        Value::Array(items) if items.len() == 3 => {
            let mut it = items.into_iter();
            let status = as_str(&it.next().unwrap());
            let value = it.next().unwrap();
            let attempt = as_int(&it.next().unwrap());
            (status, value, attempt)
        }
        other => panic!("expected a 3-element CLAIM reply, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// Module commands
// ---------------------------------------------------------------------------

/// `IDEM.CLAIM key lease` → `(status, value, attempt)`.
pub fn claim(con: &mut redis::Connection, key: &str, lease: i64) -> (String, Value, i64) {
    claim_opts(con, key, lease, &[])
}

/// `IDEM.CLAIM key lease <opts...>` → `(status, value, attempt)`.
pub fn claim_opts(con: &mut redis::Connection, key: &str, lease: i64, opts: &[&str]) -> (String, Value, i64) {
    let v = redis::cmd("IDEM.CLAIM")
        .arg(key)
        .arg(lease)
        .arg(opts)
        .query::<Value>(con)
        .unwrap_or_else(|e| panic!("IDEM.CLAIM {key} {lease} {opts:?}: {e}"));
    parse_claim(v)
}

/// Claims an absent key: asserts NEW / attempt 1, returns the token.
pub fn claim_new(con: &mut redis::Connection, key: &str, lease: i64) -> String {
    claim_new_opts(con, key, lease, &[])
}

pub fn claim_new_opts(con: &mut redis::Connection, key: &str, lease: i64, opts: &[&str]) -> String {
    let (status, value, attempt) = claim_opts(con, key, lease, opts);
    assert_eq!((status.as_str(), attempt), ("NEW", 1), "CLAIM {key}: value {value:?}");
    as_token(&value)
}

/// `IDEM.DONE key token [args...]` → reply integer, or the error text.
pub fn done<A: redis::ToRedisArgs>(
    con: &mut redis::Connection,
    key: &str,
    token: &str,
    args: A,
) -> Result<i64, String> {
    redis::cmd("IDEM.DONE").arg(key).arg(token).arg(args).query::<i64>(con).map_err(|e| err_text(&e))
}

/// `IDEM.RELEASE key token` → 0/1 (panics on an error).
pub fn release(con: &mut redis::Connection, key: &str, token: &str) -> i64 {
    redis::cmd("IDEM.RELEASE")
        .arg(key)
        .arg(token)
        .query::<i64>(con)
        .unwrap_or_else(|e| panic!("IDEM.RELEASE {key}: {e}"))
}

/// `IDEM.EXTEND key token lease` → 1, or the error text.
pub fn extend(con: &mut redis::Connection, key: &str, token: &str, lease: i64) -> Result<i64, String> {
    redis::cmd("IDEM.EXTEND").arg(key).arg(token).arg(lease).query::<i64>(con).map_err(|e| err_text(&e))
}

/// `IDEM.ONCE key retain` → 0/1.
pub fn once(con: &mut redis::Connection, key: &str, retain: i64) -> i64 {
    redis::cmd("IDEM.ONCE").arg(key).arg(retain).query::<i64>(con).unwrap_or_else(|e| panic!("IDEM.ONCE {key}: {e}"))
}

/// The fields of `IDEM.GET`, in the order the spec lists them.
pub const GET_FIELDS: [&str; 8] =
    ["state", "attempt", "lease_ms", "pttl", "claimed_at", "done_at", "result", "fingerprint"];

pub type Fields = HashMap<String, Value>;

/// `IDEM.GET key` as a map (RESP2 flat array or RESP3 map); `None` for nil.
/// Checks the reply shape: every field once, in the spec's order for RESP2.
pub fn get_opt(con: &mut redis::Connection, key: &str) -> Option<Fields> {
    let v: Value = redis::cmd("IDEM.GET").arg(key).query(con).unwrap_or_else(|e| panic!("IDEM.GET {key}: {e}"));
    fields_from_reply(v)
}

pub fn fields_from_reply(v: Value) -> Option<Fields> {
    let pairs: Vec<(Value, Value)> = match v {
        Value::Nil => return None,
        Value::Array(items) => {
            assert_eq!(items.len(), 16, "IDEM.GET: expected 8 field/value pairs, got {items:?}");
            let mut pairs = Vec::new();
            let mut it = items.into_iter();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                pairs.push((k, v));
            }
            let names: Vec<String> = pairs.iter().map(|(k, _)| as_str(k)).collect();
            assert_eq!(names, GET_FIELDS, "IDEM.GET field order (RESP2)");
            pairs
        }
        Value::Map(pairs) => pairs,
        other => panic!("IDEM.GET: expected nil, an array or a map, got {other:?}"),
    };
    let mut fields = Fields::new();
    for (k, v) in pairs {
        let name = as_str(&k);
        let v = match (name.as_str(), v) {
            // Accept the state as a simple or a bulk string.
            ("state", v) => Value::SimpleString(as_str(&v)),
            (_, v) => v,
        };
        assert!(fields.insert(name.clone(), v).is_none(), "IDEM.GET: field {name} twice");
    }
    let mut names: Vec<&str> = fields.keys().map(String::as_str).collect();
    names.sort();
    let mut expected = GET_FIELDS.to_vec();
    expected.sort();
    assert_eq!(names, expected, "IDEM.GET field names");
    Some(fields)
}

/// `IDEM.GET key`, which must exist.
pub fn get_fields(con: &mut redis::Connection, key: &str) -> Fields {
    get_opt(con, key).unwrap_or_else(|| panic!("IDEM.GET {key}: nil, expected a record"))
}

pub fn f_str(f: &Fields, name: &str) -> String {
    as_str(&f[name])
}

pub fn f_int(f: &Fields, name: &str) -> i64 {
    as_int(&f[name])
}

pub fn f_bytes(f: &Fields, name: &str) -> Option<Vec<u8>> {
    as_bytes(&f[name])
}

pub fn pexpiretime(con: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("PEXPIRETIME").arg(key).query(con).expect("PEXPIRETIME")
}

pub fn pttl(con: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(con).expect("PTTL")
}

pub fn exists(con: &mut redis::Connection, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query::<i64>(con).expect("EXISTS") == 1
}

/// The server's clock (`TIME`) in Unix ms.
pub fn server_ms(con: &mut redis::Connection) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query(con).expect("TIME");
    s * 1000 + us / 1000
}

/// The fingerprint a PAYLOAD must show in IDEM.GET.
pub fn fingerprint_hex(payload: &[u8]) -> String {
    format!("{:032x}", xxhash_rust::xxh3::xxh3_128(payload))
}

/// `INFO idem` counters, names without an `idem_` prefix.
pub fn idem_counters(con: &mut redis::Connection) -> HashMap<String, i64> {
    let text: String = redis::cmd("INFO").arg("idem").query(con).expect("INFO idem");
    let mut out = HashMap::new();
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        if let Some((k, v)) = line.trim().split_once(':') {
            let k = k.strip_prefix("idem_").unwrap_or(k);
            if let Ok(n) = v.trim().parse::<i64>() {
                out.insert(k.to_string(), n);
            }
        }
    }
    assert!(!out.is_empty(), "INFO idem has no counters:\n{text}");
    out
}

// ---------------------------------------------------------------------------
// Records in every state, and snapshots of them (persistence, replication)
// ---------------------------------------------------------------------------

/// No extra arguments (for `done(.., NONE)`).
pub const NONE: &[&str] = &[];

pub const BIN_RESULT: &[u8] = b"\x00\xff\xfe bin\r\n\x00\x80 result";

/// The base names of the records `populate` makes (each prefixed).
pub const FIXTURE_KEYS: [&str; 12] = [
    "rec:expired",
    "rec:processing",
    "rec:processing-nofp",
    "rec:released",
    "rec:retried",
    "rec:done-result",
    "rec:done-noresult",
    "rec:done-empty",
    "rec:done-fp",
    "rec:done-big",
    "rec:once",
    "rec:late-done",
];

/// Records in every state, made by `populate`, with the tokens they hold.
pub struct Fixture {
    pub prefix: String,
    /// Full key names.
    pub keys: Vec<String>,
    /// Latest token of each claimed record, by base name.
    pub tokens: HashMap<&'static str, String>,
    /// The first token of `rec:retried` (superseded by its second claim).
    pub retried_old_token: String,
}

impl Fixture {
    /// Full key name of a base name.
    pub fn key(&self, base: &str) -> String {
        format!("{}{}", self.prefix, base)
    }

    pub fn key_refs(&self) -> Vec<&str> {
        self.keys.iter().map(String::as_str).collect()
    }
}

/// Creates records in every state, key names starting with `prefix`.
/// Takes ~1.1 s (a lease must lapse).
pub fn populate(con: &mut redis::Connection, prefix: &str) -> Fixture {
    let k = |base: &str| format!("{prefix}{base}");
    let mut tokens = HashMap::new();
    let started = Instant::now();
    // expired: lease of 1 s, lapsed by the end of this function.
    tokens.insert("rec:expired", claim_new_opts(con, &k("rec:expired"), 1, &["PAYLOAD", "exp-payload"]));
    tokens.insert("rec:processing", claim_new_opts(con, &k("rec:processing"), 600, &["PAYLOAD", "payload-1"]));
    tokens.insert("rec:processing-nofp", claim_new(con, &k("rec:processing-nofp"), 700));
    let t = claim_new(con, &k("rec:released"), 600);
    assert_eq!(release(con, &k("rec:released"), &t), 1);
    tokens.insert("rec:released", t);
    let old = claim_new_opts(con, &k("rec:retried"), 600, &["MAXTRIES", "5"]);
    assert_eq!(release(con, &k("rec:retried"), &old), 1);
    let (status, value, attempt) = claim(con, &k("rec:retried"), 800);
    assert_eq!((status.as_str(), attempt), ("RETRY", 2));
    tokens.insert("rec:retried", as_token(&value));
    let t = claim_new(con, &k("rec:done-result"), 600);
    assert_eq!(done(con, &k("rec:done-result"), &t, ("RESULT", BIN_RESULT, "RETAIN", 5000)), Ok(1));
    let t = claim_new(con, &k("rec:done-noresult"), 600);
    assert_eq!(done(con, &k("rec:done-noresult"), &t, NONE), Ok(1));
    let t = claim_new(con, &k("rec:done-empty"), 600);
    assert_eq!(done(con, &k("rec:done-empty"), &t, ("RESULT", "")), Ok(1));
    let t = claim_new_opts(con, &k("rec:done-fp"), 600, &["PAYLOAD", "fp-payload"]);
    assert_eq!(done(con, &k("rec:done-fp"), &t, ("RESULT", "ok", "RETAIN", 9000)), Ok(1));
    let t = claim_new(con, &k("rec:done-big"), 600);
    let big: Vec<u8> = (0..20_000u32).map(|i| (i * 7 % 251) as u8).collect();
    assert_eq!(done(con, &k("rec:done-big"), &t, ("RESULT", big)), Ok(1));
    assert_eq!(once(con, &k("rec:once"), 7000), 1);
    assert_eq!(done(con, &k("rec:late-done"), &random_token(), ("RESULT", "late")), Ok(1));
    let elapsed = started.elapsed();
    let wait = Duration::from_millis(1150);
    if elapsed < wait {
        std::thread::sleep(wait - elapsed);
    }
    let f = get_fields(con, &k("rec:expired"));
    assert_eq!(f_str(&f, "state"), "expired", "rec:expired: {f:?}");
    Fixture {
        prefix: prefix.to_string(),
        keys: FIXTURE_KEYS.iter().map(|b| k(b)).collect(),
        tokens,
        retried_old_token: old,
    }
}

/// What `IDEM.GET` and `PEXPIRETIME` say about a key.
#[derive(Debug, Clone)]
pub struct Snap {
    pub key: String,
    pub fields: Option<Fields>,
    pub pexpiretime: i64,
}

pub fn snapshot(con: &mut redis::Connection, key: &str) -> Snap {
    Snap { key: key.to_string(), fields: get_opt(con, key), pexpiretime: pexpiretime(con, key) }
}

pub fn snapshot_all(con: &mut redis::Connection, keys: &[&str]) -> Vec<Snap> {
    keys.iter().map(|k| snapshot(con, k)).collect()
}

/// Asserts two snapshots of a record are the same record: every field
/// exact except the time-relative `lease_ms` / `pttl` (within `tol_ms`), and
/// the absolute expiry exact.
pub fn assert_same_record(before: &Snap, after: &Snap, tol_ms: i64, what: &str) {
    let (Some(b), Some(a)) = (&before.fields, &after.fields) else {
        panic!("{what}: {} was {:?}, {} is {:?}", before.key, before.fields, after.key, after.fields);
    };
    for name in ["state", "attempt", "claimed_at", "done_at", "result", "fingerprint"] {
        assert_eq!(b[name], a[name], "{what}: field {name} of {} (before) vs {} (after)", before.key, after.key);
    }
    for name in ["lease_ms", "pttl"] {
        let (x, y) = (as_int(&b[name]), as_int(&a[name]));
        assert!(
            (x - y).abs() <= tol_ms,
            "{what}: field {name} of {} was {x}, of {} is {y} (tolerance {tol_ms} ms)",
            before.key,
            after.key
        );
    }
    assert_eq!(before.pexpiretime, after.pexpiretime, "{what}: PEXPIRETIME of {} vs {}", before.key, after.key);
}

pub fn assert_same_records(before: &[Snap], after: &[Snap], tol_ms: i64, what: &str) {
    assert_eq!(before.len(), after.len());
    for (b, a) in before.iter().zip(after) {
        assert_same_record(b, a, tol_ms, what);
    }
}

/// After a reload/copy/failover, the tokens the fixture holds still work on
/// the records now named `name(full key)`, and wrong tokens still do not.
/// (This changes the records.)
pub fn check_fixture_tokens(con: &mut redis::Connection, fx: &Fixture, name: impl Fn(&str) -> String) {
    let key = |base: &str| name(&fx.key(base));
    let k = key("rec:processing");
    assert!(done(con, &k, &random_token(), NONE).unwrap_err().starts_with("STALE"), "{k}: wrong token");
    assert_eq!(extend(con, &k, &fx.tokens["rec:processing"], 900), Ok(1), "{k}: EXTEND with its token");
    assert_eq!(done(con, &k, &fx.tokens["rec:processing"], ("RESULT", "r")), Ok(1), "{k}: DONE with its token");

    let k = key("rec:processing-nofp");
    assert_eq!(release(con, &k, &fx.tokens["rec:processing-nofp"]), 1, "{k}: RELEASE with its token");
    let (s, _, a) = claim(con, &k, 60);
    assert_eq!((s.as_str(), a), ("RETRY", 2), "{k}");

    // The lapsed lease, nobody claimed since: the token still extends it.
    let k = key("rec:expired");
    assert_eq!(extend(con, &k, &fx.tokens["rec:expired"], 60), Ok(1), "{k}: EXTEND after lapse");
    assert_eq!(f_str(&get_fields(con, &k), "state"), "processing");

    let k = key("rec:retried");
    assert!(
        done(con, &k, &fx.retried_old_token, NONE).unwrap_err().starts_with("STALE"),
        "{k}: superseded token must be STALE"
    );
    assert_eq!(done(con, &k, &fx.tokens["rec:retried"], NONE), Ok(1), "{k}: DONE with the latest token");

    let k = key("rec:released");
    assert_eq!(release(con, &k, &fx.tokens["rec:released"]), 0, "{k}");
    let (s, v, a) = claim(con, &k, 60);
    assert_eq!((s.as_str(), a), ("RETRY", 2), "{k}");
    assert_ne!(as_token(&v), fx.tokens["rec:released"], "{k}: a new claim got an old token");

    let k = key("rec:done-result");
    let (s, v, a) = claim(con, &k, 60);
    assert_eq!((s, v, a), ("DONE".to_string(), Value::BulkString(BIN_RESULT.to_vec()), 1), "{k}");
    let k = key("rec:done-empty");
    let (s, v, _) = claim(con, &k, 60);
    assert_eq!((s.as_str(), v), ("DONE", Value::BulkString(vec![])), "{k}");
    let k = key("rec:done-fp");
    let (s, v, _) = claim_opts(con, &k, 60, &["PAYLOAD", "other"]);
    assert_eq!((s.as_str(), v), ("MISMATCH", Value::Nil), "{k}: fingerprint kept");
    let k = key("rec:once");
    let (s, v, a) = claim(con, &k, 60);
    assert_eq!((s, v, a), ("DONE".to_string(), Value::Nil, 0), "{k}");
}

/// `IDEM.BF.RESERVE key error_rate capacity <opts>`, which must answer OK.
pub fn reserve(con: &mut redis::Connection, key: &str, error_rate: &str, capacity: i64, opts: &[&str]) {
    let r: String = redis::cmd("IDEM.BF.RESERVE")
        .arg(key)
        .arg(error_rate)
        .arg(capacity)
        .arg(opts)
        .query(con)
        .unwrap_or_else(|e| panic!("IDEM.BF.RESERVE {key} {error_rate} {capacity} {opts:?}: {e}"));
    assert_eq!(r, "OK");
}

/// `DEBUG DIGEST-VALUE key` as hex.
pub fn digest_value(con: &mut redis::Connection, key: &str) -> String {
    let v: Vec<String> = redis::cmd("DEBUG").arg("DIGEST-VALUE").arg(key).query(con).expect("DEBUG DIGEST-VALUE");
    v.into_iter().next().unwrap()
}

/// `DEBUG DIGEST`: a digest of the whole dataset, expiry times included.
pub fn digest(con: &mut redis::Connection) -> String {
    redis::cmd("DEBUG").arg("DIGEST").query(con).expect("DEBUG DIGEST")
}

/// A 64-bit CRC as Redis computes it (Jones polynomial, reflected): the
/// checksum at the end of a DUMP payload.
pub fn crc64_redis(data: &[u8]) -> u64 {
    const POLY: u64 = 0x95ac_9329_ac4b_c9b5; // 0xad93d23594c935a9 reflected
    let mut crc: u64 = 0;
    for &byte in data {
        crc ^= byte as u64;
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ POLY } else { crc >> 1 };
        }
    }
    crc
}

/// Rewrites the trailing CRC of a DUMP payload so Redis accepts its checksum.
pub fn fix_dump_crc(payload: &mut Vec<u8>) {
    let n = payload.len();
    assert!(n > 10);
    let crc = crc64_redis(&payload[..n - 8]);
    payload[n - 8..].copy_from_slice(&crc.to_le_bytes());
}

/// `MIGRATE 127.0.0.1 <port> "" 0 5000 COPY KEYS <keys>`: copies the keys
/// to another server through DUMP/RESTORE payloads, as resharding does.
pub fn migrate_copy<K: redis::ToRedisArgs>(con: &mut redis::Connection, port: u16, keys: K) {
    let reply: String = redis::cmd("MIGRATE")
        .arg("127.0.0.1")
        .arg(port)
        .arg("")
        .arg(0)
        .arg(5000)
        .arg("COPY")
        .arg("KEYS")
        .arg(keys)
        .query(con)
        .expect("MIGRATE");
    assert_eq!(reply, "OK");
}
