//! The Streams consumer's steps without I/O, shared by the sync and tokio
//! drivers: the commands it sends, what their replies say, and what the end
//! of a process() call means for an entry (docs/clients.md, "Consumers of
//! brokers").
use super::{Action, Fields, KeyFn, PayloadFn, Settled, StreamEntry, StreamOptions, StreamStats};
use crate::error::{Error, ProcessError};
use crate::options::{Outcome, Stats};
use crate::ride::{Ridden, Ride};
use redis::{Cmd, RedisResult, Value};
use std::fmt::Display;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How many `XAUTOCLAIM` calls one read may walk while they find nothing
/// idle (each looks at up to ten times its `COUNT` pending entries).
pub(crate) const WALK_STEPS: usize = 10;
/// After a lost connection (a restart, a failover), the pause before reading again.
pub(crate) const RECONNECT_PAUSE: Duration = Duration::from_millis(200);
/// The least an entry is held back: a holder's lease about to end is not spun on.
const MIN_DELAY: Duration = Duration::from_millis(100);

/// What the consumer was made with, from its Idem.
pub(crate) struct Setup {
    pub lease: Duration,
    pub owner: String,
    pub cluster: bool,
    /// The reply timeout of the connection `XREADGROUP ... BLOCK` waits on.
    pub max_block: Duration,
}

impl Setup {
    pub fn of<C>(core: &crate::flow::Core<C>) -> Setup {
        Setup {
            lease: core.options.lease,
            owner: core.owner().into_owned(),
            cluster: core.cluster,
            max_block: core.reply_timeout(),
        }
    }
}

pub(crate) struct StreamCore {
    pub stream: String,
    pub group: String,
    pub consumer: String,
    pub dead_letter: String,
    key: Option<KeyFn>,
    key_field: String,
    payload: Option<PayloadFn>,
    claim_idle: Duration,
    block: Duration,
    retry_delay: Duration,
    max_retry_delay: Duration,
    pub create_group: bool,
    /// The tokio consumer's (the sync one works one entry at a time).
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub concurrency: usize,
    cluster: bool,
    reader: Mutex<Reader>,
    acknowledged: AtomicU64,
    held_back: AtomicU64,
    dead_lettered: AtomicU64,
    trimmed_pending: AtomicU64,
}

/// `XAUTOCLAIM`'s walk of the group's pending entries.
struct Reader {
    cursor: String,
    /// When the next walk is due (after one that found nothing).
    claim_at: Instant,
}

/// What an entry's process() call means for it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Verdict {
    Ack { replayed: bool },
    Hold { delay: Duration, error: String },
    Dead { error: String },
}

/// Commands for one node, in one pipeline; `retry`: safe to send again
/// after a lost connection; `multi`: a `MULTI` ... `EXEC`.
pub(crate) struct Settling {
    pub cmds: Vec<Cmd>,
    pub route: String,
    pub retry: bool,
    pub multi: bool,
}

impl Settling {
    /// Whether its replies say every command ran (a `MULTI` whose `EXEC`
    /// was aborted, nil or an error, did not).
    pub fn answered(&self, replies: &[RedisResult<Value>]) -> bool {
        let fine = |v: &Value| !matches!(v, Value::ServerError(_));
        let all = replies.len() == self.cmds.len() && replies.iter().all(|r| matches!(r, Ok(v) if fine(v)));
        match (self.multi, replies.last()) {
            (true, Some(Ok(Value::Array(items)))) => all && items.iter().all(fine),
            (true, _) => false,
            (false, _) => all,
        }
    }
}

