//! Byte encodings of a record: one serialized form for RDB, DUMP/RESTORE,
//! digests and the replicated effect, and packed in-memory forms that keep
//! the common done record as small as a `SET key <token> NX PX` and a
//! claimed one at 32 bytes.
//!
//! Decoding is strict: a payload comes from disk or the network (RESTORE
//! accepts any bytes), so every field is checked and nothing is allocated
//! before its length is known to be present.

use unsigned_varint::encode as varint;

use super::{Fingerprint, MAX_ATTEMPT, MAX_OWNER, Millis, Phase, Record, Token};
use crate::decode::{DecodeError, Reader, VARINT_MAX};

/// First byte of every serialized record. 4 adds the optional owner (flag
/// 32); 3 added the optional tries base and extension time (flags 8 and
/// 16). Formats 3 and 2 (which 0.1 wrote) are read as records without
/// what they did not know.
pub const FORMAT_VERSION: u8 = 4;
/// The formats that came before, still read (RDB files, DUMP payloads).
const FORMAT_3: u8 = 3;
const FORMAT_2: u8 = 2;

const HAS_FINGERPRINT: u8 = 1;
const HAS_RESULT: u8 = 2;
/// The token is not all zero (done records and never-claimed ones have
/// none), so its 16 bytes follow.
const HAS_TOKEN: u8 = 4;
/// The record was requeued: its tries base follows the four numbers.
const HAS_TRIES_BASE: u8 = 8;
/// A processing record's lease was extended: the time follows.
const HAS_EXTENDED: u8 = 16;
/// The latest claim's owner (varint length, bytes) follows the fingerprint.
const HAS_OWNER: u8 = 32;
const MAX_OWNER_LEN: u64 = MAX_OWNER as u64;
/// The flags each format knows.
const FORMAT_2_FLAGS: u8 = HAS_FINGERPRINT | HAS_RESULT | HAS_TOKEN;
const FORMAT_3_FLAGS: u8 = FORMAT_2_FLAGS | HAS_TRIES_BASE | HAS_EXTENDED;
const ALL_FLAGS: u8 = FORMAT_3_FLAGS | HAS_OWNER;

/// Most bytes of a record's fields before its owner and result: version,
/// phase, flags, six numbers as varints, token and fingerprint.
const MAX_FIXED_LEN: usize = 3 + 6 * VARINT_MAX + 16 + 16;

/// Room to reserve for a record's encoding (at most this many bytes).
pub fn max_encoded_len(record: &Record) -> usize {
    let tail = [&record.owner, &record.result].into_iter().flatten();
    MAX_FIXED_LEN + tail.map(|bytes| VARINT_MAX + bytes.len()).sum::<usize>()
}

/// The fields before a record's result, assembled on the stack: one copy
/// into the output instead of one per field.
struct Head {
    bytes: [u8; MAX_FIXED_LEN + VARINT_MAX],
    len: usize,
}

