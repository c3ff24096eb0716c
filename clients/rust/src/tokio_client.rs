//! The tokio client: [`AsyncIdem`], the same calls as [`Idem`](crate::Idem)
//! with `async`; every decision is [`flow`](crate::flow)'s, the heartbeat
//! one tokio task per instance.
use crate::batch::{ClaimArgs, DoneArgs, Lane, Request, Turn, dropped};
use crate::cmd::{self, ClaimOptions, DoneOptions, Edition};
use crate::codec::{Codec, DefaultCodec};
use crate::commands::{decode, detect_edition_async, extended, flag};
use crate::error::{Error, ProcessError};
use crate::flow::{Backoff, Core, Next, Step};
use crate::many::BatchItem;
use crate::options::{Job, Options, Outcome, ProcessOptions, ReleaseReason, Stats};
use crate::plan::{Answer, DoneItem, Plan, ReleaseItem, Replies};
use crate::reply::{Claim, Done, Record};
use crate::ride::{Ridden, Ride};
use crate::scan::{AsyncScan, ScanOptions, Walk};
use crate::source::AsyncConnectionSource;
use redis::{Cmd, FromRedisValue, RedisResult, Value};
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::{Arc, Mutex, Weak};
use std::task::Poll;
use std::time::Duration;

/// A redis-idem client for tokio, on `redis::Client`, (feature
/// `cluster-async`) `redis::cluster::ClusterClient` or (feature `sentinel`)
/// `tokio::sync::Mutex<redis::sentinel::SentinelClient>`. Cheap to clone;
/// one instance serves any number of tasks.
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
    /// The loop's claims and DONEs waiting for the one in flight (`batch`).
    claims: Lane<ClaimArgs>,
    dones: Lane<DoneArgs>,
}

