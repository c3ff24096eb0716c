//! The batch commands, `IDEM.MCLAIM`, `IDEM.MDONE` and `IDEM.MRELEASE`:
//! their arguments, and their transitions, which run the single command's
//! transition on each key in order.
//!
//! A batch's keys are taken one after another, as the same sequence of
//! single commands would take them: a key given twice sees, the second
//! time, what its first occurrence did. A per-key failure (a key of
//! another type, a token that is none, a stale token) is that key's answer
//! alone. What the whole call leaves is one [`Batch`]: each distinct key's
//! record as it ends, and which of them were written, so the command layer
//! stores them and propagates them as one effect ([`effect`]).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher, RandomState};

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::codec::{self, write_effect};
use super::{
    ClaimArgs, ClaimReply, DoneReply, Fingerprint, Lifetimes, Millis, Record, Token, Write, claim, done, fingerprint,
    max_tries_arg, owner_arg, release, token_arg,
};
use crate::args::{ArgList, parse_counted_options, require, seconds_arg};
use crate::decode::{DecodeError, Reader};
use crate::error::{CmdError, NOT_AN_INTEGER, WRONGTYPE};

/// The most keys one call takes: large enough for any consumer's batch
/// (Kafka's default `max.poll.records` is 500, SQS's 10), small enough that
/// one call holds the server for milliseconds, not seconds.
pub const MAX_BATCH: usize = 10_000;

/// `IDEM.MCLAIM`'s options, in the order [`parse_mclaim`] takes them.
pub const MCLAIM_OPTIONS: &[&str] = &["PAYLOADS", "MAXTRIES", "BLOOM", "OWNER"];
/// `IDEM.MDONE`'s options, in the order [`parse_mdone`] takes them.
pub const MDONE_OPTIONS: &[&str] = &["RESULTS", "RETAIN", "BLOOM"];

/// Where a batch command's arguments are: `numkeys` keys from `first`,
/// `width` arguments each (a key, or a key and its token), then options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub numkeys: usize,
    pub first: usize,
    pub width: usize,
}

impl Layout {
    /// The argument index of the `position`th key.
    pub fn key(&self, position: usize) -> usize {
        self.first + position * self.width
    }

    /// Where the options start.
    pub fn options(&self) -> usize {
        self.first + self.numkeys * self.width
    }
}

/// `numkeys` at `at`, then as many keys (`width` arguments each).
fn layout<A: ArgList + ?Sized>(args: &A, at: usize, width: usize) -> Result<Layout, CmdError> {
    require(args, at + 1)?;
    let numkeys = args.int(at).map_err(|_| NOT_AN_INTEGER)?;
    if numkeys < 1 || numkeys > MAX_BATCH as i64 {
        return Err(CmdError::Static(c"ERR numkeys must be between 1 and 10000"));
    }
    let layout = Layout { numkeys: numkeys as usize, first: at + 1, width };
    if layout.options() > args.len() {
        let what = if width == 1 { "keys" } else { "key-token pairs" };
        return Err(CmdError::new(format!("ERR syntax error, numkeys is {numkeys} but fewer {what} are given")));
    }
    Ok(layout)
}

/// Where the `BLOOM` option's value is, found by the walker the parsers
/// use; `None` when there is none or the options do not parse.
fn bloom_at<A: ArgList + ?Sized>(args: &A, layout: Layout, options: &[&str]) -> Option<usize> {
    let mut found = None;
    let _ = parse_counted_options(
        args,
        layout.options(),
        options,
        |o| if o == 0 { layout.numkeys } else { 1 },
        |o, v| {
            if o == 2 {
                found = Some(v);
            }
            Ok(())
        },
    );
    found
}

/// Every key position of a call, record keys first and the `BLOOM` filter
/// last, for the command layer's `getkeys-api` answer. A call that does not
/// parse gives no keys: it fails before touching any.
pub fn key_positions<A: ArgList + ?Sized>(args: &A, command: Command) -> (Vec<usize>, Option<usize>) {
    let (at, width, options): (usize, usize, &[&str]) = match command {
        Command::MClaim => (2, 1, MCLAIM_OPTIONS),
        Command::MDone => (1, 2, MDONE_OPTIONS),
        Command::MRelease => (1, 2, &[]),
    };
    let Ok(layout) = layout(args, at, width) else { return (Vec::new(), None) };
    let keys = (0..layout.numkeys).map(|p| layout.key(p)).collect();
    (keys, bloom_at(args, layout, options))
}