fn invalid(message: String) -> Error {
    Error::InvalidArgument(message)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl StreamCore {
    pub fn new(stream: &str, group: &str, options: StreamOptions, setup: Setup) -> Result<StreamCore, Error> {
        let claim_idle = options.claim_idle.unwrap_or(setup.lease);
        if stream.is_empty() || group.is_empty() {
            return Err(invalid("the stream and the group need names".into()));
        }
        if claim_idle < setup.lease {
            return Err(invalid(format!(
                "claim_idle ({claim_idle:?}) must be at least the Idem's lease ({:?}): an entry is taken over only once its holder's lease can have lapsed",
                setup.lease
            )));
        }
        if options.block.is_zero() || options.block >= setup.max_block {
            return Err(invalid(format!("block must be more than zero and less than {:?}", setup.max_block)));
        }
        if options.retry_delay.is_zero() || options.retry_delay > options.max_retry_delay {
            return Err(invalid("retry_delay: more than zero, and at most its max".into()));
        }
        if options.concurrency == 0 {
            return Err(invalid("concurrency must be at least 1".into()));
        }
        let consumer = options.consumer.unwrap_or(setup.owner);
        if consumer.is_empty() {
            return Err(invalid("the consumer needs a name".into()));
        }
        Ok(StreamCore {
            stream: stream.to_string(),
            group: group.to_string(),
            consumer,
            dead_letter: options.dead_letter.unwrap_or_else(|| format!("{stream}:dlq")),
            key: options.key,
            key_field: options.key_field,
            payload: options.payload,
            claim_idle,
            block: options.block,
            retry_delay: options.retry_delay,
            max_retry_delay: options.max_retry_delay,
            create_group: options.create_group,
            concurrency: options.concurrency,
            cluster: setup.cluster,
            reader: Mutex::new(Reader { cursor: "0-0".into(), claim_at: Instant::now() }),
            acknowledged: AtomicU64::new(0),
            held_back: AtomicU64::new(0),
            dead_lettered: AtomicU64::new(0),
            trimmed_pending: AtomicU64::new(0),
        })
    }

    pub fn stats(&self, idem: Stats) -> StreamStats {
        let load = |n: &AtomicU64| n.load(Ordering::Relaxed);
        StreamStats {
            idem,
            acknowledged: load(&self.acknowledged),
            held_back: load(&self.held_back),
            dead_lettered: load(&self.dead_lettered),
            trimmed_pending: load(&self.trimmed_pending),
        }
    }

    // --- reading ---

    /// `XGROUP CREATE stream group 0 MKSTREAM`: a new group reads the
    /// stream from its start (nothing published before it is missed).
    pub fn create_group_cmd(&self) -> Cmd {
        redis::cmd("XGROUP").arg("CREATE").arg(&self.stream).arg(&self.group).arg("0").arg("MKSTREAM").to_owned()
    }

    /// Whether an error of `XGROUP CREATE` is the group being there already.
    pub fn group_exists(error: &Error) -> bool {
        error.to_string().contains("BUSYGROUP")
    }

    /// Whether a read's error is the group (or the stream) being gone.
    pub fn no_group(error: &Error) -> bool {
        error.to_string().contains("NOGROUP")
    }

    /// The next step of `XAUTOCLAIM`'s walk, when one is due: up to `count`
    /// entries pending past `claim_idle`.
    pub fn autoclaim_cmd(&self, count: usize) -> Option<Cmd> {
        let reader = self.reader.lock().ok()?;
        (Instant::now() >= reader.claim_at).then(|| {
            redis::cmd("XAUTOCLAIM")
                .arg(&self.stream)
                .arg(&self.group)
                .arg(&self.consumer)
                .arg(millis(self.claim_idle))
                .arg(&reader.cursor)
                .arg("COUNT")
                .arg(count)
                .to_owned()
        })
    }

    /// `XAUTOCLAIM`'s answer: the entries taken over, and whether the walk
    /// goes on. A walk ended with nothing found is next due after the
    /// shorter of `block` and half of `claim_idle`.
    pub fn on_autoclaim(&self, reply: RedisResult<Value>) -> Result<(Vec<StreamEntry>, bool), Error> {
        let Value::Array(parts) = lift(reply)? else { return Err(unexpected("XAUTOCLAIM")) };
        let mut parts = parts.into_iter();
        let cursor = text(parts.next()).ok_or_else(|| unexpected("XAUTOCLAIM's cursor"))?;
        let (entries, gone) = self.entries(parts.next().unwrap_or(Value::Nil))?;
        let deleted = match parts.next() {
            Some(Value::Array(ids)) => ids.len(),
            _ => 0,
        };
        self.trimmed_pending.fetch_add((gone + deleted) as u64, Ordering::Relaxed);
        let more = cursor != "0-0";
        if let Ok(mut reader) = self.reader.lock() {
            if !more && entries.is_empty() {
                reader.claim_at = Instant::now() + self.block.min(self.claim_idle / 2);
            }
            reader.cursor = cursor;
        }
        Ok((entries, more))
    }

    /// `XREADGROUP GROUP group consumer COUNT count BLOCK block STREAMS stream >`.
    pub fn read_cmd(&self, count: usize) -> Cmd {
        redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(&self.group)
            .arg(&self.consumer)
            .arg("COUNT")
            .arg(count)
            .arg("BLOCK")
            .arg(millis(self.block).max(1))
            .arg("STREAMS")
            .arg(&self.stream)
            .arg(">")
            .to_owned()
    }

    /// `XREADGROUP`'s answer (RESP2 or RESP3): the new entries.
    pub fn on_read(&self, reply: RedisResult<Value>) -> Result<Vec<StreamEntry>, Error> {
        let streams = match lift(reply)? {
            Value::Nil => return Ok(Vec::new()),
            Value::Array(streams) => streams
                .into_iter()
                .filter_map(|s| match s {
                    Value::Array(pair) if pair.len() == 2 => pair.into_iter().nth(1),
                    _ => None,
                })
                .collect::<Vec<_>>(),
            Value::Map(streams) => streams.into_iter().map(|(_, entries)| entries).collect(),
            _ => return Err(unexpected("XREADGROUP")),
        };
        let mut out = Vec::new();
        for entries in streams {
            out.extend(self.entries(entries)?.0);
        }
        Ok(out)
    }

    /// Entries `[[id, [field, value, ...]], ...]`, and how many came
    /// without fields (deleted from the stream while pending).
    fn entries(&self, value: Value) -> Result<(Vec<StreamEntry>, usize), Error> {
        let Value::Array(items) = value else { return Ok((Vec::new(), 0)) };
        let (mut entries, mut gone) = (Vec::with_capacity(items.len()), 0);
        for item in items {
            let Value::Array(pair) = item else { return Err(unexpected("a stream entry")) };
            let mut pair = pair.into_iter();
            let id = text(pair.next()).ok_or_else(|| unexpected("a stream entry's id"))?;
            let fields = match pair.next() {
                Some(Value::Array(flat)) => pairs(flat)?,
                Some(Value::Map(map)) => {
                    map.into_iter().map(|(n, v)| Ok((bytes(n)?, bytes(v)?))).collect::<Result<_, Error>>()?
                }
                _ => {
                    gone += 1;
                    continue;
                }
            };
            entries.push(StreamEntry { stream: self.stream.clone(), id, fields });
        }
        Ok((entries, gone))
    }

    // --- one entry ---

    /// The entry's key: the key function's, or the key field's.
    pub fn key_of(&self, entry: &StreamEntry) -> Result<String, Error> {
        let key = match &self.key {
            Some(key) => key(entry),
            None => entry.field_str(&self.key_field).map(str::to_owned),
        };
        match key {
            Some(key) if !key.is_empty() => Ok(key),
            _ => Err(Error::MissingKey {
                what: match &self.key {
                    Some(_) => format!("the key function found none in entry {}", entry.id),
                    None => format!("entry {} has no {} field", entry.id, self.key_field),
                },
            }),
        }
    }

    pub fn payload_of(&self, entry: &StreamEntry) -> Option<Vec<u8>> {
        self.payload.as_ref().and_then(|payload| payload(entry))
    }

    /// What rides with the entry's DONE (its `XACK`) and with each EXTEND
    /// of its work (an `XCLAIM ... JUSTID` that keeps it from looking idle).
    pub fn ride(&self, entry: &StreamEntry) -> Ride {
        Ride { route: self.stream.clone(), with_done: vec![self.xack(entry)], with_extend: vec![self.touch(entry)] }
    }

    fn xack(&self, entry: &StreamEntry) -> Cmd {
        redis::cmd("XACK").arg(&self.stream).arg(&self.group).arg(&entry.id).to_owned()
    }

    fn touch(&self, entry: &StreamEntry) -> Cmd {
        redis::cmd("XCLAIM")
            .arg(&self.stream)
            .arg(&self.group)
            .arg(&self.consumer)
            .arg(0)
            .arg(&entry.id)
            .arg("JUSTID")
            .to_owned()
    }

    /// What the end of the entry's process() call means for it; `attempt`
    /// is the one its work ran with, if it ran.
    pub fn judge<T, E: Display>(
        &self,
        result: &Result<Outcome<T>, ProcessError<T, E>>,
        attempt: Option<u64>,
    ) -> Verdict {
        let hold = |delay: Duration, error: &dyn Display| Verdict::Hold {
            delay: delay.max(MIN_DELAY),
            error: error.to_string(),
        };
        let error = match result {
            Ok(outcome) => return Verdict::Ack { replayed: outcome.is_replay() },
            Err(ProcessError::Work(e)) => return hold(self.failure_delay(attempt), e),
            Err(ProcessError::Idem(e))
            | Err(ProcessError::Completed { error: e, .. })
            | Err(ProcessError::Unsettled { error: e, .. })
            | Err(ProcessError::Replayed { error: e, .. }) => e,
        };
        match (result, error) {
            // The record is done: a result or a hook's trouble does not undo it.
            (Err(ProcessError::Completed { .. }), Error::NotDurable { .. }) => hold(self.retry_delay, error),
            (Err(ProcessError::Completed { .. }), _) => Verdict::Ack { replayed: false },
            // A replay whose stored result did not decode: the record is done.
            (_, Error::Codec(_)) => Verdict::Ack { replayed: true },
            // No redelivery can change these.
            (_, Error::Exhausted { .. } | Error::Mismatch { .. } | Error::MissingKey { .. }) => {
                Verdict::Dead { error: error.to_string() }
            }
            (_, Error::Busy { lease_left, .. }) => hold(*lease_left, error),
            // The redelivery replays, or fences.
            (_, Error::LeaseLost { .. } | Error::DoneUnconfirmed { .. } | Error::NotDurable { .. }) => {
                hold(self.retry_delay, error)
            }
            (Err(ProcessError::Unsettled { .. }), _) => hold(self.retry_delay, error),
            _ => hold(self.failure_delay(attempt), error),
        }
    }

    /// A failure's delay: `retry_delay` after the first try, doubling with
    /// each attempt up to its max.
    fn failure_delay(&self, attempt: Option<u64>) -> Duration {
        let doublings = attempt.unwrap_or(1).saturating_sub(1).min(30) as u32;
        self.retry_delay.saturating_mul(1u32 << doublings).min(self.max_retry_delay)
    }

    /// What settles the entry. `ridden`: the replies of the `XACK` that
    /// rode with its latest DONE (`None`: none rode).
    pub fn settle(&self, entry: &StreamEntry, verdict: &Verdict, ridden: &Ridden) -> Vec<Settling> {
        let here = |cmds: Vec<Cmd>, retry: bool| Settling { cmds, route: self.stream.clone(), retry, multi: false };
        match verdict {
            Verdict::Ack { .. } if acked(ridden) => Vec::new(),
            Verdict::Ack { .. } => vec![here(vec![self.xack(entry)], true)],
            Verdict::Hold { delay, .. } => {
                // Pending still (or again, FORCE: DONE's XACK may have run),
                // handed out again once `delay` has passed.
                let idle = millis(self.claim_idle.saturating_sub(*delay));
                let mut xclaim = redis::cmd("XCLAIM");
                xclaim.arg(&self.stream).arg(&self.group).arg(&self.consumer).arg(0).arg(&entry.id);
                xclaim.arg("IDLE").arg(idle).arg("JUSTID");
                if ridden.is_some() {
                    xclaim.arg("FORCE");
                }
                vec![here(vec![xclaim], true)]
            }
            Verdict::Dead { error } => {
                let mut xadd = redis::cmd("XADD");
                xadd.arg(&self.dead_letter).arg("*");
                for (name, value) in &entry.fields {
                    xadd.arg(name).arg(value);
                }
                xadd.arg("original-stream").arg(&self.stream).arg("original-id").arg(&entry.id).arg("error").arg(error);
                // Sent once: a second send after a lost reply could add a
                // second copy. Across nodes XADD goes first: a crash between
                // the two leaves a copy, never a lost entry.
                match self.cluster
                    && crate::plan::slot(self.dead_letter.as_bytes()) != crate::plan::slot(self.stream.as_bytes())
                {
                    false => vec![Settling {
                        cmds: vec![redis::cmd("MULTI"), xadd, self.xack(entry), redis::cmd("EXEC")],
                        route: self.stream.clone(),
                        retry: false,
                        multi: true,
                    }],
                    true => vec![
                        Settling { cmds: vec![xadd], route: self.dead_letter.clone(), retry: false, multi: false },
                        here(vec![self.xack(entry)], false),
                    ],
                }
            }
        }
    }

    /// The entry's end, once `settle`'s sends were answered (`ok`: all
    /// without error): counted.
    pub fn settled(&self, entry: &StreamEntry, key: Option<String>, verdict: Verdict, ok: bool) -> Settled {
        let (action, error, counter) = match verdict {
            _ if !ok => (Action::Left, None, None),
            Verdict::Ack { replayed } => (Action::Acknowledged { replayed }, None, Some(&self.acknowledged)),
            Verdict::Hold { delay, error } => {
                (Action::HeldBack { delay: delay.min(self.claim_idle) }, Some(error), Some(&self.held_back))
            }
            Verdict::Dead { error } => (Action::DeadLettered, Some(error), Some(&self.dead_lettered)),
        };
        if let Some(counter) = counter {
            counter.fetch_add(1, Ordering::Relaxed);
        }
        Settled { id: entry.id.clone(), key, action, error }
    }
}

/// Whether the `XACK` that rode with DONE ran.
fn acked(ridden: &Ridden) -> bool {
    matches!(ridden.as_deref(), Some([Ok(Value::Int(_))]))
}

/// A reply with the server's error lifted into [`Error`].
fn lift(reply: RedisResult<Value>) -> Result<Value, Error> {
    match reply {
        Err(e) => Err(Error::from_server(e)),
        Ok(Value::ServerError(e)) => Err(Error::from_server(e.into())),
        Ok(value) => Ok(value),
    }
}

fn unexpected(what: &str) -> Error {
    Error::UnexpectedReply(format!("{what}: not the shape Redis answers"))
}

fn text(value: Option<Value>) -> Option<String> {
    match value? {
        Value::BulkString(b) => String::from_utf8(b).ok(),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

fn bytes(value: Value) -> Result<Vec<u8>, Error> {
    match value {
        Value::BulkString(b) => Ok(b),
        Value::SimpleString(s) => Ok(s.into_bytes()),
        Value::Int(n) => Ok(n.to_string().into_bytes()),
        _ => Err(unexpected("a stream field")),
    }
}

fn pairs(flat: Vec<Value>) -> Result<Fields, Error> {
    if !flat.len().is_multiple_of(2) {
        return Err(unexpected("a stream entry's fields"));
    }
    let mut out = Vec::with_capacity(flat.len() / 2);
    let mut flat = flat.into_iter();
    while let (Some(name), Some(value)) = (flat.next(), flat.next()) {
        out.push((bytes(name)?, bytes(value)?));
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
