//! The consumer loop's decisions, shared by the sync [`Idem`](crate::Idem)
//! and the async [`AsyncIdem`](crate::AsyncIdem), without I/O: which claim
//! to send and what its answer means ([`Step`]), how a work's value is
//! settled ([`Settle`], a `Next` from each reply); plan.rs splits a batch
//! into commands and many.rs reads `process_many`'s answers. The front ends
//! only send and wait.
use crate::cmd::{self, ClaimOptions, DoneOptions, Edition};
use crate::codec::Codec;
use crate::commands::{decode, extended};
use crate::error::{BoxError, DurableStage, Error, ProcessError};
use crate::heartbeat::Beats;
use crate::options::{Counters, DropReason, Event, Job, Options, Outcome, Oversize, ReleaseReason, bump};
use crate::reply::{Claim, Done, Granted, Record, RecordState};
use redis::{Cmd, RedisResult, Value};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// What an instance resolved when it was made: settings, codec, edition.
pub(crate) struct Core<C> {
    pub options: Options,
    pub edition: Edition,
    pub counters: Counters,
    pub codec: C,
    pub cluster: bool,
    /// `OWNER`, and the process it was made in (read again after a fork).
    owner: (String, u32),
    /// `WAIT` / `WAITAOF` after each write, with `durable`.
    pub wait: Option<Cmd>,
    pub beats: Beats,
}

/// What the loop does after a claim's answer.
pub(crate) enum Step<T> {
    Work(Job, String),
    Return(Outcome<T>),
    /// Claim again after this pause.
    Again(Duration),
    /// Still busy at the end of the wait: read the holder's owner
    /// (`IDEM.GET`), then [`Core::busy`].
    Busy(Duration),
    /// Granted but not durable: RELEASE the claim (not counted), then fail.
    Release(Job, String, Error),
    /// A replay whose `WAIT` fell short: the stored value (decoded when it
    /// can be) with `NotDurable` at the done stage; nothing to release.
    Undurable {
        value: Option<T>,
        attempt: u64,
        error: Error,
    },
}

/// The time a duplicate waits for a busy key, and its polling where WAIT
/// is not available.
pub(crate) struct Backoff {
    deadline: Instant,
    next: Duration,
    waited: bool,
}

impl Backoff {
    pub fn new(wait: Duration) -> Backoff {
        Backoff { deadline: Instant::now() + wait, next: Duration::from_millis(10), waited: false }
    }
    fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }
    /// The next pause: doubling from 10 ms to 1 s, jittered, never past the
    /// holder's lease end (the key may be free then) nor the deadline.
    fn pause(&mut self, lease_left: Duration) -> Duration {
        // 75% to 125%, from the clock's nanoseconds: pollers started together drift apart.
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let jitter = 0.75 + f64::from(nanos.subsec_nanos() % 500) / 1000.0;
        let pause = self.next.mul_f64(jitter).min(lease_left.max(Duration::from_millis(1))).min(self.remaining());
        self.next = (self.next * 2).min(Duration::from_secs(1));
        pause
    }
}

/// A panic's message.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a hook panicked".into())
}

/// `host:pid`, the default owner (docs/clients.md).
fn default_owner() -> String {
    format!("{}:{}", gethostname::gethostname().to_string_lossy(), std::process::id())
}

/// How many replicas (or fsyncs) a `WAIT` / `WAITAOF` reply acknowledges;
/// an error (a server without `WAITAOF`) acknowledges none.
fn acknowledged(reply: RedisResult<Value>, fsync: bool) -> u64 {
    match (decode::<Vec<i64>>(reply.clone()), fsync) {
        (Ok(both), true) if both.len() == 2 && both[0] >= 1 => both[1].max(0) as u64,
        (_, true) => 0,
        _ => decode::<i64>(reply).map_or(0, |n| n.max(0) as u64),
    }
}

