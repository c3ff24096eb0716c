//! The servers under test: a `redis-server` (or `valkey-server`) child
//! process with the module loaded, on a free port, in its own directory
//! under `target/test-servers/`; restarts, replicas, AOF rewrites, `INFO`.
use redis::{RedisResult, Value};
use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

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

pub(crate) fn redis_server_bin() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_string())
}

pub(crate) fn test_servers_root() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let target = if target.is_absolute() { target } else { Path::new(env!("CARGO_MANIFEST_DIR")).join(target) };
    target.join("test-servers")
}

/// A port nobody listens on right now. Another process may take it before
/// the server binds it: `Server` then retries with another port, and checks
/// the server it talks to is its own (by pid).
pub(crate) fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().unwrap().port()
}

pub(crate) static NEXT_ID: AtomicUsize = AtomicUsize::new(0);

/// How `restart` stops the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shutdown {
    /// `SHUTDOWN SAVE`: write an RDB first.
    Save,
    /// `SHUTDOWN NOSAVE`: no RDB (the AOF, when on, is still flushed).
    NoSave,
}

pub(crate) enum StartError {
    /// The port was taken: try another one.
    PortTaken,
    /// Anything else: give up with this message.
    Fatal(String),
}

/// A `redis-server` child process with the module loaded.
pub struct Server {
    pub port: u16,
    pub dir: PathBuf,
    pub(crate) module_args: Vec<String>,
    pub(crate) extra_args: Vec<String>,
    pub(crate) child: Option<Child>,
    /// False for a plain server (the Functions edition's tests).
    pub(crate) load_module: bool,
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
        Server::launch(true, module_args, extra_args)
    }

    /// A server without the module (for the Functions edition).
    pub fn without_module(extra_args: &[&str]) -> Server {
        Server::launch(false, &[], extra_args).unwrap_or_else(|msg| panic!("{msg}"))
    }

    fn launch(load_module: bool, module_args: &[&str], extra_args: &[&str]) -> Result<Server, String> {
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
            load_module,
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
        ];
        if self.load_module {
            args.extend(["--loadmodule".into(), module_path().display().to_string()]);
            args.extend(self.module_args.iter().cloned());
        }
        args.extend(self.extra_args.iter().cloned());
        args
    }

    /// Starts the process on `self.port` and waits until it answers PING.
    pub(crate) fn spawn_and_wait(&mut self) -> Result<(), StartError> {
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
            if let Some(their_pid) = ping_pid(self.port)
                && their_pid == pid
            {
                self.child = Some(child);
                return Ok(());
            }
            // Someone else's server has this port: ours will exit.
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
        if let Ok(client) = redis::Client::open(self.url())
            && let Ok(mut con) = client.get_connection_with_timeout(Duration::from_secs(5))
        {
            let arg = match how {
                Shutdown::Save => "SAVE",
                Shutdown::NoSave => "NOSAVE",
            };
            // The connection closes: the reply is an I/O error on success.
            let r: RedisResult<Value> = redis::cmd("SHUTDOWN").arg(arg).query(&mut con);
            if let Err(e) = &r
                && e.kind() != redis::ErrorKind::IoError
                && !e.is_connection_dropped()
            {
                let _ = child.kill();
                let _ = child.wait();
                panic!("SHUTDOWN {arg} failed: {e}; server log:\n{}", self.log_tail(40));
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
pub(crate) fn ping_pid(port: u16) -> Option<u32> {
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

/// Which server the tests run on, from `INFO server`. Tests that answer
/// differently on one server read it here (the one version parser of the
/// tests); the module itself checks API functions, never versions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerKind {
    Redis,
    Valkey,
}

/// A server's kind and its own version (Valkey's `valkey_version`, not the
/// `redis_version` 7.2.4 it reports for compatibility).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerVersion {
    pub kind: ServerKind,
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl ServerVersion {
    pub fn of(con: &mut redis::Connection) -> ServerVersion {
        let text: String = redis::cmd("INFO").arg("server").query(con).expect("INFO server");
        let info = parse_info(&text);
        let (kind, version) = match info.get("valkey_version") {
            Some(version) => (ServerKind::Valkey, version),
            None => (ServerKind::Redis, &info["redis_version"]),
        };
        let mut parts = version.split('.').map(|part| part.parse::<u32>().unwrap_or(0));
        let mut next = || parts.next().unwrap_or(0);
        ServerVersion { kind, major: next(), minor: next(), patch: next() }
    }

    /// This kind of server, at `major.minor` or later.
    pub fn is_at_least(self, kind: ServerKind, major: u32, minor: u32) -> bool {
        self.kind == kind && (self.major, self.minor) >= (major, minor)
    }
}

impl std::fmt::Display for ServerVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self.kind {
            ServerKind::Redis => "Redis",
            ServerKind::Valkey => "Valkey",
        };
        write!(f, "{name} {}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl Server {
    pub fn version(&self) -> ServerVersion {
        ServerVersion::of(&mut self.conn())
    }
}

/// `blocked_clients` of `INFO clients`.
pub fn blocked_clients(con: &mut redis::Connection) -> i64 {
    let text: String = redis::cmd("INFO").arg("clients").query(con).unwrap();
    parse_info(&text)["blocked_clients"].parse().unwrap()
}

/// Waits (up to 5 s) until the server has `n` blocked clients.
pub fn wait_for_blocked(con: &mut redis::Connection, n: i64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let now = blocked_clients(con);
        if now == n {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "expected {n} blocked clients, the server has {now}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// `WAIT n 10000` on the connection that wrote: `n` replicas acknowledged.
pub fn wait_replicas(con: &mut redis::Connection, n: i64) {
    let acked: i64 = redis::cmd("WAIT").arg(n).arg(10_000).query(con).expect("WAIT");
    assert_eq!(acked, n, "WAIT {n}: only {acked} replica(s) acknowledged");
}

/// Server options for an AOF written command by command (no RDB preamble),
/// fsynced at every write.
pub fn aof_args() -> Vec<&'static str> {
    vec!["--appendonly", "yes", "--aof-use-rdb-preamble", "no", "--appendfsync", "always"]
}
