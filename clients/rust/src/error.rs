//! The errors of this crate, one variant per name of docs/clients.md's
//! table, and the error of the consumer loop, which also carries the work's
//! own failure and, once the work has returned, its value.
use std::time::Duration;

/// Answers of a server that is not (or not yet) the primary, or a primary
/// cut from its replicas (`NOREPLICAS`, min-replicas-to-write): not run.
const FAILOVER: [&str; 4] = ["READONLY", "MASTERDOWN", "LOADING", "NOREPLICAS"];

/// A boxed error, as codecs return it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What went wrong in a command or in the consumer loop.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The connection or the server failed, or answered an error this
    /// crate has no variant for (a syntax error, ...).
    #[error(transparent)]
    Redis(#[from] redis::RedisError),
    /// Still busy when the wait ended: another worker holds the key. Do not
    /// acknowledge the message; it comes back later.
    /// `owner` is the holder's `OWNER` (read with one `IDEM.GET` on this
    /// path only; None when the record has none or the read failed).
    #[error("idempotency key {key:?} is still being processed by another worker ({} left on its lease{})", format!("{lease_left:?}"), owner.as_ref().map(|o| format!(", held by {o}")).unwrap_or_default())]
    Busy { key: String, lease_left: Duration, owner: Option<String> },
    /// The key was claimed with another payload: it was reused for
    /// different content. Reject the message.
    #[error("idempotency key {key:?} was used before with another payload")]
    Mismatch { key: String },
    /// `max_tries` tries used: dead-letter the message.
    #[error("idempotency key {key:?} exhausted its tries")]
    Exhausted { key: String },
    /// This worker's lease lapsed and another worker claimed the key: its
    /// result is not the one kept.
    #[error("the claim on {key:?} (attempt {attempt}) was lost: its lease lapsed and another worker took the key over")]
    LeaseLost { key: String, attempt: u64 },
    /// The record was completed without the result: the codec failed, or
    /// the result was too large under [`Oversize::Error`](crate::Oversize::Error).
    #[error("the record {key:?} was completed without its result: {cause}")]
    ResultNotStored {
        key: String,
        #[source]
        cause: BoxError,
    },
    /// A hook panicked: before the work the claim was released, after it
    /// the record is completed.
    #[error("a hook failed on {key:?}: {message}")]
    Hook { key: String, message: String },
    /// A broker adapter found no key in the message (`what` says where it
    /// looked): dead-lettered, never processed unclaimed.
    #[error("the message has no key ({what})")]
    MissingKey { what: String },
    /// `DONE` could not be confirmed after `done_retries` sends. Do not
    /// acknowledge the message: its redelivery replays or retries.
    #[error("the completion of {key:?} could not be confirmed: {}", unconfirmed_cause(cause))]
    DoneUnconfirmed {
        key: String,
        #[source]
        cause: Box<Error>,
    },
    /// [`Durable`](crate::Durable): a `WAIT` answered fewer replicas than
    /// asked (or `WAITAOF` fewer fsyncs, or refused it). At
    /// [`DurableStage::Claim`] the claim was released and the work never
    /// ran; at [`DurableStage::Done`] the record is done on the primary (the
    /// value comes back in [`ProcessError::Completed`], or for a replay the
    /// stored one in [`ProcessError::Replayed`]). Do not acknowledge the
    /// message.
    #[error("the {stage} of {key:?} was acknowledged by {acknowledged} replicas, fewer than asked")]
    NotDurable { key: String, stage: DurableStage, acknowledged: u64 },
    /// `STALE` from `EXTEND` or `DONE`: the token no longer holds the claim.
    #[error("STALE {0}")]
    Stale(String),
    /// The key holds a value of another type.
    #[error("WRONGTYPE {0}")]
    WrongType(String),
    /// The server refused `RESULT` as larger than `idem.max-result`.
    #[error("{0}")]
    ResultTooLarge(String),
    /// The Functions edition cannot do this (`WAIT`, `BLOOM`, the raw batch
    /// commands).
    #[error("{0}")]
    ModuleRequired(String),
    /// `IDEM.REQUEUE` refused: the record is processing with a live lease
    /// (its holder is still at work); nothing changed.
    #[error("{0}")]
    LiveLease(String),
    /// Neither the module nor the Functions library is on the server.
    #[error(
        "redis-idem is not on this server: load the module (loadmodule libredis_idem.so) or the Functions library (FUNCTION LOAD REPLACE < functions/idem.lua)"
    )]
    NotInstalled,
    /// An argument the server would refuse, refused before sending (a
    /// lease that is not whole seconds, a batch of the wrong size, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A stored result could not be decoded.
    #[error("result codec: {0}")]
    Codec(#[source] BoxError),
    /// A reply of a shape no version of redis-idem sends.
    #[error("unexpected reply: {0}")]
    UnexpectedReply(String),
}

