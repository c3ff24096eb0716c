//! The filter's byte encoding, for RDB, DUMP/RESTORE, digests and the AOF:
//! format 4, the version byte first, then the parameters and seed, each
//! shard and each of its sub-filters, with how many times their arrays
//! were folded. The bits are one array whatever chunks they are kept in
//! (see [`super::bits`]). Formats 1 to 3 were written only by development
//! builds before 0.1.0, the first release: a payload of one is refused
//! with an error that says so.
//!
//! Decoding is strict: every count and length is checked against the
//! bytes present and the module's limits before anything is allocated,
//! and only a shape the commands could have built is accepted, so that
//! whatever loads is as cheap to query as a filter the commands made: at
//! most `window + 1` shards, started at ascending multiples of the period
//! within one window of the newest; in each shard a stack whose
//! capacities follow the expansion, all full but the top, whose items add
//! up, and whose hash counts, sizes and errors are what the sizing gives
//! (within floating-point differences between builds) and sum within the
//! shard's budget; arrays folded only in closed shards, and only as far as
//! their items keep within their error; no more bits set than its items
//! can have set; and at most [`MAX_TOTAL_SUB_FILTERS`] sub-filters and
//! [`MAX_BYTES`] of bits in all, the limits the commands enforce.

use super::bits::Bits;
use super::sizing::{false_positive_rate, hash_count, rate_with_hashes, stacked_capacity, sub_filter_bytes};
use super::{
    MAX_BYTES, MAX_HASHES, MAX_SUB_FILTERS, MAX_TOTAL_SUB_FILTERS, MAX_WINDOW, PROTO_MAX_BULK_LEN, Params, Plan, Shard,
    ShardedBloom, Shards, Share, SubFilter, SubFilters, allocation_class,
};
use crate::Millis;
use crate::decode::{DecodeError, Reader};

/// The format of the filters this version writes and reads.
pub const FORMAT: u8 = 4;

/// Bytes of the format, parameters and seed ([`encode_params`]).
pub const PARAMS_LEN: usize = 1 + 8 + 8 + 4 + 8 + 4 + SEED_LEN;
/// Bytes of the parameters, seed and shard count.
const HEADER_LEN: u64 = PARAMS_LEN as u64 + 4;
const SHARD_HEADER_LEN: u64 = 8 + 8 + 4;
/// Capacity, items, error, hash count, array length and folds (see
/// [`encode_folds`]).
const SUB_FILTER_HEADER_LEN: u64 = 8 + 8 + 8 + 4 + 4 + 4;
/// The most times a sub-filter's array can have been halved: 512 MiB
/// folds to 8 bytes in 26.
const MAX_FOLDS: u32 = 26;

/// The fold field: the halvings in its low 5 bits, and above them
/// half the odd factor (rounded down) that the array was then divided
/// by. Payloads written before odd factors existed hold only halvings
/// (at most 26), which read as an odd factor of 1; builds from before
/// refuse a payload with an odd factor as a bad fold count, never
/// misread it.
fn encode_folds(sub: &SubFilter) -> u32 {
    u32::from(sub.folds) | (sub.odd_fold / 2) << 5
}

/// The halvings and the odd factor of a fold field.
fn decode_folds(field: u32) -> (u32, u32) {
    (field & 31, (field >> 5) * 2 + 1)
}
/// The most bytes a filter's encoding adds to its bits.
pub const MAX_OVERHEAD: u64 =
    HEADER_LEN + (MAX_WINDOW as u64 + 1) * SHARD_HEADER_LEN + MAX_TOTAL_SUB_FILTERS as u64 * SUB_FILTER_HEADER_LEN;
/// What `DUMP` wraps around the encoding: the type (1 byte), module id
/// (9), string opcode (1) and length (at most 9), end opcode (1), RDB
/// version (2) and checksum (8).
const DUMP_ENVELOPE: u64 = 31;
// The largest filter DUMPs within proto-max-bulk-len.
const _: () = assert!(MAX_BYTES + MAX_OVERHEAD + DUMP_ENVELOPE <= PROTO_MAX_BULK_LEN);

/// Relative slack for rates recomputed from a payload: another build's
/// `exp` or `powf` may differ in the last bits.
const RATE_TOLERANCE: f64 = 1e-9;

/// The encoding's length for `filter`.
pub fn encoded_len(filter: &ShardedBloom) -> u64 {
    HEADER_LEN
        + filter.shards.len() as u64 * SHARD_HEADER_LEN
        + filter.sub_filter_count() as u64 * SUB_FILTER_HEADER_LEN
        + filter.bytes()
}

/// What a write as `plan` adds to the encoding: its bits, the headers of
/// the sub-filters it stacks and of the shard it opens.
pub fn encoded_growth(plan: &Plan) -> u64 {
    plan.allocate
        + plan.sub_filters as u64 * SUB_FILTER_HEADER_LEN
        + if plan.opens_shard { SHARD_HEADER_LEN } else { 0 }
}

/// The length of a `DUMP` payload around an encoding of `encoded` bytes.
pub fn dumped_len(encoded: u64) -> u64 {
    encoded + DUMP_ENVELOPE
}

