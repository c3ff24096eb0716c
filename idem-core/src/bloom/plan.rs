//! Planning a write and executing the plan: what sub-filters it stacks
//! (a new shard's first included), checked against the limits before
//! anything changes, then the insertions that stack them.

use smallvec::smallvec;

use super::bits::Bits;
use super::sizing::{Share, false_positive_rate, hash_count, stacked_capacity, sub_filter_bytes};
use super::{
    BloomError, ItemHash, MAX_BYTES, MAX_SUB_FILTERS, MAX_TOTAL_SUB_FILTERS, Params, Shard, ShardedBloom, Shards,
    SubFilter,
};
use crate::Millis;

/// A write as [`ShardedBloom::plan`] planned it: what it will allocate,
/// and the sub-filters it will stack, already sized and checked against
/// the limits. [`ShardedBloom::insert_planned`] executes it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// Bytes of new bit arrays; 0 when the items fit the current shard's
    /// top sub-filter.
    pub allocate: u64,
    /// New sub-filters (a new shard's first one included).
    pub sub_filters: u32,
    /// Whether the write opens a shard.
    pub opens_shard: bool,
    /// Those sub-filters, last to be stacked first.
    planned: Vec<PlannedSubFilter>,
}

/// What an insertion did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Added {
    /// Recorded in the current shard; no shard of the window had seen it.
    New,
    /// Recorded in the current shard; an older shard of the window may
    /// have seen it.
    Seen,
    /// Already in the current shard: nothing changed.
    AlreadyThere,
    /// Not stored: past the hard limits, which a write within its plan
    /// never reaches (see [`ShardedBloom::insert_planned`]); `seen` when a
    /// shard of the window may hold it.
    Refused { seen: bool },
}

impl Added {
    /// The answer: whether the item was new to the window.
    pub fn is_new(self) -> bool {
        matches!(self, Added::New | Added::Refused { seen: false })
    }

    /// Whether the filter changed.
    pub fn is_inserted(self) -> bool {
        matches!(self, Added::New | Added::Seen)
    }
}

/// The next sub-filter a write would allocate, and what the filter would
/// then hold: the one reckoning [`ShardedBloom::plan`] plans with
/// and [`ShardedBloom::insert_planned`] allocates by past a plan, so that
/// they cannot disagree.
pub(super) struct Growth {
    expansion: u32,
    shard_error: f64,
    /// Bytes of the live shards' bit arrays and their sub-filter count.
    bytes: u64,
    sub_filters: usize,
    /// Height of the stack that takes the items (0 for a new shard).
    height: usize,
    /// The errors of that stack's sub-filters, summed in order: the
    /// budget left is the shard's minus this, the same to the last bit
    /// whether planned or allocated.
    spent: f64,
    capacity: u64,
    share: Share,
}

/// A sub-filter [`Growth`] sized.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct PlannedSubFilter {
    pub(super) capacity: u64,
    /// What [`sub_filter_bytes`] gave: the array's bytes.
    pub(super) bytes: u64,
}

impl Growth {
    /// Sizes the next sub-filter against the hard limits and `limit`
    /// (bytes of bit arrays, at most [`MAX_BYTES`]), counts it in and
    /// moves on to the one after it. What it is, or why it cannot be.
    pub(super) fn allocate(&mut self, limit: u64) -> Result<PlannedSubFilter, BloomError> {
        if self.height >= MAX_SUB_FILTERS {
            return Err(BloomError::StackFull);
        }
        if self.sub_filters >= MAX_TOTAL_SUB_FILTERS {
            return Err(BloomError::TooManySubFilters);
        }
        let limit = limit.min(MAX_BYTES);
        let capacity = self.capacity;
        let sizing = sub_filter_bytes(capacity, self.shard_error - self.spent, self.share)
            .map_err(|needed| BloomError::SizeLimit { needed: self.bytes.saturating_add(needed), limit })?;
        let bytes = sizing;
        let total = self.bytes + bytes;
        if total > limit {
            return Err(BloomError::SizeLimit { needed: total, limit });
        }
        self.bytes = total;
        self.sub_filters += 1;
        self.height += 1;
        self.spent += false_positive_rate(sizing * 8, capacity);
        self.capacity = stacked_capacity(self.expansion, self.height, capacity);
        self.share = Share::Half;
        Ok(PlannedSubFilter { capacity, bytes })
    }
}

