//! The module's `INFO` section (`INFO idem`).

use std::cell::Cell;

use redis_module::raw;

use super::api;
use super::context::Ctx;

/// A source of `INFO` fields: calls its argument with each field's name and
/// value.
pub type Fields = fn(&mut dyn FnMut(&str, u64));

thread_local! {
    /// The fields' source, set once at load; INFO runs on the main thread.
    static FIELDS: Cell<Option<Fields>> = const { Cell::new(None) };
}

/// Makes `fields` the source of `INFO idem`: it calls its argument with
/// each field's name and value. Replaces the crate's default INFO
/// callback. Called once, from OnLoad.
pub fn register(ctx: Ctx<'_>, fields: Fields) {
    FIELDS.set(Some(fields));
    // SAFETY: OnLoad's live context and a callback with the signature
    // Redis expects.
    unsafe { api!(RedisModule_RegisterInfoFunc)(ctx.as_ptr(), Some(on_info)) };
}

/// # Safety
/// Called by Redis with a live info context.
unsafe extern "C" fn on_info(ctx: *mut raw::RedisModuleInfoCtx, _for_crash_report: i32) {
    let Some(fields) = FIELDS.get() else { return };
    raw::add_info_section(ctx, None);
    fields(&mut |name, value| {
        raw::add_info_field_unsigned_long_long(ctx, name, value);
    });
}
