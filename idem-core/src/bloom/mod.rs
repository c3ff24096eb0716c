//! The date-sharded Bloom filter: pure Rust, the clock passed in.
//!
//! One filter holds a shard per period (a UTC day by default). An item is
//! "seen" when any shard of the last `window` periods holds it; older shards
//! are dropped. Each shard stacks sub-filters as it fills, each taking a
//! share of what is left of the shard's error budget (see [`Share`]), so a
//! shard never exceeds `error_rate / window` and the whole window never
//! exceeds `error_rate`, however many items arrive.
//!
//! A new shard's capacity follows the previous shards' counts; its arrays
//! are sized to the byte in chunks of the allocator's classes, and when the
//! next shard opens they fold to what their items need (see [`Bits::fold`]).
//!
//! Every decision depends only on the filter's state and the `now` passed
//! in, so a replica or an AOF replay given the primary's `now` ends up with
//! the same bits. The seams: [`params`] (settings, bounds, errors),
//! [`sizing`] (arrays, rates, a new shard's capacity), [`plan`] (a write
//! planned against the limits, then executed), [`fold`] (closed shards
//! shrink), [`write`] (the one entry point of every write), [`codec`] and
//! [`bits`].

pub mod bits;
pub mod codec;
mod fold;
mod params;
mod plan;
mod sizing;
mod write;

use bits::Bits;
pub use bits::{allocated_bytes, allocation_class, fitted_bytes};
pub use params::*;
pub use plan::{Added, Plan};
pub use sizing::{EXPANSION_HEIGHT, GROWTH_MARGIN, HEADROOM, MAX_HASHES, MAX_TREND_FALL, MAX_TREND_RISE, Share};
pub use smallvec::SmallVec;
pub use write::{Answers, Effect, FixedLimits, HardLimits, KeyChange, Limits, NewFilter, WhenGone, Written};
use xxhash_rust::xxh3::xxh3_128_with_seed;

use crate::Millis;

/// Unix time or a duration in whole seconds.
pub type Seconds = i64;

pub const DAY: Seconds = 86_400;
pub const HOUR: Seconds = 3_600;

/// An item hashed once per command; every sub-filter probes with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ItemHash(u128);

/// One Bloom filter of a shard's stack.
///
/// A filter's structures are laid out so that a filter of one shard of one
/// sub-filter (every new filter, and every small one for its first period)
/// is one allocation beside its bits: a shard keeps its first sub-filter,
/// and a filter its first shard, inline ([`SmallVec`]). That costs the
/// narrow counts here: a filter per tenant pays its structures per tenant.
#[derive(Clone)]
pub struct SubFilter {
    pub capacity: u64,
    pub items: u64,
    /// Its false-positive rate when full, as sized.
    pub error: f64,
    /// Probes per item, at most [`MAX_HASHES`].
    pub hashes: u8,
    /// How many times its array was halved since it was sized (see
    /// [`Bits::fold`]): `bits` holds its sized bytes over `2^folds`, and
    /// over `odd_fold` more.
    pub folds: u8,
    /// The odd factor its array was then divided by, where halving
    /// stopped at an odd number of words (see [`Bits::fold_by`]); 1 when
    /// it was not.
    pub odd_fold: u32,
    pub bits: Bits,
}

/// A shard's stack of sub-filters, the first one inline.
pub type SubFilters = SmallVec<[SubFilter; 1]>;
/// A filter's shards, the first one inline.
pub type Shards = SmallVec<[Shard; 1]>;

#[derive(Clone)]
pub struct Shard {
    /// Unix seconds, a multiple of the period.
    pub start: Seconds,
    /// Never empty; all full but the top one.
    pub filters: SubFilters,
}

#[derive(Clone)]
pub struct ShardedBloom {
    pub params: Params,
    /// Hash seed, chosen once on the primary; persisted and replicated.
    pub seed: u64,
    /// Oldest first.
    pub shards: Shards,
}

impl SubFilter {
    pub fn bytes(&self) -> u64 {
        self.bits.bytes()
    }

    pub fn hashes(&self) -> u32 {
        u32::from(self.hashes)
    }

    fn check(&self, item: ItemHash) -> bool {
        self.bits.check(item, self.hashes())
    }
}

impl Shard {
    /// Whether the shard is in a window of `span` seconds at `now`. Its
    /// end is the key's expiry, and Redis keeps a key through the very
    /// millisecond of its expiry (`now > expire_at` expires it): so does
    /// the shard, or a key Redis still holds would have no live shard.
    fn live_at(&self, span: Seconds, now: Millis) -> bool {
        now <= self.start.saturating_add(span).saturating_mul(1000)
    }

    fn contains(&self, item: ItemHash) -> bool {
        self.filters.iter().any(|filter| filter.check(item))
    }

    /// Insertions into this shard: its sub-filters' items (saturating,
    /// for a filter built to test a payload that claims absurd counts).
    pub fn items(&self) -> u64 {
        self.filters.iter().fold(0, |sum, filter| sum.saturating_add(filter.items))
    }

    pub fn bytes(&self) -> u64 {
        self.filters.iter().map(SubFilter::bytes).sum()
    }
}

impl ShardedBloom {
    pub fn hash(&self, item: &[u8]) -> ItemHash {
        ItemHash(xxh3_128_with_seed(item, self.seed))
    }

    /// Start of the shard that `now` falls in.
    pub fn shard_start(&self, now: Millis) -> Seconds {
        now.div_euclid(1000).div_euclid(self.params.period) * self.params.period
    }

    /// Whether any shard is still in the window at `now`. A filter with
    /// none is gone for every command, even while its key lingers (a
    /// user's TTL can outlast the window).
    pub fn is_alive(&self, now: Millis) -> bool {
        self.shards.iter().any(|shard| self.is_live(shard, now))
    }

    /// Whether `shard` is still in the window at `now`.
    pub fn is_live(&self, shard: &Shard, now: Millis) -> bool {
        shard.live_at(self.params.span(), now)
    }

    /// Drops shards that left the window; `true` if any did.
    pub fn drop_expired(&mut self, now: Millis) -> bool {
        let live_from = self.shards.iter().position(|shard| self.is_live(shard, now)).unwrap_or(self.shards.len());
        // Most writes drop nothing: no drain to set up and tear down.
        if live_from == 0 {
            return false;
        }
        self.shards.drain(..live_from);
        true
    }

    /// Unix ms at which the newest shard leaves the window: the key's expiry.
    pub fn expire_at(&self) -> Option<Millis> {
        let newest = self.shards.last()?;
        Some(newest.start.saturating_add(self.params.span()).saturating_mul(1000))
    }

    /// Whether any shard still in the window may hold the item.
    pub fn contains(&self, item: ItemHash, now: Millis) -> bool {
        self.shards.iter().rev().any(|shard| self.is_live(shard, now) && shard.contains(item))
    }

    pub fn items(&self) -> u64 {
        self.shards.iter().map(Shard::items).sum()
    }

    pub fn bytes(&self) -> u64 {
        self.shards.iter().map(Shard::bytes).sum()
    }

    pub fn sub_filter_count(&self) -> usize {
        self.shards.iter().map(|shard| shard.filters.len()).sum()
    }
}

#[cfg(test)]
mod tests;
