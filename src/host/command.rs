//! Command registration and dispatch. Each feature declares its commands
//! as a table of [`CommandSpec`] rows (name, flags, ACL categories, arity,
//! key specs, `COMMAND DOCS` text and argument tree) next to their
//! handlers; this registers them in one pass at load time and runs them.
//!
//! Redis 7.0 has no `RedisModule_SetCommandACLCategories`, so commands are
//! registered with the raw API rather than the crate's macros (which need
//! it), and arity and key specs are set with `RedisModule_SetCommandInfo`.

use std::ffi::{CStr, CString, c_int};
use std::mem::MaybeUninit;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr;

use idem_core::args::ArgList;
use idem_core::error::{CmdError, CmdResult};
use redis_module::raw;

use super::api;
use super::context::Ctx;
use super::key::Args;

pub use raw::{
    REDISMODULE_CMD_KEY_ACCESS as ACCESS, REDISMODULE_CMD_KEY_INCOMPLETE as INCOMPLETE,
    REDISMODULE_CMD_KEY_INSERT as INSERT, REDISMODULE_CMD_KEY_OW as OW, REDISMODULE_CMD_KEY_RO as RO,
    REDISMODULE_CMD_KEY_RW as RW, REDISMODULE_CMD_KEY_UPDATE as UPDATE,
};

/// A command's C entry point, made by [`command_entry!`].
pub type CommandFn = unsafe extern "C" fn(*mut raw::RedisModuleCtx, *mut *mut raw::RedisModuleString, c_int) -> c_int;

/// A command handler: runs the command on a call's context and arguments.
pub type Handler = fn(Ctx<'_>, &Args<'_>) -> CmdResult;

