//! The sync client: [`Idem`], the consumer loop as one call, the commands of
//! either edition, batches.
use crate::cmd::{self, ClaimOptions, DoneOptions, Edition};
use crate::codec::{Codec, DefaultCodec};
use crate::commands::{decode, decode_each, detect_edition, extended, flag};
use crate::error::{Error, ProcessError};
use crate::flow::{Backoff, Core, Step, batches};
use crate::options::{Attempt, Counters, Options, Outcome, ProcessOptions, Stats};
use crate::reply::{Claim, Done, Record};
use crate::source::ConnectionSource;
use redis::{Cmd, RedisResult, Value};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Mutex;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

/// A redis-idem client on a connection source (`redis::Client` or
/// `redis::cluster::ClusterClient`), for any number of threads.
///
/// ```no_run
/// use redis_idem_client::{Idem, Options};
/// # fn charge(order: &str, attempt: u64) -> Result<String, std::io::Error> { Ok(String::new()) }
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let idem = Idem::with_options(redis::Client::open("redis://127.0.0.1/")?, Options::new().prefix("shop:"))?;
/// let receipt = idem.process("order:1001", |attempt| charge("1001", attempt.number))?;
/// println!("{:?} (replayed: {})", receipt.value(), receipt.is_replay());
/// # Ok(()) }
/// ```
pub struct Idem<S: ConnectionSource, C = DefaultCodec> {
    source: S,
    core: Core<C>,
    pool: Mutex<Vec<S::Connection>>,
}

/// A connection of the pool, back in it when dropped unless it failed.
struct Pooled<'a, S: ConnectionSource, C> {
    idem: &'a Idem<S, C>,
    con: Option<S::Connection>,
}

impl<S: ConnectionSource, C> Pooled<'_, S, C> {
    fn con(&mut self) -> &mut S::Connection {
        self.con.as_mut().expect("a pooled connection")
    }
    /// Sends a command to `key`'s node; a connection error drops the
    /// connection instead of pooling it.
    fn send(&mut self, cmd: &Cmd, key: &str) -> RedisResult<Value> {
        let reply = self.idem.source.route(self.con(), cmd, key.as_bytes());
        if let Err(e) = &reply
            && (e.is_io_error() || e.is_connection_dropped() || e.is_timeout() || e.is_unrecoverable_error())
        {
            self.con = None;
        }
        reply
    }
}

impl<S: ConnectionSource, C> Drop for Pooled<'_, S, C> {
    fn drop(&mut self) {
        if let Some(con) = self.con.take()
            && let Ok(mut pool) = self.idem.pool.lock()
            && pool.len() < 64
        {
            pool.push(con);
        }
    }
}

/// One answer per key of [`Idem::process_batch`], in order.
pub type BatchOutcomes<T, E> = Vec<Result<Outcome<T>, ProcessError<E>>>;

impl<S: ConnectionSource> Idem<S, DefaultCodec> {
    /// A client with the default [`Options`]; asks the server which edition
    /// it has.
    pub fn new(source: S) -> Result<Self, Error> {
        Self::with_options(source, Options::default())
    }

    pub fn with_options(source: S, options: Options) -> Result<Self, Error> {
        Self::with_codec(source, options, DefaultCodec::default())
    }
}

impl<S: ConnectionSource, C> Idem<S, C> {
    /// A client storing results with `codec`.
    pub fn with_codec(source: S, options: Options, codec: C) -> Result<Self, Error> {
        let response_timeout = options.wait.min(Duration::from_secs(3600)) + Duration::from_secs(5);
        let mut con = source.connect(response_timeout)?;
        let edition = match options.edition {
            Some(edition) => edition,
            None => detect_edition(&mut con)?,
        };
        Ok(Idem {
            source,
            core: Core { edition, options, counters: Counters::default(), codec },
            pool: Mutex::new(vec![con]),
        })
    }

    /// The edition this client uses.
    pub fn edition(&self) -> Edition {
        self.core.edition
    }

    pub fn options(&self) -> &Options {
        &self.core.options
    }

