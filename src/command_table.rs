//! Static command table: names, flags, arity, key specs and `COMMAND DOCS`
//! text, registered in one pass at load time.
//!
//! Redis 7.0 has no `RedisModule_SetCommandACLCategories`, so commands are
//! registered with the raw API rather than the crate's macros (which need
//! it), and arity and key specs are set with `RedisModule_SetCommandInfo`.

use std::ffi::{CStr, CString, c_int};
use std::mem::MaybeUninit;
use std::ptr;

use redis_module::raw;

use crate::args::ArgList;
use crate::server::{Args, Handler, RawCtx, RawString, api, dispatch};
use crate::{bloom_commands, commands};

type CommandFn = unsafe extern "C" fn(RawCtx, *mut RawString, c_int) -> c_int;

/// Where a key argument is.
enum KeyAt {
    /// Always at this position.
    Index(c_int),
    /// The argument after this option name, searched from position 3.
    /// Declared incomplete, since an earlier option's value may spell the
    /// name: Redis then asks the command itself (`getkeys-api`).
    Option(&'static CStr),
}

struct KeyArg {
    at: KeyAt,
    flags: u32,
}

const fn key(position: c_int, flags: u32) -> KeyArg {
    KeyArg { at: KeyAt::Index(position), flags }
}

struct CommandSpec {
    name: &'static CStr,
    entry: CommandFn,
    flags: &'static CStr,
    /// ACL categories, as a built-in of its kind has them (`@idem` is
    /// added where the server lets modules add a category).
    acl: &'static str,
    arity: c_int,
    summary: &'static CStr,
    complexity: &'static CStr,
    keys: &'static [KeyArg],
}

/// For `getkeys-api` commands: the positions of the record key and of the
/// `BLOOM` option's value, with their access flags, found by walking the
/// options in pairs so that a value spelling "BLOOM" is never taken for the
/// option.
fn record_and_bloom_keys(args: &Args, record: u32, bloom: u32) -> Vec<(usize, u32)> {
    let mut keys = vec![(1, record)];
    let mut index = 3;
    while index + 1 < args.len() {
        if args.bytes(index).eq_ignore_ascii_case(b"BLOOM") {
            keys.push((index + 1, bloom));
        }
        index += 2;
    }
    keys
}

const CLAIM_RECORD: u32 = RW | ACCESS | UPDATE;
/// CLAIM only reads the filter: a user with read access to it may claim.
const CLAIM_FILTER: u32 = RO | ACCESS;
const DONE_RECORD: u32 = RW | UPDATE;
/// DONE adds the record's key name to the filter (Redis allows one of
/// INSERT and UPDATE; adding to a filter is mostly the latter).
const DONE_FILTER: u32 = RW | UPDATE;

fn claim_keys(args: &Args) -> Vec<(usize, u32)> {
    record_and_bloom_keys(args, CLAIM_RECORD, CLAIM_FILTER)
}

fn done_keys(args: &Args) -> Vec<(usize, u32)> {
    record_and_bloom_keys(args, DONE_RECORD, DONE_FILTER)
}

/// A C entry point for a handler.
macro_rules! entry {
    ($handler:path) => {{
        extern "C" fn entry(ctx: RawCtx, argv: *mut RawString, argc: c_int) -> c_int {
            dispatch(ctx, argv, argc, $handler as Handler, None)
        }
        entry as CommandFn
    }};
    ($handler:path, keys: $keys:path) => {{
        extern "C" fn entry(ctx: RawCtx, argv: *mut RawString, argc: c_int) -> c_int {
            dispatch(ctx, argv, argc, $handler as Handler, Some($keys))
        }
        entry as CommandFn
    }};
}

use raw::{
    REDISMODULE_CMD_KEY_ACCESS as ACCESS, REDISMODULE_CMD_KEY_INCOMPLETE as INCOMPLETE,
    REDISMODULE_CMD_KEY_INSERT as INSERT, REDISMODULE_CMD_KEY_OW as OW, REDISMODULE_CMD_KEY_RO as RO,
    REDISMODULE_CMD_KEY_RW as RW, REDISMODULE_CMD_KEY_UPDATE as UPDATE,
};

const SINCE: &CStr = c"0.1.0";

fn table() -> [CommandSpec; 15] {
    [
        CommandSpec {
            name: c"IDEM.CLAIM",
            entry: entry!(commands::claim, keys: claim_keys),
            flags: c"write deny-oom fast getkeys-api",
            acl: "write fast",
            arity: -3,
            summary:
                c"Claims a key for processing: check, mark and lease in one step; replies [status, value, attempt].",
            complexity: c"O(1)",
            keys: const { &[key(1, CLAIM_RECORD), KeyArg { at: KeyAt::Option(c"BLOOM"), flags: CLAIM_FILTER | INCOMPLETE }] },
        },
        CommandSpec {
            name: c"IDEM.DONE",
            entry: entry!(commands::done, keys: done_keys),
            // Not deny-oom: completing work must not fail on a full memory
            // (what cannot be stored is dropped, see commands::done).
            flags: c"write getkeys-api",
            acl: "write slow",
            arity: -3,
            summary: c"Completes a claim and stores its result for replay by later claims.",
            complexity: c"O(N) where N is the size of the result",
            keys: const { &[key(1, DONE_RECORD), KeyArg { at: KeyAt::Option(c"BLOOM"), flags: DONE_FILTER | INCOMPLETE }] },
        },
        CommandSpec {
            name: c"IDEM.RELEASE",
            entry: entry!(commands::release),
            flags: c"write fast",
            acl: "write fast",
            arity: 3,
            summary: c"Gives up a live claim so that a retry can claim the key at once.",
            complexity: c"O(1)",
            keys: const { &[key(1, RW | UPDATE)] },
        },
        CommandSpec {
            name: c"IDEM.EXTEND",
            entry: entry!(commands::extend),
            flags: c"write fast",
            acl: "write fast",
            arity: 4,
            summary: c"Extends the lease of the current claim.",
            complexity: c"O(1)",
            keys: const { &[key(1, RW | UPDATE)] },
        },
        CommandSpec {
            name: c"IDEM.GET",
            entry: entry!(commands::get),
            flags: c"readonly fast",
            acl: "read fast",
            arity: 2,
            summary: c"Shows a record's state, attempt, times, result and fingerprint (never its token).",
            complexity: c"O(1)",
            keys: const { &[key(1, RO | ACCESS)] },
        },
        CommandSpec {
            name: c"IDEM.ONCE",
            entry: entry!(commands::once),
            flags: c"write deny-oom fast",
            acl: "write fast",
            arity: 3,
            summary: c"Marks a key done if it has no record, in one step, for consumers that need no lease.",
            complexity: c"O(1)",
            keys: const { &[key(1, RW | INSERT)] },
        },
        CommandSpec {
            name: c"IDEM.APPLY",
            entry: entry!(commands::apply),
            flags: c"write",
            acl: "write slow admin dangerous",
            arity: 3,
            summary: c"Internal: stores a record exactly as the primary wrote it (replication and AOF).",
            complexity: c"O(N) where N is the size of the record",
            keys: const { &[key(1, OW | UPDATE)] },
        },
        CommandSpec {
            name: c"IDEM.BF.RESERVE",
            entry: entry!(bloom_commands::reserve),
            flags: c"write deny-oom",
            acl: "write slow",
            arity: -4,
            summary: c"Creates a date-sharded Bloom filter: a shard per period, the last WINDOW shards remembered.",
            complexity: c"O(1)",
            keys: const { &[key(1, RW | INSERT)] },
        },
        CommandSpec {
            name: c"IDEM.BF.ADD",
            entry: entry!(bloom_commands::add),
            flags: c"write deny-oom fast",
            acl: "write fast",
            arity: 3,
            summary: c"Records an item in the current shard; replies 1 if the window had not seen it.",
            complexity: c"O(K x S): K hash functions, S shards in the window",
            keys: const { &[key(1, RW | ACCESS | UPDATE)] },
        },
        CommandSpec {
            name: c"IDEM.BF.MADD",
            entry: entry!(bloom_commands::madd),
            flags: c"write deny-oom",
            acl: "write slow",
            arity: -3,
            summary: c"Records items in the current shard; replies, for each, 1 if the window had not seen it.",
            complexity: c"O(N x K x S) for N items",
            keys: const { &[key(1, RW | ACCESS | UPDATE)] },
        },
        CommandSpec {
            name: c"IDEM.BF.EXISTS",
            entry: entry!(bloom_commands::exists),
            flags: c"readonly fast",
            acl: "read fast",
            arity: 3,
            summary: c"Replies 1 if the item may have been seen within the window, 0 if not.",
            complexity: c"O(K x S): K hash functions, S shards in the window",
            keys: const { &[key(1, RO | ACCESS)] },
        },
        CommandSpec {
            name: c"IDEM.BF.MEXISTS",
            entry: entry!(bloom_commands::mexists),
            flags: c"readonly",
            acl: "read slow",
            arity: -3,
            summary: c"Replies, for each item, 1 if it may have been seen within the window, 0 if not.",
            complexity: c"O(N x K x S) for N items",
            keys: const { &[key(1, RO | ACCESS)] },
        },
        CommandSpec {
            name: c"IDEM.BF.INFO",
            entry: entry!(bloom_commands::info),
            flags: c"readonly fast",
            acl: "read fast",
            arity: 2,
            summary: c"Shows a filter's parameters and its live shards.",
            complexity: c"O(S) for S shards",
            keys: const { &[key(1, RO)] },
        },
        CommandSpec {
            name: c"IDEM.BF.APPLY",
            entry: entry!(bloom_commands::apply),
            flags: c"write",
            acl: "write slow admin dangerous",
            arity: -3,
            summary: c"Internal: a filter write as the primary made it, at the primary's time (replication and AOF).",
            complexity: c"O(N x K x S) for N items",
            keys: const { &[key(1, RW | UPDATE)] },
        },
        CommandSpec {
            name: c"IDEM.BF.LOAD",
            entry: entry!(bloom_commands::load),
            flags: c"write",
            acl: "write slow admin dangerous",
            arity: 3,
            summary: c"Internal: stores a whole filter, as the AOF rewrite writes it.",
            complexity: c"O(N) where N is the size of the filter",
            keys: const { &[key(1, OW | UPDATE)] },
        },
    ]
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
    }
    spec.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE;
    spec.fk.range = raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_1 { lastkey: 0, keystep: 1, limit: 0 };
    spec
}

