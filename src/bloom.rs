//! The date-sharded Bloom filter: pure Rust, the clock passed in.
//!
//! One filter holds a shard per period (a UTC day by default). An item is
//! "seen" when any shard of the last `window` periods holds it; older shards
//! are dropped. Each shard stacks sub-filters as it fills, each taking half
//! of what is left of the shard's error budget, so a shard never exceeds
//! `error_rate / window` and the whole window never exceeds `error_rate`,
//! however many items arrive.
//!
//! Every decision depends only on the filter's state and the `now` passed
//! in, so a replica or an AOF replay given the primary's `now` ends up with
//! the same bits.

pub mod bits;
pub mod codec;

use bits::Bits;
use xxhash_rust::xxh3::xxh3_128_with_seed;

use crate::record::Millis;

/// Unix time or a duration in whole seconds.
pub type Seconds = i64;

pub const DAY: Seconds = 86_400;
pub const HOUR: Seconds = 3_600;

/// Largest window: a year of hourly shards.
pub const MAX_WINDOW: u32 = 8_784;
/// Largest expansion factor between stacked sub-filters.
pub const MAX_EXPANSION: u32 = 1_024;
/// Most sub-filters one shard stacks; with expansion 1 that is the limit on
/// growth, with 2 a billion-fold.
pub const MAX_SUB_FILTERS: usize = 32;
/// Largest filter, all shards together: big enough for a billion items a
/// day at 1%, small enough to save and replicate as one Redis string.
pub const MAX_BYTES: u64 = 512 * 1024 * 1024 - 64 * 1024;
/// Smallest error rate: one false positive in a billion queries. Below it
/// a filter costs over 43 bits per item per shard for a difference no
/// one can measure, and rates like 1e-300 overflow the sizing.
pub const MIN_ERROR_RATE: f64 = 1e-9;

/// Largest period: a century.
pub const MAX_PERIOD: Seconds = 100 * 365 * DAY;
/// A new shard's capacity is the previous shard's item count times this
/// when that is the only period of history: no trend to follow yet, so
/// room for ordinary day-to-day variation without stacking a second
/// sub-filter.
pub const HEADROOM: f64 = 1.1;
/// With two periods of history the headroom is their growth (a decline
/// counts as none: often a one-off, and a shard sized too small stacks a
/// sub-filter costing about twice its first one) plus this margin for the
/// forecast's error. Small: steady traffic varies by little more, a day
/// that outgrows it still keeps the rate by stacking, and every percent of
/// headroom is a percent of every shard's bytes.
pub const GROWTH_MARGIN: f64 = 0.03;
/// The most headroom growth earns: one period's jump is a weak forecast
/// (a spike, or a first shard that started mid-period), so steeper growth
/// is left to stacking, which keeps the rate too; a quarter still covers
/// 20% a day with its margin.
pub const MAX_GROWTH_HEADROOM: f64 = 1.25;

/// The filter's settings, fixed at creation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Params {
    /// False-positive rate of one query against the whole window.
    pub error_rate: f64,
    /// Capacity of the first shard.
    pub capacity: u64,
    pub window: u32,
    /// Shard period in seconds; shard starts are multiples of it.
    pub period: Seconds,
    /// Capacity factor from one sub-filter to the next in a shard.
    pub expansion: u32,
}

#[derive(Debug, PartialEq, Eq)]
pub enum BloomError {
    /// An argument out of range, with the message to show.
    Invalid(&'static str),
    /// The filter would outgrow `MAX_BYTES` or `MAX_SUB_FILTERS`.
    TooLarge,
}

impl Params {
    pub fn check(&self) -> Result<(), BloomError> {
        if !(self.error_rate >= MIN_ERROR_RATE && self.error_rate < 1.0) {
            return Err(BloomError::Invalid("error_rate must be at least 1e-9 and less than 1"));
        }
        if self.capacity < 1 {
            return Err(BloomError::Invalid("capacity must be at least 1"));
        }
        if !(1..=MAX_WINDOW).contains(&self.window) {
            return Err(BloomError::Invalid("WINDOW must be between 1 and 8784"));
        }
        if !(1..=MAX_PERIOD).contains(&self.period) {
            return Err(BloomError::Invalid("SHARD must be DAY, HOUR or a number of seconds >= 1"));
        }
        if !(1..=MAX_EXPANSION).contains(&self.expansion) {
            return Err(BloomError::Invalid("EXPANSION must be between 1 and 1024"));
        }
        Ok(())
    }