impl<C> Core<C> {
    pub fn new(options: Options, edition: Edition, codec: C, cluster: bool) -> Core<C> {
        let owner = (options.owner.clone().unwrap_or_else(default_owner), std::process::id());
        let wait = options.durable.as_ref().map(cmd::wait_for);
        let beats = Beats::new(options.heartbeat_interval());
        Core { options, edition, counters: Counters::default(), codec, cluster, owner, wait, beats }
    }

    pub fn key(&self, key: &str) -> String {
        format!("{}{key}", self.options.prefix)
    }

    /// Whether commands on `route` may share a pipeline with the record's
    /// (a cluster routes a pipeline by one key: both must share its slot).
    pub fn same_slot(&self, record: &str, route: &str) -> bool {
        !self.cluster || crate::plan::slot(record.as_bytes()) == crate::plan::slot(route.as_bytes())
    }

    /// The claims' `OWNER`; the default one made again in a forked child.
    pub fn owner(&self) -> std::borrow::Cow<'_, str> {
        if self.options.owner.is_none() && self.owner.1 != std::process::id() {
            return default_owner().into();
        }
        self.owner.0.as_str().into()
    }

    /// Calls the hook; a panic is the hook's failure, given back as a message.
    fn emit_checked(&self, event: Event<'_>) -> Result<(), String> {
        match &self.options.hook {
            Some(hook) => catch_unwind(AssertUnwindSafe(|| hook(&event))).map_err(|p| panic_message(&*p)),
            None => Ok(()),
        }
    }

    /// Calls the hook after the outcome is settled: what it raises is ignored.
    fn emit(&self, event: Event<'_>) {
        let _ = self.emit_checked(event);
    }

    /// Replies of commands that do not block: `done_timeout`, or longer
    /// when a durable `WAIT` may take longer.
    pub fn reply_timeout(&self) -> Duration {
        let wait = self.options.durable.map_or(Duration::ZERO, |d| d.timeout + Duration::from_secs(1));
        self.options.done_timeout.max(wait)
    }

    /// Replies of a claim that may block (WAIT), with a margin.
    pub fn waiting_timeout(&self) -> Duration {
        self.options.wait.min(Duration::from_secs(3600)) + self.reply_timeout()
    }

    pub fn claim_options(&self, payload: Option<Vec<u8>>, wait: Option<Duration>) -> ClaimOptions {
        let owner = Some(self.owner().into_owned());
        ClaimOptions { payload, max_tries: self.options.max_tries, bloom: self.options.bloom.clone(), wait, owner }
    }

    /// The loop's next claim (to the record's key): the first one without
    /// WAIT, so that a busy key is seen and counted once; after that, on
    /// the module, WAIT for the time left. True when it may block.
    pub fn claim_cmd(&self, record: &str, payload: &Option<Vec<u8>>, backoff: &Backoff) -> Result<(Cmd, bool), Error> {
        let wait = (backoff.waited && self.edition == Edition::Module).then(|| backoff.remaining());
        let wait = wait.filter(|w| cmd::wait_ms(*w) > 0);
        Ok((
            cmd::claim(self.edition, record, self.options.lease, &self.claim_options(payload.clone(), wait))?,
            wait.is_some(),
        ))
    }

    /// A claim's answer (and its `WAIT`'s, with `durable`): work, return,
    /// or claim again. `key` is the caller's, `record` the prefixed one.
    pub fn on_claim<T>(
        &self,
        key: &str,
        claim: Result<Claim, Error>,
        ack: Option<RedisResult<Value>>,
        backoff: &mut Backoff,
    ) -> Result<Step<T>, Error>
    where
        C: Codec<T>,
    {
        let claim = match claim {
            // It wrote nothing (or, its connection lost, meets itself as
            // BUSY): the same claim again, while time is left.
            Err(e) if e.is_claim_retryable() && !backoff.remaining().is_zero() => {
                return Ok(Step::Again(Duration::from_millis(10)));
            }
            other => other?,
        };
        let status = claim.granted();
        let undurable = self.claim_not_durable(key, &claim, ack);
        match claim {
            Claim::New { token, attempt } | Claim::Seen { token, attempt } | Claim::Retry { token, attempt } => {
                let job = self.job(key, attempt, status.expect("granted"));
                match undurable {
                    Some(error) => Ok(Step::Release(job, token, error)),
                    None => {
                        self.granted(&job);
                        Ok(Step::Work(job, token))
                    }
                }
            }
            // Counted as not durable, not as a replay.
            Claim::Done { result, attempt } => match undurable {
                Some(error) => {
                    let value = result.and_then(|bytes| self.codec.decode(&bytes).ok());
                    Ok(Step::Undurable { value, attempt, error })
                }
                None => Ok(Step::Return(self.replay(key, result, attempt)?)),
            },
            Claim::Busy { lease_left, .. } => {
                if backoff.remaining().is_zero() {
                    return Ok(Step::Busy(lease_left));
                }
                if !backoff.waited {
                    backoff.waited = true;
                    bump(&self.counters.waits);
                    self.emit(Event::Busy { key, lease_left });
                }
                Ok(Step::Again(match self.edition {
                    // The next claim WAITs for the time left.
                    Edition::Module => Duration::ZERO,
                    Edition::Functions => backoff.pause(lease_left),
                }))
            }
            Claim::Mismatch { .. } => {
                bump(&self.counters.mismatches);
                Err(Error::Mismatch { key: key.to_string() })
            }
            Claim::Exhausted { .. } => {
                bump(&self.counters.exhausted);
                Err(Error::Exhausted { key: key.to_string() })
            }
        }
    }

    /// [`Error::Busy`] with the holder's owner, as `IDEM.GET` read it.
    pub fn busy(&self, key: &str, lease_left: Duration, record: Result<Option<Record>, Error>) -> Error {
        bump(&self.counters.busy);
        let owner = record.ok().flatten().and_then(|r| r.owner);
        Error::Busy { key: key.to_string(), lease_left, owner }
    }

    /// With `durable`, the error when `ack` (the `WAIT` after a claim)
    /// fell short of a claim that matters to it, in the loop and in
    /// `claim_many` alike: a granted claim (stage claim: give it back) or
    /// a replay (stage done: the completion read may not have reached the
    /// replicas yet, a primary that has just lost its role keeps
    /// answering). Busy and refused claims wrote and read nothing to keep.
    pub fn claim_not_durable(&self, key: &str, claim: &Claim, ack: Option<RedisResult<Value>>) -> Option<Error> {
        let stage = match claim {
            Claim::New { .. } | Claim::Seen { .. } | Claim::Retry { .. } => DurableStage::Claim,
            Claim::Done { .. } => DurableStage::Done,
            Claim::Busy { .. } | Claim::Mismatch { .. } | Claim::Exhausted { .. } => return None,
        };
        self.not_durable(key, stage, ack)
    }

    /// With `durable`, the error when `ack` (the `WAIT`'s reply)
    /// acknowledged fewer replicas than asked.
    pub fn not_durable(&self, key: &str, stage: DurableStage, ack: Option<RedisResult<Value>>) -> Option<Error> {
        let durable = self.options.durable?;
        let acknowledged = ack.map_or(0, |reply| acknowledged(reply, durable.fsync));
        (acknowledged < u64::from(durable.replicas)).then(|| {
            bump(&self.counters.not_durable);
            Error::NotDurable { key: key.to_string(), stage, acknowledged }
        })
    }

    /// A job, not counted yet (see [`granted`](Self::granted)).
    pub fn job(&self, key: &str, attempt: u64, status: Granted) -> Job {
        let (key, record) = (key.to_string(), self.key(key));
        Job { key, record, attempt, status, lost: Arc::new(AtomicBool::new(false)) }
    }

    /// The claim is the work's: counted as a first run or a retry.
    pub fn granted(&self, job: &Job) {
        bump(match job.status {
            Granted::New => &self.counters.first_runs,
            Granted::Seen | Granted::Retry => &self.counters.retries,
        });
    }

    pub fn replay<T>(&self, key: &str, result: Option<Vec<u8>>, attempt: u64) -> Result<Outcome<T>, Error>
    where
        C: Codec<T>,
    {
        bump(&self.counters.replays);
        self.emit(Event::Replay { key, attempt });
        let value = result.map(|bytes| self.codec.decode(&bytes)).transpose().map_err(Error::Codec)?;
        Ok(Outcome::Replayed { value, attempt })
    }

    /// The run hook, before the heartbeat and the work: a panic is
    /// [`Error::Hook`], and the caller releases the claim.
    pub fn before_work(&self, job: &Job) -> Result<(), Error> {
        self.emit_checked(Event::Run { job }).map_err(|message| Error::Hook { key: job.key.clone(), message })
    }

    pub fn release_cmd(&self, job: &Job, token: &str) -> Cmd {
        cmd::release(self.edition, &job.record, token)
    }

    /// The RELEASE of a failed work or hook, sent once: `released` counts
    /// it only when answered 1; the hook is told either way.
    pub fn released(&self, job: &Job, reason: ReleaseReason, reply: Result<bool, Error>) {
        if matches!(reply, Ok(true)) {
            bump(&self.counters.released);
        }
        self.emit(Event::Release { job, reason });
    }

    /// An EXTEND's answer: false when the claim is lost (stop extending it).
    pub fn on_extend(&self, job: &Job, reply: RedisResult<Value>) -> bool {
        match extended(reply) {
            Ok(()) => {
                bump(&self.counters.extends);
                true
            }
            Err(Error::Stale(_)) => {
                self.lease_lost(job);
                false
            }
            // A connection error: the next beat tries again.
            Err(_) => true,
        }
    }

    /// Counted and told once per job, by the heartbeat or by DONE.
    pub fn lease_lost(&self, job: &Job) -> Error {
        if !job.lost.swap(true, Ordering::Relaxed) {
            bump(&self.counters.leases_lost);
            self.emit(Event::LeaseLost { job });
        }
        Error::LeaseLost { key: job.key.clone(), attempt: job.attempt }
    }

    pub fn done_cmd(&self, record: &str, token: &str, result: Option<Vec<u8>>) -> Result<Cmd, Error> {
        let options = DoneOptions { result, retain: self.options.retain, bloom: self.options.bloom.clone() };
        cmd::done(self.edition, record, token, &options)
    }

    /// The work's value encoded for DONE: the bytes to send, or why none.
    pub fn encode<T>(&self, value: &T) -> Result<Vec<u8>, (DropReason, BoxError)>
    where
        C: Codec<T>,
    {
        let bytes = self.codec.encode(value).map_err(|e| (DropReason::Unserializable, e))?;
        match self.options.max_result {
            Some(max) if bytes.len() > max => Err((DropReason::Oversize, oversize(bytes.len()))),
            _ => Ok(bytes),
        }
    }

    /// Settling a work's value: from here on the record is completed.
    pub fn settle<T, E>(&self, job: Job, token: String, value: T) -> (Settle<T>, Next<T, E>)
    where
        C: Codec<T>,
    {
        let (result, dropped) = match self.encode(&value) {
            Ok(bytes) => (Some(bytes), None),
            Err(dropped) => (None, Some(dropped)),
        };
        let settle = Settle {
            job,
            token,
            value: Some(value),
            result,
            dropped,
            sends: 1,
            resent: false,
            checking: false,
            ack: None,
        };
        let next = settle.send_done(self, Duration::ZERO);
        (settle, next)
    }

    /// A completion recorded: counters, events, and what the caller gets
    /// (with `durable`, `not_durable` when the `WAIT` fell short).
    pub fn completed<T>(
        &self,
        job: &Job,
        value: T,
        stored: bool,
        dropped: Option<(DropReason, BoxError)>,
        not_durable: Option<Error>,
    ) -> Result<Outcome<T>, ProcessError<T, Error>> {
        bump(&self.counters.completed);
        if let Some((reason, _)) = &dropped {
            bump(&self.counters.results_dropped);
            self.emit(Event::ResultDropped { job, reason: *reason });
        }
        let key = job.key.clone();
        let hook = self.emit_checked(Event::Done { job, result_stored: stored });
        if let Some(error) = not_durable {
            return Err(ProcessError::Completed { value, error });
        }
        if let Err(message) = hook {
            return Err(ProcessError::Completed { value, error: Error::Hook { key, message } });
        }
        match dropped {
            Some((DropReason::Unserializable, cause)) => {
                Err(ProcessError::Completed { value, error: Error::ResultNotStored { key, cause } })
            }
            Some((DropReason::Oversize, cause)) if self.options.oversize == Oversize::Error => {
                Err(ProcessError::Completed { value, error: Error::ResultNotStored { key, cause } })
            }
            _ => Ok(Outcome::Completed { value, attempt: job.attempt, status: job.status, result_stored: stored }),
        }
    }
}

