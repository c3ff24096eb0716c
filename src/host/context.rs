//! The context of one call Redis makes into the module: a command, a timer,
//! the load. Replies, replication and notifications go through it.

use std::ffi::{CStr, c_int};
use std::marker::PhantomData;
use std::ptr::NonNull;

use idem_core::Millis;
use idem_core::error::{CmdError, CmdResult};
use redis_module::{Context, RedisValue, raw};

use super::key::{Arg, Key, KeyMode};
use super::{api, c_bytes};

/// The context of one call, valid for `'call`: what Redis passed in, for
/// as long as the call lasts.
#[derive(Clone, Copy)]
pub struct Ctx<'call> {
    raw: NonNull<raw::RedisModuleCtx>,
    _call: PhantomData<&'call raw::RedisModuleCtx>,
}

impl<'call> Ctx<'call> {
    /// # Safety
    /// `raw` is the context Redis passed to the running call (command,
    /// timer, OnLoad), used only while that call runs.
    pub(super) unsafe fn from_raw(raw: *mut raw::RedisModuleCtx) -> Option<Ctx<'call>> {
        Some(Ctx { raw: NonNull::new(raw)?, _call: PhantomData })
    }

    /// The context of the crate's `Context` (OnLoad), for as long as it is
    /// borrowed.
    pub fn of(context: &'call Context) -> Ctx<'call> {
        // SAFETY: a `Context` wraps the context of the running call.
        unsafe { Ctx::from_raw(context.ctx) }.expect("OnLoad has a context")
    }

    pub(super) fn as_ptr(self) -> *mut raw::RedisModuleCtx {
        self.raw.as_ptr()
    }

    /// The wall clock in Unix ms, read once per command.
    pub fn now(self) -> Millis {
        // SAFETY: no arguments; any thread may call it.
        unsafe { api!(RedisModule_Milliseconds)() }
    }

    pub(super) fn flags(self) -> u32 {
        // SAFETY: a live context (the type's invariant).
        unsafe { api!(RedisModule_GetContextFlags)(self.as_ptr()) as u32 }
    }

    /// Used memory is over `maxmemory` (never on a replica that ignores
    /// it, nor without a `maxmemory`).
    pub fn memory_full(self) -> bool {
        self.flags() & raw::REDISMODULE_CTX_FLAGS_OOM != 0
    }

    /// A primary that is not loading data: the one that may write on its
    /// own initiative (the sweeper).
    pub fn is_writable_primary(self) -> bool {
        let flags = self.flags();
        let loading = raw::REDISMODULE_CTX_FLAGS_LOADING | raw::REDISMODULE_CTX_FLAGS_ASYNC_LOADING;
        flags & raw::REDISMODULE_CTX_FLAGS_MASTER != 0 && flags & loading == 0
    }

    /// Writes may not happen now: clients are paused for writes (`CLIENT
    /// PAUSE ... WRITE`, `FAILOVER`, a cluster manual failover; on Redis
    /// 7.0 any pause). Redis aborts if anything propagates then, so work
    /// the module does on its own (timers, waiters' wake-ups, the sweeper)
    /// must hold its writes back until this is false again.
    pub fn writes_paused(self) -> bool {
        // SAFETY: no arguments; called on the main thread.
        unsafe { api!(RedisModule_AvoidReplicaTraffic)() != 0 }
    }

    /// In cluster mode, where a key may leave with its slot.
    pub fn is_cluster(self) -> bool {
        self.flags() & raw::REDISMODULE_CTX_FLAGS_CLUSTER != 0
    }

    /// Selects database `db` for what this context does next; `false` if
    /// the server has no such database (any more).
    pub(super) fn select_db(self, db: c_int) -> bool {
        // SAFETY: a live context.
        unsafe { api!(RedisModule_SelectDb)(self.as_ptr(), db) == raw::REDISMODULE_OK as c_int }
    }

    /// The database this context works in.
    pub(super) fn selected_db(self) -> c_int {
        // SAFETY: a live context.
        unsafe { api!(RedisModule_GetSelectedDb)(self.as_ptr()) }
    }

    /// Refuses the internal commands to clients: they store records and
    /// filters exactly as sent, so only the primary's replication link and
    /// AOF loading (which replay what this module itself propagated) may
    /// run them. Valkey runs the link of an atomic slot migration
    /// (`CLUSTER MIGRATESLOTS`) as a primary's, so the keys it carries are
    /// accepted (tests/cluster_migrateslots.rs).
    pub fn require_primary_or_aof(self) -> CmdResult {
        if self.flags() & (raw::REDISMODULE_CTX_FLAGS_REPLICATED | raw::REDISMODULE_CTX_FLAGS_LOADING) != 0 {
            return Ok(());
        }
        Err(CmdError::Static(c"ERR internal command: only the primary's replication link and AOF loading may run it"))
    }

    pub fn reply_array(self, len: usize) {
        // SAFETY: a live command context; Redis copies what it replies.
        unsafe { api!(RedisModule_ReplyWithArray)(self.as_ptr(), len as _) };
    }

    /// A map in RESP3, a flat field-value array in RESP2.
    pub fn reply_map(self, pairs: usize) {
        // SAFETY: a live command context; Redis copies what it replies.
        unsafe { api!(RedisModule_ReplyWithMap)(self.as_ptr(), pairs as _) };
    }

    pub fn reply_int(self, value: i64) {
        // SAFETY: a live command context; Redis copies what it replies.
        unsafe { api!(RedisModule_ReplyWithLongLong)(self.as_ptr(), value) };
    }

    pub fn reply_null(self) {
        // SAFETY: a live command context; Redis copies what it replies.
        unsafe { api!(RedisModule_ReplyWithNull)(self.as_ptr()) };
    }

    pub fn reply_simple(self, text: &'static CStr) {
        // SAFETY: a live command context; Redis copies what it replies.
        unsafe { api!(RedisModule_ReplyWithSimpleString)(self.as_ptr(), text.as_ptr()) };
    }

    pub fn reply_bulk(self, bytes: &[u8]) {
        let (ptr, len) = c_bytes(bytes);
        // SAFETY: a live command context; Redis copies what it replies.
        unsafe { api!(RedisModule_ReplyWithStringBuffer)(self.as_ptr(), ptr, len) };
    }

    pub fn reply_optional_bulk(self, bytes: Option<&[u8]>) {
        match bytes {
            Some(bytes) => self.reply_bulk(bytes),
            None => self.reply_null(),
        }
    }

    pub fn reply_double(self, value: f64) {
        // SAFETY: a live command context; Redis copies what it replies.
        unsafe { api!(RedisModule_ReplyWithDouble)(self.as_ptr(), value) };
    }

    pub fn reply_error(self, error: &CmdError) {
        // SAFETY: a live command context; Redis copies what it replies.
        unsafe { api!(RedisModule_ReplyWithError)(self.as_ptr(), error.as_cstr().as_ptr()) };
    }

    /// Opens the key named by a command argument, closed when the [`Key`]
    /// is dropped.
    pub fn open_key(self, name: Arg<'call>, mode: KeyMode) -> Key<'call> {
        Key::open(self, name, mode)
    }

    /// Runs `use_key` on the key named `name` (a name of our own, not a
    /// command argument), opened in `mode`.
    pub fn with_key_named<R>(self, name: &[u8], mode: KeyMode, use_key: impl FnOnce(&mut Key<'_>) -> R) -> R {
        self.with_key_name(name, |arg| {
            let mut key = Key::open(self, arg, mode);
            use_key(&mut key)
        })
    }

    /// Runs `use_name` on a Redis string holding `name`, freed after.
    pub fn with_key_name<R>(self, name: &[u8], use_name: impl FnOnce(Arg<'_>) -> R) -> R {
        let (ptr, len) = c_bytes(name);
        // SAFETY: a live context and a buffer of `len` bytes, which Redis
        // copies.
        let string = unsafe { api!(RedisModule_CreateString)(self.as_ptr(), ptr, len) };
        let result = {
            // SAFETY: the string was just created and is freed only after
            // `use_name`, the last user of `arg`, returns (`Arg` and `Key`
            // borrow it for the closure's call only).
            let arg = unsafe { Arg::from_raw(string) }.expect("RedisModule_CreateString returns a string");
            use_name(arg)
        };
        // SAFETY: created above with this context; nothing refers to it.
        unsafe { api!(RedisModule_FreeString)(self.as_ptr(), string) };
        result
    }

    /// Propagates `command key blob` to replicas and the AOF: one compact
    /// command per write, which is what RM_Replicate charges least for.
    pub fn replicate_key_blob(self, command: &'static CStr, key: Arg<'_>, blob: &[u8]) {
        let (blob_ptr, blob_len) = c_bytes(blob);
        // SAFETY: a live context; "sb" matches a Redis string and a buffer
        // with its length; Redis copies both.
        unsafe {
            api!(RedisModule_Replicate)(
                self.as_ptr(),
                command.as_ptr(),
                c"sb".as_ptr(),
                key.as_ptr(),
                blob_ptr,
                blob_len,
            )
        };
    }

    /// Propagates `command key blob item...`. One or no item, the common
    /// case, avoids the `v` format, which grows Redis's argument vector
    /// with a realloc.
    pub fn replicate_key_blob_items(self, command: &'static CStr, key: Arg<'_>, blob: &[u8], items: &[Arg<'_>]) {
        let (blob_ptr, blob_len) = c_bytes(blob);
        let replicate = api!(RedisModule_Replicate);
        let (ctx, command, key) = (self.as_ptr(), command.as_ptr(), key.as_ptr());
        // SAFETY: a live context; each format matches its arguments: a
        // Redis string, a buffer with its length, then one Redis string
        // or an array of them with its length (`Arg` is a transparent
        // string pointer). Redis copies all of them.
        unsafe {
            match items {
                [] => replicate(ctx, command, c"sb".as_ptr(), key, blob_ptr, blob_len),
                [item] => replicate(ctx, command, c"sbs".as_ptr(), key, blob_ptr, blob_len, item.as_ptr()),
                _ => replicate(ctx, command, c"sbv".as_ptr(), key, blob_ptr, blob_len, items.as_ptr(), items.len()),
            }
        };
    }

    /// Propagates `command blob key [key ...]`: many keys' writes as one
    /// command (the batch commands' effect).
    pub fn replicate_blob_keys(self, command: &'static CStr, blob: &[u8], keys: &[Arg<'_>]) {
        let (blob_ptr, blob_len) = c_bytes(blob);
        // SAFETY: a live context; "bv" matches a buffer with its length,
        // then an array of Redis strings with its length (`Arg` is a
        // transparent string pointer). Redis copies all of them.
        unsafe {
            api!(RedisModule_Replicate)(
                self.as_ptr(),
                command.as_ptr(),
                c"bv".as_ptr(),
                blob_ptr,
                blob_len,
                keys.as_ptr(),
                keys.len(),
            )
        };
    }

    pub fn replicate_verbatim(self) {
        // SAFETY: a live command context.
        unsafe { api!(RedisModule_ReplicateVerbatim)(self.as_ptr()) };
    }

    /// A keyspace notification of the module class (`d` in
    /// notify-keyspace-events); Redis skips it cheaply when not enabled.
    pub fn notify(self, event: &'static CStr, key: Arg<'_>) {
        // SAFETY: a live context, a NUL-terminated event and a live key
        // name, which Redis copies.
        unsafe {
            api!(RedisModule_NotifyKeyspaceEvent)(
                self.as_ptr(),
                raw::REDISMODULE_NOTIFY_MODULE,
                event.as_ptr(),
                key.as_ptr(),
            )
        };
    }

    /// Has Redis apply its config file's `idem.*` lines to the configs
    /// registered: once, in OnLoad, after the last is registered.
    pub fn load_configs(self) -> Result<(), String> {
        // SAFETY: the module's OnLoad context, after its configs were
        // registered.
        let status = unsafe { api!(RedisModule_LoadConfigs)(self.as_ptr()) };
        if status == raw::REDISMODULE_OK as c_int {
            Ok(())
        } else {
            Err("the server refused an idem.* value of its config file (see the lines above)".into())
        }
    }

    pub fn log_warning(self, message: &str) {
        raw::redis_log(self.as_ptr(), message);
    }

    /// A server config's value (`CONFIG GET name`), as text.
    pub fn config(self, name: &str) -> Option<String> {
        let reply = Context::new(self.as_ptr()).call("CONFIG", &["GET", name]).ok()?;
        let RedisValue::Array(pair) = reply else { return None };
        match pair.get(1)? {
            RedisValue::SimpleString(text) | RedisValue::BulkString(text) => Some(text.clone()),
            RedisValue::BulkRedisString(text) => Some(text.to_string_lossy()),
            RedisValue::StringBuffer(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
            _ => None,
        }
    }

    /// The server says it is Valkey (`INFO server`'s `server_name`, which
    /// Redis does not have): for what only Valkey defines.
    pub fn is_valkey(self) -> bool {
        let info = Context::new(self.as_ptr()).server_info("server");
        info.field("server_name").is_some_and(|name| name.to_string_lossy() == "valkey")
    }

    /// Numeric fields of an `INFO` section, in the order asked.
    pub fn info_numbers<const N: usize>(self, section: &str, names: [&str; N]) -> [Option<u64>; N] {
        let info = Context::new(self.as_ptr()).server_info(section);
        names.map(|name| info.field(name).and_then(|value| value.to_string_lossy().parse::<u64>().ok()))
    }

    /// One step of `SCAN cursor [MATCH pattern] COUNT count` over this
    /// context's database: the next cursor and the key names returned.
    pub fn scan_keys(
        self,
        cursor: &[u8],
        pattern: Option<&[u8]>,
        count: i64,
    ) -> Result<(Vec<u8>, Vec<Vec<u8>>), CmdError> {
        let count = count.to_string();
        let mut args: Vec<&[u8]> = vec![cursor, b"COUNT", count.as_bytes()];
        if let Some(pattern) = pattern {
            args.extend_from_slice(&[b"MATCH", pattern]);
        }
        let reply = Context::new(self.as_ptr()).call("SCAN", &args[..]).map_err(|error| {
            // SCAN's own error keeps its code; anything else gets one.
            let text = error.to_string();
            let coded = text
                .split(' ')
                .next()
                .is_some_and(|code| code.len() > 1 && code.bytes().all(|b| b.is_ascii_uppercase()));
            CmdError::new(if coded { text } else { format!("ERR {text}") })
        })?;
        let bytes = |value: &RedisValue| match value {
            RedisValue::SimpleString(text) | RedisValue::BulkString(text) => Some(text.as_bytes().to_vec()),
            RedisValue::StringBuffer(bytes) => Some(bytes.clone()),
            RedisValue::BulkRedisString(text) => Some(text.as_slice().to_vec()),
            _ => None,
        };
        let unexpected = || CmdError::Static(c"ERR unexpected SCAN reply");
        let RedisValue::Array(parts) = reply else { return Err(unexpected()) };
        let [next, RedisValue::Array(names)] = &parts[..] else { return Err(unexpected()) };
        let names = names.iter().map(bytes).collect::<Option<Vec<_>>>().ok_or_else(unexpected)?;
        Ok((bytes(next).ok_or_else(unexpected)?, names))
    }
}
