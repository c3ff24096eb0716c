//! The record commands: parse arguments, run the transition from
//! `idem_core::record` on the key's record, reply, and propagate the
//! effect; and their rows of the command table.
//!
//! Every write is propagated as one `IDEM.APPLY key blob` carrying the
//! record and its absolute expiry, never the command itself: replaying
//! `IDEM.CLAIM` on a replica or from the AOF would draw another token and
//! read another clock.

use std::ffi::CStr;

use idem_core::args::{ArgList, seconds_arg};
use idem_core::error::{CmdError, CmdResult};
use idem_core::record::codec::{self as record_codec, RECORD_OVERHEAD};
use idem_core::record::{self, ClaimArgs, ClaimReply, DoneArgs, DoneReply, Millis, Token, Write, token_arg};

use super::data_type::{self, OpenRecord};
use crate::bloom::commands as bloom_commands;
use crate::config;
use crate::host::blocking::{self, Waiter, Wake};
use crate::host::command::{
    ACCESS, CommandSpec, INCOMPLETE, INSERT, KeyArg, KeyAt, OW, RO, RW, UPDATE, arg, command_entry, key,
};
use crate::host::{Args, Ctx, KeyMode};
use crate::limits;
use crate::metrics::{Metric, count};

/// 128 bits from the thread's CSPRNG (seeded from the OS, reseeded
/// periodically): unique across keys, restarts and primaries without any
/// coordination.
fn new_token() -> Token {
    Token(rand::random())
}

/// Stores a transition's write, propagates it and notifies `event`.
pub(super) fn store_write(ctx: Ctx, mut slot: OpenRecord, write: Write, event: &'static CStr) {
    let name = slot.name();
    match write {
        Write::None => return,
        // Redis copies the blob when it is replicated, before the command
        // ends and the effect is propagated.
        Write::Update { expire_at } => {
            if let Some(record) = slot.record() {
                record_codec::with_effect(record, Some(expire_at), |blob| {
                    ctx.replicate_key_blob(c"IDEM.APPLY", name, blob)
                });
            }
            slot.store_updated(expire_at);
        }
        Write::Create { record, expire_at } => {
            record_codec::with_effect(&record, Some(expire_at), |blob| {
                ctx.replicate_key_blob(c"IDEM.APPLY", name, blob)
            });
            slot.store_new(record, Some(expire_at));
        }
    }
    ctx.notify(event, name);
}

/// IDEM.CLAIM key lease [PAYLOAD data] [MAXTRIES n] [BLOOM filterkey] [WAIT ms] [OWNER name]
pub fn claim(ctx: Ctx, args: &Args) -> CmdResult {
    let now = ctx.now();
    let (claim, bloom) = record::parse_claim(args, now)?;
    // Where the client may not block, or too many already wait, WAIT
    // answers as without it.
    let wait = claim.wait > 0 && blocking::may_block(ctx) && room_for_a_waiter();
    if let Answer::Busy { lease_end } = decide_claim(ctx, args, &claim, bloom, now, Caller::Command { wait })? {
        count(Metric::WaitStarted);
        let waiter = ClaimWaiter { claim, bloom };
        blocking::block_on_key(ctx, args.arg(1), claim.wait, Some(wake_after(lease_end)), waiter);
    }
    Ok(())
}

/// Whether another client may wait (`idem.max-waiters`); counted when not.
fn room_for_a_waiter() -> bool {
    let room = blocking::waiting() < config::max_waiters();
    if !room {
        count(Metric::WaitRefused);
    }
    room
}

/// Who runs a CLAIM, which decides what it leaves unanswered.
#[derive(Clone, Copy)]
enum Caller {
    /// A client's `IDEM.CLAIM`: every answer is replied, but `BUSY` when
    /// the client will wait.
    Command { wait: bool },
    /// A waiter woken on its key: `BUSY` is not replied (it waits on), nor
    /// an answer that writes while writes are paused (it waits for the
    /// pause to end).
    Woken,
    /// A waiter whose time is up: every answer is replied; one that writes
    /// is an error when it may not write now.
    TimedOut,
}

/// How a CLAIM ended.
enum Answer {
    /// `BUSY`, not answered yet: the caller waits until the lease ends at
    /// `lease_end` or the record changes.
    Busy { lease_end: Millis },
    /// Not answered: the answer writes, and writes are paused.
    WritesPaused,
    /// A claim was granted: `NEW`, `SEEN` or `RETRY`.
    Claimed,
    /// Any other answer.
    Other,
}

