//! The sharded Bloom filter as a Redis data type: how a key holds one, and
//! the `unsafe extern "C"` callbacks Redis calls for persistence, copying,
//! digests, memory accounting and freeing. A key's value is a boxed
//! [`ShardedBloom`].

use std::ffi::{c_int, c_void};
use std::ptr;

use idem_core::bloom::{ShardedBloom, codec};
use idem_core::error::CmdError;
use redis_module::native_types::RedisType;
use redis_module::raw;

use crate::host::background::VisitedKey;
use crate::host::io::{Aof, Digest, Rdb};
use crate::host::key::TypeHandle;
use crate::host::{Arg, Key, allocation_size};

/// Encoding version of the RDB payload; a newer one is refused on load.
pub const ENCODING_VERSION: i32 = 2;

pub static BLOOM_TYPE: RedisType = RedisType::new(
    "idembloom",
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
    *BLOOM_TYPE.raw_type.borrow()
}

/// The filter under an open key, for as long as the key is borrowed;
/// `Err(WRONGTYPE)` for another type.
pub fn open<'k>(key: &'k mut Key<'_>) -> Result<Option<&'k mut ShardedBloom>, CmdError> {
    // SAFETY: values of this type are boxed filters made by `store`; the
    // key stays open, and its `&mut` borrow keeps anything else from
    // reaching the value, while the filter is borrowed.
    Ok(key.module_value(module_type())?.map(|value| unsafe { &mut *value.as_ptr().cast::<ShardedBloom>() }))
}

/// The filter a walk visits, if the key holds one.
pub fn visited<'k>(key: &'k VisitedKey<'_>) -> Option<&'k ShardedBloom> {
    // SAFETY: as in `open`; the scan only reads, for the length of the
    // visit.
    key.module_value(module_type()).map(|value| unsafe { &*value.as_ptr().cast::<ShardedBloom>() })
}

/// Makes `key` hold `filter`, expiring when its newest shard leaves the
/// window.
pub fn store(key: &mut Key<'_>, filter: ShardedBloom) {
    let expire_at = filter.expire_at();
    store_without_expiry(key, filter);
    key.set_expire_at(expire_at);
}

/// Makes `key` hold `filter` with no expiry (the AOF rewrite's
/// `IDEM.BF.LOAD` is followed by the key's own `PEXPIREAT`, if it has one).
pub fn store_without_expiry(key: &mut Key<'_>, filter: ShardedBloom) {
    // SAFETY: a boxed filter, as this type's callbacks expect.
    unsafe { key.set_module_value(module_type(), Box::into_raw(Box::new(filter)).cast()) };
}

fn encode(filter: &ShardedBloom) -> Vec<u8> {
    let mut bytes = Vec::new();
    codec::encode(filter, &mut bytes);
    bytes
}

/// # Safety
/// `value` must be a live value of this type, not freed while borrowed.
unsafe fn filter_ref<'a>(value: *const c_void) -> &'a ShardedBloom {
    // SAFETY: values of this type are boxed filters.
    unsafe { &*(value as *const ShardedBloom) }
}

/// # Safety
/// Called by Redis with a valid `rdb` handle; IO errors are handled
/// (`HANDLE_IO_ERRORS`), so a failed read makes the load fail, never abort.
unsafe extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    // SAFETY: the handle Redis passed to this callback.
    let Some(mut rdb) = (unsafe { Rdb::from_raw(rdb) }) else { return ptr::null_mut() };
    if encver > ENCODING_VERSION {
        rdb.log_refused(c"filter", c"encoding version newer than this module");
        return ptr::null_mut();
    }
    let Some(buffer) = rdb.load_bytes() else { return ptr::null_mut() };
    // The server's own data (an RDB or a full sync being loaded) may hold
    // format 1 filters that older versions grew past today's limits; a
    // RESTORE payload comes from a client and gets the strict decoder.
    let decode = if rdb.server_is_loading() { codec::decode_stored } else { codec::decode };
    match decode(buffer.as_ref()) {
        Ok(filter) => Box::into_raw(Box::new(filter)).cast(),
        Err(_) => {
            rdb.log_refused(c"filter", c"corrupt filter");
            ptr::null_mut()
        }
    }
}

