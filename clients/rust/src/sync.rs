//! The sync client: [`Idem`]. Every decision is [`flow`](crate::flow)'s;
//! this sends and waits, and one thread per instance runs the heartbeat.
use crate::cmd::{self, ClaimOptions, DoneOptions, Edition};
use crate::codec::{Codec, DefaultCodec};
use crate::commands::{decode, detect_edition, extended, flag};
use crate::error::{Error, ProcessError};
use crate::flow::{Backoff, Core, Next, Step};
use crate::many::BatchItem;
use crate::options::{Job, Options, Outcome, ProcessOptions, ReleaseReason, Stats};
use crate::plan::{Answer, DoneItem, Plan, ReleaseItem, Replies};
use crate::reply::{Claim, Done, Record};
use crate::ride::{Ridden, Ride};
use crate::scan::{Scan, ScanOptions, Walk};
use crate::source::ConnectionSource;
use redis::{Cmd, FromRedisValue, RedisResult, Value};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// A redis-idem client on a connection source (`redis::Client`,
/// `redis::cluster::ClusterClient`, `Mutex<redis::sentinel::SentinelClient>`),
/// for any number of threads.
pub struct Idem<S: ConnectionSource, C = DefaultCodec> {
    inner: Arc<Inner<S, C>>,
}

