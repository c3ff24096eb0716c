//! A real Redis Cluster on 127.0.0.1 for the cluster tests: 3 primaries with
//! one replica each, the module loaded on every node, AOF on (a node killed
//! with SIGKILL keeps what it wrote), created with
//! `redis-cli --cluster create ... --cluster-replicas 1`.
//!
//! Also: the cluster's view of itself (`CLUSTER NODES`), waits for a stable
//! configuration, key slots, `redis-cli` with a timeout, and a claiming load
//! of client threads that records every claim it was granted.
//!
//! Every node is a `Server`: dropping the `Cluster` kills them all.
use crate::common::commands::{digest_value, server_ms};
use crate::common::fixtures::{FilterSnap, Snap, snapshot};
use crate::common::reply::{as_int, as_token, err_text, parse_claim};
use crate::common::server::{NEXT_ID, Server, StartError, module_path, parse_info, test_servers_root};
use redis::{ConnectionLike, RedisResult, Value};

use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::thread::JoinHandle;

use redis::cluster::{ClusterClient, ClusterConnection};

/// `cluster-node-timeout` of every node, ms.
pub const NODE_TIMEOUT_MS: u64 = 2000;

/// How long a cluster may take to settle after a change.
const SETTLE: Duration = Duration::from_secs(60);

fn redis_cli_bin() -> String {
    std::env::var("REDIS_CLI").unwrap_or_else(|_| "redis-cli".to_string())
}

/// A port `p` that is free, whose cluster bus port `p + 10000` is free too,
/// both below the kernel's ephemeral range (32768 and up), so outgoing
/// connections do not take them.
fn free_cluster_port() -> u16 {
    for _ in 0..10_000 {
        let port: u16 = rand::random_range(12_000..22_700);
        let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && free(port + 10_000) {
            return port;
        }
    }
    panic!("no free port pair (p, p + 10000) found");
}

