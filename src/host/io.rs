//! What the data types' callbacks get from Redis, wrapped: the RDB stream
//! (`rdb_load`, `rdb_save`), the AOF rewrite and digests. Each wrapper is
//! made from the raw handle a callback received and lives no longer than
//! the callback.

use std::ffi::CStr;
use std::marker::PhantomData;
use std::ptr::NonNull;

use redis_module::raw;

use super::key::Arg;
use super::{api, c_bytes};

/// The RDB stream of an `rdb_load` or `rdb_save` callback (also `DUMP`,
/// `RESTORE`, a full sync and `DEBUG RELOAD`).
pub struct Rdb<'a> {
    raw: NonNull<raw::RedisModuleIO>,
    _call: PhantomData<&'a mut raw::RedisModuleIO>,
}

impl<'a> Rdb<'a> {
    /// # Safety
    /// `raw` is the handle Redis passed to the running callback.
    pub unsafe fn from_raw(raw: *mut raw::RedisModuleIO) -> Option<Rdb<'a>> {
        Some(Rdb { raw: NonNull::new(raw)?, _call: PhantomData })
    }

    /// The next string of the payload; `None` when the read failed (the
    /// module handles IO errors, so Redis then fails the load itself).
    pub fn load_bytes(&mut self) -> Option<redis_module::RedisBuffer> {
        raw::load_string_buffer(self.raw.as_ptr()).ok()
    }

    pub fn save_bytes(&mut self, bytes: &[u8]) {
        raw::save_slice(self.raw.as_ptr(), bytes);
    }

    /// Logs why a payload was refused (`what` names the payload's kind);
    /// the load then fails with an error.
    pub fn log_refused(&self, what: &CStr, why: &CStr) {
        // SAFETY: the callback's live handle; a format with two `%s`, and
        // two NUL-terminated strings.
        unsafe {
            api!(RedisModule_LogIOError)(
                self.raw.as_ptr(),
                c"warning".as_ptr(),
                c"redis-idem: refused a %s payload: %s".as_ptr(),
                what.as_ptr(),
                why.as_ptr(),
            )
        };
    }

    /// Whether the server is loading its own data (RDB, AOF, a primary's
    /// full sync, also into a temporary database with `repl-diskless-load
    /// swapdb`), rather than running a client's `RESTORE`.
    pub fn server_is_loading(&self) -> bool {
        // SAFETY: the callback's live handle; the context it gives lives
        // as long as the handle.
        let ctx = unsafe { api!(RedisModule_GetContextFromIO)(self.raw.as_ptr()) };
        if ctx.is_null() {
            return false;
        }
        // SAFETY: a live context, as above.
        let flags = unsafe { api!(RedisModule_GetContextFlags)(ctx) } as u32;
        flags & (raw::REDISMODULE_CTX_FLAGS_LOADING | raw::REDISMODULE_CTX_FLAGS_ASYNC_LOADING) != 0
    }
}

/// The AOF being rewritten, in an `aof_rewrite` callback.
pub struct Aof<'a> {
    raw: NonNull<raw::RedisModuleIO>,
    _call: PhantomData<&'a mut raw::RedisModuleIO>,
}

impl<'a> Aof<'a> {
    /// # Safety
    /// `raw` is the handle Redis passed to the running callback.
    pub unsafe fn from_raw(raw: *mut raw::RedisModuleIO) -> Option<Aof<'a>> {
        Some(Aof { raw: NonNull::new(raw)?, _call: PhantomData })
    }

    /// Writes `command key blob` to the AOF.
    pub fn emit_key_blob(&mut self, command: &'static CStr, key: Arg<'_>, blob: &[u8]) {
        let (ptr, len) = c_bytes(blob);
        // SAFETY: the callback's live handle; "sb" matches a Redis string
        // and a buffer with its length, which Redis copies.
        unsafe {
            api!(RedisModule_EmitAOF)(self.raw.as_ptr(), command.as_ptr(), c"sb".as_ptr(), key.as_ptr(), ptr, len)
        };
    }
}

/// A `DEBUG DIGEST` in progress, in a `digest` callback.
pub struct Digest<'a> {
    raw: NonNull<raw::RedisModuleDigest>,
    _call: PhantomData<&'a mut raw::RedisModuleDigest>,
}

impl<'a> Digest<'a> {
    /// # Safety
    /// `raw` is the digest Redis passed to the running callback.
    pub unsafe fn from_raw(raw: *mut raw::RedisModuleDigest) -> Option<Digest<'a>> {
        Some(Digest { raw: NonNull::new(raw)?, _call: PhantomData })
    }

    /// Adds the value's bytes as one ordered sequence.
    pub fn add_sequence(&mut self, bytes: &[u8]) {
        let (ptr, len) = c_bytes(bytes);
        // SAFETY: the callback's live digest and a buffer of `len` bytes.
        unsafe {
            api!(RedisModule_DigestAddStringBuffer)(self.raw.as_ptr(), ptr, len);
            api!(RedisModule_DigestEndSequence)(self.raw.as_ptr());
        }
    }
}