/// Polls `future`, a panic in it caught: the work's claim is released
/// before the panic goes on.
async fn caught<F: Future>(future: F) -> std::thread::Result<F::Output> {
    let mut future = std::pin::pin!(future);
    std::future::poll_fn(|cx| match catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
        Ok(Poll::Pending) => Poll::Pending,
        Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
        Err(panic) => Poll::Ready(Err(panic)),
    })
    .await
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
        let mut core = Core::new(options, Edition::Module, codec, source.is_cluster());
        let mut shared = source.connect(core.reply_timeout()).await?;
        let edition = match core.options.edition {
            Some(edition) => edition,
            None => detect_edition_async(&mut shared).await?,
        };
        core.edition = edition;
        let (shared, waiting) = (Mutex::new(Some(shared)), Mutex::new(Vec::new()));
        let (claims, dones) = (Lane::default(), Lane::default());
        Ok(AsyncIdem { inner: Arc::new(Inner { source, core, shared, waiting, claims, dones }) })
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

    /// A typed command: sent once more, on a new connection, when the
    /// shared one turns out stale (closed by a failover, or to a demoted
    /// primary).
    async fn send_typed(&self, cmd: Cmd, key: &str) -> RedisResult<Value> {
        let reply = self.send(cmd.clone(), key).await;
        match &reply {
            Err(e) if Error::broke_connection(e) => self.send(cmd, key).await,
            _ => reply,
        }
    }

    /// Sends `cmd` to the primary serving `slot` (one server: itself).
    pub(crate) async fn send_to_primary(&self, cmd: Cmd, slot: u16) -> RedisResult<Value> {
        let mut con = self.shared().await?;
        let reply = self.inner.source.route_to_slot(&mut con, cmd, slot).await;
        self.forget_if(reply.as_ref().is_err_and(Error::broke_connection));
        reply
    }

    /// An EXTEND with its job's riding commands: one pipeline where they
    /// share the record's slot, else each to its own node after it.
    async fn extend_riding(&self, extend: Cmd, record: &str, ride: &Ride) -> RedisResult<Value> {
        if !self.inner.core.same_slot(record, &ride.route) {
            let reply = self.send(extend, record).await;
            for cmd in &ride.with_extend {
                let _ = self.send(cmd.clone(), &ride.route).await;
            }
            return reply;
        }
        let cmds: Vec<Cmd> = std::iter::once(extend).chain(ride.with_extend.iter().cloned()).collect();
        let (mut replies, _) = self.send_group(cmds, record, false, false).await;
        replies.truncate(1);
        replies.pop().unwrap_or(Ok(Value::Nil))
    }

    /// The shared connection, made when there is none.
    async fn shared(&self) -> RedisResult<S::Connection> {
        if let Some(con) = self.inner.shared.lock().ok().and_then(|con| con.clone()) {
            return Ok(con);
        }
        let con = self.inner.source.connect(self.inner.core.reply_timeout()).await?;
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
            None => self.inner.source.connect(self.inner.core.waiting_timeout()).await?,
        };
        let reply = self.inner.source.route(&mut con, cmd, key.as_bytes().to_vec()).await;
        if let Ok(mut pool) = self.inner.waiting.lock() {
            match reply.as_ref().is_err_and(Error::broke_connection) {
                // A failover: the other pooled connections are as stale.
                true => pool.clear(),
                false if pool.len() < 64 => pool.push(con),
                false => {}
            }
        }
        reply
    }

    /// A write of the loop (a claim, a DONE): with `durable`, followed by
    /// `WAIT` on the same connection in the same round trip.
    async fn send_write(&self, cmd: Cmd, key: &str, waits: bool) -> (RedisResult<Value>, Option<RedisResult<Value>>) {
        let Some(wait) = self.inner.core.wait.clone() else {
            return (if waits { self.send_waiting(cmd, key).await } else { self.send(cmd, key).await }, None);
        };
        let (mut replies, _) = self.send_group(vec![cmd, wait], key, false, waits).await;
        let ack = replies.pop();
        (replies.pop().unwrap_or(Ok(Value::Nil)), ack)
    }

    /// Commands in one pipeline (the shared connection, or one of its own
    /// when it may block), with `WAIT` after them when `durable` and `write`.
    async fn send_group(&self, mut cmds: Vec<Cmd>, key: &str, write: bool, waits: bool) -> Replies {
        let wait = self.inner.core.wait.clone().filter(|_| write);
        cmds.extend(wait.iter().cloned());
        let count = cmds.len();
        let failed = |e: redis::RedisError| -> Replies { ((0..count).map(|_| Err(e.clone())).collect(), None) };
        let pooled = if waits { self.inner.waiting.lock().ok().and_then(|mut pool| pool.pop()) } else { None };
        let mut con = match (waits, pooled) {
            (true, Some(con)) => con,
            (true, None) => match self.inner.source.connect(self.inner.core.waiting_timeout()).await {
                Ok(con) => con,
                Err(e) => return failed(e),
            },
            (false, _) => match self.shared().await {
                Ok(con) => con,
                Err(e) => return failed(e),
            },
        };
        let mut replies = self.inner.source.route_pipeline(&mut con, cmds, key.as_bytes().to_vec()).await;
        let broken = replies.iter().any(|r| r.as_ref().is_err_and(Error::broke_connection));
        match waits {
            false => self.forget_if(broken),
            true if !broken => {
                if let Ok(mut pool) = self.inner.waiting.lock() {
                    pool.push(con);
                }
            }
            true => {}
        }
        let ack = if wait.is_some() { replies.pop() } else { None };
        (replies, ack)
    }

    /// As [`Idem::process`](crate::Idem::process). A work that panics has
    /// its claim released before the panic goes on; if the call's future
    /// is dropped, the claim lapses at the end of its lease (the next
    /// claim is a RETRY).
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
        let mut ridden = None;
        self.process_riding(key, call, &Ride::default(), &mut ridden, work).await
    }

    /// As [`Idem::process_riding`](crate::Idem): `ride`'s commands sent
    /// with the call's DONEs (which then do not join a shared batch) and
    /// EXTENDs; `ridden` gets the replies of those sent with the latest DONE.
    pub(crate) async fn process_riding<T, E, F, Fut>(
        &self,
        key: &str,
        call: &ProcessOptions,
        ride: &Ride,
        ridden: &mut Ridden,
        work: F,
    ) -> Result<Outcome<T>, ProcessError<T, E>>
    where
        C: Codec<T>,
        F: FnOnce(Job) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let core = &self.inner.core;
        let record = core.key(key);
        let mut backoff = Backoff::new(core.options.wait);
        let (job, token) = loop {
            let (cmd, waits) = core.claim_cmd(&record, &call.payload, &backoff)?;
            let (reply, ack) = match !waits && self.batching() {
                true => (self.shared_claim(cmd, &record, &call.payload).await, None),
                false => self.send_write(cmd, &record, waits).await,
            };
            match core.on_claim(key, decode(reply), ack, &mut backoff)? {
                Step::Work(job, token) => break (job, token),
                Step::Return(outcome) => return Ok(outcome),
                Step::Undurable { value, attempt, error } => {
                    return Err(ProcessError::Replayed { value, attempt, error });
                }
                Step::Again(pause) => tokio::time::sleep(pause).await,
                Step::Busy(lease_left) => {
                    let holder = decode(self.send(cmd::get(core.edition, &record), &record).await);
                    return Err(core.busy(key, lease_left, holder).into());
                }
                Step::Release(job, token, error) => {
                    let _ = self.send(core.release_cmd(&job, &token), &record).await;
                    return Err(error.into());
                }
            }
        };
        if let Err(hook) = core.before_work(&job) {
            self.give_back(&job, &token, ReleaseReason::Hook).await;
            return Err(hook.into());
        }
        let beat = Beat { idem: self, ticket: Some(self.beat(&[(&job, &token)], ride)) };
        let ran = caught(work(job.clone())).await;
        drop(beat);
        let value = match ran {
            Ok(Ok(value)) => value,
            Ok(Err(error)) => {
                self.give_back(&job, &token, ReleaseReason::Work).await;
                return Err(ProcessError::Work(error));
            }
            Err(panic) => {
                self.give_back(&job, &token, ReleaseReason::Panic).await;
                resume_unwind(panic)
            }
        };
        let rides = !ride.with_done.is_empty() && core.same_slot(&job.record, &ride.route);
        let (mut settle, mut next) = core.settle(job, token, value);
        loop {
            match next {
                Next::Send(cmd, pause, durable) => {
                    if !pause.is_zero() {
                        tokio::time::sleep(pause).await;
                    }
                    if rides && settle.sends_done() {
                        let cmds: Vec<Cmd> = std::iter::once(cmd).chain(ride.with_done.iter().cloned()).collect();
                        let (mut replies, ack) = self.send_group(cmds, settle.record(), durable, false).await;
                        let theirs = replies.split_off(1.min(replies.len()));
                        *ridden = Some(theirs);
                        next = settle.on_reply(core, replies.pop().unwrap_or(Ok(Value::Nil)), ack);
                        continue;
                    }
                    let shared = pause.is_zero() && settle.sends_done() && self.batching();
                    let (reply, ack) = match (durable, shared) {
                        (true, _) => self.send_write(cmd, settle.record(), false).await,
                        (false, true) => {
                            let (token, result) = settle.done_args();
                            let args = (token.to_string(), result.map(<[u8]>::to_vec));
                            (self.shared_done(cmd, settle.record(), args).await, None)
                        }
                        (false, false) => (self.send(cmd, settle.record()).await, None),
                    };
                    next = settle.on_reply(core, reply, ack);
                }
                Next::Finish(outcome) => return outcome,
            }
        }
    }

    /// Whether concurrent calls share batch commands: `batch`, without
    /// `durable` (whose claims and DONEs each carry their own `WAIT`).
    fn batching(&self) -> bool {
        self.inner.core.options.batch && self.inner.core.wait.is_none()
    }

    /// The loop's first claim: its own command when nothing is in flight,
    /// else its answer from the next batch.
    async fn shared_claim(&self, cmd: Cmd, record: &str, payload: &Option<Vec<u8>>) -> RedisResult<Value> {
        match self.inner.claims.enter(record, payload.clone()) {
            Turn::Wait(answer) => answer.await.unwrap_or_else(|_| Err(dropped())),
            Turn::Lead => {
                let _handoff = Handoff { idem: self, claims: true };
                self.send(cmd, record).await
            }
        }
    }

    /// A DONE of the loop, as [`shared_claim`](Self::shared_claim).
    /// (It takes the DONE's arguments, not the `Settle`, so that the call's
    /// future is `Send` whatever the value's type.)
    async fn shared_done(&self, cmd: Cmd, record: &str, args: DoneArgs) -> RedisResult<Value> {
        match self.inner.dones.enter(record, args) {
            Turn::Wait(answer) => answer.await.unwrap_or_else(|_| Err(dropped())),
            Turn::Lead => {
                let _handoff = Handoff { idem: self, claims: false };
                self.send(cmd, record).await
            }
        }
    }

    /// The queued claims, batch after batch until none queue.
    async fn flush_claims(self, mut queued: Vec<Request<ClaimArgs>>) {
        let core = &self.inner.core;
        while !queued.is_empty() {
            // MCLAIM takes payloads for every key or for none.
            let (with, without): (Vec<_>, Vec<_>) = queued.into_iter().partition(|r| r.args.is_some());
            for part in [with, without].into_iter().filter(|part| !part.is_empty()) {
                let records: Vec<String> = part.iter().map(|r| r.record.clone()).collect();
                let payloads: Option<Vec<Vec<u8>>> = part.iter().map(|r| r.args.clone()).collect();
                let plan = core.plan_claims(&records, core.options.lease, payloads.as_deref());
                self.flush(part, plan).await;
            }
            queued = self.inner.claims.next();
        }
    }

    /// The queued DONEs, batch after batch until none queue.
    async fn flush_dones(self, mut queued: Vec<Request<DoneArgs>>) {
        let core = &self.inner.core;
        while !queued.is_empty() {
            let items: Vec<DoneItem> = queued
                .iter()
                .map(|r| DoneItem { key: r.record.clone(), token: r.args.0.clone(), result: r.args.1.clone() })
                .collect();
            let plan = core.plan_dones(&items);
            self.flush(std::mem::take(&mut queued), plan).await;
            queued = self.inner.dones.next();
        }
    }

    /// One batch's commands sent, each call given its own key's reply.
    async fn flush<A>(&self, requests: Vec<Request<A>>, plan: Result<Plan, Error>) {
        let Ok(plan) = plan else {
            return requests.into_iter().for_each(|r| r.answer(Err(dropped())));
        };
        let mut replies = Vec::with_capacity(plan.sends.len());
        for group in &plan.sends {
            replies.push(self.send_group(group.cmds.clone(), &group.route, false, false).await);
        }
        for (request, reply) in requests.into_iter().zip(plan.split(replies)) {
            request.answer(reply);
        }
    }

    /// Registers the jobs with the instance's heartbeat, starting its task
    /// with the first job.
    fn beat(&self, jobs: &[(&Job, &String)], ride: &Ride) -> crate::heartbeat::Ticket {
        let (ticket, start) = self.inner.core.beats.add(jobs.iter().map(|(job, token)| (*job, token.as_str())), ride);
        if start {
            let (inner, tick) = (Arc::downgrade(&self.inner), self.inner.core.beats.tick());
            tokio::spawn(heartbeat(inner, tick));
        }
        ticket
    }

    /// RELEASE, once, within `done_timeout`: counted when it answered 1.
    async fn give_back(&self, job: &Job, token: &str, reason: ReleaseReason) {
        let reply = flag(self.send(self.inner.core.release_cmd(job, token), &job.record).await);
        self.inner.core.released(job, reason, reply);
    }

    // --- the commands, on the edition the server has (keys get the prefix) ---

    pub async fn claim(&self, key: &str, lease: Duration, options: &ClaimOptions) -> Result<Claim, Error> {
        let key = self.inner.core.key(key);
        let cmd = cmd::claim(self.edition(), &key, lease, options)?;
        let waits = options.wait.is_some_and(|w| cmd::wait_ms(w) > 0);
        decode(if waits { self.send_waiting(cmd, &key).await } else { self.send_typed(cmd, &key).await })
    }

    pub async fn done(&self, key: &str, token: &str, options: &DoneOptions) -> Result<Done, Error> {
        let key = self.inner.core.key(key);
        decode(self.send_typed(cmd::done(self.edition(), &key, token, options)?, &key).await)
    }

    pub async fn release(&self, key: &str, token: &str) -> Result<bool, Error> {
        let key = self.inner.core.key(key);
        flag(self.send_typed(cmd::release(self.edition(), &key, token), &key).await)
    }

    pub async fn extend(&self, key: &str, token: &str, lease: Duration) -> Result<(), Error> {
        let key = self.inner.core.key(key);
        extended(self.send_typed(cmd::extend(self.edition(), &key, token, lease)?, &key).await)
    }

    pub async fn get(&self, key: &str) -> Result<Option<Record>, Error> {
        let key = self.inner.core.key(key);
        decode(self.send_typed(cmd::get(self.edition(), &key), &key).await)
    }

    pub async fn once(&self, key: &str, retain: Duration) -> Result<bool, Error> {
        let key = self.inner.core.key(key);
        flag(self.send_typed(cmd::once(self.edition(), &key, retain)?, &key).await)
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

    async fn run<R: FromRedisValue>(&self, plan: Plan, write: bool) -> Vec<Answer<R>> {
        let mut replies = Vec::with_capacity(plan.sends.len());
        for group in &plan.sends {
            replies.push(self.send_group(group.cmds.clone(), &group.route, write, false).await);
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
        let core = &self.inner.core;
        let records: Vec<String> = keys.iter().map(|k| core.key(k)).collect();
        let plan = core.plan_claims(&records, lease, payloads)?;
        let answers = self.run(plan, true).await;
        let (claims, releases) = core.durable_claims(keys, &records, answers);
        if !releases.is_empty() {
            let _ = self.run::<Value>(core.plan_releases(&releases)?, false).await;
        }
        Ok(claims)
    }

    pub async fn done_many(&self, items: &[DoneItem]) -> Result<Vec<Result<Done, Error>>, Error> {
        let core = &self.inner.core;
        let items: Vec<DoneItem> = items.iter().map(|i| DoneItem { key: core.key(&i.key), ..i.clone() }).collect();
        let plan = core.plan_dones(&items)?;
        let answers = self.run(plan, true).await;
        Ok(core.durable_dones(&items, answers))
    }

    pub async fn release_many(&self, items: &[ReleaseItem]) -> Result<Vec<Result<bool, Error>>, Error> {
        let core = &self.inner.core;
        let items: Vec<ReleaseItem> =
            items.iter().map(|i| ReleaseItem { key: core.key(&i.key), ..i.clone() }).collect();
        let plan = core.plan_releases(&items)?;
        let answers: Vec<(Result<i64, Error>, _)> = self.run(plan, false).await;
        Ok(answers.into_iter().map(|(a, _)| a.map(|n| n == 1)).collect())
    }

    /// As [`Idem::process_many`](crate::Idem::process_many); a panicking
    /// work's claim, and those of the keys not run yet, are released before
    /// the panic goes on.
    pub async fn process_many<T, E, F, Fut>(&self, keys: &[&str], work: F) -> Result<Vec<BatchItem<T, E>>, Error>
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
    ) -> Result<Vec<BatchItem<T, E>>, Error>
    where
        C: Codec<T>,
        F: FnMut(Job) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let core = &self.inner.core;
        let records: Vec<String> = keys.iter().map(|k| core.key(k)).collect();
        let claims = self.run(core.plan_claims(&records, core.options.lease, payloads)?, true).await;
        let mut many = core.many(keys, claims);
        let jobs = many.take_jobs();
        let ticket = self.beat(&jobs.iter().map(|(_, job, token)| (job, token)).collect::<Vec<_>>(), &Ride::default());
        let beat = Beat { idem: self, ticket: Some(ticket) };
        let mut todo = jobs.into_iter();
        let mut panic = None;
        while let Some(job) = todo.next() {
            match caught(work(job.1.clone())).await {
                Ok(ran) => many.ran(core, job, ran),
                Err(caught) => {
                    many.panicked(std::iter::once(job).chain(todo.by_ref()).collect());
                    panic = Some(caught);
                }
            }
        }
        drop(beat);
        let releases = many.release_items();
        if !releases.is_empty() {
            let answers: Vec<(Result<i64, Error>, _)> = self.run(core.plan_releases(&releases)?, false).await;
            many.on_releases(core, answers.into_iter().map(|(a, _)| a.map(|n| n == 1)).collect());
        }
        let mut items = many.done_items();
        while !items.is_empty() {
            let answers = self.run(core.plan_dones(&items)?, true).await;
            items = many.on_dones(core, answers);
            if !items.is_empty() {
                tokio::time::sleep(many.pause()).await;
            }
        }
        let mut records = Vec::new();
        for key in many.check_keys() {
            records.push(decode(self.send(cmd::get(core.edition, &key), &key).await));
        }
        many.on_checks(core, records);
        match panic {
            Some(panic) => resume_unwind(panic),
            None => Ok(many.finish()),
        }
    }
}

