//! Redis Streams consumers on the loop (feature `streams`): a consumer of a
//! stream's group that runs each entry's work once per key
//! (docs/clients.md, "Consumers of brokers"), sync ([`StreamConsumer`] on an
//! [`Idem`](crate::Idem)) and tokio ([`AsyncStreamConsumer`] on an
//! [`AsyncIdem`](crate::AsyncIdem)).
//!
//! - New entries come with `XREADGROUP`; entries a consumer left pending
//!   (it died, stalled, or gave them back) come again with `XAUTOCLAIM`
//!   once idle past `claim_idle` (the Idem's lease by default). While an
//!   entry's work runs, each heartbeat `EXTEND` carries an `XCLAIM ...
//!   JUSTID` of it, so that it never looks idle to the others.
//! - The key is a field of the entry (`idem-key` by default), never its id;
//!   an entry without one is dead-lettered ([`Error::MissingKey`]).
//! - `DONE` and `XACK` go in one round trip, pipelined on one connection
//!   (`XACK` behind `DONE`, before a durable `WAIT`). When `DONE` did not
//!   complete the record (the lease was lost, its reply never came), the
//!   entry is put back in the group's pending list (`XCLAIM ... FORCE`): it
//!   is never left acknowledged unless done.
//! - `Busy` and failures stay pending, their idle time set (`XCLAIM ...
//!   IDLE`) so that `XAUTOCLAIM` hands them out again after the holder's
//!   lease left, or after the retry delay: never acknowledged, never spun on.
//! - `Exhausted` (`max_tries`), `Mismatch` and `MissingKey`: `XADD` to the
//!   dead-letter stream (`<stream>:dlq`: the entry's fields, then
//!   `original-stream`, `original-id`, `error`) and `XACK`, in one `MULTI`.
//! - Nothing here trims a stream: the README's "Trimming" says how to.
use crate::options::Stats;
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "tokio")]
mod aio;
mod core;
mod sync;

#[cfg(feature = "tokio")]
pub use aio::AsyncStreamConsumer;
pub use sync::StreamConsumer;

/// The field where the default key function finds an entry's key.
pub const KEY_FIELD: &str = "idem-key";

/// An entry's fields, names and values.
type Fields = Vec<(Vec<u8>, Vec<u8>)>;

/// One entry of the stream, as the work gets it: its id and its fields, in
/// the stream's order, as bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamEntry {
    stream: String,
    id: String,
    fields: Fields,
}

impl StreamEntry {
    /// An entry of `stream` (for a test of your work, or an entry read
    /// yourself).
    pub fn new(stream: impl Into<String>, id: impl Into<String>, fields: Vec<(Vec<u8>, Vec<u8>)>) -> Self {
        StreamEntry { stream: stream.into(), id: id.into(), fields }
    }
    pub fn stream(&self) -> &str {
        &self.stream
    }
    /// The entry's id in the stream (a producer's retry gets another one:
    /// never the key).
    pub fn id(&self) -> &str {
        &self.id
    }
    /// Its fields, names and values, in order.
    pub fn fields(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.fields.iter().map(|(name, value)| (name.as_slice(), value.as_slice()))
    }
    /// The first field named `name`.
    pub fn field(&self, name: &str) -> Option<&[u8]> {
        self.fields.iter().find(|(n, _)| n == name.as_bytes()).map(|(_, value)| value.as_slice())
    }
    /// [`field`](Self::field) as text (`None` when it is not UTF-8).
    pub fn field_str(&self, name: &str) -> Option<&str> {
        self.field(name).and_then(|value| std::str::from_utf8(value).ok())
    }
}

/// The key of an entry: `None` (or an empty key) is [`Error::MissingKey`](crate::Error::MissingKey).
pub type KeyFn = Arc<dyn Fn(&StreamEntry) -> Option<String> + Send + Sync>;
/// The payload an entry is claimed with (`MISMATCH` for another payload).
pub type PayloadFn = Arc<dyn Fn(&StreamEntry) -> Option<Vec<u8>> + Send + Sync>;

/// A consumer's settings, builder style; checked when the consumer is made.
#[derive(Clone)]
pub struct StreamOptions {
    pub(crate) consumer: Option<String>,
    pub(crate) key: Option<KeyFn>,
    pub(crate) key_field: String,
    pub(crate) payload: Option<PayloadFn>,
    pub(crate) dead_letter: Option<String>,
    pub(crate) claim_idle: Option<Duration>,
    pub(crate) block: Duration,
    pub(crate) retry_delay: Duration,
    pub(crate) max_retry_delay: Duration,
    pub(crate) create_group: bool,
    pub(crate) concurrency: usize,
}

impl Default for StreamOptions {
    fn default() -> Self {
        StreamOptions {
            consumer: None,
            key: None,
            key_field: KEY_FIELD.into(),
            payload: None,
            dead_letter: None,
            claim_idle: None,
            block: Duration::from_secs(1),
            retry_delay: Duration::from_millis(100),
            max_retry_delay: Duration::from_secs(30),
            create_group: true,
            concurrency: 1,
        }
    }
}

