//! The record as a Redis data type: how a key holds one, and the
//! `unsafe extern "C"` callbacks Redis calls for persistence, copying,
//! digests and memory accounting.
//!
//! A key's value is a tagged pointer. The common records (no result, no
//! fingerprint) are packed allocations told apart by the low bits: a done
//! record in 16 bytes, so it costs no more than `SET key <16-byte token> NX
//! PX`, a claimed one in 32; every other record is a boxed [`Record`].

use std::ffi::{c_int, c_void};
use std::ptr;

use idem_core::Millis;
use idem_core::error::CmdError;
use idem_core::record::Record;
use idem_core::record::codec::{self, Packed};
use redis_module::native_types::RedisType;
use redis_module::raw;

use crate::host::io::{Aof, Digest, Rdb};
use crate::host::key::TypeHandle;
use crate::host::{Arg, Key, allocation_size};

/// Encoding version of the RDB payload; a newer one is refused on load.
/// 2: the record's format 2 (varints), which format 1 readers refuse.
pub const ENCODING_VERSION: i32 = 2;

pub static RECORD_TYPE: RedisType = RedisType::new(
    "idemrecrd",
    ENCODING_VERSION,
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(rdb_load),
        rdb_save: Some(rdb_save),
        aof_rewrite: Some(aof_rewrite),
        mem_usage: Some(mem_usage),
        digest: Some(digest),
        free: Some(free),
        aux_load: None,
        aux_save: None,
        aux_save_triggers: 0,
        free_effort: Some(free_effort),
        unlink: None,
        copy: Some(copy),
        defrag: None,
        mem_usage2: None,
        free_effort2: None,
        unlink2: None,
        copy2: None,
        aux_save2: None,
    },
);

fn module_type() -> TypeHandle {
    *RECORD_TYPE.raw_type.borrow()
}

/// Low bits of a value pointer (allocations are 8-byte aligned) saying
/// what it points to.
const TAG_MASK: usize = 0b11;
const FULL_TAG: usize = 0;
const DONE_TAG: usize = 1;
const CLAIM_TAG: usize = 2;

/// Moves a record into a value pointer Redis can hold.
fn into_value(record: Record) -> *mut c_void {
    let tagged = match codec::pack(&record) {
        Some(Packed::Done(words)) => Box::into_raw(Box::new(words)) as usize | DONE_TAG,
        Some(Packed::Claim(words)) => Box::into_raw(Box::new(words)) as usize | CLAIM_TAG,
        None => Box::into_raw(Box::new(record)) as usize | FULL_TAG,
    };
    tagged as *mut c_void
}

fn untagged(value: *const c_void) -> usize {
    value as usize & !TAG_MASK
}

/// A stored value, borrowed.
enum Value<'a> {
    Packed(Packed),
    Full(&'a mut Record),
}

/// # Safety
/// `value` must come from [`into_value`] and not be freed yet; the borrow
/// must end before anything else reads or frees it.
unsafe fn value_ref<'a>(value: *mut c_void) -> Value<'a> {
    let address = untagged(value);
    // SAFETY, for each: the tag says which of `into_value`'s boxes the
    // address is, live as the caller promises.
    match value as usize & TAG_MASK {
        // SAFETY: see above.
        DONE_TAG => Value::Packed(Packed::Done(unsafe { *(address as *const [u64; 2]) })),
        // SAFETY: see above.
        CLAIM_TAG => Value::Packed(Packed::Claim(unsafe { *(address as *const [u64; 4]) })),
        // SAFETY: see above; the caller keeps the borrow exclusive.
        _ => Value::Full(unsafe { &mut *(address as *mut Record) }),
    }
}

/// # Safety
/// `value` must come from [`into_value`]; it is invalid afterwards.
unsafe fn drop_value(value: *mut c_void) {
    let address = untagged(value);
    // The tag says which of `into_value`'s boxes the address is, freed
    // once as the caller promises.
    match value as usize & TAG_MASK {
        // SAFETY: see above.
        DONE_TAG => drop(unsafe { Box::from_raw(address as *mut [u64; 2]) }),
        // SAFETY: see above.
        CLAIM_TAG => drop(unsafe { Box::from_raw(address as *mut [u64; 4]) }),
        // SAFETY: see above.
        _ => drop(unsafe { Box::from_raw(address as *mut Record) }),
    }
}