/// The module's own ACL category, `+@idem`, where the server lets modules
/// add one (Redis 7.4+, Valkey 8.1+). `false` where it cannot.
fn add_idem_category(ctx: RawCtx) -> bool {
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

/// Registers every command. `Err` names the one that failed.
pub fn register(ctx: RawCtx) -> Result<(), String> {
    let with_idem = add_idem_category(ctx);
    let version = raw::RedisModuleCommandInfoVersion {
        version: 1,
        sizeof_historyentry: size_of::<raw::RedisModuleCommandHistoryEntry>(),
        sizeof_keyspec: size_of::<raw::RedisModuleCommandKeySpec>(),
        sizeof_arg: size_of::<raw::RedisModuleCommandArg>(),
    };
    for spec in table() {
        let failed = || format!("redis-idem: cannot register {}", spec.name.to_string_lossy());
        let first_key = match spec.keys.first().map(|k| &k.at) {
            Some(KeyAt::Index(position)) => *position,
            _ => 0,
        };
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
        let command = unsafe { api!(RedisModule_GetCommand)(ctx, spec.name.as_ptr()) };
        let mut key_specs: Vec<_> = spec.keys.iter().map(key_spec).collect();
        key_specs.push(unsafe { MaybeUninit::zeroed().assume_init() });
        let info = raw::RedisModuleCommandInfo {
            version: &version,
            summary: spec.summary.as_ptr(),
            complexity: spec.complexity.as_ptr(),
            since: SINCE.as_ptr(),
            history: ptr::null_mut(),
            tips: ptr::null(),
            arity: spec.arity,
            key_specs: key_specs.as_mut_ptr(),
            args: ptr::null_mut(),
        };
        // Redis copies what it keeps; the table may go after this call.
        if command.is_null()
            || unsafe { api!(RedisModule_SetCommandInfo)(command, &info) } != raw::REDISMODULE_OK as c_int
        {
            return Err(failed());
        }
        set_acl_categories(command, spec.acl, with_idem).map_err(|()| failed())?;
    }
    Ok(())
}
