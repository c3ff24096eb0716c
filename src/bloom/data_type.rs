//! The sharded Bloom filter as a Redis data type: how a key holds one, and
//! what its callbacks (RDB, AOF rewrite, COPY, MEMORY USAGE, digest, lazy
//! free) do. A key's value is a boxed [`ShardedBloom`].

use std::ffi::CStr;

use idem_core::bloom::{ShardedBloom, codec};
use idem_core::error::CmdError;
use redis_module::native_types::RedisType;

use crate::host::Key;
use crate::host::background::VisitedKey;
use crate::host::data_type::{self, DataType, boxed_size, boxed_slice_size, methods, small_vec_size};

/// Encoding version of the RDB payload; a newer one is refused on load.
/// 4: filters of format 4 (fitted sizing, folded arrays), the first
/// released and the only one read (see `idem_core::bloom::codec`).
pub const ENCODING_VERSION: i32 = 4;

pub static BLOOM_TYPE: RedisType = RedisType::new("idembloom", ENCODING_VERSION, methods::<FilterType>());

pub struct FilterType;

impl DataType for FilterType {
    type Value = Box<ShardedBloom>;
    const ENCODING_VERSION: i32 = ENCODING_VERSION;
    const WHAT: &'static CStr = c"filter";
    const REWRITE_COMMAND: &'static CStr = c"IDEM.BF.LOAD";

    fn redis_type() -> &'static RedisType {
        &BLOOM_TYPE
    }

    /// One strict decoder for the server's own data and a client's
    /// `RESTORE` payload alike.
    fn load(bytes: &[u8], _loading: bool) -> Option<Box<ShardedBloom>> {
        codec::decode(bytes).ok().map(Box::new)
    }

    fn save(filter: &ShardedBloom, out: &mut Vec<u8>) {
        codec::encode(filter, out);
    }

    /// One `IDEM.BF.LOAD key blob`; Redis appends the key's `PEXPIREAT`
    /// after it.
    fn rewrite(filter: &ShardedBloom) -> Vec<u8> {
        let mut bytes = Vec::new();
        codec::encode(filter, &mut bytes);
        bytes
    }

    /// The shards' and stacks' tables once they leave the inline slot,
    /// then each array's allocations.
    fn mem_usage(filter: &ShardedBloom) -> usize {
        let mut total = small_vec_size(&filter.shards);
        for shard in &filter.shards {
            total += small_vec_size(&shard.filters);
            for sub in &shard.filters {
                let (table, chunks) = sub.bits.allocations();
                total += table.map_or(0, |table| boxed_size(table) + boxed_slice_size(table));
                total += chunks.iter().map(boxed_slice_size).sum::<usize>();
            }
        }
        total
    }

    /// One unit per allocation and per 64 KiB of bits: a filter of more
    /// than about 4 MiB goes over Redis's lazy-free threshold (64) and is
    /// freed in the background on `UNLINK`, `FLUSHALL ASYNC` or lazy
    /// expiry.
    fn free_effort(filter: &ShardedBloom) -> usize {
        let arrays: usize = (filter.shards.iter().flat_map(|shard| &shard.filters))
            .map(|sub| match sub.bits.allocations() {
                (Some(_), chunks) => 2 + chunks.len(),
                (None, chunks) => chunks.len(),
            })
            .sum();
        let stacks = filter.shards.iter().filter(|shard| shard.filters.spilled()).count();
        1 + usize::from(filter.shards.spilled()) + stacks + arrays + (filter.bytes() >> 16) as usize
    }

    fn copy(filter: &ShardedBloom) -> Box<ShardedBloom> {
        Box::new(filter.clone())
    }
}

/// The filter under an open key, for as long as the key is borrowed;
/// `Err(WRONGTYPE)` for another type.
pub fn open<'k>(key: &'k mut Key<'_>) -> Result<Option<&'k mut ShardedBloom>, CmdError> {
    data_type::value_mut::<FilterType>(key)
}

/// The filter a walk visits, if the key holds one.
pub fn visited<'k>(key: &'k VisitedKey<'_>) -> Option<&'k ShardedBloom> {
    data_type::visited_value::<FilterType>(key)
}

/// Makes `key` hold `filter`, expiring when its newest shard leaves the
/// window.
pub fn store(key: &mut Key<'_>, filter: Box<ShardedBloom>) {
    let expire_at = filter.expire_at();
    data_type::set_value::<FilterType>(key, filter);
    key.set_expire_at(expire_at);
}

/// Makes `key` hold `filter` with no expiry (the AOF rewrite's
/// `IDEM.BF.LOAD` is followed by the key's own `PEXPIREAT`, if it has one).
pub fn store_without_expiry(key: &mut Key<'_>, filter: ShardedBloom) {
    data_type::set_value::<FilterType>(key, Box::new(filter));
}
