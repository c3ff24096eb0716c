//! The batch commands `IDEM.MCLAIM`, `IDEM.MDONE` and `IDEM.MRELEASE`, and
//! their internal effect `IDEM.MAPPLY`: parse with `idem_core::record::batch`,
//! open each distinct key once, run the batch transition, reply one element
//! per key, store what was written and propagate it as one command.
//!
//! One `IDEM.MAPPLY blob key [key ...]` carries every record the call
//! wrote, each exactly as `IDEM.APPLY` would carry it (record and absolute
//! expiry): a replica or an AOF replay ends up with the records the same
//! single commands would have left. Dispatch, argument parsing and the
//! propagation are paid once per call, which is what makes a batch cheaper
//! per key than a pipeline of single commands.

use std::ffi::CStr;

use idem_core::args::ArgList;
use idem_core::error::{CmdError, CmdResult};
use idem_core::record::batch::{self, Batch, Command, Held};
use idem_core::record::codec::RECORD_OVERHEAD;
use idem_core::record::{ClaimReply, DoneReply, Millis, Record, Token};

use super::data_type::OpenRecord;
use crate::bloom::commands as bloom_commands;
use crate::bloom::data_type as bloom_data_type;
use crate::config;
use crate::host::blocking;
use crate::host::command::{ACCESS, CommandSpec, INCOMPLETE, KeyArg, KeyAt, OW, RO, RW, UPDATE, arg, command_entry};
use crate::host::{Arg, Args, Ctx, Key, KeyMode};
use crate::limits;
use crate::metrics::{Metric, count};

/// Tokens as `IDEM.CLAIM` draws them, 128 bits each from the thread's
/// CSPRNG, drawn for the whole call at once (one generator call, not one
/// a key): a call grants at most one token per key position.
struct Tokens {
    bytes: Vec<u8>,
    next: usize,
}

impl Tokens {
    fn for_keys(numkeys: usize) -> Tokens {
        let mut bytes = vec![0u8; numkeys * 16];
        rand::Rng::fill(&mut rand::rng(), &mut bytes[..]);
        Tokens { bytes, next: 0 }
    }

    fn next(&mut self) -> Token {
        match self.bytes.get(self.next..self.next + 16) {
            Some(drawn) => {
                self.next += 16;
                let mut token = [0u8; 16];
                token.copy_from_slice(drawn);
                Token(token)
            }
            // Never reached (one token per position at most); still a
            // fresh token rather than a panic.
            None => Token(rand::random()),
        }
    }
}

/// The distinct keys of a call, opened for writing, in first-occurrence
/// order, with each key position's index among them.
struct OpenKeys<'a> {
    positions: Vec<usize>,
    keys: Vec<Key<'a>>,
}

impl<'a> OpenKeys<'a> {
    fn open(ctx: Ctx<'a>, args: &Args<'a>, layout: batch::Layout) -> OpenKeys<'a> {
        let (positions, firsts) = batch::distinct(args, layout);
        let keys = firsts.iter().map(|&p| ctx.open_key(args.arg(layout.key(p)), KeyMode::Write)).collect();
        OpenKeys { positions, keys }
    }
}

