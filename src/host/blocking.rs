//! Clients that wait on a key: `RedisModule_BlockClientOnKeys` with its
//! reply, timeout and free callbacks, `RedisModule_SignalKeyAsReady`, and a
//! module timer per waiter that signals the key at a moment of its choosing
//! (a lease's end).
//!
//! A [`Waiter`] is the state of one blocked client. Redis calls
//! [`Waiter::ready`] every time its key is signalled as ready, serving the
//! clients blocked on a key in the order they blocked; the waiter answers
//! the client there (the wait ends) or asks to go on waiting. When its time
//! is up (or `CLIENT UNBLOCK ... TIMEOUT`), [`Waiter::timeout`] answers it.
//! When the client goes away (disconnect, `CLIENT UNBLOCK ... ERROR`)
//! without either, [`Waiter::abandoned`] runs.
//!
//! Two wake-ups cannot be given when they fall due, and [`owed`] gives them
//! later:
//! - A waiter that would write while writes are paused (`CLIENT PAUSE ...
//!   WRITE`, a failover) holds back ([`Wake::WaitForWrites`]): Redis aborts
//!   if anything propagates then. Its key is signalled again when the
//!   pause ends.
//! - A deleted key wakes its waiters where the server has
//!   `RedisModule_BlockClientOnKeysWithFlags` with
//!   `REDISMODULE_BLOCK_UNBLOCK_DELETED` (Redis 7.2+, Valkey 8+). Redis 7.0
//!   serves only keys that exist, and only those a write of a blocking
//!   type signalled, so there the module hears of changes itself
//!   (keyspace events, `FLUSHDB`, `SWAPDB`): it unblocks a missing key's
//!   longest waiter, whose timeout callback then runs [`Waiter::ready`],
//!   and signals a key that holds another value now.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr;

use idem_core::Millis;
use idem_core::error::CmdError;
use redis_module::raw;

use super::api;
use super::context::Ctx;
use super::key::{Arg, Args, KeyMode};
use super::owed;

/// What a waiter decided when its key was signalled.
pub enum Wake {
    /// It answered the client: the wait is over.
    Replied,
    /// Go on waiting; signal the key again at `signal_at` (Unix ms), if
    /// given, whether or not anything else signals it before.
    Wait { signal_at: Option<Millis> },
    /// Go on waiting: its answer needs a write, and writes are paused. The
    /// key is signalled again when they are not.
    WaitForWrites,
}

/// One blocked client's state, owned by Redis while the client waits.
pub trait Waiter: Sized + 'static {
    /// The key was signalled: answer the client through `ctx` and return
    /// [`Wake::Replied`], or answer nothing and go on waiting. `args` are
    /// the blocked command's own arguments. May write (and replicate) as a
    /// command does.
    fn ready(&mut self, ctx: Ctx<'_>, args: &Args<'_>) -> Wake;

    /// Time is up (or `CLIENT UNBLOCK ... TIMEOUT`): answer the client,
    /// with what its command would answer now. May write as a command
    /// does, but not while [`Ctx::writes_paused`]: this is the last call,
    /// so an answer that needs a write then is an error the client can
    /// retry.
    fn timeout(&mut self, ctx: Ctx<'_>, args: &Args<'_>);

    /// The wait ended without an answer from `ready` or `timeout`: the
    /// client disconnected, or `CLIENT UNBLOCK ... ERROR` answered it.
    fn abandoned(self);
}

/// Whether a command running on `ctx` may block its client: never inside
/// MULTI, a script or a function, for the primary's replication stream or
/// AOF loading, nor where the caller forbids it (`RM_Call`, `CLIENT NO-EVICT`
/// and the like set DENY_BLOCKING).
pub fn may_block(ctx: Ctx<'_>) -> bool {
    const NEVER: u32 = raw::REDISMODULE_CTX_FLAGS_MULTI
        | raw::REDISMODULE_CTX_FLAGS_LUA
        | raw::REDISMODULE_CTX_FLAGS_REPLICATED
        | raw::REDISMODULE_CTX_FLAGS_LOADING
        | raw::REDISMODULE_CTX_FLAGS_DENY_BLOCKING;
    ctx.flags() & NEVER == 0
}

