//! What an [`Idem`](crate::Idem) instance is configured with, the job a
//! work is given, what the consumer loop reports, and its counters.
use crate::cmd::Edition;
use crate::error::Error;
use crate::reply::Granted;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// What to do with a result larger than the server keeps
/// (`idem.max-result`, default 1 MiB, or [`Options::max_result`]). Both
/// complete the record, so the work is never done again: only the replay
/// loses the result.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Oversize {
    /// Complete the record without its result: the call returns the value
    /// with `result_stored: false`; later claims replay `None`.
    #[default]
    Complete,
    /// Complete the record without its result, then return
    /// [`Error::ResultNotStored`] (in [`ProcessError::Completed`](crate::ProcessError::Completed), with the value).
    Error,
}

/// Why a completion was recorded without its result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// Larger than the server keeps.
    Oversize,
    /// The codec could not encode it.
    Unserializable,
    /// The server dropped it under `maxmemory` (`DONE` answered 3 or 7).
    Memory,
}

/// Why a claim was given back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseReason {
    /// The work returned an error.
    Work,
    /// The work panicked (the panic is resumed after the release).
    Panic,
    /// The run hook panicked.
    Hook,
}

/// Something the consumer loop did, for the one hook ([`Options::on_event`]).
#[derive(Debug)]
#[non_exhaustive]
pub enum Event<'a> {
    /// A claim was granted; the work runs next. A panic here releases the
    /// claim and fails the call with [`Error::Hook`].
    Run { job: &'a Job },
    /// The key was done: its stored result is replayed, the work does not run.
    Replay { key: &'a str, attempt: u64 },
    /// Another worker holds the key: this call waits (once per call).
    Busy { key: &'a str, lease_left: Duration },
    /// This worker's completion was recorded. A panic here leaves the
    /// record done and fails the call with [`Error::Hook`], carrying the value.
    Done { job: &'a Job, result_stored: bool },
    /// The claim was given back.
    Release { job: &'a Job, reason: ReleaseReason },
    /// The lease was found lost (by the heartbeat or by `DONE`), once per job.
    LeaseLost { job: &'a Job },
    /// The completion was recorded without its result.
    ResultDropped { job: &'a Job, reason: DropReason },
}

/// The hook called with every [`Event`].
pub type Hook = Arc<dyn Fn(&Event<'_>) + Send + Sync>;

/// The configuration of an [`Idem`](crate::Idem) or
/// [`AsyncIdem`](crate::AsyncIdem), builder style; checked when the
/// instance is made.
#[derive(Clone)]
pub struct Options {
    pub(crate) prefix: String,
    pub(crate) lease: Duration,
    pub(crate) heartbeat: Option<Duration>,
    pub(crate) wait: Duration,
    pub(crate) retain: Option<Duration>,
    pub(crate) max_tries: Option<u32>,
    pub(crate) bloom: Option<String>,
    pub(crate) max_result: Option<usize>,
    pub(crate) oversize: Oversize,
    pub(crate) done_retries: u32,
    pub(crate) done_timeout: Duration,
    pub(crate) edition: Option<Edition>,
    pub(crate) hook: Option<Hook>,
    pub(crate) owner: Option<String>,
    pub(crate) durable: Option<Durable>,
    pub(crate) batch: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            prefix: String::new(),
            lease: Duration::from_secs(30),
            heartbeat: None,
            wait: Duration::from_secs(10),
            retain: None,
            max_tries: None,
            bloom: None,
            max_result: None,
            oversize: Oversize::default(),
            done_retries: 5,
            done_timeout: Duration::from_secs(5),
            edition: None,
            hook: None,
            owner: None,
            durable: None,
            batch: true,
        }
    }
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("prefix", &self.prefix)
            .field("lease", &self.lease)
            .field("heartbeat", &self.heartbeat_interval())
            .field("wait", &self.wait)
            .field("retain", &self.retain)
            .field("max_tries", &self.max_tries)
            .field("bloom", &self.bloom)
            .field("max_result", &self.max_result)
            .field("oversize", &self.oversize)
            .field("done_retries", &self.done_retries)
            .field("done_timeout", &self.done_timeout)
            .field("edition", &self.edition)
            .field("hook", &self.hook.is_some())
            .field("owner", &self.owner)
            .field("durable", &self.durable)
            .field("batch", &self.batch)
            .finish()
    }
}

impl Options {
    pub fn new() -> Options {
        Options::default()
    }
    /// Put before every key (a tenant, a service): `"tenant-a:"` makes
    /// `order:1` the record `tenant-a:order:1`. In a cluster, a hash tag
    /// in the key still decides its slot.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }
    /// How long a claim is held between heartbeats (whole seconds, at
    /// least 1; default 30 s).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }
    /// Time between `IDEM.EXTEND`s while the work runs (default a third of
    /// the lease; zero: no heartbeat).
    pub fn heartbeat(mut self, every: Duration) -> Self {
        self.heartbeat = Some(every);
        self
    }
    /// How long a duplicate waits for the copy in flight before
    /// [`Error::Busy`] (default 10 s; zero: do not wait).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }
    /// How long a done record is kept (`RETAIN`, whole seconds; else the
    /// server's `idem.retain`).
    pub fn retain(mut self, retain: Duration) -> Self {
        self.retain = Some(retain);
        self
    }
    /// `MAXTRIES`: after this many tries a claim is [`Error::Exhausted`].
    pub fn max_tries(mut self, n: u32) -> Self {
        self.max_tries = Some(n);
        self
    }
    /// A date-sharded Bloom filter remembering completed keys beyond their
    /// records' retention (module only).
    pub fn bloom(mut self, filter_key: impl Into<String>) -> Self {
        self.bloom = Some(filter_key.into());
        self
    }
    /// Results larger than this many bytes are not sent at all ([`Oversize`]
    /// applies). Without it the server's `idem.max-result` decides.
    pub fn max_result(mut self, bytes: usize) -> Self {
        self.max_result = Some(bytes);
        self
    }
    /// The policy for a result too large to keep (default [`Oversize::Complete`]).
    pub fn oversize(mut self, policy: Oversize) -> Self {
        self.oversize = policy;
        self
    }
    /// How often `IDEM.DONE` is sent again after a connection error
    /// (default 5; 50 ms doubling between them).
    pub fn done_retries(mut self, n: u32) -> Self {
        self.done_retries = n;
        self
    }
    /// How long one `DONE` (with its `WAIT` under [`durable`](Self::durable))
    /// or the `RELEASE` of a failed work may take before it counts as lost
    /// (default 5 s). Also the reply timeout of every command that does not
    /// block.
    pub fn done_timeout(mut self, timeout: Duration) -> Self {
        self.done_timeout = timeout;
        self
    }
    /// `OWNER` sent with every claim, shown by `IDEM.GET` and carried by
    /// [`Error::Busy`] (1 to 64 bytes; default `host:pid`, the host name as
    /// `gethostname(2)` gives it and this process's id).
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }
    /// Durability (off by default): every claim that grants work and every
    /// `DONE` is followed by `WAIT` (or `WAITAOF`) on the same connection in
    /// the same round trip; see [`Durable`].
    pub fn durable(mut self, durable: Durable) -> Self {
        self.durable = Some(durable);
        self
    }
    /// Concurrent [`AsyncIdem`](crate::AsyncIdem) calls share one batch
    /// command per tick (default on): while the loop's claim or `DONE` is
    /// in flight, those that arrive queue and go as one `IDEM.MCLAIM` /
    /// `IDEM.MDONE` (per slot in a cluster; pipelined singles on the
    /// Functions edition). A call alone sends its own command at once.
    /// Off while [`durable`](Self::durable) is on; the sync
    /// [`Idem`](crate::Idem)'s threads each send their own commands.
    pub fn batch(mut self, on: bool) -> Self {
        self.batch = on;
        self
    }
    /// Skip asking the server which edition it has.
    pub fn edition(mut self, edition: Edition) -> Self {
        self.edition = Some(edition);
        self
    }
    /// The hook, called with every [`Event`].
    pub fn on_event(mut self, hook: impl Fn(&Event<'_>) + Send + Sync + 'static) -> Self {
        self.hook = Some(Arc::new(hook));
        self
    }

    /// Zero when there is no heartbeat.
    pub(crate) fn heartbeat_interval(&self) -> Duration {
        self.heartbeat.unwrap_or(self.lease / 3)
    }

    /// The durations the server takes in whole seconds, refused otherwise.
    pub(crate) fn check(&self) -> Result<(), Error> {
        crate::cmd::whole_seconds("lease", self.lease)?;
        if let Some(retain) = self.retain {
            crate::cmd::whole_seconds("retain", retain)?;
        }
        if self.max_tries == Some(0) {
            return Err(Error::InvalidArgument("max_tries must be at least 1".into()));
        }
        if let Some(owner) = &self.owner
            && (owner.is_empty() || owner.len() > 64)
        {
            return Err(Error::InvalidArgument(format!("owner must be 1 to 64 bytes, not {} bytes", owner.len())));
        }
        if self.done_timeout.is_zero() {
            return Err(Error::InvalidArgument("done_timeout must be more than zero".into()));
        }
        Ok(())
    }
}

/// Durability ([`Options::durable`]): each write of the loop is followed,
/// on the same connection and in the same round trip, by `WAIT replicas
/// timeout` (or, with `fsync`, `WAITAOF 1 replicas timeout`: Redis 7.2+,
/// Valkey 8+, the primary's `appendonly yes`). A claim not acknowledged by
/// `replicas` in time is released and the call fails with
/// [`Error::NotDurable`] before the work runs; a `DONE` not acknowledged
/// returns the value with [`Error::NotDurable`] (do not acknowledge the
/// message).
///
/// ```
/// use redis_idem_client::Durable;
/// use std::time::Duration;
/// let durable = Durable::replicas(1).timeout(Duration::from_millis(500)).fsync(false);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Durable {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
    pub(crate) fsync: bool,
}

impl Durable {
    /// Wait for `n` replicas (default timeout 1 s, no fsync).
    pub fn replicas(n: u32) -> Durable {
        Durable { replicas: n, timeout: Duration::from_secs(1), fsync: false }
    }
    /// How long one `WAIT` / `WAITAOF` may block (whole milliseconds).
    pub fn timeout(mut self, timeout: Duration) -> Durable {
        self.timeout = timeout;
        self
    }
    /// `WAITAOF`: the write fsynced to the primary's AOF and to `replicas`
    /// replicas' (a server that refuses `WAITAOF` makes every call end
    /// `NotDurable` before any work ran).
    pub fn fsync(mut self, fsync: bool) -> Durable {
        self.fsync = fsync;
        self
    }
}

/// Counters of the consumer loop, since the instance was made
/// (docs/clients.md's table).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Claims granted `NEW`: the work was given its first try.
    pub first_runs: u64,
    /// Claims granted `RETRY` or `SEEN`.
    pub retries: u64,
    /// Calls answered with a stored completion, after a wait too.
    pub replays: u64,
    /// Calls that met a busy key and waited: once per call.
    pub waits: u64,
    /// Calls (or batch keys) that ended [`Error::Busy`].
    pub busy: u64,
    /// This worker's completions recorded by `DONE`.
    pub completed: u64,
    /// Claims given back after a failed work or hook.
    pub released: u64,
    /// Leases found lost (by a heartbeat or by `DONE`), once per job.
    pub leases_lost: u64,
    /// Completions recorded without their result.
    pub results_dropped: u64,
    /// [`Error::Mismatch`] answers.
    pub mismatches: u64,
    /// [`Error::Exhausted`] answers.
    pub exhausted: u64,
    /// Heartbeat extensions that succeeded.
    pub extends: u64,
    /// Calls (or batch keys) that ended [`Error::NotDurable`] (not counted
    /// as `first_runs` / `retries` when it was the claim).
    pub not_durable: u64,
}

macro_rules! counters {
    ($($name:ident),*) => {
        #[derive(Default)]
        pub(crate) struct Counters { $(pub $name: AtomicU64,)* }
        impl Counters {
            pub fn snapshot(&self) -> Stats {
                Stats { $($name: self.$name.load(Ordering::Relaxed),)* }
            }
        }
    };
}
counters!(
    first_runs,
    retries,
    replays,
    waits,
    busy,
    completed,
    released,
    leases_lost,
    results_dropped,
    mismatches,
    exhausted,
    extends,
    not_durable
);

pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// One claimed key, given to the work.
#[derive(Clone, Debug)]
pub struct Job {
    /// The key as the caller gave it.
    pub(crate) key: String,
    /// The record's key: the instance's prefix and the caller's key.
    pub(crate) record: String,
    pub(crate) attempt: u64,
    pub(crate) status: Granted,
    pub(crate) lost: Arc<AtomicBool>,
}

impl Job {
    /// The fencing number: 1 on the first claim of a key, +1 with each
    /// claim. A downstream store can refuse writes with a lower number than
    /// it has seen, so a worker whose lease lapsed cannot overwrite its
    /// successor's effects.
    pub fn attempt(&self) -> u64 {
        self.attempt
    }
    /// How the claim was granted: `Retry` when an earlier attempt failed or
    /// crashed (it may have partly run), `Seen` when the Bloom filter
    /// thinks the key completed before (verify before applying effects).
    pub fn status(&self) -> Granted {
        self.status
    }
    /// True once the lease was found lost while the work ran: its result
    /// will be refused; long work may stop early.
    pub fn lost(&self) -> bool {
        self.lost.load(Ordering::Relaxed)
    }
    /// The key as the caller gave it, without the instance's prefix.
    pub fn key(&self) -> &str {
        &self.key
    }
}

/// What [`Idem::process`](crate::Idem::process) did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome<T> {
    /// The work ran under this claim and its completion was recorded: the
    /// work's own value.
    Completed {
        value: T,
        attempt: u64,
        status: Granted,
        /// False when the result was not kept (too large, or the server's
        /// memory was full): a replay of this key gets `None`.
        result_stored: bool,
    },
    /// The key was done already: the codec's decoding of the stored result
    /// (`None` when none was kept). The work did not run.
    Replayed { value: Option<T>, attempt: u64 },
}

impl<T> Outcome<T> {
    /// The result, whether fresh or replayed.
    pub fn value(&self) -> Option<&T> {
        match self {
            Outcome::Completed { value, .. } => Some(value),
            Outcome::Replayed { value, .. } => value.as_ref(),
        }
    }
    pub fn into_value(self) -> Option<T> {
        match self {
            Outcome::Completed { value, .. } => Some(value),
            Outcome::Replayed { value, .. } => value,
        }
    }
    pub fn is_replay(&self) -> bool {
        matches!(self, Outcome::Replayed { .. })
    }
    pub fn attempt(&self) -> u64 {
        match self {
            Outcome::Completed { attempt, .. } | Outcome::Replayed { attempt, .. } => *attempt,
        }
    }
}

/// Per-call options of the consumer loop.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessOptions {
    /// The message's content: a later delivery of the key with other
    /// content is [`Error::Mismatch`].
    pub payload: Option<Vec<u8>>,
}

impl ProcessOptions {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn payload(mut self, payload: impl Into<Vec<u8>>) -> Self {
        self.payload = Some(payload.into());
        self
    }
}