/// A copy of the stored record (packed ones are unpacked).
///
/// # Safety
/// As [`value_ref`].
unsafe fn to_record(value: *mut c_void) -> Record {
    // SAFETY: as the caller promises.
    match unsafe { value_ref(value) } {
        Value::Packed(packed) => codec::unpack(packed),
        Value::Full(record) => record.clone(),
    }
}

/// The record under an open key, ready for a transition of
/// `idem_core::record`. Boxed records are changed in place; a packed one is
/// unpacked into `unpacked` and stored again only if a transition changes
/// it.
pub struct Slot<'k, 'a> {
    key: &'k mut Key<'a>,
    full: Option<&'k mut Record>,
    unpacked: Option<Record>,
}

impl<'k, 'a> Slot<'k, 'a> {
    /// `Err(WRONGTYPE)` for a key of another type.
    pub fn open(key: &'k mut Key<'a>) -> Result<Slot<'k, 'a>, CmdError> {
        let (mut full, mut unpacked) = (None, None);
        if let Some(value) = key.module_value(module_type())? {
            // SAFETY: a value of our type was made by `into_value`; it lives
            // while the key is open, and the slot's `&mut` on the key keeps
            // anything else from reaching it meanwhile.
            match unsafe { value_ref(value.as_ptr()) } {
                Value::Packed(packed) => unpacked = Some(codec::unpack(packed)),
                Value::Full(record) => full = Some(record),
            }
        }
        Ok(Slot { key, full, unpacked })
    }

    pub fn name(&self) -> Arg<'a> {
        self.key.name()
    }

    pub fn record(&mut self) -> Option<&mut Record> {
        match &mut self.full {
            Some(record) => Some(record),
            None => self.unpacked.as_mut(),
        }
    }

    /// The record, with the milliseconds its key has to live as PTTL counts
    /// them.
    pub fn record_and_pttl(&mut self) -> Option<(&mut Record, Millis)> {
        let record = match &mut self.full {
            Some(record) => record,
            None => self.unpacked.as_mut()?,
        };
        Some((record, self.key.pttl()))
    }

    /// Makes the key, which held no record, hold `record` until `expire_at`.
    pub fn store_new(self, record: Record, expire_at: Millis) {
        store_new(self.key, record, Some(expire_at));
    }

    /// Stores the record after an in-place transition and sets the key's
    /// expiry: a packed one is packed again, a boxed one that now packs
    /// shrinks.
    pub fn store_updated(self, expire_at: Millis) {
        let Slot { key, full, unpacked } = self;
        let record = match (unpacked, full) {
            (Some(record), _) => Some(record),
            (None, Some(record)) if codec::pack(record).is_some() => {
                Some(std::mem::replace(record, Record::done_without_claim(0, None)))
            }
            _ => None,
        };
        if let Some(record) = record {
            // SAFETY: the key holds a record (the slot found one), and the
            // new value is one `into_value` made; `full`'s borrow of the
            // old value ended above.
            let old = unsafe { key.replace_module_value(module_type(), into_value(record)) };
            // SAFETY: `old` was this key's value, now detached from it.
            unsafe { drop_value(old) };
        }
        key.set_expire_at(Some(expire_at));
    }
}

/// Makes `key` hold `record` until `expire_at` (`None`: no expiry),
/// replacing whatever record it held.
pub fn store_new(key: &mut Key<'_>, record: Record, expire_at: Option<Millis>) {
    // SAFETY: a value `into_value` made, of this type.
    unsafe { key.set_module_value(module_type(), into_value(record)) };
    key.set_expire_at(expire_at);
}

/// Decodes a replicated effect, for `IDEM.APPLY`.
pub fn decode_effect(blob: &[u8]) -> Result<(Record, Option<Millis>), CmdError> {
    codec::decode_effect(blob).map_err(|e| CmdError::new(format!("ERR invalid IDEM.APPLY payload: {}", e.0)))
}