    /// The error budget of one shard.
    fn shard_error(&self) -> f64 {
        self.error_rate / self.window as f64
    }

    /// How long a shard stays in the window after it starts.
    fn span(&self) -> Seconds {
        self.period * self.window as Seconds
    }
}

/// An item hashed once per command; every sub-filter probes with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ItemHash(u128);

/// One Bloom filter of a shard's stack.
#[derive(Clone)]
pub struct SubFilter {
    pub capacity: u64,
    pub items: u64,
    /// Its false-positive rate when full, as sized.
    pub error: f64,
    pub bits: Bits,
}

#[derive(Clone)]
pub struct Shard {
    /// Unix seconds, a multiple of the period.
    pub start: Seconds,
    /// Insertions into this shard.
    pub items: u64,
    pub filters: Vec<SubFilter>,
}

#[derive(Clone)]
pub struct ShardedBloom {
    pub params: Params,
    /// Hash seed, chosen once on the primary; persisted and replicated.
    pub seed: [u8; 32],
    /// Oldest first.
    pub shards: Vec<Shard>,
}

/// Bytes jemalloc (Redis's allocator) really takes for a request of
/// `size`: four size classes per doubling above 64 bytes.
pub fn allocation_class(size: u64) -> u64 {
    match size {
        0..=8 => 8,
        9..=16 => 16,
        17..=64 => size.div_ceil(16) * 16,
        _ => {
            let spacing = size.next_power_of_two() / 8;
            size.div_ceil(spacing) * spacing
        }
    }
}

/// The largest allocation class not above `size` (`size` >= 8).
fn allocation_class_below(size: u64) -> u64 {
    let class = allocation_class(size);
    if class == size {
        return class;
    }
    // Classes are at most 1/4 apart: the one below is within 25%.
    let mut below = size * 3 / 4;
    while allocation_class(below + 1) <= size {
        below = allocation_class(below + 1);
    }
    below
}

/// Most hash functions a sub-filter uses: past about 20 (a rate of one in
/// a million) more probes buy little and cost a cache miss each.
pub const MAX_HASHES: u32 = 20;

/// Hash functions for `bits` bits holding `items` items: the optimum,
/// capped.
fn hash_count(bits: u64, items: u64) -> u32 {
    ((bits as f64 / items as f64) * std::f64::consts::LN_2).round().clamp(1.0, MAX_HASHES as f64) as u32
}

/// A floor under the false-positive rate of small bit arrays, times the
/// array's size: an item whose probe step maps to less than one bit (one
/// in `m`) puts all its probes on a few neighbouring bits, and is "seen"
/// if those are set, about half the time at capacity. Negligible for large
/// arrays; it keeps small ones honest.
const COLLAPSE_FLOOR: f64 = 0.75;

/// False-positive rate of `bits` bits holding `items` items.
fn false_positive_rate(bits: u64, items: u64) -> f64 {
    let k = hash_count(bits, items) as f64;
    (1.0 - (-k * items as f64 / bits as f64).exp()).powf(k) + COLLAPSE_FLOOR / bits as f64
}

/// How much of its shard's remaining error budget a sub-filter takes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Share {
    /// Capacity is a guess (reserved, configured, or a stacked sub-filter
    /// that the first one overflowed into): aim at half the budget, keeping
    /// the other half for growth.
    Half,
    /// Capacity comes from the previous shard's real count: growth is
    /// unlikely, so aim at nine tenths.
    Most,
}

impl Share {
    /// The fraction aimed at, and the most it may take after rounding to
    /// an allocation class.
    fn fractions(self) -> (f64, f64) {
        match self {
            Share::Half => (0.5, 0.9),
            Share::Most => (0.9, 0.97),
        }
    }
}

