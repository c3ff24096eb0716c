//! The model's state: records, filters and other keys, each with its expiry.

use crate::common::model::PENDING;
use crate::common::model::command::show_arg;
use std::collections::{BTreeMap, BTreeSet};

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
    /// The latest claim's token (None for records made by ONCE or a late
    /// DONE, and once requeued).
    pub token: Option<String>,
    /// The attempt at the latest IDEM.REQUEUE (0 if never): MAXTRIES
    /// counts the claims since.
    pub tries_base: i64,
    /// The latest granted claim's OWNER, until DONE or REQUEUE.
    pub owner: Option<Vec<u8>>,
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

    pub(super) fn new(rate: f64, capacity: i64, window: i64, period: i64, expansion: i64) -> Filt {
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

    pub(super) fn purge(&mut self, t: i64) {
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
