//! The consumer loop's decisions, shared by the sync and the async
//! [`Idem`](crate::Idem): which claim to send, what its answer means, how
//! the result is stored. The two front ends only do the I/O.
use crate::cmd::{self, ClaimOptions, DoneOptions, Edition, MAX_BATCH};
use crate::codec::Codec;
use crate::error::{Error, ProcessError};
use crate::options::{Attempt, Counters, Event, Options, Outcome, ProcessOptions, bump};
use crate::reply::{Claim, Done, Granted};
use redis::Cmd;
#[cfg(feature = "cluster")]
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

pub(crate) struct Core<C> {
    pub options: Options,
    pub edition: Edition,
    pub counters: Counters,
    pub codec: C,
}

/// What the loop does after a claim's answer.
pub(crate) enum Step<T> {
    Work(Attempt, String),
    Return(Outcome<T>),
    /// Claim again after this pause (polling on the Functions edition;
    /// zero after a module WAIT that ended without an answer).
    Again(Duration),
}

/// The polling of a BUSY key where WAIT is not available.
pub(crate) struct Backoff {
    pub deadline: Instant,
    next: Duration,
    waited: bool,
}

impl Backoff {
    pub fn new(wait: Duration) -> Backoff {
        Backoff { deadline: Instant::now() + wait, next: Duration::from_millis(10), waited: false }
    }
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }
    /// The next pause: doubling from 10 ms to 1 s, never past the lease's
    /// end (the holder's key may be free then) nor the deadline.
    fn pause(&mut self, lease_left: Duration) -> Duration {
        let pause = self.next.min(lease_left.max(Duration::from_millis(1))).min(self.remaining());
        self.next = (self.next * 2).min(Duration::from_secs(1));
        pause
    }
}

impl<C> Core<C> {
    pub fn key(&self, key: &str) -> String {
        format!("{}{key}", self.options.prefix)
    }

    pub fn emit(&self, event: Event<'_>) {
        if let Some(hook) = &self.options.hook {
            hook(&event);
        }
    }

    /// Replies to wait for at most this long (a WAIT's reply comes after it).
    pub fn response_timeout(&self) -> Duration {
        self.options.wait.min(Duration::from_secs(3600)) + Duration::from_secs(5)
    }

    pub fn claim_options(&self, call: &ProcessOptions, wait: Duration) -> ClaimOptions {
        ClaimOptions {
            payload: call.payload.clone(),
            max_tries: self.options.max_tries,
            bloom: self.options.bloom.clone(),
            wait: (self.edition == Edition::Module && !wait.is_zero()).then_some(wait),
        }
    }

    /// The loop's next claim: the first one without WAIT (so that a busy
    /// key is seen, counted and reported), the next ones on the module with
    /// WAIT for the time left.
    pub fn loop_claim_options(&self, call: &ProcessOptions, backoff: &Backoff) -> ClaimOptions {
        self.claim_options(call, if backoff.waited { backoff.remaining() } else { Duration::ZERO })
    }

    /// A claim's answer: work, return, or claim again.
    pub fn on_claim<T>(&self, key: &str, claim: Result<Claim, Error>, backoff: &mut Backoff) -> Result<Step<T>, Error>
    where
        C: Codec<T>,
    {
        let claim = match claim {
            // A waiter whose record left its node (cluster): claim again,
            // redis-rs routes it to the key's node.
            Err(Error::Redis(e)) if e.code() == Some("TRYAGAIN") && !backoff.remaining().is_zero() => {
                return Ok(Step::Again(Duration::from_millis(10)));
            }
            other => other?,
        };
        if let Some(granted) = claim.granted() {
            let attempt = claim.attempt();
            let (Claim::New { token, .. } | Claim::Seen { token, .. } | Claim::Retry { token, .. }) = claim else {
                unreachable!()
            };
            bump(match granted {
                Granted::New => &self.counters.first_runs,
                Granted::Seen | Granted::Retry => &self.counters.retries,
            });
            self.emit(Event::Claimed { key, granted, attempt });
            let lost = Arc::new(AtomicBool::new(false));
            return Ok(Step::Work(Attempt { number: attempt, granted, key: key.to_string(), lost }, token));
        }
        match claim {
            Claim::Done { result, attempt } => {
                bump(&self.counters.replays);
                self.emit(Event::Replayed { key, attempt });
                let value = result.map(|bytes| self.codec.decode(&bytes)).transpose().map_err(Error::Codec)?;
                Ok(Step::Return(Outcome::Replayed { value, attempt }))
            }
            Claim::Busy { lease_left, attempt } => {
                if backoff.remaining().is_zero() {
                    return Err(Error::Busy { key: key.to_string(), lease_left, attempt });
                }
                if !backoff.waited {
                    backoff.waited = true;
                    bump(&self.counters.waits);
                }
                self.emit(Event::Waiting { key, lease_left });
                Ok(Step::Again(match self.edition {
                    // A WAIT that ended BUSY used up the time: the next
                    // round finds the deadline passed.
                    Edition::Module => Duration::ZERO,
                    Edition::Functions => backoff.pause(lease_left),
                }))
            }
            Claim::Mismatch { attempt } => Err(Error::Mismatch { key: key.to_string(), attempt }),
            Claim::Exhausted { attempt } => Err(Error::Exhausted { key: key.to_string(), attempt }),
            Claim::New { .. } | Claim::Seen { .. } | Claim::Retry { .. } => unreachable!("granted above"),
        }
    }

