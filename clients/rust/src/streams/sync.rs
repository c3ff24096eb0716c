//! [`StreamConsumer`]: the Streams consumer on the sync [`Idem`], one entry
//! at a time. Every decision is [`StreamCore`]'s; this sends and waits.
use super::core::{RECONNECT_PAUSE, Settling, Setup, StreamCore, WALK_STEPS};
use super::{Settled, StreamEntry, StreamOptions, StreamStats};
use crate::codec::{Codec, DefaultCodec};
use crate::error::{Error, ProcessError};
use crate::options::{Job, ProcessOptions};
use crate::source::ConnectionSource;
use crate::sync::Idem;
use std::fmt::Display;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// A consumer of `group` on `stream`, on an [`Idem`]'s server (in a
/// cluster: the stream's node; give the stream and the keys one hash tag
/// for `XACK` to ride with `DONE`).
///
/// ```no_run
/// use redis_idem_client::streams::{StreamConsumer, StreamOptions};
/// use redis_idem_client::{redis, Idem, Job, Options};
/// use std::time::Duration;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let idem = Idem::with_options(redis::Client::open("redis://127.0.0.1/")?,
///     Options::new().lease(Duration::from_secs(30)).max_tries(5))?;
/// let consumer = StreamConsumer::new(&idem, "orders", "billing", StreamOptions::new())?;
/// consumer.run(|entry, job: &Job| -> Result<String, std::io::Error> {
///     Ok(format!("charged {:?} (attempt {})", entry.field_str("body"), job.attempt()))
/// })?;
/// # Ok(()) }
/// ```
pub struct StreamConsumer<'a, S: ConnectionSource, C = DefaultCodec> {
    idem: &'a Idem<S, C>,
    core: StreamCore,
    stop: Arc<AtomicBool>,
}

impl<'a, S: ConnectionSource, C> StreamConsumer<'a, S, C> {
    /// A consumer of `group` on `stream`: settings checked, nothing sent
    /// (`run` creates the group when it is missing).
    pub fn new(idem: &'a Idem<S, C>, stream: &str, group: &str, options: StreamOptions) -> Result<Self, Error> {
        let core = StreamCore::new(stream, group, options, Setup::of(idem.core()))?;
        Ok(StreamConsumer { idem, core, stop: Arc::new(AtomicBool::new(false)) })
    }

    /// This consumer's name in the group.
    pub fn consumer(&self) -> &str {
        &self.core.consumer
    }

    /// The consumer's counters, and its Idem's.
    pub fn stats(&self) -> StreamStats {
        self.core.stats(self.idem.stats())
    }

    /// Stop taking entries: `run` returns once the one in hand is settled.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// The flag [`stop`](Self::stop) sets, for a signal handler
    /// (`signal_hook::flag::register(SIGTERM, consumer.stop_flag())`).
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    /// `XGROUP CREATE <stream> <group> 0 MKSTREAM`, unless the group exists.
    pub fn create_group(&self) -> Result<(), Error> {
        match crate::commands::decode::<redis::Value>(
            self.idem.send_cmd(&self.core.create_group_cmd(), &self.core.stream),
        ) {
            Err(e) if !StreamCore::group_exists(&e) => Err(e),
            _ => Ok(()),
        }
    }

    /// Reads and settles entries until [`stop`](Self::stop): `handler(entry,
    /// job)` is the work (pass `job.attempt()` to your writes), its value the
    /// record's result. A lost connection is waited out; a group that
    /// vanished is made again (with `create_group`); another error of the
    /// stream (`WRONGTYPE`, `NOGROUP` without `create_group`) ends it. A
    /// handler's panic goes up, as `process`'s does (its entry stays pending).
    pub fn run<T, E, F>(&self, mut handler: F) -> Result<(), Error>
    where
        C: Codec<T> + 'static,
        E: Display,
        F: FnMut(&StreamEntry, &Job) -> Result<T, E>,
    {
        if self.core.create_group {
            self.create_group()?;
        }
        while !self.stop.load(Ordering::Relaxed) {
            match self.poll(&mut handler) {
                Ok(_) => {}
                Err(e) if e.is_connection_error() || e.is_failover() => std::thread::sleep(RECONNECT_PAUSE),
                Err(e) if StreamCore::no_group(&e) && self.core.create_group => {
                    if let Err(e) = self.create_group()
                        && !(e.is_connection_error() || e.is_failover())
                    {
                        return Err(e);
                    }
                    std::thread::sleep(RECONNECT_PAUSE);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// One read (an entry pending past `claim_idle`, else a new one, waiting
    /// up to `block`), settled: what was done with it (none when nothing came).
    pub fn poll<T, E, F>(&self, handler: &mut F) -> Result<Vec<Settled>, Error>
    where
        C: Codec<T> + 'static,
        E: Display,
        F: FnMut(&StreamEntry, &Job) -> Result<T, E>,
    {
        let entries = self.fetch(1)?;
        Ok(entries.iter().map(|entry| self.handle(entry, &mut *handler)).collect())
    }

    fn fetch(&self, count: usize) -> Result<Vec<StreamEntry>, Error> {
        let core = &self.core;
        for _ in 0..WALK_STEPS {
            let Some(cmd) = core.autoclaim_cmd(count) else { break };
            match core.on_autoclaim(self.idem.send_cmd(&cmd, &core.stream))? {
                (entries, _) if !entries.is_empty() => return Ok(entries),
                (_, more) if !more => break,
                _ => {}
            }
        }
        core.on_read(self.idem.send_blocking(&core.read_cmd(count), &core.stream))
    }

    /// One entry of the group, read by this consumer (`run`'s, or one you
    /// read yourself), through the Idem's loop to its end.
    pub fn handle<T, E, F>(&self, entry: &StreamEntry, handler: F) -> Settled
    where
        C: Codec<T> + 'static,
        E: Display,
        F: FnOnce(&StreamEntry, &Job) -> Result<T, E>,
    {
        let core = &self.core;
        let (mut attempt, mut ridden) = (None, None);
        let (key, result) = match core.key_of(entry) {
            Ok(key) => {
                let call = ProcessOptions { payload: core.payload_of(entry) };
                let result = self.idem.process_riding(&key, &call, &core.ride(entry), &mut ridden, |job: &Job| {
                    attempt = Some(job.attempt());
                    handler(entry, job)
                });
                (Some(key), result)
            }
            Err(missing) => (None, Err(ProcessError::Idem(missing))),
        };
        let verdict = core.judge(&result, attempt);
        let sends = core.settle(entry, &verdict, &ridden);
        let ok = sends.iter().all(|send| self.send(send));
        core.settled(entry, key, verdict, ok)
    }

    /// One settling send: answered in full. One that may be sent again is,
    /// twice more, after a lost connection.
    fn send(&self, send: &Settling) -> bool {
        for pause in [0u64, 50, 200] {
            std::thread::sleep(Duration::from_millis(pause));
            let replies = self.idem.send_cmds(&send.cmds, &send.route);
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
}

impl<S: ConnectionSource, C> std::fmt::Debug for StreamConsumer<'_, S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamConsumer")
            .field("stream", &self.core.stream)
            .field("group", &self.core.group)
            .field("consumer", &self.core.consumer)
            .finish()
    }
}