/// Whether a deleted key wakes its waiters (Redis 7.2+, Valkey 8+).
pub fn deletion_wakes() -> bool {
    // SAFETY: reads (copies) a function pointer Redis set before OnLoad.
    unsafe { raw::RedisModule_BlockClientOnKeysWithFlags }.is_some()
}

/// Whether a waiter woken on its key's absence may act on it (claim the
/// key): not in cluster mode, where the key may have left with its slot
/// (`MIGRATE` deletes it on the source, a node that lost a slot deletes
/// its keys) and the claim would be granted on a node that no longer
/// serves the key, while the record lives on. There the waiter waits on:
/// the server redirects it (`-MOVED`) when the slot changes hands, as it
/// does its own blocked clients, or the key is written again here.
pub fn may_claim_absent_key(ctx: Ctx<'_>) -> bool {
    ctx.flags() & raw::REDISMODULE_CTX_FLAGS_CLUSTER == 0
}

/// Signals `key` as ready: every client blocked on it has its waiter's
/// `ready` called, before Redis reads the next command. Cheap when nobody
/// waits on it.
pub fn signal_ready(ctx: Ctx<'_>, key: Arg<'_>) {
    // SAFETY: a live context (of a command or callback, with a client and
    // its selected database) and a live key name, which Redis copies.
    unsafe { api!(RedisModule_SignalKeyAsReady)(ctx.as_ptr(), key.as_ptr()) };
}

/// What a blocked client waits on, and a timer that signals it: owned by
/// the [`Blocked`] it serves, so the timer is stopped and the watch
/// unlisted before its data goes away.
struct KeyTimer {
    db: c_int,
    key: Vec<u8>,
    /// The pending timer and when it fires; `None` once it fired.
    armed: Option<(raw::RedisModuleTimerID, Millis)>,
    /// The blocked client, where the module serves deletions itself
    /// (listed in [`WATCHED`]); null elsewhere.
    handle: *mut raw::RedisModuleBlockedClient,
    /// Unblocked by the module because its key was deleted: the timeout
    /// callback that follows is a wake-up.
    woken: bool,
}

/// A key as the module remembers it: its database and its name.
pub(super) type DbKey = (c_int, Vec<u8>);

thread_local! {
    /// Where the module serves deletions itself (Redis 7.0): the clients
    /// blocked on each key, by database and name, longest waiter first.
    /// Callbacks and timers run on Redis's main thread, one at a time.
    static WATCHED: RefCell<HashMap<DbKey, Vec<*mut KeyTimer>>> = RefCell::new(HashMap::new());
    /// Clients blocked by [`block_on_key`] now.
    static WAITING: Cell<usize> = const { Cell::new(0) };
}

/// Clients waiting on a key now.
pub fn waiting() -> usize {
    WAITING.get()
}

impl KeyTimer {
    /// Fires at `at` (Unix ms), replacing any pending timer.
    fn arm(&mut self, ctx: Ctx<'_>, at: Millis) {
        if self.armed.is_some_and(|(_, pending)| pending == at) {
            return;
        }
        self.stop(ctx);
        let delay = (at - ctx.now()).max(1);
        let data = (self as *mut KeyTimer).cast::<c_void>();
        // SAFETY: a live context; `data` points at this timer state, which
        // lives in a Box until `stop` has removed the pending timer (see
        // `on_free`), so the callback never sees it freed.
        let id = unsafe { api!(RedisModule_CreateTimer)(ctx.as_ptr(), delay, Some(on_key_timer), data) };
        self.armed = Some((id, at));
    }

