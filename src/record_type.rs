//! The record as a Redis data type: its in-memory representation and the
//! `unsafe extern "C"` callbacks Redis calls for persistence, copying,
//! digests and memory accounting.
//!
//! A key's value is a tagged pointer. The common records (no result, no
//! fingerprint) are packed allocations told apart by the low bits: a done
//! record in 16 bytes, so it costs no more than `SET key <16-byte token> NX
//! PX`, a claimed one in 32; every other record is a boxed [`Record`].

use std::cell::RefCell;
use std::ffi::{c_int, c_void};
use std::ptr;

use redis_module::native_types::RedisType;
use redis_module::raw;

use crate::record::codec::{self, Packed};
use crate::record::{Millis, Record};
use crate::server::{CmdError, Key, RawString, allocation_size, api, c_bytes};

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

fn module_type() -> *mut raw::RedisModuleType {
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
/// `value` must come from [`into_value`] and not be freed yet.
unsafe fn value_ref<'a>(value: *mut c_void) -> Value<'a> {
    let address = untagged(value);
    match value as usize & TAG_MASK {
        DONE_TAG => Value::Packed(Packed::Done(unsafe { *(address as *const [u64; 2]) })),
        CLAIM_TAG => Value::Packed(Packed::Claim(unsafe { *(address as *const [u64; 4]) })),
        _ => Value::Full(unsafe { &mut *(address as *mut Record) }),
    }
}

/// # Safety
/// `value` must come from [`into_value`]; it is invalid afterwards.
unsafe fn drop_value(value: *mut c_void) {
    let address = untagged(value);
    match value as usize & TAG_MASK {
        DONE_TAG => drop(unsafe { Box::from_raw(address as *mut [u64; 2]) }),
        CLAIM_TAG => drop(unsafe { Box::from_raw(address as *mut [u64; 4]) }),
        _ => drop(unsafe { Box::from_raw(address as *mut Record) }),
    }
}

/// A copy of the stored record (packed ones are unpacked).
///
/// # Safety
/// As [`value_ref`].
unsafe fn to_record(value: *mut c_void) -> Record {
    match unsafe { value_ref(value) } {
        Value::Packed(packed) => codec::unpack(packed),
        Value::Full(record) => record.clone(),
    }
}

/// The record under an open key, ready for a transition of `record.rs`.
/// Boxed records are changed in place; a packed one is unpacked into
/// `unpacked` and stored again only if a transition changes it.
pub struct Slot<'k> {
    key: &'k Key,
    full: Option<&'k mut Record>,
    unpacked: Option<Record>,
}

impl<'k> Slot<'k> {
    /// `Err(WRONGTYPE)` for a key of another type.
    pub fn open(key: &'k Key) -> Result<Slot<'k>, CmdError> {
        let mut slot = Slot { key, full: None, unpacked: None };
        if let Some(value) = key.module_value(module_type())? {
            // SAFETY: a value of our type was made by `into_value`; it lives
            // while the key is open and nothing else touches it meanwhile.
            match unsafe { value_ref(value) } {
                Value::Packed(packed) => slot.unpacked = Some(codec::unpack(packed)),
                Value::Full(record) => slot.full = Some(record),
            }
        }
        Ok(slot)
    }

    pub fn key(&self) -> &'k Key {
        self.key
    }

    pub fn record(&mut self) -> Option<&mut Record> {
        match &mut self.full {
            Some(record) => Some(record),
            None => self.unpacked.as_mut(),
        }
    }

    /// Stores the record after an in-place transition and sets the key's
    /// expiry: a packed one is packed again, a boxed one that now packs
    /// shrinks.
    pub fn store_updated(mut self, expire_at: Millis) {
        let key = self.key;
        if let Some(record) = self.unpacked.take() {
            let old = key.replace_module_value(module_type(), into_value(record));
            // SAFETY: `old` was this key's value, now detached from it.
            unsafe { drop_value(old) };
        } else if let Some(record) = self.full.take() {
            if codec::pack(record).is_some() {
                let record = std::mem::replace(record, Record::done_without_claim(0, None));
                let old = key.replace_module_value(module_type(), into_value(record));
                unsafe { drop_value(old) };
            }
        }
        key.set_expire_at(Some(expire_at));
    }
}

/// Makes `key` hold `record` until `expire_at` (`None`: no expiry),
/// replacing whatever record it held.
pub fn store_new(key: &Key, record: Record, expire_at: Option<Millis>) {
    key.set_module_value(module_type(), into_value(record));
    key.set_expire_at(expire_at);
}

/// The replicated effect of a write: the record with its absolute expiry
/// (-1: none), applied as is by `IDEM.APPLY`.
pub fn effect_blob(record: &Record, expire_at: Option<Millis>) -> Vec<u8> {
    let mut blob = Vec::new();
    write_effect(record, expire_at, &mut blob);
    blob
}

fn write_effect(record: &Record, expire_at: Option<Millis>, out: &mut Vec<u8>) {
    out.reserve(8 + codec::max_encoded_len(record));
    out.extend_from_slice(&expire_at.unwrap_or(-1).to_le_bytes());
    codec::encode(record, out);
}

