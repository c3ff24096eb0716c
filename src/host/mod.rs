//! The host layer: the one place that talks to Redis's C module API, and
//! the only one with `unsafe`.
//!
//! Everything here hands the rest of the module safe types whose
//! lifetimes are tied to the call Redis made: a [`Ctx`] for one command,
//! timer or load, the [`Args`] of that command, the [`Key`]s it opens.
//! Raw pointers never leave this layer except as values of our own data
//! types, which their callbacks own.
//!
//! - [`context`]: the call's context: clock, flags, replies, replication,
//!   notifications, logging, server settings.
//! - [`key`]: command arguments and open keys (expiry, module values).
//! - [`command`]: command registration and dispatch (panics become errors).
//! - [`data_type`]: module data types in safe Rust: the value behind
//!   Redis's pointer, and the C callbacks, once for every type (a panic
//!   in one gives its safest answer, never an abort).
//! - [`io`]: what those callbacks read and write.
//! - [`background`]: the timer and keyspace walk of the filter sweeper.
//! - [`blocking`]: clients that wait on a key (`IDEM.CLAIM ... WAIT`), and
//!   the timers and signals that wake them; [`owed`]: the wake-ups given
//!   later (after a write pause; on Redis 7.0, deletions).
//! - [`info`]: the `INFO idem` section.
//! - [`access`]: the caller's ACL key permissions, and reading a key
//!   without a trace (`IDEM.SCAN`).
//! - [`options`]: what the module declares it handles (async loading of
//!   a full sync, Valkey's atomic slot migration).
//!
//! The crate's convenience layer (`decode_args`, `RedisValue` replies, a
//! `String` per replicated argument) costs 0.3-0.4 us per command on a
//! 1.9 us budget, so the hot path talks to the raw API through these.

pub mod access;
pub mod background;
pub mod blocking;
pub mod command;
pub mod context;
pub mod data_type;
pub mod info;
pub mod io;
pub mod key;
pub mod options;
pub mod owed;

use std::ffi::c_char;

pub use context::Ctx;
pub use key::{Arg, Args, Key, KeyMode};

/// Loads an API function pointer. Redis fills them in before any module code
/// runs; a missing one is a module built against a newer API than the
/// server, which `init` checks for the optional ones.
macro_rules! api {
    ($name:ident) => {{
        // SAFETY: reads a function pointer Redis set once, before OnLoad,
        // and never changes afterwards.
        #[allow(unused_unsafe)]
        let function = unsafe { redis_module::raw::$name };
        function.expect(concat!(stringify!($name), " is not available"))
    }};
}
pub(crate) use api;

/// A byte slice as the C API takes it. An empty Rust slice points at an
/// address that was never allocated (its alignment): harmless to Rust, but
/// C code may hand it to the allocator or to memcpy. Empty slices point at
/// a real static byte instead.
pub fn c_bytes(bytes: &[u8]) -> (*const c_char, usize) {
    static EMPTY: [u8; 1] = [0];
    let bytes = if bytes.is_empty() { &EMPTY[..0] } else { bytes };
    (bytes.as_ptr().cast(), bytes.len())
}

/// Whether the server can set a key's absolute expiry (Redis 7.0.5+,
/// Valkey 8+), which records need to stay exact across replicas.
pub fn has_absolute_expiry() -> bool {
    // SAFETY: reads (copies) function pointers Redis set before OnLoad.
    let (set, get) =
        unsafe { (redis_module::raw::RedisModule_SetAbsExpire, redis_module::raw::RedisModule_GetAbsExpire) };
    set.is_some() && get.is_some()
}

/// The optional parts of the module API the module uses, as this server
/// has them: found by their function pointers at load, never assumed from
/// a version number (a 7.2 or 7.4, or a fork, has what it has).
pub struct ApiFeatures {
    /// `RedisModule_SetCommandACLCategories` (Redis 7.2+, Valkey 8+): the
    /// commands carry ACL categories.
    pub command_acl_categories: bool,
    /// `RedisModule_AddACLCategory` (Redis 7.4+, Valkey 8.1+): `@idem`.
    pub module_acl_category: bool,
    /// `RedisModule_BlockClientOnKeysWithFlags` (Redis 7.2+, Valkey 8+):
    /// a deleted key wakes its waiters.
    pub block_on_keys_with_flags: bool,
}

pub fn api_features() -> ApiFeatures {
    use redis_module::raw;
    // SAFETY: reads (copies) function pointers Redis set before OnLoad.
    let (acl, category, block) = unsafe {
        (
            raw::RedisModule_SetCommandACLCategories,
            raw::RedisModule_AddACLCategory,
            raw::RedisModule_BlockClientOnKeysWithFlags,
        )
    };
    ApiFeatures {
        command_acl_categories: acl.is_some(),
        module_acl_category: category.is_some(),
        block_on_keys_with_flags: block.is_some(),
    }
}