impl Head {
    fn put(&mut self, bytes: &[u8]) {
        self.bytes[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
    }
    fn put_varint(&mut self, value: u64) {
        let slot = (&mut self.bytes[self.len..self.len + VARINT_MAX]).try_into().expect("room for a varint");
        self.len += varint::u64(value, slot).len();
    }
}

/// The layout: version, phase, flags, then attempt, claimed_at, lease_end
/// and done_at as varints (LEB128), the tries base and the extension time
/// as varints when not zero, then the token and fingerprint, and the
/// owner and result (each a varint length, then its bytes) when present.
/// Small on purpose: the encoding is also the replicated effect, and Redis
/// keeps an argument of up to 44 bytes in one allocation, which a fresh
/// claim's effect (without an owner) fits.
pub fn encode(record: &Record, out: &mut Vec<u8>) {
    let phase = match record.phase {
        Phase::Processing => 0u8,
        Phase::Released => 1,
        Phase::Done => 2,
    };
    let has_token = record.token != Token::default();
    let flags = (record.fingerprint.is_some() as u8 * HAS_FINGERPRINT)
        | (record.result.is_some() as u8 * HAS_RESULT)
        | (has_token as u8 * HAS_TOKEN)
        | ((record.tries_base != 0) as u8 * HAS_TRIES_BASE)
        | ((record.extended_at != 0) as u8 * HAS_EXTENDED)
        | (record.owner.is_some() as u8 * HAS_OWNER);
    let mut head = Head { bytes: [0; MAX_FIXED_LEN + VARINT_MAX], len: 0 };
    head.put(&[FORMAT_VERSION, phase, flags]);
    head.put_varint(record.attempt);
    for time in [record.claimed_at, record.lease_end, record.done_at] {
        head.put_varint(time as u64);
    }
    if record.tries_base != 0 {
        head.put_varint(record.tries_base);
    }
    if record.extended_at != 0 {
        head.put_varint(record.extended_at as u64);
    }
    if has_token {
        head.put(&record.token.0);
    }
    if let Some(fingerprint) = record.fingerprint {
        head.put(&fingerprint.to_le_bytes());
    }
    let tail = [&record.owner, &record.result].into_iter().flatten();
    out.reserve(head.len + tail.clone().map(|bytes| VARINT_MAX + bytes.len()).sum::<usize>());
    out.extend_from_slice(&head.bytes[..head.len]);
    for bytes in tail {
        let mut slot = [0; VARINT_MAX];
        out.extend_from_slice(varint::u64(bytes.len() as u64, &mut slot));
        out.extend_from_slice(bytes);
    }
}

pub fn decode(bytes: &[u8]) -> Result<Record, DecodeError> {
    let mut input = Reader(bytes);
    let known_flags = match input.u8()? {
        FORMAT_VERSION => ALL_FLAGS,
        FORMAT_3 => FORMAT_3_FLAGS,
        FORMAT_2 => FORMAT_2_FLAGS,
        _ => return Err(DecodeError("unknown record format version")),
    };
    let phase = match input.u8()? {
        0 => Phase::Processing,
        1 => Phase::Released,
        2 => Phase::Done,
        _ => return Err(DecodeError("unknown record phase")),
    };
    let flags = input.u8()?;
    if flags & !known_flags != 0 {
        return Err(DecodeError("unknown record flags"));
    }
    let attempt = input.varint()?;
    let claimed_at = input.varint_time()?;
    let lease_end = input.varint_time()?;
    let done_at = input.varint_time()?;
    // Present means not zero: one encoding per record, so digests agree.
    let tries_base = match flags & HAS_TRIES_BASE {
        0 => 0,
        _ => Some(input.varint()?).filter(|&base| base != 0).ok_or(DecodeError("zero tries base marked present"))?,
    };
    let extended_at = match flags & HAS_EXTENDED {
        0 => 0,
        _ => Some(input.varint_time()?).filter(|&at| at != 0).ok_or(DecodeError("zero extension marked present"))?,
    };
    let token = match flags & HAS_TOKEN {
        0 => Token::default(),
        _ => Token(input.array()?),
    };
    if flags & HAS_TOKEN != 0 && token == Token::default() {
        return Err(DecodeError("empty token marked present"));
    }
    let fingerprint = match flags & HAS_FINGERPRINT {
        0 => None,
        _ => Some(Fingerprint::from_le_bytes(input.array()?)),
    };
    let owner = match flags & HAS_OWNER {
        0 => None,
        _ => match input.varint()? {
            len @ 1..=MAX_OWNER_LEN => Some(Box::from(input.take(len as usize)?)),
            _ => return Err(DecodeError("owner length out of range")),
        },
    };
    let result = match flags & HAS_RESULT {
        0 => None,
        _ => {
            let len = usize::try_from(input.varint()?).map_err(|_| DecodeError("truncated"))?;
            Some(Box::from(input.take(len)?))
        }
    };
    input.finish()?;
    let record = Record {
        phase,
        attempt,
        claimed_at,
        lease_end,
        done_at,
        token,
        fingerprint,
        result,
        tries_base,
        extended_at,
        owner,
    };
    check_consistent(&record)?;
    Ok(record)
}

/// Field combinations the state machine never produces are corruption.
fn check_consistent(record: &Record) -> Result<(), DecodeError> {
    // Replies carry it (and the tries, never above it) as a signed integer.
    if record.attempt > MAX_ATTEMPT {
        return Err(DecodeError("attempt out of range"));
    }
    let done = record.phase == Phase::Done;
    if done && (record.lease_end != 0 || record.token != Token::default()) {
        return Err(DecodeError("done record with a lease"));
    }
    if !done && (record.done_at != 0 || record.result.is_some()) {
        return Err(DecodeError("unfinished record with a completion"));
    }
    // A requeued ONCE record is released with attempt 0, and no token.
    if !done && record.attempt == 0 && record.token != Token::default() {
        return Err(DecodeError("claimed record with attempt 0"));
    }
    if record.tries_base > record.attempt {
        return Err(DecodeError("tries base above the attempt"));
    }
    if record.extended_at != 0 && record.phase != Phase::Processing {
        return Err(DecodeError("extension time on a record not processing"));
    }
    // Only a claim sets an owner; DONE and REQUEUE drop it with the token.
    if record.owner.is_some() && record.token == Token::default() {
        return Err(DecodeError("owner without a claim"));
    }
    Ok(())
}

/// Packed forms of the two common records, for keys that hold millions of
/// them: times that fit in 44 bits (until year 2527), attempts in 32, no
/// result, no fingerprint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Packed {
    /// A done record: done_at, claimed_at and attempt side by side in 128
    /// bits, 16 bytes, as small as `SET key <16-byte token> NX PX`'s value.
    Done([u64; 2]),
    /// A claimed (processing or released) record: its token, then
    /// claimed_at, lease_end, attempt and a released bit in 128 bits; 32
    /// bytes where a boxed record takes 112.
    Claim([u64; 4]),
}

const TIME_BITS: u32 = 44;
const ATTEMPT_BITS: u32 = 32;

fn fits_time(time: Millis) -> bool {
    (0..1 << TIME_BITS).contains(&time)
}

