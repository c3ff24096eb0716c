//! The sharded filter without a server, one file per seam of the code
//! (`sizing`, `plan`, `fold`, `write`, `decoding` for the codec); here,
//! what they share: fixed times and seeds, filters and items to test
//! with, and the single insertions the tests make.

use proptest::prelude::*;

use super::codec;
use super::sizing::{false_positive_rate, hash_count, rate_with_hashes, sub_filter_bytes};
use super::*;
use crate::error::CmdError;

const T0: Millis = 1_800_000_000_000 - 1_800_000_000_000 % (DAY * 1000);
/// Any fixed seed: the tests must be repeatable.
const SEED: u64 = 0x0ee9_c49f_7a55_300b;

/// Single insertions, as the tests make them: each as a write of that
/// item alone would, drops first.
impl ShardedBloom {
    /// Records the item past any plan (sub-filters sized within the hard
    /// limits); `true` when it was new to the window.
    fn add(&mut self, item: ItemHash, now: Millis) -> Result<bool, BloomError> {
        self.drop_expired(now);
        self.insert(item, now, |filter| filter.next_sub_filter(now)).map(Added::is_new)
    }

    /// [`insert_planned`](Self::insert_planned), its answer.
    fn add_planned(&mut self, plan: &mut Plan, item: ItemHash, now: Millis) -> bool {
        self.drop_expired(now);
        self.insert_planned(plan, item, now).is_new()
    }

    /// What [`new`](Self::new) would allocate, or why it would fail.
    fn plan_new(params: &Params, now: Millis, max_bytes: u64) -> Result<Plan, BloomError> {
        params.check()?;
        let empty = ShardedBloom { params: *params, seed: 0, shards: Shards::new() };
        empty.plan(1, now, max_bytes)
    }
}

fn new_filter(params: Params, seed: u64, now: Millis) -> Result<ShardedBloom, BloomError> {
    ShardedBloom::new(params, seed, now, MAX_BYTES)
}

fn params(error_rate: f64, capacity: u64, window: u32, period: Seconds) -> Params {
    Params { error_rate, capacity, window, period, expansion: 2 }
}

fn item(prefix: &str, n: u64) -> Vec<u8> {
    format!("{prefix}:{n:012}").into_bytes()
}

fn add_all(filter: &mut ShardedBloom, prefix: &str, range: std::ops::Range<u64>, now: Millis) -> u64 {
    let mut new = 0;
    for n in range {
        let hash = filter.hash(&item(prefix, n));
        new += filter.add(hash, now).unwrap() as u64;
    }
    new
}

fn false_positives(filter: &ShardedBloom, queries: u64, now: Millis) -> f64 {
    let hits = (0..queries).filter(|&n| filter.contains(filter.hash(&item("fresh", n)), now)).count();
    hits as f64 / queries as f64
}

/// Allowed sampling excess over the target rate: four standard deviations.
fn slack(rate: f64, queries: u64) -> f64 {
    4.0 * (rate * (1.0 - rate) / queries as f64).sqrt()
}

fn unhex(lines: &[&str]) -> Vec<u8> {
    let hex: String = lines.concat();
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect()
}

fn encoded(filter: &ShardedBloom) -> Vec<u8> {
    let mut bytes = Vec::new();
    codec::encode(filter, &mut bytes);
    bytes
}

/// Pseudo-random item hashes, repeatable.
fn hashes(seed: u64, n: usize) -> Vec<ItemHash> {
    let mut state = seed;
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    (0..n).map(|_| ItemHash(((next() as u128) << 64) | next() as u128)).collect()
}

/// Median of `runs` timings of `f`.
fn median_time(runs: usize, mut f: impl FnMut()) -> std::time::Duration {
    let mut times: Vec<_> = (0..runs)
        .map(|_| {
            let start = std::time::Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    times.sort();
    times[runs / 2]
}

/// A valid filter with a full window: three 10 s shards of a window of
/// 2 (the oldest live through the newest's first millisecond), the
/// first stacked three high.
fn three_shards() -> ShardedBloom {
    let mut filter = new_filter(Params { expansion: 2, ..params(0.1, 4, 2, 10) }, SEED, T0).unwrap();
    add_all(&mut filter, "a", 0..20, T0);
    add_all(&mut filter, "b", 0..12, T0 + 10_000);
    add_all(&mut filter, "c", 0..3, T0 + 20_000);
    assert_eq!(filter.shards.len(), 3);
    assert_eq!(filter.shards[0].filters.len(), 3);
    filter
}

/// A stack of `height` sub-filters of `capacity` (EXPANSION 1), all full,
/// sized as the commands size them, in each of `shards` shards of 1 s.
fn stacked(error_rate: f64, window: u32, shards: i64, height: usize, capacity: u64) -> ShardedBloom {
    let params = Params { error_rate, capacity, window, period: 1, expansion: 1 };
    let filters = |_| {
        let mut spent = 0.0;
        (0..height)
            .map(|_| {
                let bytes = sub_filter_bytes(capacity, params.shard_error() - spent, Share::Half).unwrap();
                let mut sub = SubFilter::new(capacity, bytes);
                spent += sub.error;
                sub.items = capacity;
                sub
            })
            .collect()
    };
    let shards = (0..shards).map(|start| Shard { start, filters: filters(start) }).collect();
    ShardedBloom { params, seed: SEED, shards }
}

fn refusal(filter: &ShardedBloom) -> &'static str {
    match codec::decode(&encoded(filter)) {
        Ok(_) => "accepted",
        Err(error) => error.0,
    }
}

/// A filter of 1 s shards, window 2: shard 0 reserved at `capacity` and
/// given `items`, then shard 1 opened with 10.
fn closed_after(capacity: u64, items: u64) -> ShardedBloom {
    let mut filter = new_filter(params(0.01, capacity, 2, 1), SEED, T0).unwrap();
    add_all(&mut filter, "a", 0..items, T0);
    add_all(&mut filter, "b", 0..10, T0 + 1_000);
    filter
}

mod decoding;
mod fold;
mod plan;
mod sizing;
mod write;

#[test]
fn a_small_filter_is_one_allocation_beside_its_bits() {
    // A key holds a boxed filter: with its first shard and that shard's
    // first sub-filter inline, and an array kept whole, a filter for its
    // first period costs the box and its bits. Under 128 bytes: a filter
    // per tenant pays this per tenant (issue 18).
    assert!(allocation_class(size_of::<ShardedBloom>() as u64) < 128, "{} bytes", size_of::<ShardedBloom>());
    let filter = new_filter(params(0.01, 1_000, 7, DAY), SEED, T0).unwrap();
    assert!(!filter.shards.spilled() && !filter.shards[0].filters.spilled());
    let (table, chunks) = filter.shards[0].filters[0].bits.allocations();
    assert!(table.is_none() && chunks.len() == 1);
    // Past the first shard, the shards move to a table of their own.
    let mut filter = filter;
    filter.add(filter.hash(b"next"), T0 + DAY * 1000).unwrap();
    assert_eq!(filter.shards.len(), 2);
    assert!(filter.shards.spilled());
}
