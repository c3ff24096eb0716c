//! What an [`Idem`](crate::Idem) instance is configured with, what the
//! consumer loop reports, and the counters that tell a replay from a first
//! run.
use crate::cmd::Edition;
use crate::reply::{Done, Granted};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// What to do with a result larger than the server keeps
/// (`idem.max-result`, default 1 MiB, or [`Options::max_result`]). Both
/// complete the record, so the work is never done again: only the replay
/// loses the result.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OversizePolicy {
    /// Complete the record without its result: the call returns the value
    /// with `result_stored: false`, later claims replay `None`.
    #[default]
    CompleteWithoutResult,
    /// Complete the record without its result, and return
    /// [`Error::ResultTooLarge`](crate::Error::ResultTooLarge).
    CompleteAndError,
}

/// Something the consumer loop did, for a hook (metrics, logs).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event<'a> {
    /// A claim was granted: the work runs (a first run when `Granted::New`).
    Claimed { key: &'a str, granted: Granted, attempt: u64 },
    /// The key was already done: its stored result is replayed, the work
    /// does not run.
    Replayed { key: &'a str, attempt: u64 },
    /// Another worker holds the key: this call waits for it.
    Waiting { key: &'a str, lease_left: Duration },
    /// The work's result was recorded.
    Completed { key: &'a str, attempt: u64, done: Done },
    /// The work failed and its claim was given back.
    Released { key: &'a str, attempt: u64 },
    /// The result was too large to keep: the record was completed without it.
    ResultOmitted { key: &'a str, size: usize },
    /// The claim was taken over by another worker.
    LeaseLost { key: &'a str, attempt: u64 },
}

/// A hook called with every [`Event`].
pub type Hook = Arc<dyn Fn(&Event<'_>) + Send + Sync>;

/// The configuration of an [`Idem`](crate::Idem) or
/// [`AsyncIdem`](crate::AsyncIdem), builder style.
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
    pub(crate) oversize: OversizePolicy,
    pub(crate) edition: Option<Edition>,
    pub(crate) hook: Option<Hook>,
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
            oversize: OversizePolicy::default(),
            edition: None,
            hook: None,
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
            .field("edition", &self.edition)
            .field("hook", &self.hook.is_some())
            .finish()
    }
}

impl Options {
    pub fn new() -> Options {
        Options::default()
    }
    /// Put before every key (a tenant, a service): `"tenant-a:"` makes
    /// `order:1` the record `tenant-a:order:1`, so two tenants never
    /// replay each other's results. In a cluster, a hash tag in the key
    /// still decides its slot.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }
    /// How long a claim is held without a heartbeat (whole seconds, rounded
    /// up; default 30 s). The heartbeat renews it while the work runs, so
    /// it bounds how soon a crashed worker's key is retried.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }
    /// How often the heartbeat sends EXTEND (default: a third of the lease).
    pub fn heartbeat(mut self, every: Duration) -> Self {
        self.heartbeat = Some(every);
        self
    }
    /// How long a copy that finds the key BUSY waits for the holder's
    /// result before [`Error::Busy`](crate::Error::Busy) (default 10 s;
    /// zero: do not wait). WAIT on the module, polling with backoff on the
    /// Functions edition.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }
    /// How long a done record is kept (`RETAIN`; else the server's
    /// `idem.retain`, one day by default).
    pub fn retain(mut self, retain: Duration) -> Self {
        self.retain = Some(retain);
        self
    }
    /// After this many attempts a key is [`Error::Exhausted`](crate::Error::Exhausted).
    pub fn max_tries(mut self, n: u32) -> Self {
        self.max_tries = Some(n);
        self
    }
    /// A date-sharded Bloom filter remembering completed keys beyond their
    /// records' retention (module only; in a cluster it must share the
    /// records' slot).
    pub fn bloom(mut self, filter_key: impl Into<String>) -> Self {
        self.bloom = Some(filter_key.into());
        self
    }
    /// Results larger than this many bytes are not sent at all (the
    /// [`OversizePolicy`] applies). Without it, the server's
    /// `idem.max-result` decides.
    pub fn max_result(mut self, bytes: usize) -> Self {
        self.max_result = Some(bytes);
        self
    }
    pub fn oversize(mut self, policy: OversizePolicy) -> Self {
        self.oversize = policy;
        self
    }
    /// Skip asking the server which edition it has.
    pub fn edition(mut self, edition: Edition) -> Self {
        self.edition = Some(edition);
        self
    }
    /// Called with every [`Event`] of the consumer loop.
    pub fn on_event(mut self, hook: impl Fn(&Event<'_>) + Send + Sync + 'static) -> Self {
        self.hook = Some(Arc::new(hook));
        self
    }

    pub(crate) fn heartbeat_interval(&self) -> Duration {
        self.heartbeat
            .unwrap_or(Duration::from_secs(crate::cmd::seconds(self.lease)) / 3)
            .max(Duration::from_millis(100))
    }
}

/// Counters of the consumer loop, since the instance was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Work that ran on a NEW claim.
    pub first_runs: u64,
    /// Work that ran on a RETRY (an earlier attempt failed or crashed) or a
    /// SEEN claim.
    pub retries: u64,
    /// Calls answered from a done record: the work did not run.
    pub replays: u64,
    /// Calls that found the key busy and waited.
    pub waits: u64,
    /// Results recorded.
    pub completed: u64,
    /// Claims released after the work failed.
    pub released: u64,
    /// Claims lost to another worker.
    pub leases_lost: u64,
    /// Completions without the result (too large).
    pub results_omitted: u64,
    /// EXTENDs sent by heartbeats.
    pub extends: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub first_runs: AtomicU64,
    pub retries: AtomicU64,
    pub replays: AtomicU64,
    pub waits: AtomicU64,
    pub completed: AtomicU64,
    pub released: AtomicU64,
    pub leases_lost: AtomicU64,
    pub results_omitted: AtomicU64,
    pub extends: AtomicU64,
}

impl Counters {
    pub fn snapshot(&self) -> Stats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Stats {
            first_runs: get(&self.first_runs),
            retries: get(&self.retries),
            replays: get(&self.replays),
            waits: get(&self.waits),
            completed: get(&self.completed),
            released: get(&self.released),
            leases_lost: get(&self.leases_lost),
            results_omitted: get(&self.results_omitted),
            extends: get(&self.extends),
        }
    }
}

pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// The claim a piece of work runs under, handed to it.
#[derive(Clone, Debug)]
pub struct Attempt {
    /// The fencing number: 1 on the first claim of a key, +1 with each
    /// claim. A downstream store can refuse writes with a lower number than
    /// it has seen, so a worker whose lease lapsed cannot overwrite its
    /// successor's effects.
    pub number: u64,
    /// How the claim was granted: `Retry` when an earlier attempt failed or
    /// crashed (it may have partly run), `Seen` when the Bloom filter
    /// thinks the key completed before (verify before applying effects).
    pub granted: Granted,
    /// The record's key (with the prefix).
    pub key: String,
    pub(crate) lost: Arc<AtomicBool>,
}

impl Attempt {
    /// True once the heartbeat found the claim taken over: the result will
    /// be refused; long work may stop early.
    pub fn lease_lost(&self) -> bool {
        self.lost.load(Ordering::Relaxed)
    }
}

/// What [`Idem::process`](crate::Idem::process) did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome<T> {
    /// The work ran under this claim and its result was recorded.
    Completed {
        value: T,
        attempt: u64,
        granted: Granted,
        /// The DONE's answer (`AlreadyDone` when the record was completed
        /// first by someone else, or by this call's own retried DONE).
        done: Done,
        /// False when the result was too large to keep, or the server's
        /// memory was full: a replay of this key gets `None`.
        result_stored: bool,
    },
    /// The key was done already: the stored result (None when none was
    /// kept). The work did not run.
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
    /// content is [`Error::Mismatch`](crate::Error::Mismatch) (payload
    /// validation; only a 128-bit hash is kept).
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
