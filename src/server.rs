//! Thin wrappers over the raw Redis module API: context, arguments, keys,
//! replies. The crate's convenience layer (`decode_args`, `RedisValue`
//! replies, a `String` per replicated argument) costs 0.3-0.4 us per command
//! on a 1.9 us budget, so the hot path talks to the raw API through these.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

use redis_module::raw;

use crate::args::ArgList;
use crate::record::Millis;

pub type RawCtx = *mut raw::RedisModuleCtx;
pub type RawString = *mut raw::RedisModuleString;

/// Loads an API function pointer. Redis fills them in before any module code
/// runs; a missing one is a module built against a newer API than the
/// server, which `init` checks for the optional ones.
macro_rules! api {
    ($name:ident) => {{
        #[allow(unused_unsafe)]
        let function = unsafe { raw::$name };
        function.expect(concat!(stringify!($name), " is not available"))
    }};
}
pub(crate) use api;

/// An error reply. Static text on the common paths; formatted only when the
/// message names a value.
#[derive(Debug)]
pub enum CmdError {
    Static(&'static CStr),
    Owned(CString),
}

impl CmdError {
    pub fn new(message: String) -> CmdError {
        // Messages are built from our own text and argument bytes a client
        // sent; a NUL in those would truncate, never fail.
        let bytes: Vec<u8> = message.into_bytes().into_iter().filter(|&b| b != 0).collect();
        CmdError::Owned(CString::new(bytes).expect("NULs were removed"))
    }
    /// The reply's text.
    pub fn message(&self) -> String {
        self.as_cstr().to_string_lossy().into_owned()
    }

    fn as_cstr(&self) -> &CStr {
        match self {
            CmdError::Static(text) => text,
            CmdError::Owned(text) => text,
        }
    }
}

pub const WRONGTYPE: CmdError = CmdError::Static(c"WRONGTYPE Operation against a key holding the wrong kind of value");
pub const NOT_AN_INTEGER: CmdError = CmdError::Static(c"ERR value is not an integer or out of range");

pub type CmdResult = Result<(), CmdError>;

/// The context of one command call.
#[derive(Clone, Copy)]
pub struct Ctx(pub RawCtx);

impl Ctx {
    /// The wall clock in Unix ms, read once per command.
    pub fn now(self) -> Millis {
        unsafe { api!(RedisModule_Milliseconds)() }
    }

    /// Used memory is over `maxmemory` (never on a replica that ignores
    /// it, nor without a `maxmemory`).
    pub fn memory_full(self) -> bool {
        let flags = unsafe { api!(RedisModule_GetContextFlags)(self.0) } as u32;
        flags & raw::REDISMODULE_CTX_FLAGS_OOM != 0
    }

    pub fn reply_array(self, len: usize) {
        unsafe { api!(RedisModule_ReplyWithArray)(self.0, len as _) };
    }
    /// A map in RESP3, a flat field-value array in RESP2.
    pub fn reply_map(self, pairs: usize) {
        unsafe { api!(RedisModule_ReplyWithMap)(self.0, pairs as _) };
    }
    pub fn reply_int(self, value: i64) {
        unsafe { api!(RedisModule_ReplyWithLongLong)(self.0, value) };
    }
    pub fn reply_null(self) {
        unsafe { api!(RedisModule_ReplyWithNull)(self.0) };
    }
    pub fn reply_simple(self, text: &'static CStr) {
        unsafe { api!(RedisModule_ReplyWithSimpleString)(self.0, text.as_ptr()) };
    }
    pub fn reply_bulk(self, bytes: &[u8]) {
        let (ptr, len) = c_bytes(bytes);
        unsafe { api!(RedisModule_ReplyWithStringBuffer)(self.0, ptr, len) };
    }
    pub fn reply_optional_bulk(self, bytes: Option<&[u8]>) {
        match bytes {
            Some(bytes) => self.reply_bulk(bytes),
            None => self.reply_null(),
        }
    }
    pub fn reply_double(self, value: f64) {
        unsafe { api!(RedisModule_ReplyWithDouble)(self.0, value) };
    }
    pub fn reply_error(self, error: &CmdError) {
        unsafe { api!(RedisModule_ReplyWithError)(self.0, error.as_cstr().as_ptr()) };
    }

    pub fn open_key(self, name: RawString, mode: KeyMode) -> Key {
        let raw = unsafe { api!(RedisModule_OpenKey)(self.0, name, mode as c_int) };
        Key { raw, name }
    }

    /// Propagates `command key blob` to replicas and the AOF: one compact
    /// command per write, which is what RM_Replicate charges least for.
    pub fn replicate_key_blob(self, command: &'static CStr, key: RawString, blob: &[u8]) {
        let (blob_ptr, blob_len) = c_bytes(blob);
        unsafe { api!(RedisModule_Replicate)(self.0, command.as_ptr(), c"sb".as_ptr(), key, blob_ptr, blob_len) };
    }