/// Bit-array bytes for a sub-filter of `capacity` items with `budget` of
/// error left in its shard. It aims at its share of the budget, then fills
/// its allocation class exactly: the class just below the ideal size if
/// that stays within the share's limit, else the one above. Redis would
/// charge for the whole class anyway.
fn sub_filter_bytes(capacity: u64, budget: f64, share: Share) -> Option<u64> {
    let (aim, limit) = share.fractions();
    let ln2_squared = std::f64::consts::LN_2 * std::f64::consts::LN_2;
    let target = budget * aim;
    // The optimum for the rate alone, then grown until the capped hash
    // count and the collapse floor fit the target too.
    let mut ideal_bits = ((capacity as f64) * -target.ln() / ln2_squared).max(2.0 * COLLAPSE_FLOOR / target);
    while ideal_bits.is_finite() && ideal_bits < 8.0 * MAX_BYTES as f64 {
        if false_positive_rate(ideal_bits.ceil() as u64, capacity) <= target {
            break;
        }
        ideal_bits *= 1.05;
    }
    let ideal_bytes = (ideal_bits / 8.0).ceil().max(8.0);
    if !ideal_bytes.is_finite() || ideal_bytes > MAX_BYTES as f64 {
        return None;
    }
    // Allocation classes are multiples of 8 bytes: whole words.
    let ideal_bytes = ideal_bytes as u64;
    let below = allocation_class_below(ideal_bytes);
    let bytes = if false_positive_rate(below * 8, capacity) <= limit * budget {
        below
    } else {
        allocation_class(ideal_bytes)
    };
    Some(bytes)
}

impl SubFilter {
    fn new(capacity: u64, budget: f64, share: Share) -> Result<SubFilter, BloomError> {
        let bytes = sub_filter_bytes(capacity, budget, share).ok_or(BloomError::TooLarge)?;
        let bits = Bits::new(bytes, hash_count(bytes * 8, capacity));
        Ok(SubFilter { capacity, items: 0, error: false_positive_rate(bytes * 8, capacity), bits })
    }

    pub fn bytes(&self) -> u64 {
        self.bits.bytes()
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
        self.filters.iter().any(|filter| filter.bits.check(item))
    }

    pub fn bytes(&self) -> u64 {
        self.filters.iter().map(SubFilter::bytes).sum()
    }

    /// What is left of the shard's error budget for the next sub-filter.
    fn budget_left(&self, params: &Params) -> f64 {
        params.shard_error() - self.filters.iter().map(|f| f.error).sum::<f64>()
    }

    /// Capacity of the sub-filter that would come next.
    fn next_capacity(&self, params: &Params) -> u64 {
        let last = self.filters.last().map_or(0, |f| f.capacity);
        last.saturating_mul(params.expansion as u64).max(1)
    }
}

impl ShardedBloom {
    /// A filter with its first shard allocated at `capacity`, as `RESERVE`
    /// and an `ADD` on a missing key make it.
    pub fn new(params: Params, seed: [u8; 32], now: Millis) -> Result<ShardedBloom, BloomError> {
        params.check()?;
        let mut filter = ShardedBloom { params, seed, shards: Vec::new() };
        filter.check_room(1, now)?;
        let first = SubFilter::new(params.capacity, params.shard_error(), Share::Half)?;
        filter.shards.push(Shard { start: filter.shard_start(now), items: 0, filters: vec![first] });
        Ok(filter)
    }

    pub fn hash(&self, item: &[u8]) -> ItemHash {
        let seed = u64::from_le_bytes(self.seed[..8].try_into().expect("8 bytes"));
        ItemHash(xxh3_128_with_seed(item, seed))
    }

    /// Start of the shard that `now` falls in.
    pub fn shard_start(&self, now: Millis) -> Seconds {
        now.div_euclid(1000).div_euclid(self.params.period) * self.params.period
    }

    /// Whether `shard` is still in the window at `now`.
    pub fn is_live(&self, shard: &Shard, now: Millis) -> bool {
        shard.live_at(self.params.span(), now)
    }

