//! A model of what the module's commands answer, written from
//! docs/commands.md (the user documentation, which holds the contract),
//! never from src/. tests/stateful.rs checks a real server against it.
//!
//! The model is a `World`: the keys of databases 0 and 1 (records, filters,
//! plain strings, each with its absolute expiry) plus the values of the DUMP
//! payloads the test holds. `apply(world, cmd, t)` gives every answer the
//! documentation allows for `cmd` run at Unix ms `t`, each with the world it
//! leaves. The test does not know `t` exactly (only that it lies between two
//! `TIME` calls), so it tries every ms of that bracket and keeps the worlds
//! whose answer matched the server's.
//!
//! Where the documentation leaves a choice to the module, `apply` returns one
//! answer per choice:
//! - a filter that has no live shard left but whose key has not expired (the
//!   user set its TTL) is deleted by the module "on access and in the
//!   background": until that is seen it may or may not exist;
//! - a filter whose TTL the user set (EXPIRE, PERSIST, RESTORE) may get the
//!   module's own expiry (newest shard end) back at any time (when the
//!   module drops a shard, writes to it, or its background walk passes); a
//!   write that opens a new shard always sets it;
//! - `IDEM.DONE ... BLOOM f` where `f` holds another type and the record is
//!   already done or the token stale: `0`/`STALE` or `WRONGTYPE` (when it
//!   completes the record the docs say `5`: completed, the add dropped);
//! - `IDEM.CLAIM ... BLOOM f` where `f` holds another type and a record
//!   exists: the record's answer or `WRONGTYPE`;
//! - `IDEM.BF.ADD` on such a dead filter: a new filter from the configs, or
//!   the old parameters with a fresh shard.
//!
//! A Bloom filter may answer "maybe seen" where the model knows the item is
//! absent (a false positive): `matches` allows it and counts it. It must
//! never answer "not seen" for an item the model holds in a live shard.

use redis::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// Stands for the token a granted claim will get, until the reply shows it.
pub const PENDING: &str = "<pending token>";

pub const DAY: i64 = 86_400;

/// The module configuration the server was started with.
#[derive(Clone, Debug)]
pub struct Cfg {
    pub history_ms: i64,
    pub retain_ms: i64,
    pub bf_rate: f64,
    pub bf_capacity: i64,
    pub bf_window: i64,
}

