//! The idempotency record: a pure state machine, with the clock passed in.
//!
//! Nothing here knows Redis. The module's command layer looks the key
//! up, calls one of the transitions below with the current time, and applies
//! the returned [`Write`] (store the record, set the key's absolute expiry,
//! replicate the effect). Every decision is made here, so it is unit- and
//! property-tested without a server.
//!
//! ```text
//! absent --CLAIM--> processing --DONE--> done --(retention ends)--> absent
//!                   processing --RELEASE--> released --CLAIM--> processing
//!                   processing --(lease lapses)--> expired --CLAIM--> processing
//! ```
//! `expired` is not stored: it is a processing record whose lease has ended.

pub mod batch;
pub mod codec;
pub mod operator;

use std::ffi::CStr;

use xxhash_rust::xxh3::xxh3_128;

use crate::args::{ArgList, parse_options, require, seconds_arg};
use crate::error::CmdError;

pub use crate::Millis;

/// The largest attempt: replies carry it as a signed 64-bit integer, so a
/// record at it can be claimed no more (see [`ATTEMPT_LIMIT`]), and a
/// payload with a larger one is corrupt.
pub const MAX_ATTEMPT: u64 = i64::MAX as u64;

/// What `IDEM.CLAIM` answers where it would grant a claim on a record at
/// [`MAX_ATTEMPT`]: a higher fencing number cannot be given, and repeating
/// one would let two holders carry the same.
pub const ATTEMPT_LIMIT: CmdError =
    CmdError::Static(c"ERR the record is at the largest attempt, 9223372036854775807: no claim can be fenced above it");

/// Longest `retain`/`history` config: 100 years. Time arguments are checked
/// against it, so `now + argument + history` can never overflow.
pub const MAX_SECONDS: i64 = 100 * 365 * 24 * 3600;

/// A 128-bit xxh3 of a claim's `PAYLOAD`, held as two words: a `u128`
/// would align [`Record`] to 16 bytes, and its padding would push it from
/// 128 bytes (a size class of Redis's allocator) to 144.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub struct Fingerprint([u64; 2]);

impl Fingerprint {
    pub fn to_le_bytes(self) -> [u8; 16] {
        u128::from(self).to_le_bytes()
    }

    pub fn from_le_bytes(bytes: [u8; 16]) -> Fingerprint {
        Fingerprint::from(u128::from_le_bytes(bytes))
    }
}

impl From<u128> for Fingerprint {
    fn from(hash: u128) -> Fingerprint {
        Fingerprint([hash as u64, (hash >> 64) as u64])
    }
}

impl From<Fingerprint> for u128 {
    fn from(fingerprint: Fingerprint) -> u128 {
        fingerprint.0[0] as u128 | (fingerprint.0[1] as u128) << 64
    }
}

/// As `IDEM.GET` shows it: the hash's 32 hex digits.
impl std::fmt::LowerHex for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::LowerHex::fmt(&u128::from(*self), f)
    }
}

/// Fingerprint of a `PAYLOAD` argument.
pub fn fingerprint(payload: &[u8]) -> Fingerprint {
    Fingerprint::from(xxh3_128(payload))
}

/// The owner token of one claim: 128 random bits, shown as 32 hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Hash)]
pub struct Token(pub [u8; 16]);

impl Token {
    /// Length of the token as clients see it.
    pub const HEX_LEN: usize = 32;