/// Arguments of every cluster node (after the harness's defaults).
fn node_args() -> Vec<String> {
    [
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
        &NODE_TIMEOUT_MS.to_string(),
        "--appendonly",
        "yes",
        "--enable-debug-command",
        "yes",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Starts one cluster-enabled node (not yet part of any cluster).
pub fn start_cluster_member() -> Server {
    module_path();
    let id = NEXT_ID.fetch_add(1, Ordering::SeqCst);
    let dir = test_servers_root().join(format!("{}-{}", std::process::id(), id));
    let mut server =
        Server { port: 0, dir, module_args: Vec::new(), extra_args: node_args(), child: None, load_module: true };
    let mut last = String::new();
    for _ in 0..30 {
        // A fresh directory each try: no log or nodes.conf of a failed try.
        let _ = std::fs::remove_dir_all(&server.dir);
        std::fs::create_dir_all(&server.dir).expect("create the server's directory");
        server.port = free_cluster_port();
        match server.spawn_and_wait() {
            Ok(()) => return server,
            Err(StartError::PortTaken) => last = format!("port {} (or its bus port) taken", server.port),
            Err(StartError::Fatal(msg)) => panic!("{msg}"),
        }
    }
    panic!("could not start a cluster node on a free port ({last})");
}

/// Kills a server with SIGKILL (no shutdown, no final fsync) and reaps it.
/// `start_again` brings it back on the same port and directory.
pub fn kill9(server: &mut Server) {
    if let Some(mut child) = server.child.take() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

pub fn is_running(server: &Server) -> bool {
    server.child.is_some()
}

/// `redis-cli --cluster reshard`: moves `slots` slots from node `from` to
/// node `to` (both by node id), through the node on `port`; its output.
///
/// Valkey 8+ answers `CLUSTER SETSLOT ... NODE` with NOREPLICAS when a
/// replica has not acknowledged it within 2 s (a loaded machine), and
/// redis-cli stops there with that slot open: as an operator would, the
/// open slot is closed with `--cluster fix` and the slots not yet moved
/// (the source's next ones, as redis-cli picks them) are moved again.
pub fn reshard(port: u16, from: &str, to: &str, slots: usize, timeout: Duration) -> String {
    let node = format!("127.0.0.1:{port}");
    let mut left = slots;
    let mut output = String::new();
    for _ in 0..3 {
        let args = [
            "--cluster".to_string(),
            "reshard".into(),
            node.clone(),
            "--cluster-from".into(),
            from.into(),
            "--cluster-to".into(),
            to.into(),
            "--cluster-slots".into(),
            left.to_string(),
            "--cluster-yes".into(),
        ];
        match run_redis_cli(&args, timeout) {
            Ok(text) => return output + &text,
            Err(text) if text.contains("NOREPLICAS") => {
                // The slot it stopped on is finished by fix, so it counts as moved.
                left -= text.lines().filter(|l| l.starts_with("Moving slot ")).count().min(left);
                eprintln!("reshard stopped on NOREPLICAS with {left} slots to go: fixing the open slot, then again");
                output += &text;
                // fix prints the disagreement it mends as an [ERR] line: what
                // comes next (the reshard, the caller's wait_stable) judges it.
                let fix = ["--cluster".to_string(), "fix".into(), node.clone(), "--cluster-yes".into()];
                let _ = run_redis_cli(&fix, timeout);
                if left == 0 {
                    return output;
                }
            }
            Err(text) => panic!("redis-cli {args:?} failed; output:\n{}", tail(&text, 40)),
        }
    }
    panic!("redis-cli --cluster reshard met NOREPLICAS three times; output:\n{}", tail(&output, 40));
}

/// Runs `redis-cli args...`, waits at most `timeout`, panics on failure
/// (exit status, or an `[ERR]` line). Returns its output.
pub fn redis_cli(args: &[String], timeout: Duration) -> String {
    run_redis_cli(args, timeout)
        .unwrap_or_else(|text| panic!("redis-cli {args:?} failed; output:\n{}", tail(&text, 40)))
}

/// Runs `redis-cli args...`, waits at most `timeout` (panics past it): its
/// output, as an error on a failure (exit status, or an `[ERR]` line).
fn run_redis_cli(args: &[String], timeout: Duration) -> Result<String, String> {
    let id = NEXT_ID.fetch_add(1, Ordering::SeqCst);
    let root = test_servers_root();
    std::fs::create_dir_all(&root).unwrap();
    let out_path = root.join(format!("{}-{}-redis-cli.out", std::process::id(), id));
    let out = std::fs::File::create(&out_path).expect("create redis-cli output file");
    let mut child = Command::new(redis_cli_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", redis_cli_bin()));
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for redis-cli") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let text = std::fs::read_to_string(&out_path).unwrap_or_default();
            let _ = std::fs::remove_file(&out_path);
            panic!("redis-cli {args:?} did not finish in {timeout:?}; output:\n{}", tail(&text, 40));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = std::fs::read_to_string(&out_path).unwrap_or_default();
    let _ = std::fs::remove_file(&out_path);
    if !status.success() || text.contains("[ERR]") { Err(format!("{status}\n{text}")) } else { Ok(text) }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

// ---------------------------------------------------------------------------
// Slots
// ---------------------------------------------------------------------------

fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= (b as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc
}

/// The slot of a key, as Redis Cluster computes it (hash tags included).
pub fn key_slot(key: &str) -> u16 {
    let k = key.as_bytes();
    let hashed = match k.iter().position(|&b| b == b'{') {
        Some(open) => match k[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &k[open + 1..open + 1 + len],
            _ => k,
        },
        None => k,
    };
    crc16(hashed) % 16384
}

/// The hash tag of a key (`{...}`, non-empty), if any.
pub fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let len = key[open + 1..].find('}')?;
    (len > 0).then(|| &key[open + 1..open + 1 + len])
}

/// The first hash tag `<prefix><n>` whose slot satisfies `pred`.
pub fn tag_where(prefix: &str, pred: impl Fn(u16) -> bool) -> String {
    (0..1_000_000)
        .map(|n| format!("{prefix}{n}"))
        .find(|t| pred(key_slot(t)))
        .unwrap_or_else(|| panic!("no tag {prefix}<n> in the wanted slots"))
}

// ---------------------------------------------------------------------------
// Topology
// ---------------------------------------------------------------------------

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    pub id: String,
    pub port: u16,
    pub primary: bool,
    /// The primary's id, for a replica.
    pub master_id: Option<String>,
    /// Flagged `fail` or `fail?`.
    pub down: bool,
    /// Slot ranges, inclusive.
    pub slots: Vec<(u16, u16)>,
    /// Migrating / importing entries (`[slot->-id]`).
    pub open_slots: Vec<String>,
}

impl NodeInfo {
    pub fn owns(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| a <= slot && slot <= b)
    }

    /// Every slot it owns, ascending.
    pub fn slot_list(&self) -> Vec<u16> {
        let mut v: Vec<u16> = self.slots.iter().flat_map(|&(a, b)| a..=b).collect();
        v.sort();
        v
    }
}

/// A node's view of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// Sorted by id.
    pub nodes: Vec<NodeInfo>,
    /// The id of the node that answered.
    pub myself: String,
}

impl Topology {
    pub fn parse(text: &str) -> Topology {
        let mut nodes = Vec::new();
        let mut myself = String::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let f: Vec<&str> = line.split_whitespace().collect();
            assert!(f.len() >= 8, "CLUSTER NODES line: {line}");
            let addr = f[1].split('@').next().unwrap();
            let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap_or(0);
            let flags: Vec<&str> = f[2].split(',').collect();
            if flags.contains(&"myself") {
                myself = f[0].to_string();
            }
            let mut slots = Vec::new();
            let mut open_slots = Vec::new();
            for s in &f[8..] {
                if s.starts_with('[') {
                    open_slots.push(s.to_string());
                } else if let Some((a, b)) = s.split_once('-') {
                    slots.push((a.parse().unwrap(), b.parse().unwrap()));
                } else {
                    let a: u16 = s.parse().unwrap();
                    slots.push((a, a));
                }
            }
            slots.sort();
            nodes.push(NodeInfo {
                id: f[0].to_string(),
                port,
                primary: flags.contains(&"master"),
                master_id: if f[3] == "-" { None } else { Some(f[3].to_string()) },
                down: flags.contains(&"fail") || flags.contains(&"fail?"),
                slots,
                open_slots,
            });
        }
        nodes.sort_by(|a, b| a.id.cmp(&b.id));
        Topology { nodes, myself }
    }

    /// Primaries that own slots, ordered by their first slot.
    pub fn primaries(&self) -> Vec<&NodeInfo> {
        let mut v: Vec<&NodeInfo> = self.nodes.iter().filter(|n| n.primary && !n.down && !n.slots.is_empty()).collect();
        v.sort_by_key(|n| n.slots[0].0);
        v
    }

    pub fn replicas_of(&self, id: &str) -> Vec<&NodeInfo> {
        self.nodes.iter().filter(|n| !n.primary && n.master_id.as_deref() == Some(id)).collect()
    }

    /// The primary owning a slot.
    pub fn owner(&self, slot: u16) -> &NodeInfo {
        self.primaries()
            .into_iter()
            .find(|n| n.owns(slot))
            .unwrap_or_else(|| panic!("no primary owns slot {slot}: {self:?}"))
    }

    pub fn by_port(&self, port: u16) -> &NodeInfo {
        self.nodes.iter().find(|n| n.port == port).unwrap_or_else(|| panic!("no node on port {port}: {self:?}"))
    }

    /// The view without the answering node's identity, for comparing views.
    fn shape(&self) -> Vec<NodeInfo> {
        self.nodes.clone()
    }
}