/// When a waiter's key is signalled for a lease that lapses at
/// `lease_end`: the first millisecond the record is `expired`.
fn wake_after(lease_end: Millis) -> Millis {
    lease_end.saturating_add(1)
}

/// Runs a CLAIM at `now` with parsed arguments, replies and stores its
/// write, but for the answers `caller` leaves unanswered (see [`Caller`]),
/// which are returned with nothing stored.
fn decide_claim(
    ctx: Ctx,
    args: &Args,
    claim: &ClaimArgs,
    bloom: Option<usize>,
    now: Millis,
    caller: Caller,
) -> Result<Answer, CmdError> {
    let mut claim = *claim;
    let mut key = ctx.open_key(args.arg(1), KeyMode::Write);
    let mut slot = OpenRecord::open(&mut key)?;
    if let Some(filter_index) = bloom {
        // Only a missing record consults the filter: "may have completed
        // within its window" turns NEW into SEEN.
        let item = slot.record().is_none().then(|| args.bytes(1));
        claim.maybe_seen = bloom_commands::may_contain(ctx, args.arg(filter_index), item, now)?;
    }
    // A waiter's answer comes from a callback, not from a command Redis
    // would hold back while writes are paused.
    if !matches!(caller, Caller::Command { .. }) {
        // In cluster mode a missing key may have left with its slot, and
        // claiming it here could grant it twice.
        if matches!(caller, Caller::TimedOut) && slot.record().is_none() && !blocking::may_claim_absent_key(ctx) {
            return Err(TRYAGAIN_GONE);
        }
        // An answer that writes waits for writes; it is found on a copy,
        // so that nothing changes before it is known. Only during a pause:
        // the copy costs nothing that matters.
        if ctx.writes_paused() {
            let mut copy = slot.record().cloned();
            let (_, write) = record::claim(copy.as_mut(), &claim, now, config::lifetimes(), new_token)?;
            if !matches!(write, Write::None) {
                return match caller {
                    Caller::Woken => Ok(Answer::WritesPaused),
                    _ => Err(TRYAGAIN_PAUSED),
                };
            }
        }
    }
    let (reply, write) = record::claim(slot.record(), &claim, now, config::lifetimes(), new_token)?;
    let busy_goes_unanswered = matches!(caller, Caller::Command { wait: true } | Caller::Woken);
    if busy_goes_unanswered && let ClaimReply::Busy { lease_left, .. } = reply {
        return Ok(Answer::Busy { lease_end: now + lease_left });
    }
    ctx.reply_array(3);
    let (attempt, answer) = match reply {
        ClaimReply::New { token } | ClaimReply::Seen { token } => {
            let seen = matches!(reply, ClaimReply::Seen { .. });
            count(if seen { Metric::ClaimSeen } else { Metric::ClaimNew });
            ctx.reply_simple(if seen { c"SEEN" } else { c"NEW" });
            ctx.reply_bulk(&token.to_hex());
            (1, Answer::Claimed)
        }
        ClaimReply::Retry { token, attempt } => {
            count(Metric::ClaimRetry);
            ctx.reply_simple(c"RETRY");
            ctx.reply_bulk(&token.to_hex());
            (attempt, Answer::Claimed)
        }
        ClaimReply::Mismatch { attempt } => {
            count(Metric::ClaimMismatch);
            ctx.reply_simple(c"MISMATCH");
            ctx.reply_null();
            (attempt, Answer::Other)
        }
        ClaimReply::Done { attempt } => {
            count(Metric::ClaimDone);
            ctx.reply_simple(c"DONE");
            let result = slot.record().and_then(|record| record.result.as_deref());
            ctx.reply_optional_bulk(result);
            (attempt, Answer::Other)
        }
        ClaimReply::Busy { lease_left, attempt } => {
            count(Metric::ClaimBusy);
            ctx.reply_simple(c"BUSY");
            ctx.reply_int(lease_left);
            (attempt, Answer::Other)
        }
        ClaimReply::Exhausted { attempt } => {
            count(Metric::ClaimExhausted);
            ctx.reply_simple(c"EXHAUSTED");
            ctx.reply_null();
            (attempt, Answer::Other)
        }
    };
    ctx.reply_int(attempt as i64);
    store_write(ctx, slot, write, c"idem.claim");
    Ok(answer)
}