/// Runs `transition` on the keys' records and returns its replies; then
/// stores every record written, propagates them as one `IDEM.MAPPLY`, and
/// returns the replies with the names of the keys that were written.
fn run_batch<R>(
    ctx: Ctx,
    open: OpenKeys<'_>,
    transition: impl FnOnce(&mut Batch<'_>) -> R,
    reply: impl FnOnce(&R, &mut Batch<'_>),
) -> R {
    let OpenKeys { positions, mut keys } = open;
    let names: Vec<Arg> = keys.iter().map(Key::name).collect();
    let mut slots: Vec<Result<OpenRecord, CmdError>> = keys.iter_mut().map(OpenRecord::open).collect();
    let held = slots.iter_mut().map(|slot| match slot {
        Ok(slot) => slot.record().map_or(Held::Absent, Held::Stored),
        Err(_) => Held::WrongType,
    });
    let mut batch = Batch::new(positions, held.collect::<Vec<_>>());
    let replies = transition(&mut batch);
    reply(&replies, &mut batch);
    let written: Vec<(usize, Millis)> = batch.written().collect();
    if !written.is_empty() {
        let mut effect = Vec::new();
        batch.effect(&mut effect);
        let written_names: Vec<Arg> = written.iter().map(|&(index, _)| names[index]).collect();
        ctx.replicate_blob_keys(c"IDEM.MAPPLY", &effect, &written_names);
    }
    let mut created: Vec<Option<Record>> = batch.keys.into_iter().map(|(held, _)| held.into_created()).collect();
    let mut written = written.into_iter().peekable();
    for (index, slot) in slots.into_iter().enumerate() {
        let (Ok(slot), Some(&(next, expire_at))) = (slot, written.peek()) else { continue };
        if next != index {
            continue;
        }
        written.next();
        match created[index].take() {
            Some(record) => slot.store_new(record, Some(expire_at)),
            None => slot.store_updated(expire_at),
        }
    }
    replies
}

/// Notifies `event` on each key position whose answer wrote, in order, as
/// the single commands would have; and wakes clients waiting on it when
/// `wake`.
fn notify_written(
    ctx: Ctx,
    args: &Args,
    layout: batch::Layout,
    wrote: impl Fn(usize) -> bool,
    event: &'static CStr,
    wake: bool,
) {
    for position in (0..layout.numkeys).filter(|&p| wrote(p)) {
        let name = args.arg(layout.key(position));
        ctx.notify(event, name);
        if wake {
            blocking::signal_ready(ctx, name);
        }
    }
}

/// IDEM.MCLAIM lease numkeys key [key ...] [PAYLOADS payload [payload ...]] [MAXTRIES n] [BLOOM filterkey] [OWNER name]
pub fn mclaim(ctx: Ctx, args: &Args) -> CmdResult {
    let now = ctx.now();
    let parsed = batch::parse_mclaim(args, now)?;
    let layout = parsed.layout;
    let open = OpenKeys::open(ctx, args, layout);
    // The filter is read once for the call; a filter key of another type
    // fails the call, as it fails an IDEM.CLAIM, before anything changes.
    let mut filter_key = parsed.bloom.map(|at| ctx.open_key(args.arg(at), KeyMode::Read));
    let filter = match filter_key.as_mut() {
        Some(key) => bloom_data_type::open(key)?,
        None => None,
    };
    let maybe_seen = |position: usize| {
        filter.as_ref().is_some_and(|filter| filter.contains(filter.hash(args.bytes(layout.key(position))), now))
    };
    let lifetimes = config::lifetimes();
    let mut tokens = Tokens::for_keys(layout.numkeys);
    let replies = run_batch(
        ctx,
        open,
        |batch| batch::mclaim(args, &parsed, batch, now, lifetimes, maybe_seen, || tokens.next()),
        |replies, batch| {
            ctx.reply_array(replies.len());
            for (position, reply) in replies.iter().enumerate() {
                match reply {
                    Ok(reply) => reply_claim(ctx, reply, batch.record_at(position).as_deref()),
                    Err(error) => ctx.reply_error(error),
                }
            }
        },
    );
    let claimed = |p: usize| {
        matches!(replies[p], Ok(ClaimReply::New { .. } | ClaimReply::Seen { .. } | ClaimReply::Retry { .. }))
    };
    notify_written(ctx, args, layout, claimed, c"idem.claim", false);
    Ok(())
}

/// One key's `[status, value, attempt]`, as `IDEM.CLAIM` answers it.
fn reply_claim(ctx: Ctx, reply: &ClaimReply, record: Option<&Record>) {
    ctx.reply_array(3);
    let attempt = match *reply {
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
            ctx.reply_optional_bulk(record.and_then(|record| record.result.as_deref()));
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
}

/// IDEM.DONE's bits for what a completing call could not store
/// (docs/commands.md, "IDEM.DONE").
const DONE_RESULT_DROPPED: i64 = 2;
const DONE_BLOOM_DROPPED: i64 = 4;

const STALE: CmdError = CmdError::Static(c"STALE the key was claimed again since this token's claim");

/// IDEM.MDONE numkeys key token [key token ...] [RESULTS result [result ...]] [RETAIN seconds] [BLOOM filterkey]
///
/// As IDEM.DONE, per key: a completion is never refused for memory; under a
/// full memory the results are dropped, and the filter add (one add of
/// every completed key) is best effort.
pub fn mdone(ctx: Ctx, args: &Args) -> CmdResult {
    let now = ctx.now();
    let parsed = batch::parse_mdone(args, now, config::retain())?;
    let layout = parsed.layout;
    let memory_full = ctx.memory_full();
    let max_result = config::max_result();
    let check_result = |result: &[u8]| limits::check_value_size(ctx, result.len() as u64 + RECORD_OVERHEAD, "RESULT");
    let open = OpenKeys::open(ctx, args, layout);
    let replies = run_batch(
        ctx,
        open,
        |batch| batch::mdone(args, &parsed, batch, now, max_result, !memory_full, check_result),
        |_, _| {},
    );
    let completed = |p: usize| matches!(replies[p], Ok(DoneReply::Completed));
    notify_written(ctx, args, layout, completed, c"idem.done", true);
    let mut dropped = 0;
    if memory_full && parsed.results.is_some() {
        dropped |= DONE_RESULT_DROPPED;
        limits::log_drop(ctx, "dropped the RESULTS of a completed IDEM.MDONE: used memory is over maxmemory");
    }
    let items: Vec<Arg> = (0..layout.numkeys).filter(|&p| completed(p)).map(|p| args.arg(layout.key(p))).collect();
    if let Some(filter_at) = parsed.bloom
        && !items.is_empty()
        && let Err(why) = bloom_commands::add_completed(ctx, args.arg(filter_at), &items, now, memory_full)
    {
        limits::log_drop(ctx, &format!("dropped the BLOOM add of a completed IDEM.MDONE: {}", why.message()));
        dropped |= DONE_BLOOM_DROPPED;
    }
    ctx.reply_array(replies.len());
    for reply in &replies {
        match reply {
            Ok(DoneReply::Completed) => {
                count(Metric::DoneCompleted);
                if dropped & DONE_RESULT_DROPPED != 0 {
                    count(Metric::DoneResultDropped);
                }
                if dropped & DONE_BLOOM_DROPPED != 0 {
                    count(Metric::DoneBloomDropped);
                }
                ctx.reply_int(1 | dropped);
            }
            Ok(DoneReply::AlreadyDone) => {
                count(Metric::DoneAlready);
                ctx.reply_int(0);
            }
            Ok(DoneReply::Stale) => {
                count(Metric::DoneStale);
                ctx.reply_error(&STALE);
            }
            Err(error) => ctx.reply_error(error),
        }
    }
    Ok(())
}

/// IDEM.MRELEASE numkeys key token [key token ...]
pub fn mrelease(ctx: Ctx, args: &Args) -> CmdResult {
    let now = ctx.now();
    let layout = batch::parse_mrelease(args)?;
    let open = OpenKeys::open(ctx, args, layout);
    let lifetimes = config::lifetimes();
    let replies = run_batch(ctx, open, |batch| batch::mrelease(args, layout, batch, now, lifetimes), |_, _| {});
    ctx.reply_array(replies.len());
    for reply in &replies {
        match reply {
            Ok(released) => {
                count(if *released { Metric::ReleaseOk } else { Metric::ReleaseMiss });
                ctx.reply_int(*released as i64);
            }
            Err(error) => ctx.reply_error(error),
        }
    }
    let released = |p: usize| matches!(replies[p], Ok(true));
    notify_written(ctx, args, layout, released, c"idem.release", true);
    Ok(())
}

/// IDEM.MAPPLY blob key [key ...]: stores records exactly as the primary's
/// batch wrote them. Internal, as IDEM.APPLY: only the primary's link and
/// AOF loading may send it. The whole blob is checked, and every key's
/// type, before any key changes.
pub fn mapply(ctx: Ctx, args: &Args) -> CmdResult {
    ctx.require_primary_or_aof()?;
    let records = batch::decode_effect(args.bytes(1), args.len() - 2)
        .map_err(|e| CmdError::new(format!("ERR invalid IDEM.MAPPLY payload: {}", e.0)))?;
    for index in 2..args.len() {
        OpenRecord::open(&mut ctx.open_key(args.arg(index), KeyMode::Read))?;
    }
    for (index, (record, expire_at)) in (2..args.len()).zip(records) {
        let mut key = ctx.open_key(args.arg(index), KeyMode::Write);
        OpenRecord::open(&mut key)?.store_new(record, expire_at);
        drop(key);
        blocking::signal_ready(ctx, args.arg(index));
    }
    ctx.replicate_verbatim();
    ctx.reply_simple(c"OK");
    Ok(())
}

/// Flags of the record keys and filter, as the single commands declare
/// theirs (src/record/commands.rs).
const CLAIM_RECORD: u32 = RW | ACCESS | UPDATE;
const CLAIM_FILTER: u32 = RO | ACCESS;
const DONE_RECORD: u32 = RW | UPDATE;
const DONE_FILTER: u32 = RW | UPDATE;
const RELEASE_RECORD: u32 = RW | UPDATE;

// The key-token pairs' count spec is declared incomplete: Redis (7.0 to
// 8.2 at least) reads `numkeys` of a keynum spec as a count of arguments,
// not of keys, when the keys are a step apart (Valkey reads it as keys),
// so it finds half the keys. Incomplete makes Redis ask the command.

/// Key positions for `getkeys-api`, from the parser's own walker.
fn keys_of(args: &Args, command: Command, record: u32, filter: u32) -> Vec<(usize, u32)> {
    let (keys, bloom) = batch::key_positions(args, command);
    keys.into_iter().map(|at| (at, record)).chain(bloom.map(|at| (at, filter))).collect()
}

fn mclaim_keys(args: &Args) -> Vec<(usize, u32)> {
    keys_of(args, Command::MClaim, CLAIM_RECORD, CLAIM_FILTER)
}

fn mdone_keys(args: &Args) -> Vec<(usize, u32)> {
    keys_of(args, Command::MDone, DONE_RECORD, DONE_FILTER)
}

fn mrelease_keys(args: &Args) -> Vec<(usize, u32)> {
    keys_of(args, Command::MRelease, RELEASE_RECORD, 0)
}

/// The batch commands as registered.
pub static COMMANDS: [CommandSpec; 4] = [
    CommandSpec {
        name: c"IDEM.MCLAIM",
        entry: command_entry!(mclaim, keys: mclaim_keys),
        args: &[
            arg::integer(c"lease"),
            arg::integer(c"numkeys"),
            arg::many(arg::key(c"key", 0)),
            arg::option(c"PAYLOADS", arg::block(c"payloads", &[arg::many(arg::string(c"payload"))])),
            arg::option(c"MAXTRIES", arg::integer(c"n")),
            arg::option(c"BLOOM", arg::key(c"filterkey", 1)),
            arg::option(c"OWNER", arg::string(c"name")),
        ],
        // deny-script (COMMAND INFO: noscript), as MDONE and MRELEASE:
        // Valkey 9.1 raises a reply with an
        // error element to a script as one error while the writes stand
        // (claims nobody holds a token for); refused in scripts everywhere.
        flags: c"write deny-oom deny-script getkeys-api",
        acl: "write slow",
        arity: -4,
        summary: c"Claims many keys in one call, each answered as IDEM.CLAIM would answer it; replies one [status, value, attempt] per key.",
        complexity: c"O(N) where N is the number of keys",
        keys: &[
            KeyArg { at: KeyAt::Counted { at: 2, step: 1 }, flags: CLAIM_RECORD },
            KeyArg { at: KeyAt::Option(c"BLOOM"), flags: CLAIM_FILTER | INCOMPLETE },
        ],
    },
    CommandSpec {
        name: c"IDEM.MDONE",
        entry: command_entry!(mdone, keys: mdone_keys),
        args: &[
            arg::integer(c"numkeys"),
            arg::many(arg::block(c"key_token", &[arg::key(c"key", 0), arg::string(c"token")])),
            arg::option(c"RESULTS", arg::block(c"results", &[arg::many(arg::string(c"result"))])),
            arg::option(c"RETAIN", arg::integer(c"seconds")),
            arg::option(c"BLOOM", arg::key(c"filterkey", 1)),
        ],
        // Not deny-oom, as IDEM.DONE: completing work must not fail on a
        // full memory. deny-script: as IDEM.MCLAIM.
        flags: c"write deny-script getkeys-api",
        acl: "write slow",
        arity: -4,
        summary: c"Completes many claims in one call, each answered as IDEM.DONE would answer it.",
        complexity: c"O(N) where N is the number of keys plus the size of the results",
        keys: &[
            KeyArg { at: KeyAt::Counted { at: 1, step: 2 }, flags: DONE_RECORD | INCOMPLETE },
            KeyArg { at: KeyAt::Option(c"BLOOM"), flags: DONE_FILTER | INCOMPLETE },
        ],
    },
    CommandSpec {
        name: c"IDEM.MRELEASE",
        entry: command_entry!(mrelease, keys: mrelease_keys),
        args: &[arg::integer(c"numkeys"), arg::many(arg::block(c"key_token", &[arg::key(c"key", 0), arg::string(c"token")]))],
        flags: c"write deny-script getkeys-api",
        acl: "write slow",
        arity: -4,
        summary: c"Gives up many live claims in one call, each answered as IDEM.RELEASE would answer it.",
        complexity: c"O(N) where N is the number of keys",
        keys: &[KeyArg { at: KeyAt::Counted { at: 1, step: 2 }, flags: RELEASE_RECORD | INCOMPLETE }],
    },
    CommandSpec {
        name: c"IDEM.MAPPLY",
        entry: command_entry!(mapply),
        args: &[arg::string(c"blob"), arg::many(arg::key(c"key", 0))],
        flags: c"write",
        acl: "write slow admin dangerous",
        arity: -3,
        summary: c"Internal: stores the records of a batch command exactly as the primary wrote them (replication and AOF).",
        complexity: c"O(N) where N is the size of the records",
        keys: &[KeyArg { at: KeyAt::Range { from: 2 }, flags: OW | UPDATE }],
    },
];
