//! Work the module does on its own, on Redis's main thread: a periodic
//! timer, and a walk of the keyspace a few keys at a time.

use std::cell::RefCell;
use std::ffi::{c_int, c_void};
use std::ptr::NonNull;

use redis_module::raw;

use super::api;
use super::context::Ctx;
use super::key::{Arg, TypeHandle};

/// A function run every `interval` ms.
pub struct Periodic {
    pub interval: i64,
    pub run: fn(Ctx<'_>),
}

thread_local! {
    /// Timers run on Redis's main thread: the periodic tasks, by index.
    static PERIODIC: RefCell<Vec<Periodic>> = const { RefCell::new(Vec::new()) };
}

/// Runs `task` every `task.interval` ms from now on. Called at load time.
pub fn every(ctx: Ctx<'_>, task: Periodic) {
    let interval = task.interval;
    let index = PERIODIC.with_borrow_mut(|tasks| {
        tasks.push(task);
        tasks.len() - 1
    });
    schedule(ctx.as_ptr(), interval, index);
}

fn schedule(ctx: *mut raw::RedisModuleCtx, interval: i64, index: usize) {
    // SAFETY: a live context; the timer's data is the task's index, not a
    // pointer.
    unsafe { api!(RedisModule_CreateTimer)(ctx, interval, Some(on_timer), index as *mut c_void) };
}

/// # Safety
/// Called by Redis on the main thread with a live context and the data
/// given to `RedisModule_CreateTimer`.
unsafe extern "C" fn on_timer(ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    let index = data as usize;
    let Some((interval, run)) = PERIODIC.with_borrow(|tasks| tasks.get(index).map(|task| (task.interval, task.run)))
    else {
        return;
    };
    // SAFETY: the timer's own context, used only during this call.
    if let Some(call) = unsafe { Ctx::from_raw(ctx) } {
        // A panic must not unwind into Redis; the task simply runs again
        // next time.
        let _ = std::panic::catch_unwind(|| run(call));
    }
    schedule(ctx, interval, index);
}

/// A key visited by a [`Walk`], for the length of its visit.
pub struct VisitedKey<'a> {
    raw: NonNull<raw::RedisModuleKey>,
    name: Arg<'a>,
}

impl<'a> VisitedKey<'a> {
    pub fn name(&self) -> &'a [u8] {
        self.name.bytes()
    }

    /// The value if the key holds one of `module_type`, as the pointer the
    /// type stored.
    pub fn module_value(&self, module_type: TypeHandle) -> Option<NonNull<c_void>> {
        // SAFETY: the scan's live key handle, only read.
        if unsafe { api!(RedisModule_ModuleTypeGetType)(self.raw.as_ptr()) } != module_type {
            return None;
        }
        // SAFETY: as above; the pointer is returned, not read.
        NonNull::new(unsafe { api!(RedisModule_ModuleTypeGetValue)(self.raw.as_ptr()) })
    }
}

/// A walk over every database's keys, resumed where it stopped.
pub struct Walk {
    cursor: NonNull<raw::RedisModuleScanCursor>,
    db: c_int,
}

impl Walk {
    pub fn new() -> Walk {
        // SAFETY: creates a cursor owned by this walk, never freed (the
        // walk lives as long as the module).
        let cursor = unsafe { api!(RedisModule_ScanCursorCreate)() };
        Walk { cursor: NonNull::new(cursor).expect("RedisModule_ScanCursorCreate returns a cursor"), db: 0 }
    }

    /// One `SCAN` step (about ten keys) of the current database: `visit`
    /// sees each key, and must not write (Redis forbids writes during a
    /// scan); `after` then runs outside the scan, in that database, to
    /// write. `false` when past the last database: the next step starts
    /// over at database 0.
    pub fn step<T>(
        &mut self,
        ctx: Ctx<'_>,
        mut visit: impl FnMut(&VisitedKey<'_>) -> Option<T>,
        after: impl FnOnce(Ctx<'_>, Vec<T>),
    ) -> bool {
        // SAFETY: a live context.
        if unsafe { api!(RedisModule_SelectDb)(ctx.as_ptr(), self.db) } != raw::REDISMODULE_OK as c_int {
            self.db = 0;
            return false;
        }
        let mut found = Vec::new();
        let mut visitor = |name: *mut raw::RedisModuleString, key: *mut raw::RedisModuleKey| {
            // SAFETY: the scan's name and key live for this visit.
            let (Some(name), Some(raw)) = (unsafe { Arg::from_raw(name) }, NonNull::new(key)) else { return };
            if let Some(item) = visit(&VisitedKey { raw, name }) {
                found.push(item);
            }
        };
        let mut visitor: &mut dyn FnMut(*mut raw::RedisModuleString, *mut raw::RedisModuleKey) = &mut visitor;
        // SAFETY: a live context and cursor; the data is the visitor above,
        // alive until Scan returns.
        let more = unsafe {
            api!(RedisModule_Scan)(
                ctx.as_ptr(),
                self.cursor.as_ptr(),
                Some(on_key),
                (&mut visitor as *mut &mut dyn FnMut(_, _)).cast(),
            )
        };
        after(ctx, found);
        if more == 0 {
            // SAFETY: the walk's own cursor.
            unsafe { api!(RedisModule_ScanCursorRestart)(self.cursor.as_ptr()) };
            self.db += 1;
        }
        true
    }
}

impl Default for Walk {
    fn default() -> Walk {
        Walk::new()
    }
}

type Visitor<'v> = &'v mut dyn FnMut(*mut raw::RedisModuleString, *mut raw::RedisModuleKey);

/// # Safety
/// Called by `RedisModule_Scan` with the data [`Walk::step`] gave it.
unsafe extern "C" fn on_key(
    _ctx: *mut raw::RedisModuleCtx,
    name: *mut raw::RedisModuleString,
    key: *mut raw::RedisModuleKey,
    data: *mut c_void,
) {
    // SAFETY: `data` points at the step's visitor, alive during the scan.
    let visitor = unsafe { &mut *(data as *mut Visitor<'_>) };
    visitor(name, key);
}
