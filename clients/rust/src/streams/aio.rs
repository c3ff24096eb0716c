//! [`AsyncStreamConsumer`]: the Streams consumer on [`AsyncIdem`], up to
//! `concurrency` entries at work at once, each read only when a slot is
//! free. Every decision is [`StreamCore`]'s; this sends and awaits.
use super::core::{RECONNECT_PAUSE, Settling, Setup, StreamCore, WALK_STEPS};
use super::{Settled, StreamEntry, StreamOptions, StreamStats};
use crate::codec::{Codec, DefaultCodec};
use crate::error::{Error, ProcessError};
use crate::options::{Job, ProcessOptions};
use crate::source::AsyncConnectionSource;
use crate::tokio_client::AsyncIdem;
use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::task::JoinSet;

/// [`StreamConsumer`](super::StreamConsumer) on an [`AsyncIdem`]: `run`
/// keeps up to [`concurrency`](StreamOptions::concurrency) entries at work,
/// each in a task of its own.
///
/// ```no_run
/// use redis_idem_client::streams::{AsyncStreamConsumer, StreamOptions};
/// use redis_idem_client::{redis, AsyncIdem, Job, Options};
///
/// # async fn consume() -> Result<(), Box<dyn std::error::Error>> {
/// let idem = AsyncIdem::with_options(redis::Client::open("redis://127.0.0.1/")?, Options::new().max_tries(5)).await?;
/// let consumer = AsyncStreamConsumer::new(idem, "orders", "billing", StreamOptions::new().concurrency(8))?;
/// consumer.run(|entry, job: Job| async move {
///     Ok::<_, std::io::Error>(format!("charged {:?} (attempt {})", entry.field_str("body"), job.attempt()))
/// }).await?;
/// # Ok(()) }
/// ```
pub struct AsyncStreamConsumer<S: AsyncConnectionSource, C = DefaultCodec> {
    idem: AsyncIdem<S, C>,
    core: Arc<StreamCore>,
    stop: Arc<AtomicBool>,
}

impl<S: AsyncConnectionSource, C: Send + Sync + 'static> AsyncStreamConsumer<S, C> {
    /// As [`StreamConsumer::new`](super::StreamConsumer::new).
    pub fn new(idem: AsyncIdem<S, C>, stream: &str, group: &str, options: StreamOptions) -> Result<Self, Error> {
        let core = StreamCore::new(stream, group, options, Setup::of(idem.core()))?;
        Ok(AsyncStreamConsumer { idem, core: Arc::new(core), stop: Arc::new(AtomicBool::new(false)) })
    }

    pub fn consumer(&self) -> &str {
        &self.core.consumer
    }

    pub fn stats(&self) -> StreamStats {
        self.core.stats(self.idem.stats())
    }

    /// Stop taking entries: `run` returns once those in hand are settled.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// The flag [`stop`](Self::stop) sets, for another task to set.
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    /// As [`StreamConsumer::create_group`](super::StreamConsumer::create_group).
    pub async fn create_group(&self) -> Result<(), Error> {
        let reply = self.idem.send_cmd(self.core.create_group_cmd(), &self.core.stream).await;
        match crate::commands::decode::<redis::Value>(reply) {
            Err(e) if !StreamCore::group_exists(&e) => Err(e),
            _ => Ok(()),
        }
    }

    /// As [`StreamConsumer::run`](super::StreamConsumer::run), with up to
    /// `concurrency` entries at work, `handler(entry, job)` in a task each.
    /// A handler's panic stops the consumer: the other entries in hand are
    /// settled, then the panic goes up.
    pub async fn run<T, E, F, Fut>(&self, handler: F) -> Result<(), Error>
    where
        C: Codec<T>,
        T: Send + 'static,
        E: Display + Send + 'static,
        F: Fn(StreamEntry, Job) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        let handler = Arc::new(handler);
        if self.core.create_group {
            self.create_group().await?;
        }
        let mut tasks = JoinSet::new();
        let mut panic = None;
        let mut reap = |ended: Result<Settled, tokio::task::JoinError>, stop: &AtomicBool| {
            if let Err(e) = ended
                && e.is_panic()
            {
                stop.store(true, Ordering::Relaxed);
                panic.get_or_insert(e.into_panic());
            }
        };
        let result = loop {
            while let Some(ended) = tasks.try_join_next() {
                reap(ended, &self.stop);
            }
            if self.stop.load(Ordering::Relaxed) {
                break Ok(());
            }
            let free = self.core.concurrency.saturating_sub(tasks.len());
            if free == 0 {
                if let Some(ended) = tasks.join_next().await {
                    reap(ended, &self.stop);
                }
                continue;
            }
            match self.fetch(free).await {
                Ok(entries) => {
                    for entry in entries {
                        let (idem, core, handler) = (self.idem.clone(), self.core.clone(), handler.clone());
                        tasks.spawn(async move { handle(&idem, &core, entry, &*handler).await });
                    }
                }
                Err(e) if e.is_connection_error() || e.is_failover() => tokio::time::sleep(RECONNECT_PAUSE).await,
                Err(e) if StreamCore::no_group(&e) && self.core.create_group => {
                    if let Err(e) = self.create_group().await
                        && !(e.is_connection_error() || e.is_failover())
                    {
                        break Err(e);
                    }
                    tokio::time::sleep(RECONNECT_PAUSE).await;
                }
                Err(e) => break Err(e),
            }
        };
        while let Some(ended) = tasks.join_next().await {
            reap(ended, &self.stop);
        }
        if let Some(panic) = panic {
            std::panic::resume_unwind(panic);
        }
        result
    }

    async fn fetch(&self, count: usize) -> Result<Vec<StreamEntry>, Error> {
        let core = &self.core;
        for _ in 0..WALK_STEPS {
            let Some(cmd) = core.autoclaim_cmd(count) else { break };
            match core.on_autoclaim(self.idem.send_cmd(cmd, &core.stream).await)? {
                (entries, _) if !entries.is_empty() => return Ok(entries),
                (_, more) if !more => break,
                _ => {}
            }
        }
        core.on_read(self.idem.send_blocking(core.read_cmd(count), &core.stream).await)
    }

    /// As [`StreamConsumer::handle`](super::StreamConsumer::handle).
    pub async fn handle<T, E, F, Fut>(&self, entry: StreamEntry, handler: F) -> Settled
    where
        C: Codec<T>,
        E: Display,
        F: Fn(StreamEntry, Job) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        handle(&self.idem, &self.core, entry, &handler).await
    }
}