    fn stop(&mut self, ctx: Ctx<'_>) {
        if let Some((id, _)) = self.armed.take() {
            // SAFETY: a live context of this module; `id` is a timer this
            // state created and that has not fired (firing clears `armed`),
            // so it is still this module's.
            unsafe { api!(RedisModule_StopTimer)(ctx.as_ptr(), id, ptr::null_mut()) };
        }
    }
}

/// # Safety
/// Called by Redis on the main thread with a live context and the data
/// [`KeyTimer::arm`] gave it, which is alive until the timer is stopped.
unsafe extern "C" fn on_key_timer(ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    // SAFETY: as the caller promises; no other reference to it is live
    // (callbacks run one at a time on the main thread).
    let timer = unsafe { &mut *data.cast::<KeyTimer>() };
    timer.armed = None;
    // SAFETY: the timer's own context, used during this call only.
    let Some(ctx) = (unsafe { Ctx::from_raw(ctx) }) else { return };
    if ctx.select_db(timer.db) {
        ctx.with_key_name(&timer.key, |name| signal_ready(ctx, name));
    }
}

/// What Redis holds for one blocked client (its privdata).
struct Blocked<W> {
    waiter: Option<W>,
    timer: Box<KeyTimer>,
    /// `ready` or `timeout` answered the client.
    answered: bool,
}

/// Blocks the client of the running command on `key` for up to `timeout`
/// ms (>= 1), with `waiter` as its state; with `signal_at`, the key is
/// signalled then. The command must not reply: the waiter will. Check
/// [`may_block`] first.
pub fn block_on_key<W: Waiter>(ctx: Ctx<'_>, key: Arg<'_>, timeout: Millis, signal_at: Option<Millis>, waiter: W) {
    let db = ctx.selected_db();
    let timer =
        Box::new(KeyTimer { db, key: key.bytes().to_vec(), armed: None, handle: ptr::null_mut(), woken: false });
    let blocked = Box::new(Blocked { waiter: Some(waiter), timer, answered: false });
    let privdata = Box::into_raw(blocked);
    let mut keys = [key.as_ptr()];
    let (reply, on_timeout, free) = (Some(on_ready::<W> as _), Some(on_timeout::<W> as _), Some(on_free::<W> as _));
    // SAFETY: reads a function pointer Redis set before OnLoad.
    let with_flags = unsafe { raw::RedisModule_BlockClientOnKeysWithFlags };
    let (ctx_ptr, keys_ptr) = (ctx.as_ptr(), keys.as_mut_ptr());
    let timeout = timeout.max(1);
    // SAFETY: a live command context that may block (the caller checked
    // `may_block`); callbacks with the signatures Redis expects; one live
    // key name, which Redis copies; `privdata` is a Box Redis hands back
    // to `on_free` exactly once.
    let handle = unsafe {
        match with_flags {
            Some(block) => block(
                ctx_ptr,
                reply,
                on_timeout,
                free,
                timeout,
                keys_ptr,
                1,
                privdata.cast(),
                raw::REDISMODULE_BLOCK_UNBLOCK_DELETED as c_int,
            ),
            None => api!(RedisModule_BlockClientOnKeys)(
                ctx_ptr,
                reply,
                on_timeout,
                free,
                timeout,
                keys_ptr,
                1,
                privdata.cast(),
            ),
        }
    };
    WAITING.set(WAITING.get() + 1);
    // SAFETY: Redis holds `privdata` until `on_free`, which runs only after
    // this command returns; nothing else refers to it now.
    let blocked = unsafe { &mut *privdata };
    if !deletion_wakes() && !handle.is_null() {
        owed::hear_changes(ctx);
        blocked.timer.handle = handle;
        let watch: *mut KeyTimer = &mut *blocked.timer;
        WATCHED.with_borrow_mut(|watched| watched.entry((db, key.bytes().to_vec())).or_default().push(watch));
    }
    if let Some(at) = signal_at {
        blocked.timer.arm(ctx, at);
    }
}