/// What the broker adapters send besides the loop's own commands.
#[cfg(feature = "streams")]
impl<S: AsyncConnectionSource, C: Send + Sync + 'static> AsyncIdem<S, C> {
    pub(crate) fn core(&self) -> &Core<C> {
        &self.inner.core
    }

    /// `cmd` to `route`'s node, on the shared connection.
    pub(crate) async fn send_cmd(&self, cmd: Cmd, route: &str) -> RedisResult<Value> {
        self.send(cmd, route).await
    }

    /// A command that blocks (`XREADGROUP ... BLOCK`), on a connection of
    /// its own (the shared one would wait behind it).
    pub(crate) async fn send_blocking(&self, cmd: Cmd, route: &str) -> RedisResult<Value> {
        self.send_waiting(cmd, route).await
    }

    /// `cmds` to `route`'s node in one pipeline: one reply each.
    pub(crate) async fn send_cmds(&self, cmds: Vec<Cmd>, route: &str) -> Vec<RedisResult<Value>> {
        self.send_group(cmds, route, false, false).await.0
    }
}

/// The leader of a lane, when its own command returned (or its call was
/// dropped): the calls queued meanwhile go on in a task of their own, so
/// the leader returns at once.
struct Handoff<'a, S: AsyncConnectionSource, C: Send + Sync + 'static> {
    idem: &'a AsyncIdem<S, C>,
    claims: bool,
}