/// A waiter's time ended while writes were paused, on a key it would claim.
const TRYAGAIN_PAUSED: CmdError = CmdError::Static(
    c"TRYAGAIN writes are paused (CLIENT PAUSE WRITE or a failover) and the key is free: claim it again",
);
/// A waiter's time ended, in cluster mode, on a key gone from this node.
const TRYAGAIN_GONE: CmdError =
    CmdError::Static(c"TRYAGAIN the record is gone from this node (deleted, or its slot is migrating): claim it again");

/// A client of `IDEM.CLAIM ... WAIT` waiting on a record another claim
/// holds. Every time the record key is signalled (a DONE, a RELEASE, the
/// lease's end, the key deleted) it runs its CLAIM again, as of now: still
/// `BUSY` goes on waiting (until the lease, perhaps extended, ends), any
/// other answer is replied and stored exactly as a CLAIM's, once writes
/// are allowed. Redis serves the clients blocked on a key in the order
/// they blocked, so the longest waiter claims first and the others then
/// find the key busy again. In cluster mode a deleted key does not wake
/// it: the key may have left with its slot (see
/// [`blocking::may_claim_absent_key`]).
struct ClaimWaiter {
    claim: ClaimArgs,
    bloom: Option<usize>,
}

impl Waiter for ClaimWaiter {
    fn ready(&mut self, ctx: Ctx<'_>, args: &Args<'_>) -> Wake {
        if !blocking::may_claim_absent_key(ctx) && ctx.open_key(args.arg(1), KeyMode::Read).is_empty() {
            return Wake::Wait { signal_at: None };
        }
        match decide_claim(ctx, args, &self.claim, self.bloom, ctx.now(), Caller::Woken) {
            Ok(Answer::Busy { lease_end }) => return Wake::Wait { signal_at: Some(wake_after(lease_end)) },
            Ok(Answer::WritesPaused) => return Wake::WaitForWrites,
            Ok(Answer::Claimed) => count(Metric::WaitClaimed),
            Ok(Answer::Other) => count(Metric::WaitDone),
            Err(error) => {
                count(Metric::WaitDone);
                ctx.reply_error(&error);
            }
        }
        Wake::Replied
    }

    /// What a CLAIM answers now: `BUSY` with what is left of a live lease,
    /// or, when the record changed at the last moment, its new answer.
    fn timeout(&mut self, ctx: Ctx<'_>, args: &Args<'_>) {
        count(Metric::WaitTimeout);
        if let Err(error) = decide_claim(ctx, args, &self.claim, self.bloom, ctx.now(), Caller::TimedOut) {
            ctx.reply_error(&error);
        }
    }

    fn abandoned(self) {
        count(Metric::WaitUnblocked);
    }
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
    let DoneArgs { token, result, retain, bloom } =
        record::parse_done(args, now, config::retain(), config::max_result())?;
    if let Some(result) = result {
        limits::check_value_size(ctx, result.len() as u64 + RECORD_OVERHEAD, "RESULT")?;
    }
    let mut key = ctx.open_key(args.arg(1), KeyMode::Write);
    let mut slot = OpenRecord::open(&mut key)?;
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
    store_write(ctx, slot, write, c"idem.done");
    blocking::signal_ready(ctx, args.arg(1));
    let mut completed = 1;
    if result.is_some() && kept_result.is_none() {
        count(Metric::DoneResultDropped);
        limits::log_drop(ctx, "dropped the RESULT of a completed IDEM.DONE: used memory is over maxmemory");
        completed |= DONE_RESULT_DROPPED;
    }
    if let Some(filter_index) = bloom
        && let Err(why) = bloom_commands::add_completed(ctx, args.arg(filter_index), &[args.arg(1)], now, memory_full)
    {
        count(Metric::DoneBloomDropped);
        limits::log_drop(ctx, &format!("dropped the BLOOM add of a completed IDEM.DONE: {}", why.message()));
        completed |= DONE_BLOOM_DROPPED;
    }
    ctx.reply_int(completed);
    Ok(())
}

