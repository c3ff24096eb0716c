//! What `process_many` decides, without I/O: which keys of a batch's claims
//! are worked on, what each work's outcome sends (one DONE batch for the
//! successes, one RELEASE batch for the failures) and each key's answer.
use crate::codec::Codec;
use crate::error::{BoxError, DurableStage, Error, KeyError, ProcessError};
use crate::flow::{Backoff, Core, Step, oversize};
use crate::options::{DropReason, Job, Outcome, ReleaseReason};
use crate::plan::{Answer, DoneItem, ReleaseItem};
use crate::reply::{Claim, Done, Record, RecordState};
use redis::{RedisResult, Value};
use std::time::Duration;

/// How a key of [`process_many`](crate::Idem::process_many) ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchStatus {
    /// The work ran and its completion was recorded (`result_stored` says
    /// whether with its result).
    Processed,
    /// The key was done: the stored result, the work did not run.
    Replayed,
    /// Another worker holds the key (not waited for in a batch).
    Busy,
    /// The work (or the run hook) failed; the claim was released.
    Failed,
    /// The lease was lost before `DONE`: another worker's outcome is kept.
    Lost,
    Mismatch,
    Exhausted,
    /// [`Durable`](crate::Durable): the claim was not acknowledged (released,
    /// the work did not run) or the completion was not (done on the
    /// primary, the value carried), or a replay's `WAIT` fell short (the
    /// stored value carried, the work did not run, nothing released): do
    /// not acknowledge the message.
    NotDurable,
    /// Any other error for this key (`WrongType`, a connection error, ...).
    Error,
}

/// One key's answer of [`process_many`](crate::Idem::process_many).
#[derive(Debug)]
pub struct BatchItem<T, E> {
    /// The key as given (without the prefix).
    pub key: String,
    pub status: BatchStatus,
    /// The work's value (processed) or the stored one decoded (replayed, or
    /// a replay not durable).
    pub value: Option<T>,
    /// The work's failure, or this crate's error for the key; for a
    /// processed key whose result could not be stored where
    /// [`process`](crate::Idem::process) would fail, `ResultNotStored`.
    pub error: Option<KeyError<E>>,
    /// The fencing number the work was given (the record's otherwise).
    pub attempt: u64,
    pub result_stored: bool,
}

/// A work's value waiting for its DONE's answer.
struct Pending<T> {
    index: usize,
    job: Job,
    token: String,
    value: T,
    result: Option<Vec<u8>>,
    dropped: Option<(DropReason, BoxError)>,
    sends: u32,
    /// The latest DONE batch's `WAIT` reply, with `durable`.
    ack: Option<RedisResult<Value>>,
}

/// A batch on its way through `process_many`.
pub(crate) struct Many<T, E> {
    items: Vec<Option<BatchItem<T, E>>>,
    keys: Vec<String>,
    jobs: Vec<(usize, Job, String)>,
    dones: Vec<Pending<T>>,
    /// Resent DONEs answered 0: this job's own completion if IDEM.GET says so.
    checks: Vec<Pending<T>>,
    /// Claims to give back: failed works (with why), and claims not
    /// durable (neither counted nor told).
    releases: Vec<(Job, String, Option<ReleaseReason>)>,
}

impl<T, E> Many<T, E> {
    fn answer(&mut self, index: usize, status: BatchStatus, attempt: u64) -> &mut BatchItem<T, E> {
        let key = self.keys[index].clone();
        self.items[index] = Some(BatchItem { key, status, value: None, error: None, attempt, result_stored: false });
        self.items[index].as_mut().expect("just set")
    }

    fn failed(&mut self, index: usize, job: Job, token: String, reason: ReleaseReason, error: KeyError<E>) {
        self.answer(index, BatchStatus::Failed, job.attempt).error = Some(error);
        self.releases.push((job, token, Some(reason)));
    }

    /// The granted keys, to work on in order (and for the heartbeat).
    pub fn take_jobs(&mut self) -> Vec<(usize, Job, String)> {
        std::mem::take(&mut self.jobs)
    }

    /// A work's outcome: to complete, or to release.
    pub fn ran<C: Codec<T>>(&mut self, core: &Core<C>, (index, job, token): (usize, Job, String), ran: Result<T, E>) {
        match ran {
            Ok(value) => {
                let (result, dropped) = match core.encode(&value) {
                    Ok(bytes) => (Some(bytes), None),
                    Err(dropped) => (None, Some(dropped)),
                };
                self.dones.push(Pending { index, job, token, value, result, dropped, sends: 1, ack: None });
            }
            Err(e) => self.failed(index, job, token, ReleaseReason::Work, KeyError::Work(e)),
        }
    }