    /// Drops shards that left the window; `true` if any did.
    pub fn drop_expired(&mut self, now: Millis) -> bool {
        let live_from = self.shards.iter().position(|shard| self.is_live(shard, now)).unwrap_or(self.shards.len());
        self.shards.drain(..live_from);
        live_from > 0
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

    /// Capacity and budget share of a shard started at `now`: the newest
    /// live shard's final count with headroom, or `capacity` when there is
    /// none (or it saw no items). The headroom is the growth from the live
    /// shard before the newest to the newest plus [`GROWTH_MARGIN`], at
    /// most [`MAX_GROWTH_HEADROOM`], or [`HEADROOM`] when that shard is
    /// missing or empty. Only shards live at `now` count, so
    /// [`check_room`](Self::check_room) before
    /// [`drop_expired`](Self::drop_expired) sizes what [`add`](Self::add)
    /// after it allocates.
    fn new_shard_sizing(&self, now: Millis) -> (u64, Share) {
        let mut live = self.shards.iter().rev().filter(|shard| self.is_live(shard, now));
        let (newest, previous) = match (live.next(), live.next()) {
            (Some(newest), previous) if newest.items > 0 => (newest.items, previous.map_or(0, |shard| shard.items)),
            _ => return (self.params.capacity, Share::Half),
        };
        let headroom = if previous > 0 {
            let growth = (newest as f64 / previous as f64 - 1.0).max(0.0);
            (1.0 + growth + GROWTH_MARGIN).min(MAX_GROWTH_HEADROOM)
        } else {
            HEADROOM
        };
        ((newest as f64 * headroom).ceil() as u64, Share::Most)
    }

    /// The shard that takes items at `now`: the newest one if `now` falls
    /// in it, or later (a clock that stepped back never writes into an
    /// older shard than one already written), else none yet.
    fn shard_for(&self, now: Millis) -> Option<&Shard> {
        self.shards.last().filter(|newest| newest.start >= self.shard_start(now))
    }

    /// Whether `n` more insertions at `now` fit the limits on size and
    /// stacking. Allocates nothing; [`add`](Self::add) cannot fail after it.
    pub fn check_room(&self, n: u64, now: Millis) -> Result<(), BloomError> {
        // The common case: the current shard's top sub-filter has room.
        if let Some(top) = self.shard_for(now).and_then(|shard| shard.filters.last()) {
            if top.capacity - top.items >= n {
                return Ok(());
            }
        }
        let params = &self.params;
        let mut bytes: u64 = self.shards.iter().filter(|s| self.is_live(s, now)).map(Shard::bytes).sum();
        // The stack that takes the items: room left in its top sub-filter,
        // the next sub-filter's capacity, the error budget left, its height.
        let (mut room, mut next_capacity, mut share, mut budget, mut height) = match self.shard_for(now) {
            Some(shard) => {
                let top = shard.filters.last().expect("a shard has a sub-filter");
                let room = top.capacity.saturating_sub(top.items);
                (room, shard.next_capacity(params), Share::Half, shard.budget_left(params), shard.filters.len())
            }
            None => {
                let (capacity, share) = self.new_shard_sizing(now);
                (0, capacity, share, params.shard_error(), 0)
            }
        };
        let mut left = n;
        while left > room {
            left -= room;
            if height >= MAX_SUB_FILTERS {
                return Err(BloomError::TooLarge);
            }
            let filter_bytes = sub_filter_bytes(next_capacity, budget, share).ok_or(BloomError::TooLarge)?;
            bytes += filter_bytes;
            if bytes > MAX_BYTES {
                return Err(BloomError::TooLarge);
            }
            budget -= false_positive_rate(filter_bytes * 8, next_capacity);
            room = next_capacity;
            next_capacity = next_capacity.saturating_mul(params.expansion as u64);
            share = Share::Half;
            height += 1;
        }
        Ok(())
    }

    /// Records the item in the current shard unless it is already there.
    /// `true` when no shard of the window had seen it. Call
    /// [`drop_expired`](Self::drop_expired) and
    /// [`check_room`](Self::check_room) first.
    ///
    /// One pass over the shards, each sub-filter probed once.
    pub fn add(&mut self, item: ItemHash, now: Millis) -> Result<bool, BloomError> {
        if self.shard_for(now).is_none() {
            let (capacity, share) = self.new_shard_sizing(now);
            let first = SubFilter::new(capacity, self.params.shard_error(), share)?;
            let start = self.shard_start(now);
            self.shards.push(Shard { start, items: 0, filters: vec![first] });
        }
        let params = self.params;
        let span = params.span();
        let (current, older) = self.shards.split_last_mut().expect("a shard exists");
        let (top, lower) = current.filters.split_last().expect("a shard has a sub-filter");
        if lower.iter().any(|filter| filter.bits.check(item)) {
            return Ok(false);
        }
        if top.items >= top.capacity {
            if top.bits.check(item) {
                return Ok(false);
            }
            if current.filters.len() >= MAX_SUB_FILTERS {
                return Err(BloomError::TooLarge);
            }
            let next = SubFilter::new(current.next_capacity(&params), current.budget_left(&params), Share::Half)?;
            current.filters.push(next);
        }
        let top = current.filters.last_mut().expect("a shard has a sub-filter");
        if top.bits.check(item) {
            return Ok(false);
        }
        top.bits.set(item);
        top.items += 1;
        current.items += 1;
        Ok(!older.iter().rev().any(|shard| shard.live_at(span, now) && shard.contains(item)))
    }

    pub fn items(&self) -> u64 {
        self.shards.iter().map(|shard| shard.items).sum()
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
