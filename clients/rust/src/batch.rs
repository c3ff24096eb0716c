//! One batch per tick (`batch`, [`AsyncIdem`](crate::AsyncIdem)): while a
//! claim (or a DONE) of the loop is in flight, the ones that arrive queue
//! in a [`Lane`]; when it returns they go as one `IDEM.MCLAIM` /
//! `IDEM.MDONE` per slot (pipelined singles on the Functions edition), and
//! so on while any queue. A call alone leads: it sends its own single
//! command at once, so one call in flight waits for nothing.
use redis::{RedisResult, Value};
use std::sync::Mutex;
use tokio::sync::oneshot;

/// What a queued call asks for: its record key and its arguments.
pub(crate) struct Request<A> {
    pub record: String,
    pub args: A,
    reply: oneshot::Sender<RedisResult<Value>>,
}

impl<A> Request<A> {
    /// Its answer: exactly the single command's.
    pub fn answer(self, reply: RedisResult<Value>) {
        let _ = self.reply.send(reply);
    }
}

/// A claim's per-call argument (the instance's settings are shared).
pub(crate) type ClaimArgs = Option<Vec<u8>>;
/// A DONE's: the token and the result.
pub(crate) type DoneArgs = (String, Option<Vec<u8>>);

/// The calls waiting for the command in flight.
pub(crate) struct Lane<A> {
    state: Mutex<(bool, Vec<Request<A>>)>,
}

/// How a call goes: it leads (sends its own command now), or it waits for
/// its answer from a batch.
pub(crate) enum Turn {
    Lead,
    Wait(oneshot::Receiver<RedisResult<Value>>),
}

impl<A> Default for Lane<A> {
    fn default() -> Self {
        Lane { state: Mutex::new((false, Vec::new())) }
    }
}

impl<A> Lane<A> {
    /// Leads when nothing is in flight, else queues.
    pub fn enter(&self, record: &str, args: A) -> Turn {
        let Ok(mut state) = self.state.lock() else { return Turn::Lead };
        if !state.0 {
            state.0 = true;
            return Turn::Lead;
        }
        let (reply, receiver) = oneshot::channel();
        state.1.push(Request { record: record.to_string(), args, reply });
        Turn::Wait(receiver)
    }

    /// The calls queued since; none: nothing is in flight any more.
    pub fn next(&self) -> Vec<Request<A>> {
        let Ok(mut state) = self.state.lock() else { return Vec::new() };
        let queued = std::mem::take(&mut state.1);
        if queued.is_empty() {
            state.0 = false;
        }
        queued
    }
}

/// A queued call whose batch was dropped (its runtime shut down): a lost
/// connection to the loop, which sends it again.
pub(crate) fn dropped() -> redis::RedisError {
    std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "the batch carrying this command was dropped").into()
}
