//! The filter commands: parse arguments, run the filter from
//! `idem_core::bloom`, reply, and propagate the effect; and their rows of
//! the command table.
//!
//! Every write propagates as `IDEM.BF.APPLY key <header> item...` (see
//! `idem_core::bloom::codec::effect_header`): "at the primary's `now`,
//! creating the filter from the header if the key is missing, drop the
//! shards that left the window and add these items". The filter is
//! deterministic given that time, so a replica, or an AOF replayed on a
//! later day, puts every item in the shard the primary chose and ends up
//! with the same bits.

use std::ffi::CStr;

use idem_core::Millis;
use idem_core::args::ArgList;
use idem_core::bloom::{self, MAX_BYTES, Room, ShardedBloom, codec};
use idem_core::decode::Reader;
use idem_core::error::{CmdError, CmdResult};

use super::data_type;
use crate::config;
use crate::host::command::{ACCESS, ArgSpec, CommandSpec, INSERT, OW, RO, RW, UPDATE, arg, command_entry, key};
use crate::host::{Arg, Args, Ctx, Key, KeyMode};
use crate::limits;
use crate::metrics::{Metric, count};

/// Keyspace events of the module class, on the filter's key (named as
/// RedisBloom's `bf.reserve` and `bf.add`).
pub const EVENT_RESERVE: &CStr = c"idem.bf.reserve";
/// An add of one item or many (`ADD`, `MADD`, a `DONE ... BLOOM`'s), or a
/// write that creates the filter to add to it.
pub const EVENT_ADD: &CStr = c"idem.bf.add";
/// The background sweeper dropped shards that left the window.
pub const EVENT_DROP: &CStr = c"idem.bf.drop";

/// A filter about to be written: the key's own, or one to create.
enum Target<'k> {
    Existing(&'k mut ShardedBloom),
    Create(ShardedBloom),
}

/// A filter write checked and ready: nothing has changed yet.
pub struct Prepared<'k> {
    target: Target<'k>,
    /// The plan the filter checked, which the add executes.
    room: Room,
    /// Bytes of bit arrays the write will allocate (a new filter's
    /// included).
    allocate: u64,
}

impl Prepared<'_> {
    /// Whether the write needs memory: a new filter, shard or sub-filter.
    pub fn allocates(&self) -> bool {
        self.allocate > 0
    }
}

/// The filter at `key`, ready for `count` more items at `now`: the key's
/// own or, for a missing key, a new one from `create`. Checks type and room
/// and changes nothing, so a refused write leaves the key as it was.
/// Replicated writes (`IDEM.BF.APPLY`) take this path alone: a replica does
/// what its primary did.
///
/// A filter with no shard left in its window is gone for every command
/// (see `ShardedBloom::is_alive`): a write that `renew`s (one adding items,
/// `RESERVE`, and their replicated effect) replaces it with a new one, as
/// on a missing key; a drop of old shards (`renew` false) empties it, and
/// the key is deleted.
fn prepare_target<'k>(
    key: &'k mut Key<'_>,
    count: usize,
    now: Millis,
    renew: bool,
    max_bytes: u64,
    create: impl FnOnce() -> Result<ShardedBloom, CmdError>,
) -> Result<Prepared<'k>, CmdError> {
    let target = match data_type::open(key)? {
        Some(filter) if !renew || filter.is_alive(now) => Target::Existing(filter),
        _ => Target::Create(create()?),
    };
    let (filter, new_bytes) = match &target {
        Target::Existing(filter) => (&**filter, 0),
        Target::Create(filter) => (filter, filter.bytes()),
    };
    let room = filter.check_room(count as u64, now, max_bytes)?;
    Ok(Prepared { allocate: new_bytes + room.allocate, room, target })
}

/// A write of no items to an existing filter, which drops the shards that
/// left the window (the background sweeper's).
pub fn prepare_drop<'k>(key: &'k mut Key<'_>, now: Millis) -> Result<Prepared<'k>, CmdError> {
    prepare_target(key, 0, now, false, MAX_BYTES, || Err(CmdError::Static(c"ERR no such filter")))
}

/// [`prepare_target`] for a client's write, which must also leave the
/// filter small enough to move (`proto-max-bulk-len`) and used memory
/// within `maxmemory`.
pub fn prepare<'k>(
    ctx: Ctx,
    key: &'k mut Key<'_>,
    count: usize,
    now: Millis,
    create: impl FnOnce() -> Result<ShardedBloom, CmdError>,
) -> Result<Prepared<'k>, CmdError> {
    let prepared = prepare_target(key, count, now, true, config::bf_max_bytes(), create)?;
    if prepared.allocates() {
        let (filter, existing) = match &prepared.target {
            Target::Existing(filter) => (&**filter, prepared.allocate),
            Target::Create(filter) => (filter, prepared.allocate - filter.bytes()),
        };
        // The filter's encoding after the write, as DUMP wraps it: 64 bytes
        // cover each new sub-filter's and shard's headers (52) and the DUMP
        // envelope (31).
        let dumped = codec::encoded_len(filter) + existing + 64 * (prepared.room.sub_filters as u64 + 1);
        limits::check_value_size(ctx, dumped, "this write")?;
        limits::check_memory_for(ctx, prepared.allocate)?;
    }
    Ok(prepared)
}

/// A filter for a missing key, from the `idem.bf-*` configs.
pub fn from_configs(now: Millis) -> Result<ShardedBloom, CmdError> {
    Ok(ShardedBloom::new(config::default_filter(), rand::random(), now, config::bf_max_bytes())?)
}

