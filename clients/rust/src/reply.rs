//! The replies of the commands as types, decoded with redis-rs's
//! `FromRedisValue`: `IDEM.CLAIM`'s status as an enum, `IDEM.DONE`'s
//! 0/1/3/5/7, `IDEM.GET`'s record as a struct. The Functions edition sends
//! the same replies (bulk strings where the module sends simple ones).
use redis::{FromRedisValue, ParsingError, Value};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The answer of `IDEM.CLAIM`: `[status, value, attempt]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// No record: claimed; process, then DONE or RELEASE.
    New { token: String, attempt: u64 },
    /// No record, but the BLOOM filter says the key may have completed
    /// within its window: claimed; verify against the system of record
    /// before applying effects.
    Seen { token: String, attempt: u64 },
    /// The record was released or its lease lapsed: claimed; earlier
    /// attempts may have partly run.
    Retry { token: String, attempt: u64 },
    /// Already done: the stored result (None when none was kept).
    Done { result: Option<Vec<u8>>, attempt: u64 },
    /// Another claim's lease is live, with this much left on it.
    Busy { lease_left: Duration, attempt: u64 },
    /// PAYLOAD differs from the one stored: the key was reused.
    Mismatch { attempt: u64 },
    /// MAXTRIES is used up.
    Exhausted { attempt: u64 },
}

/// How a claim was granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Granted {
    New,
    Seen,
    Retry,
}

impl Claim {
    /// The record's attempt (the fencing number, for a granted claim).
    pub fn attempt(&self) -> u64 {
        match *self {
            Claim::New { attempt, .. }
            | Claim::Seen { attempt, .. }
            | Claim::Retry { attempt, .. }
            | Claim::Done { attempt, .. }
            | Claim::Busy { attempt, .. }
            | Claim::Mismatch { attempt }
            | Claim::Exhausted { attempt } => attempt,
        }
    }

    /// The token of a granted claim (NEW, SEEN, RETRY).
    pub fn token(&self) -> Option<&str> {
        match self {
            Claim::New { token, .. } | Claim::Seen { token, .. } | Claim::Retry { token, .. } => Some(token),
            _ => None,
        }
    }

    /// How the claim was granted, if it was.
    pub fn granted(&self) -> Option<Granted> {
        match self {
            Claim::New { .. } => Some(Granted::New),
            Claim::Seen { .. } => Some(Granted::Seen),
            Claim::Retry { .. } => Some(Granted::Retry),
            _ => None,
        }
    }

    /// The status word, as the server sends it.
    pub fn status(&self) -> &'static str {
        match self {
            Claim::New { .. } => "NEW",
            Claim::Seen { .. } => "SEEN",
            Claim::Retry { .. } => "RETRY",
            Claim::Done { .. } => "DONE",
            Claim::Busy { .. } => "BUSY",
            Claim::Mismatch { .. } => "MISMATCH",
            Claim::Exhausted { .. } => "EXHAUSTED",
        }
    }
}

fn fail(what: &str, v: &Value) -> ParsingError {
    format!("{what}, not {v:?}").into()
}

fn text(v: &Value) -> Option<&str> {
    match v {
        Value::SimpleString(s) => Some(s),
        Value::BulkString(b) => std::str::from_utf8(b).ok(),
        Value::VerbatimString { text, .. } => Some(text),
        _ => None,
    }
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(n) => Some(*n),
        other => text(other)?.parse().ok(),
    }
}

fn bytes(v: Value) -> Result<Option<Vec<u8>>, ParsingError> {
    match v {
        Value::Nil => Ok(None),
        Value::BulkString(b) => Ok(Some(b)),
        Value::SimpleString(s) => Ok(Some(s.into_bytes())),
        Value::VerbatimString { text, .. } => Ok(Some(text.into_bytes())),
        other => Err(fail("a string or nil", &other)),
    }
}

fn unsigned(v: &Value, what: &str) -> Result<u64, ParsingError> {
    int(v).and_then(|n| u64::try_from(n).ok()).ok_or_else(|| fail(what, v))
}

impl FromRedisValue for Claim {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let Value::Array(items) = v else { return Err(fail("IDEM.CLAIM answers a 3-element array", &v)) };
        let [status, value, attempt]: [Value; 3] =
            items.try_into().map_err(|items: Vec<Value>| fail("a 3-element array", &Value::Array(items)))?;
        let attempt = unsigned(&attempt, "an attempt")?;
        let token = |value: Value| -> Result<String, ParsingError> {
            match bytes(value)? {
                Some(b) => Ok(String::from_utf8(b)?),
                None => Err("a granted claim's token, not nil".to_string().into()),
            }
        };
        Ok(match text(&status).ok_or_else(|| fail("a status", &status))? {
            "NEW" => Claim::New { token: token(value)?, attempt },
            "SEEN" => Claim::Seen { token: token(value)?, attempt },
            "RETRY" => Claim::Retry { token: token(value)?, attempt },
            "DONE" => Claim::Done { result: bytes(value)?, attempt },
            "BUSY" => {
                Claim::Busy { lease_left: Duration::from_millis(unsigned(&value, "ms left on the lease")?), attempt }
            }
            "MISMATCH" => Claim::Mismatch { attempt },
            "EXHAUSTED" => Claim::Exhausted { attempt },
            other => return Err(format!("an IDEM.CLAIM status, not {other:?}").into()),
        })
    }
}

/// The answer of `IDEM.DONE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Done {
    /// This call completed the record (`1`, `3`, `5` or `7`): acknowledge
    /// the message. Under a full memory the RESULT may have been dropped
    /// (`3`, `7`: a later CLAIM replays nil), and the BLOOM filter add may
    /// have been dropped (`5`, `7`).
    Completed { result_dropped: bool, bloom_dropped: bool },
    /// `0`: the record was already done (by any token); nothing changed.
    AlreadyDone,
}