impl StreamOptions {
    pub fn new() -> Self {
        Self::default()
    }
    /// This consumer's name in the group: default the Idem's owner
    /// (`host:pid`, or [`Options::owner`](crate::Options::owner)).
    pub fn consumer(mut self, name: impl Into<String>) -> Self {
        self.consumer = Some(name.into());
        self
    }
    /// The field holding the key (default [`KEY_FIELD`], `idem-key`).
    pub fn key_field(mut self, name: impl Into<String>) -> Self {
        self.key_field = name.into();
        self
    }
    /// The key as a function of the entry (in place of a field).
    pub fn key(mut self, key: impl Fn(&StreamEntry) -> Option<String> + Send + Sync + 'static) -> Self {
        self.key = Some(Arc::new(key));
        self
    }
    /// Claims with this payload: the key seen again with another payload is
    /// dead-lettered ([`Error::Mismatch`](crate::Error::Mismatch)).
    pub fn payload(mut self, payload: impl Fn(&StreamEntry) -> Option<Vec<u8>> + Send + Sync + 'static) -> Self {
        self.payload = Some(Arc::new(payload));
        self
    }
    /// The dead-letter stream (default `<stream>:dlq`; in a cluster give
    /// both one hash tag, `{orders}`, for one `MULTI`).
    pub fn dead_letter(mut self, stream: impl Into<String>) -> Self {
        self.dead_letter = Some(stream.into());
        self
    }
    /// How long an entry stays pending before `XAUTOCLAIM` takes it over:
    /// default, and at least, the Idem's lease.
    pub fn claim_idle(mut self, idle: Duration) -> Self {
        self.claim_idle = Some(idle);
        self
    }
    /// How long `XREADGROUP` waits for new entries (1 s; at most the Idem's
    /// `done_timeout`); also the longest between two `XAUTOCLAIM` rounds.
    pub fn block(mut self, block: Duration) -> Self {
        self.block = block;
        self
    }
    /// A failed entry comes again after `first`, doubling with each attempt
    /// up to `max` (100 ms, 30 s), and never later than `claim_idle`.
    pub fn retry_delay(mut self, first: Duration, max: Duration) -> Self {
        self.retry_delay = first;
        self.max_retry_delay = max;
        self
    }
    /// `XGROUP CREATE <stream> <group> 0 MKSTREAM` when the group is missing
    /// (default true): a new group reads the stream from its start.
    pub fn create_group(mut self, create: bool) -> Self {
        self.create_group = create;
        self
    }
    /// [`AsyncStreamConsumer`]: how many entries are at work at once (1).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }
}

impl std::fmt::Debug for StreamOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamOptions")
            .field("consumer", &self.consumer)
            .field("key", &self.key.as_ref().map_or(self.key_field.as_str(), |_| "a function"))
            .field("payload", &self.payload.is_some())
            .field("dead_letter", &self.dead_letter)
            .field("claim_idle", &self.claim_idle)
            .field("block", &self.block)
            .field("retry_delay", &(self.retry_delay, self.max_retry_delay))
            .field("create_group", &self.create_group)
            .field("concurrency", &self.concurrency)
            .finish()
    }
}

/// What the consumer did with an entry.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Action {
    /// Its record is done (its work ran and `DONE` was confirmed, or a
    /// replay): acknowledged (`XACK`).
    Acknowledged { replayed: bool },
    /// Left pending, to come again after `delay` (`Busy`: the holder's
    /// lease left; a failure: the retry delay; `LeaseLost`,
    /// `DoneUnconfirmed`, `NotDurable`: the first retry delay).
    HeldBack { delay: Duration },
    /// Added to the dead-letter stream and acknowledged.
    DeadLettered,
    /// Not settled: the acknowledgement, give-back or dead letter failed
    /// (a lost connection). It is pending still: it comes again after
    /// `claim_idle`.
    Left,
}

/// One entry's end: its id, its key (`None` when it had none), what was
/// done with it, and why when it was not acknowledged as done (the error's
/// text).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settled {
    pub id: String,
    pub key: Option<String>,
    pub action: Action,
    pub error: Option<String>,
}

/// A consumer's counters, and its Idem's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamStats {
    /// The Idem's counters (shared by everything that uses it).
    pub idem: Stats,
    /// Entries acknowledged as done (first runs and replays).
    pub acknowledged: u64,
    /// Entries given back to come again (Busy, failures, and the outcomes
    /// that are not acknowledged).
    pub held_back: u64,
    /// Entries moved to the dead-letter stream and acknowledged.
    pub dead_lettered: u64,
    /// Pending entries `XAUTOCLAIM` found deleted from the stream: trimmed
    /// before anyone acknowledged them, never processed (see "Trimming").
    pub trimmed_pending: u64,
}