/// Where the module serves deletions itself (Redis 7.0): whether a client
/// waits on `key` of database `db`.
pub(super) fn is_watched(db: c_int, key: &[u8]) -> bool {
    WATCHED.with_borrow(|watched| watched.contains_key(&(db, key.to_vec())))
}

/// Where the module serves deletions itself (Redis 7.0): whether a client
/// waits on any key.
pub(super) fn anyone_watched() -> bool {
    WATCHED.with_borrow(|watched| !watched.is_empty())
}

/// Where the module serves deletions itself (Redis 7.0): the keys of
/// database `db` (every database for `None`) that clients wait on.
pub(super) fn watched_keys(db: Option<c_int>) -> Vec<DbKey> {
    WATCHED.with_borrow(|watched| watched.keys().filter(|(of, _)| db.is_none_or(|db| db == *of)).cloned().collect())
}

/// Wakes the waiters of a deleted key (Redis 7.0), longest waiter first,
/// for as long as the key stays missing: each runs [`Waiter::ready`] on
/// the missing key, and the first one's claim usually makes the key busy
/// for the others, who go on waiting. Run outside keyspace events (it
/// writes) and only while writes are allowed; the context's database is
/// `db`.
pub(super) fn wake_on_deleted(ctx: Ctx<'_>, db: c_int, key: &[u8]) {
    loop {
        let missing = ctx.with_key_named(key, KeyMode::Read, |open| open.is_empty());
        let next = WATCHED.with_borrow(|watched| {
            let watches = watched.get(&(db, key.to_vec()))?;
            // SAFETY: listed watches are alive: `on_free` unlists a watch
            // before its Box is dropped.
            watches.iter().copied().find(|&watch| unsafe { !(*watch).woken })
        });
        let Some(watch) = next.filter(|_| missing) else { return };
        // SAFETY: as above; no other reference to it is live now.
        let handle = unsafe {
            (*watch).woken = true;
            (*watch).handle
        };
        // SAFETY: the handle of a client still blocked (its watch is
        // listed, so `on_free` has not run); on Redis 7.0 this runs its
        // timeout callback at once, then frees it later through `on_free`.
        unsafe { api!(RedisModule_UnblockClient)(handle, ptr::null_mut()) };
    }
}

/// The blocked client's state in a reply or timeout callback.
///
/// # Safety
/// `ctx` is the context Redis passed to a callback of a client blocked by
/// [`block_on_key`] with `Blocked<W>`; callbacks run one at a time.
unsafe fn blocked_of<'a, W>(ctx: Ctx<'_>) -> Option<&'a mut Blocked<W>> {
    // SAFETY: a live callback context; the privdata is the Box
    // `block_on_key` gave Redis, alive until `on_free`.
    unsafe { api!(RedisModule_GetBlockedClientPrivateData)(ctx.as_ptr()).cast::<Blocked<W>>().as_mut() }
}

/// # Safety
/// Called by Redis with a live context and the blocked command's `argc`
/// arguments, for a client blocked by [`block_on_key`] with `Blocked<W>`.
unsafe extern "C" fn on_ready<W: Waiter>(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    const KEEP_WAITING: c_int = raw::REDISMODULE_ERR as c_int;
    // SAFETY: as the caller promises; both live for this call.
    let (Some(ctx), args) = (unsafe { Ctx::from_raw(ctx) }, unsafe { Args::from_raw(argv, argc) }) else {
        return KEEP_WAITING;
    };
    // SAFETY: as the caller promises.
    let Some(blocked) = (unsafe { blocked_of::<W>(ctx) }) else { return KEEP_WAITING };
    let Some(waiter) = blocked.waiter.as_mut() else { return KEEP_WAITING };
    match catch_unwind(AssertUnwindSafe(|| waiter.ready(ctx, &args))) {
        Ok(Wake::Wait { signal_at }) => {
            if let Some(at) = signal_at {
                blocked.timer.arm(ctx, at);
            }
            KEEP_WAITING
        }
        Ok(Wake::WaitForWrites) => {
            owed::signal_when_writable(ctx, blocked.timer.db, &blocked.timer.key);
            KEEP_WAITING
        }
        Ok(Wake::Replied) => {
            blocked.answered = true;
            raw::REDISMODULE_OK as c_int
        }
        Err(_) => {
            ctx.log_warning("redis-idem: a waiter panicked; it was answered with an error");
            ctx.reply_error(&CmdError::Static(c"ERR internal error in redis-idem, see the server log"));
            blocked.answered = true;
            raw::REDISMODULE_OK as c_int
        }
    }
}

