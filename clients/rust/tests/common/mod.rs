//! The servers the client's tests run against, started by the tests on
//! free 127.0.0.1 ports: `REDIS_SERVER` (default `redis-server`) with the
//! module `REDIS_IDEM_MODULE` (default `<repo>/target/release/libredis_idem.so`)
//! loaded, or, with `REDIS_IDEM_EDITION=functions`, without the module and
//! with `functions/idem.lua` loaded; one server or a 3-node cluster.
#![allow(dead_code)] // each test binary uses part of it

use std::collections::HashMap;
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
            // Our pid, not a PING: another suite's server can take the port
            // first, and ours exits while theirs answers.
            if let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
                && let Ok(mut con) = client.get_connection_with_timeout(Duration::from_millis(200))
                && let Ok(info) = redis::cmd("INFO").arg("server").query::<String>(&mut con)
            {
                if info.contains(&format!("process_id:{}\r\n", child.id())) {
                    break;
                }
                let _ = child.kill();
                let _ = child.wait();
                return None;
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

    /// A connection (tried again for a few seconds: a Sentinel's
    /// failover closes every client of the servers it reconfigures).
    pub fn conn(&self) -> redis::Connection {
        let mut tries = 0;
        let con = loop {
            match self.client().get_connection() {
                Ok(con) => break con,
                Err(e) if tries < 50 => {
                    let _ = e;
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => panic!("connect: {e}"),
            }
        };
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

impl Server {
    /// Makes this server a replica of `primary` and waits until the
    /// primary lists it online with the primary's offset and it
    /// acknowledges a write.
    pub fn replicate(&self, primary: &Server) {
        let _: () =
            redis::cmd("REPLICAOF").arg("127.0.0.1").arg(primary.port).query(&mut self.conn()).expect("REPLICAOF");
        primary.wait_replica_synced(self.port);
        primary.wait_acknowledged();
    }

    /// Waits until this primary's replica acknowledges a write made on it
    /// now (a SET, then WAIT 1 on the same connection): only then has the
    /// replica loaded its full sync and received everything written
    /// before. Listed online at the primary's offset is not that: after a
    /// full sync both offsets are 0 until the first write while the
    /// replica may still be loading, and a replica promoted then comes up
    /// without the writes made meanwhile. (A WAIT after no write of its
    /// connection's own answers at once.)
    pub fn wait_acknowledged(&self) {
        let mut con = self.conn();
        eventually(Duration::from_secs(30), "the replica acknowledges a write", || {
            let _: () = redis::cmd("SET").arg("topology:acknowledged").arg(self.port).query(&mut con).unwrap();
            redis::cmd("WAIT").arg(1).arg(1000).query::<i64>(&mut con).unwrap() >= 1
        });
    }

    /// Waits until the replica on `port` is online with this server's offset.
    pub fn wait_replica_synced(&self, port: u16) {
        eventually(Duration::from_secs(30), "the replica in sync", || {
            let info: String = redis::cmd("INFO").arg("replication").query(&mut self.conn()).unwrap();
            let offset = info.lines().find_map(|l| l.strip_prefix("master_repl_offset:")).unwrap_or("-").trim();
            let want = format!("port={port},state=online,offset={offset},");
            info.lines().any(|l| l.starts_with("slave") && l.contains(&want))
        });
    }

    /// `ROLE`'s first element: master, slave or sentinel.
    /// "" while it cannot answer (a failover kills its clients).
    pub fn role(&self) -> String {
        let Ok(role) = redis::cmd("ROLE").query::<Vec<redis::Value>>(&mut self.conn()) else { return String::new() };
        redis::from_redis_value(role[0].clone()).unwrap_or_default()
    }
}

/// A primary and one replica of it (the `replicated` topology).
pub struct Replicated {
    pub primary: Server,
    pub replica: Server,
}

impl Replicated {
    pub fn start() -> Replicated {
        let primary = Server::start();
        let replica = Server::launch(functions_mode(), &[]);
        replica.replicate(&primary);
        Replicated { primary, replica }
    }
}

/// A primary, one replica and one Sentinel monitoring them as `mymaster`
/// with quorum 1 (the `sentinel` topology); a failover swaps the roles.
pub struct Sentineled {
    pub servers: [Server; 2],
    pub sentinel_port: u16,
    sentinel: Child,
    dir: PathBuf,
}

impl Sentineled {
    pub fn start() -> Sentineled {
        let Replicated { primary, replica } = Replicated::start();
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "idem-sentinel-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let port = free_port(false);
        let conf = format!(
            "port {port}\nbind 127.0.0.1\ndir {}\nlogfile {}\nsentinel monitor mymaster 127.0.0.1 {} 1\n\
             sentinel down-after-milliseconds mymaster 2000\nsentinel failover-timeout mymaster 10000\n",
            dir.display(),
            dir.join("log").display(),
            primary.port
        );
        std::fs::write(dir.join("sentinel.conf"), conf).unwrap();
        let server_bin = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let sentinel = Command::new(server_bin)
            .arg(dir.join("sentinel.conf"))
            .arg("--sentinel")
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("a Sentinel");
        let set = Sentineled { servers: [primary, replica], sentinel_port: port, sentinel, dir };
        // Ready once it knows the replica as a healthy one.
        eventually(Duration::from_secs(30), "the Sentinel sees the replica", || {
            let Ok(mut con) = redis::Client::open(set.sentinel_url()).and_then(|c| c.get_connection()) else {
                return false;
            };
            let replicas: redis::RedisResult<Vec<HashMap<String, String>>> =
                redis::cmd("SENTINEL").arg("REPLICAS").arg("mymaster").query(&mut con);
            replicas.is_ok_and(|r| {
                r.iter().any(|r| {
                    r.get("flags").is_some_and(|f| f == "slave")
                        && r.get("master-link-status").is_some_and(|s| s == "ok")
                })
            })
        });
        set
    }

    pub fn sentinel_url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.sentinel_port)
    }

    /// The server the Sentinel names as primary.
    pub fn primary(&self) -> &Server {
        let mut con = redis::Client::open(self.sentinel_url()).unwrap().get_connection().unwrap();
        let (_, port): (String, u16) =
            redis::cmd("SENTINEL").arg("GET-MASTER-ADDR-BY-NAME").arg("mymaster").query(&mut con).unwrap();
        self.servers.iter().find(|s| s.port == port).expect("one of the two")
    }

    pub fn replica(&self) -> &Server {
        let primary = self.primary().port;
        self.servers.iter().find(|s| s.port != primary).unwrap()
    }

    /// `SENTINEL FAILOVER mymaster` once the replica acknowledged a write,
    /// then waits until the Sentinel names the other server, which answers
    /// ROLE as master, and the old primary is its replica, acknowledging.
    pub fn failover(&self) {
        // The replica has everything the case wrote: a Sentinel failover
        // promotes the replica as it is (asynchronous replication, which
        // the case is not about), and what it never acknowledged is lost.
        self.primary().wait_acknowledged();
        let (old, new) = (self.primary().port, self.replica().port);
        let mut con = redis::Client::open(self.sentinel_url()).unwrap().get_connection().unwrap();
        let _: () = redis::cmd("SENTINEL").arg("FAILOVER").arg("mymaster").query(&mut con).unwrap();
        eventually(Duration::from_secs(30), "the failover", || self.primary().port == new);
        let (new, old) = (self.primary(), self.servers.iter().find(|s| s.port == old).unwrap());
        eventually(Duration::from_secs(30), "the new primary", || new.role() == "master");
        eventually(Duration::from_secs(30), "the old primary its replica", || old.role() == "slave");
        new.wait_replica_synced(old.port);
        new.wait_acknowledged();
    }

    /// The Sentinel client the libraries are made from.
    pub fn client(&self) -> redis::sentinel::SentinelClient {
        redis::sentinel::SentinelClient::build(
            vec![self.sentinel_url()],
            "mymaster".to_string(),
            None,
            redis::sentinel::SentinelServerType::Master,
        )
        .unwrap()
    }
}

impl Drop for Sentineled {
    fn drop(&mut self) {
        let _ = self.sentinel.kill();
        let _ = self.sentinel.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