struct Inner<S: ConnectionSource, C> {
    source: S,
    core: Core<C>,
    /// Connections for commands that do not block (`done_timeout`).
    pool: Mutex<Vec<S::Connection>>,
    /// Connections for claims that WAIT.
    waiting: Mutex<Vec<S::Connection>>,
}

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
        options.check()?;
        let mut core = Core::new(options, Edition::Module, codec, source.is_cluster());
        let mut con = source.connect(core.reply_timeout())?;
        let edition = match core.options.edition {
            Some(edition) => edition,
            None => detect_edition(&mut con)?,
        };
        core.edition = edition;
        let (pool, waiting) = (Mutex::new(vec![con]), Mutex::new(Vec::new()));
        Ok(Idem { inner: Arc::new(Inner { source, core, pool, waiting }) })
    }

    /// The edition this client uses.
    pub fn edition(&self) -> Edition {
        self.inner.core.edition
    }

    /// The consumer loop's counters so far.
    pub fn stats(&self) -> Stats {
        self.inner.core.counters.snapshot()
    }

    fn send(&self, cmd: &Cmd, key: &str) -> RedisResult<Value> {
        self.inner.send(cmd, key)
    }

    /// A typed command: sent once more, on a new connection, when a pooled
    /// one turns out stale (closed by a failover, or to a demoted primary).
    fn send_typed(&self, cmd: &Cmd, key: &str) -> RedisResult<Value> {
        let reply = self.inner.send(cmd, key);
        match &reply {
            Err(e) if Error::broke_connection(e) => self.inner.send(cmd, key),
            _ => reply,
        }
    }

    /// Sends `cmd` to the primary serving `slot` (one server: itself).
    pub(crate) fn send_to_primary(&self, cmd: &Cmd, slot: u16) -> RedisResult<Value> {
        let inner = &*self.inner;
        inner.on_pooled(&inner.pool, |con| inner.source.route_to_slot(con, cmd, slot), Error::broke_connection)
    }

    /// Runs `work` once for `key`, however often it is called for it:
    /// docs/clients.md's "What process does", in the README.
    pub fn process<T, E, F>(&self, key: &str, work: F) -> Result<Outcome<T>, ProcessError<T, E>>
    where
        C: Codec<T> + 'static,
        F: FnOnce(&Job) -> Result<T, E>,
    {
        self.process_with(key, &ProcessOptions::default(), work)
    }

    /// [`process`](Self::process) with per-call options (the payload).
    pub fn process_with<T, E, F>(
        &self,
        key: &str,
        call: &ProcessOptions,
        work: F,
    ) -> Result<Outcome<T>, ProcessError<T, E>>
    where
        C: Codec<T> + 'static,
        F: FnOnce(&Job) -> Result<T, E>,
    {
        let mut ridden = None;
        self.process_riding(key, call, &Ride::default(), &mut ridden, work)
    }

    /// [`process_with`](Self::process_with) with `ride`'s commands sent with
    /// its DONEs and EXTENDs; `ridden` gets the replies of those sent with
    /// the latest DONE.
    pub(crate) fn process_riding<T, E, F>(
        &self,
        key: &str,
        call: &ProcessOptions,
        ride: &Ride,
        ridden: &mut Ridden,
        work: F,
    ) -> Result<Outcome<T>, ProcessError<T, E>>
    where
        C: Codec<T> + 'static,
        F: FnOnce(&Job) -> Result<T, E>,
    {
        let (inner, core) = (&*self.inner, &self.inner.core);
        let record = core.key(key);
        let mut backoff = Backoff::new(core.options.wait);
        let (job, token) = loop {
            let (cmd, waits) = core.claim_cmd(&record, &call.payload, &backoff)?;
            let (reply, ack) = inner.send_write(&cmd, &record, waits);
            match core.on_claim(key, decode(reply), ack, &mut backoff)? {
                Step::Work(job, token) => break (job, token),
                Step::Return(outcome) => return Ok(outcome),
                Step::Undurable { value, attempt, error } => {
                    return Err(ProcessError::Replayed { value, attempt, error });
                }
                Step::Again(pause) => std::thread::sleep(pause),
                Step::Busy(lease_left) => {
                    let holder = decode(self.send(&cmd::get(core.edition, &record), &record));
                    return Err(core.busy(key, lease_left, holder).into());
                }
                Step::Release(job, token, error) => {
                    let _ = self.send(&core.release_cmd(&job, &token), &record);
                    return Err(error.into());
                }
            }
        };
        if let Err(hook) = core.before_work(&job) {
            self.give_back(&job, &token, ReleaseReason::Hook);
            return Err(hook.into());
        }
        let beat = self.beat(&[(&job, &token)], ride);
        let ran = catch_unwind(AssertUnwindSafe(|| work(&job)));
        core.beats.remove(beat);
        let value = match ran {
            Ok(Ok(value)) => value,
            Ok(Err(error)) => {
                self.give_back(&job, &token, ReleaseReason::Work);
                return Err(ProcessError::Work(error));
            }
            Err(panic) => {
                self.give_back(&job, &token, ReleaseReason::Panic);
                resume_unwind(panic)
            }
        };
        let rides = !ride.with_done.is_empty() && core.same_slot(&job.record, &ride.route);
        let (mut settle, mut next) = core.settle(job, token, value);
        loop {
            match next {
                Next::Send(cmd, pause, durable) => {
                    std::thread::sleep(pause);
                    let (reply, ack) = match (rides && settle.sends_done(), durable) {
                        (true, _) => {
                            let cmds: Vec<Cmd> = std::iter::once(cmd).chain(ride.with_done.iter().cloned()).collect();
                            let (mut replies, ack) = inner.send_group(&cmds, settle.record(), durable, false);
                            let theirs = replies.split_off(1.min(replies.len()));
                            *ridden = Some(theirs);
                            (replies.pop().unwrap_or(Ok(Value::Nil)), ack)
                        }
                        (false, true) => inner.send_write(&cmd, settle.record(), false),
                        (false, false) => (self.send(&cmd, settle.record()), None),
                    };
                    next = settle.on_reply(core, reply, ack);
                }
                Next::Finish(outcome) => return outcome,
            }
        }
    }

    /// Registers the jobs with the instance's heartbeat, starting its
    /// thread with the first job.
    fn beat(&self, jobs: &[(&Job, &String)], ride: &Ride) -> crate::heartbeat::Ticket
    where
        C: Send + Sync + 'static,
    {
        let (ticket, start) = self.inner.core.beats.add(jobs.iter().map(|(job, token)| (*job, token.as_str())), ride);
        if start {
            let (inner, tick) = (Arc::downgrade(&self.inner), self.inner.core.beats.tick());
            let _ =
                std::thread::Builder::new().name("redis-idem-heartbeat".into()).spawn(move || heartbeat(inner, tick));
        }
        ticket
    }

    /// RELEASE, once, within `done_timeout`: counted when it answered 1.
    fn give_back(&self, job: &Job, token: &str, reason: ReleaseReason) {
        let reply = flag(self.send(&self.inner.core.release_cmd(job, token), &job.record));
        self.inner.core.released(job, reason, reply);
    }

    // --- the commands, on the edition the server has (keys get the prefix) ---

    /// `IDEM.CLAIM` / `idem_claim`. WAIT and BLOOM are
    /// [`Error::ModuleRequired`] on the Functions edition.
    pub fn claim(&self, key: &str, lease: Duration, options: &ClaimOptions) -> Result<Claim, Error> {
        let key = self.inner.core.key(key);
        let waits = options.wait.is_some_and(|w| cmd::wait_ms(w) > 0);
        let cmd = cmd::claim(self.edition(), &key, lease, options)?;
        decode(if waits { self.inner.send_waiting(&cmd, &key) } else { self.send_typed(&cmd, &key) })
    }

    pub fn done(&self, key: &str, token: &str, options: &DoneOptions) -> Result<Done, Error> {
        let key = self.inner.core.key(key);
        decode(self.send_typed(&cmd::done(self.edition(), &key, token, options)?, &key))
    }

    pub fn release(&self, key: &str, token: &str) -> Result<bool, Error> {
        let key = self.inner.core.key(key);
        flag(self.send_typed(&cmd::release(self.edition(), &key, token), &key))
    }

    pub fn extend(&self, key: &str, token: &str, lease: Duration) -> Result<(), Error> {
        let key = self.inner.core.key(key);
        extended(self.send_typed(&cmd::extend(self.edition(), &key, token, lease)?, &key))
    }

    pub fn get(&self, key: &str) -> Result<Option<Record>, Error> {
        let key = self.inner.core.key(key);
        decode(self.send_typed(&cmd::get(self.edition(), &key), &key))
    }

    pub fn once(&self, key: &str, retain: Duration) -> Result<bool, Error> {
        let key = self.inner.core.key(key);
        flag(self.send_typed(&cmd::once(self.edition(), &key, retain)?, &key))
    }

    // --- operators ---

    /// The keys (without the prefix) of every record matching `options`,
    /// on every primary of a cluster in turn: the dead letters of
    /// `max_tries` n are `ScanOptions::new().state(RecordState::Released).min_tries(n)`.
    /// Options the server would refuse are [`Error::InvalidArgument`] here.
    pub fn scan(&self, options: &ScanOptions) -> Result<Scan<'_, S, C>, Error> {
        let inner = &*self.inner;
        let walk = Walk::new(inner.core.edition, options, &inner.core.options.prefix)?;
        let primaries = inner.on_pooled(&inner.pool, |con| inner.source.primaries(con), Error::is_connection_error)?;
        Ok(Scan { idem: self, walk: walk.over(primaries) })
    }

    /// `IDEM.REQUEUE` / `idem_requeue`: gives a record's work back. True
    /// when it is now released (its attempt kept, so the next claim is a
    /// `Retry` with attempt + 1; its tries restarted), false when there is
    /// no record. A processing record whose lease is live is
    /// [`Error::LiveLease`], the record unchanged.
    pub fn requeue(&self, key: &str) -> Result<bool, Error> {
        let key = self.inner.core.key(key);
        flag(self.send_typed(&cmd::requeue(self.edition(), &key), &key))
    }

    // --- batches ---

    /// Each group of the plan as one pipeline (with its `WAIT` when
    /// `durable` and `write`).
    fn run<R: FromRedisValue>(&self, plan: Plan, write: bool) -> Vec<Answer<R>> {
        let replies: Vec<Replies> =
            plan.sends.iter().map(|group| self.inner.send_group(&group.cmds, &group.route, write, false)).collect();
        plan.gather(replies)
    }

    /// Claims many keys with the instance's MAXTRIES, OWNER and BLOOM, no
    /// WAIT: one answer per key, in order, a key's error failing only that
    /// key. With `durable`, a granted key not acknowledged is released and
    /// answered [`Error::NotDurable`].
    pub fn claim_many(&self, keys: &[&str], lease: Duration) -> Result<Vec<Result<Claim, Error>>, Error> {
        self.claim_many_with(keys, lease, None)
    }

    /// [`claim_many`](Self::claim_many) with one payload per key.
    pub fn claim_many_with(
        &self,
        keys: &[&str],
        lease: Duration,
        payloads: Option<&[Vec<u8>]>,
    ) -> Result<Vec<Result<Claim, Error>>, Error> {
        let core = &self.inner.core;
        let records: Vec<String> = keys.iter().map(|k| core.key(k)).collect();
        let answers = self.run(core.plan_claims(&records, lease, payloads)?, true);
        let (claims, releases) = core.durable_claims(keys, &records, answers);
        if !releases.is_empty() {
            let _ = self.run::<Value>(core.plan_releases(&releases)?, false);
        }
        Ok(claims)
    }

    /// Completes many claims with the instance's RETAIN and BLOOM: one
    /// answer per item, in order (with `durable`, [`Error::NotDurable`]
    /// for a completion not acknowledged).
    pub fn done_many(&self, items: &[DoneItem]) -> Result<Vec<Result<Done, Error>>, Error> {
        let core = &self.inner.core;
        let items: Vec<DoneItem> = items.iter().map(|i| DoneItem { key: core.key(&i.key), ..i.clone() }).collect();
        let answers = self.run(core.plan_dones(&items)?, true);
        Ok(core.durable_dones(&items, answers))
    }

    /// Releases many claims: one answer per item (true: released), in order.
    pub fn release_many(&self, items: &[ReleaseItem]) -> Result<Vec<Result<bool, Error>>, Error> {
        let core = &self.inner.core;
        let items: Vec<ReleaseItem> =
            items.iter().map(|i| ReleaseItem { key: core.key(&i.key), ..i.clone() }).collect();
        let answers: Vec<(Result<i64, Error>, _)> = self.run(core.plan_releases(&items)?, false);
        Ok(answers.into_iter().map(|(a, _)| a.map(|n| n == 1)).collect())
    }

    /// Claims the keys, runs `work` for each granted key in order (one
    /// heartbeat for the batch), completes the successes in one DONE batch
    /// and releases the failures in one RELEASE batch: one answer per key.
    pub fn process_many<T, E, F>(&self, keys: &[&str], work: F) -> Result<Vec<BatchItem<T, E>>, Error>
    where
        C: Codec<T> + 'static,
        F: FnMut(&Job) -> Result<T, E>,
    {
        self.process_many_with(keys, None, work)
    }

    /// [`process_many`](Self::process_many) with one payload per key.
    pub fn process_many_with<T, E, F>(
        &self,
        keys: &[&str],
        payloads: Option<&[Vec<u8>]>,
        mut work: F,
    ) -> Result<Vec<BatchItem<T, E>>, Error>
    where
        C: Codec<T> + 'static,
        F: FnMut(&Job) -> Result<T, E>,
    {
        let core = &self.inner.core;
        let records: Vec<String> = keys.iter().map(|k| core.key(k)).collect();
        let claims = self.run(core.plan_claims(&records, core.options.lease, payloads)?, true);
        let mut many = core.many(keys, claims);
        let jobs = many.take_jobs();
        let beat = self.beat(&jobs.iter().map(|(_, job, token)| (job, token)).collect::<Vec<_>>(), &Ride::default());
        let mut todo = jobs.into_iter();
        let mut panic = None;
        while let Some(job) = todo.next() {
            match catch_unwind(AssertUnwindSafe(|| work(&job.1))) {
                Ok(ran) => many.ran(core, job, ran),
                Err(caught) => {
                    many.panicked(std::iter::once(job).chain(todo.by_ref()).collect());
                    panic = Some(caught);
                }
            }
        }
        core.beats.remove(beat);
        let releases = many.release_items();
        if !releases.is_empty() {
            let answers: Vec<(Result<i64, Error>, _)> = self.run(core.plan_releases(&releases)?, false);
            many.on_releases(core, answers.into_iter().map(|(a, _)| a.map(|n| n == 1)).collect());
        }
        let mut items = many.done_items();
        while !items.is_empty() {
            let answers = self.run(core.plan_dones(&items)?, true);
            items = many.on_dones(core, answers);
            std::thread::sleep(if items.is_empty() { Duration::ZERO } else { many.pause() });
        }
        let records =
            many.check_keys().iter().map(|key| decode(self.send(&cmd::get(core.edition, key), key))).collect();
        many.on_checks(core, records);
        let answers = many.finish();
        match panic {
            Some(panic) => resume_unwind(panic),
            None => Ok(answers),
        }
    }
}