pub(crate) fn oversize(size: usize) -> BoxError {
    format!("the result is {size} bytes, more than the server keeps (idem.max-result)").into()
}

/// What a front end does next while settling.
pub(crate) enum Next<T, E> {
    /// Sends this (to the job's key) after the pause; with `durable`, a
    /// DONE is followed by the `WAIT` in the same round trip.
    Send(Cmd, Duration, bool),
    Finish(Result<Outcome<T>, ProcessError<T, E>>),
}

/// One work's value on its way into the record: DONE, sent again after a
/// connection error, without RESULT when the server refuses it, checked
/// with IDEM.GET when a resent DONE answers 0.
pub(crate) struct Settle<T> {
    job: Job,
    token: String,
    value: Option<T>,
    result: Option<Vec<u8>>,
    dropped: Option<(DropReason, BoxError)>,
    sends: u32,
    resent: bool,
    checking: bool,
    /// The latest DONE's `WAIT` reply, with `durable`.
    ack: Option<RedisResult<Value>>,
}

impl<T> Settle<T> {
    /// The record's key, where every command of the settling goes.
    pub fn record(&self) -> &str {
        &self.job.record
    }

    /// Whether the next send is a DONE (not the GET checking one).
    pub fn sends_done(&self) -> bool {
        !self.checking
    }

