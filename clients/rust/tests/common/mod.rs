//! The servers the client's tests run against, started by the tests on
//! free 127.0.0.1 ports: `REDIS_SERVER` (default `redis-server`) with the
//! module `REDIS_IDEM_MODULE` (default `<repo>/target/release/libredis_idem.so`)
//! loaded, or, with `REDIS_IDEM_EDITION=functions`, without the module and
//! with `functions/idem.lua` loaded; one server or a 3-node cluster.
#![allow(dead_code)] // each test binary uses part of it

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("the repository")
}

fn module() -> PathBuf {
    let path = std::env::var_os("REDIS_IDEM_MODULE")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/release/libredis_idem.so"));
    let path = if path.is_absolute() { path } else { repo().join(path) };
    assert!(
        path.is_file(),
        "module not found at {}: run `cargo build --release` (or set REDIS_IDEM_MODULE)",
        path.display()
    );
    path
}

/// True when the suite runs on the Functions edition.
pub fn functions_mode() -> bool {
    std::env::var("REDIS_IDEM_EDITION").is_ok_and(|e| e == "functions")
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

pub struct Server {
    pub port: u16,
    dir: PathBuf,
    child: Child,
    pub functions: bool,
}

impl Server {
    /// A server of the suite's edition.
    pub fn start() -> Server {
        Server::launch(functions_mode(), &[])
    }

    /// A server without the module, the Functions library loaded.
    pub fn functions() -> Server {
        Server::launch(true, &[])
    }

    pub fn launch(functions: bool, extra: &[&str]) -> Server {
        for _ in 0..20 {
            let port = free_port(extra.contains(&"--cluster-enabled"));
            if let Some(server) = Server::spawn(port, functions, extra) {
                return server;
            }
        }
        panic!("could not start a server on a free port");
    }

    fn spawn(port: u16, functions: bool, extra: &[&str]) -> Option<Server> {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "idem-client-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let server_bin = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let mut command = Command::new(&server_bin);
        command.args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]);
        command.arg("--dir").arg(&dir).arg("--logfile").arg(dir.join("log"));
        if !functions {
            command.arg("--loadmodule").arg(module());
        }
        command.args(extra).current_dir(&dir).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        let mut child = command.spawn().unwrap_or_else(|e| panic!("cannot run {server_bin}: {e}"));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                let log = std::fs::read_to_string(dir.join("log")).unwrap_or_default();
                assert!(log.contains("Address already in use"), "the server exited at start:\n{log}");
                return None;
            }
            if let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
                && let Ok(mut con) = client.get_connection_with_timeout(Duration::from_millis(200))
                && redis::cmd("PING").query::<String>(&mut con).is_ok()
            {
                break;
            }
            assert!(Instant::now() < deadline, "the server did not answer in 10 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        let server = Server { port, dir, child, functions };
        if functions {
            server.load_functions();
        }
        Some(server)
    }

    pub fn load_functions(&self) {
        let lua = std::fs::read_to_string(repo().join("functions/idem.lua")).expect("functions/idem.lua");
        let _: String =
            redis::cmd("FUNCTION").arg("LOAD").arg("REPLACE").arg(lua).query(&mut self.conn()).expect("FUNCTION LOAD");
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).unwrap()
    }

    pub fn conn(&self) -> redis::Connection {
        let con = self.client().get_connection().expect("connect");
        con.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        con
    }

    pub fn conn_resp3(&self) -> redis::Connection {
        let con =
            redis::Client::open(format!("{}?protocol=resp3", self.url())).unwrap().get_connection().expect("connect");
        con.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        con
    }

    /// `INFO <section>`'s field, as a number (0 when absent).
    pub fn info_count(&self, section: &str, field: &str) -> i64 {
        let text: String = redis::cmd("INFO").arg(section).query(&mut self.conn()).unwrap();
        text.lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| *k == field)
            .and_then(|(_, v)| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// How many times the server ran `command` (INFO commandstats).
    pub fn calls(&self, command: &str) -> i64 {
        let text: String = redis::cmd("INFO").arg("commandstats").query(&mut self.conn()).unwrap();
        let name = format!("cmdstat_{}:", command.to_lowercase());
        text.lines()
            .find_map(|l| l.get(..name.len()).filter(|head| head.eq_ignore_ascii_case(&name)).map(|_| &l[name.len()..]))
            .and_then(|rest| rest.split(',').find_map(|f| f.strip_prefix("calls=")).and_then(|n| n.parse().ok()))
            .unwrap_or(0)
    }

    pub fn config_set(&self, name: &str, value: &str) {
        let _: () = redis::cmd("CONFIG").arg("SET").arg(name).arg(value).query(&mut self.conn()).expect("CONFIG SET");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A free port; for a cluster node, one whose bus port (+10000) is free
/// too, below the ephemeral range.
fn free_port(cluster: bool) -> u16 {
    if !cluster {
        return TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    }
    let seed = std::process::id() as u64 * 7919 + NEXT.fetch_add(1, Ordering::SeqCst) as u64 * 104_729;
    for i in 0..10_000u64 {
        let port = 12_000 + ((seed + i * 613) % 10_700) as u16;
        let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && free(port + 10_000) {
            return port;
        }
    }
    panic!("no free port pair");
}

/// A Redis Cluster of 3 primaries (no replicas), slots split in three,
/// formed with CLUSTER ADDSLOTSRANGE and CLUSTER MEET.
pub struct Cluster {
    pub nodes: Vec<Server>,
}

impl Cluster {
    pub fn start() -> Cluster {
        let functions = functions_mode();
        let nodes: Vec<Server> = (0..3)
            .map(|_| {
                Server::launch(
                    functions,
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        "2000",
                    ],
                )
            })
            .collect();
        let ranges = [(0, 5460), (5461, 10922), (10923, 16383)];
        for (node, (from, to)) in nodes.iter().zip(ranges) {
            let _: () = redis::cmd("CLUSTER").arg("ADDSLOTSRANGE").arg(from).arg(to).query(&mut node.conn()).unwrap();
        }
        for node in &nodes[1..] {
            let _: () =
                redis::cmd("CLUSTER").arg("MEET").arg("127.0.0.1").arg(nodes[0].port).query(&mut node.conn()).unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for node in &nodes {
            loop {
                let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut node.conn()).unwrap();
                if info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:3") {
                    break;
                }
                assert!(Instant::now() < deadline, "the cluster did not form in 30 s:\n{info}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Cluster { nodes }
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Server::url).collect()
    }

    pub fn client(&self) -> redis::cluster::ClusterClient {
        redis::cluster::ClusterClient::new(self.urls()).unwrap()
    }

    /// The node that owns `key`'s slot.
    pub fn node_of(&self, key: &str) -> &Server {
        let slot: i64 = redis::cmd("CLUSTER").arg("KEYSLOT").arg(key).query(&mut self.nodes[0].conn()).unwrap();
        &self.nodes[match slot {
            0..=5460 => 0,
            5461..=10922 => 1,
            _ => 2,
        }]
    }
}

/// Polls `condition` every 10 ms for up to `within`.
pub fn eventually(within: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !condition() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