    /// Propagates `command key blob item...`. One or no item, the common
    /// case, avoids the `v` format, which grows Redis's argument vector
    /// with a realloc.
    pub fn replicate_key_blob_items(self, command: &'static CStr, key: RawString, blob: &[u8], items: &[RawString]) {
        if items.is_empty() {
            return self.replicate_key_blob(command, key, blob);
        }
        let (blob_ptr, blob_len) = c_bytes(blob);
        let replicate = api!(RedisModule_Replicate);
        unsafe {
            match items {
                [item] => replicate(self.0, command.as_ptr(), c"sbs".as_ptr(), key, blob_ptr, blob_len, *item),
                _ => replicate(
                    self.0,
                    command.as_ptr(),
                    c"sbv".as_ptr(),
                    key,
                    blob_ptr,
                    blob_len,
                    items.as_ptr(),
                    items.len(),
                ),
            }
        };
    }

    pub fn replicate_verbatim(self) {
        unsafe { api!(RedisModule_ReplicateVerbatim)(self.0) };
    }

    /// A keyspace notification of the module class (`d` in
    /// notify-keyspace-events); Redis skips it cheaply when not enabled.
    pub fn notify(self, event: &'static CStr, key: RawString) {
        unsafe { api!(RedisModule_NotifyKeyspaceEvent)(self.0, raw::REDISMODULE_NOTIFY_MODULE, event.as_ptr(), key) };
    }

    /// Refuses the internal commands to clients: they store records and
    /// filters exactly as sent, so only the primary's replication link and
    /// AOF loading (which replay what this module itself propagated) may
    /// run them.
    pub fn require_primary_or_aof(self) -> CmdResult {
        let flags = unsafe { api!(RedisModule_GetContextFlags)(self.0) } as u32;
        if flags & (raw::REDISMODULE_CTX_FLAGS_REPLICATED | raw::REDISMODULE_CTX_FLAGS_LOADING) != 0 {
            return Ok(());
        }
        Err(CmdError::Static(c"ERR internal command: only the primary's replication link and AOF loading may run it"))
    }

    pub fn log_warning(self, message: &str) {
        redis_module::raw::redis_log(self.0, message);
    }
}

/// A command's arguments, `argv[0]` being the command name.
pub struct Args<'a>(&'a [RawString]);

impl Args<'_> {
    pub fn raw(&self, index: usize) -> RawString {
        self.0[index]
    }

    pub fn raw_from(&self, index: usize) -> &[RawString] {
        &self.0[index..]
    }
}

impl ArgList for Args<'_> {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn bytes(&self, index: usize) -> &[u8] {
        string_bytes(self.0[index])
    }
}

/// A byte slice as the C API takes it. An empty Rust slice points at an
/// address that was never allocated (its alignment): harmless to Rust, but
/// C code may hand it to the allocator or to memcpy. Empty slices point at
/// a real static byte instead.
pub fn c_bytes(bytes: &[u8]) -> (*const c_char, usize) {
    static EMPTY: [u8; 1] = [0];
    let bytes = if bytes.is_empty() { &EMPTY[..0] } else { bytes };
    (bytes.as_ptr().cast(), bytes.len())
}

/// Bytes Redis's allocator really holds for an allocation of `len`
/// elements starting at `ptr`. A Rust value with nothing in it (an empty
/// boxed slice, a `Vec` without capacity) holds no allocation at all, and
/// its dangling pointer must never reach the allocator: 0 for those.
pub fn allocation_size<T>(ptr: *const T, len: usize) -> usize {
    if len == 0 || size_of::<T>() == 0 {
        return 0;
    }
    unsafe { api!(RedisModule_MallocSize)(ptr as *mut c_void) }
}

/// A Redis string with a copy of `bytes`, to be freed with
/// `RedisModule_FreeString`.
pub fn create_string(ctx: RawCtx, bytes: &[u8]) -> RawString {
    let (ptr, len) = c_bytes(bytes);
    unsafe { api!(RedisModule_CreateString)(ctx, ptr, len) }
}

/// The bytes of a Redis string; valid while the string is.
pub fn string_bytes<'a>(string: RawString) -> &'a [u8] {
    let mut len = 0;
    let ptr = unsafe { api!(RedisModule_StringPtrLen)(string, &mut len) };
    if len == 0 {
        return &[];
    }
    unsafe { std::slice::from_raw_parts(ptr.cast(), len) }
}

#[derive(Clone, Copy)]
#[repr(i32)]
pub enum KeyMode {
    Read = raw::REDISMODULE_READ as i32,
    Write = (raw::REDISMODULE_READ | raw::REDISMODULE_WRITE) as i32,
}