/// # Safety
/// As [`on_ready`].
unsafe extern "C" fn on_timeout<W: Waiter>(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    // SAFETY: as the caller promises; both live for this call.
    let (Some(ctx), args) = (unsafe { Ctx::from_raw(ctx) }, unsafe { Args::from_raw(argv, argc) }) else {
        return raw::REDISMODULE_OK as c_int;
    };
    // SAFETY: as the caller promises.
    let Some(blocked) = (unsafe { blocked_of::<W>(ctx) }) else { return raw::REDISMODULE_OK as c_int };
    let woken = blocked.timer.woken;
    if let Some(waiter) = blocked.waiter.as_mut() {
        // Unblocked by `wake_on_deleted`: a wake-up, which must answer now
        // (the client is unblocked either way).
        let answer = || {
            if !(woken && matches!(waiter.ready(ctx, &args), Wake::Replied)) {
                waiter.timeout(ctx, &args);
            }
        };
        if catch_unwind(AssertUnwindSafe(answer)).is_err() {
            ctx.log_warning("redis-idem: a waiter panicked at its timeout; it was answered with an error");
            ctx.reply_error(&CmdError::Static(c"ERR internal error in redis-idem, see the server log"));
        }
    }
    blocked.answered = true;
    raw::REDISMODULE_OK as c_int
}

/// # Safety
/// Called by Redis once per client blocked by [`block_on_key`] with
/// `Blocked<W>`, on the main thread, with a live context of this module and
/// that call's privdata.
unsafe extern "C" fn on_free<W: Waiter>(ctx: *mut raw::RedisModuleCtx, privdata: *mut c_void) {
    if privdata.is_null() {
        return;
    }
    // SAFETY: the Box `block_on_key` leaked; Redis hands it back once.
    let mut blocked = unsafe { Box::from_raw(privdata.cast::<Blocked<W>>()) };
    WAITING.set(WAITING.get().saturating_sub(1));
    if !blocked.timer.handle.is_null() {
        let watch: *mut KeyTimer = &mut *blocked.timer;
        let name = (blocked.timer.db, std::mem::take(&mut blocked.timer.key));
        WATCHED.with_borrow_mut(|watched| {
            if let Some(watches) = watched.get_mut(&name) {
                watches.retain(|&listed| listed != watch);
                if watches.is_empty() {
                    watched.remove(&name);
                }
            }
        });
    }
    // SAFETY: the context Redis passed in, for this call.
    if let Some(ctx) = unsafe { Ctx::from_raw(ctx) } {
        blocked.timer.stop(ctx);
    } else if blocked.timer.armed.is_some() {
        // Without a context the timer cannot be stopped: leak its state
        // rather than let the timer read freed memory.
        std::mem::forget(std::mem::replace(
            &mut blocked.timer,
            Box::new(KeyTimer { db: 0, key: Vec::new(), armed: None, handle: ptr::null_mut(), woken: false }),
        ));
    }
    if let Some(waiter) = blocked.waiter.take()
        && !blocked.answered
    {
        let _ = catch_unwind(AssertUnwindSafe(|| waiter.abandoned()));
    }
}
