//! The record commands: parse arguments, run the transition from
//! `record.rs` on the key's record, reply, and propagate the effect.
//!
//! Every write is propagated as one `IDEM.APPLY key blob` carrying the
//! record and its absolute expiry, never the command itself: replaying
//! `IDEM.CLAIM` on a replica or from the AOF would draw another token and
//! read another clock.

use std::ffi::CStr;

use crate::args::{ArgList, parse_options, require, seconds_arg};
use crate::config;
use crate::limits;
use crate::metrics::{Metric, count};
use crate::record::{self, ClaimArgs, ClaimReply, DoneReply, Millis, Token, Write};
use crate::record_type::{self, Slot};
use crate::server::{Args, CmdError, CmdResult, Ctx, KeyMode};
use crate::{bloom_commands, bloom_type};

/// 128 bits from the thread's CSPRNG (seeded from the OS, reseeded
/// periodically): unique across keys, restarts and primaries without any
/// coordination.
fn new_token() -> Token {
    Token(rand::random())
}

/// Issued tokens are exactly 32 hex digits; anything longer is not a token.
fn token_arg<A: ArgList + ?Sized>(args: &A, index: usize) -> Result<Option<Token>, CmdError> {
    let text = args.bytes(index);
    if text.len() > Token::HEX_LEN {
        return Err(CmdError::Static(c"ERR invalid token"));
    }
    Ok(Token::from_hex(text))
}

/// The `BLOOM filterkey` option's value index, refused when it names the
/// record's own key.
fn bloom_key<A: ArgList + ?Sized>(args: &A, value: usize) -> Result<Option<usize>, CmdError> {
    if args.bytes(value) == args.bytes(1) {
        return Err(CmdError::Static(c"ERR the BLOOM filter must be another key than the record"));
    }
    Ok(Some(value))
}

/// Stores a transition's write, propagates it and notifies `event`.
fn commit(ctx: Ctx, mut slot: Slot, write: Write, event: &'static CStr) {
    let key = slot.key();
    match write {
        Write::None => return,
        // Redis copies the blob when it is replicated, before the command
        // ends and the effect is propagated.
        Write::Update { expire_at } => {
            let record = slot.record().expect("an updated record exists");
            record_type::with_effect_blob(record, Some(expire_at), |blob| {
                ctx.replicate_key_blob(c"IDEM.APPLY", key.name(), blob)
            });
            slot.store_updated(expire_at);
        }
        Write::Create { record, expire_at } => {
            record_type::with_effect_blob(&record, Some(expire_at), |blob| {
                ctx.replicate_key_blob(c"IDEM.APPLY", key.name(), blob)
            });
            record_type::store_new(key, record, Some(expire_at));
        }
    }
    ctx.notify(event, key.name());
}

/// IDEM.CLAIM's arguments: the claim, and the index of the `BLOOM`
/// filter key if given.
pub fn parse_claim<A: ArgList + ?Sized>(args: &A, now: Millis) -> Result<(ClaimArgs, Option<usize>), CmdError> {
    require(args, 3)?;
    let mut claim = ClaimArgs { lease: seconds_arg(args, 2, now)?, ..ClaimArgs::default() };
    let mut bloom = None;
    parse_options(args, 3, &["PAYLOAD", "MAXTRIES", "BLOOM"], |option, value| {
        match option {
            0 => claim.fingerprint = Some(record::fingerprint(args.bytes(value))),
            1 => {
                let max = args.int(value)?;
                if max < 1 {
                    return Err(CmdError::Static(c"ERR MAXTRIES must be a positive integer"));
                }
                claim.max_tries = Some(max as u64);
            }
            _ => bloom = bloom_key(args, value)?,
        }
        Ok(())
    })?;
    Ok((claim, bloom))
}