/// IDEM.RELEASE key token
pub fn release(ctx: Ctx, args: &Args) -> CmdResult {
    let now = ctx.now();
    let token = token_arg(args, 2)?;
    let mut key = ctx.open_key(args.arg(1), KeyMode::Write);
    let mut slot = OpenRecord::open(&mut key)?;
    let (released, write) = record::release(slot.record(), token, now, config::lifetimes());
    count(if released { Metric::ReleaseOk } else { Metric::ReleaseMiss });
    ctx.reply_int(released as i64);
    store_write(ctx, slot, write, c"idem.release");
    if released {
        blocking::signal_ready(ctx, args.arg(1));
    }
    Ok(())
}

/// IDEM.EXTEND key token lease
pub fn extend(ctx: Ctx, args: &Args) -> CmdResult {
    let now = ctx.now();
    let token = token_arg(args, 2)?;
    let lease = seconds_arg(args, 3, now)?;
    let mut key = ctx.open_key(args.arg(1), KeyMode::Write);
    let mut slot = OpenRecord::open(&mut key)?;
    let (extended, write) = record::extend(slot.record(), token, lease, now, config::lifetimes());
    if extended.is_err() {
        count(Metric::ExtendStale);
        return Err(CmdError::Static(c"STALE this token does not hold the claim"));
    }
    count(Metric::ExtendOk);
    ctx.reply_int(1);
    store_write(ctx, slot, write, c"idem.extend");
    Ok(())
}

/// IDEM.ONCE key retain
pub fn once(ctx: Ctx, args: &Args) -> CmdResult {
    let now = ctx.now();
    let retain = seconds_arg(args, 2, now)?;
    let mut key = ctx.open_key(args.arg(1), KeyMode::Write);
    let mut slot = OpenRecord::open(&mut key)?;
    let (created, write) = record::once(slot.record().as_deref(), retain, now);
    count(if created { Metric::OnceNew } else { Metric::OnceExists });
    ctx.reply_int(created as i64);
    store_write(ctx, slot, write, c"idem.done");
    Ok(())
}

/// IDEM.GET key
pub fn get(ctx: Ctx, args: &Args) -> CmdResult {
    let now = ctx.now();
    let mut key = ctx.open_key(args.arg(1), KeyMode::Read);
    let mut slot = OpenRecord::open(&mut key)?;
    let Some((record, pttl)) = slot.record_and_pttl() else {
        ctx.reply_null();
        return Ok(());
    };
    ctx.reply_map(10);
    ctx.reply_simple(c"state");
    ctx.reply_simple(record.state_at(now).name());
    ctx.reply_simple(c"attempt");
    ctx.reply_int(record.attempt as i64);
    ctx.reply_simple(c"lease_ms");
    ctx.reply_int(record.lease_left(now));
    ctx.reply_simple(c"pttl");
    ctx.reply_int(pttl);
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
    // Last, so that readers of the fields before by position still work.
    ctx.reply_simple(c"tries");
    ctx.reply_int(record.tries() as i64);
    ctx.reply_simple(c"owner");
    ctx.reply_optional_bulk(record.owner.as_deref());
    Ok(())
}

/// IDEM.APPLY key blob: stores a record exactly as the primary wrote it.
/// Replicas and AOF replay receive every write as this command; clients may
/// not send it. The blob is still fully validated: an AOF file can be
/// damaged.
pub fn apply(ctx: Ctx, args: &Args) -> CmdResult {
    ctx.require_primary_or_aof()?;
    let (record, expire_at) = data_type::decode_effect(args.bytes(2))?;
    let mut key = ctx.open_key(args.arg(1), KeyMode::Write);
    OpenRecord::open(&mut key)?.store_new(record, expire_at);
    // Clients waiting on the key (a writable replica's) see the change.
    blocking::signal_ready(ctx, args.arg(1));
    // On a primary this reaches replicas and the AOF; on a replica, its own
    // AOF (sub-replicas get the primary's stream as it is).
    ctx.replicate_verbatim();
    ctx.reply_simple(c"OK");
    Ok(())
}

/// For `getkeys-api` commands: the positions of the record key and of the
/// `BLOOM` option's value, with their access flags, as the command's own
/// parser finds them.
fn record_and_bloom_keys(args: &Args, options: &[&str], record: u32, bloom: u32) -> Vec<(usize, u32)> {
    let mut keys = vec![(1, record)];
    keys.extend(record::bloom_key_position(args, options).map(|at| (at, bloom)));
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
    record_and_bloom_keys(args, record::CLAIM_OPTIONS, CLAIM_RECORD, CLAIM_FILTER)
}

