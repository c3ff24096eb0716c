//! The operator commands: `IDEM.SCAN` finds stuck and dead-lettered work,
//! `IDEM.REQUEUE` gives it back without breaking the fencing number.

use idem_core::args::ArgList;
use idem_core::error::{CmdError, CmdResult};
use idem_core::record::operator::parse_scan;
use idem_core::record::{self, RequeueReply};

use super::commands::store_write;
use super::data_type::OpenRecord;
use crate::config;
use crate::host::access::{self, Caller};
use crate::host::blocking;
use crate::host::command::{CommandSpec, RW, UPDATE, arg, command_entry, key};
use crate::host::{Args, Ctx, KeyMode};
use crate::metrics::{Metric, count};

/// IDEM.SCAN cursor [MATCH pattern] [COUNT count] [STATE state] [MINTRIES n] [IDLE seconds]
///
/// One step of the keyspace's own `SCAN` (so its cursor and guarantees are
/// exactly `SCAN`'s; the parser bounds `MATCH` as the fixed servers bound
/// their matcher), then each name it returned that the caller may read by
/// its ACL key patterns is opened without a trace (as `SCAN` leaves keys)
/// and kept if it holds a record the filter selects. Nothing is written.
pub fn scan(ctx: Ctx, args: &Args) -> CmdResult {
    let now = ctx.now();
    let scan = parse_scan(args)?;
    let caller = Caller::of(ctx)?;
    let pattern = scan.pattern.map(|index| args.bytes(index));
    let (cursor, names) = ctx.scan_keys(args.bytes(scan.cursor), pattern, scan.count)?;
    let selected: Vec<&Vec<u8>> = names
        .iter()
        .filter(|name| {
            ctx.with_key_name(name, |name| {
                caller.may_read(name)
                    && access::read_quietly(ctx, name, |key| match OpenRecord::open(key) {
                        Ok(mut slot) => slot.record().is_some_and(|record| scan.filter.selects(record, now)),
                        Err(_) => false, // another type
                    })
            })
        })
        .collect();
    ctx.reply_array(2);
    ctx.reply_bulk(&cursor);
    ctx.reply_array(selected.len());
    for name in selected {
        ctx.reply_bulk(name);
    }
    Ok(())
}

/// IDEM.REQUEUE's error for a live lease.
const REQUEUE_BUSY: CmdError = CmdError::Static(
    c"ERR the record is processing with a live lease: its holder is still at work (requeue it when the lease ends)",
);

/// IDEM.REQUEUE key
pub fn requeue(ctx: Ctx, args: &Args) -> CmdResult {
    let now = ctx.now();
    let mut key = ctx.open_key(args.arg(1), KeyMode::Write);
    let mut slot = OpenRecord::open(&mut key)?;
    let (reply, write) = record::requeue(slot.record(), now, config::lifetimes());
    match reply {
        RequeueReply::Busy => {
            count(Metric::RequeueBusy);
            return Err(REQUEUE_BUSY);
        }
        RequeueReply::Absent => count(Metric::RequeueMiss),
        RequeueReply::Requeued => count(Metric::RequeueOk),
    }
    ctx.reply_int((reply == RequeueReply::Requeued) as i64);
    store_write(ctx, slot, write, c"idem.requeue");
    if reply == RequeueReply::Requeued {
        // A waiter whose lease lapsed a moment ago claims it now.
        blocking::signal_ready(ctx, args.arg(1));
    }
    Ok(())
}

/// The operator commands as registered.
pub static COMMANDS: [CommandSpec; 2] = [
    CommandSpec {
        name: c"IDEM.SCAN",
        entry: command_entry!(scan),
        // Keyless, as SCAN: one node's keys; never blocks.
        flags: c"readonly",
        acl: "read slow",
        arity: -2,
        summary: c"Iterates the records of the database whose state, tries and idle time match the filters given: stuck and dead-lettered work.",
        complexity: c"O(1) for every call. O(N) for a complete iteration, where N is the number of keys in the database",
        keys: &[],
        args: &[
            arg::integer(c"cursor"),
            arg::option(c"MATCH", arg::string(c"pattern")),
            arg::option(c"COUNT", arg::integer(c"count")),
            // A state's name in any case, as the syntax line shows it.
            arg::option(c"STATE", arg::string(c"state")),
            arg::option(c"MINTRIES", arg::integer(c"n")),
            arg::option(c"IDLE", arg::integer(c"seconds")),
        ],
    },
    CommandSpec {
        name: c"IDEM.REQUEUE",
        entry: command_entry!(requeue),
        flags: c"write fast",
        acl: "write fast",
        arity: 2,
        summary: c"Gives a stuck, dead-lettered or completed record's work back: released now, attempt kept, tries restarted.",
        complexity: c"O(1)",
        // Like RELEASE: it changes the record and returns none of its data.
        keys: &[key(1, RW | UPDATE)],
        args: &[arg::key(c"key", 0)],
    },
];
