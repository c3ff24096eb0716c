//! The tokio client: [`AsyncIdem`], the same API as [`Idem`](crate::Idem)
//! with `async` calls; the heartbeat is a tokio task.
use crate::cmd::{self, ClaimOptions, DoneOptions, Edition};
use crate::codec::{Codec, DefaultCodec};
use crate::commands::{decode, decode_each, detect_edition_async, extended, flag};
use crate::error::{Error, ProcessError};
use crate::flow::{Backoff, Core, Step, batches};
use crate::options::{Attempt, Counters, Options, Outcome, ProcessOptions, Stats};
use crate::reply::{Claim, Done, Record};
use crate::source::AsyncConnectionSource;
use redis::{Cmd, RedisResult, Value};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A redis-idem client for tokio, on `redis::Client` or (feature
/// `cluster-async`) `redis::cluster::ClusterClient`. Cheap to clone; one
/// instance serves any number of tasks.
///
/// Commands share one multiplexed connection; a claim that waits (WAIT)
/// takes a connection of its own, so that it does not hold up the others.
///
/// ```no_run
/// use redis_idem_client::{AsyncIdem, Options};
/// # async fn charge(order: &str, attempt: u64) -> Result<String, std::io::Error> { Ok(String::new()) }
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let idem = AsyncIdem::with_options(redis::Client::open("redis://127.0.0.1/")?, Options::new().prefix("shop:")).await?;
/// let receipt = idem.process("order:1001", |attempt| async move { charge("1001", attempt.number).await }).await?;
/// # Ok(()) }
/// ```
pub struct AsyncIdem<S: AsyncConnectionSource, C = DefaultCodec> {
    inner: Arc<Inner<S, C>>,
}

impl<S: AsyncConnectionSource, C> Clone for AsyncIdem<S, C> {
    fn clone(&self) -> Self {
        AsyncIdem { inner: self.inner.clone() }
    }
}

struct Inner<S: AsyncConnectionSource, C> {
    source: S,
    core: Core<C>,
    shared: S::Connection,
    waiting: Mutex<Vec<S::Connection>>,
}

/// Aborts the heartbeat task when the call ends, however it ends (an error,
/// a panic of the work, the call's future dropped).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<S: AsyncConnectionSource> AsyncIdem<S, DefaultCodec> {
    pub async fn new(source: S) -> Result<Self, Error> {
        Self::with_options(source, Options::default()).await
    }
    pub async fn with_options(source: S, options: Options) -> Result<Self, Error> {
        Self::with_codec(source, options, DefaultCodec::default()).await
    }
}

