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

pub mod command;
pub mod expect;
pub mod semantics;
pub mod state;

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