    pub fn to_hex(self) -> [u8; Self::HEX_LEN] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; Self::HEX_LEN];
        for (i, byte) in self.0.iter().enumerate() {
            out[2 * i] = DIGITS[(byte >> 4) as usize];
            out[2 * i + 1] = DIGITS[(byte & 0xf) as usize];
        }
        out
    }

    /// Parses a token as issued (either hex case). `None` for anything else:
    /// such a string can never match a stored token.
    pub fn from_hex(text: &[u8]) -> Option<Token> {
        if text.len() != Self::HEX_LEN {
            return None;
        }
        // Each byte's value as a hex digit, or 16 for none: one table read
        // a digit (a batch parses a token per key).
        const VALUE: [u8; 256] = {
            let mut table = [16u8; 256];
            let mut digit = 0;
            while digit < 10 {
                table[b'0' as usize + digit] = digit as u8;
                digit += 1;
            }
            let mut letter = 0;
            while letter < 6 {
                table[b'a' as usize + letter] = 10 + letter as u8;
                table[b'A' as usize + letter] = 10 + letter as u8;
                letter += 1;
            }
            table
        };
        let mut bytes = [0u8; 16];
        for (i, pair) in text.chunks_exact(2).enumerate() {
            let (high, low) = (VALUE[pair[0] as usize], VALUE[pair[1] as usize]);
            if (high | low) >= 16 {
                return None;
            }
            bytes[i] = high << 4 | low;
        }
        Some(Token(bytes))
    }
}

/// Longest `OWNER`.
pub const MAX_OWNER: usize = 64;

/// An `OWNER` argument: who holds a claim, for the people reading it later
/// (a worker id, `host:pid`), any 1 to [`MAX_OWNER`] bytes. Held inline, so
/// that a claim's arguments can be copied (into a waiter, per key of a
/// batch) without borrowing the command's.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    len: u8,
    bytes: [u8; MAX_OWNER],
}

impl Owner {
    /// `None` for an empty name or one longer than [`MAX_OWNER`].
    pub fn new(name: &[u8]) -> Option<Owner> {
        if name.is_empty() || name.len() > MAX_OWNER {
            return None;
        }
        let mut bytes = [0; MAX_OWNER];
        bytes[..name.len()].copy_from_slice(name);
        Some(Owner { len: name.len() as u8, bytes })
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

impl std::fmt::Debug for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Owner({:?})", String::from_utf8_lossy(self.as_bytes()))
    }
}

/// What is stored. `Expired` is derived from `Processing` and the clock.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Phase {
    Processing,
    Released,
    Done,
}

/// What a record is at a given moment, as `IDEM.GET` names it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum State {
    Processing,
    Expired,
    Released,
    Done,
}

impl State {
    /// The name `IDEM.GET` replies.
    pub fn name(self) -> &'static CStr {
        match self {
            State::Processing => c"processing",
            State::Expired => c"expired",
            State::Released => c"released",
            State::Done => c"done",
        }
    }
}

#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Record {
    pub phase: Phase,
    /// Fencing number: 1 for the first claim, +1 per claim; 0 for records
    /// made by ONCE or by a DONE on a missing key.
    pub attempt: u64,
    /// Time of the latest claim; 0 when never claimed.
    pub claimed_at: Millis,
    /// Processing: when the lease ends. Released: when it was released.
    /// Done: unused (0).
    pub lease_end: Millis,
    /// Done: when it was completed. Otherwise 0.
    pub done_at: Millis,
    /// The latest claim's token; all zero when never claimed or done.
    pub token: Token,
    pub fingerprint: Option<Fingerprint>,
    /// The result stored by DONE, replayed by CLAIM.
    pub result: Option<Box<[u8]>>,
    /// The attempt at the latest `IDEM.REQUEUE` (0 when never requeued):
    /// `MAXTRIES` counts the claims since, `attempt - tries_base`.
    pub tries_base: u64,
    /// Processing: when the lease was last extended, 0 when not since the
    /// claim. Otherwise 0. Kept for [`Record::changed_at`] (`IDLE`).
    pub extended_at: Millis,
    /// The latest claim's `OWNER` (1 to [`MAX_OWNER`] bytes), kept while
    /// processing, released or expired; dropped by DONE and REQUEUE.
    pub owner: Option<Box<[u8]>>,
}

/// How long records live after their last event, from the configs.
#[derive(Clone, Copy, Debug)]
pub struct Lifetimes {
    /// Released or expired records are kept this long after the lease ended.
    pub history: Millis,
}

