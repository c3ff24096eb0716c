//! Wake-ups the module owes its waiters but may not give when they fall
//! due (see [`super::blocking`]), given by one timer as soon as it may:
//!
//! - keys whose waiters held back a write while writes were paused: each
//!   is signalled again once writes are allowed;
//! - where the server does not wake the clients blocked on a deleted key
//!   (Redis 7.0), keys changed under their waiters without a wake-up from
//!   the server: deleted, expired, evicted, renamed, moved, flushed,
//!   swapped away (`SWAPDB`, a replica's swap of a full sync loaded with
//!   `repl-diskless-load swapdb`), or overwritten by a value of another
//!   type (`SET` over a record, a new hash after a `DEL`). The module hears
//!   of them through keyspace events (every data type's class once a
//!   client has waited) and the `FLUSHDB`, `SWAPDB` and async-load server
//!   events. A keyspace
//!   event's handler must not write, and waking a waiter writes (its
//!   claim), so the wake-up waits for the timer too: one due at once, which
//!   runs before the server reads its next command from the network.
//!
//! While writes are paused the timer only looks again a little later.

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::ffi::{c_char, c_int, c_void};

use redis_module::raw;

use super::api;
use super::blocking::{self, DbKey};
use super::context::Ctx;
use super::key::Arg;

/// How soon a wake-up owed is given when writes are allowed: in this turn
/// of the event loop (its timers run after the commands it read), so that
/// the next command a client sends sees the waiter's answer, as on servers
/// that serve it after the command that changed the key.
const SOON_MS: i64 = 0;
/// How often a paused server is looked at again. A pause lasts from
/// milliseconds (a failover's handover) to whatever an operator typed.
const WHILE_PAUSED_MS: i64 = 10;

#[derive(Default)]
struct Owed {
    /// Keys, by database and name, to signal as ready.
    signal: HashSet<DbKey>,
    /// Keys changed under their waiters, whose waiters the module wakes
    /// (missing keys) or signals (keys that hold something else now).
    changed: HashSet<DbKey>,
    /// The timer is pending.
    armed: bool,
}

thread_local! {
    /// Callbacks and timers run on Redis's main thread, one at a time.
    static OWED: RefCell<Owed> = RefCell::new(Owed::default());
    /// The data types' keyspace events are heard (see [`hear_changes`]).
    static HEARING_CHANGES: Cell<bool> = const { Cell::new(false) };
}

/// Signals `key` of database `db` again as soon as writes are allowed.
pub(super) fn signal_when_writable(ctx: Ctx<'_>, db: c_int, key: &[u8]) {
    OWED.with_borrow_mut(|owed| owed.signal.insert((db, key.to_vec())));
    arm(ctx, SOON_MS);
}

fn changed(ctx: Ctx<'_>, keys: impl IntoIterator<Item = DbKey>) {
    let any = OWED.with_borrow_mut(|owed| {
        let before = owed.changed.len();
        owed.changed.extend(keys);
        owed.changed.len() > before
    });
    if any {
        arm(ctx, SOON_MS);
    }
}

fn arm(ctx: Ctx<'_>, delay: i64) {
    if OWED.with_borrow_mut(|owed| std::mem::replace(&mut owed.armed, true)) {
        return;
    }
    // SAFETY: a live context; the timer carries no data.
    unsafe { api!(RedisModule_CreateTimer)(ctx.as_ptr(), delay, Some(on_timer), std::ptr::null_mut()) };
}