    /// A work panicked: it and the jobs not run yet are given back.
    pub fn panicked(&mut self, rest: Vec<(usize, Job, String)>) {
        for (index, job, token) in rest {
            let error = Error::Hook { key: job.key.clone(), message: "the batch's work panicked".into() };
            self.failed(index, job, token, ReleaseReason::Panic, KeyError::Idem(error));
        }
    }

    /// The RELEASEs to send (record keys), one batch.
    pub fn release_items(&self) -> Vec<ReleaseItem> {
        self.releases.iter().map(|(job, token, _)| ReleaseItem::new(job.record.clone(), token.clone())).collect()
    }

    /// The RELEASE batch's answers: a failed work's counted when 1, its
    /// hook told either way.
    pub fn on_releases<C>(&mut self, core: &Core<C>, answers: Vec<Result<bool, Error>>) {
        let mut answers = answers.into_iter();
        for (job, _, reason) in std::mem::take(&mut self.releases) {
            let answer = answers.next().unwrap_or(Ok(false));
            if let Some(reason) = reason {
                core.released(&job, reason, answer);
            }
        }
    }

    /// The DONEs to send (record keys), one batch.
    pub fn done_items(&self) -> Vec<DoneItem> {
        let item =
            |p: &Pending<T>| DoneItem { key: p.job.record.clone(), token: p.token.clone(), result: p.result.clone() };
        self.dones.iter().map(item).collect()
    }

    /// The pause before DONEs are sent again after a connection error.
    pub fn pause(&self) -> Duration {
        let sends = self.dones.iter().map(|p| p.sends).max().unwrap_or(1);
        Duration::from_millis(50) * 2u32.pow(sends.clamp(2, 11) - 2)
    }

    /// The DONE batch's answers, one per [`done_items`](Self::done_items).
    /// Kept to be sent again (the returned items; none: every key settled
    /// or to be checked): those refused as too large, without their result,
    /// and those that failed on the connection, while `done_retries` allow.
    pub fn on_dones<C>(&mut self, core: &Core<C>, dones: Vec<Answer<Done>>) -> Vec<DoneItem> {
        for (mut p, (done, ack)) in std::mem::take(&mut self.dones).into_iter().zip(dones) {
            match done {
                Err(Error::ResultTooLarge(_)) if p.result.is_some() => {
                    p.dropped = Some((DropReason::Oversize, oversize(p.result.take().map_or(0, |r| r.len()))));
                    self.dones.push(p);
                }
                Err(e) if e.is_connection_error() && p.sends <= core.options.done_retries => {
                    p.sends += 1;
                    self.dones.push(p);
                }
                Err(e) if e.is_connection_error() => {
                    let error = Error::DoneUnconfirmed { key: p.job.key.clone(), cause: Box::new(e) };
                    self.settled(p, BatchStatus::Error, Some(error));
                }
                Ok(Done::AlreadyDone) if p.sends > 1 => {
                    p.ack = ack;
                    self.checks.push(p)
                }
                Ok(Done::Completed { result_dropped, .. }) => {
                    if result_dropped && p.dropped.is_none() {
                        p.dropped = Some((DropReason::Memory, "dropped under maxmemory".into()));
                    }
                    let stored = p.result.is_some() && !result_dropped;
                    p.ack = ack;
                    self.completed(core, p, stored);
                }
                Ok(Done::AlreadyDone) | Err(Error::Stale(_)) => {
                    let lost = core.lease_lost(&p.job);
                    self.settled(p, BatchStatus::Lost, Some(lost));
                }
                Err(e) => self.settled(p, BatchStatus::Error, Some(e)),
            }
        }
        self.done_items()
    }

    /// The record keys whose resent DONE answered 0, for IDEM.GET.
    pub fn check_keys(&self) -> Vec<String> {
        self.checks.iter().map(|p| p.job.record.clone()).collect()
    }