fn done_keys(args: &Args) -> Vec<(usize, u32)> {
    record_and_bloom_keys(args, record::DONE_OPTIONS, DONE_RECORD, DONE_FILTER)
}

/// The record commands as registered.
pub static COMMANDS: [CommandSpec; 7] = [
    CommandSpec {
        name: c"IDEM.CLAIM",
        entry: command_entry!(claim, keys: claim_keys),
        args: &[
            arg::key(c"key", 0),
            arg::integer(c"lease"),
            arg::option(c"PAYLOAD", arg::string(c"data")),
            arg::option(c"MAXTRIES", arg::integer(c"n")),
            arg::option(c"BLOOM", arg::key(c"filterkey", 1)),
            arg::option(c"WAIT", arg::integer(c"ms")),
            arg::option(c"OWNER", arg::string(c"name")),
        ],
        // `blocking`: WAIT may block the client (COMMAND INFO, @blocking),
        // as BZPOPMAX is "write fast blocking".
        flags: c"write deny-oom fast getkeys-api blocking",
        acl: "write fast blocking",
        arity: -3,
        summary: c"Claims a key for processing: check, mark and lease in one step, or with WAIT waits for the copy in flight; replies [status, value, attempt].",
        complexity: c"O(1)",
        keys: &[key(1, CLAIM_RECORD), KeyArg { at: KeyAt::Option(c"BLOOM"), flags: CLAIM_FILTER | INCOMPLETE }],
    },
    CommandSpec {
        name: c"IDEM.DONE",
        entry: command_entry!(done, keys: done_keys),
        args: &[
            arg::key(c"key", 0),
            arg::string(c"token"),
            arg::option(c"RESULT", arg::string(c"value")),
            arg::option(c"RETAIN", arg::integer(c"seconds")),
            arg::option(c"BLOOM", arg::key(c"filterkey", 1)),
        ],
        // Not deny-oom: completing work must not fail on a full memory
        // (what cannot be stored is dropped, see `done`).
        flags: c"write getkeys-api",
        acl: "write slow",
        arity: -3,
        summary: c"Completes a claim and stores its result for replay by later claims.",
        complexity: c"O(N) where N is the size of the result",
        keys: &[key(1, DONE_RECORD), KeyArg { at: KeyAt::Option(c"BLOOM"), flags: DONE_FILTER | INCOMPLETE }],
    },
    CommandSpec {
        name: c"IDEM.RELEASE",
        entry: command_entry!(release),
        flags: c"write fast",
        acl: "write fast",
        arity: 3,
        summary: c"Gives up a live claim so that a retry can claim the key at once.",
        complexity: c"O(1)",
        keys: &[key(1, RW | UPDATE)],
        args: &[arg::key(c"key", 0), arg::string(c"token")],
    },
    CommandSpec {
        name: c"IDEM.EXTEND",
        entry: command_entry!(extend),
        flags: c"write fast",
        acl: "write fast",
        arity: 4,
        summary: c"Extends the lease of the current claim.",
        complexity: c"O(1)",
        keys: &[key(1, RW | UPDATE)],
        args: &[arg::key(c"key", 0), arg::string(c"token"), arg::integer(c"lease")],
    },
    CommandSpec {
        name: c"IDEM.GET",
        entry: command_entry!(get),
        flags: c"readonly fast",
        acl: "read fast",
        arity: 2,
        summary: c"Shows a record's state, attempt, times, result, fingerprint and owner (never its token).",
        complexity: c"O(1)",
        keys: &[key(1, RO | ACCESS)],
        args: &[arg::key(c"key", 0)],
    },
    CommandSpec {
        name: c"IDEM.ONCE",
        entry: command_entry!(once),
        flags: c"write deny-oom fast",
        acl: "write fast",
        arity: 3,
        summary: c"Marks a key done if it has no record, in one step, for consumers that need no lease.",
        complexity: c"O(1)",
        keys: &[key(1, RW | INSERT)],
        args: &[arg::key(c"key", 0), arg::integer(c"retain")],
    },
    CommandSpec {
        name: c"IDEM.APPLY",
        entry: command_entry!(apply),
        flags: c"write",
        acl: "write slow admin dangerous",
        arity: 3,
        summary: c"Internal: stores a record exactly as the primary wrote it (replication and AOF).",
        complexity: c"O(N) where N is the size of the record",
        keys: &[key(1, OW | UPDATE)],
        args: &[arg::key(c"key", 0), arg::string(c"blob")],
    },
];
