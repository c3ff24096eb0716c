//! Drops the shards of idle filters once they leave the window.
//!
//! Writes drop old shards as they pass, and a filter whose newest shard
//! left the window expires as a key. What remains is the memory of old
//! shards in a filter nobody writes to: a timer on the primary walks the
//! keyspace a little at a time and drops them, propagating the drop as an
//! `IDEM.BF.APPLY` without items so replicas drop the same shards.

use std::cell::RefCell;
use std::ffi::{c_int, c_void};
use std::ptr;

use redis_module::raw;

use crate::bloom_commands::{add_and_propagate, prepare_drop};
use crate::bloom_type;
use crate::record::Millis;
use crate::server::{Ctx, KeyMode, RawCtx, RawString, api, create_string};

/// Time between two steps of the walk.
const INTERVAL_MS: i64 = 100;
/// SCAN iterations per step (each visits about ten keys).
const SCANS_PER_STEP: usize = 10;

struct Walk {
    cursor: *mut raw::RedisModuleScanCursor,
    db: c_int,
}

thread_local! {
    /// Timers run on Redis's main thread, one at a time.
    static WALK: RefCell<Option<Walk>> = const { RefCell::new(None) };
}

/// Starts the periodic walk; called once at load time.
pub fn start(ctx: RawCtx) {
    schedule(ctx);
}

fn schedule(ctx: RawCtx) {
    unsafe { api!(RedisModule_CreateTimer)(ctx, INTERVAL_MS, Some(on_timer), ptr::null_mut()) };
}

/// # Safety
/// Called by Redis on the main thread with a valid context.
unsafe extern "C" fn on_timer(ctx: RawCtx, _data: *mut c_void) {
    // A panic must not unwind into Redis; the walk simply goes on next time.
    let _ = std::panic::catch_unwind(|| step(ctx));
    schedule(ctx);
}

fn is_writable_primary(ctx: RawCtx) -> bool {
    let flags = unsafe { api!(RedisModule_GetContextFlags)(ctx) } as u32;
    flags & raw::REDISMODULE_CTX_FLAGS_MASTER != 0 && flags & raw::REDISMODULE_CTX_FLAGS_LOADING == 0
}

/// Names of filters with shards to drop, found by one scan.
struct Found {
    now: Millis,
    names: Vec<Vec<u8>>,
}

/// # Safety
/// Called by `RedisModule_Scan` with `found` pointing at a live [`Found`].
unsafe extern "C" fn visit(_ctx: RawCtx, name: RawString, key: *mut raw::RedisModuleKey, found: *mut c_void) {
    if key.is_null() {
        return;
    }
    let found = unsafe { &mut *(found as *mut Found) };
    if let Some(filter) = bloom_type::value_of(key) {
        if filter.shards.first().is_some_and(|oldest| !filter.is_live(oldest, found.now)) {
            found.names.push(crate::server::string_bytes(name).to_vec());
        }
    }
}

fn step(ctx: RawCtx) {
    if !is_writable_primary(ctx) {
        return;
    }
    let now = Ctx(ctx).now();
    WALK.with_borrow_mut(|walk| {
        let walk = walk.get_or_insert_with(|| Walk { cursor: unsafe { api!(RedisModule_ScanCursorCreate)() }, db: 0 });
        // A step spends its scans across databases: empty ones cost one
        // scan each, so a quiet server is walked whole within a step or two.
        for _ in 0..SCANS_PER_STEP {
            if unsafe { api!(RedisModule_SelectDb)(ctx, walk.db) } != raw::REDISMODULE_OK as c_int {
                // Past the last database: start over at 0 next step.
                walk.db = 0;
                return;
            }
            let mut found = Found { now, names: Vec::new() };
            let more =
                unsafe { api!(RedisModule_Scan)(ctx, walk.cursor, Some(visit), (&mut found as *mut Found).cast()) };
            // Written outside the scan callback, in the database scanned.
            for name in found.names {
                drop_old_shards(Ctx(ctx), &name, now);
            }
            if more == 0 {
                unsafe { api!(RedisModule_ScanCursorRestart)(walk.cursor) };
                walk.db += 1;
            }
        }
    });
}

fn drop_old_shards(ctx: Ctx, name: &[u8], now: Millis) {
    let name = create_string(ctx.0, name);
    {
        let key = ctx.open_key(name, KeyMode::Write);
        if let Ok(prepared) = prepare_drop(&key, now) {
            add_and_propagate(ctx, &key, prepared, now, &[], |_| {});
        }
    }
    unsafe { api!(RedisModule_FreeString)(ctx.0, name) };
}