impl Done {
    /// Decodes the integer reply.
    pub fn from_code(code: i64) -> Option<Done> {
        match code {
            0 => Some(Done::AlreadyDone),
            1 | 3 | 5 | 7 => Some(Done::Completed { result_dropped: code & 2 != 0, bloom_dropped: code & 4 != 0 }),
            _ => None,
        }
    }

    /// True when this call completed the record.
    pub fn completed(&self) -> bool {
        matches!(self, Done::Completed { .. })
    }
}

impl FromRedisValue for Done {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        int(&v).and_then(Done::from_code).ok_or_else(|| fail("IDEM.DONE answers 0, 1, 3, 5 or 7", &v))
    }
}

/// A record's state, as `IDEM.GET` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecordState {
    Processing,
    Expired,
    Released,
    Done,
}

impl RecordState {
    /// The name the server uses (`IDEM.GET`'s `state`, `IDEM.SCAN`'s `STATE`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            RecordState::Processing => "processing",
            RecordState::Expired => "expired",
            RecordState::Released => "released",
            RecordState::Done => "done",
        }
    }
}

/// The answer of `IDEM.GET` for a key that has a record (the token is
/// never shown).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub state: RecordState,
    pub attempt: u64,
    /// Left on the lease; zero unless processing.
    pub lease_left: Duration,
    /// The key's PTTL; None when the key has no expiry (a user's PERSIST).
    pub ttl: Option<Duration>,
    /// The latest claim's time; None if never claimed (IDEM.ONCE, a late DONE).
    pub claimed_at: Option<SystemTime>,
    /// The completion's time; None unless done.
    pub done_at: Option<SystemTime>,
    /// The stored result.
    pub result: Option<Vec<u8>>,
    /// The payload's fingerprint, 32 hex digits (xxh3-128 in the module,
    /// SHA-1's first 128 bits in the Functions edition).
    pub fingerprint: Option<String>,
    /// The claims since the latest requeue (what `MAXTRIES` counts; equal
    /// to `attempt` for a record never requeued). None from a server older
    /// than `IDEM.REQUEUE`.
    pub tries: Option<u64>,
    /// The latest claim's `OWNER` (kept while processing, released or
    /// expired; dropped by `DONE`), None without one.
    pub owner: Option<String>,
}

fn time(ms: u64) -> Option<SystemTime> {
    (ms > 0).then(|| UNIX_EPOCH + Duration::from_millis(ms))
}

impl FromRedisValue for Record {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let pairs: Vec<(Value, Value)> = match v {
            Value::Map(pairs) => pairs,
            Value::Array(items) if items.len() % 2 == 0 => {
                let mut items = items.into_iter();
                std::iter::from_fn(|| Some((items.next()?, items.next()?))).collect()
            }
            other => return Err(fail("IDEM.GET answers a map, a field-value array or nil", &other)),
        };
        let (mut state, mut attempt, mut lease, mut pttl, mut claimed, mut done) = (None, None, 0, None, 0, 0);
        let (mut result, mut fingerprint, mut tries, mut owner) = (None, None, None, None);
        for (name, value) in pairs {
            match text(&name).unwrap_or_default() {
                "state" => {
                    state = Some(match text(&value) {
                        Some("processing") => RecordState::Processing,
                        Some("expired") => RecordState::Expired,
                        Some("released") => RecordState::Released,
                        Some("done") => RecordState::Done,
                        _ => return Err(fail("a record state", &value)),
                    })
                }
                "attempt" => attempt = Some(unsigned(&value, "attempt")?),
                "lease_ms" => lease = unsigned(&value, "lease_ms")?,
                "pttl" => pttl = Some(int(&value).ok_or_else(|| fail("pttl", &value))?),
                "claimed_at" => claimed = unsigned(&value, "claimed_at")?,
                "done_at" => done = unsigned(&value, "done_at")?,
                "result" => result = bytes(value)?,
                "fingerprint" => fingerprint = bytes(value)?.map(String::from_utf8).transpose()?,
                "tries" => tries = Some(unsigned(&value, "tries")?),
                "owner" => owner = bytes(value)?.map(String::from_utf8).transpose()?,
                _ => {} // a field a later version adds
            }
        }
        Ok(Record {
            state: state.ok_or_else(|| ParsingError::from("IDEM.GET without state".to_string()))?,
            attempt: attempt.ok_or_else(|| ParsingError::from("IDEM.GET without attempt".to_string()))?,
            lease_left: Duration::from_millis(lease),
            ttl: pttl.and_then(|ms| u64::try_from(ms).ok()).map(Duration::from_millis),
            claimed_at: time(claimed),
            done_at: time(done),
            result,
            fingerprint,
            tries,
            owner,
        })
    }
}