    /// The DONE's token and result, for a shared batch of completions.
    #[cfg(feature = "tokio")]
    pub fn done_args(&self) -> (&str, Option<&[u8]>) {
        (&self.token, self.result.as_deref())
    }

    fn finish<E>(&mut self, outcome: Result<Outcome<T>, ProcessError<T, Error>>) -> Next<T, E> {
        Next::Finish(outcome.map_err(|e| match e {
            ProcessError::Completed { value, error } => ProcessError::Completed { value, error },
            ProcessError::Unsettled { value, error } => ProcessError::Unsettled { value, error },
            ProcessError::Replayed { value, attempt, error } => ProcessError::Replayed { value, attempt, error },
            ProcessError::Idem(e) | ProcessError::Work(e) => ProcessError::Idem(e),
        }))
    }

    fn value(&mut self) -> T {
        self.value.take().expect("settled once")
    }

    fn send_done<C, E>(&self, core: &Core<C>, after: Duration) -> Next<T, E> {
        match core.done_cmd(&self.job.record, &self.token, self.result.clone()) {
            Ok(cmd) => Next::Send(cmd, after, core.wait.is_some()),
            // Not reached: the claim took the same options.
            Err(e) => Next::Finish(Err(ProcessError::Idem(e))),
        }
    }

    /// The answer to what the last `Next::Send` sent (and its `WAIT`'s).
    pub fn on_reply<C, E>(
        &mut self,
        core: &Core<C>,
        reply: RedisResult<Value>,
        ack: Option<RedisResult<Value>>,
    ) -> Next<T, E> {
        if self.checking {
            return self.on_checked(core, decode::<Option<Record>>(reply));
        }
        self.ack = ack;
        match decode::<Done>(reply) {
            Ok(Done::Completed { result_dropped, .. }) => {
                if result_dropped && self.dropped.is_none() {
                    self.dropped = Some((DropReason::Memory, "dropped under maxmemory".into()));
                }
                self.success(core, !result_dropped)
            }
            // Someone else's completion, unless this is our own DONE sent twice.
            Ok(Done::AlreadyDone) if self.resent => {
                self.checking = true;
                Next::Send(cmd::get(core.edition, &self.job.record), Duration::ZERO, false)
            }
            Ok(Done::AlreadyDone) | Err(Error::Stale(_)) => {
                self.finish(Err(ProcessError::Idem(core.lease_lost(&self.job))))
            }
            Err(Error::ResultTooLarge(_)) if self.result.is_some() => {
                let size = self.result.take().map_or(0, |r| r.len());
                self.dropped = Some((DropReason::Oversize, oversize(size)));
                self.send_done(core, Duration::ZERO)
            }
            // Lost with its connection, or refused by a demoted primary: again.
            Err(e) if e.is_connection_error() || e.is_failover() => self.again(core, e, false),
            // WRONGTYPE (the key was overwritten), ...: not completed.
            Err(error) => {
                let value = self.value();
                self.finish(Err(ProcessError::Unsettled { value, error }))
            }
        }
    }

