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
//! - `model`: what the commands answer, for tests/stateful.rs.
//!
//! Each test binary compiles this directory on its own and uses part of
//! it: every `mod common;` carries `#[allow(dead_code)]` for that reason.

pub use redis::{RedisError, RedisResult, Value};

pub mod cluster;
pub mod model;
pub mod rng;

mod clock;
mod commands;
mod dump;
mod fixtures;
mod functions;
mod reply;
mod server;

// Re-exported for `use common::*`; a test binary may use none of a module.
#[allow(unused_imports)]
pub use clock::*;
#[allow(unused_imports)]
pub use commands::*;
#[allow(unused_imports)]
pub use dump::*;
#[allow(unused_imports)]
pub use fixtures::*;
#[allow(unused_imports)]
pub use functions::*;
#[allow(unused_imports)]
pub use reply::*;
#[allow(unused_imports)]
pub use server::*;

/// Default `idem.history` and `idem.retain`, in ms (docs/commands.md,
/// "Configuration").
pub const HISTORY_MS: i64 = 3_600_000;
pub const RETAIN_MS: i64 = 86_400_000;