// ---------------------------------------------------------------------------
// The cluster
// ---------------------------------------------------------------------------

/// 3 primaries with a replica each. Dropping it kills every node.
pub struct Cluster {
    pub nodes: Vec<Server>,
}

impl Cluster {
    /// Starts 6 nodes, creates the cluster with `redis-cli --cluster create
    /// ... --cluster-replicas 1`, and waits until it is stable.
    pub fn start() -> Cluster {
        let started = Instant::now();
        let nodes: Vec<Server> = (0..6).map(|_| start_cluster_member()).collect();
        let cluster = Cluster { nodes };
        let mut args = vec!["--cluster".to_string(), "create".to_string()];
        args.extend(cluster.nodes.iter().map(|s| format!("127.0.0.1:{}", s.port)));
        args.extend(["--cluster-replicas", "1", "--cluster-yes"].iter().map(|s| s.to_string()));
        redis_cli(&args, Duration::from_secs(60));
        cluster.wait_stable("after cluster create");
        let topo = cluster.topology();
        assert_eq!(topo.primaries().len(), 3, "3 primaries: {topo:?}");
        for p in topo.primaries() {
            assert_eq!(topo.replicas_of(&p.id).len(), 1, "one replica of {}: {topo:?}", p.port);
        }
        eprintln!("cluster up in {:?}", started.elapsed());
        cluster
    }

