//! Command arguments and open keys.

use std::ffi::{c_int, c_void};
use std::marker::PhantomData;
use std::ptr::NonNull;

use idem_core::Millis;
use idem_core::args::ArgList;
use idem_core::error::{CmdError, WRONGTYPE};
use redis_module::raw;

use super::api;
use super::context::Ctx;

/// A Redis string that lives at least as long as `'a`: a command argument,
/// or a key name the host created for a call.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct Arg<'a> {
    raw: NonNull<raw::RedisModuleString>,
    _lives: PhantomData<&'a raw::RedisModuleString>,
}

impl<'a> Arg<'a> {
    /// # Safety
    /// `raw` is a Redis string that stays alive, and unchanged, for `'a`.
    pub unsafe fn from_raw(raw: *mut raw::RedisModuleString) -> Option<Arg<'a>> {
        Some(Arg { raw: NonNull::new(raw)?, _lives: PhantomData })
    }

    pub(super) fn as_ptr(self) -> *mut raw::RedisModuleString {
        self.raw.as_ptr()
    }

    /// The string's bytes, valid while it is.
    pub fn bytes(self) -> &'a [u8] {
        let mut len = 0;
        // SAFETY: a live string (the type's invariant).
        let ptr = unsafe { api!(RedisModule_StringPtrLen)(self.as_ptr(), &mut len) };
        if ptr.is_null() || len == 0 {
            return &[];
        }
        // SAFETY: Redis answers the string's own buffer of `len` bytes,
        // unchanged while the string lives, which is `'a`.
        unsafe { std::slice::from_raw_parts(ptr.cast(), len) }
    }
}

/// A command's arguments, `argv[0]` being the command name.
#[derive(Clone, Copy)]
pub struct Args<'a>(&'a [Arg<'a>]);

impl<'a> Args<'a> {
    /// # Safety
    /// `argv` holds `argc` live Redis strings that outlive `'a` (a
    /// command's own arguments, for the duration of the call).
    pub(super) unsafe fn from_raw(argv: *mut *mut raw::RedisModuleString, argc: c_int) -> Args<'a> {
        let len = argc.max(0) as usize;
        if argv.is_null() || len == 0 {
            return Args(&[]);
        }
        // SAFETY: `Arg` is a transparent non-null string pointer, and
        // Redis never passes a null argument; the array outlives `'a`.
        Args(unsafe { std::slice::from_raw_parts(argv.cast::<Arg<'a>>(), len) })
    }

    pub fn arg(&self, index: usize) -> Arg<'a> {
        self.0[index]
    }

    /// The arguments from `index` on.
    pub fn from(&self, index: usize) -> &'a [Arg<'a>] {
        &self.0[index..]
    }
}

impl ArgList for Args<'_> {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn bytes(&self, index: usize) -> &[u8] {
        self.0[index].bytes()
    }
}

#[derive(Clone, Copy)]
#[repr(i32)]
pub enum KeyMode {
    Read = raw::REDISMODULE_READ as i32,
    Write = (raw::REDISMODULE_READ | raw::REDISMODULE_WRITE) as i32,
}

/// A data type's handle, as Redis registered it.
pub type TypeHandle = *mut raw::RedisModuleType;

/// An open key, closed when dropped. Values are reached through `&mut`,
/// so at most one borrow of a key's value exists at a time; a command
/// never opens the same key twice.
pub struct Key<'a> {
    /// Null for a missing key opened for reading.
    raw: *mut raw::RedisModuleKey,
    name: Arg<'a>,
}

impl<'a> Key<'a> {
    pub(super) fn open(ctx: Ctx<'a>, name: Arg<'a>, mode: KeyMode) -> Key<'a> {
        Key::open_with(ctx, name, mode as c_int)
    }

    /// Opens a key with `RedisModule_OpenKey`'s own mode bits.
    pub(super) fn open_with(ctx: Ctx<'a>, name: Arg<'a>, mode: c_int) -> Key<'a> {
        // SAFETY: a live context and key name; the key is closed on drop,
        // within the call.
        let raw = unsafe { api!(RedisModule_OpenKey)(ctx.as_ptr(), name.as_ptr(), mode) };
        Key { raw: raw.cast(), name }
    }

    pub fn name(&self) -> Arg<'a> {
        self.name
    }

    /// Whether the key holds nothing.
    pub fn is_empty(&self) -> bool {
        // SAFETY: a key this handle opened and has not closed.
        self.raw.is_null() || unsafe { api!(RedisModule_KeyType)(self.raw) } == raw::REDISMODULE_KEYTYPE_EMPTY as c_int
    }

    /// The value if the key holds one of `module_type`, as the pointer the
    /// type stored; `Err` for any other type; `Ok(None)` when missing.
    pub fn module_value(&self, module_type: TypeHandle) -> Result<Option<NonNull<c_void>>, CmdError> {
        if self.is_empty() {
            return Ok(None);
        }
        // SAFETY: an open, non-empty key.
        if unsafe { api!(RedisModule_ModuleTypeGetType)(self.raw) } != module_type {
            return Err(WRONGTYPE);
        }
        // SAFETY: as above; the pointer is returned, not read.
        Ok(NonNull::new(unsafe { api!(RedisModule_ModuleTypeGetValue)(self.raw) }))
    }

    /// Stores a new value, freeing the old one through its type's `free`.
    ///
    /// # Safety
    /// `value` is a value of `module_type`, made as that type's callbacks
    /// expect; Redis owns it from now on.
    pub unsafe fn set_module_value(&mut self, module_type: TypeHandle, value: *mut c_void) {
        // SAFETY: a key opened for writing; the caller vouches for `value`.
        unsafe { api!(RedisModule_ModuleTypeSetValue)(self.raw, module_type, value) };
    }

    /// Swaps the value of a key of `module_type`, keeping its TTL; returns
    /// the old value, which the caller now owns.
    ///
    /// # Safety
    /// As [`set_module_value`](Self::set_module_value), and the key holds
    /// a value of `module_type`.
    pub unsafe fn replace_module_value(&mut self, module_type: TypeHandle, value: *mut c_void) -> *mut c_void {
        let mut old = std::ptr::null_mut();
        // SAFETY: as the caller vouches.
        unsafe { api!(RedisModule_ModuleTypeReplaceValue)(self.raw, module_type, value, &mut old) };
        old
    }

    /// Deletes the key (opened for writing) and its value.
    pub fn delete(&mut self) {
        // SAFETY: an open key; Redis frees the value through its type.
        unsafe { api!(RedisModule_DeleteKey)(self.raw) };
    }

    /// `None` removes the expiry.
    pub fn set_expire_at(&mut self, at: Option<Millis>) {
        // SAFETY: a key opened for writing.
        unsafe {
            match at {
                Some(at) => api!(RedisModule_SetAbsExpire)(self.raw, at),
                None => api!(RedisModule_SetExpire)(self.raw, raw::REDISMODULE_NO_EXPIRE as _),
            }
        };
    }

    /// Milliseconds to live, as PTTL counts them (-1: no expiry, -2: no
    /// key).
    pub fn pttl(&self) -> Millis {
        if self.raw.is_null() {
            return -2;
        }
        // SAFETY: an open key.
        unsafe { api!(RedisModule_GetExpire)(self.raw) }
    }
}

impl Drop for Key<'_> {
    fn drop(&mut self) {
        if !self.raw.is_null() {
            // SAFETY: opened by this handle, closed once.
            unsafe { api!(RedisModule_CloseKey)(self.raw) };
        }
    }
}