    /// The consumer loop's counters so far.
    pub fn stats(&self) -> Stats {
        self.core.counters.snapshot()
    }

    /// The record key for `key` (the prefix put before it).
    pub fn key(&self, key: &str) -> String {
        self.core.key(key)
    }

    fn connection(&self) -> Result<Pooled<'_, S, C>, Error> {
        let pooled = self.pool.lock().ok().and_then(|mut pool| pool.pop());
        let con = match pooled {
            Some(con) => con,
            None => self.source.connect(self.core.response_timeout())?,
        };
        Ok(Pooled { idem: self, con: Some(con) })
    }

    fn send(&self, cmd: &Cmd, key: &str) -> Result<RedisResult<Value>, Error> {
        Ok(self.connection()?.send(cmd, key))
    }

    /// Runs `work` once for `key`, however often it is called for it.
    ///
    /// Claims the key. On NEW, RETRY or SEEN runs `work` with the
    /// [`Attempt`] (its `number` is the fencing number) while a thread
    /// renews the lease (EXTEND every [`Options::heartbeat`]), then records
    /// its result (DONE, encoded by the codec), or gives the claim back
    /// (RELEASE) when it returns an error or panics. On DONE returns the
    /// stored result without running `work`. On BUSY waits for the holder
    /// (up to [`Options::wait`]) and returns its result. MISMATCH,
    /// EXHAUSTED, a key still BUSY and a lost lease are errors.
    pub fn process<T, E, F>(&self, key: &str, work: F) -> Result<Outcome<T>, ProcessError<E>>
    where
        C: Codec<T>,
        F: FnOnce(&Attempt) -> Result<T, E>,
    {
        self.process_with(key, &ProcessOptions::default(), work)
    }

    /// [`process`](Self::process) with per-call options (the payload).
    pub fn process_with<T, E, F>(
        &self,
        key: &str,
        call: &ProcessOptions,
        work: F,
    ) -> Result<Outcome<T>, ProcessError<E>>
    where
        C: Codec<T>,
        F: FnOnce(&Attempt) -> Result<T, E>,
    {
        let key = self.core.key(key);
        let mut backoff = Backoff::new(self.core.options.wait);
        let (attempt, token) = loop {
            let options = self.core.loop_claim_options(call, &backoff);
            let cmd = cmd::claim(self.core.edition, &key, self.core.options.lease, &options)?;
            let claim = self.send(&cmd, &key).and_then(decode);
            match self.core.on_claim(&key, claim, &mut backoff)? {
                Step::Work(attempt, token) => break (attempt, token),
                Step::Return(outcome) => return Ok(outcome),
                Step::Again(pause) => std::thread::sleep(pause),
            }
        };
        let ran = std::thread::scope(|scope| {
            let (stop, stopped) = mpsc::channel::<()>();
            let heartbeat = scope.spawn(|| self.heartbeat(&attempt, &token, stopped));
            let ran = catch_unwind(AssertUnwindSafe(|| work(&attempt)));
            drop(stop);
            let _ = heartbeat.join();
            ran
        });
        match ran {
            Ok(Ok(value)) => self.complete(&attempt, &token, value),
            Ok(Err(error)) => {
                self.give_back(&attempt, &token);
                Err(ProcessError::Work(error))
            }
            Err(panic) => {
                self.give_back(&attempt, &token);
                resume_unwind(panic)
            }
        }
    }

    /// EXTEND every beat until `stopped` closes or the claim is lost.
    fn heartbeat(&self, attempt: &Attempt, token: &str, stopped: mpsc::Receiver<()>) {
        let extend = cmd::extend(self.core.edition, &attempt.key, token, self.core.options.lease);
        loop {
            match stopped.recv_timeout(self.core.options.heartbeat_interval()) {
                Err(RecvTimeoutError::Timeout) => {}
                _ => return,
            }
            let reply = self.send(&extend, &attempt.key).and_then(extended);
            if !self.core.on_extend(attempt, reply) {
                return;
            }
        }
    }

    fn complete<T, E>(&self, attempt: &Attempt, token: &str, value: T) -> Result<Outcome<T>, ProcessError<E>>
    where
        C: Codec<T>,
    {
        let (cmd, mut omitted, size) = self.core.done_cmd(&attempt.key, token, &value)?;
        let (mut done, mut retried) = self.done_retrying(&cmd, &attempt.key);
        if matches!(&done, Err(e) if e.is_result_too_large()) {
            omitted = Some(size);
            (done, retried) =
                self.done_retrying(&self.core.done_without_result_cmd(&attempt.key, token)?, &attempt.key);
        }
        self.core.on_done(attempt, value, done, omitted, retried)
    }

    /// DONE, once more on a fresh connection if the connection failed (a
    /// DONE that went through answers 0 the second time).
    fn done_retrying(&self, cmd: &Cmd, key: &str) -> (Result<Done, Error>, bool) {
        match self.send(cmd, key).and_then(decode) {
            Err(e) if e.is_connection_error() => (self.send(cmd, key).and_then(decode), true),
            other => (other, false),
        }
    }

    fn give_back(&self, attempt: &Attempt, token: &str) {
        // Best effort: if it fails the lease lapses and the key is retried.
        let _ = self.send(&cmd::release(self.core.edition, &attempt.key, token), &attempt.key);
        self.core.on_released(attempt);
    }

    // --- the commands, on the edition the server has (keys get the prefix) ---

    /// `IDEM.CLAIM` / `idem_claim`. WAIT and BLOOM are refused on the
    /// Functions edition ([`Error::Unsupported`]).
    pub fn claim(&self, key: &str, lease: Duration, options: &ClaimOptions) -> Result<Claim, Error> {
        let key = self.core.key(key);
        decode(self.send(&cmd::claim(self.core.edition, &key, lease, options)?, &key)?)
    }

    pub fn done(&self, key: &str, token: &str, options: &DoneOptions) -> Result<Done, Error> {
        let key = self.core.key(key);
        decode(self.send(&cmd::done(self.core.edition, &key, token, options)?, &key)?)
    }

    pub fn release(&self, key: &str, token: &str) -> Result<bool, Error> {
        let key = self.core.key(key);
        flag(self.send(&cmd::release(self.core.edition, &key, token), &key)?)
    }

    pub fn extend(&self, key: &str, token: &str, lease: Duration) -> Result<(), Error> {
        let key = self.core.key(key);
        extended(self.send(&cmd::extend(self.core.edition, &key, token, lease), &key)?)
    }

    pub fn get(&self, key: &str) -> Result<Option<Record>, Error> {
        let key = self.core.key(key);
        decode(self.send(&cmd::get(self.core.edition, &key), &key)?)
    }

    pub fn once(&self, key: &str, retain: Duration) -> Result<bool, Error> {
        let key = self.core.key(key);
        flag(self.send(&cmd::once(self.core.edition, &key, retain), &key)?)
    }

    // --- batches ---

    /// Claims many keys with the instance's lease, MAXTRIES and BLOOM: one
    /// answer per key, in order. `IDEM.MCLAIM` per slot (in a cluster) and
    /// per 10000 keys; one `idem_claim` per key on the Functions edition.
    /// No WAIT: a BUSY key answers BUSY.
    pub fn claim_batch(&self, keys: &[&str], payloads: Option<&[Vec<u8>]>) -> Result<Vec<Result<Claim, Error>>, Error> {
        if payloads.is_some_and(|p| p.len() != keys.len()) {
            return Err(Error::Unsupported("claim_batch takes one payload per key".into()));
        }
        let keys: Vec<String> = keys.iter().map(|k| self.core.key(k)).collect();
        let opts = &self.core.options;
        if self.core.edition == Edition::Functions {
            return Ok(keys
                .iter()
                .enumerate()
                .map(|(i, key)| {
                    let options = ClaimOptions {
                        payload: payloads.map(|p| p[i].clone()),
                        max_tries: opts.max_tries,
                        bloom: opts.bloom.clone(),
                        wait: None,
                    };
                    decode(self.send(&cmd::claim(self.core.edition, key, opts.lease, &options)?, key)?)
                })
                .collect());
        }
        let mut answers: Vec<Option<Result<Claim, Error>>> = (0..keys.len()).map(|_| None).collect();
        for group in batches(&keys, self.source.is_cluster()) {
            let group_keys: Vec<&str> = group.iter().map(|&i| keys[i].as_str()).collect();
            let group_payloads: Option<Vec<Vec<u8>>> = payloads.map(|p| group.iter().map(|&i| p[i].clone()).collect());
            let cmd = cmd::mclaim(
                self.core.edition,
                &group_keys,
                opts.lease,
                group_payloads.as_deref(),
                opts.max_tries,
                opts.bloom.as_deref(),
            )?;
            let each = decode_each(self.send(&cmd, group_keys[0])?, group.len())?;
            for (i, answer) in group.into_iter().zip(each) {
                answers[i] = Some(answer);
            }
        }
        Ok(answers.into_iter().map(|a| a.expect("every key answered")).collect())
    }

    /// Completes many claims (key, token, result) with the instance's
    /// RETAIN and BLOOM: one answer per key, in order. `IDEM.MDONE` per slot
    /// and per 10000 keys (results given and not given in separate calls);
    /// one `idem_done` per key on the Functions edition.
    pub fn complete_batch(&self, items: &[(&str, &str, Option<Vec<u8>>)]) -> Result<Vec<Result<Done, Error>>, Error> {
        let keys: Vec<String> = items.iter().map(|(k, _, _)| self.core.key(k)).collect();
        let opts = &self.core.options;
        if self.core.edition == Edition::Functions {
            return Ok(items
                .iter()
                .zip(&keys)
                .map(|((_, token, result), key)| {
                    let options =
                        DoneOptions { result: result.clone(), retain: opts.retain, bloom: opts.bloom.clone() };
                    decode(self.send(&cmd::done(self.core.edition, key, token, &options)?, key)?)
                })
                .collect());
        }
        let mut answers: Vec<Option<Result<Done, Error>>> = (0..keys.len()).map(|_| None).collect();
        for with_result in [true, false] {
            let picked: Vec<usize> = (0..items.len()).filter(|&i| items[i].2.is_some() == with_result).collect();
            let picked_keys: Vec<String> = picked.iter().map(|&i| keys[i].clone()).collect();
            for group in batches(&picked_keys, self.source.is_cluster()) {
                let group: Vec<usize> = group.into_iter().map(|j| picked[j]).collect();
                let pairs: Vec<(&str, String)> =
                    group.iter().map(|&i| (keys[i].as_str(), items[i].1.to_string())).collect();
                let results: Option<Vec<Vec<u8>>> =
                    with_result.then(|| group.iter().map(|&i| items[i].2.clone().unwrap_or_default()).collect());
                let cmd =
                    cmd::mdone(self.core.edition, &pairs, results.as_deref(), opts.retain, opts.bloom.as_deref())?;
                let each = decode_each(self.send(&cmd, pairs[0].0)?, group.len())?;
                for (i, answer) in group.into_iter().zip(each) {
                    answers[i] = Some(answer);
                }
            }
        }
        Ok(answers.into_iter().map(|a| a.expect("every key answered")).collect())
    }

    /// Releases many claims (key, token): one answer per key, in order.
    pub fn release_batch(&self, items: &[(&str, &str)]) -> Result<Vec<Result<bool, Error>>, Error> {
        let keys: Vec<String> = items.iter().map(|(k, _)| self.core.key(k)).collect();
        if self.core.edition == Edition::Functions {
            return Ok(items
                .iter()
                .zip(&keys)
                .map(|((_, token), key)| flag(self.send(&cmd::release(self.core.edition, key, token), key)?))
                .collect());
        }
        let mut answers: Vec<Option<Result<bool, Error>>> = (0..keys.len()).map(|_| None).collect();
        for group in batches(&keys, self.source.is_cluster()) {
            let pairs: Vec<(&str, String)> =
                group.iter().map(|&i| (keys[i].as_str(), items[i].1.to_string())).collect();
            let cmd = cmd::mrelease(self.core.edition, &pairs)?;
            let each: Vec<Result<i64, Error>> = decode_each(self.send(&cmd, pairs[0].0)?, group.len())?;
            for (i, answer) in group.into_iter().zip(each) {
                answers[i] = Some(answer.map(|n| n == 1));
            }
        }
        Ok(answers.into_iter().map(|a| a.expect("every key answered")).collect())
    }

    /// Runs `work` for each key of a batch that is not done yet: one
    /// [`claim_batch`](Self::claim_batch), the work key by key (no
    /// heartbeat: the instance's lease must cover the whole batch), then
    /// one [`complete_batch`](Self::complete_batch) for the results and one
    /// [`release_batch`](Self::release_batch) for the failures. One answer
    /// per key, in order; a BUSY key is [`Error::Busy`] at once.
    pub fn process_batch<T, E, F>(&self, keys: &[&str], mut work: F) -> Result<BatchOutcomes<T, E>, Error>
    where
        C: Codec<T>,
        F: FnMut(&Attempt) -> Result<T, E>,
    {
        let claims = self.claim_batch(keys, None)?;
        let mut answers: Vec<Option<Result<Outcome<T>, ProcessError<E>>>> = (0..keys.len()).map(|_| None).collect();
        let (mut to_complete, mut values, mut to_release) = (Vec::new(), Vec::new(), Vec::new());
        for (i, claim) in claims.into_iter().enumerate() {
            let key = self.core.key(keys[i]);
            let mut no_wait = Backoff::new(Duration::ZERO);
            match claim.and_then(|claim| self.core.on_claim::<T>(&key, Ok(claim), &mut no_wait)) {
                Ok(Step::Work(attempt, token)) => match work(&attempt) {
                    Ok(value) => {
                        let bytes = self.core.codec.encode(&value).map_err(Error::Codec);
                        match bytes {
                            Ok(bytes) => {
                                to_complete.push((i, attempt, token, bytes));
                                values.push(value);
                            }
                            Err(e) => {
                                to_release.push((i, attempt, token));
                                answers[i] = Some(Err(e.into()));
                            }
                        }
                    }
                    Err(e) => {
                        to_release.push((i, attempt, token));
                        answers[i] = Some(Err(ProcessError::Work(e)));
                    }
                },
                Ok(Step::Return(outcome)) => answers[i] = Some(Ok(outcome)),
                Ok(Step::Again(_)) => unreachable!("no waiting in a batch"),
                Err(e) => answers[i] = Some(Err(e.into())),
            }
        }
        if !to_release.is_empty() {
            let items: Vec<(&str, &str)> = to_release.iter().map(|(i, _, token)| (keys[*i], token.as_str())).collect();
            let _ = self.release_batch(&items); // best effort, as in process
            for (_, attempt, _) in &to_release {
                self.core.on_released(attempt);
            }
        }
        if !to_complete.is_empty() {
            let max = self.core.options.max_result;
            let items: Vec<(&str, &str, Option<Vec<u8>>)> = to_complete
                .iter()
                .map(|(i, _, token, bytes)| {
                    (keys[*i], token.as_str(), max.is_none_or(|max| bytes.len() <= max).then(|| bytes.clone()))
                })
                .collect();
            let dones = self.complete_batch(&items)?;
            for (((i, attempt, _, bytes), value), done) in to_complete.into_iter().zip(values).zip(dones) {
                let omitted = max.filter(|max| bytes.len() > *max).map(|_| bytes.len());
                answers[i] = Some(self.core.on_done(&attempt, value, done, omitted, false));
            }
        }
        Ok(answers.into_iter().map(|a| a.expect("every key answered")).collect())
    }
}

impl<S: ConnectionSource, C> std::fmt::Debug for Idem<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idem").field("edition", &self.core.edition).field("options", &self.core.options).finish()
    }
}

#[allow(dead_code)]
fn assert_send_sync<S: ConnectionSource>(idem: Idem<S>) -> impl Send + Sync {
    idem
}
