//! The sharded Bloom filter as a Redis data type: the `unsafe extern "C"`
//! callbacks Redis calls for persistence, copying, digests, memory
//! accounting and freeing. A key's value is a boxed [`ShardedBloom`].

use std::ffi::{c_int, c_void};
use std::ptr;

use redis_module::native_types::RedisType;
use redis_module::raw;

use crate::bloom::{ShardedBloom, codec};
use crate::server::{CmdError, Key, RawString, allocation_size, api, c_bytes};

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

fn module_type() -> *mut raw::RedisModuleType {
    *BLOOM_TYPE.raw_type.borrow()
}

/// The filter under an open key; `Err(WRONGTYPE)` for another type.
pub fn open(key: &Key) -> Result<Option<&mut ShardedBloom>, CmdError> {
    // SAFETY: values of this type are boxed filters made by `store`; the
    // key stays open, and nothing else touches the value, while borrowed.
    Ok(key.module_value(module_type())?.map(|value| unsafe { &mut *(value as *mut ShardedBloom) }))
}

/// The filter under a raw key handle (as `RedisModule_Scan` gives it), if
/// the key holds one.
pub fn value_of<'a>(key: *mut raw::RedisModuleKey) -> Option<&'a ShardedBloom> {
    if unsafe { api!(RedisModule_ModuleTypeGetType)(key) } != module_type() {
        return None;
    }
    // SAFETY: as in `open`; the handle is valid for the scan callback.
    Some(unsafe { &*(api!(RedisModule_ModuleTypeGetValue)(key) as *const ShardedBloom) })
}

/// Makes `key` hold `filter`, expiring when its newest shard leaves the
/// window.
pub fn store(key: &Key, filter: ShardedBloom) {
    let expire_at = filter.expire_at();
    store_without_expiry(key, filter);
    key.set_expire_at(expire_at);
}

/// Makes `key` hold `filter` with no expiry (the AOF rewrite's
/// `IDEM.BF.LOAD` is followed by the key's own `PEXPIREAT`, if it has one).
pub fn store_without_expiry(key: &Key, filter: ShardedBloom) {
    key.set_module_value(module_type(), Box::into_raw(Box::new(filter)).cast());
}

fn encode(filter: &ShardedBloom) -> Vec<u8> {
    let mut bytes = Vec::new();
    codec::encode(filter, &mut bytes);
    bytes
}

/// # Safety
/// `value` must be a live value of this type.
unsafe fn filter_ref<'a>(value: *const c_void) -> &'a ShardedBloom {
    unsafe { &*(value as *const ShardedBloom) }
}

/// # Safety
/// Called by Redis with a valid `rdb` handle; IO errors are handled
/// (`HANDLE_IO_ERRORS`), so a failed read makes the load fail, never abort.
unsafe extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    let refuse = |why: &'static std::ffi::CStr| {
        unsafe {
            api!(RedisModule_LogIOError)(
                rdb,
                c"warning".as_ptr(),
                c"redis-idem: refused a filter payload: %s".as_ptr(),
                why.as_ptr(),
            )
        };
        ptr::null_mut()
    };
    if encver > ENCODING_VERSION {
        return refuse(c"encoding version newer than this module");
    }
    let Ok(buffer) = raw::load_string_buffer(rdb) else {
        return ptr::null_mut();
    };
    // The server's own data (an RDB or a full sync being loaded) may hold
    // format 1 filters that older versions grew past today's limits; a
    // RESTORE payload comes from a client and gets the strict decoder.
    let decode = if is_loading(rdb) { codec::decode_stored } else { codec::decode };
    match decode(buffer.as_ref()) {
        Ok(filter) => Box::into_raw(Box::new(filter)).cast(),
        Err(_) => refuse(c"corrupt filter"),
    }
}

/// Whether the server is loading its own data (RDB, AOF, a primary's full
/// sync), rather than running a client's `RESTORE`.
fn is_loading(rdb: *mut raw::RedisModuleIO) -> bool {
    // SAFETY: `rdb` is the handle Redis passed to the callback; the context
    // it gives lives as long as the handle.
    let ctx = unsafe { api!(RedisModule_GetContextFromIO)(rdb) };
    if ctx.is_null() {
        return false;
    }
    // SAFETY: a valid context, as above.
    let flags = unsafe { api!(RedisModule_GetContextFlags)(ctx) } as u32;
    flags & raw::REDISMODULE_CTX_FLAGS_LOADING != 0
}

/// # Safety
/// `value` is a live value of this type.
unsafe extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    raw::save_slice(rdb, &encode(unsafe { filter_ref(value) }));
}

/// Rewrites the key as one `IDEM.BF.LOAD key blob`; Redis appends the
/// key's `PEXPIREAT` after it.
///
/// # Safety
/// `value` is a live value of this type; `key` is its key name.
unsafe extern "C" fn aof_rewrite(aof: *mut raw::RedisModuleIO, key: RawString, value: *mut c_void) {
    let blob = encode(unsafe { filter_ref(value) });
    let (ptr, len) = c_bytes(&blob);
    unsafe { api!(RedisModule_EmitAOF)(aof, c"IDEM.BF.LOAD".as_ptr(), c"sb".as_ptr(), key, ptr, len) };
}

/// Size of Redis's `moduleValue` wrapper around our pointer.
const MODULE_VALUE_SIZE: usize = 16;

/// # Safety
/// `value` is a live value of this type, allocated by Redis's allocator.
unsafe extern "C" fn mem_usage(value: *const c_void) -> usize {
    let filter = unsafe { filter_ref(value) };
    let mut total = MODULE_VALUE_SIZE + allocation_size(value as *const ShardedBloom, 1);
    total += allocation_size(filter.shards.as_ptr(), filter.shards.capacity());
    for shard in &filter.shards {
        total += allocation_size(shard.filters.as_ptr(), shard.filters.capacity());
        total += shard.filters.iter().map(|sub| allocation_size(sub.bits.as_ptr(), sub.bits.words())).sum::<usize>();
    }
    total
}

/// # Safety
/// `md` is a valid digest context; `value` a live value of this type.
unsafe extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    let bytes = encode(unsafe { filter_ref(value) });
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
    drop(unsafe { Box::from_raw(value as *mut ShardedBloom) });
}

/// One unit per allocation and per 64 KiB of bits: a filter of more than
/// about 4 MiB goes over Redis's lazy-free threshold (64) and is freed in
/// the background on `UNLINK`, `FLUSHALL ASYNC` or lazy expiry.
///
/// # Safety
/// `value` is a live value of this type.
unsafe extern "C" fn free_effort(_key: RawString, value: *const c_void) -> usize {
    let filter = unsafe { filter_ref(value) };
    1 + filter.shards.len() + filter.sub_filter_count() + (filter.bytes() >> 16) as usize
}

/// `COPY`: an independent copy of the value.
///
/// # Safety
/// `value` is a live value of this type.
unsafe extern "C" fn copy(_from: RawString, _to: RawString, value: *const c_void) -> *mut c_void {
    Box::into_raw(Box::new(unsafe { filter_ref(value) }.clone())).cast()
}