    /// The DONE for a work's value: with its encoded result, or without it
    /// when the client-side limit says it is too large (then `Some(size)`).
    pub fn done_cmd<T>(&self, key: &str, token: &str, value: &T) -> Result<(Cmd, Option<usize>, usize), Error>
    where
        C: Codec<T>,
    {
        let bytes = self.codec.encode(value).map_err(Error::Codec)?;
        let size = bytes.len();
        let mut options =
            DoneOptions { result: Some(bytes), retain: self.options.retain, bloom: self.options.bloom.clone() };
        let omitted = self.options.max_result.filter(|max| size > *max).map(|_| size);
        if omitted.is_some() {
            options.result = None;
        }
        Ok((cmd::done(self.edition, key, token, &options)?, omitted, size))
    }

    /// The DONE without a result, after the server refused it as too large.
    pub fn done_without_result_cmd(&self, key: &str, token: &str) -> Result<Cmd, Error> {
        let options = DoneOptions { result: None, retain: self.options.retain, bloom: self.options.bloom.clone() };
        cmd::done(self.edition, key, token, &options)
    }

    /// What a DONE's answer makes of the call.
    pub fn on_done<T, E>(
        &self,
        attempt: &Attempt,
        value: T,
        done: Result<Done, Error>,
        omitted: Option<usize>,
        retried: bool,
    ) -> Result<Outcome<T>, ProcessError<E>> {
        let key = attempt.key.as_str();
        let done = match done {
            // Done already, and not by this call's own DONE sent twice: a
            // worker that took the key over completed it first.
            Ok(Done::AlreadyDone) if !retried => Err(Error::Stale(String::new())),
            other => other,
        };
        let done = match done {
            Ok(done) => done,
            Err(Error::Stale(_)) => {
                bump(&self.counters.leases_lost);
                self.emit(Event::LeaseLost { key, attempt: attempt.number });
                return Err(Error::LeaseLost { key: key.to_string(), attempt: attempt.number }.into());
            }
            Err(e) => return Err(e.into()),
        };
        bump(&self.counters.completed);
        self.emit(Event::Completed { key, attempt: attempt.number, done });
        if let Some(size) = omitted {
            bump(&self.counters.results_omitted);
            self.emit(Event::ResultOmitted { key, size });
            if self.options.oversize == crate::OversizePolicy::CompleteAndError {
                return Err(Error::ResultTooLarge { key: key.to_string(), size }.into());
            }
        }
        let result_stored = omitted.is_none() && matches!(done, Done::Completed { result_dropped: false, .. });
        Ok(Outcome::Completed { value, attempt: attempt.number, granted: attempt.granted, done, result_stored })
    }

    pub fn on_released(&self, attempt: &Attempt) {
        bump(&self.counters.released);
        self.emit(Event::Released { key: &attempt.key, attempt: attempt.number });
    }

    /// The heartbeat's EXTEND answer: false when the claim is lost.
    pub fn on_extend(&self, attempt: &Attempt, reply: Result<(), Error>) -> bool {
        match reply {
            Ok(()) => {
                bump(&self.counters.extends);
                true
            }
            Err(Error::Stale(_)) => {
                attempt.lost.store(true, std::sync::atomic::Ordering::Relaxed);
                false
            }
            // A connection error: the next beat tries again.
            Err(_) => true,
        }
    }
}

/// The batches for `keys`: in a cluster one group per slot, every group at
/// most 10000 keys; each group the keys' indices in order.
pub(crate) fn batches(keys: &[String], cluster: bool) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    #[cfg(feature = "cluster")]
    if cluster {
        use redis::cluster_routing::Slot;
        let mut by_slot: HashMap<Slot, usize> = HashMap::new();
        for (i, key) in keys.iter().enumerate() {
            let slot = Slot::for_key(key.as_bytes());
            let group = *by_slot.entry(slot).or_insert_with(|| {
                groups.push(Vec::new());
                groups.len() - 1
            });
            groups[group].push(i);
        }
        return chunked(groups);
    }
    let _ = cluster;
    if !keys.is_empty() {
        groups.push((0..keys.len()).collect());
    }
    chunked(groups)
}

fn chunked(groups: Vec<Vec<usize>>) -> Vec<Vec<usize>> {
    groups.into_iter().flat_map(|g| g.chunks(MAX_BATCH).map(<[usize]>::to_vec).collect::<Vec<_>>()).collect()
}
