//! The tokio client: [`AsyncIdem`], the same calls as [`Idem`](crate::Idem)
//! with `async`; every decision is [`flow`](crate::flow)'s, the heartbeat
//! a tokio task.
use crate::cmd::{self, ClaimOptions, DoneOptions, Edition};
use crate::codec::{Codec, DefaultCodec};
use crate::commands::{decode, detect_edition_async, extended, flag};
use crate::error::{Error, ProcessError};
use crate::flow::{Backoff, Core, DoneItem, Next, Plan, ReleaseItem, Step};
use crate::many::KeyOutcome;
use crate::options::{Counters, Job, Options, Outcome, ProcessOptions, ReleaseReason, Stats};
use crate::reply::{Claim, Done, Record};
use crate::scan::{AsyncScan, ScanOptions, Walk};
use crate::source::AsyncConnectionSource;
use redis::{Cmd, FromRedisValue, RedisResult, Value};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A redis-idem client for tokio, on `redis::Client` or (feature
/// `cluster-async`) `redis::cluster::ClusterClient`. Cheap to clone; one
/// instance serves any number of tasks.
///
/// Commands share one multiplexed connection (made again after it
/// failed); a claim that waits (WAIT) takes a connection of its own.
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
    shared: Mutex<Option<S::Connection>>,
    waiting: Mutex<Vec<S::Connection>>,
}