/// The three batch commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    MClaim,
    MDone,
    MRelease,
}

/// The filter must be none of the record keys.
fn check_bloom_key<A: ArgList + ?Sized>(args: &A, layout: Layout, bloom: Option<usize>) -> Result<(), CmdError> {
    if let Some(filter) = bloom
        && (0..layout.numkeys).any(|p| args.bytes(layout.key(p)) == args.bytes(filter))
    {
        return Err(CmdError::Static(c"ERR the BLOOM filter must be another key than the records"));
    }
    Ok(())
}

/// `IDEM.MCLAIM`'s arguments, checked.
#[derive(Clone, Copy, Debug)]
pub struct MClaimArgs {
    pub layout: Layout,
    /// Lease, `MAXTRIES` and `OWNER`; fingerprint and `maybe_seen` are per
    /// key.
    pub claim: ClaimArgs,
    /// Index of the first of `PAYLOADS`' values.
    pub payloads: Option<usize>,
    /// Index of the `BLOOM` filter key.
    pub bloom: Option<usize>,
}

/// `IDEM.MCLAIM lease numkeys key [key ...] [PAYLOADS payload [payload ...]]
/// [MAXTRIES n] [BLOOM filterkey] [OWNER name]`
pub fn parse_mclaim<A: ArgList + ?Sized>(args: &A, now: Millis) -> Result<MClaimArgs, CmdError> {
    require(args, 4)?;
    let lease = seconds_arg(args, 1, now)?;
    let layout = layout(args, 2, 1)?;
    let mut parsed =
        MClaimArgs { layout, claim: ClaimArgs { lease, ..ClaimArgs::default() }, payloads: None, bloom: None };
    let values = |option| if option == 0 { layout.numkeys } else { 1 };
    parse_counted_options(args, layout.options(), MCLAIM_OPTIONS, values, |option, value| {
        match option {
            0 => parsed.payloads = Some(value),
            1 => parsed.claim.max_tries = Some(max_tries_arg(args, value)?),
            2 => parsed.bloom = Some(value),
            _ => parsed.claim.owner = Some(owner_arg(args, value)?),
        }
        Ok(())
    })?;
    check_bloom_key(args, layout, parsed.bloom)?;
    Ok(parsed)
}

/// `IDEM.MDONE`'s arguments, checked.
#[derive(Clone, Copy, Debug)]
pub struct MDoneArgs {
    pub layout: Layout,
    /// Index of the first of `RESULTS`' values.
    pub results: Option<usize>,
    pub retain: Millis,
    pub bloom: Option<usize>,
}

/// `IDEM.MDONE numkeys key token [key token ...] [RESULTS result [result
/// ...]] [RETAIN seconds] [BLOOM filterkey]`, `retain` being the default
/// `RETAIN`. Tokens and result sizes are checked per key, by [`mdone`].
pub fn parse_mdone<A: ArgList + ?Sized>(args: &A, now: Millis, retain: Millis) -> Result<MDoneArgs, CmdError> {
    require(args, 4)?;
    let layout = layout(args, 1, 2)?;
    let mut parsed = MDoneArgs { layout, results: None, retain, bloom: None };
    let values = |option| if option == 0 { layout.numkeys } else { 1 };
    parse_counted_options(args, layout.options(), MDONE_OPTIONS, values, |option, value| {
        match option {
            0 => parsed.results = Some(value),
            1 => parsed.retain = seconds_arg(args, value, now)?,
            _ => parsed.bloom = Some(value),
        }
        Ok(())
    })?;
    check_bloom_key(args, layout, parsed.bloom)?;
    Ok(parsed)
}

/// `IDEM.MRELEASE numkeys key token [key token ...]`
pub fn parse_mrelease<A: ArgList + ?Sized>(args: &A) -> Result<Layout, CmdError> {
    require(args, 4)?;
    let layout = layout(args, 1, 2)?;
    if layout.options() < args.len() {
        let name = String::from_utf8_lossy(args.bytes(layout.options()));
        return Err(CmdError::new(format!("ERR syntax error, unexpected argument '{name}' after the keys")));
    }
    Ok(layout)
}

