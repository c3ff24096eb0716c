//! The filter commands: parse arguments, run the filter from `bloom.rs`,
//! reply, and propagate the effect.
//!
//! Every write propagates as `IDEM.BF.APPLY key <header> item...`, the
//! header being the primary's time `now` (8 bytes, little-endian ms) and,
//! for a filter the write creates, its parameters and seed: "at `now`,
//! creating the filter from the header if the key is missing, drop the
//! shards that left the window and add these items". The filter is
//! deterministic given that time, so a replica, or an AOF replayed on a
//! later day, puts every item in the shard the primary chose and ends up
//! with the same bits. The time travels inside the header because
//! RM_Replicate turns a number argument into a string object of its own.

use crate::args::{ArgList, parse_options, require};
use crate::bloom::{
    BloomError, DAY, HOUR, ItemHash, MAX_BYTES, MAX_SUB_FILTERS, MAX_TOTAL_SUB_FILTERS, Params, ShardedBloom, codec,
};
use crate::bloom_type;
use crate::config;
use crate::limits;
use crate::metrics::{Metric, count};
use crate::record::Millis;
use crate::record::codec::Reader;
use crate::server::{Args, CmdError, CmdResult, Ctx, Key, KeyMode, RawString, string_bytes};

/// The error of a refused filter write, naming its cause.
fn bloom_error(error: BloomError) -> CmdError {
    match error {
        BloomError::Invalid(message) => CmdError::new(format!("ERR {message}")),
        BloomError::SizeLimit { needed, .. } if needed > MAX_BYTES => CmdError::new(format!(
            "ERR filter too large: it would need {needed} bytes, over the largest filter ({MAX_BYTES}); \
             lower its capacity or raise its error rate"
        )),
        BloomError::SizeLimit { needed, limit } => {
            CmdError::new(format!("ERR the filter would grow to {needed} bytes, over idem.bf-max-bytes ({limit})"))
        }
        BloomError::StackFull => CmdError::new(format!(
            "ERR filter full: the current shard already stacks {MAX_SUB_FILTERS} sub-filters; \
             reserve a larger capacity or EXPANSION"
        )),
        BloomError::TooManySubFilters => CmdError::new(format!(
            "ERR filter full: it would hold more than {MAX_TOTAL_SUB_FILTERS} sub-filters in all; \
             reserve a larger capacity or a shorter WINDOW"
        )),
    }
}

/// A filter about to be written: the key's own, or one to create.
pub enum Target<'k> {
    Existing(&'k mut ShardedBloom),
    Create(ShardedBloom),
}

impl Target<'_> {
    fn filter(&mut self) -> &mut ShardedBloom {
        match self {
            Target::Existing(filter) => filter,
            Target::Create(filter) => filter,
        }
    }

    /// `IDEM.BF.APPLY`'s header for a write at `now` that creates the
    /// filter: the time, then the parameters and seed a replica needs to
    /// create the same one. `None` for an existing filter, whose header is
    /// the time alone.
    fn create_header(&self, now: Millis) -> Option<Vec<u8>> {
        let Target::Create(filter) = self else { return None };
        let mut header = now.to_le_bytes().to_vec();
        codec::encode_params(&filter.params, filter.scheme, &filter.seed, &mut header);
        Some(header)
    }
}

/// A filter write checked and ready: nothing has changed yet.
pub struct Prepared<'k> {
    target: Target<'k>,
    /// Bytes of bit arrays the write will allocate.
    allocate: u64,
    /// Sub-filters it will add to an existing filter.
    new_sub_filters: u32,
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
/// A filter with no shard left in its window is gone for every command,
/// even while its key lingers (a user's TTL can outlast the window): a write
/// that `renew`s (one adding items, `RESERVE`, and their replicated effect)
/// replaces it with a new one, as on a missing key; a drop of old shards
/// (`renew` false) empties it, and the key is deleted.
fn prepare_target<'k>(
    key: &'k Key,
    count: usize,
    now: Millis,
    renew: bool,
    max_bytes: u64,
    create: impl FnOnce() -> Result<ShardedBloom, CmdError>,
) -> Result<Prepared<'k>, CmdError> {
    let target = match bloom_type::open(key)? {
        Some(filter) if !renew || is_alive(filter, now) => Target::Existing(filter),
        _ => Target::Create(create()?),
    };
    let (filter, new_bytes) = match &target {
        Target::Existing(filter) => (&**filter, 0),
        Target::Create(filter) => (filter, filter.bytes()),
    };
    let room = filter.check_room(count as u64, now, max_bytes).map_err(bloom_error)?;
    Ok(Prepared { target, allocate: new_bytes + room.allocate, new_sub_filters: room.sub_filters })
}