/// IDEM.CLAIM key lease [PAYLOAD data] [MAXTRIES n] [BLOOM filterkey]
pub fn claim(ctx: Ctx, args: &Args) -> CmdResult {
    let now = ctx.now();
    let (mut claim, bloom) = parse_claim(args, now)?;
    let key = ctx.open_key(args.raw(1), KeyMode::Write);
    let mut slot = Slot::open(&key)?;
    if let Some(filter_key) = bloom {
        // Only a missing record consults the filter: "may have completed
        // within its window" turns NEW into SEEN.
        let filter_key = ctx.open_key(args.raw(filter_key), KeyMode::Read);
        let filter = bloom_type::open(&filter_key)?;
        claim.maybe_seen =
            slot.record().is_none() && filter.is_some_and(|filter| filter.contains(filter.hash(args.bytes(1)), now));
    }
    let (reply, write) = record::claim(slot.record(), &claim, now, config::lifetimes(), new_token);
    ctx.reply_array(3);
    let attempt = match reply {
        ClaimReply::New { token } | ClaimReply::Seen { token } => {
            let seen = matches!(reply, ClaimReply::Seen { .. });
            count(if seen { Metric::ClaimSeen } else { Metric::ClaimNew });
            ctx.reply_simple(if seen { c"SEEN" } else { c"NEW" });
            ctx.reply_bulk(&token.to_hex());
            1
        }
        ClaimReply::Retry { token, attempt } => {
            count(Metric::ClaimRetry);
            ctx.reply_simple(c"RETRY");
            ctx.reply_bulk(&token.to_hex());
            attempt
        }
        ClaimReply::Mismatch { attempt } => {
            count(Metric::ClaimMismatch);
            ctx.reply_simple(c"MISMATCH");
            ctx.reply_null();
            attempt
        }
        ClaimReply::Done { attempt } => {
            count(Metric::ClaimDone);
            ctx.reply_simple(c"DONE");
            let result = slot.record().and_then(|record| record.result.as_deref());
            ctx.reply_optional_bulk(result);
            attempt
        }
        ClaimReply::Busy { lease_left, attempt } => {
            count(Metric::ClaimBusy);
            ctx.reply_simple(c"BUSY");
            ctx.reply_int(lease_left);
            attempt
        }
        ClaimReply::Exhausted { attempt } => {
            count(Metric::ClaimExhausted);
            ctx.reply_simple(c"EXHAUSTED");
            ctx.reply_null();
            attempt
        }
    };
    ctx.reply_int(attempt as i64);
    commit(ctx, slot, write, c"idem.claim");
    Ok(())
}

/// IDEM.DONE's arguments, checked.
pub struct DoneArgs<'a> {
    pub token: Option<Token>,
    pub result: Option<&'a [u8]>,
    pub retain: Millis,
    /// Index of the `BLOOM` filter key.
    pub bloom: Option<usize>,
}

pub fn parse_done<A: ArgList + ?Sized>(args: &A, now: Millis, max_result: usize) -> Result<DoneArgs<'_>, CmdError> {
    require(args, 3)?;
    let mut done = DoneArgs { token: token_arg(args, 2)?, result: None, retain: config::retain(), bloom: None };
    parse_options(args, 3, &["RESULT", "RETAIN", "BLOOM"], |option, value| {
        match option {
            0 => {
                let bytes = args.bytes(value);
                if bytes.len() > max_result {
                    return Err(CmdError::new(format!(
                        "ERR RESULT is larger than idem.max-result ({max_result} bytes)"
                    )));
                }
                done.result = Some(bytes);
            }
            1 => done.retain = seconds_arg(args, value, now)?,
            _ => done.bloom = bloom_key(args, value)?,
        }
        Ok(())
    })?;
    Ok(done)
}

/// IDEM.DONE's reply when it completed the record: `1`, plus these bits
/// for what could not be stored (docs/commands.md).
const DONE_RESULT_DROPPED: i64 = 2;
const DONE_BLOOM_DROPPED: i64 = 4;

/// IDEM.DONE key token [RESULT value] [RETAIN seconds] [BLOOM filterkey]
///
/// Completed work must never come back as a redo: once the token is known
/// to hold the claim, the record is completed whatever else fails. The
/// RESULT (under a full memory) and the filter add (a full filter, a
/// filter key of another type, a full memory) are best effort: dropped,
/// counted, logged and told in the reply, never an error.
pub fn done(ctx: Ctx, args: &Args) -> CmdResult {
    let now = ctx.now();
    let DoneArgs { token, result, retain, bloom } = parse_done(args, now, config::max_result())?;
    if let Some(result) = result {
        limits::check_value_size(ctx, result.len() as u64 + limits::RECORD_OVERHEAD, "RESULT")?;
    }
    let key = ctx.open_key(args.raw(1), KeyMode::Write);
    let mut slot = Slot::open(&key)?;
    let memory_full = ctx.memory_full();
    let kept_result = if memory_full { None } else { result };
    let (reply, write) = record::done(slot.record(), token, kept_result, retain, now);
    match reply {
        DoneReply::Completed => count(Metric::DoneCompleted),
        DoneReply::AlreadyDone => {
            count(Metric::DoneAlready);
            ctx.reply_int(0);
            return Ok(());
        }
        DoneReply::Stale => {
            count(Metric::DoneStale);
            return Err(CmdError::Static(c"STALE the key was claimed again since this token's claim"));
        }
    }
    commit(ctx, slot, write, c"idem.done");
    let mut completed = 1;
    if result.is_some() && kept_result.is_none() {
        count(Metric::DoneResultDropped);
        limits::log_drop(ctx, "dropped the RESULT of a completed IDEM.DONE: used memory is over maxmemory");
        completed |= DONE_RESULT_DROPPED;
    }
    if let Some(filter_index) = bloom {
        if let Err(why) = add_completed_to_filter(ctx, args, filter_index, now, memory_full) {
            count(Metric::DoneBloomDropped);
            limits::log_drop(ctx, &format!("dropped the BLOOM add of a completed IDEM.DONE: {}", why.message()));
            completed |= DONE_BLOOM_DROPPED;
        }
    }
    ctx.reply_int(completed);
    Ok(())
}