/// Which write of the loop [`Error::NotDurable`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DurableStage {
    /// The claim: released, the work never ran.
    Claim,
    /// The completion: the record is done on the primary.
    Done,
}

impl std::fmt::Display for DurableStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DurableStage::Claim => "claim",
            DurableStage::Done => "completion",
        })
    }
}

/// A reply timeout reads as one on every transport: redis-rs's sync
/// connection reports it as the socket's `EAGAIN` ("Resource temporarily
/// unavailable").
fn unconfirmed_cause(cause: &Error) -> String {
    match cause {
        Error::Redis(e) if e.is_timeout() => format!("no reply within done_timeout ({e})"),
        other => other.to_string(),
    }
}

impl Error {
    /// Sorts a server error into this crate's variants.
    pub(crate) fn from_server(error: redis::RedisError) -> Error {
        let detail = || error.detail().unwrap_or_default().to_string();
        match error.code() {
            Some("STALE") => return Error::Stale(detail()),
            Some("WRONGTYPE") => return Error::WrongType(detail()),
            _ => {}
        }
        let text = error.to_string();
        // The Functions library's stubs, or an IDEM.* command the server
        // does not know: the module is not loaded.
        let unknown_idem = text.contains("unknown command") && text.to_lowercase().contains("'idem.");
        if text.contains("needs the redis-idem module") || unknown_idem {
            return Error::ModuleRequired(text);
        }
        if text.contains("processing with a live lease") {
            return Error::LiveLease(text);
        }
        if text.contains("RESULT is larger than idem.max-result")
            || (text.contains("RESULT") && text.contains("over proto-max-bulk-len"))
        {
            return Error::ResultTooLarge(text);
        }
        Error::Redis(error)
    }

    /// Errors of the connection rather than of the command: the command may
    /// or may not have run; worth sending again on a fresh connection.
    pub(crate) fn is_connection_error(&self) -> bool {
        matches!(self, Error::Redis(e) if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() || e.is_unrecoverable_error())
    }

    /// A connection not to use again: it failed, or its server is no
    /// longer the primary (`READONLY`, `MASTERDOWN`, `LOADING`: after a
    /// failover the next connection, made through Sentinel, finds the new one).
    pub(crate) fn broke_connection(error: &redis::RedisError) -> bool {
        Error::Redis(error.clone()).is_connection_error()
            || matches!(error.code(), Some(code) if FAILOVER.contains(&code))
    }

    /// An answer of a server that is not the primary (any more, or yet):
    /// the command wrote nothing.
    pub(crate) fn is_failover(&self) -> bool {
        matches!(self, Error::Redis(e) if matches!(e.code(), Some(code) if FAILOVER.contains(&code)))
    }

