//! The consumer loop's decisions, shared by the sync [`Idem`](crate::Idem)
//! and the async [`AsyncIdem`](crate::AsyncIdem), without I/O: which claim
//! to send and what its answer means ([`Step`]), how a work's value is
//! settled ([`Settle`], a `Next` from each reply), and how a batch is split
//! into commands ([`Plan`]); many.rs reads `process_many`'s answers. The
//! front ends only send and wait.
use crate::cmd::{self, ClaimOptions, DoneOptions, Edition, MAX_BATCH};
use crate::codec::Codec;
use crate::commands::{decode, decode_each, extended};
use crate::error::{BoxError, Error, ProcessError};
use crate::options::{Counters, DropReason, Event, Job, Options, Outcome, Oversize, ReleaseReason, bump};
use crate::reply::{Claim, Done, Granted, Record, RecordState};
use redis::{Cmd, FromRedisValue, RedisResult, Value};
use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub(crate) struct Core<C> {
    pub options: Options,
    pub edition: Edition,
    pub counters: Counters,
    pub codec: C,
    pub cluster: bool,
}

/// What the loop does after a claim's answer.
pub(crate) enum Step<T> {
    Work(Job, String),
    Return(Outcome<T>),
    /// Claim again after this pause.
    Again(Duration),
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

impl<C> Core<C> {
    pub fn key(&self, key: &str) -> String {
        format!("{}{key}", self.options.prefix)
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

    /// Replies to wait for at most this long (a WAIT's reply comes after it).
    pub fn response_timeout(&self) -> Duration {
        self.options.wait.min(Duration::from_secs(3600)) + Duration::from_secs(5)
    }

    fn claim_options(&self, payload: Option<Vec<u8>>, wait: Option<Duration>) -> ClaimOptions {
        ClaimOptions { payload, max_tries: self.options.max_tries, bloom: self.options.bloom.clone(), wait }
    }

    /// The loop's next claim: the first one without WAIT, so that a busy
    /// key is seen and counted once; after that, on the module, WAIT for
    /// the time left.
    pub fn claim_cmd(&self, key: &str, payload: &Option<Vec<u8>>, backoff: &Backoff) -> Result<(Cmd, bool), Error> {
        let wait = (backoff.waited && self.edition == Edition::Module).then(|| backoff.remaining());
        let wait = wait.filter(|w| cmd::wait_ms(*w) > 0);
        Ok((
            cmd::claim(self.edition, key, self.options.lease, &self.claim_options(payload.clone(), wait))?,
            wait.is_some(),
        ))
    }

    /// A claim's answer: work, return, or claim again.
    pub fn on_claim<T>(&self, key: &str, claim: Result<Claim, Error>, backoff: &mut Backoff) -> Result<Step<T>, Error>
    where
        C: Codec<T>,
    {
        let claim = match claim {
            // It wrote nothing: the same claim again, while time is left.
            Err(e) if e.is_claim_retryable() && !backoff.remaining().is_zero() => {
                return Ok(Step::Again(Duration::from_millis(10)));
            }
            other => other?,
        };
        match claim {
            Claim::New { token, attempt } => Ok(Step::Work(self.job(key, attempt, Granted::New), token)),
            Claim::Seen { token, attempt } => Ok(Step::Work(self.job(key, attempt, Granted::Seen), token)),
            Claim::Retry { token, attempt } => Ok(Step::Work(self.job(key, attempt, Granted::Retry), token)),
            Claim::Done { result, attempt } => Ok(Step::Return(self.replay(key, result, attempt)?)),
            Claim::Busy { lease_left, .. } => {
                if backoff.remaining().is_zero() {
                    bump(&self.counters.busy);
                    return Err(Error::Busy { key: key.to_string(), lease_left });
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

    fn job(&self, key: &str, attempt: u64, status: Granted) -> Job {
        bump(match status {
            Granted::New => &self.counters.first_runs,
            Granted::Seen | Granted::Retry => &self.counters.retries,
        });
        Job { key: key.to_string(), attempt, status, lost: Arc::new(AtomicBool::new(false)) }
    }

    fn replay<T>(&self, key: &str, result: Option<Vec<u8>>, attempt: u64) -> Result<Outcome<T>, Error>
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
        cmd::release(self.edition, &job.key, token)
    }

    /// Counted whether or not the RELEASE arrived: if it did not, the lease
    /// lapses and the key is retried.
    pub fn released(&self, job: &Job, reason: ReleaseReason) {
        bump(&self.counters.released);
        self.emit(Event::Release { job, reason });
    }

    /// The heartbeat's commands, one per job; None when there is no heartbeat.
    pub fn heartbeat(&self, jobs: &[(Job, String)]) -> Option<(Duration, Vec<Cmd>)> {
        let every = self.options.heartbeat_interval();
        let cmds = jobs.iter().map(|(job, token)| cmd::extend(self.edition, &job.key, token, self.options.lease));
        (!every.is_zero()).then(|| (every, cmds.collect::<Result<_, _>>().expect("the lease was checked")))
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

    fn done_cmd(&self, key: &str, token: &str, result: Option<Vec<u8>>) -> Result<Cmd, Error> {
        let options = DoneOptions { result, retain: self.options.retain, bloom: self.options.bloom.clone() };
        cmd::done(self.edition, key, token, &options)
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
        let settle =
            Settle { job, token, value: Some(value), result, dropped, sends: 1, resent: false, checking: false };
        let next = settle.send_done(self, Duration::ZERO);
        (settle, next)
    }

    /// A completion recorded: counters, events, and what the caller gets.
    pub fn completed<T>(
        &self,
        job: &Job,
        value: T,
        stored: bool,
        dropped: Option<(DropReason, BoxError)>,
    ) -> Result<Outcome<T>, ProcessError<T, Error>> {
        bump(&self.counters.completed);
        if let Some((reason, _)) = &dropped {
            bump(&self.counters.results_dropped);
            self.emit(Event::ResultDropped { job, reason: *reason });
        }
        let key = job.key.clone();
        if let Err(message) = self.emit_checked(Event::Done { job, result_stored: stored }) {
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
    /// Sends this (to the job's key) after the pause.
    Send(Cmd, Duration),
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
}

impl<T> Settle<T> {
    pub fn key(&self) -> &str {
        &self.job.key
    }

    fn finish<E>(&mut self, outcome: Result<Outcome<T>, ProcessError<T, Error>>) -> Next<T, E> {
        Next::Finish(outcome.map_err(|e| match e {
            ProcessError::Completed { value, error } => ProcessError::Completed { value, error },
            ProcessError::Idem(e) => ProcessError::Idem(e),
            ProcessError::Work(e) => ProcessError::Idem(e),
        }))
    }

    fn value(&mut self) -> T {
        self.value.take().expect("settled once")
    }

    fn send_done<C, E>(&self, core: &Core<C>, after: Duration) -> Next<T, E> {
        match core.done_cmd(&self.job.key, &self.token, self.result.clone()) {
            Ok(cmd) => Next::Send(cmd, after),
            // Not reached: the claim took the same options.
            Err(e) => Next::Finish(Err(ProcessError::Idem(e))),
        }
    }

    /// The answer to what the last `Next::Send` sent.
    pub fn on_reply<C, E>(&mut self, core: &Core<C>, reply: RedisResult<Value>) -> Next<T, E> {
        if self.checking {
            return self.on_checked(core, decode::<Option<Record>>(reply));
        }
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
                Next::Send(cmd::get(core.edition, &self.job.key), Duration::ZERO)
            }
            Ok(Done::AlreadyDone) | Err(Error::Stale(_)) => {
                self.finish(Err(ProcessError::Idem(core.lease_lost(&self.job))))
            }
            Err(Error::ResultTooLarge(_)) if self.result.is_some() => {
                let size = self.result.take().map_or(0, |r| r.len());
                self.dropped = Some((DropReason::Oversize, oversize(size)));
                self.send_done(core, Duration::ZERO)
            }
            Err(e) if e.is_connection_error() => self.again(core, e, false),
            Err(error) => {
                let value = self.value();
                self.finish(Err(ProcessError::Completed { value, error }))
            }
        }
    }

    /// DONE (or the GET checking it) once more after a connection error,
    /// or DoneUnconfirmed when the retries are used up.
    fn again<C, E>(&mut self, core: &Core<C>, cause: Error, checking: bool) -> Next<T, E> {
        if self.sends > core.options.done_retries {
            let (key, value) = (self.job.key.clone(), self.value());
            let error = Error::DoneUnconfirmed { key, cause: Box::new(cause) };
            return self.finish(Err(ProcessError::Completed { value, error }));
        }
        let pause = Duration::from_millis(50) * 2u32.pow(self.sends.min(10) - 1);
        self.sends += 1;
        if checking {
            return Next::Send(cmd::get(core.edition, &self.job.key), pause);
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
            Err(e) if e.is_connection_error() => self.again(core, e, true),
            Err(error) => {
                let value = self.value();
                self.finish(Err(ProcessError::Completed { value, error }))
            }
        }
    }

    fn success<C, E>(&mut self, core: &Core<C>, stored: bool) -> Next<T, E> {
        let stored = stored && self.result.is_some();
        let value = self.value();
        let outcome = core.completed(&self.job, value, stored, self.dropped.take());
        self.finish(outcome)
    }
}

/// A batch helper's commands: one per slot and per 10000 keys on the
/// module, one per key on the Functions edition.
pub(crate) struct Plan {
    count: usize,
    pub sends: Vec<(Vec<usize>, Cmd, String)>,
    single: bool,
}

impl Plan {
    /// Each key's answer, in order; a command's failure fails its keys.
    pub fn gather<R: FromRedisValue>(self, replies: Vec<RedisResult<Value>>) -> Vec<Result<R, Error>> {
        let mut answers: Vec<Option<Result<R, Error>>> = (0..self.count).map(|_| None).collect();
        for ((indices, _, _), reply) in self.sends.into_iter().zip(replies) {
            let each = if self.single {
                vec![decode(reply)]
            } else {
                match decode_each(reply.clone(), indices.len()) {
                    Ok(each) => each,
                    Err(_) => indices.iter().map(|_| decode::<R>(reply.clone())).collect(),
                }
            };
            for (i, answer) in indices.into_iter().zip(each) {
                answers[i] = Some(answer);
            }
        }
        answers.into_iter().map(|a| a.expect("every key answered")).collect()
    }
}

/// A completion of a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DoneItem {
    pub key: String,
    pub token: String,
    /// `RESULT`, kept and replayed.
    pub result: Option<Vec<u8>>,
}

impl DoneItem {
    pub fn new(key: impl Into<String>, token: impl Into<String>) -> DoneItem {
        DoneItem { key: key.into(), token: token.into(), result: None }
    }
    pub fn result(mut self, result: impl Into<Vec<u8>>) -> DoneItem {
        self.result = Some(result.into());
        self
    }
}

/// A release of a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReleaseItem {
    pub key: String,
    pub token: String,
}

impl ReleaseItem {
    pub fn new(key: impl Into<String>, token: impl Into<String>) -> ReleaseItem {
        ReleaseItem { key: key.into(), token: token.into() }
    }
}

impl<C> Core<C> {
    /// The groups of `keys` (prefixed), by `class` (a batch command of one
    /// shape) and, in a cluster, by slot; each at most 10000 keys, the
    /// keys' indices in order.
    fn groups(&self, keys: &[&str], class: impl Fn(usize) -> bool) -> Vec<Vec<usize>> {
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut by_slot: HashMap<(bool, Slot), usize> = HashMap::new();
        for (i, key) in keys.iter().enumerate() {
            let slot = if self.cluster { slot(key.as_bytes()) } else { Slot::default() };
            let group = *by_slot.entry((class(i), slot)).or_insert_with(|| {
                groups.push(Vec::new());
                groups.len() - 1
            });
            groups[group].push(i);
        }
        groups.into_iter().flat_map(|g| g.chunks(MAX_BATCH).map(<[usize]>::to_vec).collect::<Vec<_>>()).collect()
    }

    /// One command per key on the Functions edition, one per group on the module.
    fn plan(
        &self,
        keys: &[&str],
        class: impl Fn(usize) -> bool,
        single: impl Fn(usize) -> Result<Cmd, Error>,
        batch: impl Fn(&[usize]) -> Result<Cmd, Error>,
    ) -> Result<Plan, Error> {
        let single_mode = self.edition == Edition::Functions;
        let sends = if single_mode {
            (0..keys.len()).map(|i| Ok((vec![i], single(i)?, keys[i].to_string()))).collect::<Result<_, Error>>()?
        } else {
            let groups = self.groups(keys, class);
            groups
                .into_iter()
                .map(|g| Ok((g.clone(), batch(&g)?, keys[g[0]].to_string())))
                .collect::<Result<_, Error>>()?
        };
        Ok(Plan { count: keys.len(), sends, single: single_mode })
    }

    /// `keys` prefixed already.
    pub fn plan_claims(&self, keys: &[String], lease: Duration, payloads: Option<&[Vec<u8>]>) -> Result<Plan, Error> {
        if payloads.is_some_and(|p| p.len() != keys.len()) {
            return Err(Error::InvalidArgument("claim_many takes one payload per key".into()));
        }
        let (max_tries, bloom) = (self.options.max_tries, self.options.bloom.as_deref());
        let routes: Vec<&str> = keys.iter().map(String::as_str).collect();
        self.plan(
            &routes,
            |_| true,
            |i| cmd::claim(self.edition, &keys[i], lease, &self.claim_options(payloads.map(|p| p[i].clone()), None)),
            |g| {
                let group_keys: Vec<&str> = g.iter().map(|&i| keys[i].as_str()).collect();
                let group_payloads: Option<Vec<Vec<u8>>> = payloads.map(|p| g.iter().map(|&i| p[i].clone()).collect());
                cmd::mclaim(self.edition, &group_keys, lease, group_payloads.as_deref(), max_tries, bloom)
            },
        )
    }

    /// Items with their keys prefixed already; those with and without a
    /// result go in separate MDONEs.
    pub fn plan_dones(&self, items: &[DoneItem]) -> Result<Plan, Error> {
        let (retain, bloom) = (self.options.retain, self.options.bloom.as_deref());
        let routes: Vec<&str> = items.iter().map(|item| item.key.as_str()).collect();
        self.plan(
            &routes,
            |i| items[i].result.is_some(),
            |i| self.done_cmd(&items[i].key, &items[i].token, items[i].result.clone()),
            |g| {
                let pairs: Vec<(&str, String)> =
                    g.iter().map(|&i| (items[i].key.as_str(), items[i].token.clone())).collect();
                let results: Option<Vec<Vec<u8>>> = items[g[0]]
                    .result
                    .is_some()
                    .then(|| g.iter().map(|&i| items[i].result.clone().unwrap_or_default()).collect());
                cmd::mdone(self.edition, &pairs, results.as_deref(), retain, bloom)
            },
        )
    }

    pub fn plan_releases(&self, items: &[ReleaseItem]) -> Result<Plan, Error> {
        let routes: Vec<&str> = items.iter().map(|item| item.key.as_str()).collect();
        self.plan(
            &routes,
            |_| true,
            |i| Ok(cmd::release(self.edition, &items[i].key, &items[i].token)),
            |g| {
                let pairs: Vec<(&str, String)> =
                    g.iter().map(|&i| (items[i].key.as_str(), items[i].token.clone())).collect();
                cmd::mrelease(self.edition, &pairs)
            },
        )
    }
}

#[cfg(feature = "cluster")]
type Slot = Option<redis::cluster_routing::Slot>;
#[cfg(feature = "cluster")]
fn slot(key: &[u8]) -> Slot {
    Some(redis::cluster_routing::Slot::for_key(key))
}

#[cfg(not(feature = "cluster"))]
type Slot = ();
#[cfg(not(feature = "cluster"))]
fn slot(_key: &[u8]) -> Slot {}