/// # Safety
/// Called by Redis with a valid `rdb` handle; module IO errors are handled
/// (`HANDLE_IO_ERRORS`), so a failed read returns an error, never aborts.
unsafe extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    // SAFETY: the handle Redis passed to this callback.
    let Some(mut rdb) = (unsafe { Rdb::from_raw(rdb) }) else { return ptr::null_mut() };
    if encver > ENCODING_VERSION {
        rdb.log_refused(c"record", c"encoding version newer than this module");
        return ptr::null_mut();
    }
    let Some(buffer) = rdb.load_bytes() else { return ptr::null_mut() };
    match codec::decode(buffer.as_ref()) {
        Ok(record) => into_value(record),
        Err(_) => {
            rdb.log_refused(c"record", c"corrupt record");
            ptr::null_mut()
        }
    }
}

/// # Safety
/// `value` is a live value of this type; `rdb` the callback's handle.
unsafe extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    // SAFETY: the handle Redis passed to this callback.
    let Some(mut rdb) = (unsafe { Rdb::from_raw(rdb) }) else { return };
    let mut bytes = Vec::new();
    // SAFETY: a live value of this type, only read.
    codec::encode(&unsafe { to_record(value) }, &mut bytes);
    rdb.save_bytes(&bytes);
}

/// Rewrites the key as one `IDEM.APPLY` without expiry; Redis appends the
/// key's `PEXPIREAT` after it.
///
/// # Safety
/// `value` is a live value of this type; `key` is its key name.
unsafe extern "C" fn aof_rewrite(aof: *mut raw::RedisModuleIO, key: *mut raw::RedisModuleString, value: *mut c_void) {
    // SAFETY: the handle and key name Redis passed to this callback.
    let (Some(mut aof), Some(key)) = (unsafe { Aof::from_raw(aof) }, unsafe { Arg::from_raw(key) }) else { return };
    // SAFETY: a live value of this type, only read.
    let blob = codec::effect(&unsafe { to_record(value) }, None);
    aof.emit_key_blob(c"IDEM.APPLY", key, &blob);
}

/// Size of Redis's `moduleValue` wrapper around our pointer.
const MODULE_VALUE_SIZE: usize = 16;

/// # Safety
/// `value` is a live value of this type, allocated by Redis's allocator.
unsafe extern "C" fn mem_usage(value: *const c_void) -> usize {
    // SAFETY: the untagged address is the box `into_value` allocated.
    let own = MODULE_VALUE_SIZE + unsafe { allocation_size(untagged(value) as *const u8, 1) };
    // SAFETY: a live value of this type, only read.
    match unsafe { value_ref(value as *mut c_void) } {
        Value::Packed(_) => own,
        // An empty RESULT is an empty boxed slice: no allocation behind it.
        Value::Full(record) => {
            // SAFETY: a boxed slice's own allocation, `len` elements long.
            own + record.result.as_ref().map_or(0, |r| unsafe { allocation_size(r.as_ptr(), r.len()) })
        }
    }
}

/// # Safety
/// `md` is a valid digest context; `value` a live value of this type.
unsafe extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    // SAFETY: the digest Redis passed to this callback.
    let Some(mut digest) = (unsafe { Digest::from_raw(md) }) else { return };
    let mut bytes = Vec::new();
    // SAFETY: a live value of this type, only read.
    codec::encode(&unsafe { to_record(value) }, &mut bytes);
    digest.add_sequence(&bytes);
}

/// May run on the lazy-free thread: no Redis API calls here.
///
/// # Safety
/// `value` is a live value of this type, not used after this call.
unsafe extern "C" fn free(value: *mut c_void) {
    // SAFETY: as above; Redis frees each value once.
    unsafe { drop_value(value) };
}

/// A record is at most two allocations: always cheap to free inline.
///
/// # Safety
/// No pointer is dereferenced.
unsafe extern "C" fn free_effort(_key: *mut raw::RedisModuleString, _value: *const c_void) -> usize {
    1
}

/// `COPY`: an independent copy of the value.
///
/// # Safety
/// `value` is a live value of this type.
unsafe extern "C" fn copy(
    _from: *mut raw::RedisModuleString,
    _to: *mut raw::RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    // SAFETY: a live value of this type, only read.
    into_value(unsafe { to_record(value as *mut c_void) })
}
