//! A seeded random test of every user-facing command against a model
//! (tests/common/model/) written from docs/commands.md.
//!
//! Each seed runs for about 28 s of real time against a primary with a
//! replica attached: random IDEM.* and IDEM.BF.* commands with right and
//! wrong tokens, mixed with DEL, UNLINK, COPY, RENAME, EXPIRE/PEXPIRE, PERSIST,
//! DUMP/RESTORE (REPLACE, ABSTTL), MOVE, SWAPDB, DEBUG RELOAD and plain
//! strings that make WRONGTYPE, over a dozen record keys and a few filter
//! keys, so that states collide. `idem.history` and `idem.retain` are a few
//! seconds, leases 1-2 s, filters have 1-2 s shards: the clock runs across
//! leases, retentions and shard boundaries many times per run.
//!
//! Time: the server's clock is this machine's. Every step runs as a pipeline
//! between two `TIME` calls; the model is evaluated at every ms of that
//! bracket and the test keeps each outcome whose answer matches (a set of
//! possible worlds, nearly always one). When a step leaves several worlds,
//! reads of the keys they disagree on (TYPE, PEXPIRETIME, IDEM.GET,
//! IDEM.BF.INFO) tell them apart. Nothing sleeps to dodge a boundary.
//!
//! Every 3 s and at the end, after WAIT, the replica must hold exactly what
//! the primary holds (`DEBUG DIGEST`), and every key is read on both, each
//! read checked against the model (reads work on replicas).
//!
//! False positives of the Bloom filters are allowed where the model knows
//! an item is absent, counted, and must stay under 5 + 4% of such answers;
//! a "not seen" for an item the model holds in a live shard fails at once.
//!
//! Environment:
//! - `IDEM_STATEFUL_SECONDS`: seconds per seed (default 28).
//! - `IDEM_STATEFUL_SEEDS=n`: `stateful_random_seeds` runs n more seeds,
//!   picked from the clock and printed (`make fuzz`).
//! - `IDEM_STATEFUL_SEED=s1,s2`: `stateful_random_seeds` runs these seeds
//!   (to replay a failure: `cargo test --release --test stateful
//!   stateful_random_seeds -- --nocapture`).
//! - `IDEM_STATEFUL_DEBUG`: print the possible worlds each time reads are
//!   needed to tell them apart.
//!
//! A failure prints the seed, the server, the last steps (each with its
//! TIME bracket and reply), the history of the keys involved and the
//! model's worlds.
#[path = "stateful/batches.rs"]
mod batches;
#[allow(dead_code)] // each test binary uses part of common/
mod common;

use common::commands::{digest, server_ms};
use common::model::Cfg;
use common::model::command::{Cmd, show_arg};
use common::model::expect::{Exp, Matched, error_text, matches};
use common::model::semantics::apply;
use common::model::state::{Entry, Val, World, variants};
use common::rng::Rng;
use common::server::Server;
use redis::Value;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

const HISTORY_S: i64 = 2;
const RETAIN_S: i64 = 3;
const BF_WINDOW: i64 = 2;
const BF_CAPACITY: i64 = 1000;
const DUMP_SLOTS: usize = 4;
/// Pause between steps, so that a run spans many leases with a few
/// thousand commands.
const PACE: Duration = Duration::from_millis(5);
/// More possible worlds than this is a test failure (the model could not
/// tell what happened).
const MAX_WORLDS: usize = 4096;

/// Indexes of `Run::cons`.
const PRIMARY0: usize = 0;
const PRIMARY1: usize = 1;
const REPLICA0: usize = 2;
const REPLICA1: usize = 3;

const RECS: [&str; 12] = ["r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8", "r9", "r10", "r11"];
const FILTS: [&str; 3] = ["f0", "f1", "f2"];
const ITEMS: [&str; 4] = ["i0", "i1", "i2", "i3"];
const PAYLOADS: [&[u8]; 3] = [b"p0", b"p1", b""];
/// Claims' OWNERs: plain, binary, the longest (64 bytes).
const OWNERS: [&[u8]; 3] = [b"worker-1", b"\x00\xff host:1\r\n", &[b'w'; 64]];

fn all_keys() -> Vec<&'static str> {
    RECS.iter().chain(FILTS.iter()).copied().collect()
}

// ---------------------------------------------------------------------------
// The run
// ---------------------------------------------------------------------------

fn time_ms(v: &Value) -> i64 {
    let (s, us): (i64, i64) = redis::from_redis_value(v).expect("TIME reply");
    s * 1000 + us / 1000
}

