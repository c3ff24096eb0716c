//! Limits that keep every key movable and the server's memory honest:
//! a value must fit `proto-max-bulk-len`, or `DUMP`, `RESTORE`, `MIGRATE`
//! and a resharding stop on it; a large allocation must not take used
//! memory past `maxmemory`; and what `IDEM.DONE` had to drop is logged.
//!
//! The server is asked for its settings only on the rare large writes, so
//! the hot paths pay nothing.

use std::cell::Cell;

use idem_core::Millis;
use idem_core::bloom::{Limits, MAX_BYTES};
use idem_core::error::{CmdError, CmdResult};

use crate::config;
use crate::host::Ctx;

/// Smallest `proto-max-bulk-len` Redis accepts (1mb). A value below it
/// always fits, so nothing needs to be asked.
const MIN_PROTO_MAX_BULK_LEN: u64 = 1024 * 1024;

/// Allocations below this go ahead without asking for the used memory:
/// `deny-oom` already refuses writes once memory is full, and this is the
/// most one write can overshoot by.
const SMALL_ALLOCATION: u64 = 1024 * 1024;

fn config_number(ctx: Ctx, name: &str) -> Option<u64> {
    ctx.config(name)?.parse().ok()
}

/// Refuses a value of `bytes` (as `DUMP` would serialize it) that
/// `proto-max-bulk-len` would not let `RESTORE` or `MIGRATE` carry.
pub fn check_value_size(ctx: Ctx, bytes: u64, what: &str) -> CmdResult {
    if bytes <= MIN_PROTO_MAX_BULK_LEN {
        return Ok(());
    }
    match config_number(ctx, "proto-max-bulk-len") {
        Some(limit) if bytes > limit => Err(CmdError::new(format!(
            "ERR {what} would make the key {bytes} bytes, over proto-max-bulk-len ({limit}): \
             it could not be DUMPed, RESTOREd or MIGRATEd"
        ))),
        _ => Ok(()),
    }
}

/// Refuses to allocate `bytes` when that would take used memory past
/// `maxmemory`.
pub fn check_memory_for(ctx: Ctx, bytes: u64) -> CmdResult {
    if bytes < SMALL_ALLOCATION {
        return Ok(());
    }
    match ctx.info_numbers("memory", ["used_memory", "maxmemory"]) {
        [Some(used), Some(max)] if max > 0 && used.saturating_add(bytes) > max => Err(CmdError::new(format!(
            "OOM the filter needs {bytes} more bytes, which would take used memory ({used}) past maxmemory ({max})"
        ))),
        _ => Ok(()),
    }
}

/// The server's limits on a client's filter write, as the core asks for
/// them (`idem_core::bloom::Limits`): `idem.bf-max-bytes`,
/// `proto-max-bulk-len` and `maxmemory`.
pub struct ServerLimits<'c> {
    ctx: Ctx<'c>,
    /// Refuse any allocation: used memory is already over `maxmemory`
    /// (a `DONE`'s add, which is not `deny-oom`).
    memory_full: bool,
}

impl<'c> ServerLimits<'c> {
    pub fn of(ctx: Ctx<'c>) -> ServerLimits<'c> {
        ServerLimits { ctx, memory_full: false }
    }

    /// The limits when used memory is over `maxmemory`: only a write that
    /// allocates nothing goes ahead.
    pub fn memory_full(ctx: Ctx<'c>) -> ServerLimits<'c> {
        ServerLimits { ctx, memory_full: true }
    }
}

impl Limits for ServerLimits<'_> {
    fn max_bytes(&self) -> u64 {
        config::bf_max_bytes().min(MAX_BYTES)
    }

    fn check_value_size(&self, dumped: u64) -> CmdResult {
        check_value_size(self.ctx, dumped, "this write")
    }

    fn check_memory_for(&self, bytes: u64) -> CmdResult {
        check_memory_for(self.ctx, bytes)?;
        if self.memory_full && bytes > 0 {
            return Err(CmdError::Static(c"OOM the filter needs memory and used memory is over maxmemory"));
        }
        Ok(())
    }
}

/// Least time between two warnings about dropped data.
const LOG_INTERVAL_MS: Millis = 10_000;

thread_local! {
    /// Commands run on Redis's main thread: plain cells. The time of the
    /// last warning, and how many were held back since.
    static LAST_LOG: Cell<Millis> = const { Cell::new(Millis::MIN) };
    static HELD_BACK: Cell<u64> = const { Cell::new(0) };
}

/// Logs a warning about something `IDEM.DONE` dropped, at most once every
/// ten seconds (a full memory can make every DONE drop something), saying
/// how many were held back; `INFO idem` counts them all.
pub fn log_drop(ctx: Ctx, message: &str) {
    let now = ctx.now();
    if now.saturating_sub(LAST_LOG.get()) < LOG_INTERVAL_MS {
        HELD_BACK.set(HELD_BACK.get() + 1);
        return;
    }
    LAST_LOG.set(now);
    let held_back = HELD_BACK.replace(0);
    let more = match held_back {
        0 => String::new(),
        n => format!(" ({n} more such drops since the last warning)"),
    };
    ctx.log_warning(&format!("redis-idem: {message}{more}"));
}