/// Adds a completed record's key name to its `BLOOM` filter: `Err` says
/// why the add was dropped, with nothing changed in the filter.
fn add_completed_to_filter(ctx: Ctx, args: &Args, filter_index: usize, now: Millis, memory_full: bool) -> CmdResult {
    let filter_key = ctx.open_key(args.raw(filter_index), KeyMode::Write);
    let item = [args.raw(1)];
    let prepared = bloom_commands::prepare(ctx, &filter_key, item.len(), now, || bloom_commands::from_configs(now))?;
    // Under a full memory only an add that allocates nothing goes ahead.
    if memory_full && prepared.allocates() {
        return Err(CmdError::Static(c"OOM the filter needs memory and used memory is over maxmemory"));
    }
    bloom_commands::add_and_propagate(ctx, &filter_key, prepared, now, &item, |new| {
        count(if new { Metric::BfAddNew } else { Metric::BfAddSeen });
    });
    Ok(())
}

/// IDEM.RELEASE key token
pub fn release(ctx: Ctx, args: &Args) -> CmdResult {
    let now = ctx.now();
    let token = token_arg(args, 2)?;
    let key = ctx.open_key(args.raw(1), KeyMode::Write);
    let mut slot = Slot::open(&key)?;
    let (released, write) = record::release(slot.record(), token, now, config::lifetimes());
    count(if released { Metric::ReleaseOk } else { Metric::ReleaseMiss });
    ctx.reply_int(released as i64);
    commit(ctx, slot, write, c"idem.release");
    Ok(())
}

/// IDEM.EXTEND key token lease
pub fn extend(ctx: Ctx, args: &Args) -> CmdResult {
    let now = ctx.now();
    let token = token_arg(args, 2)?;
    let lease = seconds_arg(args, 3, now)?;
    let key = ctx.open_key(args.raw(1), KeyMode::Write);
    let mut slot = Slot::open(&key)?;
    let (extended, write) = record::extend(slot.record(), token, lease, now, config::lifetimes());
    if extended.is_err() {
        count(Metric::ExtendStale);
        return Err(CmdError::Static(c"STALE this token does not hold the claim"));
    }
    count(Metric::ExtendOk);
    ctx.reply_int(1);
    commit(ctx, slot, write, c"idem.extend");
    Ok(())
}

/// IDEM.ONCE key retain
pub fn once(ctx: Ctx, args: &Args) -> CmdResult {
    let now = ctx.now();
    let retain = seconds_arg(args, 2, now)?;
    let key = ctx.open_key(args.raw(1), KeyMode::Write);
    let mut slot = Slot::open(&key)?;
    let (created, write) = record::once(slot.record().as_deref(), retain, now);
    count(if created { Metric::OnceNew } else { Metric::OnceExists });
    ctx.reply_int(created as i64);
    commit(ctx, slot, write, c"idem.done");
    Ok(())
}

/// IDEM.GET key
pub fn get(ctx: Ctx, args: &Args) -> CmdResult {
    let now = ctx.now();
    let key = ctx.open_key(args.raw(1), KeyMode::Read);
    let mut slot = Slot::open(&key)?;
    let Some(record) = slot.record() else {
        ctx.reply_null();
        return Ok(());
    };
    ctx.reply_map(8);
    ctx.reply_simple(c"state");
    ctx.reply_simple(match record.state_at(now) {
        record::State::Processing => c"processing",
        record::State::Expired => c"expired",
        record::State::Released => c"released",
        record::State::Done => c"done",
    });
    ctx.reply_simple(c"attempt");
    ctx.reply_int(record.attempt as i64);
    ctx.reply_simple(c"lease_ms");
    ctx.reply_int(record.lease_left(now));
    ctx.reply_simple(c"pttl");
    ctx.reply_int(key.pttl());
    ctx.reply_simple(c"claimed_at");
    ctx.reply_int(record.claimed_at);
    ctx.reply_simple(c"done_at");
    ctx.reply_int(record.done_at);
    ctx.reply_simple(c"result");
    ctx.reply_optional_bulk(record.result.as_deref());
    ctx.reply_simple(c"fingerprint");
    match record.fingerprint {
        Some(fingerprint) => ctx.reply_bulk(format!("{fingerprint:032x}").as_bytes()),
        None => ctx.reply_null(),
    }
    Ok(())
}

/// IDEM.APPLY key blob: stores a record exactly as the primary wrote it.
/// Replicas and AOF replay receive every write as this command; clients may
/// not send it. The blob is still fully validated: an AOF file can be
/// damaged.
pub fn apply(ctx: Ctx, args: &Args) -> CmdResult {
    ctx.require_primary_or_aof()?;
    let (record, expire_at) = record_type::decode_effect(args.bytes(2))?;
    let key = ctx.open_key(args.raw(1), KeyMode::Write);
    Slot::open(&key)?;
    record_type::store_new(&key, record, expire_at);
    // On a primary this reaches replicas and the AOF; on a replica, its own
    // AOF (sub-replicas get the primary's stream as it is).
    ctx.replicate_verbatim();
    ctx.reply_simple(c"OK");
    Ok(())
}