/// For each key position, the index of its distinct key; and each distinct
/// key's first position. Keys are compared as bytes, as Redis compares
/// them.
pub fn distinct<'a, A: ArgList + ?Sized>(args: &'a A, layout: Layout) -> (Vec<usize>, Vec<usize>) {
    let mut index: HashMap<&'a [u8], usize, KeyHashing> =
        HashMap::with_capacity_and_hasher(layout.numkeys, KeyHashing::new());
    let mut firsts = Vec::with_capacity(layout.numkeys);
    let positions = (0..layout.numkeys)
        .map(|position| {
            *index.entry(args.bytes(layout.key(position))).or_insert_with(|| {
                firsts.push(position);
                firsts.len() - 1
            })
        })
        .collect();
    (positions, firsts)
}

/// How [`distinct`] hashes key names: xxh3, a fraction of the cost of the
/// standard SipHash on short keys, seeded per call from the standard
/// library's random keys, so that a client cannot pick names that collide
/// and make a 10000-key call quadratic.
struct KeyHashing(u64);

impl KeyHashing {
    fn new() -> KeyHashing {
        KeyHashing(RandomState::new().hash_one(0u8))
    }
}

impl BuildHasher for KeyHashing {
    type Hasher = KeyHasher;

    fn build_hasher(&self) -> KeyHasher {
        KeyHasher { seed: self.0, hash: 0 }
    }
}

/// One name's hash. A slice's `Hash` writes its length, then its bytes;
/// xxh3 covers the length itself, so the length only varies the seed.
struct KeyHasher {
    seed: u64,
    hash: u64,
}

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        self.hash = xxh3_64_with_seed(bytes, self.seed ^ self.hash);
    }

    fn write_usize(&mut self, n: usize) {
        self.hash ^= n as u64;
    }

    fn finish(&self) -> u64 {
        self.hash
    }
}

/// A distinct key's record as the batch goes on.
#[derive(Debug)]
pub enum Held<'r> {
    /// The key holds another type: every occurrence answers WRONGTYPE.
    WrongType,
    Absent,
    /// The key's stored record, changed in place.
    Stored(&'r mut Record),
    /// A record this batch created on a key that had none.
    Created(Record),
}

impl Held<'_> {
    pub fn record(&mut self) -> Option<&mut Record> {
        match self {
            Held::Stored(record) => Some(record),
            Held::Created(record) => Some(record),
            Held::WrongType | Held::Absent => None,
        }
    }

    /// The record this batch created, if it did.
    pub fn into_created(self) -> Option<Record> {
        match self {
            Held::Created(record) => Some(record),
            _ => None,
        }
    }
}

/// A batch's distinct keys, each with its record and, once written, the
/// key's new absolute expiry.
pub struct Batch<'r> {
    /// For each key position, its index in `keys`.
    pub positions: Vec<usize>,
    pub keys: Vec<(Held<'r>, Option<Millis>)>,
}

impl<'r> Batch<'r> {
    /// `positions` as [`distinct`] gives them, and each distinct key's
    /// record as stored.
    pub fn new(positions: Vec<usize>, held: impl IntoIterator<Item = Held<'r>>) -> Batch<'r> {
        Batch { positions, keys: held.into_iter().map(|held| (held, None)).collect() }
    }

    /// Runs `transition` on the `position`th key's record, and keeps its
    /// write. `Err(WRONGTYPE)` for a key of another type.
    fn run<R>(
        &mut self,
        position: usize,
        transition: impl FnOnce(Option<&mut Record>) -> (R, Write),
    ) -> Result<R, CmdError> {
        let (held, expire) = &mut self.keys[self.positions[position]];
        if matches!(held, Held::WrongType) {
            return Err(WRONGTYPE);
        }
        let (reply, write) = transition(held.record());
        match write {
            Write::None => {}
            Write::Update { expire_at } => *expire = Some(expire_at),
            Write::Create { record, expire_at } => {
                *held = Held::Created(record);
                *expire = Some(expire_at);
            }
        }
        Ok(reply)
    }

    /// The record at key position `position` now.
    pub fn record_at(&mut self, position: usize) -> Option<&mut Record> {
        self.keys[self.positions[position]].0.record()
    }

    /// The distinct keys written, as (index, expiry).
    pub fn written(&self) -> impl Iterator<Item = (usize, Millis)> + '_ {
        self.keys.iter().enumerate().filter_map(|(index, (_, expire))| expire.map(|at| (index, at)))
    }

