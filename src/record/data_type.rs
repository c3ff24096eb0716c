//! The record as a Redis data type: how a key holds one, and what its
//! callbacks (RDB, AOF rewrite, COPY, MEMORY USAGE, digest) do.
//!
//! A key's value is one of three allocations behind a tagged pointer
//! (`host::data_type::Tagged`). The common records (no result, no
//! fingerprint, no owner) are packed: a done record in 16 bytes, so it
//! costs no more than `SET key <16-byte token> NX PX`, a claimed one in 32;
//! every other record is a boxed [`Record`] (128 bytes, plus its result's
//! or owner's own allocation).

use std::ffi::CStr;

use idem_core::Millis;
use idem_core::error::CmdError;
use idem_core::record::Record;
use idem_core::record::codec::{self, Packed};
use redis_module::native_types::RedisType;

use crate::host::data_type::{self, DataType, Tagged, TaggedMut, TaggedRef, boxed_slice_size, methods};
use crate::host::{Arg, Key};

/// Encoding version of the RDB payload; a newer one is refused on load.
/// 2: the record's format 2 (varints), which format 1 readers refuse.
/// 3: format 3 (the tries base of IDEM.REQUEUE).
/// 4: format 4 (the owner of IDEM.CLAIM ... OWNER); 3 and 2 still load.
pub const ENCODING_VERSION: i32 = 4;

pub static RECORD_TYPE: RedisType = RedisType::new("idemrecrd", ENCODING_VERSION, methods::<RecordType>());

/// A done record packed (`codec::Packed::Done`).
type PackedDone = [u64; 2];
/// A claimed record packed (`codec::Packed::Claim`).
type PackedClaim = [u64; 4];
/// A done record packed, a claimed one packed, or any record.
type Value = Tagged<PackedDone, PackedClaim, Record>;
/// A view of a key's record as stored.
type ValueRef<'a> = TaggedRef<'a, PackedDone, PackedClaim, Record>;

pub struct RecordType;

impl DataType for RecordType {
    type Value = Value;
    const ENCODING_VERSION: i32 = ENCODING_VERSION;
    const WHAT: &'static CStr = c"record";
    const REWRITE_COMMAND: &'static CStr = c"IDEM.APPLY";

    fn redis_type() -> &'static RedisType {
        &RECORD_TYPE
    }

    fn load(bytes: &[u8], _loading: bool) -> Option<Value> {
        codec::decode(bytes).ok().map(into_value)
    }

    fn save(value: ValueRef<'_>, out: &mut Vec<u8>) {
        codec::encode(&to_record(value), out);
    }

    /// One `IDEM.APPLY` without expiry; Redis appends the key's
    /// `PEXPIREAT` after it.
    fn rewrite(value: ValueRef<'_>) -> Vec<u8> {
        codec::effect(&to_record(value), None)
    }

    fn mem_usage(value: ValueRef<'_>) -> usize {
        match value {
            TaggedRef::C(record) => [&record.result, &record.owner].into_iter().flatten().map(boxed_slice_size).sum(),
            _ => 0,
        }
    }

    /// A record is at most two allocations: always cheap to free inline.
    fn free_effort(_value: ValueRef<'_>) -> usize {
        1
    }

    fn copy(value: ValueRef<'_>) -> Value {
        into_value(to_record(value))
    }
}

/// A record as a key holds it: packed when it packs.
fn into_value(record: Record) -> Value {
    match codec::pack(&record) {
        Some(Packed::Done(words)) => Tagged::A(Box::new(words)),
        Some(Packed::Claim(words)) => Tagged::B(Box::new(words)),
        None => Tagged::C(Box::new(record)),
    }
}

/// A copy of the stored record (packed ones are unpacked).
fn to_record(value: ValueRef<'_>) -> Record {
    match value {
        TaggedRef::A(words) => codec::unpack(Packed::Done(*words)),
        TaggedRef::B(words) => codec::unpack(Packed::Claim(*words)),
        TaggedRef::C(record) => record.clone(),
    }
}

/// The record under an open key, ready for a transition of
/// `idem_core::record`. Boxed records are changed in place; a packed one is
/// unpacked into `unpacked` and stored again only if a transition changes
/// it.
pub struct OpenRecord<'k, 'a> {
    stored: data_type::OpenValue<'k, 'a, RecordType>,
    unpacked: Option<Record>,
}

impl<'k, 'a> OpenRecord<'k, 'a> {
    /// `Err(WRONGTYPE)` for a key of another type.
    pub fn open(key: &'k mut Key<'a>) -> Result<OpenRecord<'k, 'a>, CmdError> {
        let mut stored = data_type::OpenValue::open(key)?;
        let unpacked = match stored.value() {
            Some(TaggedMut::A(words)) => Some(codec::unpack(Packed::Done(**words))),
            Some(TaggedMut::B(words)) => Some(codec::unpack(Packed::Claim(**words))),
            _ => None,
        };
        Ok(OpenRecord { stored, unpacked })
    }

    pub fn name(&self) -> Arg<'a> {
        self.stored.name()
    }

    pub fn record(&mut self) -> Option<&mut Record> {
        if self.unpacked.is_some() {
            return self.unpacked.as_mut();
        }
        match self.stored.value() {
            Some(TaggedMut::C(record)) => Some(&mut **record),
            _ => None,
        }
    }

    /// The record, with the milliseconds its key has to live as PTTL counts
    /// them.
    pub fn record_and_pttl(&mut self) -> Option<(&mut Record, Millis)> {
        let pttl = self.stored.pttl();
        self.record().map(|record| (record, pttl))
    }

    /// Stores the record after an in-place transition and sets the key's
    /// expiry: a packed one is packed again, a boxed one that now packs
    /// shrinks.
    pub fn store_updated(mut self, expire_at: Millis) {
        let repacked = match self.stored.value() {
            Some(TaggedMut::C(record)) if codec::pack(record).is_some() => {
                Some(std::mem::replace(&mut **record, Record::done_without_claim(0, None)))
            }
            _ => None,
        };
        match self.unpacked.take().or(repacked) {
            Some(record) => self.stored.store(into_value(record), Some(expire_at)),
            None => self.stored.keep(Some(expire_at)),
        }
    }

    /// Makes the key hold `record` until `expire_at` (`None`: no expiry),
    /// replacing whatever record it held.
    pub fn store_new(self, record: Record, expire_at: Option<Millis>) {
        self.stored.store(into_value(record), expire_at);
    }
}

/// Decodes a replicated effect, for `IDEM.APPLY`.
pub fn decode_effect(blob: &[u8]) -> Result<(Record, Option<Millis>), CmdError> {
    codec::decode_effect(blob).map_err(|e| CmdError::new(format!("ERR invalid IDEM.APPLY payload: {}", e.0)))
}