fn short(v: &Value) -> String {
    let s = match v {
        Value::BulkString(b) => format!("bulk({})", show_arg(b)),
        other => format!("{other:?}"),
    };
    if s.len() > 300 { format!("{}...", &s[..300]) } else { s }
}

struct State {
    w: World,
    /// The time of the last command applied to this world.
    tmin: i64,
    fp: u32,
    neg: u32,
}

struct Run {
    seed: u64,
    server: String,
    cfg: Cfg,
    rng: Rng,
    primary: Server,
    replica: Server,
    /// Connections: the primary's db 0 (RESP2) and db 1 (RESP3), the
    /// replica's db 0 (RESP3) and db 1 (RESP2); see `PRIMARY0` etc.
    cons: Vec<redis::Connection>,
    worlds: Vec<World>,
    payloads: Vec<Option<Vec<u8>>>,
    tokens_seen: HashSet<String>,
    tokens_by_key: HashMap<String, Vec<String>>,
    log: VecDeque<String>,
    /// The last steps that named each key (and every SWAPDB, DEBUG RELOAD).
    key_log: HashMap<String, VecDeque<String>>,
    started: Instant,
    steps: u64,
    fp: u64,
    neg: u64,
    probes: u64,
    max_worlds: usize,
    widest: i64,
    /// Digest comparisons with the replica that passed.
    digests: u64,
    /// Replies by command and kind: what the run covered.
    seen: BTreeMap<String, u64>,
}