    /// The call's replicated effect: each written key's record and expiry,
    /// in the order of the keys' first occurrences (see [`effect`]).
    pub fn effect(&mut self, out: &mut Vec<u8>) {
        for (held, expire) in &mut self.keys {
            if let (Some(at), Some(record)) = (*expire, held.record()) {
                let start = out.len();
                out.extend_from_slice(&[0; 4]);
                write_effect(record, Some(at), out);
                let len = (out.len() - start - 4) as u32;
                out[start..start + 4].copy_from_slice(&len.to_le_bytes());
            }
        }
    }
}

/// `IDEM.MCLAIM`: each key's CLAIM answer, in order. `maybe_seen(position)`
/// asks the `BLOOM` filter about the key at that position (only for a key
/// with no record).
pub fn mclaim<A: ArgList + ?Sized>(
    args: &A,
    parsed: &MClaimArgs,
    batch: &mut Batch<'_>,
    now: Millis,
    lifetimes: Lifetimes,
    mut maybe_seen: impl FnMut(usize) -> bool,
    mut next_token: impl FnMut() -> Token,
) -> Vec<Result<ClaimReply, CmdError>> {
    (0..parsed.layout.numkeys)
        .map(|position| {
            let fingerprint: Option<Fingerprint> =
                parsed.payloads.map(|first| fingerprint(args.bytes(first + position)));
            batch
                .run(position, |record| {
                    let maybe_seen = parsed.bloom.is_some() && record.is_none() && maybe_seen(position);
                    let args = ClaimArgs { fingerprint, maybe_seen, ..parsed.claim };
                    match claim(record, &args, now, lifetimes, &mut next_token) {
                        Ok((reply, write)) => (Ok(reply), write),
                        Err(error) => (Err(error), Write::None),
                    }
                })
                .and_then(|reply| reply)
        })
        .collect()
}

/// `IDEM.MDONE`: each key's DONE answer, in order. A result larger than
/// `max_result`, or one `check_result` refuses, is that key's error; with
/// `keep_results` false (a full memory) no result is stored.
pub fn mdone<A: ArgList + ?Sized>(
    args: &A,
    parsed: &MDoneArgs,
    batch: &mut Batch<'_>,
    now: Millis,
    max_result: usize,
    keep_results: bool,
    mut check_result: impl FnMut(&[u8]) -> Result<(), CmdError>,
) -> Vec<Result<DoneReply, CmdError>> {
    let layout = parsed.layout;
    (0..layout.numkeys)
        .map(|position| {
            let token = token_arg(args, layout.key(position) + 1)?;
            let result = parsed.results.map(|first| args.bytes(first + position));
            if let Some(result) = result {
                if result.len() > max_result {
                    return Err(CmdError::new(format!(
                        "ERR RESULT is larger than idem.max-result ({max_result} bytes)"
                    )));
                }
                check_result(result)?;
            }
            let kept = if keep_results { result } else { None };
            batch.run(position, |record| done(record, token, kept, parsed.retain, now))
        })
        .collect()
}

/// `IDEM.MRELEASE`: each key's RELEASE answer, in order.
pub fn mrelease<A: ArgList + ?Sized>(
    args: &A,
    layout: Layout,
    batch: &mut Batch<'_>,
    now: Millis,
    lifetimes: Lifetimes,
) -> Vec<Result<bool, CmdError>> {
    (0..layout.numkeys)
        .map(|position| {
            let token = token_arg(args, layout.key(position) + 1)?;
            batch.run(position, |record| release(record, token, now, lifetimes))
        })
        .collect()
}

/// Reads a batch's effect (`IDEM.MAPPLY blob key...`): `keys` records with
/// their expiries, each as `IDEM.APPLY` carries one, after a 4-byte
/// little-endian length. All of it is checked before anything is applied.
pub fn decode_effect(blob: &[u8], keys: usize) -> Result<Vec<(Record, Option<Millis>)>, DecodeError> {
    let mut input = Reader(blob);
    let mut records = Vec::new();
    while !input.0.is_empty() {
        if records.len() == keys {
            return Err(DecodeError("more records than keys"));
        }
        let len = input.u32()? as usize;
        records.push(codec::decode_effect(input.take(len)?)?);
    }
    if records.len() != keys {
        return Err(DecodeError("fewer records than keys"));
    }
    Ok(records)
}

#[cfg(test)]
mod tests;