/// What the broker adapters send besides the loop's own commands.
#[cfg(feature = "streams")]
impl<S: ConnectionSource, C> Idem<S, C> {
    pub(crate) fn core(&self) -> &Core<C> {
        &self.inner.core
    }

    /// `cmd` to `route`'s node, on a pooled connection.
    pub(crate) fn send_cmd(&self, cmd: &Cmd, route: &str) -> RedisResult<Value> {
        self.inner.send(cmd, route)
    }

    /// A command that blocks (`XREADGROUP ... BLOCK`), on a connection for
    /// waiting.
    pub(crate) fn send_blocking(&self, cmd: &Cmd, route: &str) -> RedisResult<Value> {
        self.inner.send_waiting(cmd, route)
    }

    /// `cmds` to `route`'s node in one pipeline: one reply each.
    pub(crate) fn send_cmds(&self, cmds: &[Cmd], route: &str) -> Vec<RedisResult<Value>> {
        self.inner.send_group(cmds, route, false, false).0
    }
}

impl<S: ConnectionSource, C> Inner<S, C> {
    /// An EXTEND with its job's riding commands: one pipeline where they
    /// share the record's slot, else each to its own node after it.
    fn extend_riding(&self, extend: Cmd, record: &str, ride: &Ride) -> RedisResult<Value> {
        if !self.core.same_slot(record, &ride.route) {
            let reply = self.send(&extend, record);
            for cmd in &ride.with_extend {
                let _ = self.send(cmd, &ride.route);
            }
            return reply;
        }
        let cmds: Vec<Cmd> = std::iter::once(extend).chain(ride.with_extend.iter().cloned()).collect();
        let (mut replies, _) = self.send_group(&cmds, record, false, false);
        replies.truncate(1);
        replies.pop().unwrap_or(Ok(Value::Nil))
    }