impl<S: AsyncConnectionSource, C: Send + Sync + 'static> AsyncIdem<S, C> {
    /// A client storing results with `codec`; asks the server which edition
    /// it has unless [`Options::edition`] says.
    pub async fn with_codec(source: S, options: Options, codec: C) -> Result<Self, Error> {
        let core =
            Core { edition: options.edition.unwrap_or(Edition::Module), options, counters: Counters::default(), codec };
        let mut shared = source.connect(core.response_timeout()).await?;
        let edition = match core.options.edition {
            Some(edition) => edition,
            None => detect_edition_async(&mut shared).await?,
        };
        let core = Core { edition, ..core };
        Ok(AsyncIdem { inner: Arc::new(Inner { source, core, shared, waiting: Mutex::new(Vec::new()) }) })
    }

    pub fn edition(&self) -> Edition {
        self.inner.core.edition
    }

    pub fn options(&self) -> &Options {
        &self.inner.core.options
    }

    pub fn stats(&self) -> Stats {
        self.inner.core.counters.snapshot()
    }

    pub fn key(&self, key: &str) -> String {
        self.inner.core.key(key)
    }

    async fn send(&self, cmd: Cmd, key: &str) -> RedisResult<Value> {
        let mut con = self.inner.shared.clone();
        self.inner.source.route(&mut con, cmd, key.as_bytes().to_vec()).await
    }

    /// A claim that may block (WAIT), on a connection of its own.
    async fn send_waiting(&self, cmd: Cmd, key: &str) -> Result<RedisResult<Value>, Error> {
        let pooled = self.inner.waiting.lock().ok().and_then(|mut pool| pool.pop());
        let mut con = match pooled {
            Some(con) => con,
            None => self.inner.source.connect(self.inner.core.response_timeout()).await?,
        };
        let reply = self.inner.source.route(&mut con, cmd, key.as_bytes().to_vec()).await;
        if reply.is_ok()
            && let Ok(mut pool) = self.inner.waiting.lock()
            && pool.len() < 64
        {
            pool.push(con);
        }
        Ok(reply)
    }

    /// Runs `work` once for `key`, however often it is called for it: as
    /// [`Idem::process`](crate::Idem::process), with the heartbeat in a
    /// tokio task. If the work panics or the call's future is dropped, the
    /// heartbeat stops and the claim lapses at the end of its lease (the
    /// next claim is a RETRY).
    pub async fn process<T, E, F, Fut>(&self, key: &str, work: F) -> Result<Outcome<T>, ProcessError<E>>
    where
        C: Codec<T>,
        F: FnOnce(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.process_with(key, &ProcessOptions::default(), work).await
    }

    pub async fn process_with<T, E, F, Fut>(
        &self,
        key: &str,
        call: &ProcessOptions,
        work: F,
    ) -> Result<Outcome<T>, ProcessError<E>>
    where
        C: Codec<T>,
        F: FnOnce(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let core = &self.inner.core;
        let key = core.key(key);
        let mut backoff = Backoff::new(core.options.wait);
        let (attempt, token) = loop {
            let options = core.loop_claim_options(call, &backoff);
            let cmd = cmd::claim(core.edition, &key, core.options.lease, &options)?;
            let reply =
                if options.wait.is_some() { self.send_waiting(cmd, &key).await? } else { self.send(cmd, &key).await };
            match core.on_claim(&key, decode(reply), &mut backoff)? {
                Step::Work(attempt, token) => break (attempt, token),
                Step::Return(outcome) => return Ok(outcome),
                Step::Again(pause) => tokio::time::sleep(pause).await,
            }
        };
        let heartbeat = AbortOnDrop(tokio::spawn(self.clone().heartbeat(attempt.clone(), token.clone())));
        let ran = work(attempt.clone()).await;
        drop(heartbeat);
        match ran {
            Ok(value) => self.complete(&attempt, &token, value).await,
            Err(error) => {
                // Best effort: if it fails the lease lapses and the key is retried.
                let _ = self.send(cmd::release(core.edition, &attempt.key, &token), &attempt.key).await;
                core.on_released(&attempt);
                Err(ProcessError::Work(error))
            }
        }
    }

    async fn heartbeat(self, attempt: Attempt, token: String) {
        let core = &self.inner.core;
        let every = core.options.heartbeat_interval();
        loop {
            tokio::time::sleep(every).await;
            let extend = cmd::extend(core.edition, &attempt.key, &token, core.options.lease);
            let reply = extended(self.send(extend, &attempt.key).await);
            if !core.on_extend(&attempt, reply) {
                return;
            }
        }
    }

    async fn complete<T, E>(&self, attempt: &Attempt, token: &str, value: T) -> Result<Outcome<T>, ProcessError<E>>
    where
        C: Codec<T>,
    {
        let core = &self.inner.core;
        let (cmd, mut omitted, size) = core.done_cmd(&attempt.key, token, &value)?;
        let (mut done, mut retried) = self.done_retrying(cmd, &attempt.key).await;
        if matches!(&done, Err(e) if e.is_result_too_large()) {
            omitted = Some(size);
            (done, retried) =
                self.done_retrying(core.done_without_result_cmd(&attempt.key, token)?, &attempt.key).await;
        }
        core.on_done(attempt, value, done, omitted, retried)
    }

    async fn done_retrying(&self, cmd: Cmd, key: &str) -> (Result<Done, Error>, bool) {
        match decode(self.send(cmd.clone(), key).await) {
            Err(e) if e.is_connection_error() => (decode(self.send(cmd, key).await), true),
            other => (other, false),
        }
    }

    // --- the commands, on the edition the server has (keys get the prefix) ---

    pub async fn claim(&self, key: &str, lease: Duration, options: &ClaimOptions) -> Result<Claim, Error> {
        let key = self.key(key);
        let cmd = cmd::claim(self.edition(), &key, lease, options)?;
        let reply = if options.wait.is_some_and(|w| !w.is_zero()) {
            self.send_waiting(cmd, &key).await?
        } else {
            self.send(cmd, &key).await
        };
        decode(reply)
    }

    pub async fn done(&self, key: &str, token: &str, options: &DoneOptions) -> Result<Done, Error> {
        let key = self.key(key);
        decode(self.send(cmd::done(self.edition(), &key, token, options)?, &key).await)
    }

    pub async fn release(&self, key: &str, token: &str) -> Result<bool, Error> {
        let key = self.key(key);
        flag(self.send(cmd::release(self.edition(), &key, token), &key).await)
    }

    pub async fn extend(&self, key: &str, token: &str, lease: Duration) -> Result<(), Error> {
        let key = self.key(key);
        extended(self.send(cmd::extend(self.edition(), &key, token, lease), &key).await)
    }

    pub async fn get(&self, key: &str) -> Result<Option<Record>, Error> {
        let key = self.key(key);
        decode(self.send(cmd::get(self.edition(), &key), &key).await)
    }

    pub async fn once(&self, key: &str, retain: Duration) -> Result<bool, Error> {
        let key = self.key(key);
        flag(self.send(cmd::once(self.edition(), &key, retain), &key).await)
    }

    // --- batches, as Idem's ---

    pub async fn claim_batch(
        &self,
        keys: &[&str],
        payloads: Option<&[Vec<u8>]>,
    ) -> Result<Vec<Result<Claim, Error>>, Error> {
        if payloads.is_some_and(|p| p.len() != keys.len()) {
            return Err(Error::Unsupported("claim_batch takes one payload per key".into()));
        }
        let core = &self.inner.core;
        let opts = &core.options;
        let keys: Vec<String> = keys.iter().map(|k| core.key(k)).collect();
        if core.edition == Edition::Functions {
            let mut answers = Vec::with_capacity(keys.len());
            for (i, key) in keys.iter().enumerate() {
                let options = ClaimOptions {
                    payload: payloads.map(|p| p[i].clone()),
                    max_tries: opts.max_tries,
                    bloom: opts.bloom.clone(),
                    wait: None,
                };
                answers.push(match cmd::claim(core.edition, key, opts.lease, &options) {
                    Ok(cmd) => decode(self.send(cmd, key).await),
                    Err(e) => Err(e),
                });
            }
            return Ok(answers);
        }
        let mut answers: Vec<Option<Result<Claim, Error>>> = (0..keys.len()).map(|_| None).collect();
        for group in batches(&keys, self.inner.source.is_cluster()) {
            let group_keys: Vec<&str> = group.iter().map(|&i| keys[i].as_str()).collect();
            let group_payloads: Option<Vec<Vec<u8>>> = payloads.map(|p| group.iter().map(|&i| p[i].clone()).collect());
            let cmd = cmd::mclaim(
                core.edition,
                &group_keys,
                opts.lease,
                group_payloads.as_deref(),
                opts.max_tries,
                opts.bloom.as_deref(),
            )?;
            let each = decode_each(self.send(cmd, group_keys[0]).await, group.len())?;
            for (i, answer) in group.into_iter().zip(each) {
                answers[i] = Some(answer);
            }
        }
        Ok(answers.into_iter().map(|a| a.expect("every key answered")).collect())
    }

    pub async fn complete_batch(
        &self,
        items: &[(&str, &str, Option<Vec<u8>>)],
    ) -> Result<Vec<Result<Done, Error>>, Error> {
        let core = &self.inner.core;
        let opts = &core.options;
        let keys: Vec<String> = items.iter().map(|(k, _, _)| core.key(k)).collect();
        if core.edition == Edition::Functions {
            let mut answers = Vec::with_capacity(keys.len());
            for ((_, token, result), key) in items.iter().zip(&keys) {
                let options = DoneOptions { result: result.clone(), retain: opts.retain, bloom: opts.bloom.clone() };
                answers.push(match cmd::done(core.edition, key, token, &options) {
                    Ok(cmd) => decode(self.send(cmd, key).await),
                    Err(e) => Err(e),
                });
            }
            return Ok(answers);
        }
        let mut answers: Vec<Option<Result<Done, Error>>> = (0..keys.len()).map(|_| None).collect();
        for with_result in [true, false] {
            let picked: Vec<usize> = (0..items.len()).filter(|&i| items[i].2.is_some() == with_result).collect();
            let picked_keys: Vec<String> = picked.iter().map(|&i| keys[i].clone()).collect();
            for group in batches(&picked_keys, self.inner.source.is_cluster()) {
                let group: Vec<usize> = group.into_iter().map(|j| picked[j]).collect();
                let pairs: Vec<(&str, String)> =
                    group.iter().map(|&i| (keys[i].as_str(), items[i].1.to_string())).collect();
                let results: Option<Vec<Vec<u8>>> =
                    with_result.then(|| group.iter().map(|&i| items[i].2.clone().unwrap_or_default()).collect());
                let cmd = cmd::mdone(core.edition, &pairs, results.as_deref(), opts.retain, opts.bloom.as_deref())?;
                let each = decode_each(self.send(cmd, pairs[0].0).await, group.len())?;
                for (i, answer) in group.into_iter().zip(each) {
                    answers[i] = Some(answer);
                }
            }
        }
        Ok(answers.into_iter().map(|a| a.expect("every key answered")).collect())
    }

    pub async fn release_batch(&self, items: &[(&str, &str)]) -> Result<Vec<Result<bool, Error>>, Error> {
        let core = &self.inner.core;
        let keys: Vec<String> = items.iter().map(|(k, _)| core.key(k)).collect();
        if core.edition == Edition::Functions {
            let mut answers = Vec::with_capacity(keys.len());
            for ((_, token), key) in items.iter().zip(&keys) {
                answers.push(flag(self.send(cmd::release(core.edition, key, token), key).await));
            }
            return Ok(answers);
        }
        let mut answers: Vec<Option<Result<bool, Error>>> = (0..keys.len()).map(|_| None).collect();
        for group in batches(&keys, self.inner.source.is_cluster()) {
            let pairs: Vec<(&str, String)> =
                group.iter().map(|&i| (keys[i].as_str(), items[i].1.to_string())).collect();
            let cmd = cmd::mrelease(core.edition, &pairs)?;
            let each: Vec<Result<i64, Error>> = decode_each(self.send(cmd, pairs[0].0).await, group.len())?;
            for (i, answer) in group.into_iter().zip(each) {
                answers[i] = Some(answer.map(|n| n == 1));
            }
        }
        Ok(answers.into_iter().map(|a| a.expect("every key answered")).collect())
    }
}

impl<S: AsyncConnectionSource, C> std::fmt::Debug for AsyncIdem<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncIdem")
            .field("edition", &self.inner.core.edition)
            .field("options", &self.inner.core.options)
            .finish()
    }
}