/// # Safety
/// `value` is a live value of this type; `rdb` the callback's handle.
unsafe extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    // SAFETY: the handle Redis passed to this callback.
    let Some(mut rdb) = (unsafe { Rdb::from_raw(rdb) }) else { return };
    // SAFETY: a live value of this type, only read.
    rdb.save_bytes(&encode(unsafe { filter_ref(value) }));
}

/// Rewrites the key as one `IDEM.BF.LOAD key blob`; Redis appends the
/// key's `PEXPIREAT` after it.
///
/// # Safety
/// `value` is a live value of this type; `key` is its key name.
unsafe extern "C" fn aof_rewrite(aof: *mut raw::RedisModuleIO, key: *mut raw::RedisModuleString, value: *mut c_void) {
    // SAFETY: the handle and key name Redis passed to this callback.
    let (Some(mut aof), Some(key)) = (unsafe { Aof::from_raw(aof) }, unsafe { Arg::from_raw(key) }) else { return };
    // SAFETY: a live value of this type, only read.
    let blob = encode(unsafe { filter_ref(value) });
    aof.emit_key_blob(c"IDEM.BF.LOAD", key, &blob);
}

/// Size of Redis's `moduleValue` wrapper around our pointer.
const MODULE_VALUE_SIZE: usize = 16;

/// # Safety
/// `value` is a live value of this type, allocated by Redis's allocator.
unsafe extern "C" fn mem_usage(value: *const c_void) -> usize {
    // SAFETY: a live value of this type, only read.
    let filter = unsafe { filter_ref(value) };
    // SAFETY: the filter's own box.
    let mut total = MODULE_VALUE_SIZE + unsafe { allocation_size(value as *const ShardedBloom, 1) };
    // SAFETY: a `Vec`'s buffer, `capacity` elements long.
    total += unsafe { allocation_size(filter.shards.as_ptr(), filter.shards.capacity()) };
    for shard in &filter.shards {
        // SAFETY: as above.
        total += unsafe { allocation_size(shard.filters.as_ptr(), shard.filters.capacity()) };
        let words = shard.filters.iter().map(|sub| sub.bits.words());
        // SAFETY: a boxed slice's own allocation, `len` elements long.
        total += words.map(|words| unsafe { allocation_size(words.as_ptr(), words.len()) }).sum::<usize>();
    }
    total
}

/// # Safety
/// `md` is a valid digest context; `value` a live value of this type.
unsafe extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    // SAFETY: the digest Redis passed to this callback.
    let Some(mut digest) = (unsafe { Digest::from_raw(md) }) else { return };
    // SAFETY: a live value of this type, only read.
    digest.add_sequence(&encode(unsafe { filter_ref(value) }));
}

/// May run on the lazy-free thread: no Redis API calls here.
///
/// # Safety
/// `value` is a live value of this type, not used after this call.
unsafe extern "C" fn free(value: *mut c_void) {
    // SAFETY: a boxed filter; Redis frees each value once.
    drop(unsafe { Box::from_raw(value as *mut ShardedBloom) });
}

/// One unit per allocation and per 64 KiB of bits: a filter of more than
/// about 4 MiB goes over Redis's lazy-free threshold (64) and is freed in
/// the background on `UNLINK`, `FLUSHALL ASYNC` or lazy expiry.
///
/// # Safety
/// `value` is a live value of this type.
unsafe extern "C" fn free_effort(_key: *mut raw::RedisModuleString, value: *const c_void) -> usize {
    // SAFETY: a live value of this type, only read.
    let filter = unsafe { filter_ref(value) };
    1 + filter.shards.len() + filter.sub_filter_count() + (filter.bytes() >> 16) as usize
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
    Box::into_raw(Box::new(unsafe { filter_ref(value) }.clone())).cast()
}
