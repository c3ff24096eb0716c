//! The errors of this crate: the module's own (STALE, the Functions
//! edition's refusals) as variants, the consumer loop's outcomes that are
//! not a result (MISMATCH, EXHAUSTED, still BUSY, a lost lease), and
//! redis-rs's errors for everything else.
use std::time::Duration;

/// A boxed error, as codecs return it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What went wrong in a command or in the consumer loop.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The connection or the server failed, or answered an error this
    /// crate has no variant for (WRONGTYPE, a syntax error, ...).
    #[error(transparent)]
    Redis(#[from] redis::RedisError),
    /// `STALE`: the token no longer holds the claim (DONE or EXTEND after
    /// another claim took the key).
    #[error("STALE {0}")]
    Stale(String),
    /// The key was claimed before with another payload: it was reused for
    /// different content. Reject the message.
    #[error("idempotency key {key:?} was used before with another payload (attempt {attempt})")]
    Mismatch { key: String, attempt: u64 },
    /// `MAXTRIES` is used up: dead-letter the message.
    #[error("idempotency key {key:?} exhausted its tries (attempt {attempt})")]
    Exhausted { key: String, attempt: u64 },
    /// Another worker still holds the key after the configured wait: do not
    /// acknowledge the message; it comes back later.
    #[error("idempotency key {key:?} is still being processed by another worker ({lease_left:?} left on its lease)")]
    Busy { key: String, lease_left: Duration, attempt: u64 },
    /// This worker's claim was taken over (its lease lapsed and another
    /// worker claimed the key): its result was not recorded, the other
    /// worker's will be.
    #[error("the claim on {key:?} (attempt {attempt}) was lost: its lease lapsed and another worker took the key over")]
    LeaseLost { key: String, attempt: u64 },
    /// The record was completed, without its result, because the result was
    /// larger than the server keeps (`idem.max-result`); only returned with
    /// [`OversizePolicy::CompleteAndError`](crate::OversizePolicy::CompleteAndError).
    #[error("the result for {key:?} is {size} bytes, more than the server keeps: the record was completed without it")]
    ResultTooLarge { key: String, size: usize },
    /// The edition on the server cannot do this (the Functions edition has
    /// no WAIT, BLOOM, batch commands or INFO counters).
    #[error("{0}")]
    Unsupported(String),
    /// Neither the module nor the Functions library is on the server.
    #[error(
        "redis-idem is not on this server: load the module (loadmodule libredis_idem.so) or the Functions library (FUNCTION LOAD REPLACE < functions/idem.lua)"
    )]
    NotInstalled,
    /// A result could not be encoded or a stored one decoded.
    #[error("result codec: {0}")]
    Codec(#[source] BoxError),
    /// A reply of a shape no version of redis-idem sends.
    #[error("unexpected reply: {0}")]
    UnexpectedReply(String),
}

impl Error {
    /// Sorts a server error into this crate's variants.
    pub(crate) fn from_server(error: redis::RedisError) -> Error {
        if error.code() == Some("STALE") {
            return Error::Stale(error.detail().unwrap_or_default().to_string());
        }
        let text = error.to_string();
        if text.contains("needs the redis-idem module") {
            return Error::Unsupported(
                error.detail().map_or(text.clone(), |d| format!("{} {d}", error.code().unwrap_or("ERR"))),
            );
        }
        Error::Redis(error)
    }

    /// True for an error that a DONE with a smaller (or no) RESULT avoids.
    pub(crate) fn is_result_too_large(&self) -> bool {
        match self {
            Error::Redis(e) => {
                let text = e.to_string();
                text.contains("RESULT is larger than idem.max-result")
                    || (text.contains("RESULT") && text.contains("over proto-max-bulk-len"))
            }
            _ => false,
        }
    }

    /// Errors of the connection rather than of the command: worth one more
    /// try on a fresh connection.
    pub(crate) fn is_connection_error(&self) -> bool {
        matches!(self, Error::Redis(e) if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() || e.is_unrecoverable_error())
    }
}

/// The error of [`Idem::process`](crate::Idem::process): the work's own, or
/// this crate's.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError<E> {
    /// The work failed; its claim was released (`RELEASE`), so a redelivery
    /// retries at once (attempt + 1).
    #[error("the work failed: {0}")]
    Work(E),
    /// Claiming or completing failed, or the claim's answer was not one to
    /// work on (MISMATCH, EXHAUSTED, still BUSY, a lost lease).
    #[error(transparent)]
    Idem(#[from] Error),
}

impl<E> ProcessError<E> {
    /// This crate's error, if it was one.
    pub fn idem(&self) -> Option<&Error> {
        match self {
            ProcessError::Idem(e) => Some(e),
            ProcessError::Work(_) => None,
        }
    }
}