/// What the caller must do to the key after a transition.
#[derive(Debug, PartialEq, Eq)]
pub enum Write {
    /// Nothing changed: no store, no replication.
    None,
    /// The record passed in was changed in place; the key now expires at
    /// `expire_at` (absolute Unix ms).
    Update { expire_at: Millis },
    /// The key was absent and now holds `record`, expiring at `expire_at`.
    Create { record: Record, expire_at: Millis },
}

/// `IDEM.CLAIM`'s arguments, already validated.
#[derive(Clone, Copy, Debug, Default)]
pub struct ClaimArgs {
    pub lease: Millis,
    pub fingerprint: Option<Fingerprint>,
    pub max_tries: Option<u64>,
    /// With `BLOOM`: the filter says the key may have completed before.
    pub maybe_seen: bool,
    /// `WAIT ms`: how long to wait where the answer would be `BUSY`; 0
    /// (the default) answers at once.
    pub wait: Millis,
    /// `OWNER name`: stored by a granted claim, replacing the previous
    /// holder's (none clears it).
    pub owner: Option<Owner>,
}

/// The longest `WAIT`: one hour.
pub const MAX_WAIT: Millis = 3_600_000;

/// `IDEM.CLAIM`'s reply, in the spec's precedence order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimReply {
    New {
        token: Token,
    },
    Seen {
        token: Token,
    },
    Mismatch {
        attempt: u64,
    },
    /// The result to replay is the record's own `result`.
    Done {
        attempt: u64,
    },
    Busy {
        lease_left: Millis,
        attempt: u64,
    },
    Exhausted {
        attempt: u64,
    },
    Retry {
        token: Token,
        attempt: u64,
    },
}

/// `IDEM.DONE`'s reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DoneReply {
    /// This call completed the claim (reply `1`).
    Completed,
    /// The record was already done (reply `0`).
    AlreadyDone,
    /// Another claim took the key since this token's claim.
    Stale,
}

/// Saturating: the command layer refuses times that overflow, but a config
/// changed later must never wrap an expiry into the past.
fn after(at: Millis, duration: Millis) -> Millis {
    at.saturating_add(duration)
}

impl Record {
    fn claimed(now: Millis, args: &ClaimArgs, token: Token, attempt: u64) -> Record {
        Record {
            phase: Phase::Processing,
            attempt,
            claimed_at: now,
            lease_end: after(now, args.lease),
            done_at: 0,
            token,
            fingerprint: args.fingerprint,
            result: None,
            tries_base: 0,
            extended_at: 0,
            owner: args.owner.map(|owner| Box::from(owner.as_bytes())),
        }
    }

    /// A done record that no claim made (ONCE, late DONE on a missing key).
    pub fn done_without_claim(now: Millis, result: Option<&[u8]>) -> Record {
        Record {
            phase: Phase::Done,
            attempt: 0,
            claimed_at: 0,
            lease_end: 0,
            done_at: now,
            token: Token::default(),
            fingerprint: None,
            result: result.map(Box::from),
            tries_base: 0,
            extended_at: 0,
            owner: None,
        }
    }

    /// Claims since the latest requeue (`attempt` if never requeued): what
    /// `MAXTRIES` compares.
    pub fn tries(&self) -> u64 {
        self.attempt.saturating_sub(self.tries_base)
    }

    /// Time of the latest change an operator would call activity: the
    /// claim or its latest extension, the release (or requeue), the
    /// completion. A lease lapsing is no change: that is what stuck means.
    pub fn changed_at(&self) -> Millis {
        match self.phase {
            Phase::Processing => self.claimed_at.max(self.extended_at),
            Phase::Released => self.lease_end,
            Phase::Done => self.done_at,
        }
    }

    pub fn state_at(&self, now: Millis) -> State {
        match self.phase {
            Phase::Processing if now < self.lease_end => State::Processing,
            Phase::Processing => State::Expired,
            Phase::Released => State::Released,
            Phase::Done => State::Done,
        }
    }

    /// Milliseconds left on a live lease, else 0.
    pub fn lease_left(&self, now: Millis) -> Millis {
        match self.state_at(now) {
            State::Processing => self.lease_end - now,
            _ => 0,
        }
    }

