//! The sync client: [`Idem`]. Every decision is [`flow`](crate::flow)'s;
//! this sends, waits and runs the heartbeat in a thread.
use crate::cmd::{self, ClaimOptions, DoneOptions, Edition};
use crate::codec::{Codec, DefaultCodec};
use crate::commands::{decode, detect_edition, extended, flag};
use crate::error::{Error, ProcessError};
use crate::flow::{Backoff, Core, DoneItem, Next, Plan, ReleaseItem, Step};
use crate::many::KeyOutcome;
use crate::options::{Counters, Job, Options, Outcome, ProcessOptions, ReleaseReason, Stats};
use crate::reply::{Claim, Done, Record};
use crate::scan::{Scan, ScanOptions, Walk};
use crate::source::ConnectionSource;
use redis::{Cmd, FromRedisValue, RedisResult, Value};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Mutex;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

/// A redis-idem client on a connection source (`redis::Client` or
/// `redis::cluster::ClusterClient`), for any number of threads.
pub struct Idem<S: ConnectionSource, C = DefaultCodec> {
    source: S,
    core: Core<C>,
    pool: Mutex<Vec<S::Connection>>,
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
        let cluster = source.is_cluster();
        let core = Core { edition: Edition::Module, options, counters: Counters::default(), codec, cluster };
        let mut con = source.connect(core.response_timeout())?;
        let edition = match core.options.edition {
            Some(edition) => edition,
            None => detect_edition(&mut con)?,
        };
        Ok(Idem { source, core: Core { edition, ..core }, pool: Mutex::new(vec![con]) })
    }

    /// The edition this client uses.
    pub fn edition(&self) -> Edition {
        self.core.edition
    }

    /// The consumer loop's counters so far.
    pub fn stats(&self) -> Stats {
        self.core.counters.snapshot()
    }

    /// Sends `cmd` to `key`'s node on a pooled connection; a connection
    /// that failed is dropped, so the next command gets a fresh one.
    fn send(&self, cmd: &Cmd, key: &str) -> RedisResult<Value> {
        self.on_pooled(|con| self.source.route(con, cmd, key.as_bytes()), Error::broke_connection)
    }

    /// Sends `cmd` to the primary serving `slot` (one server: itself).
    pub(crate) fn send_to_primary(&self, cmd: &Cmd, slot: u16) -> RedisResult<Value> {
        self.on_pooled(|con| self.source.route_to_slot(con, cmd, slot), Error::broke_connection)
    }

    /// Runs `call` on a pooled connection, given back unless `broken` says
    /// the error was the connection's.
    fn on_pooled<R, E: From<redis::RedisError>>(
        &self,
        call: impl FnOnce(&mut S::Connection) -> Result<R, E>,
        broken: impl Fn(&E) -> bool,
    ) -> Result<R, E> {
        let pooled = self.pool.lock().ok().and_then(|mut pool| pool.pop());
        let mut con = match pooled {
            Some(con) => con,
            None => self.source.connect(self.core.response_timeout())?,
        };
        let reply = call(&mut con);
        if !reply.as_ref().is_err_and(&broken)
            && let Ok(mut pool) = self.pool.lock()
            && pool.len() < 64
        {
            pool.push(con);
        }
        reply
    }

    /// Runs `work` once for `key`, however often it is called for it:
    /// docs/clients.md's "What process does", in the README.
    pub fn process<T, E, F>(&self, key: &str, work: F) -> Result<Outcome<T>, ProcessError<T, E>>
    where
        C: Codec<T>,
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
        C: Codec<T>,
        F: FnOnce(&Job) -> Result<T, E>,
    {
        let core = &self.core;
        let key = core.key(key);
        let mut backoff = Backoff::new(core.options.wait);
        let (job, token) = loop {
            let (cmd, _) = core.claim_cmd(&key, &call.payload, &backoff)?;
            match core.on_claim(&key, decode(self.send(&cmd, &key)), &mut backoff)? {
                Step::Work(job, token) => break (job, token),
                Step::Return(outcome) => return Ok(outcome),
                Step::Again(pause) => std::thread::sleep(pause),
            }
        };
        if let Err(hook) = core.before_work(&job) {
            self.give_back(&job, &token, ReleaseReason::Hook);
            return Err(hook.into());
        }
        let jobs = [(job, token)];
        let ran = self.with_heartbeat(&jobs, || catch_unwind(AssertUnwindSafe(|| work(&jobs[0].0))));
        let [(job, token)] = jobs;
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
        let (mut settle, mut next) = core.settle(job, token, value);
        loop {
            match next {
                Next::Send(cmd, pause) => {
                    std::thread::sleep(pause);
                    next = settle.on_reply(core, self.send(&cmd, settle.key()));
                }
                Next::Finish(outcome) => return outcome,
            }
        }
    }

    /// Runs `f` while a thread EXTENDs every job's claim each beat.
    fn with_heartbeat<R>(&self, jobs: &[(Job, String)], f: impl FnOnce() -> R) -> R
    where
        C: Sync,
    {
        let Some((every, extends)) = self.core.heartbeat(jobs) else { return f() };
        std::thread::scope(|scope| {
            let (stop, stopped) = mpsc::channel::<()>();
            scope.spawn(move || {
                let mut live: Vec<bool> = vec![true; jobs.len()];
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                    for (i, (job, _)) in jobs.iter().enumerate() {
                        live[i] = live[i] && self.core.on_extend(job, self.send(&extends[i], &job.key));
                    }
                }
            });
            let ran = f();
            drop(stop);
            ran
        })
    }

    fn give_back(&self, job: &Job, token: &str, reason: ReleaseReason) {
        // Best effort: if it fails the lease lapses and the key is retried.
        let _ = self.send(&self.core.release_cmd(job, token), &job.key);
        self.core.released(job, reason);
    }

    // --- the commands, on the edition the server has (keys get the prefix) ---

    /// `IDEM.CLAIM` / `idem_claim`. WAIT and BLOOM are
    /// [`Error::ModuleRequired`] on the Functions edition.
    pub fn claim(&self, key: &str, lease: Duration, options: &ClaimOptions) -> Result<Claim, Error> {
        let key = self.core.key(key);
        decode(self.send(&cmd::claim(self.core.edition, &key, lease, options)?, &key))
    }

    pub fn done(&self, key: &str, token: &str, options: &DoneOptions) -> Result<Done, Error> {
        let key = self.core.key(key);
        decode(self.send(&cmd::done(self.core.edition, &key, token, options)?, &key))
    }

    pub fn release(&self, key: &str, token: &str) -> Result<bool, Error> {
        let key = self.core.key(key);
        flag(self.send(&cmd::release(self.core.edition, &key, token), &key))
    }

    pub fn extend(&self, key: &str, token: &str, lease: Duration) -> Result<(), Error> {
        let key = self.core.key(key);
        extended(self.send(&cmd::extend(self.core.edition, &key, token, lease)?, &key))
    }

    pub fn get(&self, key: &str) -> Result<Option<Record>, Error> {
        let key = self.core.key(key);
        decode(self.send(&cmd::get(self.core.edition, &key), &key))
    }

    pub fn once(&self, key: &str, retain: Duration) -> Result<bool, Error> {
        let key = self.core.key(key);
        flag(self.send(&cmd::once(self.core.edition, &key, retain)?, &key))
    }

    // --- operators ---

    /// The keys (without the prefix) of every record matching `options`,
    /// on every primary of a cluster in turn: the dead letters of
    /// `max_tries` n are `ScanOptions::new().state(RecordState::Released).min_tries(n)`.
    /// Options the server would refuse are [`Error::InvalidArgument`] here.
    pub fn scan(&self, options: &ScanOptions) -> Result<Scan<'_, S, C>, Error> {
        let walk = Walk::new(self.core.edition, options, &self.core.options.prefix)?;
        let primaries = self.on_pooled(|con| self.source.primaries(con), Error::is_connection_error)?;
        Ok(Scan { idem: self, walk: walk.over(primaries) })
    }

    /// `IDEM.REQUEUE` / `idem_requeue`: gives a record's work back. True
    /// when it is now released (its attempt kept, so the next claim is a
    /// `Retry` with attempt + 1; its tries restarted), false when there is
    /// no record. A processing record whose lease is live is refused with
    /// the server's error ([`Error::Redis`]), the record unchanged.
    pub fn requeue(&self, key: &str) -> Result<bool, Error> {
        let key = self.core.key(key);
        flag(self.send(&cmd::requeue(self.core.edition, &key), &key))
    }

    // --- batches ---

    fn run<R: FromRedisValue>(&self, plan: Plan) -> Vec<Result<R, Error>> {
        let replies = plan.sends.iter().map(|(_, cmd, route)| self.send(cmd, route)).collect();
        plan.gather(replies)
    }

    /// Claims many keys with the instance's MAXTRIES and BLOOM, no WAIT:
    /// one answer per key, in order, a key's error failing only that key.
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
        let keys: Vec<String> = keys.iter().map(|k| self.core.key(k)).collect();
        Ok(self.run(self.core.plan_claims(&keys, lease, payloads)?))
    }

    /// Completes many claims with the instance's RETAIN and BLOOM: one
    /// answer per item, in order.
    pub fn done_many(&self, items: &[DoneItem]) -> Result<Vec<Result<Done, Error>>, Error> {
        let items: Vec<DoneItem> = items.iter().map(|i| DoneItem { key: self.core.key(&i.key), ..i.clone() }).collect();
        Ok(self.run(self.core.plan_dones(&items)?))
    }

    /// Releases many claims: one answer per item (true: released), in order.
    pub fn release_many(&self, items: &[ReleaseItem]) -> Result<Vec<Result<bool, Error>>, Error> {
        let items: Vec<ReleaseItem> =
            items.iter().map(|i| ReleaseItem { key: self.core.key(&i.key), ..i.clone() }).collect();
        let answers: Vec<Result<i64, Error>> = self.run(self.core.plan_releases(&items)?);
        Ok(answers.into_iter().map(|a| a.map(|n| n == 1)).collect())
    }

    /// Claims the keys, runs `work` for each granted key in order (one
    /// heartbeat for the batch), completes the successes in one DONE batch
    /// and releases the failures in one RELEASE batch: one answer per key.
    pub fn process_many<T, E, F>(&self, keys: &[&str], work: F) -> Result<Vec<KeyOutcome<T, E>>, Error>
    where
        C: Codec<T>,
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
    ) -> Result<Vec<KeyOutcome<T, E>>, Error>
    where
        C: Codec<T>,
        F: FnMut(&Job) -> Result<T, E>,
    {
        let core = &self.core;
        let claims = self.claim_many_with(keys, core.options.lease, payloads)?;
        let mut many = core.many(keys, claims);
        let jobs = many.jobs();
        let mut todo = many.take_jobs().into_iter();
        let panic = self.with_heartbeat(&jobs, || {
            while let Some(job) = todo.next() {
                match catch_unwind(AssertUnwindSafe(|| work(&job.1))) {
                    Ok(ran) => many.ran(core, job, ran),
                    Err(panic) => {
                        many.panicked(core, std::iter::once(job).chain(todo.by_ref()).collect());
                        return Some(panic);
                    }
                }
            }
            None
        });
        let _ = self.run::<Value>(core.plan_releases(&many.release_items())?); // best effort, as in process
        let mut items = many.done_items();
        while !items.is_empty() {
            let answers = self.run(core.plan_dones(&items)?);
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

impl<S: ConnectionSource, C> std::fmt::Debug for Idem<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idem").field("edition", &self.core.edition).field("options", &self.core.options).finish()
    }
}