/// Whether any shard of `filter` is still in its window at `now`.
fn is_alive(filter: &ShardedBloom, now: Millis) -> bool {
    filter.shards.iter().any(|shard| filter.is_live(shard, now))
}

/// A write of no items to an existing filter, which drops the shards that
/// left the window (the background sweeper's).
pub fn prepare_drop(key: &Key, now: Millis) -> Result<Prepared<'_>, CmdError> {
    prepare_target(key, 0, now, false, MAX_BYTES, || Err(CmdError::Static(c"ERR no such filter")))
}

/// [`prepare_target`] for a client's write, which must also leave the
/// filter small enough to move (`proto-max-bulk-len`) and used memory
/// within `maxmemory`.
pub fn prepare<'k>(
    ctx: Ctx,
    key: &'k Key,
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
        let dumped = codec::encoded_len(filter) + existing + 64 * (prepared.new_sub_filters as u64 + 1);
        limits::check_value_size(ctx, dumped, "this write")?;
        limits::check_memory_for(ctx, prepared.allocate)?;
    }
    Ok(prepared)
}

/// A filter for a missing key, from the `idem.bf-*` configs.
pub fn from_configs(now: Millis) -> Result<ShardedBloom, CmdError> {
    ShardedBloom::new(config::default_filter(), rand::random(), now, config::bf_max_bytes()).map_err(bloom_error)
}

/// Adds `items` at `now` and stores the result; `on_item` hears, in order,
/// whether each item was new to the window. `true` when anything changed.
/// A filter left with no shard in its window is deleted: a filter key
/// never outlives its window, whatever TTL a user gave it.
fn add_at(key: &Key, prepared: Prepared, now: Millis, items: &[RawString], mut on_item: impl FnMut(bool)) -> bool {
    let mut target = prepared.target;
    let filter = target.filter();
    let items_before = filter.items();
    let mut changed = filter.drop_expired(now);
    for &item in items {
        let hash: ItemHash = filter.hash(string_bytes(item));
        // Room was checked for every item before anything changed.
        let new = filter.add(hash, now).expect("room was checked");
        on_item(new);
    }
    changed |= filter.items() != items_before;
    match target {
        Target::Create(filter) => {
            bloom_type::store(key, filter);
            true
        }
        Target::Existing(filter) if filter.shards.is_empty() => {
            key.delete();
            true
        }
        Target::Existing(filter) => {
            if changed {
                key.set_expire_at(filter.expire_at());
            }
            changed
        }
    }
}

/// Adds `items` to the filter prepared for them and propagates the effect.
pub fn add_and_propagate(
    ctx: Ctx,
    key: &Key,
    prepared: Prepared,
    now: Millis,
    items: &[RawString],
    on_item: impl FnMut(bool),
) {
    let created = prepared.target.create_header(now);
    if add_at(key, prepared, now, items, on_item) {
        let time = now.to_le_bytes();
        let header = created.as_deref().unwrap_or(&time);
        ctx.replicate_key_blob_items(c"IDEM.BF.APPLY", key.name(), header, items);
    }
}

/// IDEM.BF.RESERVE's parameters, checked; `window` is the default WINDOW.
pub fn parse_reserve<A: ArgList + ?Sized>(args: &A, window: u32) -> Result<Params, CmdError> {
    require(args, 4)?;
    let mut params =
        Params { error_rate: args.double(2)?, capacity: args.int(3)?.max(0) as u64, window, period: DAY, expansion: 2 };
    let to_u32 = |value: i64| u32::try_from(value).unwrap_or(0);
    parse_options(args, 4, &["WINDOW", "SHARD", "EXPANSION"], |option, value| {
        match option {
            0 => params.window = to_u32(args.int(value)?),
            1 => {
                let text = args.bytes(value);
                params.period = if text.eq_ignore_ascii_case(b"DAY") {
                    DAY
                } else if text.eq_ignore_ascii_case(b"HOUR") {
                    HOUR
                } else {
                    args.int(value)
                        .map_err(|_| CmdError::Static(c"ERR SHARD must be DAY, HOUR or a number of seconds >= 1"))?
                };
            }
            _ => params.expansion = to_u32(args.int(value)?),
        }
        Ok(())
    })?;
    params.check().map_err(bloom_error)?;
    Ok(params)
}