    /// When a released or expired record is forgotten.
    fn history_end(&self, lifetimes: Lifetimes) -> Millis {
        after(self.lease_end, lifetimes.history)
    }

    /// A requeued record holds no token: none, not even all zeros, holds it.
    fn holds(&self, token: Option<Token>) -> bool {
        token == Some(self.token) && self.token != Token::default()
    }

    fn complete(&mut self, now: Millis, result: Option<&[u8]>) {
        self.phase = Phase::Done;
        self.done_at = now;
        self.lease_end = 0;
        self.extended_at = 0;
        self.token = Token::default();
        self.result = result.map(Box::from);
        self.owner = None;
    }
}

/// `IDEM.CLAIM`. `next_token` is called only when a claim is granted.
/// `Err(ATTEMPT_LIMIT)`, nothing changed, where a claim would be granted
/// on a record at [`MAX_ATTEMPT`].
pub fn claim(
    record: Option<&mut Record>,
    args: &ClaimArgs,
    now: Millis,
    lifetimes: Lifetimes,
    next_token: impl FnOnce() -> Token,
) -> Result<(ClaimReply, Write), CmdError> {
    let Some(record) = record else {
        let token = next_token();
        let created = Record::claimed(now, args, token, 1);
        let expire_at = created.history_end(lifetimes);
        let reply = if args.maybe_seen { ClaimReply::Seen { token } } else { ClaimReply::New { token } };
        return Ok((reply, Write::Create { record: created, expire_at }));
    };
    let attempt = record.attempt;
    if let (Some(given), Some(stored)) = (args.fingerprint, record.fingerprint)
        && given != stored
    {
        return Ok((ClaimReply::Mismatch { attempt }, Write::None));
    }
    Ok(match record.state_at(now) {
        State::Done => (ClaimReply::Done { attempt }, Write::None),
        State::Processing => {
            let lease_left = record.lease_end - now;
            (ClaimReply::Busy { lease_left, attempt }, Write::None)
        }
        State::Released | State::Expired => {
            if args.max_tries.is_some_and(|max| record.tries() >= max) {
                return Ok((ClaimReply::Exhausted { attempt }, Write::None));
            }
            if attempt >= MAX_ATTEMPT {
                return Err(ATTEMPT_LIMIT);
            }
            let token = next_token();
            let fingerprint = record.fingerprint.or(args.fingerprint);
            let tries_base = record.tries_base;
            let attempt = attempt + 1;
            *record = Record { fingerprint, tries_base, ..Record::claimed(now, args, token, attempt) };
            let expire_at = record.history_end(lifetimes);
            (ClaimReply::Retry { token, attempt }, Write::Update { expire_at })
        }
    })
}

/// `IDEM.DONE`. `token` is `None` when the argument is not a token at all.
pub fn done(
    record: Option<&mut Record>,
    token: Option<Token>,
    result: Option<&[u8]>,
    retain: Millis,
    now: Millis,
) -> (DoneReply, Write) {
    let expire_at = after(now, retain);
    let Some(record) = record else {
        // A late completion after the record was forgotten: recorded, so a
        // redelivery is still recognised as done.
        let record = Record::done_without_claim(now, result);
        return (DoneReply::Completed, Write::Create { record, expire_at });
    };
    if record.phase == Phase::Done {
        return (DoneReply::AlreadyDone, Write::None);
    }
    // Processing (live or lapsed) or released: only the latest claim's
    // token may complete it; any other claim was superseded.
    if !record.holds(token) {
        return (DoneReply::Stale, Write::None);
    }
    record.complete(now, result);
    (DoneReply::Completed, Write::Update { expire_at })
}

/// `IDEM.RELEASE`: `true` when the token held a live lease, now given up.
pub fn release(record: Option<&mut Record>, token: Option<Token>, now: Millis, lifetimes: Lifetimes) -> (bool, Write) {
    match record {
        Some(record) if record.state_at(now) == State::Processing && record.holds(token) => {
            record.phase = Phase::Released;
            record.lease_end = now;
            record.extended_at = 0;
            let expire_at = record.history_end(lifetimes);
            (true, Write::Update { expire_at })
        }
        _ => (false, Write::None),
    }
}

