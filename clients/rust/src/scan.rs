//! The operator's scan: `IDEM.SCAN` (or `FCALL_RO idem_scan 0`) walked to
//! its end on every primary in turn, since one call sees one node's keys.
//! [`Walk`] decides what to send and what the replies give, without I/O;
//! [`Scan`] (sync) and [`AsyncScan`] (tokio) only send.
use crate::cmd::{self, Edition};
use crate::commands::decode;
use crate::error::Error;
use crate::reply::RecordState;
use redis::{Cmd, RedisResult, Value};
use std::collections::VecDeque;
use std::time::Duration;

/// The filters of [`Idem::scan`](crate::Idem::scan): a record is listed
/// when it matches every one given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScanOptions {
    /// `STATE`: its state now.
    pub state: Option<RecordState>,
    /// `MINTRIES n` (n >= 1): at least n claims since its latest requeue.
    /// With state `Released` or `Expired` and a consumer's `max_tries` n,
    /// these are the keys that consumer is answered `Exhausted` for: its
    /// dead letters.
    pub min_tries: Option<u64>,
    /// `IDLE`: its latest change (claim, extension, release, requeue or
    /// completion) is at least this old; whole seconds, at least 1.
    pub idle: Option<Duration>,
    /// `MATCH`: a glob on the key, without the instance's prefix.
    pub pattern: Option<String>,
    /// `COUNT`: the server's hint of work per call (at least 1).
    pub count: Option<u32>,
}

impl ScanOptions {
    pub fn new() -> ScanOptions {
        ScanOptions::default()
    }
    pub fn state(mut self, state: RecordState) -> Self {
        self.state = Some(state);
        self
    }
    pub fn min_tries(mut self, n: u64) -> Self {
        self.min_tries = Some(n);
        self
    }
    pub fn idle(mut self, idle: Duration) -> Self {
        self.idle = Some(idle);
        self
    }
    pub fn pattern(mut self, glob: impl Into<String>) -> Self {
        self.pattern = Some(glob.into());
        self
    }
    pub fn count(mut self, count: u32) -> Self {
        self.count = Some(count);
        self
    }
}

