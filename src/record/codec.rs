//! Byte encodings of a record: one serialized form for RDB, DUMP/RESTORE,
//! digests and the replicated effect, and a 16-byte packed form that keeps
//! the common done record as small as a `SET key <token> NX PX`.
//!
//! Decoding is strict: a payload comes from disk or the network (RESTORE
//! accepts any bytes), so every field is checked and nothing is allocated
//! before its length is known to be present.

use super::{Fingerprint, Millis, Phase, Record, Token};

/// First byte of every serialized record.
pub const FORMAT_VERSION: u8 = 1;

const HAS_FINGERPRINT: u8 = 1;
const HAS_RESULT: u8 = 2;
const FIXED_LEN: usize = 1 + 1 + 1 + 8 + 8 + 8 + 8 + 16;

#[derive(Debug, PartialEq, Eq)]
pub struct DecodeError(pub &'static str);

pub fn encoded_len(record: &Record) -> usize {
    FIXED_LEN
        + record.fingerprint.map_or(0, |_| 16)
        + record.result.as_ref().map_or(0, |r| 4 + r.len())
}

pub fn encode(record: &Record, out: &mut Vec<u8>) {
    out.reserve(encoded_len(record));
    let phase = match record.phase {
        Phase::Processing => 0u8,
        Phase::Released => 1,
        Phase::Done => 2,
    };
    let mut flags = 0u8;
    if record.fingerprint.is_some() {
        flags |= HAS_FINGERPRINT;
    }
    if record.result.is_some() {
        flags |= HAS_RESULT;
    }
    out.extend_from_slice(&[FORMAT_VERSION, phase, flags]);
    out.extend_from_slice(&record.attempt.to_le_bytes());
    for time in [record.claimed_at, record.lease_end, record.done_at] {
        out.extend_from_slice(&time.to_le_bytes());
    }
    out.extend_from_slice(&record.token.0);
    if let Some(fingerprint) = record.fingerprint {
        out.extend_from_slice(&fingerprint.to_le_bytes());
    }
    if let Some(result) = &record.result {
        out.extend_from_slice(&(result.len() as u32).to_le_bytes());
        out.extend_from_slice(result);
    }
}

/// Reads fixed-size fields off the front of a slice.
pub struct Reader<'a>(pub &'a [u8]);

impl<'a> Reader<'a> {
    pub fn take(&mut self, len: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < len {
            return Err(DecodeError("truncated"));
        }
        let (head, rest) = self.0.split_at(len);
        self.0 = rest;
        Ok(head)
    }
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        Ok(self.take(N)?.try_into().expect("length checked"))
    }
    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    pub fn time(&mut self) -> Result<Millis, DecodeError> {
        let time = i64::from_le_bytes(self.array()?);
        if time < 0 {
            return Err(DecodeError("negative time"));
        }
        Ok(time)
    }
    pub fn finish(&self) -> Result<(), DecodeError> {
        if self.0.is_empty() { Ok(()) } else { Err(DecodeError("trailing bytes")) }
    }
}

pub fn decode(bytes: &[u8]) -> Result<Record, DecodeError> {
    let mut input = Reader(bytes);
    if input.u8()? != FORMAT_VERSION {
        return Err(DecodeError("unknown record format version"));
    }
    let phase = match input.u8()? {
        0 => Phase::Processing,
        1 => Phase::Released,
        2 => Phase::Done,
        _ => return Err(DecodeError("unknown record phase")),
    };
    let flags = input.u8()?;
    if flags & !(HAS_FINGERPRINT | HAS_RESULT) != 0 {
        return Err(DecodeError("unknown record flags"));
    }
    let attempt = input.u64()?;
    let claimed_at = input.time()?;
    let lease_end = input.time()?;
    let done_at = input.time()?;
    let token = Token(input.array()?);
    let fingerprint = match flags & HAS_FINGERPRINT {
        0 => None,
        _ => Some(Fingerprint::from_le_bytes(input.array()?)),
    };
    let result = match flags & HAS_RESULT {
        0 => None,
        _ => {
            let len = input.u32()? as usize;
            Some(Box::from(input.take(len)?))
        }
    };
    input.finish()?;
    let record = Record { phase, attempt, claimed_at, lease_end, done_at, token, fingerprint, result };
    check_consistent(&record)?;
    Ok(record)
}

/// Field combinations the state machine never produces are corruption.
fn check_consistent(record: &Record) -> Result<(), DecodeError> {
    let done = record.phase == Phase::Done;
    if done && (record.lease_end != 0 || record.token != Token::default()) {
        return Err(DecodeError("done record with a lease"));
    }
    if !done && (record.done_at != 0 || record.result.is_some()) {
        return Err(DecodeError("unfinished record with a completion"));
    }
    if !done && record.attempt == 0 {
        return Err(DecodeError("claimed record with attempt 0"));
    }
    Ok(())
}

/// Packed form of a done record without result or fingerprint, whose
/// times fit in 44 bits (until year 2527) and attempt in 32: done_at,
/// claimed_at and attempt side by side in 128 bits.
pub type Packed = [u64; 2];

const TIME_BITS: u32 = 44;
const ATTEMPT_BITS: u32 = 32;

pub fn pack(record: &Record) -> Option<Packed> {
    let fits_time = |t: Millis| (0..1 << TIME_BITS).contains(&t);
    if record.phase != Phase::Done
        || record.fingerprint.is_some()
        || record.result.is_some()
        || !fits_time(record.done_at)
        || !fits_time(record.claimed_at)
        || record.attempt >= 1 << ATTEMPT_BITS
    {
        return None;
    }
    let bits = record.done_at as u128
        | (record.claimed_at as u128) << TIME_BITS
        | (record.attempt as u128) << (2 * TIME_BITS);
    Some([bits as u64, (bits >> 64) as u64])
}

pub fn unpack(packed: Packed) -> Record {
    let bits = packed[0] as u128 | (packed[1] as u128) << 64;
    let field = |shift: u32, width: u32| ((bits >> shift) & ((1u128 << width) - 1)) as u64;
    Record {
        done_at: field(0, TIME_BITS) as Millis,
        claimed_at: field(TIME_BITS, TIME_BITS) as Millis,
        attempt: field(2 * TIME_BITS, ATTEMPT_BITS),
        ..Record::done_without_claim(0, None)
    }
}
