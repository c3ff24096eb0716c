//! Module data types written in safe Rust. A type says, in a [`DataType`],
//! what its value is and what each callback does with it; the host keeps
//! the value behind the pointer Redis holds ([`Stored`]) and implements
//! the `unsafe extern "C"` callbacks once, for every type.

use std::ffi::{CStr, c_int, c_void};
use std::marker::PhantomData;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::{self, NonNull};

use idem_core::Millis;
use idem_core::error::CmdError;
use redis_module::native_types::RedisType;
use redis_module::raw;

use super::api;
use super::io::{Aof, Digest, Rdb};
use super::key::{Arg, Key};

/// A value Redis holds as one pointer, owned by it between callbacks.
///
/// # Safety
/// `from_raw(into_raw(value))` gives `value` back, and while the pointer
/// lives, `borrow` and `borrow_mut` give views of that value.
pub unsafe trait Stored: Sized + 'static {
    /// A shared view of a stored value.
    type Ref<'a>: Copy;
    /// An exclusive view of a stored value.
    type Mut<'a>;

    fn into_raw(self) -> NonNull<c_void>;

    /// # Safety
    /// `ptr` came from [`into_raw`](Self::into_raw) and is not used after.
    unsafe fn from_raw(ptr: NonNull<c_void>) -> Self;

    /// # Safety
    /// `ptr` came from [`into_raw`](Self::into_raw), stays alive for
    /// `'a`, and is not changed meanwhile.
    unsafe fn borrow<'a>(ptr: NonNull<c_void>) -> Self::Ref<'a>;

    /// # Safety
    /// As [`borrow`](Self::borrow), and nothing else reaches the value
    /// for `'a`.
    unsafe fn borrow_mut<'a>(ptr: NonNull<c_void>) -> Self::Mut<'a>;

    /// Bytes Redis's allocator holds for the value's own allocation.
    fn allocation_size(value: Self::Ref<'_>) -> usize;
}

// SAFETY: a box's pointer, and back.
unsafe impl<T: 'static> Stored for Box<T> {
    type Ref<'a> = &'a T;
    type Mut<'a> = &'a mut T;

    fn into_raw(self) -> NonNull<c_void> {
        NonNull::from(Box::leak(self)).cast()
    }

    unsafe fn from_raw(ptr: NonNull<c_void>) -> Self {
        // SAFETY: the pointer `into_raw` leaked, given back once.
        unsafe { Box::from_raw(ptr.cast().as_ptr()) }
    }

    unsafe fn borrow<'a>(ptr: NonNull<c_void>) -> &'a T {
        // SAFETY: a live box, unchanged for `'a`, as the caller promises.
        unsafe { ptr.cast().as_ref() }
    }

    unsafe fn borrow_mut<'a>(ptr: NonNull<c_void>) -> &'a mut T {
        // SAFETY: a live box, reached by nothing else for `'a`.
        unsafe { ptr.cast().as_mut() }
    }

    fn allocation_size(value: &T) -> usize {
        // SAFETY: a view `borrow` made, so the box's own address.
        unsafe { heap_size(value as *const T, 1) }
    }
}

/// One of three boxed kinds of value behind a single pointer, told apart by
/// its two low bits (every kind is aligned to at least 4): a value costs
/// one allocation of its own size, with no tag stored beside it.
pub enum Tagged<A, B, C> {
    A(Box<A>),
    B(Box<B>),
    C(Box<C>),
}