    /// Sends `cmd` to `key`'s node on a pooled connection; a connection
    /// that failed is dropped, so the next command gets a fresh one.
    fn send(&self, cmd: &Cmd, key: &str) -> RedisResult<Value> {
        self.on_pooled(&self.pool, |con| self.source.route(con, cmd, key.as_bytes()), Error::broke_connection)
    }

    /// A claim that may block (WAIT), on a connection whose replies may
    /// take that long.
    fn send_waiting(&self, cmd: &Cmd, key: &str) -> RedisResult<Value> {
        self.on_pooled(&self.waiting, |con| self.source.route(con, cmd, key.as_bytes()), Error::broke_connection)
    }

    /// A write of the loop (a claim, a DONE): with `durable`, followed by
    /// `WAIT` on the same connection in the same round trip.
    fn send_write(&self, cmd: &Cmd, key: &str, waits: bool) -> (RedisResult<Value>, Option<RedisResult<Value>>) {
        if self.core.wait.is_none() {
            return (if waits { self.send_waiting(cmd, key) } else { self.send(cmd, key) }, None);
        }
        let (mut replies, ack) = self.send_group(std::slice::from_ref(cmd), key, true, waits);
        (replies.pop().unwrap_or(Ok(Value::Nil)), ack)
    }

    /// Commands in one pipeline (on a connection of the waiting pool when
    /// they may block), with `WAIT` after them when `durable` and `write`.
    fn send_group(&self, cmds: &[Cmd], key: &str, write: bool, waits: bool) -> Replies {
        let mut cmds = cmds.to_vec();
        let wait = self.core.wait.clone().filter(|_| write);
        cmds.extend(wait.iter().cloned());
        let pool = if waits { &self.waiting } else { &self.pool };
        let reply = self.on_pooled(
            pool,
            |con| {
                let replies = self.source.route_pipeline(con, &cmds, key.as_bytes());
                match replies.iter().find_map(|r| r.as_ref().err().filter(|e| Error::broke_connection(e))) {
                    Some(e) => Err(e.clone()),
                    None => Ok(replies),
                }
            },
            Error::broke_connection,
        );
        let mut replies = reply.unwrap_or_else(|e| cmds.iter().map(|_| Err(e.clone())).collect());
        let ack = if wait.is_some() { replies.pop() } else { None };
        (replies, ack)
    }