    /// IDEM.GET's answers, one per [`check_keys`](Self::check_keys): done
    /// with this job's attempt is this worker's own completion.
    pub fn on_checks<C>(&mut self, core: &Core<C>, records: Vec<Result<Option<Record>, Error>>) {
        for (p, record) in std::mem::take(&mut self.checks).into_iter().zip(records) {
            match record {
                Ok(Some(r)) if r.state == RecordState::Done && r.attempt == p.job.attempt => {
                    let stored = p.result.is_some() && r.result == p.result;
                    self.completed(core, p, stored);
                }
                Ok(_) => {
                    let lost = core.lease_lost(&p.job);
                    self.settled(p, BatchStatus::Lost, Some(lost));
                }
                Err(e) => {
                    let error = Error::DoneUnconfirmed { key: p.job.key.clone(), cause: Box::new(e) };
                    self.settled(p, BatchStatus::Error, Some(error));
                }
            }
        }
    }

    fn completed<C>(&mut self, core: &Core<C>, p: Pending<T>, stored: bool) {
        let Pending { index, job, value, dropped, ack, .. } = p;
        let not_durable = core.not_durable(&job.key, DurableStage::Done, ack);
        let status = if not_durable.is_some() { BatchStatus::NotDurable } else { BatchStatus::Processed };
        let (value, error) = match core.completed(&job, value, stored, dropped, not_durable) {
            Ok(outcome) => (outcome.into_value(), None),
            Err(ProcessError::Completed { value, error } | ProcessError::Unsettled { value, error }) => {
                (Some(value), Some(error))
            }
            Err(ProcessError::Replayed { value, error, .. }) => (value, Some(error)),
            Err(ProcessError::Idem(e) | ProcessError::Work(e)) => (None, Some(e)),
        };
        let item = self.answer(index, status, job.attempt);
        (item.value, item.error, item.result_stored) = (value, error.map(KeyError::Idem), stored);
    }

    fn settled(&mut self, p: Pending<T>, status: BatchStatus, error: Option<Error>) {
        let item = self.answer(p.index, status, p.job.attempt);
        (item.value, item.error) = (Some(p.value), error.map(KeyError::Idem));
    }

    /// Each key's answer, in order.
    pub fn finish(self) -> Vec<BatchItem<T, E>> {
        self.items.into_iter().map(|item| item.expect("every key answered")).collect()
    }
}

impl<C> Core<C> {
    /// The batch's claims (and their `WAIT`s) read: replays, busy keys and
    /// errors answered, claims not durable given back, the granted keys'
    /// run hook called (a panic releases the key).
    pub fn many<T, E>(&self, keys: &[&str], claims: Vec<Answer<Claim>>) -> Many<T, E>
    where
        C: Codec<T>,
    {
        let mut many = Many {
            items: (0..keys.len()).map(|_| None).collect(),
            keys: keys.iter().map(|k| k.to_string()).collect(),
            jobs: Vec::new(),
            dones: Vec::new(),
            checks: Vec::new(),
            releases: Vec::new(),
        };
        for (index, (claim, ack)) in claims.into_iter().enumerate() {
            let key = keys[index];
            let attempt = claim.as_ref().map_or(0, Claim::attempt);
            let step =
                claim.and_then(|claim| self.on_claim::<T>(key, Ok(claim), ack, &mut Backoff::new(Duration::ZERO)));
            match step {
                Ok(Step::Work(job, token)) => match self.before_work(&job) {
                    Ok(()) => many.jobs.push((index, job, token)),
                    Err(hook) => many.failed(index, job, token, ReleaseReason::Hook, KeyError::Idem(hook)),
                },
                Ok(Step::Release(job, token, error)) => {
                    many.answer(index, BatchStatus::NotDurable, attempt).error = Some(KeyError::Idem(error));
                    many.releases.push((job, token, None));
                }
                Ok(Step::Undurable { value, attempt, error }) => {
                    let item = many.answer(index, BatchStatus::NotDurable, attempt);
                    (item.value, item.error) = (value, Some(KeyError::Idem(error)));
                }
                Ok(Step::Return(Outcome::Replayed { value, attempt })) => {
                    many.answer(index, BatchStatus::Replayed, attempt).value = value;
                }
                Ok(Step::Busy(lease_left)) => {
                    let error = self.busy(key, lease_left, Ok(None));
                    many.answer(index, BatchStatus::Busy, attempt).error = Some(KeyError::Idem(error));
                }
                Ok(Step::Return(Outcome::Completed { .. }) | Step::Again(_)) => unreachable!("a claim without wait"),
                Err(error) => {
                    let status = match error {
                        Error::Mismatch { .. } => BatchStatus::Mismatch,
                        Error::Exhausted { .. } => BatchStatus::Exhausted,
                        _ => BatchStatus::Error,
                    };
                    many.answer(index, status, attempt).error = Some(KeyError::Idem(error));
                }
            }
        }
        many
    }
}