// ---------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Claimed; "expired" once `t >= lease_end`.
    Processing,
    Released,
    Done,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Rec {
    pub phase: Phase,
    pub attempt: i64,
    /// Unix ms the lease ends (Processing only, else 0).
    pub lease_end: i64,
    pub claimed_at: i64,
    pub done_at: i64,
    pub result: Option<Vec<u8>>,
    /// xxh3-128 of the first granted claim's PAYLOAD, 32 hex digits.
    pub fingerprint: Option<String>,
    /// The latest claim's token (None for records made by ONCE or a late DONE).
    pub token: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Shard {
    pub items: BTreeSet<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Filt {
    /// error_rate as f64 bits (so the world can be hashed).
    pub rate_bits: u64,
    pub capacity: i64,
    pub window: i64,
    /// Shard period, seconds.
    pub period: i64,
    pub expansion: i64,
    /// Live shards by start (Unix seconds).
    pub shards: BTreeMap<i64, Shard>,
    /// The key's expiry was set by a user command, not by the module.
    pub user_expiry: bool,
    /// A shard of this filter has left the window (the module may still be
    /// holding it, and will put the expiry back when it drops it).
    pub ever_dropped: bool,
}

impl Filt {
    pub fn rate(&self) -> f64 {
        f64::from_bits(self.rate_bits)
    }

    fn span_ms(&self) -> i64 {
        self.window * self.period * 1000
    }

    /// The start (Unix s) of the shard `t` falls in.
    pub fn current_start(&self, t: i64) -> i64 {
        t.div_euclid(self.period * 1000) * self.period
    }

    /// Last ms a shard starting at `start` is live (it is live through it).
    pub fn shard_end(&self, start: i64) -> i64 {
        start * 1000 + self.span_ms()
    }

    /// The key's own expiry: the newest shard's end.
    pub fn newest_end(&self) -> Option<i64> {
        self.shards.keys().next_back().map(|&s| self.shard_end(s))
    }

    pub fn contains(&self, item: &str) -> bool {
        self.shards.values().any(|s| s.items.contains(item))
    }

    fn new(rate: f64, capacity: i64, window: i64, period: i64, expansion: i64) -> Filt {
        Filt {
            rate_bits: rate.to_bits(),
            capacity,
            window,
            period,
            expansion,
            shards: BTreeMap::new(),
            user_expiry: false,
            ever_dropped: false,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Val {
    Rec(Rec),
    Filt(Filt),
    Str(Vec<u8>),
}

impl Val {
    pub fn type_name(&self) -> &'static str {
        match self {
            Val::Rec(_) => "idemrecrd",
            Val::Filt(_) => "idembloom",
            Val::Str(_) => "string",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Entry {
    pub val: Val,
    /// Absolute expiry, Unix ms; Redis keeps the key while `now <= expire`.
    pub expire: Option<i64>,
}

impl Entry {
    /// One line, results cut short.
    pub fn describe(&self) -> String {
        let val = match &self.val {
            Val::Rec(r) => format!(
                "record {:?} attempt={} lease_end={} claimed_at={} done_at={} result={} fingerprint={:?} token={:?}",
                r.phase,
                r.attempt,
                r.lease_end,
                r.claimed_at,
                r.done_at,
                r.result.as_deref().map_or("nil".to_string(), show_arg),
                r.fingerprint,
                r.token
            ),
            Val::Filt(f) => {
                let shards: Vec<String> = f.shards.iter().map(|(s, sh)| format!("{s}: {:?}", sh.items)).collect();
                format!(
                    "filter rate={} capacity={} window={} shard={}s expansion={} user_expiry={} ever_dropped={} shards=[{}]",
                    f.rate(),
                    f.capacity,
                    f.window,
                    f.period,
                    f.expansion,
                    f.user_expiry,
                    f.ever_dropped,
                    shards.join("; ")
                )
            }
            Val::Str(b) => format!("string {}", show_arg(b)),
        };
        format!("{val} expire={:?}", self.expire)
    }

    pub fn alive(&self, t: i64) -> bool {
        self.expire.is_none_or(|e| t <= e)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct World {
    pub dbs: [BTreeMap<String, Entry>; 2],
    /// What each DUMP slot's payload holds (None: DUMP answered nil).
    pub dumps: Vec<Option<Val>>,
}

impl World {
    pub fn new(dump_slots: usize) -> World {
        World { dbs: [BTreeMap::new(), BTreeMap::new()], dumps: vec![None; dump_slots] }
    }

    pub fn get(&self, db: usize, key: &str) -> Option<&Entry> {
        self.dbs[db].get(key)
    }

    /// The world as it may be at `t`: expired keys gone, shards that left
    /// the window dropped. A filter whose user-set expiry has come may have
    /// got the module's own expiry back before it (see `variants`): then it
    /// lives on.
    pub fn at(&self, t: i64) -> Vec<World> {
        let mut out = vec![self.clone()];
        for db in 0..2 {
            for (k, e) in &self.dbs[db] {
                if let Val::Filt(f) = &e.val
                    && f.user_expiry
                    && !e.alive(t)
                {
                    let mut more = Vec::new();
                    for w in &out {
                        let mut reset = w.clone();
                        let e = reset.dbs[db].get_mut(k).unwrap();
                        let Val::Filt(f) = &mut e.val else { unreachable!() };
                        e.expire = f.newest_end();
                        f.user_expiry = false;
                        more.push(reset);
                    }
                    out.extend(more);
                }
            }
        }
        for w in out.iter_mut() {
            w.purge(t);
        }
        out.dedup();
        out
    }

    fn purge(&mut self, t: i64) {
        for db in self.dbs.iter_mut() {
            db.retain(|_, e| e.alive(t));
            for e in db.values_mut() {
                if let Val::Filt(f) = &mut e.val {
                    let span = f.span_ms();
                    let before = f.shards.len();
                    f.shards.retain(|&s, _| t <= s * 1000 + span);
                    if f.shards.len() != before {
                        f.ever_dropped = true;
                    }
                }
            }
        }
    }

    /// Replaces the pending token of a granted claim by the one the server
    /// answered.
    pub fn patch_token(&mut self, token: &str) {
        for db in self.dbs.iter_mut() {
            for e in db.values_mut() {
                if let Val::Rec(r) = &mut e.val
                    && r.token.as_deref() == Some(PENDING)
                {
                    r.token = Some(token.to_string());
                }
            }
        }
    }

    /// A short description of a key, for failure reports.
    pub fn describe(&self, db: usize, key: &str) -> String {
        match self.get(db, key) {
            None => "absent".into(),
            Some(e) => e.describe(),
        }
    }
}

/// The variants of `w` (already at `t`) the module may have made of `keys`
/// on its own: a dead filter deleted, a user-set filter expiry put back to
/// the newest shard's end. The latter may happen at any time, so it is only
/// forked where a command shows the expiry (`shows_expiry`); until then the
/// world keeps it open (COPY, RENAME and MOVE carry it along).
pub fn variants(w: &World, db: usize, keys: &[&str], shows_expiry: bool) -> Vec<World> {
    let mut out = vec![w.clone()];
    for key in keys {
        let mut more = Vec::new();
        for v in &out {
            let Some(Entry { val: Val::Filt(f), .. }) = v.get(db, key) else { continue };
            if f.shards.is_empty() {
                let mut gone = v.clone();
                gone.dbs[db].remove(*key);
                more.push(gone);
            } else if f.user_expiry && shows_expiry {
                let mut reset = v.clone();
                let e = reset.dbs[db].get_mut(*key).unwrap();
                let Val::Filt(f) = &mut e.val else { unreachable!() };
                e.expire = f.newest_end();
                f.user_expiry = false;
                more.push(reset);
            }
        }
        out.extend(more);
        out.dedup();
    }
    out
}

// ---------------------------------------------------------------------------
// Commands
// ---------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq)]
pub enum Cmd {
    Claim {
        key: String,
        lease: i64,
        payload: Option<Vec<u8>>,
        maxtries: Option<i64>,
        bloom: Option<String>,
    },
    Done {
        key: String,
        token: String,
        result: Option<Vec<u8>>,
        retain: Option<i64>,
        bloom: Option<String>,
    },
    Release {
        key: String,
        token: String,
    },
    Extend {
        key: String,
        token: String,
        lease: i64,
    },
    Get {
        key: String,
    },
    Once {
        key: String,
        retain: i64,
    },
    BfReserve {
        key: String,
        rate: f64,
        capacity: i64,
        window: Option<i64>,
        shard: Option<i64>,
        expansion: Option<i64>,
    },
    BfAdd {
        key: String,
        item: String,
    },
    BfMadd {
        key: String,
        items: Vec<String>,
    },
    BfExists {
        key: String,
        item: String,
    },
    BfMexists {
        key: String,
        items: Vec<String>,
    },
    BfInfo {
        key: String,
    },
    Del {
        key: String,
    },
    Unlink {
        key: String,
    },
    Exists {
        key: String,
    },
    Type {
        key: String,
    },
    Pttl {
        key: String,
    },
    Pexpiretime {
        key: String,
    },
    Pexpire {
        key: String,
        ms: i64,
    },
    Expire {
        key: String,
        secs: i64,
    },
    Persist {
        key: String,
    },
    Copy {
        src: String,
        dst: String,
        replace: bool,
    },
    Rename {
        src: String,
        dst: String,
    },
    Dump {
        key: String,
        slot: usize,
    },
    /// `ttl` 0: no expiry; else ms from now, or a Unix ms with ABSTTL.
    Restore {
        key: String,
        slot: usize,
        ttl: i64,
        replace: bool,
        absttl: bool,
    },
    /// MOVE key 1 (from db 0).
    Move {
        key: String,
    },
    Swapdb,
    DebugReload,
    /// SET key plain PX ms: a key of another type, for a while.
    SetStr {
        key: String,
        px: i64,
    },
}

impl Cmd {
    /// The keys the command reads or writes (in its own database).
    pub fn keys(&self) -> Vec<&str> {
        use Cmd::*;
        match self {
            Claim { key, bloom, .. } | Done { key, bloom, .. } => {
                let mut k = vec![key.as_str()];
                if let Some(b) = bloom {
                    k.push(b);
                }
                k
            }
            Copy { src, dst, .. } | Rename { src, dst } => vec![src, dst],
            Swapdb | DebugReload => vec![],
            Release { key, .. }
            | Extend { key, .. }
            | Get { key }
            | Once { key, .. }
            | BfReserve { key, .. }
            | BfAdd { key, .. }
            | BfMadd { key, .. }
            | BfExists { key, .. }
            | BfMexists { key, .. }
            | BfInfo { key }
            | Del { key }
            | Unlink { key }
            | Exists { key }
            | Type { key }
            | Pttl { key }
            | Pexpiretime { key }
            | Pexpire { key, .. }
            | Expire { key, .. }
            | Persist { key }
            | Dump { key, .. }
            | Restore { key, .. }
            | Move { key }
            | SetStr { key, .. } => vec![key],
        }
    }

    /// The command's arguments; `payload` is the DUMP payload a RESTORE sends.
    pub fn argv(&self, payload: Option<&[u8]>) -> Vec<Vec<u8>> {
        use Cmd::*;
        let mut a: Vec<Vec<u8>> = Vec::new();
        let mut s = |x: &str| a.push(x.as_bytes().to_vec());
        match self {
            Claim { key, lease, payload, maxtries, bloom } => {
                s("IDEM.CLAIM");
                s(key);
                s(&lease.to_string());
                if let Some(p) = payload {
                    s("PAYLOAD");
                    a.push(p.clone());
                }
                let mut s = |x: &str| a.push(x.as_bytes().to_vec());
                if let Some(n) = maxtries {
                    s("MAXTRIES");
                    s(&n.to_string());
                }
                if let Some(b) = bloom {
                    s("BLOOM");
                    s(b);
                }
            }
            Done { key, token, result, retain, bloom } => {
                s("IDEM.DONE");
                s(key);
                s(token);
                if let Some(r) = result {
                    s("RESULT");
                    a.push(r.clone());
                }
                let mut s = |x: &str| a.push(x.as_bytes().to_vec());
                if let Some(r) = retain {
                    s("RETAIN");
                    s(&r.to_string());
                }
                if let Some(b) = bloom {
                    s("BLOOM");
                    s(b);
                }
            }
            Release { key, token } => {
                s("IDEM.RELEASE");
                s(key);
                s(token);
            }
            Extend { key, token, lease } => {
                s("IDEM.EXTEND");
                s(key);
                s(token);
                s(&lease.to_string());
            }
            Get { key } => {
                s("IDEM.GET");
                s(key);
            }
            Once { key, retain } => {
                s("IDEM.ONCE");
                s(key);
                s(&retain.to_string());
            }
            BfReserve { key, rate, capacity, window, shard, expansion } => {
                s("IDEM.BF.RESERVE");
                s(key);
                s(&rate.to_string());
                s(&capacity.to_string());
                if let Some(w) = window {
                    s("WINDOW");
                    s(&w.to_string());
                }
                if let Some(p) = shard {
                    s("SHARD");
                    s(&p.to_string());
                }
                if let Some(e) = expansion {
                    s("EXPANSION");
                    s(&e.to_string());
                }
            }
            BfAdd { key, item } => {
                s("IDEM.BF.ADD");
                s(key);
                s(item);
            }
            BfMadd { key, items } => {
                s("IDEM.BF.MADD");
                s(key);
                for i in items {
                    s(i);
                }
            }
            BfExists { key, item } => {
                s("IDEM.BF.EXISTS");
                s(key);
                s(item);
            }
            BfMexists { key, items } => {
                s("IDEM.BF.MEXISTS");
                s(key);
                for i in items {
                    s(i);
                }
            }
            BfInfo { key } => {
                s("IDEM.BF.INFO");
                s(key);
            }
            Del { key } => {
                s("DEL");
                s(key);
            }
            Unlink { key } => {
                s("UNLINK");
                s(key);
            }
            Exists { key } => {
                s("EXISTS");
                s(key);
            }
            Type { key } => {
                s("TYPE");
                s(key);
            }
            Pttl { key } => {
                s("PTTL");
                s(key);
            }
            Pexpiretime { key } => {
                s("PEXPIRETIME");
                s(key);
            }
            Pexpire { key, ms } => {
                s("PEXPIRE");
                s(key);
                s(&ms.to_string());
            }
            Expire { key, secs } => {
                s("EXPIRE");
                s(key);
                s(&secs.to_string());
            }
            Persist { key } => {
                s("PERSIST");
                s(key);
            }
            Copy { src, dst, replace } => {
                s("COPY");
                s(src);
                s(dst);
                if *replace {
                    s("REPLACE");
                }
            }
            Rename { src, dst } => {
                s("RENAME");
                s(src);
                s(dst);
            }
            Dump { key, .. } => {
                s("DUMP");
                s(key);
            }
            Restore { key, ttl, replace, absttl, .. } => {
                s("RESTORE");
                s(key);
                s(&ttl.to_string());
                a.push(payload.expect("RESTORE needs a payload").to_vec());
                let mut s = |x: &str| a.push(x.as_bytes().to_vec());
                if *replace {
                    s("REPLACE");
                }
                if *absttl {
                    s("ABSTTL");
                }
            }
            Move { key } => {
                s("MOVE");
                s(key);
                s("1");
            }
            Swapdb => {
                s("SWAPDB");
                s("0");
                s("1");
            }
            DebugReload => {
                s("DEBUG");
                s("RELOAD");
            }
            SetStr { key, px } => {
                s("SET");
                s(key);
                s("plain");
                s("PX");
                s(&px.to_string());
            }
        }
        a
    }

    /// Whether the reply depends on the key's expiry (beyond the key's
    /// existence).
    pub fn shows_expiry(&self) -> bool {
        matches!(self, Cmd::Pttl { .. } | Cmd::Pexpiretime { .. } | Cmd::Persist { .. })
    }

    /// Read-only commands never change the world (but for what the module
    /// may do on its own, see `variants`).
    pub fn is_read(&self) -> bool {
        use Cmd::*;
        matches!(
            self,
            Get { .. }
                | BfExists { .. }
                | BfMexists { .. }
                | BfInfo { .. }
                | Exists { .. }
                | Type { .. }
                | Pttl { .. }
                | Pexpiretime { .. }
        )
    }
}

/// Printable form of an argument (binary bytes escaped, long ones cut).
pub fn show_arg(a: &[u8]) -> String {
    let mut s = String::new();
    for &b in a.iter().take(40) {
        if b.is_ascii_graphic() {
            s.push(b as char);
        } else {
            s.push_str(&format!("\\x{b:02x}"));
        }
    }
    if a.len() > 40 {
        s.push_str(&format!("...({} bytes)", a.len()));
    }
    if s.is_empty() {
        s.push_str("\"\"");
    }
    s
}

impl fmt::Display for Cmd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let placeholder = b"<payload>".to_vec();
        let argv = self.argv(Some(&placeholder));
        let parts: Vec<String> = argv.iter().map(|a| show_arg(a)).collect();
        write!(f, "{}", parts.join(" "))
    }
}

// ---------------------------------------------------------------------------
// Expected replies
// ---------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq)]
pub enum CVal {
    /// A fresh token.
    Token,
    Nil,
    /// The stored result of a done record.
    Result(Option<Vec<u8>>),
    /// ms left on the lease.
    Ms(i64),
}

#[derive(Clone, Debug, PartialEq)]
pub struct GetExp {
    pub state: &'static str,
    pub attempt: i64,
    pub lease_ms: i64,
    pub pttl: i64,
    pub claimed_at: i64,
    pub done_at: i64,
    pub result: Option<Vec<u8>>,
    pub fingerprint: Option<String>,
    /// The key's TTL and the module's clock are two readings of the clock,
    /// each anywhere in the step's bracket: `pttl` may be off by up to
    /// (below, above) ms from its value at the module's time.
    pub pttl_slack: (i64, i64),
}

#[derive(Clone, Debug, PartialEq)]
pub struct InfoExp {
    pub rate: f64,
    pub capacity: i64,
    pub window: i64,
    pub shard: i64,
    pub expansion: i64,
    /// (start, distinct items added) of each live shard, oldest first.
    pub shards: Vec<(i64, i64)>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Exp {
    Int(i64),
    Nil,
    Okay,
    /// A simple or bulk string.
    Text(&'static str),
    /// An error reply starting with this.
    Err(&'static str),
    /// A DUMP payload (any bulk string).
    Payload,
    /// A Bloom answer. `seen`: what the model knows (the item is in a live
    /// shard). `add`: the reply of ADD (1 = new), else of EXISTS (1 = maybe
    /// seen).
    Bloom {
        seen: bool,
        add: bool,
    },
    Array(Vec<Exp>),
    /// `[status, value, attempt]`; `seen_ok`: NEW may come as SEEN (a false
    /// positive of the BLOOM filter).
    Claim {
        status: &'static str,
        seen_ok: bool,
        value: CVal,
        attempt: i64,
    },
    Get(Box<GetExp>),
    Info(Box<InfoExp>),
}

/// What a matching reply told beyond the model.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Matched {
    /// The token of a granted claim.
    pub token: Option<String>,
    /// False positives, and queries the model knew to be negative.
    pub fp: u32,
    pub neg: u32,
}

fn text_of(v: &Value) -> Option<String> {
    match v {
        Value::SimpleString(s) => Some(s.clone()),
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::Okay => Some("OK".into()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

pub fn error_text(v: &Value) -> Option<String> {
    match v {
        Value::ServerError(e) => Some(match e.details() {
            Some(d) => format!("{} {}", e.code(), d),
            None => e.code().to_string(),
        }),
        _ => None,
    }
}

fn int_of(v: &Value) -> Result<i64, String> {
    match v {
        Value::Int(i) => Ok(*i),
        other => Err(format!("expected an integer, got {other:?}")),
    }
}

fn bytes_of(v: &Value) -> Result<Option<Vec<u8>>, String> {
    match v {
        Value::Nil => Ok(None),
        Value::BulkString(b) => Ok(Some(b.clone())),
        other => Err(format!("expected a bulk string or nil, got {other:?}")),
    }
}

pub fn is_token(t: &str) -> bool {
    t.len() == 32 && t.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
}

/// Field/value pairs of a RESP2 flat array or a RESP3 map, in order.
fn pairs(v: &Value) -> Result<Vec<(String, Value)>, String> {
    match v {
        Value::Array(items) if items.len() % 2 == 0 => {
            let mut out = Vec::new();
            for kv in items.chunks(2) {
                out.push((text_of(&kv[0]).ok_or("field name not a string")?, kv[1].clone()));
            }
            Ok(out)
        }
        Value::Map(m) => m.iter().map(|(k, v)| Ok((text_of(k).ok_or("field name not a string")?, v.clone()))).collect(),
        other => Err(format!("expected a map or a flat array, got {other:?}")),
    }
}

fn fields(v: &Value, names: &[&str]) -> Result<Vec<Value>, String> {
    let p = pairs(v)?;
    let got: Vec<&str> = p.iter().map(|(k, _)| k.as_str()).collect();
    if got != names {
        return Err(format!("field names {got:?}, expected {names:?}"));
    }
    Ok(p.into_iter().map(|(_, v)| v).collect())
}

/// Checks `v` against `exp`; on a match, adds what it learnt to `m`.
pub fn matches(exp: &Exp, v: &Value, m: &mut Matched) -> Result<(), String> {
    if let Some(e) = error_text(v) {
        return match exp {
            Exp::Err(prefix) if e.starts_with(prefix) => Ok(()),
            _ => Err(format!("error {e:?}, expected {exp:?}")),
        };
    }
    match exp {
        Exp::Int(n) => (int_of(v)? == *n).then_some(()).ok_or_else(|| format!("{v:?} != {n}")),
        Exp::Nil => (*v == Value::Nil).then_some(()).ok_or_else(|| format!("{v:?}, expected nil")),
        Exp::Okay => (text_of(v).as_deref() == Some("OK")).then_some(()).ok_or_else(|| format!("{v:?}, expected OK")),
        Exp::Text(s) => (text_of(v).as_deref() == Some(*s)).then_some(()).ok_or_else(|| format!("{v:?}, expected {s}")),
        Exp::Err(p) => Err(format!("{v:?}, expected an error {p}")),
        Exp::Payload => match v {
            Value::BulkString(_) => Ok(()),
            other => Err(format!("{other:?}, expected a DUMP payload")),
        },
        Exp::Bloom { seen, add } => {
            let bit = int_of(v)?;
            if bit != 0 && bit != 1 {
                return Err(format!("{bit}: not 0 or 1"));
            }
            let maybe_seen = if *add { bit == 0 } else { bit == 1 };
            if *seen {
                if !maybe_seen {
                    return Err(format!("{bit}: a false negative, the item is in a live shard"));
                }
            } else {
                m.neg += 1;
                if maybe_seen {
                    m.fp += 1;
                }
            }
            Ok(())
        }
        Exp::Array(exps) => match v {
            Value::Array(items) if items.len() == exps.len() => {
                for (i, (e, x)) in exps.iter().zip(items).enumerate() {
                    matches(e, x, m).map_err(|err| format!("element {i}: {err}"))?;
                }
                Ok(())
            }
            other => Err(format!("{other:?}, expected an array of {}", exps.len())),
        },
        Exp::Claim { status, seen_ok, value, attempt } => {
            let Value::Array(items) = v else { return Err(format!("{v:?}: not a 3-element array")) };
            if items.len() != 3 {
                return Err(format!("{v:?}: not a 3-element array"));
            }
            let got = text_of(&items[0]).ok_or("status not a string")?;
            if *seen_ok {
                m.neg += 1;
            }
            if got != *status {
                if *seen_ok && got == "SEEN" {
                    m.fp += 1;
                } else {
                    return Err(format!("status {got}, expected {status}"));
                }
            }
            let a = int_of(&items[2])?;
            if a != *attempt {
                return Err(format!("attempt {a}, expected {attempt}"));
            }
            match value {
                CVal::Token => {
                    let t = match &items[1] {
                        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                        other => return Err(format!("token {other:?} is not a bulk string")),
                    };
                    if !is_token(&t) {
                        return Err(format!("token {t:?} is not 32 lowercase hex digits"));
                    }
                    m.token = Some(t);
                }
                CVal::Nil => {
                    if items[1] != Value::Nil {
                        return Err(format!("value {:?}, expected nil", items[1]));
                    }
                }
                CVal::Result(r) => {
                    let got = bytes_of(&items[1])?;
                    if got != *r {
                        return Err(format!("result {got:?}, expected {r:?}"));
                    }
                }
                CVal::Ms(ms) => {
                    let got = int_of(&items[1])?;
                    if got != *ms {
                        return Err(format!("lease left {got} ms, expected {ms}"));
                    }
                }
            }
            Ok(())
        }
        Exp::Get(g) => {
            let f =
                fields(v, &["state", "attempt", "lease_ms", "pttl", "claimed_at", "done_at", "result", "fingerprint"])?;
            let state = text_of(&f[0]).ok_or("state not a string")?;
            let got = GetExp {
                state: match state.as_str() {
                    "processing" => "processing",
                    "expired" => "expired",
                    "released" => "released",
                    "done" => "done",
                    other => return Err(format!("state {other:?}")),
                },
                attempt: int_of(&f[1])?,
                lease_ms: int_of(&f[2])?,
                pttl: int_of(&f[3])?,
                claimed_at: int_of(&f[4])?,
                done_at: int_of(&f[5])?,
                result: bytes_of(&f[6])?,
                fingerprint: bytes_of(&f[7])?.map(|b| String::from_utf8_lossy(&b).into_owned()),
                pttl_slack: g.pttl_slack,
            };
            let pttl_ok = if g.pttl < 0 {
                got.pttl == g.pttl
            } else {
                (g.pttl - g.pttl_slack.0..=g.pttl + g.pttl_slack.1).contains(&got.pttl)
            };
            let same = GetExp { pttl: g.pttl, ..got.clone() };
            (same == **g && pttl_ok).then_some(()).ok_or_else(|| format!("IDEM.GET {got:?}, expected {g:?}"))
        }
        Exp::Info(i) => {
            let f = fields(v, &["error_rate", "capacity", "window", "shard", "expansion", "items", "bytes", "shards"])?;
            let rate = match &f[0] {
                Value::Double(d) => *d,
                other => text_of(other).and_then(|s| s.parse::<f64>().ok()).ok_or("error_rate not a double")?,
            };
            if (rate - i.rate).abs() > i.rate * 1e-9 {
                return Err(format!("error_rate {rate}, expected {}", i.rate));
            }
            let head = [int_of(&f[1])?, int_of(&f[2])?, int_of(&f[3])?, int_of(&f[4])?];
            if head != [i.capacity, i.window, i.shard, i.expansion] {
                return Err(format!(
                    "capacity/window/shard/expansion {head:?}, expected {:?}",
                    [i.capacity, i.window, i.shard, i.expansion]
                ));
            }
            let Value::Array(list) = &f[7] else { return Err("shards is not an array".into()) };
            let mut shards = Vec::new();
            for s in list {
                let sf = fields(s, &["start", "items", "filters", "bytes"])?;
                shards.push((int_of(&sf[0])?, int_of(&sf[1])?, int_of(&sf[2])?, int_of(&sf[3])?));
            }
            let starts: Vec<i64> = shards.iter().map(|s| s.0).collect();
            let want: Vec<i64> = i.shards.iter().map(|s| s.0).collect();
            if starts != want {
                return Err(format!("shard starts {starts:?}, expected {want:?}"));
            }
            let mut fp = 0;
            for (got, want) in shards.iter().zip(&i.shards) {
                // An item a shard's own bits already showed is not inserted
                // again: a false positive may leave a shard one short.
                if got.1 > want.1 || got.1 < 0 {
                    return Err(format!("shard {} has {} items, expected at most {}", got.0, got.1, want.1));
                }
                fp += (want.1 - got.1) as u32;
                if got.2 < 1 || got.3 <= 0 {
                    return Err(format!("shard {}: filters {} bytes {}", got.0, got.2, got.3));
                }
            }
            let items = int_of(&f[5])?;
            let bytes = int_of(&f[6])?;
            if items != shards.iter().map(|s| s.1).sum::<i64>() || bytes != shards.iter().map(|s| s.3).sum::<i64>() {
                return Err(format!("items {items} / bytes {bytes} are not the sums over {shards:?}"));
            }
            m.fp += fp;
            Ok(())
        }
    }
}

// ---------------------------------------------------------------------------
// Semantics
// ---------------------------------------------------------------------------

pub fn fingerprint(payload: &[u8]) -> String {
    format!("{:032x}", xxhash_rust::xxh3::xxh3_128(payload))
}

fn wrongtype() -> Exp {
    Exp::Err("WRONGTYPE")
}

/// What a filter key holds for a module command: a live filter, nothing, or
/// another type.
enum FKey<'a> {
    Missing,
    Filter(&'a Filt),
    Other,
}

fn fkey<'a>(w: &'a World, db: usize, key: &str) -> FKey<'a> {
    match w.get(db, key) {
        None => FKey::Missing,
        // A filter with no live shard is gone for the module.
        Some(Entry { val: Val::Filt(f), .. }) if f.shards.is_empty() => FKey::Missing,
        Some(Entry { val: Val::Filt(f), .. }) => FKey::Filter(f),
        Some(_) => FKey::Other,
    }
}

/// Adds `items` at `t` to the filter in `key` (created from the configs when
/// missing); the answers (true = seen before) and the worlds it may leave.
/// `None` when the key holds another type.
fn filter_add(w: &World, db: usize, key: &str, items: &[String], t: i64, cfg: &Cfg) -> Option<Vec<(Vec<bool>, World)>> {
    let mut starts: Vec<Filt> = Vec::new();
    let mut user_expiry: Option<(Option<i64>, bool)> = None;
    match w.get(db, key) {
        None => starts.push(Filt::new(cfg.bf_rate, cfg.bf_capacity, cfg.bf_window, DAY, 2)),
        Some(Entry { val: Val::Filt(f), expire }) => {
            if f.shards.is_empty() {
                // Dead: deleted and made again from the configs, or kept with
                // a fresh shard.
                starts.push(Filt::new(cfg.bf_rate, cfg.bf_capacity, cfg.bf_window, DAY, 2));
                let mut kept = f.clone();
                kept.user_expiry = false;
                starts.push(kept);
            } else {
                starts.push(f.clone());
                user_expiry = Some((*expire, f.user_expiry));
            }
        }
        Some(_) => return None,
    }
    let mut out = Vec::new();
    for mut f in starts {
        let cur = f.current_start(t);
        let new_shard = !f.shards.contains_key(&cur);
        let mut answers = Vec::new();
        for item in items {
            answers.push(f.contains(item));
            f.shards.entry(cur).or_insert_with(|| Shard { items: BTreeSet::new() }).items.insert(item.clone());
        }
        let mut w2 = w.clone();
        match user_expiry {
            Some((expire, true)) if !new_shard => {
                // The user's expiry stays, or the module puts its own back.
                let mut kept = w2.clone();
                kept.dbs[db].insert(key.to_string(), Entry { val: Val::Filt(f.clone()), expire });
                out.push((answers.clone(), kept));
                f.user_expiry = false;
            }
            _ => f.user_expiry = false,
        }
        let expire = f.newest_end();
        w2.dbs[db].insert(key.to_string(), Entry { val: Val::Filt(f), expire });
        out.push((answers, w2));
    }
    Some(out)
}

fn rec_of<'a>(w: &'a World, db: usize, key: &str) -> Result<Option<&'a Rec>, ()> {
    match w.get(db, key) {
        None => Ok(None),
        Some(Entry { val: Val::Rec(r), .. }) => Ok(Some(r)),
        Some(_) => Err(()),
    }
}

fn put_rec(w: &mut World, db: usize, key: &str, r: Rec, expire: Option<i64>) {
    w.dbs[db].insert(key.to_string(), Entry { val: Val::Rec(r), expire });
}

/// Every answer the docs allow for `cmd` on database `db` of `w` (which is
/// already at `t`, see `World::at` and `variants`), each with the world it
/// leaves.
pub fn apply(w: &World, db: usize, cmd: &Cmd, t: i64, cfg: &Cfg) -> Vec<(Exp, World)> {
    let mut out = apply_documented(w, db, cmd, t, cfg);
    // `BLOOM` naming the record's own key: the docs do not say; the module
    // refuses it with an error (and changes nothing).
    if let Cmd::Claim { key, bloom: Some(b), .. } | Cmd::Done { key, bloom: Some(b), .. } = cmd
        && key == b
    {
        out.push((Exp::Err("ERR"), w.clone()));
    }
    out
}

fn apply_documented(w: &World, db: usize, cmd: &Cmd, t: i64, cfg: &Cfg) -> Vec<(Exp, World)> {
    use Cmd::*;
    let same = |e: Exp| vec![(e, w.clone())];
    match cmd {
        Claim { key, lease, payload, maxtries, bloom } => {
            let fp = payload.as_deref().map(fingerprint);
            let bloom_key = bloom.as_deref().map(|b| fkey(w, db, b));
            let bloom_wrong = matches!(bloom_key, Some(FKey::Other));
            let rec = match rec_of(w, db, key) {
                Err(()) => return same(wrongtype()),
                Ok(r) => r,
            };
            let lease_ms = lease * 1000;
            let granted = |attempt: i64, old: Option<&Rec>| {
                let fingerprint = old.and_then(|r| r.fingerprint.clone()).or(fp.clone());
                let r = Rec {
                    phase: Phase::Processing,
                    attempt,
                    lease_end: t + lease_ms,
                    claimed_at: t,
                    done_at: 0,
                    result: None,
                    fingerprint,
                    token: Some(PENDING.to_string()),
                };
                let mut w2 = w.clone();
                put_rec(&mut w2, db, key, r, Some(t + lease_ms + cfg.history_ms));
                w2
            };
            let Some(r) = rec else {
                if bloom_wrong {
                    return same(wrongtype());
                }
                let seen = matches!(&bloom_key, Some(FKey::Filter(f)) if f.contains(key));
                let exp = if seen {
                    Exp::Claim { status: "SEEN", seen_ok: false, value: CVal::Token, attempt: 1 }
                } else {
                    Exp::Claim { status: "NEW", seen_ok: bloom_key.is_some(), value: CVal::Token, attempt: 1 }
                };
                return vec![(exp, granted(1, None))];
            };
            let mut out = if let (Some(want), Some(have)) = (&fp, &r.fingerprint)
                && want != have
            {
                same(Exp::Claim { status: "MISMATCH", seen_ok: false, value: CVal::Nil, attempt: r.attempt })
            } else if r.phase == Phase::Done {
                same(Exp::Claim {
                    status: "DONE",
                    seen_ok: false,
                    value: CVal::Result(r.result.clone()),
                    attempt: r.attempt,
                })
            } else if r.phase == Phase::Processing && t < r.lease_end {
                same(Exp::Claim {
                    status: "BUSY",
                    seen_ok: false,
                    value: CVal::Ms(r.lease_end - t),
                    attempt: r.attempt,
                })
            } else if maxtries.is_some_and(|n| r.attempt >= n) {
                same(Exp::Claim { status: "EXHAUSTED", seen_ok: false, value: CVal::Nil, attempt: r.attempt })
            } else {
                vec![(
                    Exp::Claim { status: "RETRY", seen_ok: false, value: CVal::Token, attempt: r.attempt + 1 },
                    granted(r.attempt + 1, Some(r)),
                )]
            };
            // A record decides; whether the filter's type is checked first
            // the docs do not say.
            if bloom_wrong {
                out.push((wrongtype(), w.clone()));
            }
            out
        }
        Done { key, token, result, retain, bloom } => {
            let retain_ms = retain.map_or(cfg.retain_ms, |r| r * 1000);
            let rec = match rec_of(w, db, key) {
                Err(()) => return same(wrongtype()),
                Ok(r) => r,
            };
            let completed = match rec {
                None => Some(Rec {
                    phase: Phase::Done,
                    attempt: 0,
                    lease_end: 0,
                    claimed_at: 0,
                    done_at: t,
                    result: result.clone(),
                    fingerprint: None,
                    token: None,
                }),
                Some(r) if r.phase == Phase::Done => None,
                Some(r) if r.token.as_deref() == Some(token.as_str()) => {
                    Some(Rec { phase: Phase::Done, lease_end: 0, done_at: t, result: result.clone(), ..r.clone() })
                }
                Some(_) => None,
            };
            let not_done = if rec.is_some_and(|r| r.phase == Phase::Done) { Exp::Int(0) } else { Exp::Err("STALE") };
            let Some(done) = completed else {
                let mut out = same(not_done);
                if bloom.as_deref().is_some_and(|b| matches!(fkey(w, db, b), FKey::Other)) {
                    out.push((wrongtype(), w.clone()));
                }
                return out;
            };
            let mut base = w.clone();
            put_rec(&mut base, db, key, done, Some(t + retain_ms));
            match bloom {
                None => vec![(Exp::Int(1), base)],
                Some(b) => match filter_add(&base, db, b, std::slice::from_ref(key), t, cfg) {
                    Some(worlds) => worlds.into_iter().map(|(_, w2)| (Exp::Int(1), w2)).collect(),
                    // The filter key holds another type: the record is
                    // completed all the same, the add dropped (+4).
                    None => vec![(Exp::Int(5), base)],
                },
            }
        }
        Release { key, token } => match rec_of(w, db, key) {
            Err(()) => same(wrongtype()),
            Ok(Some(r))
                if r.phase == Phase::Processing && t < r.lease_end && r.token.as_deref() == Some(token.as_str()) =>
            {
                let mut w2 = w.clone();
                let r2 = Rec { phase: Phase::Released, lease_end: 0, ..r.clone() };
                put_rec(&mut w2, db, key, r2, Some(t + cfg.history_ms));
                vec![(Exp::Int(1), w2)]
            }
            Ok(_) => same(Exp::Int(0)),
        },
        Extend { key, token, lease } => match rec_of(w, db, key) {
            Err(()) => same(wrongtype()),
            Ok(Some(r)) if r.phase == Phase::Processing && r.token.as_deref() == Some(token.as_str()) => {
                let mut w2 = w.clone();
                let end = t + lease * 1000;
                let r2 = Rec { lease_end: end, ..r.clone() };
                put_rec(&mut w2, db, key, r2, Some(end + cfg.history_ms));
                vec![(Exp::Int(1), w2)]
            }
            Ok(_) => same(Exp::Err("STALE")),
        },
        Get { key } => match rec_of(w, db, key) {
            Err(()) => same(wrongtype()),
            Ok(None) => same(Exp::Nil),
            Ok(Some(r)) => {
                let live = r.phase == Phase::Processing && t < r.lease_end;
                let state = match r.phase {
                    Phase::Done => "done",
                    Phase::Released => "released",
                    Phase::Processing if live => "processing",
                    Phase::Processing => "expired",
                };
                let expire = w.get(db, key).unwrap().expire;
                same(Exp::Get(Box::new(GetExp {
                    state,
                    attempt: r.attempt,
                    lease_ms: if live { r.lease_end - t } else { 0 },
                    pttl: expire.map_or(-1, |e| e - t),
                    claimed_at: r.claimed_at,
                    done_at: if r.phase == Phase::Done { r.done_at } else { 0 },
                    result: if r.phase == Phase::Done { r.result.clone() } else { None },
                    fingerprint: r.fingerprint.clone(),
                    pttl_slack: (0, 0),
                })))
            }
        },
        Once { key, retain } => match rec_of(w, db, key) {
            Err(()) => same(wrongtype()),
            Ok(Some(_)) => same(Exp::Int(0)),
            Ok(None) => {
                let mut w2 = w.clone();
                let r = Rec {
                    phase: Phase::Done,
                    attempt: 0,
                    lease_end: 0,
                    claimed_at: 0,
                    done_at: t,
                    result: None,
                    fingerprint: None,
                    token: None,
                };
                put_rec(&mut w2, db, key, r, Some(t + retain * 1000));
                vec![(Exp::Int(1), w2)]
            }
        },
        BfReserve { key, rate, capacity, window, shard, expansion } => {
            let create = || {
                let mut f = Filt::new(
                    *rate,
                    *capacity,
                    window.unwrap_or(cfg.bf_window),
                    shard.unwrap_or(DAY),
                    expansion.unwrap_or(2),
                );
                f.shards.insert(f.current_start(t), Shard { items: BTreeSet::new() });
                let mut w2 = w.clone();
                let expire = f.newest_end();
                w2.dbs[db].insert(key.clone(), Entry { val: Val::Filt(f), expire });
                w2
            };
            match w.get(db, key) {
                None => vec![(Exp::Okay, create())],
                // A dead filter is deleted, or still there for a moment.
                Some(Entry { val: Val::Filt(f), .. }) if f.shards.is_empty() => {
                    vec![(Exp::Okay, create()), (Exp::Err("ERR key already exists"), w.clone())]
                }
                Some(_) => same(Exp::Err("ERR key already exists")),
            }
        }
        BfAdd { key, .. } | BfMadd { key, .. } => {
            let items: Vec<String> = match cmd {
                BfAdd { item, .. } => vec![item.clone()],
                BfMadd { items, .. } => items.clone(),
                _ => unreachable!(),
            };
            match filter_add(w, db, key, &items, t, cfg) {
                None => same(wrongtype()),
                Some(worlds) => worlds
                    .into_iter()
                    .map(|(seen, w2)| {
                        let bits: Vec<Exp> = seen.iter().map(|&s| Exp::Bloom { seen: s, add: true }).collect();
                        let exp = if matches!(cmd, BfAdd { .. }) {
                            bits.into_iter().next().unwrap()
                        } else {
                            Exp::Array(bits)
                        };
                        (exp, w2)
                    })
                    .collect(),
            }
        }
        BfExists { key, item } => match fkey(w, db, key) {
            FKey::Other => same(wrongtype()),
            FKey::Missing => same(Exp::Bloom { seen: false, add: false }),
            FKey::Filter(f) => same(Exp::Bloom { seen: f.contains(item), add: false }),
        },
        BfMexists { key, items } => match fkey(w, db, key) {
            FKey::Other => same(wrongtype()),
            FKey::Missing => same(Exp::Array(items.iter().map(|_| Exp::Bloom { seen: false, add: false }).collect())),
            FKey::Filter(f) => {
                same(Exp::Array(items.iter().map(|i| Exp::Bloom { seen: f.contains(i), add: false }).collect()))
            }
        },
        BfInfo { key } => match fkey(w, db, key) {
            FKey::Other => same(wrongtype()),
            FKey::Missing => same(Exp::Nil),
            FKey::Filter(f) => same(Exp::Info(Box::new(InfoExp {
                rate: f.rate(),
                capacity: f.capacity,
                window: f.window,
                shard: f.period,
                expansion: f.expansion,
                shards: f.shards.iter().map(|(&s, sh)| (s, sh.items.len() as i64)).collect(),
            }))),
        },
        Del { key } | Unlink { key } => match w.get(db, key) {
            None => same(Exp::Int(0)),
            Some(_) => {
                let mut w2 = w.clone();
                w2.dbs[db].remove(key);
                vec![(Exp::Int(1), w2)]
            }
        },
        Exists { key } => same(Exp::Int(w.get(db, key).is_some() as i64)),
        Type { key } => same(Exp::Text(w.get(db, key).map_or("none", |e| e.val.type_name()))),
        Pttl { key } => same(Exp::Int(match w.get(db, key) {
            None => -2,
            Some(e) => e.expire.map_or(-1, |x| x - t),
        })),
        Pexpiretime { key } => same(Exp::Int(match w.get(db, key) {
            None => -2,
            Some(e) => e.expire.unwrap_or(-1),
        })),
        Pexpire { key, .. } | Expire { key, .. } => match w.get(db, key) {
            None => same(Exp::Int(0)),
            Some(_) => {
                let ms = match cmd {
                    Expire { secs, .. } => secs * 1000,
                    Pexpire { ms, .. } => *ms,
                    _ => unreachable!(),
                };
                let mut w2 = w.clone();
                let e = w2.dbs[db].get_mut(key).unwrap();
                e.expire = Some(t + ms);
                if let Val::Filt(f) = &mut e.val {
                    f.user_expiry = true;
                }
                vec![(Exp::Int(1), w2)]
            }
        },
        Persist { key } => match w.get(db, key) {
            Some(Entry { expire: Some(_), .. }) => {
                let mut w2 = w.clone();
                let e = w2.dbs[db].get_mut(key).unwrap();
                e.expire = None;
                if let Val::Filt(f) = &mut e.val {
                    f.user_expiry = true;
                }
                vec![(Exp::Int(1), w2)]
            }
            _ => same(Exp::Int(0)),
        },
        Copy { src, dst, replace } => match w.get(db, src) {
            None => same(Exp::Int(0)),
            Some(_) if w.get(db, dst).is_some() && !replace => same(Exp::Int(0)),
            Some(e) => {
                let mut w2 = w.clone();
                w2.dbs[db].insert(dst.clone(), e.clone());
                vec![(Exp::Int(1), w2)]
            }
        },
        Rename { src, dst } => match w.get(db, src) {
            None => same(Exp::Err("ERR no such key")),
            Some(e) => {
                let mut w2 = w.clone();
                let e = e.clone();
                w2.dbs[db].remove(src);
                w2.dbs[db].insert(dst.clone(), e);
                vec![(Exp::Okay, w2)]
            }
        },
        Dump { key, slot } => {
            let mut w2 = w.clone();
            match w.get(db, key) {
                None => {
                    w2.dumps[*slot] = None;
                    vec![(Exp::Nil, w2)]
                }
                Some(e) => {
                    w2.dumps[*slot] = Some(e.val.clone());
                    vec![(Exp::Payload, w2)]
                }
            }
        }
        Restore { key, slot, ttl, replace, absttl } => {
            let Some(val) = w.dumps[*slot].clone() else {
                return same(Exp::Err("<the model holds no value for this payload>"));
            };
            if w.get(db, key).is_some() && !replace {
                return same(Exp::Err("BUSYKEY"));
            }
            let mut w2 = w.clone();
            w2.dbs[db].remove(key);
            let when = if *ttl == 0 {
                None
            } else if *absttl {
                Some(*ttl)
            } else {
                Some(t + ttl)
            };
            // Redis does not create a key whose expiry has already come.
            if when.is_none_or(|e| e > t) {
                let mut val = val;
                if let Val::Filt(f) = &mut val {
                    f.user_expiry = true;
                }
                w2.dbs[db].insert(key.clone(), Entry { val, expire: when });
                w2.purge(t);
            }
            vec![(Exp::Okay, w2)]
        }
        Move { key } => {
            // Runs on db 0; the caller resolves `variants` of db 1 too.
            match w.get(0, key) {
                None => same(Exp::Int(0)),
                Some(_) if w.get(1, key).is_some() => same(Exp::Int(0)),
                Some(e) => {
                    let mut w2 = w.clone();
                    let e = e.clone();
                    w2.dbs[0].remove(key);
                    w2.dbs[1].insert(key.clone(), e);
                    vec![(Exp::Int(1), w2)]
                }
            }
        }
        Swapdb => {
            let mut w2 = w.clone();
            w2.dbs.swap(0, 1);
            vec![(Exp::Okay, w2)]
        }
        DebugReload => same(Exp::Okay),
        SetStr { key, px } => {
            let mut w2 = w.clone();
            w2.dbs[db].insert(key.clone(), Entry { val: Val::Str(b"plain".to_vec()), expire: Some(t + px) });
            vec![(Exp::Okay, w2)]
        }
    }
}