fn to_words(bits: u128) -> [u64; 2] {
    [bits as u64, (bits >> 64) as u64]
}

fn from_words(words: [u64; 2]) -> u128 {
    words[0] as u128 | (words[1] as u128) << 64
}

/// `width` bits of `bits` from bit `shift` on.
fn field(bits: u128, shift: u32, width: u32) -> u64 {
    ((bits >> shift) & ((1u128 << width) - 1)) as u64
}

/// `None` for the rare records: with a result, a fingerprint, a tries
/// base (requeued), an extension time (a lease renewed) or an owner, or
/// numbers too large.
pub fn pack(record: &Record) -> Option<Packed> {
    if record.fingerprint.is_some()
        || record.result.is_some()
        || record.owner.is_some()
        || record.tries_base != 0
        || record.extended_at != 0
        || !fits_time(record.claimed_at)
        || record.attempt >= 1 << ATTEMPT_BITS
    {
        return None;
    }
    match record.phase {
        Phase::Done if fits_time(record.done_at) => {
            let bits = record.done_at as u128
                | (record.claimed_at as u128) << TIME_BITS
                | (record.attempt as u128) << (2 * TIME_BITS);
            Some(Packed::Done(to_words(bits)))
        }
        Phase::Processing | Phase::Released if fits_time(record.lease_end) && record.done_at == 0 => {
            let released = record.phase == Phase::Released;
            let bits = record.claimed_at as u128
                | (record.lease_end as u128) << TIME_BITS
                | (record.attempt as u128) << (2 * TIME_BITS)
                | (released as u128) << (2 * TIME_BITS + ATTEMPT_BITS);
            let token = to_words(u128::from_le_bytes(record.token.0));
            let [low, high] = to_words(bits);
            Some(Packed::Claim([token[0], token[1], low, high]))
        }
        _ => None,
    }
}

pub fn unpack(packed: Packed) -> Record {
    match packed {
        Packed::Done(words) => {
            let bits = from_words(words);
            Record {
                done_at: field(bits, 0, TIME_BITS) as Millis,
                claimed_at: field(bits, TIME_BITS, TIME_BITS) as Millis,
                attempt: field(bits, 2 * TIME_BITS, ATTEMPT_BITS),
                ..Record::done_without_claim(0, None)
            }
        }
        Packed::Claim([token_low, token_high, low, high]) => {
            let bits = from_words([low, high]);
            let released = field(bits, 2 * TIME_BITS + ATTEMPT_BITS, 1) == 1;
            Record {
                phase: if released { Phase::Released } else { Phase::Processing },
                attempt: field(bits, 2 * TIME_BITS, ATTEMPT_BITS),
                claimed_at: field(bits, 0, TIME_BITS) as Millis,
                lease_end: field(bits, TIME_BITS, TIME_BITS) as Millis,
                done_at: 0,
                token: Token(from_words([token_low, token_high]).to_le_bytes()),
                fingerprint: None,
                result: None,
                tries_base: 0,
                extended_at: 0,
                owner: None,
            }
        }
    }
}

/// What a record's `DUMP` payload and replicated effect add to its RESULT:
/// the encoded fields (under 100 bytes), the RDB framing and checksum, and
/// `IDEM.APPLY`'s expiry; rounded up generously.
pub const RECORD_OVERHEAD: u64 = 1024;

/// The replicated effect of a write, `IDEM.APPLY key <effect>`: the
/// record's absolute expiry (8 bytes little-endian, -1 for none), then the
/// record. Applied as is by replicas and AOF replay.
pub fn effect(record: &Record, expire_at: Option<Millis>) -> Vec<u8> {
    let mut blob = Vec::new();
    write_effect(record, expire_at, &mut blob);
    blob
}

/// Appends [`effect`]'s bytes to `out`.
pub fn write_effect(record: &Record, expire_at: Option<Millis>, out: &mut Vec<u8>) {
    out.reserve(8 + max_encoded_len(record));
    out.extend_from_slice(&expire_at.unwrap_or(-1).to_le_bytes());
    encode(record, out);
}

/// Calls `use_effect` with [`effect`]'s bytes, written into a buffer that
/// commands (all on Redis's main thread) reuse: no allocation per write on
/// the hot path.
pub fn with_effect<R>(record: &Record, expire_at: Option<Millis>, use_effect: impl FnOnce(&[u8]) -> R) -> R {
    thread_local! {
        static BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    BUFFER.with_borrow_mut(|buffer| {
        buffer.clear();
        write_effect(record, expire_at, buffer);
        let result = use_effect(buffer);
        // A large RESULT passed through: do not keep its memory.
        if buffer.capacity() > 64 * 1024 {
            *buffer = Vec::new();
        }
        result
    })
}

/// Reads an [`effect`].
pub fn decode_effect(blob: &[u8]) -> Result<(Record, Option<Millis>), DecodeError> {
    let mut input = Reader(blob);
    let expire_at = i64::from_le_bytes(input.array()?);
    if expire_at < -1 {
        return Err(DecodeError("bad expiry"));
    }
    Ok((decode(input.0)?, (expire_at >= 0).then_some(expire_at)))
}