/// Stops the heartbeat task when the call ends, however it ends (an error,
/// a panic of the work, the call's future dropped).
struct AbortOnDrop(Option<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
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
        options.check()?;
        let cluster = source.is_cluster();
        let core = Core { edition: Edition::Module, options, counters: Counters::default(), codec, cluster };
        let mut shared = source.connect(core.response_timeout()).await?;
        let edition = match core.options.edition {
            Some(edition) => edition,
            None => detect_edition_async(&mut shared).await?,
        };
        let core = Core { edition, ..core };
        let (shared, waiting) = (Mutex::new(Some(shared)), Mutex::new(Vec::new()));
        Ok(AsyncIdem { inner: Arc::new(Inner { source, core, shared, waiting }) })
    }

    pub fn edition(&self) -> Edition {
        self.inner.core.edition
    }

    pub fn stats(&self) -> Stats {
        self.inner.core.counters.snapshot()
    }

    /// On the shared connection, made again after a connection error.
    async fn send(&self, cmd: Cmd, key: &str) -> RedisResult<Value> {
        let mut con = self.shared().await?;
        let reply = self.inner.source.route(&mut con, cmd, key.as_bytes().to_vec()).await;
        self.forget_if(reply.as_ref().is_err_and(Error::broke_connection));
        reply
    }

    /// Sends `cmd` to the primary serving `slot` (one server: itself).
    pub(crate) async fn send_to_primary(&self, cmd: Cmd, slot: u16) -> RedisResult<Value> {
        let mut con = self.shared().await?;
        let reply = self.inner.source.route_to_slot(&mut con, cmd, slot).await;
        self.forget_if(reply.as_ref().is_err_and(Error::broke_connection));
        reply
    }

    /// The shared connection, made when there is none.
    async fn shared(&self) -> RedisResult<S::Connection> {
        if let Some(con) = self.inner.shared.lock().ok().and_then(|con| con.clone()) {
            return Ok(con);
        }
        let con = self.inner.source.connect(self.inner.core.response_timeout()).await?;
        if let Ok(mut shared) = self.inner.shared.lock() {
            *shared = Some(con.clone());
        }
        Ok(con)
    }

    /// Drops the shared connection when it `failed`: the next call makes another.
    fn forget_if(&self, failed: bool) {
        if failed && let Ok(mut shared) = self.inner.shared.lock() {
            *shared = None;
        }
    }

    /// A claim that may block (WAIT), on a connection of its own.
    async fn send_waiting(&self, cmd: Cmd, key: &str) -> RedisResult<Value> {
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
        reply
    }

    /// As [`Idem::process`](crate::Idem::process), with the heartbeat in a
    /// tokio task. If the work panics or the call's future is dropped, the
    /// heartbeat stops and the claim lapses at the end of its lease (the
    /// next claim is a RETRY).
    pub async fn process<T, E, F, Fut>(&self, key: &str, work: F) -> Result<Outcome<T>, ProcessError<T, E>>
    where
        C: Codec<T>,
        F: FnOnce(Job) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.process_with(key, &ProcessOptions::default(), work).await
    }

    pub async fn process_with<T, E, F, Fut>(
        &self,
        key: &str,
        call: &ProcessOptions,
        work: F,
    ) -> Result<Outcome<T>, ProcessError<T, E>>
    where
        C: Codec<T>,
        F: FnOnce(Job) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let core = &self.inner.core;
        let key = core.key(key);
        let mut backoff = Backoff::new(core.options.wait);
        let (job, token) = loop {
            let (cmd, waits) = core.claim_cmd(&key, &call.payload, &backoff)?;
            let reply = if waits { self.send_waiting(cmd, &key).await } else { self.send(cmd, &key).await };
            match core.on_claim(&key, decode(reply), &mut backoff)? {
                Step::Work(job, token) => break (job, token),
                Step::Return(outcome) => return Ok(outcome),
                Step::Again(pause) => tokio::time::sleep(pause).await,
            }
        };
        if let Err(hook) = core.before_work(&job) {
            self.give_back(&job, &token, ReleaseReason::Hook).await;
            return Err(hook.into());
        }
        let heartbeat = self.heartbeat(vec![(job.clone(), token.clone())]);
        let ran = work(job.clone()).await;
        drop(heartbeat);
        let value = match ran {
            Ok(value) => value,
            Err(error) => {
                self.give_back(&job, &token, ReleaseReason::Work).await;
                return Err(ProcessError::Work(error));
            }
        };
        let (mut settle, mut next) = core.settle(job, token, value);
        loop {
            match next {
                Next::Send(cmd, pause) => {
                    tokio::time::sleep(pause).await;
                    next = settle.on_reply(core, self.send(cmd, settle.key()).await);
                }
                Next::Finish(outcome) => return outcome,
            }
        }
    }

    /// A task EXTENDing every job's claim each beat, until dropped.
    fn heartbeat(&self, jobs: Vec<(Job, String)>) -> AbortOnDrop {
        let Some((every, extends)) = self.inner.core.heartbeat(&jobs) else { return AbortOnDrop(None) };
        let idem = self.clone();
        AbortOnDrop(Some(tokio::spawn(async move {
            let mut live: Vec<bool> = vec![true; jobs.len()];
            loop {
                tokio::time::sleep(every).await;
                for (i, (job, _)) in jobs.iter().enumerate() {
                    if live[i] {
                        live[i] = idem.inner.core.on_extend(job, idem.send(extends[i].clone(), &job.key).await);
                    }
                }
            }
        })))
    }

    async fn give_back(&self, job: &Job, token: &str, reason: ReleaseReason) {
        // Best effort: if it fails the lease lapses and the key is retried.
        let _ = self.send(self.inner.core.release_cmd(job, token), &job.key).await;
        self.inner.core.released(job, reason);
    }

    // --- the commands, on the edition the server has (keys get the prefix) ---

    pub async fn claim(&self, key: &str, lease: Duration, options: &ClaimOptions) -> Result<Claim, Error> {
        let key = self.inner.core.key(key);
        let cmd = cmd::claim(self.edition(), &key, lease, options)?;
        let waits = options.wait.is_some_and(|w| cmd::wait_ms(w) > 0);
        decode(if waits { self.send_waiting(cmd, &key).await } else { self.send(cmd, &key).await })
    }

    pub async fn done(&self, key: &str, token: &str, options: &DoneOptions) -> Result<Done, Error> {
        let key = self.inner.core.key(key);
        decode(self.send(cmd::done(self.edition(), &key, token, options)?, &key).await)
    }

    pub async fn release(&self, key: &str, token: &str) -> Result<bool, Error> {
        let key = self.inner.core.key(key);
        flag(self.send(cmd::release(self.edition(), &key, token), &key).await)
    }

    pub async fn extend(&self, key: &str, token: &str, lease: Duration) -> Result<(), Error> {
        let key = self.inner.core.key(key);
        extended(self.send(cmd::extend(self.edition(), &key, token, lease)?, &key).await)
    }

    pub async fn get(&self, key: &str) -> Result<Option<Record>, Error> {
        let key = self.inner.core.key(key);
        decode(self.send(cmd::get(self.edition(), &key), &key).await)
    }

    pub async fn once(&self, key: &str, retain: Duration) -> Result<bool, Error> {
        let key = self.inner.core.key(key);
        flag(self.send(cmd::once(self.edition(), &key, retain)?, &key).await)
    }

    // --- operators, as Idem's ---

    /// As [`Idem::scan`](crate::Idem::scan): `while let Some(key) = scan.next().await`.
    pub async fn scan(&self, options: &ScanOptions) -> Result<AsyncScan<S, C>, Error> {
        let walk = Walk::new(self.edition(), options, &self.inner.core.options.prefix)?;
        let mut con = self.shared().await?;
        let primaries = self.inner.source.primaries(&mut con).await;
        self.forget_if(primaries.as_ref().is_err_and(Error::is_connection_error));
        Ok(AsyncScan { idem: self.clone(), walk: walk.over(primaries?) })
    }

    /// As [`Idem::requeue`](crate::Idem::requeue).
    pub async fn requeue(&self, key: &str) -> Result<bool, Error> {
        let key = self.inner.core.key(key);
        flag(self.send(cmd::requeue(self.edition(), &key), &key).await)
    }

    // --- batches, as Idem's ---

    async fn run<R: FromRedisValue>(&self, plan: Plan) -> Vec<Result<R, Error>> {
        let mut replies = Vec::with_capacity(plan.sends.len());
        for (_, cmd, route) in &plan.sends {
            replies.push(self.send(cmd.clone(), route).await);
        }
        plan.gather(replies)
    }

    pub async fn claim_many(&self, keys: &[&str], lease: Duration) -> Result<Vec<Result<Claim, Error>>, Error> {
        self.claim_many_with(keys, lease, None).await
    }

    pub async fn claim_many_with(
        &self,
        keys: &[&str],
        lease: Duration,
        payloads: Option<&[Vec<u8>]>,
    ) -> Result<Vec<Result<Claim, Error>>, Error> {
        let keys: Vec<String> = keys.iter().map(|k| self.inner.core.key(k)).collect();
        let plan = self.inner.core.plan_claims(&keys, lease, payloads)?;
        Ok(self.run(plan).await)
    }

    pub async fn done_many(&self, items: &[DoneItem]) -> Result<Vec<Result<Done, Error>>, Error> {
        let core = &self.inner.core;
        let items: Vec<DoneItem> = items.iter().map(|i| DoneItem { key: core.key(&i.key), ..i.clone() }).collect();
        let plan = core.plan_dones(&items)?;
        Ok(self.run(plan).await)
    }

    pub async fn release_many(&self, items: &[ReleaseItem]) -> Result<Vec<Result<bool, Error>>, Error> {
        let core = &self.inner.core;
        let items: Vec<ReleaseItem> =
            items.iter().map(|i| ReleaseItem { key: core.key(&i.key), ..i.clone() }).collect();
        let plan = core.plan_releases(&items)?;
        let answers: Vec<Result<i64, Error>> = self.run(plan).await;
        Ok(answers.into_iter().map(|a| a.map(|n| n == 1)).collect())
    }

    /// As [`Idem::process_many`](crate::Idem::process_many); a panicking
    /// work unwinds the call, and the batch's claims lapse with their lease.
    pub async fn process_many<T, E, F, Fut>(&self, keys: &[&str], work: F) -> Result<Vec<KeyOutcome<T, E>>, Error>
    where
        C: Codec<T>,
        F: FnMut(Job) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.process_many_with(keys, None, work).await
    }

    pub async fn process_many_with<T, E, F, Fut>(
        &self,
        keys: &[&str],
        payloads: Option<&[Vec<u8>]>,
        mut work: F,
    ) -> Result<Vec<KeyOutcome<T, E>>, Error>
    where
        C: Codec<T>,
        F: FnMut(Job) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let core = &self.inner.core;
        let claims = self.claim_many_with(keys, core.options.lease, payloads).await?;
        let mut many = core.many(keys, claims);
        let heartbeat = self.heartbeat(many.jobs());
        for job in many.take_jobs() {
            let ran = work(job.1.clone()).await;
            many.ran(core, job, ran);
        }
        drop(heartbeat);
        let _ = self.run::<Value>(core.plan_releases(&many.release_items())?).await; // best effort
        let mut items = many.done_items();
        while !items.is_empty() {
            let answers = self.run(core.plan_dones(&items)?).await;
            items = many.on_dones(core, answers);
            tokio::time::sleep(if items.is_empty() { Duration::ZERO } else { many.pause() }).await;
        }
        let mut records = Vec::new();
        for key in many.check_keys() {
            records.push(decode(self.send(cmd::get(core.edition, &key), &key).await));
        }
        many.on_checks(core, records);
        Ok(many.finish())
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