/// IDEM.BF.RESERVE key error_rate capacity [WINDOW n] [SHARD DAY|HOUR|seconds] [EXPANSION n]
pub fn reserve(ctx: Ctx, args: &Args) -> CmdResult {
    let now = ctx.now();
    let params = parse_reserve(args, config::default_filter().window)?;
    let key = ctx.open_key(args.raw(1), KeyMode::Write);
    let dead_filter = matches!(bloom_type::open(&key), Ok(Some(filter)) if !is_alive(filter, now));
    if !key.is_empty() && !dead_filter {
        return Err(CmdError::Static(c"ERR key already exists"));
    }
    let prepared = prepare(ctx, &key, 0, now, || {
        ShardedBloom::new(params, rand::random(), now, config::bf_max_bytes()).map_err(bloom_error)
    })?;
    add_and_propagate(ctx, &key, prepared, now, &[], |_| {});
    ctx.reply_simple(c"OK");
    Ok(())
}

fn add_items(ctx: Ctx, args: &Args, as_array: bool) -> CmdResult {
    let now = ctx.now();
    let items = args.raw_from(2);
    let key = ctx.open_key(args.raw(1), KeyMode::Write);
    let prepared = prepare(ctx, &key, items.len(), now, || from_configs(now))?;
    if as_array {
        ctx.reply_array(items.len());
    }
    add_and_propagate(ctx, &key, prepared, now, items, |new| {
        count(if new { Metric::BfAddNew } else { Metric::BfAddSeen });
        ctx.reply_int(new as i64);
    });
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
    let items = args.raw_from(2);
    let key = ctx.open_key(args.raw(1), KeyMode::Read);
    let filter = bloom_type::open(&key)?;
    if as_array {
        ctx.reply_array(items.len());
    }
    for &item in items {
        let hit = filter.as_ref().is_some_and(|filter| filter.contains(filter.hash(string_bytes(item)), now));
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
    let key = ctx.open_key(args.raw(1), KeyMode::Read);
    let filter = match bloom_type::open(&key)? {
        Some(filter) if is_alive(filter, now) => filter,
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
    let (now, create) = parse_apply_header(args.bytes(2))?;
    let items = args.raw_from(3);
    let key = ctx.open_key(args.raw(1), KeyMode::Write);
    // The primary sends creation parameters exactly when it made a new
    // filter: the key was missing or its filter gone.
    // A replica does what its primary did, whatever its own bf-max-bytes.
    let prepared = prepare_target(&key, items.len(), now, !create.is_empty(), MAX_BYTES, || {
        let mut input = Reader(create);
        let (params, scheme, seed) = codec::decode_params(&mut input)
            .map_err(|_| CmdError::Static(c"ERR IDEM.BF.APPLY on a missing filter needs valid parameters"))?;
        ShardedBloom::with_scheme(params, scheme, seed, now, MAX_BYTES).map_err(bloom_error)
    })?;
    add_at(&key, prepared, now, items, |_| {});
    // On a primary this reaches replicas and the AOF; on a replica, its
    // own AOF.
    ctx.replicate_verbatim();
    ctx.reply_simple(c"OK");
    Ok(())
}

/// The time and creation parameters of an `IDEM.BF.APPLY` header.
pub fn parse_apply_header(header: &[u8]) -> Result<(Millis, &[u8]), CmdError> {
    let invalid = || CmdError::Static(c"ERR invalid IDEM.BF.APPLY header");
    let (time, create) = header.split_first_chunk::<8>().ok_or_else(invalid)?;
    let now = Millis::from_le_bytes(*time);
    if now < 0 {
        return Err(invalid());
    }
    Ok((now, create))
}

/// IDEM.BF.LOAD key blob: a whole filter, as the AOF rewrite writes it.
/// Only from the primary or the AOF.
pub fn load(ctx: Ctx, args: &Args) -> CmdResult {
    ctx.require_primary_or_aof()?;
    // The AOF holds the server's own filters, as its rewrite wrote them.
    let filter = codec::decode_stored(args.bytes(2))
        .map_err(|e| CmdError::new(format!("ERR invalid IDEM.BF.LOAD payload: {}", e.0)))?;
    let key = ctx.open_key(args.raw(1), KeyMode::Write);
    bloom_type::open(&key)?;
    // The rewrite writes the key's own expiry after this command, and none
    // for a key without one: the filter's window is not this key's TTL.
    bloom_type::store_without_expiry(&key, filter);
    ctx.replicate_verbatim();
    ctx.reply_simple(c"OK");
    Ok(())
}