impl ShardedBloom {
    /// A filter with its first shard allocated at `capacity`, as `RESERVE`
    /// and an `ADD` on a missing key make it. `max_bytes` limits its bit arrays (and is itself capped at
    /// [`MAX_BYTES`]).
    pub fn new(params: Params, seed: u64, now: Millis, max_bytes: u64) -> Result<ShardedBloom, BloomError> {
        params.check()?;
        let mut filter = ShardedBloom { params, seed, shards: Shards::new() };
        let first = filter.plan(1, now, max_bytes)?.planned.pop().ok_or(BloomError::StackFull)?;
        filter.open_shard(now, first);
        Ok(filter)
    }

    /// The shard that takes items at `now`: the newest one if `now` falls
    /// in it, or later (a clock that stepped back never writes into an
    /// older shard than one already written), else none yet.
    pub(super) fn shard_for(&self, now: Millis) -> Option<&Shard> {
        self.shards.last().filter(|newest| newest.start >= self.shard_start(now))
    }

    /// The next sub-filter of the stack that takes items at `now` (a new
    /// shard's first if none does yet), with the live shards' totals so
    /// far; and the room left in that stack's top sub-filter.
    pub(super) fn growth(&self, now: Millis) -> (Growth, u64) {
        let live = self.shards.iter().filter(|shard| self.is_live(shard, now));
        let (bytes, sub_filters) =
            live.fold((0, 0), |(bytes, count), shard| (bytes + shard.bytes(), count + shard.filters.len()));
        let params = &self.params;
        let mut growth = Growth {
            expansion: params.expansion,
            shard_error: params.shard_error(),
            bytes,
            sub_filters,
            height: 0,
            spent: 0.0,
            capacity: 0,
            share: Share::Half,
        };
        match self.shard_for(now) {
            Some(shard) => {
                let top = shard.filters.last().expect("a shard has a sub-filter");
                growth.height = shard.filters.len();
                growth.spent = shard.filters.iter().map(|f| f.error).sum::<f64>();
                growth.capacity = shard.next_capacity(params);
                (growth, top.capacity.saturating_sub(top.items))
            }
            None => {
                (growth.capacity, growth.share) = self.new_shard_sizing(now);
                (growth, 0)
            }
        }
    }

    /// Whether `n` more insertions at `now` fit the limits on size
    /// (`max_bytes` of bit arrays in the live shards after the write, at
    /// most [`MAX_BYTES`]) and on sub-filters, and what they would
    /// allocate. The limits bound growth: a write that allocates nothing
    /// fits, even in a filter over a limit lowered since it grew.
    /// Allocates nothing. [`insert_planned`](Self::insert_planned) of `n`
    /// items at `now` after it allocates at most the plan (exactly it when
    /// all `n` are new to the current shard).
    pub fn plan(&self, n: u64, now: Millis, max_bytes: u64) -> Result<Plan, BloomError> {
        // The common case: the current shard's top sub-filter has room.
        let current = self.shard_for(now);
        if let Some(top) = current.and_then(|shard| shard.filters.last())
            && top.capacity - top.items >= n
        {
            return Ok(Plan::default());
        }
        let (mut growth, mut room) = self.growth(now);
        let mut plan = Plan { opens_shard: current.is_none() && n > 0, ..Plan::default() };
        let mut left = n;
        while left > room {
            left -= room;
            let next = growth.allocate(max_bytes)?;
            plan.allocate += next.bytes;
            plan.sub_filters += 1;
            room = next.capacity;
            plan.planned.push(next);
        }
        plan.planned.reverse();
        Ok(plan)
    }

    /// The next sub-filter for the stack that takes items at `now`, sized
    /// within the hard limits.
    pub(super) fn next_sub_filter(&self, now: Millis) -> Result<PlannedSubFilter, BloomError> {
        self.growth(now).0.allocate(MAX_BYTES)
    }

