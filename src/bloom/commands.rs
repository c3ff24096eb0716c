//! The filter commands: parse arguments, run the filter from
//! `idem_core::bloom`, reply, and propagate the effect; and their rows of
//! the command table.
//!
//! Every write propagates as `IDEM.BF.APPLY key <header> item...` (see
//! `idem_core::bloom::Effect`): "at the primary's `now`,
//! creating the filter from the header if the key is missing, drop the
//! shards that left the window and add these items". The filter is
//! deterministic given that time, so a replica, or an AOF replayed on a
//! later day, puts every item in the shard the primary chose and ends up
//! with the same bits.

use std::ffi::CStr;

use idem_core::Millis;
use idem_core::args::ArgList;
use idem_core::bloom::{self, Answers, Effect, HardLimits, KeyChange, NewFilter, ShardedBloom, WhenGone, codec};
use idem_core::decode::Reader;
use idem_core::error::{CmdError, CmdResult};

use super::data_type;
use crate::config;
use crate::host::command::{ACCESS, ArgSpec, CommandSpec, INSERT, OW, RO, RW, UPDATE, arg, command_entry, key};
use crate::host::{Arg, Args, Ctx, Key, KeyMode};
use crate::limits::ServerLimits;
use crate::metrics::{Metric, count};

/// Keyspace events of the module class, on the filter's key (named as
/// RedisBloom's `bf.reserve` and `bf.add`).
pub const EVENT_RESERVE: &CStr = c"idem.bf.reserve";
/// An add of one item or many (`ADD`, `MADD`, a `DONE ... BLOOM`'s), or a
/// write that creates the filter to add to it.
pub const EVENT_ADD: &CStr = c"idem.bf.add";
/// The background sweeper dropped shards that left the window.
pub const EVENT_DROP: &CStr = c"idem.bf.drop";