/// A view of a [`Tagged`] value.
pub enum TaggedRef<'a, A, B, C> {
    A(&'a A),
    B(&'a B),
    C(&'a C),
}

impl<A, B, C> Clone for TaggedRef<'_, A, B, C> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<A, B, C> Copy for TaggedRef<'_, A, B, C> {}

/// An exclusive view of a [`Tagged`] value.
pub enum TaggedMut<'a, A, B, C> {
    A(&'a mut A),
    B(&'a mut B),
    C(&'a mut C),
}

const TAG_MASK: usize = 0b11;

impl<A, B, C> Tagged<A, B, C> {
    /// Every kind leaves the two low bits of its address free.
    const ALIGNED: () = assert!(align_of::<A>() >= 4 && align_of::<B>() >= 4 && align_of::<C>() >= 4);

    fn split(ptr: NonNull<c_void>) -> (usize, *mut c_void) {
        let address = ptr.as_ptr() as usize;
        (address & TAG_MASK, (address & !TAG_MASK) as *mut c_void)
    }
}

// SAFETY: the tag is the variant, the rest the box's own address, which
// the alignment leaves free of the tag's bits.
unsafe impl<A: 'static, B: 'static, C: 'static> Stored for Tagged<A, B, C> {
    type Ref<'a> = TaggedRef<'a, A, B, C>;
    type Mut<'a> = TaggedMut<'a, A, B, C>;

    fn into_raw(self) -> NonNull<c_void> {
        let () = Self::ALIGNED;
        let (address, tag) = match self {
            Tagged::A(value) => (Box::into_raw(value) as usize, 0),
            Tagged::B(value) => (Box::into_raw(value) as usize, 1),
            Tagged::C(value) => (Box::into_raw(value) as usize, 2),
        };
        NonNull::new((address | tag) as *mut c_void).expect("a box is never null")
    }

    unsafe fn from_raw(ptr: NonNull<c_void>) -> Self {
        let (tag, address) = Self::split(ptr);
        // SAFETY, for each: the box `into_raw` made for this tag, given
        // back once.
        match tag {
            // SAFETY: see above.
            0 => Tagged::A(unsafe { Box::from_raw(address.cast()) }),
            // SAFETY: see above.
            1 => Tagged::B(unsafe { Box::from_raw(address.cast()) }),
            // SAFETY: see above.
            _ => Tagged::C(unsafe { Box::from_raw(address.cast()) }),
        }
    }

    unsafe fn borrow<'a>(ptr: NonNull<c_void>) -> TaggedRef<'a, A, B, C> {
        let (tag, address) = Self::split(ptr);
        match tag {
            // SAFETY: the live box of this tag, unchanged for `'a`.
            0 => TaggedRef::A(unsafe { &*address.cast() }),
            // SAFETY: as above.
            1 => TaggedRef::B(unsafe { &*address.cast() }),
            // SAFETY: as above.
            _ => TaggedRef::C(unsafe { &*address.cast() }),
        }
    }

    unsafe fn borrow_mut<'a>(ptr: NonNull<c_void>) -> TaggedMut<'a, A, B, C> {
        let (tag, address) = Self::split(ptr);
        match tag {
            // SAFETY: the live box of this tag, reached by nothing else
            // for `'a`.
            0 => TaggedMut::A(unsafe { &mut *address.cast() }),
            // SAFETY: as above.
            1 => TaggedMut::B(unsafe { &mut *address.cast() }),
            // SAFETY: as above.
            _ => TaggedMut::C(unsafe { &mut *address.cast() }),
        }
    }

    fn allocation_size(value: TaggedRef<'_, A, B, C>) -> usize {
        // SAFETY, for each: a view `borrow` made, so the box's own address.
        match value {
            // SAFETY: see above.
            TaggedRef::A(value) => unsafe { heap_size(value as *const A, 1) },
            // SAFETY: see above.
            TaggedRef::B(value) => unsafe { heap_size(value as *const B, 1) },
            // SAFETY: see above.
            TaggedRef::C(value) => unsafe { heap_size(value as *const C, 1) },
        }
    }
}

/// A module data type: its value and its callbacks, in safe Rust.
pub trait DataType: 'static {
    type Value: Stored;

    /// The registered type (a `static` made with [`methods`]).
    fn redis_type() -> &'static RedisType;
    /// Encoding version of its RDB payload; a newer one is refused on load.
    const ENCODING_VERSION: i32;
    /// What the log calls a payload of this type ("record").
    const WHAT: &'static CStr;
    /// The AOF rewrite's command, `COMMAND key blob`.
    const REWRITE_COMMAND: &'static CStr;

    /// Decodes an RDB payload. `loading`: the server's own data (RDB, AOF,
    /// a primary's full sync) rather than a client's `RESTORE`.
    fn load(bytes: &[u8], loading: bool) -> Option<Self::Value>;
    /// The RDB payload, also what `DEBUG DIGEST` hashes.
    fn save(value: <Self::Value as Stored>::Ref<'_>, out: &mut Vec<u8>);
    /// The AOF rewrite's blob (Redis appends the key's `PEXPIREAT`).
    fn rewrite(value: <Self::Value as Stored>::Ref<'_>) -> Vec<u8>;
    /// Bytes the value holds in allocations of its own, beyond the one
    /// Redis's pointer points at (see [`boxed_slice_size`], [`small_vec_size`]).
    fn mem_usage(value: <Self::Value as Stored>::Ref<'_>) -> usize;
    /// Redis's lazy-free effort units (above 64, freed in the background).
    fn free_effort(value: <Self::Value as Stored>::Ref<'_>) -> usize;
    /// `COPY`: an independent copy.
    fn copy(value: <Self::Value as Stored>::Ref<'_>) -> Self::Value;
}

/// The callbacks Redis calls for a [`DataType`].
pub const fn methods<T: DataType>() -> raw::RedisModuleTypeMethods {
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(rdb_load::<T>),
        rdb_save: Some(rdb_save::<T>),
        aof_rewrite: Some(aof_rewrite::<T>),
        mem_usage: Some(mem_usage::<T>),
        digest: Some(digest::<T>),
        free: Some(free::<T>),
        aux_load: None,
        aux_save: None,
        aux_save_triggers: 0,
        free_effort: Some(free_effort::<T>),
        unlink: None,
        copy: Some(copy::<T>),
        defrag: None,
        mem_usage2: None,
        free_effort2: None,
        unlink2: None,
        copy2: None,
        aux_save2: None,
    }
}

fn handle<T: DataType>() -> *mut raw::RedisModuleType {
    *T::redis_type().raw_type.borrow()
}

/// Size of Redis's `moduleValue` wrapper around a type's pointer.
const MODULE_VALUE_SIZE: usize = 16;

/// # Safety
/// `value` is a live value of `T`, for the length of the callback.
unsafe fn view<'a, T: DataType>(value: *const c_void) -> Option<<T::Value as Stored>::Ref<'a>> {
    // SAFETY: Redis passes values it got from this type's `into_raw`.
    NonNull::new(value as *mut c_void).map(|value| unsafe { T::Value::borrow(value) })
}

/// # Safety
/// Called by Redis with a valid `rdb` handle; module IO errors are handled
/// (`HANDLE_IO_ERRORS`), so a failed read returns an error, never aborts.
unsafe extern "C" fn rdb_load<T: DataType>(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    // SAFETY: the handle Redis passed to this callback.
    let Some(mut rdb) = (unsafe { Rdb::from_raw(rdb) }) else { return ptr::null_mut() };
    if encver > T::ENCODING_VERSION {
        rdb.log_refused(T::WHAT, c"encoding version newer than this module");
        return ptr::null_mut();
    }
    // A NULL value fails the load (RESTORE answers an error), as a
    // corrupt payload does.
    contained::<T, _>(c"rdb_load", ptr::null_mut(), || {
        let Some(buffer) = rdb.load_bytes() else { return ptr::null_mut() };
        match T::load(buffer.as_ref(), rdb.server_is_loading()) {
            Some(value) => value.into_raw().as_ptr(),
            None => {
                rdb.log_refused(T::WHAT, c"corrupt payload");
                ptr::null_mut()
            }
        }
    })
}

/// # Safety
/// `value` is a live value of `T`; `rdb` the callback's handle.
unsafe extern "C" fn rdb_save<T: DataType>(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    // SAFETY: the handle and value Redis passed to this callback.
    let (Some(mut rdb), Some(value)) = (unsafe { Rdb::from_raw(rdb) }, unsafe { view::<T>(value) }) else { return };
    // A value must be written, or the rest of the RDB (or the DUMP) is
    // misread: after a panic it is an empty payload, which loads refuse.
    let bytes = contained::<T, _>(c"rdb_save", Vec::new(), || {
        let mut bytes = Vec::new();
        T::save(value, &mut bytes);
        bytes
    });
    rdb.save_bytes(&bytes);
}

/// # Safety
/// `value` is a live value of `T`; `key` is its key name.
unsafe extern "C" fn aof_rewrite<T: DataType>(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    // SAFETY: the handle, key name and value Redis passed to this callback.
    let (Some(mut aof), Some(key), Some(value)) =
        (unsafe { Aof::from_raw(aof) }, unsafe { Arg::from_raw(key) }, unsafe { view::<T>(value) })
    else {
        return;
    };
    // After a panic the key is left out of the rewritten AOF, which stays
    // valid.
    if let Some(blob) = contained::<T, _>(c"aof_rewrite", None, || Some(T::rewrite(value))) {
        aof.emit_key_blob(T::REWRITE_COMMAND, key, &blob);
    }
}

/// # Safety
/// `value` is a live value of `T`.
unsafe extern "C" fn mem_usage<T: DataType>(value: *const c_void) -> usize {
    // SAFETY: the value Redis passed to this callback.
    let Some(value) = (unsafe { view::<T>(value) }) else { return 0 };
    contained::<T, _>(c"mem_usage", MODULE_VALUE_SIZE, || {
        MODULE_VALUE_SIZE + T::Value::allocation_size(value) + T::mem_usage(value)
    })
}

/// # Safety
/// `md` is a valid digest context; `value` a live value of `T`.
unsafe extern "C" fn digest<T: DataType>(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    // SAFETY: the digest and value Redis passed to this callback.
    let (Some(mut digest), Some(value)) = (unsafe { Digest::from_raw(md) }, unsafe { view::<T>(value) }) else {
        return;
    };
    // After a panic the value adds nothing to the digest.
    let bytes = contained::<T, _>(c"digest", Vec::new(), || {
        let mut bytes = Vec::new();
        T::save(value, &mut bytes);
        bytes
    });
    digest.add_sequence(&bytes);
}

/// May run on the lazy-free thread: no Redis API calls here.
///
/// # Safety
/// `value` is a live value of `T`, not used after this call.
unsafe extern "C" fn free<T: DataType>(value: *mut c_void) {
    if let Some(value) = NonNull::new(value) {
        // SAFETY: Redis frees each value once.
        let value = unsafe { T::Value::from_raw(value) };
        // A panic must not unwind into Redis; what was not freed leaks.
        // (No log: this may be the lazy-free thread.)
        let _ = catch_unwind(AssertUnwindSafe(|| drop(value)));
    }
}

/// # Safety
/// `value` is a live value of `T`.
unsafe extern "C" fn free_effort<T: DataType>(_key: *mut raw::RedisModuleString, value: *const c_void) -> usize {
    // SAFETY: the value Redis passed to this callback.
    let Some(value) = (unsafe { view::<T>(value) }) else { return 1 };
    contained::<T, _>(c"free_effort", 1, || T::free_effort(value))
}

/// # Safety
/// `value` is a live value of `T`.
unsafe extern "C" fn copy<T: DataType>(
    _from: *mut raw::RedisModuleString,
    _to: *mut raw::RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    // SAFETY: the value Redis passed to this callback.
    let Some(value) = (unsafe { view::<T>(value) }) else { return ptr::null_mut() };
    // NULL: COPY answers an error and creates nothing.
    contained::<T, _>(c"copy", ptr::null_mut(), || T::copy(value).into_raw().as_ptr())
}

/// Runs a callback's `work`, as commands, waiters and timers are run: a
/// panic must not unwind into Redis (which aborts the server). After one,
/// the callback returns `fallback`, the safest answer for it, and the
/// server log says which callback of which type panicked (the panic's own
/// message is on the server's stderr).
fn contained<T: DataType, R>(callback: &CStr, fallback: R, work: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(work)) {
        Ok(result) => result,
        Err(_) => {
            log_panic(callback, T::WHAT);
            fallback
        }
    }
}

/// Logs a callback's panic, without a context (a callback may have none);
/// logs nothing where Redis's API is missing (unit tests).
fn log_panic(callback: &CStr, what: &CStr) {
    // SAFETY: reads a function pointer Redis set once, before OnLoad.
    let Some(log) = (unsafe { raw::RedisModule_Log }) else { return };
    // SAFETY: a NULL context is allowed (the line is logged without the
    // module's name); a format with two `%s`, and two NUL-terminated
    // strings.
    unsafe {
        log(
            ptr::null_mut(),
            c"warning".as_ptr(),
            c"redis-idem: the %s callback of a %s panicked (a bug: please report it); see the server's stderr".as_ptr(),
            callback.as_ptr(),
            what.as_ptr(),
        )
    };
}

/// Bytes Redis's allocator holds for a boxed slice (none for an empty one:
/// an empty slice holds no allocation, and its dangling pointer must never
/// reach the allocator).
#[allow(clippy::borrowed_box, reason = "the box, not the slice, is what is allocated")]
pub fn boxed_slice_size<T>(value: &Box<[T]>) -> usize {
    // SAFETY: a box's own buffer of `len` elements.
    unsafe { heap_size(value.as_ptr(), value.len()) }
}

/// Bytes Redis's allocator holds for a box's value (none for a zero-sized
/// one, which holds no allocation).
#[allow(clippy::borrowed_box, reason = "the box, not the value, is what is allocated")]
pub fn boxed_size<T>(value: &Box<T>) -> usize {
    // SAFETY: a box's own allocation of one `T`.
    unsafe { heap_size(&**value as *const T, 1) }
}

/// Bytes Redis's allocator holds for a `SmallVec`'s buffer: none while
/// its contents are inline.
pub fn small_vec_size<A: smallvec::Array>(value: &smallvec::SmallVec<A>) -> usize {
    if !value.spilled() {
        return 0;
    }
    // SAFETY: a spilled `SmallVec`'s own heap buffer of `capacity`
    // elements.
    unsafe { heap_size(value.as_ptr(), value.capacity()) }
}

/// Bytes Redis's allocator holds for an allocation of `len` elements at
/// `ptr`: 0 for an empty one, which holds no allocation.
///
/// # Safety
/// With `len > 0` and a sized `T`, `ptr` is the start of a live allocation
/// of `len` elements made by the module's allocator (Redis's).
unsafe fn heap_size<T>(ptr: *const T, len: usize) -> usize {
    if len == 0 || size_of::<T>() == 0 {
        return 0;
    }
    // SAFETY: as the caller promises.
    unsafe { api!(RedisModule_MallocSize)(ptr as *mut c_void) }
}

/// A value of `T` under an open key, borrowed for as long as this lives,
/// with the key at hand to store a new value or set the expiry.
pub struct OpenValue<'k, 'a, T: DataType> {
    key: &'k mut Key<'a>,
    value: Option<<T::Value as Stored>::Mut<'k>>,
    _type: PhantomData<T>,
}

impl<'k, 'a, T: DataType> OpenValue<'k, 'a, T> {
    /// `Err(WRONGTYPE)` for a key of another type.
    pub fn open(key: &'k mut Key<'a>) -> Result<OpenValue<'k, 'a, T>, CmdError> {
        // SAFETY: a value of this type, made by its `into_raw`; it lives
        // while the key is open, and the open value's `&mut` on the key keeps
        // anything else from reaching it meanwhile.
        let value = key.module_value(handle::<T>())?.map(|value| unsafe { T::Value::borrow_mut(value) });
        Ok(OpenValue { key, value, _type: PhantomData })
    }

    pub fn value(&mut self) -> Option<&mut <T::Value as Stored>::Mut<'k>> {
        self.value.as_mut()
    }

    pub fn name(&self) -> Arg<'a> {
        self.key.name()
    }

    /// Milliseconds the key has to live, as PTTL counts them.
    pub fn pttl(&self) -> Millis {
        self.key.pttl()
    }

    /// Makes the key hold `value` (dropping the old one) until
    /// `expire_at` (`None`: no expiry).
    pub fn store(self, value: T::Value, expire_at: Option<Millis>) {
        let OpenValue { key, value: old, .. } = self;
        let had_value = old.is_some();
        // The borrow of the old value ends before it is freed.
        drop(old);
        if had_value {
            // Swaps the pointer alone, far cheaper than deleting the key.
            // SAFETY: the key holds a value of `T` (the open value found one),
            // and the new one is made by `T`'s `into_raw`.
            let old = unsafe { key.replace_module_value(handle::<T>(), value.into_raw().as_ptr()) };
            if let Some(old) = NonNull::new(old) {
                // SAFETY: the key's old value, now detached from it.
                drop(unsafe { T::Value::from_raw(old) });
            }
        } else {
            set_value::<T>(key, value);
        }
        key.set_expire_at(expire_at);
    }

    /// Keeps the value as changed in place, expiring at `expire_at`.
    pub fn keep(self, expire_at: Option<Millis>) {
        self.key.set_expire_at(expire_at);
    }
}

/// The value of `T` under an open key, for as long as the key is
/// borrowed; `Err(WRONGTYPE)` for another type.
pub fn value_mut<'k, T: DataType>(key: &'k mut Key<'_>) -> Result<Option<<T::Value as Stored>::Mut<'k>>, CmdError> {
    // SAFETY: as in `OpenValue::open`.
    Ok(key.module_value(handle::<T>())?.map(|value| unsafe { T::Value::borrow_mut(value) }))
}

/// Makes `key` hold `value`, freeing the old one through its type.
pub fn set_value<T: DataType>(key: &mut Key<'_>, value: T::Value) {
    // SAFETY: a value of `T` made by its `into_raw`, which `T`'s callbacks
    // expect.
    unsafe { key.set_module_value(handle::<T>(), value.into_raw().as_ptr()) };
}

/// The value of `T` a walk visits, if the key holds one.
pub fn visited_value<'k, T: DataType>(
    key: &'k super::background::VisitedKey<'_>,
) -> Option<<T::Value as Stored>::Ref<'k>> {
    // SAFETY: as in `OpenValue::open`; the scan only reads, for the visit.
    key.module_value(handle::<T>()).map(|value| unsafe { T::Value::borrow(value) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A type each of whose callbacks panics, as a bug in a decoder would.
    struct Panicking;

    static PANICKING_TYPE: RedisType = RedisType::new("idempanic", 1, methods::<Panicking>());

    impl DataType for Panicking {
        type Value = Box<u64>;
        const ENCODING_VERSION: i32 = 1;
        const WHAT: &'static CStr = c"test value";
        const REWRITE_COMMAND: &'static CStr = c"TEST.APPLY";

        fn redis_type() -> &'static RedisType {
            &PANICKING_TYPE
        }
        fn load(_bytes: &[u8], _loading: bool) -> Option<Box<u64>> {
            panic!("load")
        }
        fn save(_value: &u64, _out: &mut Vec<u8>) {
            panic!("save")
        }
        fn rewrite(_value: &u64) -> Vec<u8> {
            panic!("rewrite")
        }
        fn mem_usage(_value: &u64) -> usize {
            panic!("mem_usage")
        }
        fn free_effort(_value: &u64) -> usize {
            panic!("free_effort")
        }
        fn copy(_value: &u64) -> Box<u64> {
            panic!("copy")
        }
    }

    #[test]
    fn a_panic_gives_the_fallback_and_no_panic_the_result() {
        assert_eq!(contained::<Panicking, _>(c"test", 1, || panic!("a bug")), 1);
        assert_eq!(contained::<Panicking, _>(c"test", 1, || 2), 2);
    }

    /// Through the `extern "C"` callbacks Redis calls: a panic that
    /// unwound out of one would abort this test process, as it would the
    /// server.
    #[test]
    fn panicking_callbacks_answer_their_fallback_instead_of_aborting() {
        let value = Box::new(7_u64).into_raw().as_ptr();
        // SAFETY: a live value of the type, as Redis passes one; COPY's key
        // names are not read.
        let copied = unsafe { copy::<Panicking>(ptr::null_mut(), ptr::null_mut(), value) };
        assert!(copied.is_null(), "a panicking copy makes no value");
        // SAFETY: as above.
        assert_eq!(unsafe { free_effort::<Panicking>(ptr::null_mut(), value) }, 1);
        // SAFETY: as above, not used after.
        unsafe { free::<Panicking>(value) };
    }
}