impl<S: AsyncConnectionSource, C: Send + Sync + 'static> Drop for Handoff<'_, S, C> {
    fn drop(&mut self) {
        let idem = self.idem.clone();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        match self.claims {
            true => {
                let queued = idem.inner.claims.next();
                if !queued.is_empty() {
                    runtime.spawn(idem.flush_claims(queued));
                }
            }
            false => {
                let queued = idem.inner.dones.next();
                if !queued.is_empty() {
                    runtime.spawn(idem.flush_dones(queued));
                }
            }
        }
    }
}

/// A call's jobs in the heartbeat, taken out when the call ends, however it
/// ends (an error, a panic, the call's future dropped).
struct Beat<'a, S: AsyncConnectionSource, C> {
    idem: &'a AsyncIdem<S, C>,
    ticket: Option<crate::heartbeat::Ticket>,
}

impl<S: AsyncConnectionSource, C> Drop for Beat<'_, S, C> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            self.idem.inner.core.beats.remove(ticket);
        }
    }
}

/// The instance's heartbeat task: every half `heartbeat`, the due
/// EXTENDs; it ends when the instance is dropped.
async fn heartbeat<S: AsyncConnectionSource, C: Send + Sync + 'static>(inner: Weak<Inner<S, C>>, tick: Duration) {
    loop {
        tokio::time::sleep(tick).await;
        let Some(inner) = inner.upgrade() else { return };
        let idem = AsyncIdem { inner };
        let core = &idem.inner.core;
        for due in core.beats.due(core.edition, core.options.lease) {
            let reply = match due.ride.with_extend.is_empty() {
                true => idem.send(due.extend, &due.job.record).await,
                false => idem.extend_riding(due.extend, &due.job.record, &due.ride).await,
            };
            if !core.on_extend(&due.job, reply) {
                core.beats.forget(due.id);
            }
        }
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
