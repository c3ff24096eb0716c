//! Strict decoding of stored and replicated payloads: a payload comes from
//! disk or the network (RESTORE accepts any bytes), so every read is
//! checked and nothing is allocated before its length is known to be
//! present.

use unsigned_varint::decode as read_varint;

use crate::Millis;

/// Why a payload was refused.
#[derive(Debug, PartialEq, Eq)]
pub struct DecodeError(pub &'static str);

/// Most bytes of a varint of a u64.
pub const VARINT_MAX: usize = 10;

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
    /// A minimal LEB128 varint: overlong or overflowing ones are refused,
    /// so what decodes encodes back to the same bytes.
    pub fn varint(&mut self) -> Result<u64, DecodeError> {
        let (value, rest) = read_varint::u64(self.0).map_err(|error| match error {
            read_varint::Error::Insufficient => DecodeError("truncated"),
            _ => DecodeError("bad varint"),
        })?;
        // The crate drops the bits of a tenth byte above the 64th.
        let used = &self.0[..self.0.len() - rest.len()];
        if used.len() == VARINT_MAX && used[VARINT_MAX - 1] > 1 {
            return Err(DecodeError("bad varint"));
        }
        self.0 = rest;
        Ok(value)
    }
    pub fn varint_time(&mut self) -> Result<Millis, DecodeError> {
        Millis::try_from(self.varint()?).map_err(|_| DecodeError("time out of range"))
    }
    pub fn finish(&self) -> Result<(), DecodeError> {
        if self.0.is_empty() { Ok(()) } else { Err(DecodeError("trailing bytes")) }
    }
}
