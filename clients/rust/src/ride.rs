//! Commands that ride with a call's writes, on the record's connection in
//! the same round trip: what the broker adapters build on (Streams' `XACK`
//! with `DONE`, its `XCLAIM` with each `EXTEND`). Empty for every other
//! call, so the loop sends what it always sent.
use redis::{Cmd, RedisResult, Value};

#[derive(Clone, Debug, Default)]
pub(crate) struct Ride {
    /// A key of the riding commands, where they go (the stream). In a
    /// cluster they ride only when it shares the record's slot.
    pub route: String,
    /// After each `DONE` of the call, in its pipeline (before a durable
    /// `WAIT`). They run whatever `DONE` answers: the caller reads both.
    pub with_done: Vec<Cmd>,
    /// After each `EXTEND` of the call's job (in their own send when the
    /// slots differ); their replies are not read.
    pub with_extend: Vec<Cmd>,
}

/// The replies of the riding commands sent with the call's latest `DONE`;
/// `None` when they were not sent with it (no `DONE` was sent, or the
/// slots differ).
pub(crate) type Ridden = Option<Vec<RedisResult<Value>>>;

impl Ride {
    /// What the heartbeat keeps of it.
    pub fn for_extend(&self) -> Ride {
        match self.with_extend.is_empty() {
            true => Ride::default(),
            false => Ride { route: self.route.clone(), with_done: Vec::new(), with_extend: self.with_extend.clone() },
        }
    }
}