    /// Starts the shard for `now` with `first` as its first sub-filter.
    /// The shard it follows takes no more items: its arrays fold to what
    /// its items need.
    pub(super) fn open_shard(&mut self, now: Millis, first: PlannedSubFilter) {
        let first = SubFilter::new(first.capacity, first.bytes);
        let start = self.shard_start(now);
        if let Some(closed) = self.shards.last_mut() {
            closed.filters.iter_mut().for_each(SubFilter::fold_to_items);
        }
        // The first shard is inline; past it, tables exactly as long as
        // their contents: a filter per tenant pays every spare slot per
        // tenant (a table of 8 shards cost a 1,000-item filter 320 bytes
        // besides its 1,792 of bits).
        self.shards.reserve_exact(1);
        self.shards.push(Shard { start, filters: smallvec![first] });
    }

    /// Records the item in the current shard unless it is already there,
    /// as `plan` foresaw it: the plan's sub-filters are stacked as the
    /// items need them, so nothing is sized or checked again. For at most
    /// the `n` items planned for, at the `now` planned for, after
    /// [`drop_expired`](Self::drop_expired) and nothing else in between.
    /// A sub-filter needed past the plan is sized within the hard limits;
    /// where those refuse it the item is not stored (and answered as the
    /// window answers for it).
    ///
    /// One pass over the shards, each sub-filter probed once.
    pub fn insert_planned(&mut self, plan: &mut Plan, item: ItemHash, now: Millis) -> Added {
        self.insert(item, now, |filter| plan.planned.pop().map_or_else(|| filter.next_sub_filter(now), Ok))
            .unwrap_or_else(|_| Added::Refused { seen: self.contains(item, now) })
    }

    /// Records the item in the current shard, stacking what `next` gives
    /// where the top sub-filter is full. The shards that left the window
    /// were dropped first, so the limits, counted over live shards, hold
    /// for the whole filter as stored.
    pub(super) fn insert(
        &mut self,
        item: ItemHash,
        now: Millis,
        mut next: impl FnMut(&Self) -> Result<PlannedSubFilter, BloomError>,
    ) -> Result<Added, BloomError> {
        if self.shard_for(now).is_none() {
            let first = next(self)?;
            self.open_shard(now, first);
        }
        let span = self.params.span();
        let current = self.shards.last().expect("a shard exists");
        let (top, lower) = current.filters.split_last().expect("a shard has a sub-filter");
        if lower.iter().any(|filter| filter.check(item)) {
            return Ok(Added::AlreadyThere);
        }
        if top.items >= top.capacity {
            if top.check(item) {
                return Ok(Added::AlreadyThere);
            }
            let next = next(self)?;
            let next = SubFilter::new(next.capacity, next.bytes);
            let filters = &mut self.shards.last_mut().expect("a shard exists").filters;
            filters.reserve_exact(1);
            filters.push(next);
        }
        let (current, older) = self.shards.split_last_mut().expect("a shard exists");
        let top = current.filters.last_mut().expect("a shard has a sub-filter");
        if !top.bits.insert(item, top.hashes()) {
            return Ok(Added::AlreadyThere);
        }
        top.items += 1;
        let seen = older.iter().rev().any(|shard| shard.live_at(span, now) && shard.contains(item));
        Ok(if seen { Added::Seen } else { Added::New })
    }
}

impl SubFilter {
    /// A clear sub-filter of `bytes`, as [`sub_filter_bytes`] sized it.
    pub(super) fn new(capacity: u64, bytes: u64) -> SubFilter {
        // At most MAX_HASHES, which fits.
        let hashes = hash_count(bytes * 8, capacity) as u8;
        let error = false_positive_rate(bytes * 8, capacity);
        SubFilter { capacity, items: 0, error, hashes, folds: 0, odd_fold: 1, bits: Bits::new(bytes) }
    }
}

impl Shard {
    /// Capacity of the sub-filter that would come next.
    fn next_capacity(&self, params: &Params) -> u64 {
        let last = self.filters.last().map_or(0, |f| f.capacity);
        stacked_capacity(params.expansion, self.filters.len(), last)
    }
}
