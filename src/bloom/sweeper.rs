//! Drops the shards of idle filters once they leave the window.
//!
//! Writes drop old shards as they pass, and a filter whose newest shard
//! left the window expires as a key. What remains is the memory of old
//! shards in a filter nobody writes to: a timer on the primary walks the
//! keyspace a little at a time and drops them, propagating the drop as an
//! `IDEM.BF.APPLY` without items so replicas drop the same shards.

use std::cell::RefCell;

use idem_core::Millis;

use super::commands;
use super::data_type;
use crate::host::background::{self, Periodic, VisitedKey, Walk};
use crate::host::{Ctx, KeyMode};

/// Time between two steps of the walk.
const INTERVAL_MS: i64 = 100;
/// SCAN iterations per step (each visits about ten keys).
const SCANS_PER_STEP: usize = 10;

thread_local! {
    /// Timers run on Redis's main thread, one at a time.
    static WALK: RefCell<Option<Walk>> = const { RefCell::new(None) };
}

/// Starts the periodic walk; called once at load time.
pub fn start(ctx: Ctx) {
    background::every(ctx, Periodic { interval: INTERVAL_MS, run: step });
}

fn step(ctx: Ctx) {
    // Its drops propagate, which Redis forbids while writes are paused:
    // they wait for the next step after the pause.
    if !ctx.is_writable_primary() || ctx.writes_paused() {
        return;
    }
    let now = ctx.now();
    WALK.with_borrow_mut(|walk| {
        let walk = walk.get_or_insert_with(Walk::new);
        // A step spends its scans across databases: empty ones cost one
        // scan each, so a quiet server is walked whole within a step or two.
        for _ in 0..SCANS_PER_STEP {
            let visit = |key: &VisitedKey<'_>| {
                let filter = data_type::visited(key)?;
                let has_old_shards = filter.shards.first().is_some_and(|oldest| !filter.is_live(oldest, now));
                has_old_shards.then(|| key.name().to_vec())
            };
            // Written outside the scan, in the database scanned.
            let drop_all = |ctx: Ctx<'_>, names: Vec<Vec<u8>>| {
                for name in names {
                    drop_old_shards(ctx, &name, now);
                }
            };
            if !walk.step(ctx, visit, drop_all) {
                return;
            }
        }
    });
}

fn drop_old_shards(ctx: Ctx, name: &[u8], now: Millis) {
    ctx.with_key_named(name, KeyMode::Write, |key| {
        // A key of another type since the scan is left alone.
        let _ = commands::drop_old_shards(ctx, key, now);
    });
}
