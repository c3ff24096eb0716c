//! The host layer: the one place that talks to Redis's C module API, and
//! the only one with `unsafe` besides the data types' C callbacks.
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
//! - [`io`]: what the data types' persistence callbacks read and write.
//! - [`background`]: the timer and keyspace walk of the filter sweeper.
//! - [`info`]: the `INFO idem` section.
//!
//! The crate's convenience layer (`decode_args`, `RedisValue` replies, a
//! `String` per replicated argument) costs 0.3-0.4 us per command on a
//! 1.9 us budget, so the hot path talks to the raw API through these.

pub mod background;
pub mod command;
pub mod context;
pub mod info;
pub mod io;
pub mod key;

use std::ffi::{c_char, c_void};

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

/// Bytes Redis's allocator really holds for an allocation of `len`
/// elements starting at `ptr`. A Rust value with nothing in it (an empty
/// boxed slice, a `Vec` without capacity) holds no allocation at all, and
/// its dangling pointer must never reach the allocator: 0 for those.
///
/// # Safety
/// With `len > 0`, `ptr` must be the start of a live heap allocation of
/// `len` elements made by the module's global allocator (Redis's): a
/// `Box` or a `Vec`'s buffer.
pub unsafe fn allocation_size<T>(ptr: *const T, len: usize) -> usize {
    if len == 0 || size_of::<T>() == 0 {
        return 0;
    }
    // SAFETY: the caller promises a live allocation of Redis's allocator.
    unsafe { api!(RedisModule_MallocSize)(ptr as *mut c_void) }
}

/// Whether the server can set a key's absolute expiry (Redis 7.0.5+,
/// Valkey 8+), which records need to stay exact across replicas.
pub fn has_absolute_expiry() -> bool {
    // SAFETY: reads (copies) function pointers Redis set before OnLoad.
    let (set, get) =
        unsafe { (redis_module::raw::RedisModule_SetAbsExpire, redis_module::raw::RedisModule_GetAbsExpire) };
    set.is_some() && get.is_some()
}
