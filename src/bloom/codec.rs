//! The filter's byte encoding, for RDB, DUMP/RESTORE, digests and the AOF.
//!
//! Decoding is strict: every count and length is checked against the
//! bytes present and the module's limits before anything is allocated.

use super::bits::Bits;
use super::{MAX_BYTES, MAX_HASHES, MAX_SUB_FILTERS, MAX_WINDOW, Params, Shard, ShardedBloom, SubFilter};
use crate::record::codec::{DecodeError, Reader};

pub const FORMAT_VERSION: u8 = 1;


pub fn encode_params(params: &Params, seed: &[u8; 32], out: &mut Vec<u8>) {
    out.push(FORMAT_VERSION);
    out.extend_from_slice(&params.error_rate.to_le_bytes());
    out.extend_from_slice(&params.capacity.to_le_bytes());
    out.extend_from_slice(&params.window.to_le_bytes());
    out.extend_from_slice(&params.period.to_le_bytes());
    out.extend_from_slice(&params.expansion.to_le_bytes());
    out.extend_from_slice(seed);
}

pub fn decode_params(input: &mut Reader) -> Result<(Params, [u8; 32]), DecodeError> {
    if input.u8()? != FORMAT_VERSION {
        return Err(DecodeError("unknown filter format version"));
    }
    let params = Params {
        error_rate: f64::from_le_bytes(input.array()?),
        capacity: input.u64()?,
        window: input.u32()?,
        period: i64::from_le_bytes(input.array()?),
        expansion: input.u32()?,
    };
    params.check().map_err(|_| DecodeError("filter parameters out of range"))?;
    Ok((params, input.array()?))
}

pub fn encode(filter: &ShardedBloom, out: &mut Vec<u8>) {
    out.reserve(64 + filter.bytes() as usize + 64 * filter.sub_filter_count());
    encode_params(&filter.params, &filter.seed, out);
    out.extend_from_slice(&(filter.shards.len() as u32).to_le_bytes());
    for shard in &filter.shards {
        out.extend_from_slice(&shard.start.to_le_bytes());
        out.extend_from_slice(&shard.items.to_le_bytes());
        out.extend_from_slice(&(shard.filters.len() as u32).to_le_bytes());
        for sub in &shard.filters {
            out.extend_from_slice(&sub.capacity.to_le_bytes());
            out.extend_from_slice(&sub.items.to_le_bytes());
            out.extend_from_slice(&sub.error.to_le_bytes());
            out.extend_from_slice(&sub.bits.hashes().to_le_bytes());
            out.extend_from_slice(&(sub.bits.bytes() as u32).to_le_bytes());
            sub.bits.write_bytes(out);
        }
    }
}

pub fn decode(bytes: &[u8]) -> Result<ShardedBloom, DecodeError> {
    let mut input = Reader(bytes);
    let (params, seed) = decode_params(&mut input)?;
    let shard_count = input.u32()?;
    if shard_count > 2 * MAX_WINDOW {
        return Err(DecodeError("too many shards"));
    }
    let mut total_bytes = 0u64;
    let mut shards: Vec<Shard> = Vec::new();
    for _ in 0..shard_count {
        let start = i64::from_le_bytes(input.array()?);
        let items = input.u64()?;
        let filter_count = input.u32()? as usize;
        if start < 0 || start % params.period != 0 || shards.last().is_some_and(|prev| prev.start >= start) {
            return Err(DecodeError("shard starts out of order"));
        }
        if !(1..=MAX_SUB_FILTERS).contains(&filter_count) {
            return Err(DecodeError("bad sub-filter count"));
        }
        let mut filters = Vec::new();
        for _ in 0..filter_count {
            let sub = decode_sub_filter(&mut input)?;
            total_bytes += sub.bytes();
            if total_bytes > MAX_BYTES {
                return Err(DecodeError("filter too large"));
            }
            filters.push(sub);
        }
        if filters.iter().map(|f| f.items).sum::<u64>() != items {
            return Err(DecodeError("shard item count disagrees with its sub-filters"));
        }
        shards.push(Shard { start, items, filters });
    }
    input.finish()?;
    Ok(ShardedBloom { params, seed, shards })
}

fn decode_sub_filter(input: &mut Reader) -> Result<SubFilter, DecodeError> {
    let capacity = input.u64()?;
    let items = input.u64()?;
    let error = f64::from_le_bytes(input.array()?);
    let hashes = input.u32()?;
    let len = input.u32()? as u64;
    if capacity == 0 || items > capacity || !(0.0..1.0).contains(&error) {
        return Err(DecodeError("bad sub-filter counts"));
    }
    // A crafted hash count must not make every probe loop for ages.
    if !(1..=MAX_HASHES).contains(&hashes) {
        return Err(DecodeError("bad hash count"));
    }
    if len == 0 || len % 8 != 0 || len > MAX_BYTES {
        return Err(DecodeError("bad bit-array length"));
    }
    let bits = Bits::from_bytes(input.take(len as usize)?, hashes);
    Ok(SubFilter { capacity, items, error, bits })
}