/// Bytes the format keeps for the seed: its 8 and 24 reserved, written as
/// zeros and ignored on reading (builds before 0.1.0 wrote random bytes
/// there, which no hash ever used).
const SEED_LEN: usize = 32;
/// Where the seed's reserved bytes lie in a payload: what decodes encodes
/// back to the same bytes but these, zeroed.
pub const SEED_RESERVED: std::ops::Range<usize> = PARAMS_LEN - (SEED_LEN - 8)..PARAMS_LEN;

pub fn encode_params(params: &Params, seed: u64, out: &mut Vec<u8>) {
    out.push(FORMAT);
    out.extend_from_slice(&params.error_rate.to_le_bytes());
    out.extend_from_slice(&params.capacity.to_le_bytes());
    out.extend_from_slice(&params.window.to_le_bytes());
    out.extend_from_slice(&params.period.to_le_bytes());
    out.extend_from_slice(&params.expansion.to_le_bytes());
    out.extend_from_slice(&seed.to_le_bytes());
    out.extend_from_slice(&[0; SEED_LEN - 8]);
}

/// The parameters and seed [`encode_params`] wrote.
pub fn decode_params(input: &mut Reader) -> Result<(Params, u64), DecodeError> {
    match input.u8()? {
        FORMAT => {}
        1..=3 => return Err(DecodeError("filter format 1 to 3, written only by development builds before 0.1.0")),
        _ => return Err(DecodeError("unknown filter format version")),
    }
    let params = Params {
        error_rate: f64::from_le_bytes(input.array()?),
        capacity: input.u64()?,
        window: input.u32()?,
        period: i64::from_le_bytes(input.array()?),
        expansion: input.u32()?,
    };
    params.check().map_err(|_| DecodeError("filter parameters out of range"))?;
    let seed = input.u64()?;
    input.take(SEED_LEN - 8)?;
    Ok((params, seed))
}

pub fn encode(filter: &ShardedBloom, out: &mut Vec<u8>) {
    out.reserve(encoded_len(filter) as usize);
    encode_params(&filter.params, filter.seed, out);
    out.extend_from_slice(&(filter.shards.len() as u32).to_le_bytes());
    for shard in &filter.shards {
        out.extend_from_slice(&shard.start.to_le_bytes());
        out.extend_from_slice(&shard.items().to_le_bytes());
        out.extend_from_slice(&(shard.filters.len() as u32).to_le_bytes());
        for sub in &shard.filters {
            out.extend_from_slice(&sub.capacity.to_le_bytes());
            out.extend_from_slice(&sub.items.to_le_bytes());
            out.extend_from_slice(&sub.error.to_le_bytes());
            out.extend_from_slice(&sub.hashes().to_le_bytes());
            out.extend_from_slice(&(sub.bits.bytes() as u32).to_le_bytes());
            out.extend_from_slice(&encode_folds(sub).to_le_bytes());
            sub.bits.write_bytes(out);
        }
    }
}

/// A filter from its encoding (RDB, `RESTORE`, a `MIGRATE` target,
/// `IDEM.BF.LOAD`): any shape the commands build, no other.
pub fn decode(bytes: &[u8]) -> Result<ShardedBloom, DecodeError> {
    let mut input = Reader(bytes);
    let (params, seed) = decode_params(&mut input)?;
    let shard_count = input.u32()?;
    // Every shard left when the newest started was live then (commands
    // drop the others first): its start is at most one window before the
    // newest's, so there are at most window + 1 starts.
    if shard_count > params.window + 1 {
        return Err(DecodeError("more shards than the window holds"));
    }
    let shard_error = params.shard_error();
    let mut total_bytes = 0u64;
    let mut total_filters = 0usize;
    let mut shards = Shards::with_capacity(shard_count as usize);
    for _ in 0..shard_count {
        let start = i64::from_le_bytes(input.array()?);
        let items = input.u64()?;
        let filter_count = input.u32()? as usize;
        // Starts come from a clock in milliseconds: at most i64::MAX / 1000.
        if !(0..=Millis::MAX / 1000).contains(&start)
            || start % params.period != 0
            || shards.last().is_some_and(|prev| prev.start >= start)
        {
            return Err(DecodeError("shard starts out of order"));
        }
        if !(1..=MAX_SUB_FILTERS).contains(&filter_count) {
            return Err(DecodeError("bad sub-filter count"));
        }
        total_filters += filter_count;
        if total_filters > MAX_TOTAL_SUB_FILTERS {
            return Err(DecodeError("too many sub-filters"));
        }
        let mut filters = SubFilters::with_capacity(filter_count);
        // The errors of the stack so far, summed in order as the sizing
        // sums them.
        let mut spent = 0.0f64;
        for _ in 0..filter_count {
            let sub = decode_sub_filter(&mut input)?;
            if let Some(below) = filters.last() {
                if below.items != below.capacity {
                    return Err(DecodeError("a sub-filter under the top one is not full"));
                }
                // Format 4 stacks grew by the expansion alone before
                // [`EXPANSION_HEIGHT`] existed: those still load.
                let height = filters.len();
                let grown = stacked_capacity(params.expansion, height, below.capacity);
                let grown_before = below.capacity.saturating_mul(params.expansion as u64).max(1);
                if sub.capacity != grown && sub.capacity != grown_before {
                    return Err(DecodeError("sub-filter capacities do not follow the expansion"));
                }
            }
            check_sizing(&sub, shard_error - spent)?;
            spent += sub.error;
            if spent > shard_error * (1.0 + RATE_TOLERANCE) {
                return Err(DecodeError("sub-filter errors exceed the shard's budget"));
            }
            total_bytes += sub.bytes();
            if total_bytes > MAX_BYTES {
                return Err(DecodeError("filter too large"));
            }
            filters.push(sub);
        }
        let sum = filters.iter().try_fold(0u64, |sum, sub| sum.checked_add(sub.items));
        if sum != Some(items) {
            return Err(DecodeError("shard item count disagrees with its sub-filters"));
        }
        shards.push(Shard { start, filters });
    }
    input.finish()?;
    // Only a closed shard folds: the newest takes items into the arrays
    // it was sized with.
    if shards.last().is_some_and(|newest| newest.filters.iter().any(|sub| sub.folds > 0 || sub.odd_fold > 1)) {
        return Err(DecodeError("the newest shard's arrays are folded"));
    }
    if let (Some(oldest), Some(newest)) = (shards.first(), shards.last())
        && oldest.start < newest.start - params.span()
    {
        return Err(DecodeError("shards further apart than the window"));
    }
    Ok(ShardedBloom { params, seed, shards })
}