/// Key positions of a `getkeys-api` command's call, each with its key-spec
/// flags (`RW`, `ACCESS`...), which ACL checks read.
pub type KeyFinder = fn(&Args<'_>) -> Vec<(usize, u32)>;

/// Where a key argument is.
pub enum KeyAt {
    /// Always at this position.
    Index(c_int),
    /// The argument after this option name, searched from position 3.
    /// Declared incomplete, since an earlier option's value may spell the
    /// name: Redis then asks the command itself (`getkeys-api`).
    Option(&'static CStr),
    /// A count at this position, then that many keys, one every `step`
    /// arguments from the next one (`numkeys key [key ...]`, as `ZUNION`).
    Counted { at: c_int, step: c_int },
    /// Every argument from this position on.
    Range { from: c_int },
}

pub struct KeyArg {
    pub at: KeyAt,
    pub flags: u32,
}

/// A key always at `position`.
pub const fn key(position: c_int, flags: u32) -> KeyArg {
    KeyArg { at: KeyAt::Index(position), flags }
}

/// What an argument is, in `COMMAND DOCS`.
#[derive(Clone, Copy)]
pub enum ArgType {
    /// A key, found by the command's key spec of this index.
    Key(c_int),
    String,
    Integer,
    Double,
    /// A keyword standing alone (`DAY`): the argument's token.
    PureToken,
    /// Exactly one of these.
    OneOf(&'static [ArgSpec]),
    /// These, in order, as one argument (`key token` of a pair).
    Block(&'static [ArgSpec]),
}

/// One argument of a command, as `COMMAND DOCS` shows it: what redis-cli's
/// hints and client code generators read. Made with the functions of
/// [`arg`].
#[derive(Clone, Copy)]
pub struct ArgSpec {
    /// What the value is, e.g. `lease`: unique among its siblings, since
    /// code generators name parameters after it.
    pub name: &'static CStr,
    pub kind: ArgType,
    /// The keyword before the value (`PAYLOAD` in `PAYLOAD data`).
    pub token: Option<&'static CStr>,
    /// Shown instead of the name where the docs' syntax line says
    /// otherwise (Redis 7.2+, Valkey; Redis 7.0 shows the name).
    pub display: Option<&'static CStr>,
    pub optional: bool,
    /// Repeats: `item [item ...]`.
    pub multiple: bool,
}

/// Builders of [`ArgSpec`] for the command tables.
pub mod arg {
    use super::{ArgSpec, ArgType, CStr, c_int};

    const fn of(name: &'static CStr, kind: ArgType) -> ArgSpec {
        ArgSpec { name, kind, token: None, display: None, optional: false, multiple: false }
    }

    /// A key, declared by the command's key spec `spec` (its index in
    /// `CommandSpec::keys`).
    pub const fn key(name: &'static CStr, spec: c_int) -> ArgSpec {
        of(name, ArgType::Key(spec))
    }

    pub const fn string(name: &'static CStr) -> ArgSpec {
        of(name, ArgType::String)
    }

    pub const fn integer(name: &'static CStr) -> ArgSpec {
        of(name, ArgType::Integer)
    }

    pub const fn double(name: &'static CStr) -> ArgSpec {
        of(name, ArgType::Double)
    }

    /// A keyword alone, such as `DAY`.
    pub const fn keyword(name: &'static CStr, token: &'static CStr) -> ArgSpec {
        ArgSpec { token: Some(token), ..of(name, ArgType::PureToken) }
    }

    /// One of `choices`.
    pub const fn one_of(name: &'static CStr, choices: &'static [ArgSpec]) -> ArgSpec {
        of(name, ArgType::OneOf(choices))
    }

    /// `parts` as one argument, such as a pair repeated with [`many`].
    pub const fn block(name: &'static CStr, parts: &'static [ArgSpec]) -> ArgSpec {
        of(name, ArgType::Block(parts))
    }

    /// An option: `token` then `value`, which may be left out.
    pub const fn option(token: &'static CStr, value: ArgSpec) -> ArgSpec {
        ArgSpec { token: Some(token), optional: true, ..value }
    }

    /// `value`, once or more: `item [item ...]`.
    pub const fn many(value: ArgSpec) -> ArgSpec {
        ArgSpec { multiple: true, ..value }
    }

    /// `value`, any number of times, none included.
    pub const fn any(value: ArgSpec) -> ArgSpec {
        ArgSpec { optional: true, ..many(value) }
    }

    /// `value`, shown as `display` (where two options' values share the
    /// docs' name, such as `n`).
    pub const fn shown_as(display: &'static CStr, value: ArgSpec) -> ArgSpec {
        ArgSpec { display: Some(display), ..value }
    }
}

/// One command as registered.
pub struct CommandSpec {
    pub name: &'static CStr,
    pub entry: CommandFn,
    pub flags: &'static CStr,
    /// ACL categories, as a built-in of its kind has them (`@idem` is
    /// added where the server lets modules add a category).
    pub acl: &'static str,
    pub arity: c_int,
    pub summary: &'static CStr,
    pub complexity: &'static CStr,
    pub keys: &'static [KeyArg],
    /// The argument tree after the command name, in the docs' order.
    pub args: &'static [ArgSpec],
}

/// The version every command reports in `COMMAND DOCS`.
const SINCE: &CStr = c"0.1.0";

/// The C entry point of a [`Handler`], with its [`KeyFinder`] for a
/// `getkeys-api` command.
macro_rules! command_entry {
    ($handler:path) => {
        $crate::host::command::command_entry!(@entry $handler, None)
    };
    ($handler:path, keys: $keys:path) => {
        $crate::host::command::command_entry!(@entry $handler, Some($keys as $crate::host::command::KeyFinder))
    };
    (@entry $handler:path, $keys:expr) => {{
        #[allow(unsafe_code)]
        extern "C" fn entry(
            ctx: *mut redis_module::raw::RedisModuleCtx,
            argv: *mut *mut redis_module::raw::RedisModuleString,
            argc: std::ffi::c_int,
        ) -> std::ffi::c_int {
            // SAFETY: Redis calls a command's entry point with the call's
            // live context and its `argc` live arguments.
            unsafe { $crate::host::command::dispatch(ctx, argv, argc, $handler, $keys) }
        }
        entry as $crate::host::command::CommandFn
    }};
}
pub(crate) use command_entry;

/// Runs a command handler: replies its error, and turns a panic into an
/// error reply instead of taking the server down. For a `getkeys-api`
/// command, answers Redis's key-position request instead.
///
/// # Safety
/// `ctx` is the running command's context and `argv` its `argc` arguments,
/// as Redis passes them to a command's entry point.
pub unsafe fn dispatch(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
    handler: Handler,
    keys: Option<KeyFinder>,
) -> c_int {
    // SAFETY: as the caller promises; both live for this call.
    let (Some(ctx), args) = (unsafe { Ctx::from_raw(ctx) }, unsafe { Args::from_raw(argv, argc) }) else {
        return raw::REDISMODULE_ERR as c_int;
    };
    if let Some(keys) = keys
        // SAFETY: a live command context.
        && unsafe { api!(RedisModule_IsKeysPositionRequest)(ctx.as_ptr()) } != 0
    {
        // SAFETY: reading a function pointer Redis filled in at load.
        let with_flags = unsafe { raw::RedisModule_KeyAtPosWithFlags };
        let positions = key_positions_or_every_argument(|| keys(&args), args.len());
        if positions.is_none() {
            ctx.log_warning("redis-idem: finding a call's keys failed (a panic or a position past its arguments); every argument was reported as a key it writes");
        }
        for (position, flags) in positions.unwrap_or_else(|| every_argument_written(args.len())) {
            match with_flags {
                // SAFETY: a key-position request's context, a position
                // within argv.
                Some(key_at) => unsafe { key_at(ctx.as_ptr(), position as c_int, flags as c_int) },
                // SAFETY: as above.
                None => unsafe { api!(RedisModule_KeyAtPos)(ctx.as_ptr(), position as c_int) },
            }
        }
        return raw::REDISMODULE_OK as c_int;
    }
    match catch_unwind(AssertUnwindSafe(|| handler(ctx, &args))) {
        Ok(Ok(())) => {}
        Ok(Err(error)) => ctx.reply_error(&error),
        Err(_) => {
            ctx.log_warning("redis-idem: a command panicked; the call was answered with an error");
            ctx.reply_error(&CmdError::Static(c"ERR internal error in redis-idem, see the server log"));
        }
    }
    raw::REDISMODULE_OK as c_int
}

/// The key positions `find` gives, or None when it panicked. A panic must
/// not take the server down, nor answer "no keys": Redis would then skip
/// the call's ACL key checks and route it anywhere in a cluster.
fn key_positions_or_every_argument(find: impl FnOnce() -> Vec<(usize, u32)>, argc: usize) -> Option<Vec<(usize, u32)>> {
    catch_unwind(AssertUnwindSafe(find)).ok().filter(|positions| positions.iter().all(|&(p, _)| p > 0 && p < argc))
}

/// Fails closed: every argument after the command name as a key the call
/// reads and writes, so ACL asks for write access to each of them and a
/// cluster answers CROSSSLOT unless they all share a slot; the command
/// itself then answers its own error for the arguments.
fn every_argument_written(argc: usize) -> Vec<(usize, u32)> {
    (1..argc).map(|position| (position, RW | ACCESS | UPDATE)).collect()
}

fn key_spec(key: &KeyArg) -> raw::RedisModuleCommandKeySpec {
    // SAFETY: an all-zero key spec is valid (and terminates the list).
    let mut spec: raw::RedisModuleCommandKeySpec = unsafe { MaybeUninit::zeroed().assume_init() };
    spec.flags = key.flags as u64;
    match key.at {
        KeyAt::Index(position) => {
            spec.begin_search_type = raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
            spec.bs.index.pos = position;
        }
        KeyAt::Option(name) => {
            spec.begin_search_type = raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_KEYWORD;
            spec.bs.keyword =
                raw::RedisModuleCommandKeySpec__bindgen_ty_1__bindgen_ty_2 { keyword: name.as_ptr(), startfrom: 3 };
        }
        KeyAt::Counted { at, step } => {
            spec.begin_search_type = raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
            spec.bs.index.pos = at;
            spec.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_KEYNUM;
            spec.fk.keynum =
                raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_2 { keynumidx: 0, firstkey: 1, keystep: step };
            return spec;
        }
        KeyAt::Range { from } => {
            spec.begin_search_type = raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
            spec.bs.index.pos = from;
            spec.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE;
            spec.fk.range =
                raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_1 { lastkey: -1, keystep: 1, limit: 0 };
            return spec;
        }
    }
    spec.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE;
    spec.fk.range = raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_1 { lastkey: 0, keystep: 1, limit: 0 };
    spec
}

/// [`ArgSpec`]s as the C array Redis reads (ended by an all-zero entry),
/// with the arrays its `ONEOF`s point to, which must live as long.
struct CommandArgs {
    list: Vec<raw::RedisModuleCommandArg>,
    _choices: Vec<CommandArgs>,
}

impl CommandArgs {
    fn new(specs: &[ArgSpec]) -> CommandArgs {
        let mut choices = Vec::new();
        let mut list: Vec<_> = specs
            .iter()
            .map(|spec| {
                // SAFETY: an all-zero argument is valid: no strings, no
                // flags, no sub-arguments (and it ends a list).
                let mut arg: raw::RedisModuleCommandArg = unsafe { MaybeUninit::zeroed().assume_init() };
                arg.name = spec.name.as_ptr();
                arg.token = spec.token.map_or(ptr::null(), CStr::as_ptr);
                arg.display_text = spec.display.map_or(ptr::null(), CStr::as_ptr);
                arg.key_spec_index = -1;
                arg.flags = (if spec.optional { raw::REDISMODULE_CMD_ARG_OPTIONAL } else { 0 }
                    | if spec.multiple { raw::REDISMODULE_CMD_ARG_MULTIPLE } else { 0 })
                    as c_int;
                arg.type_ = match spec.kind {
                    ArgType::Key(index) => {
                        arg.key_spec_index = index;
                        raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY
                    }
                    ArgType::String => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING,
                    ArgType::Integer => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER,
                    ArgType::Double => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_DOUBLE,
                    ArgType::PureToken => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN,
                    ArgType::OneOf(specs) | ArgType::Block(specs) => {
                        // The inner list's buffer stays put when `sub`
                        // moves into `choices`.
                        let mut sub = CommandArgs::new(specs);
                        arg.subargs = sub.list.as_mut_ptr();
                        choices.push(sub);
                        match spec.kind {
                            ArgType::Block(_) => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_BLOCK,
                            _ => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_ONEOF,
                        }
                    }
                };
                arg
            })
            .collect();
        // SAFETY: as above; the all-zero entry ends the list.
        list.push(unsafe { MaybeUninit::zeroed().assume_init() });
        CommandArgs { list, _choices: choices }
    }
}

/// The module's own ACL category, `+@idem`, where the server lets modules
/// add one (Redis 7.4+, Valkey 8.1+). `false` where it cannot.
fn add_idem_category(ctx: *mut raw::RedisModuleCtx) -> bool {
    // SAFETY: reading a function pointer Redis filled in before OnLoad.
    let Some(add_category) = (unsafe { raw::RedisModule_AddACLCategory }) else {
        return false;
    };
    // SAFETY: called during OnLoad, as the API requires, with a valid
    // context and a NUL-terminated name.
    unsafe { add_category(ctx, c"idem".as_ptr()) == raw::REDISMODULE_OK as c_int }
}

/// Gives `command` its ACL categories where the server supports module
/// categories (Redis 7.2+, Valkey 8+). On Redis 7.0 there are none to
/// set: docs/operations.md gives the ACL rules that stand in for them.
fn set_acl_categories(command: *mut raw::RedisModuleCommand, categories: &str, with_idem: bool) -> Result<(), ()> {
    // SAFETY: reading a function pointer Redis filled in before OnLoad.
    let Some(set_categories) = (unsafe { raw::RedisModule_SetCommandACLCategories }) else {
        return Ok(());
    };
    let categories = if with_idem { format!("{categories} idem") } else { categories.to_owned() };
    let categories = CString::new(categories).map_err(|_| ())?;
    // SAFETY: `command` came from RedisModule_GetCommand during OnLoad;
    // Redis parses the string during the call and keeps no pointer to it.
    match unsafe { set_categories(command, categories.as_ptr()) } == raw::REDISMODULE_OK as c_int {
        true => Ok(()),
        false => Err(()),
    }
}

/// Registers every command of `tables`. `Err` names the one that failed.
/// Called once, from OnLoad.
pub fn register(ctx: Ctx<'_>, tables: &[&[CommandSpec]]) -> Result<(), String> {
    let ctx = ctx.as_ptr();
    let with_idem = add_idem_category(ctx);
    let version = raw::RedisModuleCommandInfoVersion {
        version: 1,
        sizeof_historyentry: size_of::<raw::RedisModuleCommandHistoryEntry>(),
        sizeof_keyspec: size_of::<raw::RedisModuleCommandKeySpec>(),
        sizeof_arg: size_of::<raw::RedisModuleCommandArg>(),
    };
    for spec in tables.iter().flat_map(|table| table.iter()) {
        let failed = || format!("redis-idem: cannot register {}", spec.name.to_string_lossy());
        let first_key = match spec.keys.first().map(|k| &k.at) {
            Some(KeyAt::Index(position)) => *position,
            _ => 0,
        };
        // SAFETY: OnLoad's context; NUL-terminated name and flags, which
        // Redis copies; an entry point that lives as long as the module.
        let status = unsafe {
            api!(RedisModule_CreateCommand)(
                ctx,
                spec.name.as_ptr(),
                Some(spec.entry),
                spec.flags.as_ptr(),
                first_key,
                first_key,
                1,
            )
        };
        if status != raw::REDISMODULE_OK as c_int {
            return Err(failed());
        }
        // SAFETY: OnLoad's context and the NUL-terminated name just
        // registered.
        let command = unsafe { api!(RedisModule_GetCommand)(ctx, spec.name.as_ptr()) };
        let mut key_specs: Vec<_> = spec.keys.iter().map(key_spec).collect();
        // SAFETY: an all-zero key spec is valid, and ends the list.
        key_specs.push(unsafe { MaybeUninit::zeroed().assume_init() });
        let mut args = CommandArgs::new(spec.args);
        let info = raw::RedisModuleCommandInfo {
            version: &version,
            summary: spec.summary.as_ptr(),
            complexity: spec.complexity.as_ptr(),
            since: SINCE.as_ptr(),
            history: ptr::null_mut(),
            tips: ptr::null(),
            arity: spec.arity,
            key_specs: key_specs.as_mut_ptr(),
            args: args.list.as_mut_ptr(),
        };
        // Redis copies what it keeps, argument strings included (module.c
        // `moduleCopyCommandArgs`); the arrays may go after this call.
        if command.is_null()
            // SAFETY: a command just registered, and an info whose
            // pointers live through the call.
            || unsafe { api!(RedisModule_SetCommandInfo)(command, &info) } != raw::REDISMODULE_OK as c_int
        {
            return Err(failed());
        }
        set_acl_categories(command, spec.acl, with_idem).map_err(|()| failed())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_finder_that_panics_reports_every_argument_as_written() {
        assert_eq!(key_positions_or_every_argument(|| panic!("a bug in a parser"), 4), None);
        assert_eq!(
            every_argument_written(4),
            vec![(1, RW | ACCESS | UPDATE), (2, RW | ACCESS | UPDATE), (3, RW | ACCESS | UPDATE)]
        );
    }

    #[test]
    fn a_key_finder_past_the_arguments_is_not_believed() {
        assert_eq!(key_positions_or_every_argument(|| vec![(1, RW), (2, RO)], 3), Some(vec![(1, RW), (2, RO)]));
        assert_eq!(key_positions_or_every_argument(|| vec![(3, RW)], 3), None);
        assert_eq!(key_positions_or_every_argument(|| vec![(0, RW)], 3), None);
    }
}