    /// DONE (or the GET checking it) once more after a connection error,
    /// or DoneUnconfirmed when the retries are used up.
    fn again<C, E>(&mut self, core: &Core<C>, cause: Error, checking: bool) -> Next<T, E> {
        if self.sends > core.options.done_retries {
            let (key, value) = (self.job.key.clone(), self.value());
            let error = Error::DoneUnconfirmed { key, cause: Box::new(cause) };
            return self.finish(Err(ProcessError::Unsettled { value, error }));
        }
        let pause = Duration::from_millis(50) * 2u32.pow(self.sends.min(10) - 1);
        self.sends += 1;
        if checking {
            return Next::Send(cmd::get(core.edition, &self.job.record), pause, false);
        }
        self.resent = true;
        self.send_done(core, pause)
    }

    /// IDEM.GET after a resent DONE answered 0: done with this job's
    /// attempt is this worker's own completion (nobody else can have
    /// claimed in between); anything else is a lost lease.
    fn on_checked<C, E>(&mut self, core: &Core<C>, record: Result<Option<Record>, Error>) -> Next<T, E> {
        match record {
            Ok(Some(record)) if record.state == RecordState::Done && record.attempt == self.job.attempt => {
                let stored = self.result.is_some() && record.result == self.result;
                if !stored && self.dropped.is_none() && self.result.is_some() {
                    self.dropped = Some((DropReason::Memory, "dropped under maxmemory".into()));
                }
                self.success(core, stored)
            }
            Ok(_) => self.finish(Err(ProcessError::Idem(core.lease_lost(&self.job)))),
            Err(e) if e.is_connection_error() || e.is_failover() => self.again(core, e, true),
            Err(error) => {
                let value = self.value();
                let error = Error::DoneUnconfirmed { key: self.job.key.clone(), cause: Box::new(error) };
                self.finish(Err(ProcessError::Unsettled { value, error }))
            }
        }
    }

    fn success<C, E>(&mut self, core: &Core<C>, stored: bool) -> Next<T, E> {
        let stored = stored && self.result.is_some();
        let value = self.value();
        let not_durable = core.not_durable(&self.job.key, DurableStage::Done, self.ack.take());
        let outcome = core.completed(&self.job, value, stored, self.dropped.take(), not_durable);
        self.finish(outcome)
    }
}

#[cfg(test)]
mod tests;