/// # Safety
/// Called by Redis on the main thread with a live context.
unsafe extern "C" fn on_timer(ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    OWED.with_borrow_mut(|owed| owed.armed = false);
    // SAFETY: the timer's own context, used during this call only.
    let Some(ctx) = (unsafe { Ctx::from_raw(ctx) }) else { return };
    if ctx.writes_paused() {
        arm(ctx, WHILE_PAUSED_MS);
        return;
    }
    let (signal, changed) =
        OWED.with_borrow_mut(|owed| (std::mem::take(&mut owed.signal), std::mem::take(&mut owed.changed)));
    // A panic must not unwind into Redis: what it left undone is dropped,
    // and those waiters answer at their lease's end or their timeout.
    let _ = std::panic::catch_unwind(|| {
        for (db, key) in signal {
            if ctx.select_db(db) {
                ctx.with_key_name(&key, |name| blocking::signal_ready(ctx, name));
            }
        }
        // In cluster mode a missing key may have left with its slot: its
        // waiters wait on (see `blocking::may_claim_absent_key`).
        let cluster = ctx.is_cluster();
        for (db, key) in changed {
            if ctx.select_db(db) {
                if !cluster {
                    blocking::wake_on_deleted(ctx, db, &key);
                }
                // A key that exists (of any type) is served to its waiters
                // by Redis 7.0 once signalled; a missing one is skipped.
                ctx.with_key_name(&key, |name| blocking::signal_ready(ctx, name));
            }
        }
    });
}

/// Where the server does not wake the clients blocked on a deleted key:
/// listens for deletions, at load time; with `hear_writes_now`, for every
/// data type's writes too (see [`hear_changes`]).
pub fn start(ctx: Ctx<'_>, hear_writes_now: bool) -> Result<(), String> {
    if blocking::deletion_wakes() {
        return Ok(());
    }
    let classes = raw::REDISMODULE_NOTIFY_GENERIC | raw::REDISMODULE_NOTIFY_EXPIRED | raw::REDISMODULE_NOTIFY_EVICTED;
    // SAFETY: a live OnLoad context; a callback with the signature Redis
    // expects.
    let subscribed =
        unsafe { api!(RedisModule_SubscribeToKeyspaceEvents)(ctx.as_ptr(), classes, Some(on_keyspace_event)) };
    // redismodule.h's `RedisModuleEvent_FlushDB`, a static of the header
    // rather than a symbol: the event and the version of its data.
    let flush_db = raw::RedisModuleEvent { id: raw::REDISMODULE_EVENT_FLUSHDB, dataver: 1 };
    // SAFETY: as above.
    let flushes = unsafe { api!(RedisModule_SubscribeToServerEvent)(ctx.as_ptr(), flush_db, Some(on_flush)) };
    // `RedisModuleEvent_SwapDB`, as above.
    let swap_db = raw::RedisModuleEvent { id: raw::REDISMODULE_EVENT_SWAPDB, dataver: 1 };
    // SAFETY: as above.
    let swaps = unsafe { api!(RedisModule_SubscribeToServerEvent)(ctx.as_ptr(), swap_db, Some(on_swap)) };
    // `RedisModuleEvent_ReplAsyncLoad`, as above.
    let async_load = raw::RedisModuleEvent { id: raw::REDISMODULE_EVENT_REPL_ASYNC_LOAD, dataver: 1 };
    // SAFETY: as above.
    let loads = unsafe { api!(RedisModule_SubscribeToServerEvent)(ctx.as_ptr(), async_load, Some(on_async_load)) };
    let ok = raw::REDISMODULE_OK as c_int;
    if subscribed != ok || flushes != ok || swaps != ok || loads != ok {
        return Err("redis-idem: could not subscribe to deletions, which wake IDEM.CLAIM ... WAIT".into());
    }
    if hear_writes_now {
        hear_changes(ctx);
    }
    Ok(())
}

/// Where the server does not wake the clients blocked on a deleted key:
/// from the first wait on, also hears every data type's writes (`SET` over
/// a record, a hash made where one was deleted), which the server serves
/// no waiter for. Not at load: a server whose clients never wait pays no
/// callback per write. The module's own class is not heard: its writes
/// signal their keys themselves.
pub(super) fn hear_changes(ctx: Ctx<'_>) {
    if blocking::deletion_wakes() || HEARING_CHANGES.replace(true) {
        return;
    }
    let classes = raw::REDISMODULE_NOTIFY_STRING
        | raw::REDISMODULE_NOTIFY_LIST
        | raw::REDISMODULE_NOTIFY_SET
        | raw::REDISMODULE_NOTIFY_HASH
        | raw::REDISMODULE_NOTIFY_ZSET
        | raw::REDISMODULE_NOTIFY_STREAM;
    // SAFETY: a live command context; a callback with the signature Redis
    // expects. Redis 7.0 adds the subscription to its list, whenever made.
    let subscribed =
        unsafe { api!(RedisModule_SubscribeToKeyspaceEvents)(ctx.as_ptr(), classes, Some(on_keyspace_event)) };
    if subscribed != raw::REDISMODULE_OK as c_int {
        HEARING_CHANGES.set(false);
        ctx.log_warning("redis-idem: could not subscribe to writes of other types, which wake IDEM.CLAIM ... WAIT");
    }
}