    /// Runs `call` on a connection of `pool` (a new one when it is empty),
    /// given back unless `broken` says the error was the connection's.
    fn on_pooled<R, E>(
        &self,
        pool: &Mutex<Vec<S::Connection>>,
        call: impl FnOnce(&mut S::Connection) -> Result<R, E>,
        broken: impl Fn(&E) -> bool,
    ) -> Result<R, E>
    where
        E: From<redis::RedisError>,
    {
        let pooled = pool.lock().ok().and_then(|mut pool| pool.pop());
        let mut con = match pooled {
            Some(con) => con,
            None => {
                let waiting = std::ptr::eq(pool, &self.waiting);
                let timeout = if waiting { self.core.waiting_timeout() } else { self.core.reply_timeout() };
                self.source.connect(timeout)?
            }
        };
        let reply = call(&mut con);
        let broke = reply.as_ref().is_err_and(&broken);
        if let Ok(mut pool) = pool.lock() {
            match broke {
                // A failover: the other pooled connections are as stale.
                true => pool.clear(),
                false if pool.len() < 64 => pool.push(con),
                false => {}
            }
        }
        reply
    }
}

/// The instance's heartbeat thread: every half `heartbeat`, the due
/// EXTENDs; it ends when the instance is dropped.
fn heartbeat<S: ConnectionSource, C>(inner: Weak<Inner<S, C>>, tick: Duration) {
    loop {
        std::thread::sleep(tick);
        let Some(inner) = inner.upgrade() else { return };
        let core = &inner.core;
        for due in core.beats.due(core.edition, core.options.lease) {
            let reply = match due.ride.with_extend.is_empty() {
                true => inner.send(&due.extend, &due.job.record),
                false => inner.extend_riding(due.extend, &due.job.record, &due.ride),
            };
            if !core.on_extend(&due.job, reply) {
                core.beats.forget(due.id);
            }
        }
    }
}

impl<S: ConnectionSource, C> std::fmt::Debug for Idem<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let core = &self.inner.core;
        f.debug_struct("Idem").field("edition", &core.edition).field("options", &core.options).finish()
    }
}