/// An open key, closed when dropped.
pub struct Key {
    raw: *mut raw::RedisModuleKey,
    name: RawString,
}

impl Key {
    pub fn name(&self) -> RawString {
        self.name
    }

    /// Null for a missing key opened for reading.
    pub fn is_empty(&self) -> bool {
        self.raw.is_null() || unsafe { api!(RedisModule_KeyType)(self.raw) } == raw::REDISMODULE_KEYTYPE_EMPTY as c_int
    }

    /// The value if the key holds one of `module_type`; `Err` for any other
    /// type; `Ok(None)` when missing.
    pub fn module_value(&self, module_type: *mut raw::RedisModuleType) -> Result<Option<*mut c_void>, CmdError> {
        if self.is_empty() {
            return Ok(None);
        }
        if unsafe { api!(RedisModule_ModuleTypeGetType)(self.raw) } != module_type {
            return Err(WRONGTYPE);
        }
        Ok(Some(unsafe { api!(RedisModule_ModuleTypeGetValue)(self.raw) }))
    }

    /// Stores a new value, freeing the old one through the type's `free`.
    pub fn set_module_value(&self, module_type: *mut raw::RedisModuleType, value: *mut c_void) {
        unsafe { api!(RedisModule_ModuleTypeSetValue)(self.raw, module_type, value) };
    }

    /// Swaps the value of a key of `module_type`, keeping its TTL; returns
    /// the old value, which the caller now owns.
    pub fn replace_module_value(&self, module_type: *mut raw::RedisModuleType, value: *mut c_void) -> *mut c_void {
        let mut old = std::ptr::null_mut();
        unsafe { api!(RedisModule_ModuleTypeReplaceValue)(self.raw, module_type, value, &mut old) };
        old
    }

    /// Deletes the key (opened for writing) and its value.
    pub fn delete(&self) {
        unsafe { api!(RedisModule_DeleteKey)(self.raw) };
    }

    /// Absolute expiry in Unix ms, or `None` for a key without one.
    pub fn expire_at(&self) -> Option<Millis> {
        let at = unsafe { api!(RedisModule_GetAbsExpire)(self.raw) };
        (at >= 0).then_some(at)
    }

    /// `None` removes the expiry.
    pub fn set_expire_at(&self, at: Option<Millis>) {
        unsafe {
            match at {
                Some(at) => api!(RedisModule_SetAbsExpire)(self.raw, at),
                None => api!(RedisModule_SetExpire)(self.raw, raw::REDISMODULE_NO_EXPIRE as _),
            }
        };
    }

    /// Milliseconds to live, as PTTL counts them (-1: no expiry).
    pub fn pttl(&self) -> Millis {
        unsafe { api!(RedisModule_GetExpire)(self.raw) }
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        if !self.raw.is_null() {
            unsafe { api!(RedisModule_CloseKey)(self.raw) };
        }
    }
}

pub type Handler = fn(Ctx, &Args) -> CmdResult;
/// Key positions of a `getkeys-api` command's call, each with its key-spec
/// flags (`REDISMODULE_CMD_KEY_*`), which ACL checks read.
pub type KeyFinder = fn(&Args) -> Vec<(usize, u32)>;

/// Runs a command handler: replies its error, and turns a panic into an
/// error reply instead of taking the server down. For a `getkeys-api`
/// command, answers Redis's key-position request instead.
pub fn dispatch(ctx: RawCtx, argv: *mut RawString, argc: c_int, handler: Handler, keys: Option<KeyFinder>) -> c_int {
    let args = Args(unsafe { std::slice::from_raw_parts(argv, argc.max(0) as usize) });
    if let Some(keys) = keys {
        if unsafe { api!(RedisModule_IsKeysPositionRequest)(ctx) } != 0 {
            // SAFETY: reading a function pointer Redis filled in at load.
            let with_flags = unsafe { raw::RedisModule_KeyAtPosWithFlags };
            for (position, flags) in keys(&args) {
                match with_flags {
                    // SAFETY: a key-position request's context, a position
                    // within argv.
                    Some(key_at) => unsafe { key_at(ctx, position as c_int, flags as c_int) },
                    None => unsafe { api!(RedisModule_KeyAtPos)(ctx, position as c_int) },
                }
            }
            return raw::REDISMODULE_OK as c_int;
        }
    }
    let ctx = Ctx(ctx);
    match catch_unwind(AssertUnwindSafe(|| handler(ctx, &args))) {
        Ok(Ok(())) => {}
        Ok(Err(error)) => ctx.reply_error(&error),
        Err(_) => {
            ctx.log_warning("redis-idem: a command panicked; the call was answered with an error");
            ctx.reply_error(&CmdError::Static(c"ERR internal error in redis-idem, see the server log"));
        }
    }
    raw::REDISMODULE_OK as c_int
}