/// # Safety
/// Called by Redis on the main thread with a live context, a NUL-terminated
/// event name and the key's name, for the length of the call.
unsafe extern "C" fn on_keyspace_event(
    ctx: *mut raw::RedisModuleCtx,
    _class: c_int,
    _event: *const c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    // Every generic event of the server comes here (on Redis 7.0 only),
    // and every data type's once a client waited: most find nobody
    // waiting. Any change to a watched key owes its waiters a look (one
    // that changed nothing for them, an EXPIRE, leaves them waiting).
    if !blocking::anyone_watched() {
        return 0;
    }
    // SAFETY: as the caller promises.
    let (Some(ctx), Some(key)) = (unsafe { Ctx::from_raw(ctx) }, unsafe { Arg::from_raw(key) }) else { return 0 };
    let db = ctx.selected_db();
    if blocking::is_watched(db, key.bytes()) {
        changed(ctx, [(db, key.bytes().to_vec())]);
    }
    0
}

/// # Safety
/// Called by Redis on the main thread with a live context and, for
/// `FLUSHDB` events, a `RedisModuleFlushInfo`.
unsafe extern "C" fn on_flush(
    ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    sub: u64,
    data: *mut c_void,
) {
    if sub != raw::REDISMODULE_SUBEVENT_FLUSHDB_END {
        return;
    }
    // SAFETY: as the caller promises.
    let (Some(ctx), Some(info)) =
        (unsafe { Ctx::from_raw(ctx) }, unsafe { data.cast::<raw::RedisModuleFlushInfo>().as_ref() })
    else {
        return;
    };
    // -1: every database (FLUSHALL).
    let db = (info.dbnum >= 0).then_some(info.dbnum);
    changed(ctx, blocking::watched_keys(db));
}

/// A replica with `repl-diskless-load swapdb` loaded a full sync into a
/// temporary database while the old one served, and swapped them: every
/// watched key of every database may have vanished or changed. Redis 7.0
/// signals the keys that exist after the swap to their waiters itself, but
/// not the ones that vanished; nor does the swap fire the `SWAPDB` event.
/// While the temporary database loads, nothing of the module reaches it
/// (waiters, wake-ups and the sweeper work on the databases clients see),
/// and a load that is aborted changes nothing.
///
/// # Safety
/// Called by Redis on the main thread with a live context.
unsafe extern "C" fn on_async_load(
    ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    sub: u64,
    _data: *mut c_void,
) {
    if sub != raw::REDISMODULE_SUBEVENT_REPL_ASYNC_LOAD_COMPLETED {
        return;
    }
    // SAFETY: as the caller promises.
    let Some(ctx) = (unsafe { Ctx::from_raw(ctx) }) else { return };
    changed(ctx, blocking::watched_keys(None));
}

/// # Safety
/// Called by Redis on the main thread with a live context and a
/// `RedisModuleSwapDbInfo`.
unsafe extern "C" fn on_swap(
    ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    _sub: u64,
    data: *mut c_void,
) {
    // SAFETY: as the caller promises.
    let (Some(ctx), Some(info)) =
        (unsafe { Ctx::from_raw(ctx) }, unsafe { data.cast::<raw::RedisModuleSwapDbInfo>().as_ref() })
    else {
        return;
    };
    // Each database now holds the other's keys: every watched key of both
    // may have vanished or changed.
    for db in [info.dbnum_first, info.dbnum_second] {
        changed(ctx, blocking::watched_keys(Some(db)));
    }
}