impl Run {
    fn new(seed: u64) -> Run {
        let module_args = [
            "history",
            &HISTORY_S.to_string(),
            "retain",
            &RETAIN_S.to_string(),
            "bf-window",
            &BF_WINDOW.to_string(),
            "bf-capacity",
            &BF_CAPACITY.to_string(),
        ]
        .map(|s| s.to_string());
        let args: Vec<&str> = module_args.iter().map(String::as_str).collect();
        let primary = Server::with_args(&args, &[]);
        let replica = Server::with_args(&args, &[]);
        replica.replicaof(&primary);
        let connect = |port: u16, db: usize, resp3: bool| {
            let proto = if resp3 { "?protocol=resp3" } else { "" };
            let client = redis::Client::open(format!("redis://127.0.0.1:{port}/{db}{proto}")).unwrap();
            let con = client.get_connection().unwrap_or_else(|e| panic!("connect to {port} db {db}: {e}"));
            con.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
            con
        };
        let cons = vec![
            connect(primary.port, 0, false),
            connect(primary.port, 1, true),
            connect(replica.port, 0, true),
            connect(replica.port, 1, false),
        ];
        Run {
            seed,
            server: std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into()),
            cfg: Cfg {
                history_ms: HISTORY_S * 1000,
                retain_ms: RETAIN_S * 1000,
                bf_rate: 0.01,
                bf_capacity: BF_CAPACITY,
                bf_window: BF_WINDOW,
            },
            rng: Rng(seed),
            primary,
            replica,
            cons,
            worlds: vec![World::new(DUMP_SLOTS)],
            payloads: vec![None; DUMP_SLOTS],
            tokens_seen: HashSet::new(),
            tokens_by_key: HashMap::new(),
            log: VecDeque::new(),
            key_log: HashMap::new(),
            started: Instant::now(),
            steps: 0,
            fp: 0,
            neg: 0,
            probes: 0,
            max_worlds: 1,
            widest: 0,
            digests: 0,
            seen: BTreeMap::new(),
        }
    }

    fn note(&mut self, line: String, keys: &[&str]) {
        if self.log.len() == 150 {
            self.log.pop_front();
        }
        let all = all_keys();
        let keys = if keys.is_empty() { &all[..] } else { keys };
        for k in keys {
            let h = self.key_log.entry(k.to_string()).or_default();
            if h.len() == 40 {
                h.pop_front();
            }
            h.push_back(line.clone());
        }
        self.log.push_back(line);
    }

    /// The history of `key` (in any database), for failure reports.
    fn history(&self, key: &str) -> String {
        let mut out = format!("--- the last steps that named {key}, or every key:\n");
        for line in self.key_log.get(key).into_iter().flatten() {
            out.push_str(line);
            out.push('\n');
        }
        out
    }

    fn fail(&mut self, msg: &str) -> ! {
        let mut out = format!(
            "\n=== stateful test failed: seed {} on {} at step {} ({:.1} s) ===\n{msg}\n--- the last steps (step, s, server, db, [TIME before, TIME after], command -> reply):\n",
            self.seed,
            self.server,
            self.steps,
            self.started.elapsed().as_secs_f64()
        );
        for line in &self.log {
            out.push_str(line);
            out.push('\n');
        }
        out.push_str(&format!("--- possible worlds: {}\n", self.worlds.len()));
        for (i, w) in self.worlds.iter().take(3).enumerate() {
            out.push_str(&format!("world {i}:\n"));
            for db in 0..2 {
                for (k, e) in &w.dbs[db] {
                    out.push_str(&format!("  db{db} {k}: {}\n", e.describe()));
                }
            }
        }
        out.push_str(&format!(
            "replay: IDEM_STATEFUL_SEED={} REDIS_SERVER={} cargo test --release --test stateful stateful_random_seeds -- --nocapture\n",
            self.seed, self.server
        ));
        panic!("{out}");
    }

    /// Runs `cmds` on connection `conn` (`PRIMARY0`...; the database is
    /// `conn % 2`) as one pipeline between two TIMEs and checks every reply
    /// against the model.
    fn step(&mut self, conn: usize, cmds: &[Cmd]) -> Vec<Value> {
        self.step_as(conn, cmds, None)
    }

    /// `step`, logged as one line `summary` when given (a failing reply is
    /// explained in full all the same).
    fn step_as(&mut self, conn: usize, cmds: &[Cmd], summary: Option<&str>) -> Vec<Value> {
        let db = conn % 2;
        assert!(conn < REPLICA0 || cmds.iter().all(Cmd::is_read), "writes go to the primary");
        let mut pipe = redis::pipe();
        pipe.cmd("TIME");
        for c in cmds {
            let payload = match c {
                Cmd::Restore { slot, .. } => self.payloads[*slot].clone(),
                _ => None,
            };
            let mut rc = redis::Cmd::new();
            for a in c.argv(payload.as_deref()) {
                rc.arg(a);
            }
            pipe.add_command(rc);
        }
        pipe.cmd("TIME");
        let packed = pipe.get_packed_pipeline();
        let mut replies =
            match redis::ConnectionLike::req_packed_commands(&mut self.cons[conn], &packed, 0, cmds.len() + 2) {
                Ok(r) => r,
                Err(e) => {
                    let alive = match (self.primary.exited(), self.replica.exited()) {
                        (None, None) => "both servers are running".to_string(),
                        (p, r) => format!("primary exit status {p:?}, replica exit status {r:?}"),
                    };
                    let cmdline: Vec<String> = cmds.iter().map(|c| c.to_string()).collect();
                    self.fail(&format!(
                        "{cmdline:?}: connection error {e} ({alive}); primary log:\n{}",
                        self.primary.log_tail(30)
                    ));
                }
            };
        let t1 = time_ms(&replies.pop().unwrap());
        let t0 = time_ms(&replies.remove(0));
        self.widest = self.widest.max(t1 - t0);
        let secs = self.started.elapsed().as_secs_f64();
        let on = if conn < REPLICA0 { "primary" } else { "replica" };
        if let Some(summary) = summary {
            self.note(format!("#{} {secs:.3}s {on} db{db} [{t0}, {t1}] ({summary})", self.steps), &[]);
        } else {
            for (c, r) in cmds.iter().zip(&replies) {
                let line = format!("#{} {secs:.3}s {on} db{db} [{t0}, {t1}] {c} -> {}", self.steps, short(r));
                let keys = match c {
                    Cmd::Swapdb | Cmd::DebugReload => vec![],
                    other => other.keys(),
                };
                self.note(line, &keys);
            }
        }
        self.check(db, cmds, &replies, t0, t1);
        self.steps += 1;
        replies
    }

    fn check(&mut self, db: usize, cmds: &[Cmd], replies: &[Value], t0: i64, t1: i64) {
        let mut states: Vec<State> =
            self.worlds.iter().map(|w| State { w: w.clone(), tmin: t0, fp: 0, neg: 0 }).collect();
        // A batch answers, key by key, what its single commands would in
        // order (docs/commands.md, "Batch commands"): each part is checked
        // against its element as a command of its own.
        let mut flat: Vec<(Cmd, Value)> = Vec::new();
        for (cmd, reply) in cmds.iter().zip(replies) {
            match (cmd, reply) {
                (Cmd::Batch(parts), Value::Array(items)) if items.len() == parts.len() => {
                    self.count(cmd, reply);
                    flat.extend(parts.iter().cloned().zip(items.iter().cloned()))
                }
                (Cmd::Batch(parts), _) => {
                    self.fail(&format!("{cmd}: expected {} reply elements, got {}", parts.len(), short(reply)))
                }
                _ => flat.push((cmd.clone(), reply.clone())),
            }
        }
        for (cmd, reply) in flat.iter().map(|(c, r)| (c, r)) {
            let mut next: HashMap<World, State> = HashMap::new();
            let mut token = None;
            for st in &states {
                for t in st.tmin..=t1 {
                    for (mut exp, mut w2) in self.outcomes(&st.w, db, cmd, t) {
                        if let Exp::Get(g) = &mut exp {
                            g.pttl_slack = (t1 - t, t - t0);
                        }
                        let mut m2 = Matched::default();
                        if matches(&exp, reply, &mut m2).is_err() {
                            continue;
                        }
                        if let Some(tok) = &m2.token {
                            w2.patch_token(tok);
                            token = Some(tok.clone());
                        }
                        let (fp, neg) = (st.fp + m2.fp, st.neg + m2.neg);
                        let cand = State { w: w2.clone(), tmin: t, fp, neg };
                        match next.get_mut(&w2) {
                            Some(old) => {
                                old.tmin = old.tmin.min(t);
                                old.fp = old.fp.min(fp);
                            }
                            None => {
                                next.insert(w2, cand);
                            }
                        }
                    }
                }
            }
            if next.is_empty() {
                let msg = self.explain(&states, db, cmd, reply, t1);
                self.fail(&msg);
            }
            if let Some(tok) = token {
                if !self.tokens_seen.insert(tok.clone()) {
                    self.fail(&format!("{cmd}: token {tok} was issued before"));
                }
                let key = cmd.keys()[0].to_string();
                self.tokens_by_key.entry(key).or_default().push(tok);
            }
            if let Cmd::Dump { slot, .. } = cmd {
                self.payloads[*slot] = match reply {
                    Value::BulkString(b) => Some(b.clone()),
                    _ => None,
                };
            }
            self.count(cmd, reply);
            states = next.into_values().collect();
            if states.len() > MAX_WORLDS {
                self.fail(&format!("{cmd}: {} possible worlds, the model cannot tell them apart", states.len()));
            }
        }
        let best = states.iter().min_by_key(|s| s.fp).unwrap();
        self.fp += best.fp as u64;
        self.neg += best.neg as u64;
        self.worlds = states.into_iter().map(|s| s.w).collect();
        self.max_worlds = self.max_worlds.max(self.worlds.len());
    }

    /// Every (expected reply, world after) of `cmd` at `t` from `w`.
    fn outcomes(&self, w: &World, db: usize, cmd: &Cmd, t: i64) -> Vec<(Exp, World)> {
        let shows = cmd.shows_expiry();
        let mut vs: Vec<World> = w.at(t).iter().flat_map(|wt| variants(wt, db, &cmd.keys(), shows)).collect();
        if let Cmd::Move { key } = cmd {
            vs = vs.iter().flat_map(|v| variants(v, 1, &[key.as_str()], shows)).collect();
        }
        vs.iter().flat_map(|v| apply(v, db, cmd, t, &self.cfg)).collect()
    }

    fn explain(&self, states: &[State], db: usize, cmd: &Cmd, reply: &Value, t1: i64) -> String {
        let mut msg = format!("{cmd}\n  got: {}\n  what the model allows:\n", short(reply));
        for st in states.iter().take(3) {
            for t in [st.tmin, t1] {
                for (exp, _) in self.outcomes(&st.w, db, cmd, t) {
                    let why = matches(&exp, reply, &mut Matched::default()).err().unwrap_or_default();
                    msg.push_str(&format!("    at {t}: {exp:?}\n      ({why})\n"));
                }
            }
            for k in cmd.keys() {
                msg.push_str(&format!("    model db{db} {k}: {}\n", st.w.describe(db, k)));
            }
        }
        for k in cmd.keys() {
            msg.push_str(&self.history(k));
        }
        msg
    }

    fn count(&mut self, cmd: &Cmd, reply: &Value) {
        let name = cmd.to_string().split(' ').next().unwrap().to_string();
        let kind = match reply {
            Value::ServerError(_) => error_text(reply).unwrap().split(' ').next().unwrap().to_string(),
            Value::Int(i) if i.abs() <= 10 => i.to_string(),
            Value::Int(_) => "n".into(),
            Value::Nil => "nil".into(),
            Value::Array(items) if matches!(cmd, Cmd::Claim { .. }) => items.first().map(short).unwrap_or_default(),
            Value::Array(_) | Value::Map(_) => "array".into(),
            _ => "ok".into(),
        };
        *self.seen.entry(format!("{name} {kind}")).or_default() += 1;
    }

    /// When several worlds remain, reads the keys they disagree on.
    fn disambiguate(&mut self) {
        for _ in 0..2 {
            if self.worlds.len() <= 1 {
                return;
            }
            self.probes += 1;
            for db in 0..2 {
                let mut keys: Vec<String> = Vec::new();
                let first = &self.worlds[0];
                for w in &self.worlds[1..] {
                    for k in first.dbs[db].keys().chain(w.dbs[db].keys()) {
                        if first.get(db, k) != w.get(db, k) && !keys.contains(k) {
                            keys.push(k.clone());
                        }
                    }
                }
                if !keys.is_empty() {
                    if std::env::var_os("IDEM_STATEFUL_DEBUG").is_some() {
                        for k in &keys {
                            let descs: Vec<String> = self.worlds.iter().map(|w| w.describe(db, k)).collect();
                            eprintln!("probe db{db} {k} after {:?}: {descs:#?}", self.log.back());
                        }
                    }
                    let cmds = probe_cmds(&keys);
                    self.step(PRIMARY0 + db, &cmds);
                }
            }
        }
    }

    /// Reads every key of both databases on the primary, checks the
    /// replica's dataset digest, then reads every key on the replica (reads
    /// work on replicas), all checked against the model.
    fn sweep(&mut self) {
        let keys: Vec<String> = all_keys().iter().map(|k| k.to_string()).collect();
        let mut cmds = probe_cmds(&keys);
        let items: Vec<String> = RECS.iter().chain(ITEMS.iter()).map(|s| s.to_string()).collect();
        for k in &keys {
            cmds.push(Cmd::BfMexists { key: k.clone(), items: items.clone() });
        }
        let summary = format!("{} reads of every key: all as the model says", cmds.len());
        for conn in [PRIMARY0, PRIMARY1] {
            self.step_as(conn, &cmds, Some(&summary));
            self.disambiguate();
        }
        self.check_replica();
        for conn in [REPLICA0, REPLICA1] {
            self.step_as(conn, &cmds, Some(&summary));
            self.disambiguate();
        }
    }

    fn world(&self) -> &World {
        &self.worlds[0]
    }

    // -- choosing commands --------------------------------------------------

    fn rec_key(&mut self) -> String {
        if self.rng.chance(8) { self.rng.pick(&FILTS) } else { self.rng.pick(&RECS) }.to_string()
    }

    fn filt_key(&mut self) -> String {
        if self.rng.chance(10) { self.rng.pick(&RECS) } else { self.rng.pick(&FILTS) }.to_string()
    }

    fn any_key(&mut self) -> String {
        let keys = all_keys();
        self.rng.pick(&keys).to_string()
    }

    fn item(&mut self) -> String {
        if self.rng.chance(60) { self.rng.pick(&RECS) } else { self.rng.pick(&ITEMS) }.to_string()
    }

    fn items(&mut self) -> Vec<String> {
        let n = self.rng.range(1, 4);
        (0..n).map(|_| self.item()).collect()
    }

    fn token_for(&mut self, key: &str) -> String {
        let latest = match self.world().get(0, key) {
            Some(Entry { val: Val::Rec(r), .. }) => r.token.clone(),
            _ => None,
        };
        let roll = self.rng.below(100);
        if roll < 55
            && let Some(t) = latest
        {
            return t;
        }
        if roll < 85
            && let Some(old) = self.tokens_by_key.get(key).filter(|v| !v.is_empty())
        {
            let i = self.rng.below(old.len() as u64) as usize;
            return old[i].clone();
        }
        if roll < 93 && !self.tokens_seen.is_empty() {
            let other = self.rng.pick(&RECS);
            if let Some(old) = self.tokens_by_key.get(other).filter(|v| !v.is_empty()) {
                return old[old.len() - 1].clone();
            }
        }
        format!("{:016x}{:016x}", self.rng.next(), self.rng.next())
    }

    /// An OWNER half the time.
    fn owner(&mut self) -> Option<Vec<u8>> {
        self.rng.chance(50).then(|| self.rng.pick(&OWNERS).to_vec())
    }

    fn result(&mut self) -> Vec<u8> {
        match self.rng.below(4) {
            0 => Vec::new(),
            1 => b"ok".to_vec(),
            2 => b"\x00\xff bin\r\n\x00".to_vec(),
            _ => (0..3000u32).map(|i| (i * 7 % 251) as u8).collect(),
        }
    }

    fn choose(&mut self) -> (usize, Vec<Cmd>) {
        if self.rng.chance(6) {
            return (PRIMARY0, vec![self.batch()]);
        }
        let roll = self.rng.below(1000);
        let cmd = match roll {
            0..=229 => {
                let key = self.rec_key();
                Cmd::Claim {
                    key,
                    lease: self.rng.range(1, 2),
                    payload: self.rng.chance(40).then(|| self.rng.pick(&PAYLOADS).to_vec()),
                    maxtries: self.rng.chance(30).then(|| self.rng.range(1, 3)),
                    bloom: self.rng.chance(40).then(|| self.filt_key()),
                    owner: self.owner(),
                }
            }
            230..=339 => {
                let key = self.rec_key();
                let token = self.token_for(&key);
                Cmd::Done {
                    key,
                    token,
                    result: self.rng.chance(50).then(|| self.result()),
                    retain: self.rng.chance(40).then(|| self.rng.range(1, 3)),
                    bloom: self.rng.chance(40).then(|| self.filt_key()),
                }
            }
            340..=389 => {
                let key = self.rec_key();
                let token = self.token_for(&key);
                Cmd::Release { key, token }
            }
            390..=439 => {
                let key = self.rec_key();
                let token = self.token_for(&key);
                Cmd::Extend { key, token, lease: self.rng.range(1, 2) }
            }
            440..=504 => Cmd::Get { key: self.rec_key() },
            505..=519 => Cmd::Requeue { key: self.rec_key() },
            520..=549 => Cmd::Once { key: self.rec_key(), retain: self.rng.range(1, 3) },
            550..=584 => {
                let key = self.filt_key();
                let reserve = Cmd::BfReserve {
                    key: key.clone(),
                    rate: self.rng.pick(&[0.01, 0.001]),
                    capacity: self.rng.pick(&[2, 10, 100]),
                    window: self.rng.chance(85).then(|| self.rng.range(1, 3)),
                    shard: self.rng.chance(90).then(|| self.rng.range(1, 2)),
                    expansion: self.rng.chance(50).then(|| self.rng.pick(&[1, 2, 4])),
                };
                // Often in place of what the key holds.
                if self.rng.chance(60) {
                    return (PRIMARY0, vec![Cmd::Del { key }, reserve]);
                }
                reserve
            }
            585..=644 => Cmd::BfAdd { key: self.filt_key(), item: self.item() },
            645..=669 => Cmd::BfMadd { key: self.filt_key(), items: self.items() },
            670..=709 => Cmd::BfExists { key: self.filt_key(), item: self.item() },
            710..=729 => Cmd::BfMexists { key: self.filt_key(), items: self.items() },
            730..=759 => Cmd::BfInfo { key: self.filt_key() },
            760..=779 => Cmd::Del { key: self.cleanup_key() },
            780..=789 => Cmd::Unlink { key: self.cleanup_key() },
            790..=814 => {
                let key = self.any_key();
                match self.rng.below(4) {
                    0 => Cmd::Exists { key },
                    1 => Cmd::Type { key },
                    2 => Cmd::Pttl { key },
                    _ => Cmd::Pexpiretime { key },
                }
            }
            815..=839 => {
                let key = self.any_key();
                if self.rng.chance(25) {
                    Cmd::Expire { key, secs: self.rng.range(1, 4) }
                } else {
                    Cmd::Pexpire { key, ms: self.rng.range(200, 4000) }
                }
            }
            840..=854 => Cmd::Persist { key: self.any_key() },
            855..=874 => {
                let (src, dst) = self.two_keys();
                Cmd::Copy { src, dst, replace: self.rng.chance(50) }
            }
            875..=889 => {
                let (src, dst) = self.two_keys();
                Cmd::Rename { src, dst }
            }
            890..=909 => Cmd::Dump { key: self.any_key(), slot: self.rng.below(DUMP_SLOTS as u64) as usize },
            910..=934 => {
                let slot = self.rng.below(DUMP_SLOTS as u64) as usize;
                if self.payloads[slot].is_none() {
                    Cmd::Dump { key: self.any_key(), slot }
                } else {
                    let now = self.worlds_time();
                    let (ttl, absttl) = match self.rng.below(3) {
                        0 => (0, false),
                        1 => (self.rng.range(300, 5000), false),
                        _ => (now + self.rng.range(-2000, 5000), true),
                    };
                    Cmd::Restore { key: self.any_key(), slot, ttl, replace: self.rng.chance(60), absttl }
                }
            }
            935..=954 => Cmd::Move { key: self.any_key() },
            955..=959 => Cmd::Swapdb,
            960..=962 => Cmd::DebugReload,
            963..=969 => Cmd::SetStr { key: self.any_key(), px: self.rng.range(300, 3000) },
            _ => {
                // A look at database 1, where MOVE and SWAPDB put keys.
                let key = self.any_key();
                let cmd = match self.rng.below(4) {
                    0 => Cmd::Get { key },
                    1 => Cmd::BfInfo { key },
                    2 => Cmd::Pexpiretime { key },
                    _ => Cmd::Type { key },
                };
                return (PRIMARY1, vec![cmd]);
            }
        };
        (PRIMARY0, vec![cmd])
    }

    /// For DEL and UNLINK: often a key that holds what its name does not
    /// say (a filter or a string in a record key...), so that the key space
    /// keeps its kinds.
    fn cleanup_key(&mut self) -> String {
        if self.rng.chance(50) {
            let misplaced: Vec<String> = self.world().dbs[0]
                .iter()
                .filter(|(k, e)| match e.val {
                    Val::Rec(_) => !k.starts_with('r'),
                    Val::Filt(_) => !k.starts_with('f'),
                    Val::Str(_) => true,
                })
                .map(|(k, _)| k.clone())
                .collect();
            if !misplaced.is_empty() {
                let i = self.rng.below(misplaced.len() as u64) as usize;
                return misplaced[i].clone();
            }
        }
        self.any_key()
    }

    fn two_keys(&mut self) -> (String, String) {
        let src = self.any_key();
        loop {
            // Mostly within a kind (records with records), sometimes across.
            let dst = if self.rng.chance(90) {
                if RECS.contains(&src.as_str()) { self.rng.pick(&RECS) } else { self.rng.pick(&FILTS) }.to_string()
            } else {
                self.any_key()
            };
            if dst != src {
                return (src, dst);
            }
        }
    }

    /// The local clock, Unix ms (for ABSTTL arguments only).
    fn worlds_time(&self) -> i64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
    }

    /// A replica keeps keys that DEBUG RELOAD dropped as expired on the
    /// primary (the server propagates no DEL for them). A SET and a DEL of
    /// each key the model holds absent clears them, checked like any step.
    fn clear_stale_replica_keys(&mut self) {
        // Absent now, after the reload: the keys it may have dropped.
        let now = server_ms(&mut self.cons[PRIMARY0]);
        let worlds: Vec<World> = self.worlds.iter().flat_map(|w| w.at(now)).collect();
        for db in 0..2 {
            let keys: Vec<String> = all_keys()
                .iter()
                .filter(|k| worlds.iter().all(|w| w.get(db, k).is_none()))
                .map(|k| k.to_string())
                .collect();
            let mut cmds = Vec::new();
            for k in keys {
                cmds.push(Cmd::SetStr { key: k.clone(), px: 10_000 });
                cmds.push(Cmd::Del { key: k });
            }
            if !cmds.is_empty() {
                self.step(PRIMARY0 + db, &cmds);
            }
        }
    }

    fn run(&mut self, seconds: f64) {
        eprintln!("stateful: seed {} on {} for {seconds} s", self.seed, self.server);
        let deadline = Instant::now() + Duration::from_secs_f64(seconds);
        let mut last_sweep = Instant::now();
        while Instant::now() < deadline {
            let (conn, cmds) = self.choose();
            self.step(conn, &cmds);
            if cmds == [Cmd::DebugReload] {
                self.clear_stale_replica_keys();
            }
            self.disambiguate();
            if last_sweep.elapsed() > Duration::from_secs(3) {
                self.sweep();
                last_sweep = Instant::now();
            }
            std::thread::sleep(PACE);
        }
        self.sweep();
        self.primary.assert_alive();
        self.replica.assert_alive();
        let allowed = 5 + self.neg / 25;
        eprintln!(
            "stateful: seed {} on {}: {} steps in {:.1} s, {} probes, {} replica digests equal, at most {} worlds, widest bracket {} ms, false positives {} of {} negative Bloom answers",
            self.seed,
            self.server,
            self.steps,
            self.started.elapsed().as_secs_f64(),
            self.probes,
            self.digests,
            self.max_worlds,
            self.widest,
            self.fp,
            self.neg
        );
        let covered: Vec<String> = self.seen.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        eprintln!("stateful: replies seen: {}", covered.join(", "));
        if self.fp > allowed {
            self.fail(&format!(
                "{} false positives in {} negative Bloom answers (at most {allowed} allowed)",
                self.fp, self.neg
            ));
        }
    }

    /// After WAIT, the replica's dataset digest equals the primary's. Keys
    /// expire and shards drop on the primary all the time: compare only a
    /// primary digest that did not change around the replica's.
    fn check_replica(&mut self) {
        let mut last = String::new();
        for _ in 0..50 {
            let p1 = digest(&mut self.cons[PRIMARY0]);
            let acked: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut self.cons[PRIMARY0]).expect("WAIT");
            let r = digest(&mut self.cons[REPLICA0]);
            let p2 = digest(&mut self.cons[PRIMARY0]);
            if acked == 1 && p1 == p2 && p1 == r {
                self.digests += 1;
                return;
            }
            last = format!("primary {p1} then {p2}, replica {r}, WAIT acked by {acked}");
            std::thread::sleep(Duration::from_millis(100));
        }
        let diff = self.diff_keys();
        self.fail(&format!(
            "the replica's DEBUG DIGEST never matched the primary's: {last}\nkeys that differ:\n{diff}"
        ));
    }

    /// Every key whose digest, expiry or type differs between the primary
    /// and the replica, with both sides and the key's history.
    fn diff_keys(&mut self) -> String {
        let mut out = String::new();
        for db in 0..2 {
            for k in all_keys() {
                let mut sides = Vec::new();
                for conn in [PRIMARY0 + db, REPLICA0 + db] {
                    let mut pipe = redis::pipe();
                    pipe.cmd("DEBUG").arg("DIGEST-VALUE").arg(k);
                    pipe.cmd("PEXPIRETIME").arg(k);
                    pipe.cmd("TYPE").arg(k);
                    pipe.cmd("DEBUG").arg("OBJECT").arg(k);
                    let packed = pipe.get_packed_pipeline();
                    let r = redis::ConnectionLike::req_packed_commands(&mut self.cons[conn], &packed, 0, 4)
                        .map(|v| v.iter().map(short).collect::<Vec<_>>())
                        .unwrap_or_else(|e| vec![format!("error {e}")]);
                    sides.push(r);
                }
                if sides[0][..sides[0].len().min(3)] != sides[1][..sides[1].len().min(3)] {
                    out.push_str(&format!(
                        "  db{db} {k} (digest-value, pexpiretime, type, debug object):\n    primary: {}\n    replica: {}\n{}",
                        sides[0].join(" | "),
                        sides[1].join(" | "),
                        self.history(k)
                    ));
                }
            }
        }
        out
    }
}