/// The items of a write, as the core reads them.
fn item_bytes<'a>(items: &'a [Arg<'a>]) -> impl ExactSizeIterator<Item = &'a [u8]> {
    items.iter().map(|item| item.bytes())
}

/// A new filter from the `idem.bf-*` configs, for a write to a missing key.
fn from_configs() -> Result<NewFilter, CmdError> {
    Ok(NewFilter { params: config::default_filter(), seed: rand::random() })
}

/// Applies a write's [`KeyChange`] to `key`, propagates its effect as
/// `IDEM.BF.APPLY key <header> items...` and fires `event` on the key.
/// A write that changed nothing is neither propagated nor notified.
fn commit(ctx: Ctx, key: &mut Key<'_>, change: KeyChange, effect: Option<Effect>, items: &[Arg], event: &'static CStr) {
    change_key(key, change);
    if let Some(effect) = effect {
        ctx.replicate_key_blob_items(c"IDEM.BF.APPLY", key.name(), effect.header(), items);
        ctx.notify(event, key.name());
    }
}

/// Makes `key` what a write left it.
fn change_key(key: &mut Key<'_>, change: KeyChange) {
    match change {
        KeyChange::Store(filter) => data_type::store(key, filter),
        KeyChange::Delete => key.delete(),
        KeyChange::Updated { expire_at } => key.set_expire_at(expire_at),
        KeyChange::Unchanged => {}
    }
}

/// Counts each answer of an add.
fn count_adds(answers: &Answers) {
    for new in answers.iter() {
        count(if new { Metric::BfAddNew } else { Metric::BfAddSeen });
    }
}

/// IDEM.BF.RESERVE key error_rate capacity [WINDOW n] [SHARD DAY|HOUR|seconds] [EXPANSION n]
pub fn reserve(ctx: Ctx, args: &Args) -> CmdResult {
    let now = ctx.now();
    let params = bloom::parse_reserve(args, config::default_filter().window)?;
    let mut key = ctx.open_key(args.arg(1), KeyMode::Write);
    let dead_filter = matches!(data_type::open(&mut key), Ok(Some(filter)) if !filter.is_alive(now));
    if !key.is_empty() && !dead_filter {
        return Err(CmdError::Static(c"ERR key already exists"));
    }
    let create = WhenGone::Create(|| Ok(NewFilter { params, seed: rand::random() }));
    let (_, change, effect) = ShardedBloom::write(data_type::open(&mut key)?, create, [], now, &ServerLimits::of(ctx))?;
    commit(ctx, &mut key, change, effect, &[], EVENT_RESERVE);
    ctx.reply_simple(c"OK");
    Ok(())
}

fn add_items(ctx: Ctx, args: &Args, as_array: bool) -> CmdResult {
    let now = ctx.now();
    let items = args.from(2);
    let mut key = ctx.open_key(args.arg(1), KeyMode::Write);
    let create = WhenGone::Create(from_configs);
    let (answers, change, effect) =
        ShardedBloom::write(data_type::open(&mut key)?, create, item_bytes(items), now, &ServerLimits::of(ctx))?;
    if as_array {
        ctx.reply_array(items.len());
    }
    for new in answers.iter() {
        count(if new { Metric::BfAddNew } else { Metric::BfAddSeen });
        ctx.reply_int(new as i64);
    }
    commit(ctx, &mut key, change, effect, items, EVENT_ADD);
    Ok(())
}

/// IDEM.BF.ADD key item
pub fn add(ctx: Ctx, args: &Args) -> CmdResult {
    add_items(ctx, args, false)
}

/// IDEM.BF.MADD key item [item ...]
pub fn madd(ctx: Ctx, args: &Args) -> CmdResult {
    add_items(ctx, args, true)
}

/// `IDEM.DONE ... BLOOM filterkey`'s add (one item, or many for a batch):
/// the completed records' key names into the filter at `filter_key`,
/// created from the configs if missing. With `memory_full`, only an add
/// that allocates nothing goes ahead. `Err` says why the add was dropped,
/// with nothing changed in the filter.
pub fn add_completed(ctx: Ctx, filter_key: Arg, items: &[Arg], now: Millis, memory_full: bool) -> CmdResult {
    let mut key = ctx.open_key(filter_key, KeyMode::Write);
    let limits = if memory_full { ServerLimits::memory_full(ctx) } else { ServerLimits::of(ctx) };
    let create = WhenGone::Create(from_configs);
    let (answers, change, effect) =
        ShardedBloom::write(data_type::open(&mut key)?, create, item_bytes(items), now, &limits)?;
    count_adds(&answers);
    commit(ctx, &mut key, change, effect, items, EVENT_ADD);
    Ok(())
}

/// The sweeper's write: drops the shards of `key`'s filter that left the
/// window at `now` (the key is deleted when none is left).
pub fn drop_old_shards(ctx: Ctx, key: &mut Key<'_>, now: Millis) -> CmdResult {
    let (_, change, effect) = ShardedBloom::write(data_type::open(key)?, WhenGone::LEAVE, [], now, &HardLimits)?;
    commit(ctx, key, change, effect, &[], EVENT_DROP);
    Ok(())
}

/// Whether `item` may have been seen within the window of the filter at
/// `filter_key` (`CLAIM ... BLOOM`'s read): `false` for a missing key, and
/// with no item (a record exists: the filter is not asked), where only the
/// key's type is checked.
pub fn may_contain(ctx: Ctx, filter_key: Arg, item: Option<&[u8]>, now: Millis) -> Result<bool, CmdError> {
    let mut key = ctx.open_key(filter_key, KeyMode::Read);
    let filter = data_type::open(&mut key)?;
    Ok(item.is_some_and(|item| filter.is_some_and(|filter| filter.may_contain(item, now))))
}

fn exists_items(ctx: Ctx, args: &Args, as_array: bool) -> CmdResult {
    let now = ctx.now();
    let items = args.from(2);
    let mut key = ctx.open_key(args.arg(1), KeyMode::Read);
    let filter = data_type::open(&mut key)?;
    if as_array {
        ctx.reply_array(items.len());
    }
    for item in items {
        let hit = filter.as_ref().is_some_and(|filter| filter.may_contain(item.bytes(), now));
        count(if hit { Metric::BfExistsHit } else { Metric::BfExistsMiss });
        ctx.reply_int(hit as i64);
    }
    Ok(())
}

/// IDEM.BF.EXISTS key item
pub fn exists(ctx: Ctx, args: &Args) -> CmdResult {
    exists_items(ctx, args, false)
}

/// IDEM.BF.MEXISTS key item [item ...]
pub fn mexists(ctx: Ctx, args: &Args) -> CmdResult {
    exists_items(ctx, args, true)
}

/// IDEM.BF.INFO key: the live shards only; one that left the window but
/// was not dropped yet no longer counts.
pub fn info(ctx: Ctx, args: &Args) -> CmdResult {
    let now = ctx.now();
    let mut key = ctx.open_key(args.arg(1), KeyMode::Read);
    let filter = match data_type::open(&mut key)? {
        Some(filter) if filter.is_alive(now) => filter,
        // Missing, or with no shard left in its window: gone.
        _ => {
            ctx.reply_null();
            return Ok(());
        }
    };
    let live: Vec<_> = filter.shards.iter().filter(|shard| filter.is_live(shard, now)).collect();
    let params = &filter.params;
    ctx.reply_map(8);
    ctx.reply_simple(c"error_rate");
    ctx.reply_double(params.error_rate);
    ctx.reply_simple(c"capacity");
    ctx.reply_int(params.capacity as i64);
    ctx.reply_simple(c"window");
    ctx.reply_int(params.window as i64);
    ctx.reply_simple(c"shard");
    ctx.reply_int(params.period);
    ctx.reply_simple(c"expansion");
    ctx.reply_int(params.expansion as i64);
    ctx.reply_simple(c"items");
    ctx.reply_int(live.iter().map(|shard| shard.items()).sum::<u64>() as i64);
    ctx.reply_simple(c"bytes");
    ctx.reply_int(live.iter().map(|shard| shard.bytes()).sum::<u64>() as i64);
    ctx.reply_simple(c"shards");
    ctx.reply_array(live.len());
    for shard in live {
        ctx.reply_map(4);
        ctx.reply_simple(c"start");
        ctx.reply_int(shard.start);
        ctx.reply_simple(c"items");
        ctx.reply_int(shard.items() as i64);
        ctx.reply_simple(c"filters");
        ctx.reply_int(shard.filters.len() as i64);
        ctx.reply_simple(c"bytes");
        ctx.reply_int(shard.bytes() as i64);
    }
    Ok(())
}

/// IDEM.BF.APPLY key header item...: a write as the primary made it (see
/// the module comment). Only from the primary or the AOF; validated all the
/// same, since an AOF file can be damaged.
pub fn apply(ctx: Ctx, args: &Args) -> CmdResult {
    ctx.require_primary_or_aof()?;
    let (now, create) = codec::decode_effect_header(args.bytes(2))
        .map_err(|_| CmdError::Static(c"ERR invalid IDEM.BF.APPLY header"))?;
    let items = args.from(3);
    let mut key = ctx.open_key(args.arg(1), KeyMode::Write);
    let filter = data_type::open(&mut key)?;
    // The primary sends creation parameters exactly when it made a new
    // filter: the key was missing or its filter gone. A replica does what
    // its primary did, whatever its own limits.
    let when_gone = match create.is_empty() {
        true if filter.is_none() => {
            return Err(CmdError::Static(c"ERR IDEM.BF.APPLY on a missing filter needs valid parameters"));
        }
        true => WhenGone::Leave,
        false => WhenGone::Create(|| {
            let (params, seed) = codec::decode_params(&mut Reader(create))
                .map_err(|_| CmdError::Static(c"ERR IDEM.BF.APPLY on a missing filter needs valid parameters"))?;
            Ok(NewFilter { params, seed })
        }),
    };
    let (_, change, _) = ShardedBloom::write(filter, when_gone, item_bytes(items), now, &HardLimits)?;
    change_key(&mut key, change);
    // On a primary this reaches replicas and the AOF; on a replica, its
    // own AOF.
    ctx.replicate_verbatim();
    ctx.reply_simple(c"OK");
    Ok(())
}

/// IDEM.BF.LOAD key blob: a whole filter, as the AOF rewrite writes it.
/// Only from the primary or the AOF.
pub fn load(ctx: Ctx, args: &Args) -> CmdResult {
    ctx.require_primary_or_aof()?;
    let filter = codec::decode(args.bytes(2))
        .map_err(|e| CmdError::new(format!("ERR invalid IDEM.BF.LOAD payload: {}", e.0)))?;
    let mut key = ctx.open_key(args.arg(1), KeyMode::Write);
    data_type::open(&mut key)?;
    // The rewrite writes the key's own expiry after this command, and none
    // for a key without one: the filter's window is not this key's TTL.
    data_type::store_without_expiry(&mut key, filter);
    ctx.replicate_verbatim();
    ctx.reply_simple(c"OK");
    Ok(())
}

/// `SHARD DAY|HOUR|seconds`.
static SHARD_PERIODS: &[ArgSpec] =
    &[arg::keyword(c"day", c"DAY"), arg::keyword(c"hour", c"HOUR"), arg::integer(c"seconds")];

/// The filter commands as registered.
pub static COMMANDS: [CommandSpec; 8] = [
    CommandSpec {
        name: c"IDEM.BF.RESERVE",
        entry: command_entry!(reserve),
        flags: c"write deny-oom",
        acl: "write slow",
        arity: -4,
        summary: c"Creates a date-sharded Bloom filter: a shard per period, the last WINDOW shards remembered.",
        complexity: c"O(1)",
        keys: &[key(1, RW | INSERT)],
        args: &[
            arg::key(c"key", 0),
            arg::double(c"error_rate"),
            arg::integer(c"capacity"),
            // Both options' values are `n` in the docs; names stay unique.
            arg::option(c"WINDOW", arg::shown_as(c"n", arg::integer(c"window"))),
            arg::option(c"SHARD", arg::one_of(c"period", SHARD_PERIODS)),
            arg::option(c"EXPANSION", arg::shown_as(c"n", arg::integer(c"expansion"))),
        ],
    },
    CommandSpec {
        name: c"IDEM.BF.ADD",
        entry: command_entry!(add),
        flags: c"write deny-oom fast",
        acl: "write fast",
        arity: 3,
        summary: c"Records an item in the current shard; replies 1 if the window had not seen it.",
        complexity: c"O(K x S): K hash functions, S shards in the window",
        keys: &[key(1, RW | ACCESS | UPDATE)],
        args: &[arg::key(c"key", 0), arg::string(c"item")],
    },
    CommandSpec {
        name: c"IDEM.BF.MADD",
        entry: command_entry!(madd),
        flags: c"write deny-oom",
        acl: "write slow",
        arity: -3,
        summary: c"Records items in the current shard; replies, for each, 1 if the window had not seen it.",
        complexity: c"O(N x K x S) for N items",
        keys: &[key(1, RW | ACCESS | UPDATE)],
        args: &[arg::key(c"key", 0), arg::many(arg::string(c"item"))],
    },
    CommandSpec {
        name: c"IDEM.BF.EXISTS",
        entry: command_entry!(exists),
        flags: c"readonly fast",
        acl: "read fast",
        arity: 3,
        summary: c"Replies 1 if the item may have been seen within the window, 0 if not.",
        complexity: c"O(K x S): K hash functions, S shards in the window",
        keys: &[key(1, RO | ACCESS)],
        args: &[arg::key(c"key", 0), arg::string(c"item")],
    },
    CommandSpec {
        name: c"IDEM.BF.MEXISTS",
        entry: command_entry!(mexists),
        flags: c"readonly",
        acl: "read slow",
        arity: -3,
        summary: c"Replies, for each item, 1 if it may have been seen within the window, 0 if not.",
        complexity: c"O(N x K x S) for N items",
        keys: &[key(1, RO | ACCESS)],
        args: &[arg::key(c"key", 0), arg::many(arg::string(c"item"))],
    },
    CommandSpec {
        name: c"IDEM.BF.INFO",
        entry: command_entry!(info),
        flags: c"readonly fast",
        acl: "read fast",
        arity: 2,
        summary: c"Shows a filter's parameters and its live shards.",
        complexity: c"O(S) for S shards",
        keys: &[key(1, RO)],
        args: &[arg::key(c"key", 0)],
    },
    CommandSpec {
        name: c"IDEM.BF.APPLY",
        entry: command_entry!(apply),
        flags: c"write",
        acl: "write slow admin dangerous",
        arity: -3,
        summary: c"Internal: a filter write as the primary made it, at the primary's time (replication and AOF).",
        complexity: c"O(N x K x S) for N items",
        keys: &[key(1, RW | UPDATE)],
        args: &[arg::key(c"key", 0), arg::string(c"header"), arg::any(arg::string(c"item"))],
    },
    CommandSpec {
        name: c"IDEM.BF.LOAD",
        entry: command_entry!(load),
        flags: c"write",
        acl: "write slow admin dangerous",
        arity: 3,
        summary: c"Internal: stores a whole filter, as the AOF rewrite writes it.",
        complexity: c"O(N) where N is the size of the filter",
        keys: &[key(1, OW | UPDATE)],
        args: &[arg::key(c"key", 0), arg::string(c"blob")],
    },
];