async fn handle<S, C, T, E, F, Fut>(
    idem: &AsyncIdem<S, C>,
    core: &StreamCore,
    entry: StreamEntry,
    handler: &F,
) -> Settled
where
    S: AsyncConnectionSource,
    C: Codec<T> + Send + Sync + 'static,
    E: Display,
    F: Fn(StreamEntry, Job) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let (attempt, mut ridden) = (AtomicU64::new(0), None);
    let (key, result) = match core.key_of(&entry) {
        Ok(key) => {
            let call = ProcessOptions { payload: core.payload_of(&entry) };
            let work = |job: Job| {
                attempt.store(job.attempt(), Ordering::Relaxed);
                handler(entry.clone(), job)
            };
            let result = idem.process_riding(&key, &call, &core.ride(&entry), &mut ridden, work).await;
            (Some(key), result)
        }
        Err(missing) => (None, Err(ProcessError::Idem(missing))),
    };
    let attempt = Some(attempt.load(Ordering::Relaxed)).filter(|a| *a > 0);
    let verdict = core.judge(&result, attempt);
    let mut ok = true;
    for send in core.settle(&entry, &verdict, &ridden) {
        ok = ok && send_settling(idem, &send).await;
    }
    core.settled(&entry, key, verdict, ok)
}

/// As the sync consumer's: answered in full; one that may be sent again
/// is, twice more, after a lost connection.
async fn send_settling<S: AsyncConnectionSource, C: Send + Sync + 'static>(
    idem: &AsyncIdem<S, C>,
    send: &Settling,
) -> bool {
    for pause in [0u64, 50, 200] {
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let replies = idem.send_cmds(send.cmds.clone(), &send.route).await;
        if send.answered(&replies) {
            return true;
        }
        let lost = replies.iter().any(|r| r.as_ref().is_err_and(Error::broke_connection));
        if !send.retry || !lost {
            return false;
        }
    }
    false
}

impl<S: AsyncConnectionSource, C> std::fmt::Debug for AsyncStreamConsumer<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncStreamConsumer")
            .field("stream", &self.core.stream)
            .field("group", &self.core.group)
            .field("consumer", &self.core.consumer)
            .field("concurrency", &self.core.concurrency)
            .finish()
    }
}