    pub fn server(&self, port: u16) -> &Server {
        self.nodes.iter().find(|s| s.port == port).unwrap_or_else(|| panic!("no server on port {port}"))
    }

    pub fn server_mut(&mut self, port: u16) -> &mut Server {
        self.nodes.iter_mut().find(|s| s.port == port).unwrap_or_else(|| panic!("no server on port {port}"))
    }

    /// A plain (non-cluster) connection to one node.
    pub fn conn(&self, port: u16) -> redis::Connection {
        self.server(port).conn()
    }

    pub fn running(&self) -> impl Iterator<Item = &Server> {
        self.nodes.iter().filter(|s| is_running(s))
    }

    /// `redis://127.0.0.1:<port>/` of every running node.
    pub fn urls(&self) -> Vec<String> {
        self.running().map(|s| s.url()).collect()
    }

    /// A cluster client: follows MOVED / ASK, waits and retries on
    /// TRYAGAIN / CLUSTERDOWN, with short waits (the crate's default minimum
    /// wait is over a second).
    pub fn client(&self) -> ClusterClient {
        ClusterClient::builder(self.urls())
            .retries(10)
            .min_retry_wait(10)
            .max_retry_wait(300)
            .connection_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_secs(30))
            .build()
            .expect("cluster client")
    }

    /// A connection of the cluster client.
    pub fn cluster_conn(&self) -> ClusterConnection {
        let client = self.client();
        let deadline = Instant::now() + SETTLE;
        loop {
            match client.get_connection() {
                Ok(c) => return c,
                Err(e) if Instant::now() > deadline => panic!("cluster connection: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// The view of the first running node (call `wait_stable` first for a
    /// view every node shares).
    pub fn topology(&self) -> Topology {
        let s = self.running().next().expect("a running node");
        node_view(s).unwrap_or_else(|e| panic!("CLUSTER NODES on {}: {e}", s.port))
    }

    /// Waits until the cluster is stable: every running node says
    /// `cluster_state:ok` with every slot served and knows every node;
    /// all running nodes share one view (roles, primaries, slots, no open
    /// slots); the nodes marked down are exactly the stopped ones; every
    /// running node's own role matches the view, and each running replica
    /// is synced with the primary the view gives it.
    pub fn wait_stable(&self, what: &str) {
        let deadline = Instant::now() + SETTLE;
        let mut reason;
        loop {
            match self.stable() {
                Ok(()) => return,
                Err(r) => reason = r,
            }
            if Instant::now() > deadline {
                let views: Vec<String> = self
                    .running()
                    .map(|s| {
                        let text: String = s
                            .conn()
                            .req_command(redis::cmd("CLUSTER").arg("NODES"))
                            .and_then(|v| redis::from_redis_value(&v))
                            .unwrap_or_else(|e| format!("<{e}>"));
                        format!("node {}:\n{text}", s.port)
                    })
                    .collect();
                panic!("{what}: cluster not stable in {SETTLE:?}: {reason}\n{}", views.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn stable(&self) -> Result<(), String> {
        let mut first: Option<(u16, Vec<NodeInfo>)> = None;
        let running: BTreeSet<u16> = self.running().map(|s| s.port).collect();
        for s in self.running() {
            let client = redis::Client::open(s.url()).map_err(|e| e.to_string())?;
            let mut con =
                client.get_connection_with_timeout(Duration::from_secs(2)).map_err(|e| format!("{}: {e}", s.port))?;
            con.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let text: String =
                redis::cmd("CLUSTER").arg("INFO").query(&mut con).map_err(|e| format!("{}: {e}", s.port))?;
            let info = parse_info(&text);
            for (k, want) in [
                ("cluster_state", "ok".to_string()),
                ("cluster_slots_ok", "16384".to_string()),
                ("cluster_known_nodes", self.nodes.len().to_string()),
            ] {
                if info.get(k) != Some(&want) {
                    return Err(format!("node {}: {k} is {:?}, want {want}", s.port, info.get(k)));
                }
            }
            let nodes_text: String =
                redis::cmd("CLUSTER").arg("NODES").query(&mut con).map_err(|e| format!("{}: {e}", s.port))?;
            let view = Topology::parse(&nodes_text);
            for n in &view.nodes {
                if !n.open_slots.is_empty() {
                    return Err(format!("node {} sees open slots on {}: {:?}", s.port, n.port, n.open_slots));
                }
                if n.down == running.contains(&n.port) {
                    return Err(format!("node {} sees {} as down={} ", s.port, n.port, n.down));
                }
            }
            let me = view.nodes.iter().find(|n| n.id == view.myself).ok_or("no myself")?.clone();
            let repl = parse_info(
                &redis::cmd("INFO").arg("replication").query::<String>(&mut con).map_err(|e| e.to_string())?,
            );
            let role = repl.get("role").cloned().unwrap_or_default();
            if me.primary != (role == "master") {
                return Err(format!("node {} has role {role}, its view says primary={}", s.port, me.primary));
            }
            if !me.primary {
                let master = view
                    .nodes
                    .iter()
                    .find(|n| Some(&n.id) == me.master_id.as_ref())
                    .ok_or_else(|| format!("node {}: primary not in view", s.port))?;
                if repl.get("master_port") != Some(&master.port.to_string())
                    || repl.get("master_link_status").map(String::as_str) != Some("up")
                    || repl.get("master_sync_in_progress").map(String::as_str) != Some("0")
                {
                    return Err(format!("replica {} not synced with {}: {repl:?}", s.port, master.port));
                }
            }
            let shape = view.shape();
            match &first {
                None => first = Some((s.port, shape)),
                Some((port, other)) if *other != shape => {
                    return Err(format!("views differ: node {port} sees {other:?}, node {} sees {shape:?}", s.port));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }
}

fn node_view(s: &Server) -> Result<Topology, String> {
    let mut con = s.conn();
    let text: String = redis::cmd("CLUSTER").arg("NODES").query(&mut con).map_err(|e| e.to_string())?;
    Ok(Topology::parse(&text))
}

/// Polls `cond` every 20 ms until it holds; panics with `what` after `timeout`.
pub fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for: {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------
// Snapshots of moved records (relative times compared as absolute ones)
// ---------------------------------------------------------------------------

/// A snapshot with the server clock just before and after it.
#[derive(Debug, Clone)]
pub struct TimedSnap {
    pub snap: Snap,
    pub t0: i64,
    pub t1: i64,
    pub digest: String,
}

pub fn timed_snapshot(con: &mut redis::Connection, key: &str) -> TimedSnap {
    let t0 = server_ms(con);
    let snap = snapshot(con, key);
    let t1 = server_ms(con);
    let digest = digest_value(con, key);
    TimedSnap { snap, t0, t1, digest }
}

/// A record after MIGRATE (or a failover) is the record before: every
/// field exact but the relative `lease_ms` / `pttl`, which must point at
/// the same absolute time within `tol_ms` (plus the time the snapshots took);
/// `PEXPIRETIME` may grow by at most `expiry_slack_ms` (MIGRATE carries the
/// TTL relative to the source's clock, so the transfer time is added).
pub fn assert_same_moved_record(b: &TimedSnap, a: &TimedSnap, tol_ms: i64, expiry_slack_ms: i64, what: &str) {
    let key = &b.snap.key;
    let (Some(bf), Some(af)) = (&b.snap.fields, &a.snap.fields) else {
        panic!("{what}: {key} was {:?}, is {:?}", b.snap.fields, a.snap.fields);
    };
    for name in ["state", "attempt", "claimed_at", "done_at", "result", "fingerprint"] {
        assert_eq!(bf[name], af[name], "{what}: field {name} of {key}");
    }
    for name in ["lease_ms", "pttl"] {
        let (x, y) = (as_int(&bf[name]), as_int(&af[name]));
        if x == 0 || y == 0 {
            assert_eq!(x, y, "{what}: field {name} of {key}");
            continue;
        }
        // The absolute time each points at lies in [v + t0, v + t1].
        let (blo, bhi) = (x + b.t0, x + b.t1);
        let (alo, ahi) = (y + a.t0, y + a.t1);
        let gap = (alo - bhi).max(blo - ahi).max(0);
        assert!(
            gap <= tol_ms,
            "{what}: field {name} of {key}: before {x} at [{}, {}], after {y} at [{}, {}]: {gap} ms apart (tolerance {tol_ms})",
            b.t0,
            b.t1,
            a.t0,
            a.t1
        );
    }
    let (x, y) = (b.snap.pexpiretime, a.snap.pexpiretime);
    assert!(x > 0 && y > 0, "{what}: {key} must keep an expiry: PEXPIRETIME {x} -> {y}");
    assert!(
        y >= x - 5 && y - x <= expiry_slack_ms,
        "{what}: PEXPIRETIME of {key} {x} -> {y} (allowed: +0..{expiry_slack_ms} ms)"
    );
    assert_eq!(b.digest, a.digest, "{what}: DEBUG DIGEST-VALUE of {key}");
}

pub fn assert_same_moved_filter(b: &FilterSnap, a: &FilterSnap, expiry_slack_ms: i64, what: &str) {
    assert!(b.info.is_some(), "{what}: IDEM.BF.INFO {}: nil", b.key);
    assert_eq!(b.ty, a.ty, "{what}: TYPE {}", b.key);
    assert_eq!(b.info, a.info, "{what}: IDEM.BF.INFO {}", b.key);
    assert_eq!(b.answers, a.answers, "{what}: IDEM.BF.MEXISTS {}", b.key);
    assert_eq!(b.digest, a.digest, "{what}: DEBUG DIGEST-VALUE {}", b.key);
    let (x, y) = (b.pexpiretime, a.pexpiretime);
    assert!(x > 0 && y > 0, "{what}: filter {} must keep its expiry: PEXPIRETIME {x} -> {y}", b.key);
    assert!(
        y >= x - 5 && y - x <= expiry_slack_ms,
        "{what}: PEXPIRETIME of {} {x} -> {y} (allowed: +0..{expiry_slack_ms} ms)",
        b.key
    );
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

// ---------------------------------------------------------------------------
// A claiming load
// ---------------------------------------------------------------------------

/// One claim the load was granted (NEW, SEEN or RETRY).
#[derive(Debug, Clone)]
pub struct Grant {
    pub thread: usize,
    pub status: String,
    pub attempt: i64,
    pub token: String,
    /// ms since the load started.
    pub at_ms: u128,
}

#[derive(Debug, Default)]
pub struct LoadReport {
    pub ops: u64,
    pub busy: u64,
    /// Granted claims, by key index.
    pub grants: BTreeMap<usize, Vec<Grant>>,
    /// Keys whose claim failed without a server reply: it may have run.
    pub unknown: BTreeSet<usize>,
    /// Transient errors by kind (TRYAGAIN, CLUSTERDOWN, connection ...).
    pub transient: BTreeMap<String, u64>,
    /// Anything else: a failure of the test.
    pub unexpected: Vec<String>,
}

impl LoadReport {
    /// Keys granted more than once (with their grants).
    pub fn granted_twice(&self) -> Vec<(usize, &Vec<Grant>)> {
        self.grants.iter().filter(|(_, g)| g.len() > 1).map(|(k, g)| (*k, g)).collect()
    }

    pub fn granted_count(&self) -> usize {
        self.grants.values().map(Vec::len).sum()
    }
}

/// Client threads claiming a fixed key set through the cluster client,
/// with a long lease: each key may be granted once in the whole run.
/// Keys become claimable progressively (`fresh_per_sec` from the start), so
/// first claims keep happening for a while; half the claims go to the
/// newest keys (threads race for them), half to any key so far (a record
/// that went missing would be granted again). A key with a hash tag is
/// claimed with `BLOOM {tag}:seen` (two keys of one slot: TRYAGAIN while
/// the slot is half migrated).
pub struct Load {
    stop: Arc<AtomicBool>,
    ops: Arc<AtomicU64>,
    handles: Vec<JoinHandle<LoadReport>>,
}

pub const LOAD_LEASE_S: i64 = 600;

impl Load {
    pub fn start(client: ClusterClient, keys: Arc<Vec<String>>, threads: usize, fresh_per_sec: f64) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let ops = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let handles = (0..threads)
            .map(|thread| {
                let (stop, ops, keys, client) = (stop.clone(), ops.clone(), keys.clone(), client.clone());
                std::thread::spawn(move || load_thread(thread, client, keys, stop, ops, started, fresh_per_sec))
            })
            .collect();
        Load { stop, ops, handles }
    }

    /// Claims answered so far (any reply, errors excluded).
    pub fn ops(&self) -> u64 {
        self.ops.load(Ordering::Relaxed)
    }

    /// Waits until `n` more claims were answered.
    pub fn wait_progress(&self, n: u64, what: &str) {
        let target = self.ops() + n;
        wait_until(&format!("{n} more claims answered ({what})"), Duration::from_secs(60), || self.ops() >= target);
    }

    /// Stops the threads, merges what they saw.
    pub fn finish(mut self) -> LoadReport {
        self.stop.store(true, Ordering::SeqCst);
        let mut report = LoadReport::default();
        for h in self.handles.drain(..) {
            let r = h.join().unwrap_or_else(|_| panic!("a load thread panicked"));
            report.ops += r.ops;
            report.busy += r.busy;
            for (k, g) in r.grants {
                report.grants.entry(k).or_default().extend(g);
            }
            report.unknown.extend(r.unknown);
            for (k, n) in r.transient {
                *report.transient.entry(k).or_default() += n;
            }
            report.unexpected.extend(r.unexpected);
        }
        report
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

fn load_thread(
    thread: usize,
    client: ClusterClient,
    keys: Arc<Vec<String>>,
    stop: Arc<AtomicBool>,
    ops: Arc<AtomicU64>,
    started: Instant,
    fresh_per_sec: f64,
) -> LoadReport {
    let mut report = LoadReport::default();
    let mut conn: Option<ClusterConnection> = None;
    let n = keys.len();
    while !stop.load(Ordering::Relaxed) {
        let Some(con) = conn.as_mut() else {
            match client.get_connection() {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    *report.transient.entry(format!("connect: {:?}", e.kind())).or_default() += 1;
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            continue;
        };
        let elapsed = started.elapsed();
        let frontier = ((32.0 + elapsed.as_secs_f64() * fresh_per_sec) as usize).clamp(1, n);
        let idx = if rand::random_bool(0.5) {
            frontier - 1 - rand::random_range(0..frontier.min(32))
        } else {
            rand::random_range(0..frontier)
        };
        let key = &keys[idx];
        let mut cmd = redis::cmd("IDEM.CLAIM");
        cmd.arg(key).arg(LOAD_LEASE_S);
        if let Some(tag) = hash_tag(key) {
            cmd.arg("BLOOM").arg(format!("{{{tag}}}:seen"));
        }
        let r: RedisResult<Value> = cmd.query(con);
        match r {
            Ok(v) => {
                ops.fetch_add(1, Ordering::Relaxed);
                report.ops += 1;
                let (status, value, attempt) = parse_claim(v);
                match status.as_str() {
                    "NEW" | "SEEN" | "RETRY" => report.grants.entry(idx).or_default().push(Grant {
                        thread,
                        status,
                        attempt,
                        token: as_token(&value),
                        at_ms: started.elapsed().as_millis(),
                    }),
                    "BUSY" => {
                        report.busy += 1;
                        let left = as_int(&value);
                        if attempt != 1 || left <= 0 || left > LOAD_LEASE_S * 1000 {
                            report.unexpected.push(format!("{}: BUSY {left} attempt {attempt}", keys[idx]));
                        }
                    }
                    _ => report.unexpected.push(format!("{}: {status} {value:?} {attempt}", keys[idx])),
                }
            }
            Err(e) => match e.code() {
                None => {
                    // No server reply: the claim may or may not have run.
                    report.unknown.insert(idx);
                    *report.transient.entry(format!("{:?}", e.kind())).or_default() += 1;
                    conn = None;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Some(code @ ("TRYAGAIN" | "MOVED" | "ASK" | "CLUSTERDOWN" | "MASTERDOWN" | "LOADING")) => {
                    *report.transient.entry(code.to_string()).or_default() += 1;
                    conn = None;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Some(_) => {
                    if report.unexpected.len() < 100 {
                        report.unexpected.push(format!("IDEM.CLAIM {} {LOAD_LEASE_S}: {}", keys[idx], err_text(&e)));
                    }
                }
            },
        }
    }
    report
}
