//! A client for redis-idem (idempotent message consumption in Redis) on
//! redis-rs: the module's commands as typed methods on any connection
//! ([`IdemCommands`], [`AsyncIdemCommands`]), their replies as types
//! ([`Claim`], [`Done`], [`Record`]), and the consumer loop as one call,
//! sync ([`Idem::process`]) and tokio ([`AsyncIdem::process`]), on one
//! server or a cluster, on the module or the Functions edition.
//!
//! See the README for the loop's guarantees and choices.
#![warn(missing_debug_implementations)]

/// The redis-rs this crate is built on, for code that needs the same
/// version of its types (`redis_idem_client::redis::Client`).
pub use redis;

pub mod cmd;
mod codec;
mod commands;
mod error;
mod flow;
mod options;
mod reply;
mod source;
mod sync;
#[cfg(feature = "tokio")]
mod tokio_client;

pub use cmd::{ClaimOptions, DoneOptions, Edition, MAX_BATCH};
#[cfg(feature = "json")]
pub use codec::JsonCodec;
pub use codec::{BytesCodec, Codec, DefaultCodec};
#[cfg(feature = "tokio")]
pub use commands::{AsyncIdemCommands, detect_edition_async};
pub use commands::{IdemCommands, detect_edition};
pub use error::{BoxError, Error, ProcessError};
pub use options::{Attempt, Event, Hook, Options, Outcome, OversizePolicy, ProcessOptions, Stats};
pub use reply::{Claim, Done, Granted, Record, RecordState};
#[cfg(feature = "tokio")]
pub use source::AsyncConnectionSource;
pub use source::ConnectionSource;
pub use sync::{BatchOutcomes, Idem};
#[cfg(feature = "tokio")]
pub use tokio_client::AsyncIdem;

/// The README's examples compile (`cargo test --doc`).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExamples;