/// `IDEM.EXTEND`: `Ok` when the lease of the token's claim now ends `lease`
/// from now; `Err(())` is the `STALE` error.
pub fn extend(
    record: Option<&mut Record>,
    token: Option<Token>,
    lease: Millis,
    now: Millis,
    lifetimes: Lifetimes,
) -> (Result<(), ()>, Write) {
    match record {
        // A lapsed lease may be extended as long as nobody claimed since:
        // the token is still the latest claim's.
        Some(record) if record.phase == Phase::Processing && record.holds(token) => {
            record.lease_end = after(now, lease);
            record.extended_at = now;
            let expire_at = record.history_end(lifetimes);
            (Ok(()), Write::Update { expire_at })
        }
        _ => (Err(()), Write::None),
    }
}

/// `IDEM.REQUEUE`'s outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequeueReply {
    /// The record is released now, with its tries restarted (reply `1`).
    Requeued,
    /// No record (reply `0`).
    Absent,
    /// A live lease: its holder is still at work (an error, nothing changed).
    Busy,
}

/// `IDEM.REQUEUE`: gives an expired, released or done record's work back.
/// It stays released for `history`, keeps its attempt (the next claim's
/// is higher: the fence keeps rising, where a `DEL` would restart it at
/// 1), restarts the tries `MAXTRIES` counts, and holds no token, so the
/// latest claim's holder can no longer complete, extend or release it.
pub fn requeue(record: Option<&mut Record>, now: Millis, lifetimes: Lifetimes) -> (RequeueReply, Write) {
    let Some(record) = record else { return (RequeueReply::Absent, Write::None) };
    if record.state_at(now) == State::Processing {
        return (RequeueReply::Busy, Write::None);
    }
    *record = Record {
        phase: Phase::Released,
        attempt: record.attempt,
        claimed_at: record.claimed_at,
        lease_end: now,
        done_at: 0,
        token: Token::default(),
        fingerprint: record.fingerprint,
        result: None,
        tries_base: record.attempt,
        extended_at: 0,
        owner: None,
    };
    let expire_at = record.history_end(lifetimes);
    (RequeueReply::Requeued, Write::Update { expire_at })
}

/// `IDEM.ONCE`: mark-if-absent. `true` when the key was absent.
pub fn once(record: Option<&Record>, retain: Millis, now: Millis) -> (bool, Write) {
    if record.is_some() {
        return (false, Write::None);
    }
    let record = Record::done_without_claim(now, None);
    (true, Write::Create { record, expire_at: after(now, retain) })
}

/// Issued tokens are exactly 32 hex digits; anything longer is not a token.
pub fn token_arg<A: ArgList + ?Sized>(args: &A, index: usize) -> Result<Option<Token>, CmdError> {
    let text = args.bytes(index);
    if text.len() > Token::HEX_LEN {
        return Err(CmdError::Static(c"ERR invalid token"));
    }
    Ok(Token::from_hex(text))
}

/// The `BLOOM filterkey` option's value index, refused when it names the
/// record's own key.
fn bloom_key<A: ArgList + ?Sized>(args: &A, value: usize) -> Result<Option<usize>, CmdError> {
    if args.bytes(value) == args.bytes(1) {
        return Err(CmdError::Static(c"ERR the BLOOM filter must be another key than the record"));
    }
    Ok(Some(value))
}

/// `IDEM.CLAIM`'s options, in the order `parse_claim` takes them.
pub const CLAIM_OPTIONS: &[&str] = &["PAYLOAD", "MAXTRIES", "BLOOM", "WAIT", "OWNER"];
/// `IDEM.DONE`'s options, in the order `parse_done` takes them.
pub const DONE_OPTIONS: &[&str] = &["RESULT", "RETAIN", "BLOOM"];

