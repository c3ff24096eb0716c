//! A client for redis-idem (idempotent message consumption in Redis) on
//! redis-rs: the consumer loop as one call, sync ([`Idem::process`]) and
//! tokio ([`AsyncIdem::process`]), its batch form ([`Idem::process_many`]),
//! on one server, under Sentinel or on a cluster, on the module or the Functions edition; the
//! commands as typed methods on any connection ([`IdemCommands`],
//! [`AsyncIdemCommands`]) and their replies as types.
//!
//! See the README for the loop's guarantees and choices.
#![warn(missing_debug_implementations)]

/// The redis-rs this crate is built on, for code that needs the same
/// version of its types (`redis_idem_client::redis::Client`).
pub use redis;

#[cfg(feature = "tokio")]
mod batch;
mod cmd;
mod codec;
mod commands;
mod error;
mod flow;
mod heartbeat;
mod many;
mod options;
mod plan;
mod reply;
mod ride;
mod scan;
mod source;
#[cfg(feature = "streams")]
pub mod streams;
mod sync;
#[cfg(feature = "tokio")]
mod tokio_client;

pub use cmd::{ClaimOptions, DoneOptions, Edition, MAX_BATCH};
#[cfg(feature = "json")]
pub use codec::JsonCodec;
pub use codec::{BytesCodec, Codec, DefaultCodec};
#[cfg(feature = "tokio")]
pub use commands::AsyncIdemCommands;
pub use commands::IdemCommands;
pub use error::{BoxError, DurableStage, Error, KeyError, ProcessError};
pub use many::{BatchItem, BatchStatus};
pub use options::{
    DropReason, Durable, Event, Hook, Job, Options, Outcome, Oversize, ProcessOptions, ReleaseReason, Stats,
};
pub use plan::{DoneItem, ReleaseItem};
pub use reply::{Claim, Done, Granted, Record, RecordState};
#[cfg(feature = "tokio")]
pub use scan::AsyncScan;
pub use scan::{Scan, ScanOptions};
#[cfg(feature = "tokio")]
pub use source::AsyncConnectionSource;
pub use source::ConnectionSource;
pub use sync::Idem;
#[cfg(feature = "tokio")]
pub use tokio_client::AsyncIdem;

/// The README's examples compile (`cargo test --doc`).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExamples;