/// Reads that show everything about `keys`.
fn probe_cmds(keys: &[String]) -> Vec<Cmd> {
    let mut cmds = Vec::new();
    for k in keys {
        cmds.push(Cmd::Type { key: k.clone() });
        cmds.push(Cmd::Pexpiretime { key: k.clone() });
        cmds.push(Cmd::Get { key: k.clone() });
        cmds.push(Cmd::BfInfo { key: k.clone() });
    }
    cmds
}

fn seconds() -> f64 {
    std::env::var("IDEM_STATEFUL_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(28.0)
}

fn run_seed(seed: u64) {
    let mut run = Run::new(seed);
    run.run(seconds());
}

#[test]
fn stateful_seed_1() {
    run_seed(1);
}

#[test]
fn stateful_seed_2() {
    run_seed(0x5eed_0002);
}

/// More seeds for `make fuzz` (`IDEM_STATEFUL_SEEDS=n`), or given ones to
/// replay (`IDEM_STATEFUL_SEED=s1,s2`). Does nothing when neither is set.
#[test]
fn stateful_random_seeds() {
    let mut seeds: Vec<u64> = Vec::new();
    if let Ok(list) = std::env::var("IDEM_STATEFUL_SEED") {
        seeds.extend(
            list.split(',')
                .filter(|s| !s.trim().is_empty())
                .map(|s| s.trim().parse::<u64>().expect("IDEM_STATEFUL_SEED: integers")),
        );
    }
    if let Ok(n) = std::env::var("IDEM_STATEFUL_SEEDS") {
        let n: u64 = n.trim().parse().expect("IDEM_STATEFUL_SEEDS: a number of seeds");
        let base = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
        let mut r = Rng(base);
        seeds.extend((0..n).map(|_| r.next() >> 16));
    }
    for seed in seeds {
        run_seed(seed);
    }
}
