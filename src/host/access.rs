//! What a client may see, and reading a key without leaving a trace: for
//! `IDEM.SCAN`, which lists only the keys its caller may read by its ACL key
//! patterns, and leaves every key it looks at as a plain `SCAN` leaves it
//! (no LRU/LFU change, no keyspace hit or miss, no event).

use std::ffi::c_int;
use std::ptr::NonNull;

use idem_core::error::CmdError;
use redis_module::raw;

use super::api;
use super::context::Ctx;
use super::key::{Arg, Key};
use super::options;

/// The ACL user whose key permissions apply to the running command.
pub struct Caller {
    /// `None`: a client that may read every key (the primary's link, AOF
    /// loading, a client without a user, which Redis treats as root).
    user: Option<NonNull<raw::RedisModuleUser>>,
}

/// A caller whose user the module cannot tell: a script's or another
/// module's call (`RM_Call`), whose client Redis does not list.
const UNKNOWN_CALLER: CmdError = CmdError::Static(
    c"ERR IDEM.SCAN cannot tell whose key permissions apply inside a script or a module's call: send it as a command",
);

impl Caller {
    /// The running command's caller. `RedisModule_GetCurrentUserName`
    /// dereferences the client's user, which is NULL for root clients (a
    /// module's `RM_Call`, the primary), so the user is looked up by client
    /// id instead, which says so.
    pub fn of(ctx: Ctx<'_>) -> Result<Caller, CmdError> {
        if ctx.flags() & (raw::REDISMODULE_CTX_FLAGS_REPLICATED | raw::REDISMODULE_CTX_FLAGS_LOADING) != 0 {
            return Ok(Caller { user: None });
        }
        // SAFETY: a live command context.
        let id = unsafe { api!(RedisModule_GetClientId)(ctx.as_ptr()) };
        // SAFETY: as above; the name, when returned, is a string of this
        // context, freed below.
        let name = unsafe { api!(RedisModule_GetClientUserNameById)(ctx.as_ptr(), id) };
        let Some(name) = NonNull::new(name) else {
            return match std::io::Error::last_os_error().raw_os_error() {
                // A client without a user: root.
                Some(ENOTSUP) => Ok(Caller { user: None }),
                _ => Err(UNKNOWN_CALLER),
            };
        };
        // SAFETY: a live string; the user returned is a wrapper of the
        // server's user, freed in `drop`.
        let user = unsafe { api!(RedisModule_GetModuleUserFromUserName)(name.as_ptr()) };
        // SAFETY: created by this context above; nothing refers to it.
        unsafe { api!(RedisModule_FreeString)(ctx.as_ptr(), name.as_ptr()) };
        // The user was deleted between the two calls: nothing is readable.
        NonNull::new(user).map(|user| Caller { user: Some(user) }).ok_or(UNKNOWN_CALLER)
    }

    /// Whether the caller may read `key` by its ACL key patterns.
    pub fn may_read(&self, key: Arg<'_>) -> bool {
        let Some(user) = self.user else { return true };
        // SAFETY: a live user wrapper and key name; the flags are the
        // keyspec flags the API documents.
        let status = unsafe {
            api!(RedisModule_ACLCheckKeyPermissions)(
                user.as_ptr(),
                key.as_ptr(),
                raw::REDISMODULE_CMD_KEY_ACCESS as c_int,
            )
        };
        status == raw::REDISMODULE_OK as c_int
    }
}

impl Drop for Caller {
    fn drop(&mut self) {
        if let Some(user) = self.user {
            // SAFETY: the wrapper `of` got; it frees the wrapper alone (the
            // server's user stays).
            unsafe { api!(RedisModule_FreeModuleUser)(user.as_ptr()) };
        }
    }
}

/// `ENOTSUP` on Linux (and `EOPNOTSUPP`, its twin there).
const ENOTSUP: i32 = 95;

/// Runs `read` on the key `name`, opened so that reading it leaves no
/// trace: Redis 7.2+ and Valkey have `REDISMODULE_OPEN_KEY_NOEFFECTS`.
/// Redis 7.0 has only `NOTOUCH` (no LRU/LFU change), and counts a keyspace
/// hit or miss for every key opened for reading, but none for a key opened
/// for writing: there the key is opened for writing (nothing is written),
/// with the module's implicit "key modified" signal turned off for that
/// moment, so that no `WATCH` or client-side cache sees a change.
pub fn read_quietly<R>(ctx: Ctx<'_>, name: Arg<'_>, read: impl FnOnce(&mut Key<'_>) -> R) -> R {
    if has_no_effects_mode() {
        let mode = raw::REDISMODULE_READ | raw::REDISMODULE_OPEN_KEY_NOEFFECTS;
        let mut key = Key::open_with(ctx, name, mode as c_int);
        return read(&mut key);
    }
    let _unsignalled = options::without_implicit_signals(ctx);
    let mode = raw::REDISMODULE_READ | raw::REDISMODULE_WRITE | raw::REDISMODULE_OPEN_KEY_NOTOUCH;
    let mut key = Key::open_with(ctx, name, mode as c_int);
    // The key closes before the signal comes back on.
    read(&mut key)
}

/// Whether keys can be opened with `REDISMODULE_OPEN_KEY_NOEFFECTS`: the
/// server lists the open modes it supports (Redis 7.2+, Valkey 8+).
pub fn has_no_effects_mode() -> bool {
    // SAFETY: reads (copies) a function pointer Redis set before OnLoad.
    let Some(modes) = (unsafe { raw::RedisModule_GetOpenKeyModesAll }) else { return false };
    // SAFETY: takes no arguments.
    (unsafe { modes() }) as u32 & raw::REDISMODULE_OPEN_KEY_NOEFFECTS != 0
}
