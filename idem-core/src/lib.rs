//! The pure core of redis-idem: everything that decides, with no Redis in
//! it (this crate does not depend on `redis-module`, so the compiler checks
//! that). The module crate opens keys, calls in here with the clock, and
//! applies what comes back.
//!
//! - [`record`]: the record state machine, its command arguments, and
//!   [`record::codec`], its stored and replicated encodings.
//! - [`bloom`]: the date-sharded Bloom filter, its arguments, and
//!   [`bloom::codec`], its stored and replicated encodings.
//! - [`args`]: argument parsing shared by the commands, over [`args::ArgList`].
//! - [`decode`] and [`error`]: strict payload reading, error replies.

#![forbid(unsafe_code)]

pub mod args;
pub mod bloom;
pub mod decode;
pub mod error;
pub mod record;

/// Unix time or a duration, in milliseconds (Redis's `mstime_t`).
pub type Millis = i64;