/// `prefix` with the glob's special characters escaped, so that MATCH
/// takes it literally.
fn glob_literal(prefix: &str) -> String {
    let mut out = String::with_capacity(prefix.len());
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `IDEM.SCAN cursor [MATCH p] [COUNT n] [STATE s] [MINTRIES n] [IDLE s]`
/// or the Functions edition's `FCALL_RO idem_scan 0 cursor ...`; arguments
/// the server would refuse are refused here.
pub(crate) fn scan_cmd(edition: Edition, cursor: u64, options: &ScanOptions, prefix: &str) -> Result<Cmd, Error> {
    let mut cmd = match edition {
        Edition::Module => redis::cmd("IDEM.SCAN"),
        Edition::Functions => redis::cmd("FCALL_RO").arg("idem_scan").arg(0).to_owned(),
    };
    cmd.arg(cursor);
    match (&options.pattern, prefix.is_empty()) {
        (Some(glob), _) => cmd.arg("MATCH").arg(format!("{}{glob}", glob_literal(prefix))),
        (None, false) => cmd.arg("MATCH").arg(format!("{}*", glob_literal(prefix))),
        (None, true) => &mut cmd,
    };
    if let Some(count) = options.count {
        if count == 0 {
            return Err(Error::InvalidArgument("count must be at least 1".into()));
        }
        cmd.arg("COUNT").arg(count);
    }
    if let Some(state) = options.state {
        cmd.arg("STATE").arg(state.name());
    }
    if let Some(n) = options.min_tries {
        if n == 0 {
            return Err(Error::InvalidArgument("min_tries must be at least 1".into()));
        }
        cmd.arg("MINTRIES").arg(n);
    }
    if let Some(idle) = options.idle {
        cmd.arg("IDLE").arg(cmd::whole_seconds("idle", idle)?);
    }
    Ok(cmd)
}

#[cfg(feature = "cluster")]
/// One slot of each primary in `CLUSTER SLOTS`' reply, in slot order: a
/// command routed by it reaches that primary.
pub(crate) fn primary_slots(reply: Value) -> Result<Vec<u16>, Error> {
    let bad = || Error::UnexpectedReply("CLUSTER SLOTS: [[start, end, [host, port, ...], ...], ...]".into());
    let Value::Array(ranges) = reply else { return Err(bad()) };
    let mut firsts: Vec<(Value, u16)> = Vec::new();
    for range in ranges {
        let Value::Array(fields) = range else { return Err(bad()) };
        let (Some(Value::Int(start)), Some(Value::Array(primary))) = (fields.first(), fields.get(2)) else {
            return Err(bad());
        };
        let node = Value::Array(primary.iter().take(2).cloned().collect()); // host and port
        let start = u16::try_from(*start).map_err(|_| bad())?;
        match firsts.iter_mut().find(|(n, _)| *n == node) {
            Some((_, first)) => *first = (*first).min(start),
            None => firsts.push((node, start)),
        }
    }
    let mut slots: Vec<u16> = firsts.into_iter().map(|(_, slot)| slot).collect();
    slots.sort_unstable();
    Ok(slots)
}

/// Where a scan is: the primaries still to walk, the cursor on the current
/// one, the keys of the latest reply not yet handed out.
pub(crate) struct Walk {
    edition: Edition,
    options: ScanOptions,
    prefix: String,
    primaries: VecDeque<u16>,
    cursor: u64,
    keys: VecDeque<Vec<u8>>,
    ended: bool,
}

/// What a scan does next.
pub(crate) enum Turn {
    Key(Result<String, Error>),
    /// Send this to the primary serving this slot, then [`Walk::on_reply`].
    Send(Cmd, u16),
    End,
}

impl Walk {
    /// Checks the options before anything is sent; [`over`](Self::over)
    /// says where to walk.
    pub fn new(edition: Edition, options: &ScanOptions, prefix: &str) -> Result<Walk, Error> {
        scan_cmd(edition, 0, options, prefix)?;
        Ok(Walk {
            edition,
            options: options.clone(),
            prefix: prefix.to_string(),
            primaries: VecDeque::new(),
            cursor: 0,
            keys: VecDeque::new(),
            ended: false,
        })
    }

    /// The primaries to walk, by one slot of each.
    pub fn over(self, primaries: Vec<u16>) -> Walk {
        Walk { primaries: primaries.into(), ..self }
    }

    pub fn turn(&mut self) -> Turn {
        if let Some(key) = self.keys.pop_front() {
            let key =
                String::from_utf8(key).map_err(|e| Error::UnexpectedReply(format!("a key that is not UTF-8: {e}")));
            return Turn::Key(key.map(|k| k.strip_prefix(&self.prefix).map(str::to_string).unwrap_or(k)));
        }
        match (self.ended, self.primaries.front()) {
            (false, Some(&slot)) => match scan_cmd(self.edition, self.cursor, &self.options, &self.prefix) {
                Ok(cmd) => Turn::Send(cmd, slot),
                Err(e) => {
                    self.ended = true;
                    Turn::Key(Err(e))
                }
            },
            _ => Turn::End,
        }
    }

    /// A scan call's `[next-cursor, [key, ...]]`; cursor 0 ends this
    /// primary. An error ends the scan.
    pub fn on_reply(&mut self, reply: RedisResult<Value>) -> Option<Result<String, Error>> {
        match decode::<(u64, Vec<Vec<u8>>)>(reply) {
            Ok((cursor, keys)) => {
                self.keys.extend(keys);
                self.cursor = cursor;
                if cursor == 0 {
                    self.primaries.pop_front();
                }
                None
            }
            Err(e) => {
                self.ended = true;
                Some(Err(e))
            }
        }
    }
}

/// The keys of [`Idem::scan`](crate::Idem::scan), without the instance's
/// prefix, every primary in turn. A record present for the whole scan is
/// listed at least once (maybe more, as `SCAN` gives). An error of a scan
/// call is the last item.
pub struct Scan<'a, S: crate::ConnectionSource, C> {
    pub(crate) idem: &'a crate::Idem<S, C>,
    pub(crate) walk: Walk,
}

impl<S: crate::ConnectionSource, C> Iterator for Scan<'_, S, C> {
    type Item = Result<String, Error>;
    fn next(&mut self) -> Option<Self::Item> {
        loop {
            match self.walk.turn() {
                Turn::Key(key) => return Some(key),
                Turn::End => return None,
                Turn::Send(cmd, slot) => {
                    if let Some(error) = self.walk.on_reply(self.idem.send_to_primary(&cmd, slot)) {
                        return Some(error);
                    }
                }
            }
        }
    }
}

impl<S: crate::ConnectionSource, C> std::fmt::Debug for Scan<'_, S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scan").field("options", &self.walk.options).finish()
    }
}

/// The keys of [`AsyncIdem::scan`](crate::AsyncIdem::scan), as [`Scan`]'s:
/// `while let Some(key) = scan.next().await`.
#[cfg(feature = "tokio")]
pub struct AsyncScan<S: crate::AsyncConnectionSource, C> {
    pub(crate) idem: crate::AsyncIdem<S, C>,
    pub(crate) walk: Walk,
}

#[cfg(feature = "tokio")]
impl<S: crate::AsyncConnectionSource, C: Send + Sync + 'static> AsyncScan<S, C> {
    /// The next key, None at the end.
    pub async fn next(&mut self) -> Option<Result<String, Error>> {
        loop {
            match self.walk.turn() {
                Turn::Key(key) => return Some(key),
                Turn::End => return None,
                Turn::Send(cmd, slot) => {
                    if let Some(error) = self.walk.on_reply(self.idem.send_to_primary(cmd, slot).await) {
                        return Some(error);
                    }
                }
            }
        }
    }
}

#[cfg(feature = "tokio")]
impl<S: crate::AsyncConnectionSource, C> std::fmt::Debug for AsyncScan<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncScan").field("options", &self.walk.options).finish()
    }
}