    /// A claim that wrote nothing and may be sent again: `TRYAGAIN` (the
    /// record is moving between nodes), `UNBLOCKED` (a waiter unblocked by
    /// a failover, a resharding or `CLIENT UNBLOCK`), a demoted or starting
    /// primary (`READONLY`, `MASTERDOWN`, `LOADING`), or a connection lost
    /// (a failover: if the server ran it, the claim meets itself as BUSY
    /// and waits; the orphan lapses with its lease).
    pub(crate) fn is_claim_retryable(&self) -> bool {
        self.is_connection_error()
            || matches!(self, Error::Redis(e) if matches!(e.code(), Some(code) if code == "TRYAGAIN" || code == "UNBLOCKED" || FAILOVER.contains(&code)))
    }
}

/// The error of [`Idem::process`](crate::Idem::process).
#[derive(Debug, thiserror::Error)]
pub enum ProcessError<T, E> {
    /// The work failed; its claim was released at once, so a redelivery
    /// retries (attempt + 1).
    #[error("the work failed")]
    Work(E),
    /// Before the work returned: claiming failed, or the claim's answer was
    /// not one to work on (`Busy`, `Mismatch`, `Exhausted`), or the run
    /// hook panicked (`Hook`, the claim released). Or after it, with no
    /// value to give: `LeaseLost`.
    #[error(transparent)]
    Idem(#[from] Error),
    /// The work returned `value` and the record is completed, but
    /// something after the work failed: `ResultNotStored`, `Hook` (the
    /// done hook), `NotDurable` (done on the primary, not acknowledged).
    #[error("{error}")]
    Completed { value: T, error: Error },
    /// The work returned `value`, but its completion is not known to be
    /// recorded: `DoneUnconfirmed` (`DONE`'s replies were lost), or `DONE`
    /// refused with an error (`WrongType`: the key was overwritten; the
    /// record was not completed). Do not acknowledge the message.
    #[error("{error}")]
    Unsettled { value: T, error: Error },
    /// The key was done already (the work did not run), but the replicas
    /// did not acknowledge the completion read (`NotDurable` at
    /// [`DurableStage::Done`]: a primary that has just lost its role keeps
    /// answering for a while). `value` is the stored result decoded (`None`
    /// when none was kept or it did not decode), `attempt` the record's. Do
    /// not acknowledge the message: its redelivery reads the record again.
    #[error("{error}")]
    Replayed { value: Option<T>, attempt: u64, error: Error },
}

impl<T, E> ProcessError<T, E> {
    /// This crate's error, if it was one.
    pub fn idem(&self) -> Option<&Error> {
        match self {
            ProcessError::Idem(e)
            | ProcessError::Completed { error: e, .. }
            | ProcessError::Unsettled { error: e, .. }
            | ProcessError::Replayed { error: e, .. } => Some(e),
            ProcessError::Work(_) => None,
        }
    }
}

/// A key's error in [`Idem::process_many`](crate::Idem::process_many).
#[derive(Debug, thiserror::Error)]
pub enum KeyError<E> {
    /// The work failed on this key; its claim was released.
    #[error("the work failed")]
    Work(E),
    /// This crate's error for this key.
    #[error(transparent)]
    Idem(#[from] Error),
}

#[cfg(test)]
mod tests {
    use super::Error;
    use std::io;

    #[test]
    fn an_unconfirmed_done_names_a_reply_timeout_on_either_transport() {
        for kind in [io::ErrorKind::WouldBlock, io::ErrorKind::TimedOut] {
            let cause = Error::Redis(io::Error::new(kind, "read").into());
            let error = Error::DoneUnconfirmed { key: "k".into(), cause: Box::new(cause) };
            assert!(error.to_string().contains("no reply within done_timeout"), "{error}");
        }
        let refused = Error::Redis(io::Error::new(io::ErrorKind::ConnectionRefused, "refused").into());
        let error = Error::DoneUnconfirmed { key: "k".into(), cause: Box::new(refused) };
        assert!(!error.to_string().contains("done_timeout"), "{error}");
    }
}
