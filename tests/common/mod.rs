//! Test harness shared by the integration tests: real `redis-server`s with
//! the module loaded, and helpers to call the module's commands.
//!
//! Every test starts its own server(s) on a free port, in its own directory
//! under `target/test-servers/`. The module is loaded from
//! `target/release/libredis_idem.so` (build it with `cargo build --release`
//! first; `make test` does), or from `$REDIS_IDEM_MODULE` when set.
//! `$REDIS_SERVER` overrides the server binary (default `redis-server`).
//!
//! - `server`: starting and stopping servers, ports, the module's path,
//!   replicas, AOF rewrites, `INFO`;
//! - `reply`: error texts and reply shapes, parsed and checked;
//! - `commands`: the module's commands as functions;
//! - `clock`: the server's clock, shard boundaries, timed pipelines;
//! - `fixtures`: records and filters in every state, snapshots of keys;
//! - `functions`: the Functions edition (functions/idem.lua) loaded and called;
//! - `dump`: DUMP payloads: CRC64, re-framing, crafted filter blobs;
//! - `cluster`: a real Redis Cluster, MIGRATE, a claiming load;
//! - `model`: what the commands answer, for tests/stateful.rs;
//! - `rng`: the seeded generator of the stateful and differential runs.
//!
//! Tests import each helper by its module path (`use common::server::Server`),
//! so a reader sees where it lives.
//!
//! Each test binary compiles this directory on its own and uses part of
//! it: every `mod common;` carries `#[allow(dead_code)]` for that reason.

pub mod clock;
pub mod cluster;
pub mod commands;
pub mod dump;
pub mod fixtures;
pub mod functions;
pub mod model;
pub mod reply;
pub mod rng;
pub mod server;
pub mod waiters;

/// Default `idem.history` and `idem.retain`, in ms (docs/commands.md,
/// "Configuration").
pub const HISTORY_MS: i64 = 3_600_000;
pub const RETAIN_MS: i64 = 86_400_000;