/// Calls `use_blob` with [`effect_blob`]'s bytes, written into a buffer
/// that commands (all on Redis's main thread) reuse: no allocation per
/// write on the hot path.
pub fn with_effect_blob<R>(record: &Record, expire_at: Option<Millis>, use_blob: impl FnOnce(&[u8]) -> R) -> R {
    thread_local! {
        static BUFFER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    }
    BUFFER.with_borrow_mut(|buffer| {
        buffer.clear();
        write_effect(record, expire_at, buffer);
        let result = use_blob(buffer);
        // A large RESULT passed through: do not keep its memory.
        if buffer.capacity() > 64 * 1024 {
            *buffer = Vec::new();
        }
        result
    })
}

pub fn parse_effect_blob(blob: &[u8]) -> Result<(Record, Option<Millis>), codec::DecodeError> {
    let mut input = codec::Reader(blob);
    let expire_at = i64::from_le_bytes(input.array()?);
    if expire_at < -1 {
        return Err(codec::DecodeError("bad expiry"));
    }
    Ok((codec::decode(input.0)?, (expire_at >= 0).then_some(expire_at)))
}

/// Logs why a payload was refused; the load then fails with an error.
fn log_refused(rdb: *mut raw::RedisModuleIO, why: &'static std::ffi::CStr) {
    unsafe {
        api!(RedisModule_LogIOError)(
            rdb,
            c"warning".as_ptr(),
            c"redis-idem: refused a record payload: %s".as_ptr(),
            why.as_ptr(),
        )
    };
}

/// # Safety
/// Called by Redis with a valid `rdb` handle; module IO errors are handled
/// (`HANDLE_IO_ERRORS`), so a failed read returns an error, never aborts.
unsafe extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    if encver > ENCODING_VERSION {
        log_refused(rdb, c"encoding version newer than this module");
        return ptr::null_mut();
    }
    let Ok(buffer) = raw::load_string_buffer(rdb) else {
        return ptr::null_mut();
    };
    match codec::decode(buffer.as_ref()) {
        Ok(record) => into_value(record),
        Err(_) => {
            log_refused(rdb, c"corrupt record");
            ptr::null_mut()
        }
    }
}

/// # Safety
/// `value` is a live value of this type.
unsafe extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    let mut bytes = Vec::new();
    codec::encode(&unsafe { to_record(value) }, &mut bytes);
    raw::save_slice(rdb, &bytes);
}

/// Rewrites the key as one `IDEM.APPLY` without expiry; Redis appends the
/// key's `PEXPIREAT` after it.
///
/// # Safety
/// `value` is a live value of this type; `key` is its key name.
unsafe extern "C" fn aof_rewrite(aof: *mut raw::RedisModuleIO, key: RawString, value: *mut c_void) {
    let blob = effect_blob(&unsafe { to_record(value) }, None);
    let (ptr, len) = c_bytes(&blob);
    unsafe { api!(RedisModule_EmitAOF)(aof, c"IDEM.APPLY".as_ptr(), c"sb".as_ptr(), key, ptr, len) };
}

/// Size of Redis's `moduleValue` wrapper around our pointer.
const MODULE_VALUE_SIZE: usize = 16;

/// # Safety
/// `value` is a live value of this type, allocated by Redis's allocator.
unsafe extern "C" fn mem_usage(value: *const c_void) -> usize {
    let own = MODULE_VALUE_SIZE + allocation_size(untagged(value) as *const u8, 1);
    match unsafe { value_ref(value as *mut c_void) } {
        Value::Packed(_) => own,
        // An empty RESULT is an empty boxed slice: no allocation behind it.
        Value::Full(record) => own + record.result.as_ref().map_or(0, |r| allocation_size(r.as_ptr(), r.len())),
    }
}

/// # Safety
/// `md` is a valid digest context; `value` a live value of this type.
unsafe extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    let mut bytes = Vec::new();
    codec::encode(&unsafe { to_record(value) }, &mut bytes);
    let (ptr, len) = c_bytes(&bytes);
    unsafe {
        api!(RedisModule_DigestAddStringBuffer)(md, ptr, len);
        api!(RedisModule_DigestEndSequence)(md);
    }
}

/// May run on the lazy-free thread: no Redis API calls here.
///
/// # Safety
/// `value` is a live value of this type, not used after this call.
unsafe extern "C" fn free(value: *mut c_void) {
    unsafe { drop_value(value) };
}

/// A record is at most two allocations: always cheap to free inline.
///
/// # Safety
/// No pointer is dereferenced.
unsafe extern "C" fn free_effort(_key: RawString, _value: *const c_void) -> usize {
    1
}

/// `COPY`: an independent copy of the value.
///
/// # Safety
/// `value` is a live value of this type.
unsafe extern "C" fn copy(_from: RawString, _to: RawString, value: *const c_void) -> *mut c_void {
    into_value(unsafe { to_record(value as *mut c_void) })
}

/// Decodes a replicated effect, for `IDEM.APPLY`.
pub fn decode_effect(blob: &[u8]) -> Result<(Record, Option<Millis>), CmdError> {
    parse_effect_blob(blob).map_err(|e| CmdError::new(format!("ERR invalid IDEM.APPLY payload: {}", e.0)))
}