/// Where the `BLOOM` option's key is among `args` (a CLAIM's or a DONE's,
/// with their `options`), found by the walker the parsers use, so that a
/// value spelling an option name is never taken for it. Options that do
/// not parse (the command will refuse them) end the search.
pub fn bloom_key_position<A: ArgList + ?Sized>(args: &A, options: &[&str]) -> Option<usize> {
    let bloom = options.iter().position(|name| *name == "BLOOM")?;
    let mut found = None;
    let _ = parse_options(args, 3, options, |option, value| {
        if option == bloom {
            found = Some(value);
        }
        Ok(())
    });
    found
}

/// The `OWNER` option's value (of `IDEM.CLAIM` and `IDEM.MCLAIM`).
pub fn owner_arg<A: ArgList + ?Sized>(args: &A, index: usize) -> Result<Owner, CmdError> {
    Owner::new(args.bytes(index)).ok_or(CmdError::Static(c"ERR OWNER must be 1 to 64 bytes"))
}

/// `MAXTRIES n`'s value (of `IDEM.CLAIM` and `IDEM.MCLAIM`).
pub fn max_tries_arg<A: ArgList + ?Sized>(args: &A, index: usize) -> Result<u64, CmdError> {
    match args.int(index)? {
        max if max >= 1 => Ok(max as u64),
        _ => Err(CmdError::Static(c"ERR MAXTRIES must be a positive integer")),
    }
}

/// `IDEM.CLAIM key lease [PAYLOAD data] [MAXTRIES n] [BLOOM filterkey]
/// [WAIT ms] [OWNER name]`: the claim, and the index of the `BLOOM` filter
/// key if given.
pub fn parse_claim<A: ArgList + ?Sized>(args: &A, now: Millis) -> Result<(ClaimArgs, Option<usize>), CmdError> {
    require(args, 3)?;
    let mut claim = ClaimArgs { lease: seconds_arg(args, 2, now)?, ..ClaimArgs::default() };
    let mut bloom = None;
    parse_options(args, 3, CLAIM_OPTIONS, |option, value| {
        match option {
            0 => claim.fingerprint = Some(fingerprint(args.bytes(value))),
            1 => claim.max_tries = Some(max_tries_arg(args, value)?),
            2 => bloom = bloom_key(args, value)?,
            3 => {
                claim.wait = match args.int(value) {
                    Ok(ms) if (0..=MAX_WAIT).contains(&ms) => ms,
                    _ => return Err(CmdError::new(format!("ERR WAIT must be an integer from 0 to {MAX_WAIT}"))),
                }
            }
            _ => claim.owner = Some(owner_arg(args, value)?),
        }
        Ok(())
    })?;
    Ok((claim, bloom))
}

/// `IDEM.DONE`'s arguments, checked.
pub struct DoneArgs<'a> {
    pub token: Option<Token>,
    pub result: Option<&'a [u8]>,
    pub retain: Millis,
    /// Index of the `BLOOM` filter key.
    pub bloom: Option<usize>,
}

/// `IDEM.DONE key token [RESULT value] [RETAIN seconds] [BLOOM filterkey]`,
/// `retain` being the default `RETAIN` and `max_result` the largest
/// `RESULT`.
pub fn parse_done<A: ArgList + ?Sized>(
    args: &A,
    now: Millis,
    retain: Millis,
    max_result: usize,
) -> Result<DoneArgs<'_>, CmdError> {
    require(args, 3)?;
    let mut done = DoneArgs { token: token_arg(args, 2)?, result: None, retain, bloom: None };
    parse_options(args, 3, DONE_OPTIONS, |option, value| {
        match option {
            0 => {
                let bytes = args.bytes(value);
                if bytes.len() > max_result {
                    return Err(CmdError::new(format!(
                        "ERR RESULT is larger than idem.max-result ({max_result} bytes)"
                    )));
                }
                done.result = Some(bytes);
            }
            1 => done.retain = seconds_arg(args, value, now)?,
            _ => done.bloom = bloom_key(args, value)?,
        }
        Ok(())
    })?;
    Ok(done)
}

#[cfg(test)]
mod tests;