/// What a write leaves for its key, to [`commit`].
pub enum KeyChange {
    /// A new filter to store.
    Store(ShardedBloom),
    /// The filter was left with no shard in its window: a filter key never
    /// outlives its window, whatever TTL a user gave it.
    Delete,
    /// The filter changed in place and now expires then.
    Expire(Option<Millis>),
    Unchanged,
}

/// Adds `items` at `now` as prepared; `on_item` hears, in order, whether
/// each item was new to the window. The key's own change follows with
/// [`commit`] (or, for a replicated write, [`change_key`]).
pub fn add_prepared(prepared: Prepared, now: Millis, items: &[Arg], mut on_item: impl FnMut(bool)) -> KeyChange {
    let Prepared { mut target, mut room, .. } = prepared;
    let filter = match &mut target {
        Target::Existing(filter) => &mut **filter,
        Target::Create(filter) => filter,
    };
    let items_before = filter.items();
    let dropped = filter.drop_expired(now);
    for item in items {
        let hash = filter.hash(item.bytes());
        on_item(filter.add_planned(&mut room, hash, now));
    }
    let changed = dropped || filter.items() != items_before;
    match target {
        Target::Create(filter) => KeyChange::Store(filter),
        Target::Existing(filter) if filter.shards.is_empty() => KeyChange::Delete,
        Target::Existing(filter) if changed => KeyChange::Expire(filter.expire_at()),
        Target::Existing(_) => KeyChange::Unchanged,
    }
}

/// Applies a write's [`KeyChange`]; `true` when the key changed.
fn change_key(key: &mut Key<'_>, change: KeyChange) -> bool {
    match change {
        KeyChange::Store(filter) => data_type::store(key, filter),
        KeyChange::Delete => key.delete(),
        KeyChange::Expire(at) => key.set_expire_at(at),
        KeyChange::Unchanged => return false,
    }
    true
}

/// Applies the change a write of `items` at `now` made to `key`'s filter,
/// propagates the write and fires `event` on the key. A write that changed
/// nothing (every item already in the current shard) is neither
/// propagated nor notified, as `SADD` of a member already there.
pub fn commit(ctx: Ctx, key: &mut Key<'_>, change: KeyChange, now: Millis, items: &[Arg], event: &'static CStr) {
    let header = match &change {
        KeyChange::Store(filter) => codec::effect_header(now, Some(filter)),
        _ => Vec::new(),
    };
    if change_key(key, change) {
        let time = now.to_le_bytes();
        let header = if header.is_empty() { &time[..] } else { &header };
        ctx.replicate_key_blob_items(c"IDEM.BF.APPLY", key.name(), header, items);
        ctx.notify(event, key.name());
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
    let prepared =
        prepare(ctx, &mut key, 0, now, || Ok(ShardedBloom::new(params, rand::random(), now, config::bf_max_bytes())?))?;
    let change = add_prepared(prepared, now, &[], |_| {});
    commit(ctx, &mut key, change, now, &[], EVENT_RESERVE);
    ctx.reply_simple(c"OK");
    Ok(())
}

fn add_items(ctx: Ctx, args: &Args, as_array: bool) -> CmdResult {
    let now = ctx.now();
    let items = args.from(2);
    let mut key = ctx.open_key(args.arg(1), KeyMode::Write);
    let prepared = prepare(ctx, &mut key, items.len(), now, || from_configs(now))?;
    if as_array {
        ctx.reply_array(items.len());
    }
    let change = add_prepared(prepared, now, items, |new| {
        count(if new { Metric::BfAddNew } else { Metric::BfAddSeen });
        ctx.reply_int(new as i64);
    });
    commit(ctx, &mut key, change, now, items, EVENT_ADD);
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

fn exists_items(ctx: Ctx, args: &Args, as_array: bool) -> CmdResult {
    let now = ctx.now();
    let items = args.from(2);
    let mut key = ctx.open_key(args.arg(1), KeyMode::Read);
    let filter = data_type::open(&mut key)?;
    if as_array {
        ctx.reply_array(items.len());
    }
    for item in items {
        let hit = filter.as_ref().is_some_and(|filter| filter.contains(filter.hash(item.bytes()), now));
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
    ctx.reply_int(live.iter().map(|shard| shard.items).sum::<u64>() as i64);
    ctx.reply_simple(c"bytes");
    ctx.reply_int(live.iter().map(|shard| shard.bytes()).sum::<u64>() as i64);
    ctx.reply_simple(c"shards");
    ctx.reply_array(live.len());
    for shard in live {
        ctx.reply_map(4);
        ctx.reply_simple(c"start");
        ctx.reply_int(shard.start);
        ctx.reply_simple(c"items");
        ctx.reply_int(shard.items as i64);
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
    // The primary sends creation parameters exactly when it made a new
    // filter: the key was missing or its filter gone. A replica does what
    // its primary did, whatever its own bf-max-bytes.
    let prepared = prepare_target(&mut key, items.len(), now, !create.is_empty(), MAX_BYTES, || {
        let mut input = Reader(create);
        let (params, scheme, seed) = codec::decode_params(&mut input)
            .map_err(|_| CmdError::Static(c"ERR IDEM.BF.APPLY on a missing filter needs valid parameters"))?;
        Ok(ShardedBloom::with_scheme(params, scheme, seed, now, MAX_BYTES)?)
    })?;
    let change = add_prepared(prepared, now, items, |_| {});
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
    // The AOF holds the server's own filters, as its rewrite wrote them.
    let filter = codec::decode_stored(args.bytes(2))
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