fn decode_sub_filter(input: &mut Reader) -> Result<SubFilter, DecodeError> {
    let capacity = input.u64()?;
    let items = input.u64()?;
    let error = f64::from_le_bytes(input.array()?);
    let hashes = input.u32()?;
    let len = input.u32()? as u64;
    let (folds, odd_fold) = decode_folds(input.u32()?);
    if capacity == 0 || items > capacity || !(error > 0.0 && error < 1.0) {
        return Err(DecodeError("bad sub-filter counts"));
    }
    // The size it was sized with is at most the largest array.
    if folds > MAX_FOLDS || (len as u128 * odd_fold as u128) << folds > MAX_BYTES as u128 {
        return Err(DecodeError("bad fold count"));
    }
    // A crafted hash count must not make every probe loop for ages.
    if !(1..=MAX_HASHES).contains(&hashes) {
        return Err(DecodeError("bad hash count"));
    }
    if len == 0 || !len.is_multiple_of(8) || len > MAX_BYTES {
        return Err(DecodeError("bad bit-array length"));
    }
    let bits = Bits::from_bytes(input.take(len as usize)?);
    // Each item sets at most `hashes` bits.
    if bits.count_ones() > (hashes as u64).saturating_mul(items) {
        return Err(DecodeError("more bits set than the items set"));
    }
    // A fold stops where the items would exceed the error.
    if (folds > 0 || odd_fold > 1) && rate_with_hashes(len * 8, items, hashes) > error * (1.0 + RATE_TOLERANCE) {
        return Err(DecodeError("an array folded past its error"));
    }
    Ok(SubFilter { capacity, items, error, hashes: hashes as u8, folds: folds as u8, odd_fold, bits })
}

/// Whether a sub-filter is what the sizing makes for its capacity with
/// `budget` of its shard's error left: the hash count for its size, the
/// error of its size, and no larger than the sizing's largest share of
/// that budget gives (one allocation class more for another build's
/// floating point). Smaller arrays have larger errors, which the shard's
/// budget bounds.
fn check_sizing(sub: &SubFilter, budget: f64) -> Result<(), DecodeError> {
    // The bytes it was sized as: its own before any fold.
    let len = sub.sized_bytes();
    if hash_count(len * 8, sub.capacity) != sub.hashes() {
        return Err(DecodeError("hash count disagrees with the sub-filter's size"));
    }
    let rate = false_positive_rate(len * 8, sub.capacity);
    if (sub.error - rate).abs() > RATE_TOLERANCE * rate {
        return Err(DecodeError("error disagrees with the sub-filter's size"));
    }
    let largest = sub_filter_bytes(sub.capacity, budget, Share::Half).unwrap_or_else(|needed| needed);
    if largest < MAX_BYTES && len > allocation_class(largest + 1) {
        return Err(DecodeError("sub-filter larger than its sizing"));
    }
    Ok(())
}

/// The time of a replicated write's header (see [`Effect`](super::Effect)),
/// and the creation parameters after it
/// (empty for a write to an existing filter).
pub fn decode_effect_header(header: &[u8]) -> Result<(Millis, &[u8]), DecodeError> {
    let (time, create) = header.split_first_chunk::<8>().ok_or(DecodeError("truncated header"))?;
    let now = Millis::from_le_bytes(*time);
    if now < 0 {
        return Err(DecodeError("negative time"));
    }
    Ok((now, create))
}
