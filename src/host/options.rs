//! The module's options (`RedisModule_SetModuleOptions`): what it declares
//! it handles, set once at load, and kept here so that a moment without
//! implicit "key modified" signals can restore them after.

use std::cell::Cell;
use std::ffi::c_int;

use redis_module::raw;

use super::api;
use super::context::Ctx;

/// Valkey's `VALKEYMODULE_OPTIONS_HANDLE_ATOMIC_SLOT_MIGRATION` (`1 << 5` in
/// valkeymodule.h): the module bears `CLUSTER MIGRATESLOTS`. The
/// `redis-module` crate (built on Redis's header) has no constant for it,
/// and Redis assigns its own option bits (Redis 8.4 has an atomic slot
/// migration of its own), so it is set only on a server that says it is
/// Valkey.
const VALKEY_HANDLE_ATOMIC_SLOT_MIGRATION: c_int = 1 << 5;

thread_local! {
    /// The options set at load; the server calls modules on its main
    /// thread only.
    static DECLARED: Cell<c_int> = const { Cell::new(0) };
}

/// Declares, at load, what the module handles:
/// - `HANDLE_IO_ERRORS`: a failed read of a payload is an error, never an
///   abort (a crafted `RESTORE` payload would crash the server otherwise);
/// - `HANDLE_REPL_ASYNC_LOAD`: a replica with `repl-diskless-load swapdb`
///   loads a full sync into a temporary database while the old one serves
///   (see `owed::start`, which wakes what the swap changed);
/// - on Valkey, atomic slot migration (`CLUSTER MIGRATESLOTS`): keys
///   arrive on the target as `IDEM.APPLY` / `IDEM.BF.LOAD` from the
///   source's slot-migration link, which the server runs as it runs its
///   primary's stream (see `Ctx::require_primary_or_aof`).
///
/// Returns whether atomic slot migration was declared.
pub fn declare(ctx: Ctx<'_>) -> bool {
    let mut options =
        (raw::REDISMODULE_OPTIONS_HANDLE_IO_ERRORS | raw::REDISMODULE_OPTIONS_HANDLE_REPL_ASYNC_LOAD) as c_int;
    let valkey = ctx.is_valkey();
    if valkey {
        options |= VALKEY_HANDLE_ATOMIC_SLOT_MIGRATION;
    }
    set(ctx, options);
    DECLARED.set(options);
    valkey
}

fn set(ctx: Ctx<'_>, options: c_int) {
    // SAFETY: a live context of this module; Redis stores the bits.
    unsafe { api!(RedisModule_SetModuleOptions)(ctx.as_ptr(), options) };
}

/// While it lives, closing a key opened for writing does not signal it as
/// modified (no `WATCH` fails, no client-side cache is told), as with
/// `REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED`; the declared options
/// come back when it is dropped, before the command returns.
pub(super) struct WithoutImplicitSignals<'call> {
    ctx: Ctx<'call>,
}

pub(super) fn without_implicit_signals(ctx: Ctx<'_>) -> WithoutImplicitSignals<'_> {
    set(ctx, DECLARED.get() | raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED as c_int);
    WithoutImplicitSignals { ctx }
}

impl Drop for WithoutImplicitSignals<'_> {
    fn drop(&mut self) {
        set(self.ctx, DECLARED.get());
    }
}
