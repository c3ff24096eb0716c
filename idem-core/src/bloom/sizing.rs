//! How large a sub-filter's array is, what rate it then has, and what
//! capacity a new shard or a stacked sub-filter gets.

use super::bits::fitted_bytes;
use super::{MAX_BYTES, Shard, ShardedBloom};
use crate::Millis;

/// Most hash functions a sub-filter uses: past about 20 (a rate of one in
/// a million) more probes buy little and cost a cache miss each.
pub const MAX_HASHES: u32 = 20;

/// A new shard's capacity is the previous shard's item count times this
/// when that is the only period of history: no trend to follow yet, so
/// room for ordinary day-to-day variation. A shard that outgrows its
/// forecast costs little once it closes: the sub-filter it stacked folds
/// down to the items it took.
pub const HEADROOM: f64 = 1.05;
/// With two periods of history the forecast is the trend between them
/// plus this margin for its error. Small: steady traffic varies by little
/// more, a day that outgrows it still keeps the rate by stacking, and
/// every percent of headroom is a percent of every shard's bytes.
pub const GROWTH_MARGIN: f64 = 0.03;
/// Bounds on the trend a new shard follows: the newest shard's count over
/// the one before, times the newest count, is the forecast. A rise is
/// followed up to fourfold: a forecast too high costs only until the shard
/// closes, when its arrays fold to what its items need. A fall is followed
/// down to half: a forecast too low makes the shard stack sub-filters at
/// tighter rates, which cost more than the fall saved. Neither goes below
/// the count of a live shard that outgrew its own forecast (see
/// `new_shard_sizing`).
pub const MAX_TREND_RISE: f64 = 4.0;
pub const MAX_TREND_FALL: f64 = 0.5;
/// A shard stacks this many sub-filters at the filter's own `EXPANSION`;
/// each one past them holds at least twice the one below. A shard that
/// beats its forecast by far (a quiet period's forecast, then a busy one)
/// then reaches its volume in a few sub-filters more, whatever the
/// expansion, instead of filling [`MAX_SUB_FILTERS`](super::MAX_SUB_FILTERS)
/// equal ones. Every sub-filter still takes half of what is left of its
/// shard's error budget, so the rate holds.
pub const EXPANSION_HEIGHT: usize = 4;

/// How many standard deviations of an array's fill the sizing allows for.
const FILL_DEVIATIONS: f64 = 3.0;

/// Capacity of the sub-filter stacked at `height` (0-based) of a shard's
/// stack over one of `below` items.
pub(super) fn stacked_capacity(expansion: u32, height: usize, below: u64) -> u64 {
    let factor = if height >= EXPANSION_HEIGHT { expansion.max(2) } else { expansion };
    below.saturating_mul(factor as u64).max(1)
}

/// Hash functions for `bits` bits holding `items` items: the optimum,
/// capped.
pub(super) fn hash_count(bits: u64, items: u64) -> u32 {
    ((bits as f64 / items as f64) * std::f64::consts::LN_2).round().clamp(1.0, MAX_HASHES as f64) as u32
}

/// False-positive rate of `bits` bits holding `items` items.
///
/// Probes are independent and uniform, so a bit is still clear after
/// `k * items` probes with probability `(1 - 1/m)^(k items)`. A query's
/// rate is the mean of `(set bits / m)^k`, a little above the mean's
/// `k`-th power when the count of set bits varies, as it does in small
/// arrays (and a query's own probes may coincide); the factor
/// `1 + k (k - 1) / m` bounds that excess (about `0.15 k (k - 1) / m` at
/// half full, measured in the tests) and vanishes for large arrays.
///
/// That is the rate of the average filter. One filter's rate is its own
/// fill to the `k`-th power, and the fill of a small array varies: the
/// count of clear bits after `n = k * items` probes has a variance of
/// about `m (c - (1 + n / m) c^2)`, `c` being the mean clear fraction. A
/// 1,000-bit array at capacity misses its rate by 12% at one standard
/// deviation. The rate counts a fill [`FILL_DEVIATIONS`] deviations above
/// the mean, so almost every filter keeps its rate; the margin vanishes
/// for large arrays (a million bits: about 1%).
pub(super) fn false_positive_rate(bits: u64, items: u64) -> f64 {
    rate_with_hashes(bits, items, hash_count(bits, items))
}

/// [`false_positive_rate`] for `hashes` hash functions, whether or not
/// they are the optimum for `bits` and `items`.
pub(super) fn rate_with_hashes(bits: u64, items: u64, hashes: u32) -> f64 {
    let k = hashes as f64;
    let m = bits as f64;
    let probes = k * items as f64;
    let clear = (probes * (-1.0 / m).ln_1p()).exp();
    let variance = ((clear - (1.0 + probes / m) * clear * clear) / m).max(0.0);
    let fill = (1.0 - clear + FILL_DEVIATIONS * variance.sqrt()).min(1.0);
    fill.powf(k) * (1.0 + k * (k - 1.0) / m)
}

/// How much of its shard's remaining error budget a sub-filter takes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Share {
    /// A stacked sub-filter that the one below overflowed into: aim at
    /// half the budget left, keeping the other half for more growth.
    Half,
    /// The first sub-filter of a shard whose capacity is the user's
    /// (reserved or configured): aim at 85%. A user who reserves for a
    /// volume usually gets it, and a first sub-filter at half the budget
    /// costs a bit and a half an item more for the growth it insures.
    Reserved,
    /// Capacity comes from the previous shards' real counts: growth is
    /// unlikely, so aim at 93% (a sub-filter stacked on it folds down to
    /// its items when the shard closes; the window's rate measures
    /// 0.75-0.8% at steady volumes).
    Most,
}

impl Share {
    /// The fraction of the budget left that the sub-filter aims at.
    fn fraction(self) -> f64 {
        match self {
            Share::Half => 0.5,
            Share::Reserved => 0.85,
            Share::Most => 0.93,
        }
    }
}

/// Bit-array bytes for a sub-filter of `capacity` items with `budget` of
/// error left in its shard. It aims at its share of the budget, then takes
/// the fitted size at or above the ideal one ([`fitted_bytes`]: stored in
/// chunks, it pays the allocator for hardly a byte it does not use). `Err`
/// with (at least) the bytes it would need when that is more than
/// [`MAX_BYTES`].
pub(super) fn sub_filter_bytes(capacity: u64, budget: f64, share: Share) -> Result<u64, u64> {
    let ln2_squared = std::f64::consts::LN_2 * std::f64::consts::LN_2;
    let target = budget * share.fraction();
    // The optimum for the rate alone, then grown until the capped hash
    // count fits the target too.
    let optimum = (capacity as f64) * -target.ln() / ln2_squared;
    let mut ideal_bits = optimum;
    while ideal_bits.is_finite() && ideal_bits < 8.0 * MAX_BYTES as f64 {
        if false_positive_rate(ideal_bits.ceil() as u64, capacity) <= target {
            break;
        }
        ideal_bits *= 1.05;
    }
    // Then take back what the coarse steps overshot, to within 0.2%: a 5%
    // step is half a bit an item.
    loop {
        let smaller = ideal_bits / 1.002;
        if smaller < optimum || false_positive_rate(smaller.ceil() as u64, capacity) > target {
            break;
        }
        ideal_bits = smaller;
    }
    let ideal_bytes = (ideal_bits / 8.0).ceil().max(8.0);
    if !ideal_bytes.is_finite() || ideal_bytes > MAX_BYTES as f64 {
        // Saturates; NaN (a spent budget) becomes 0, so say "all".
        let needed = ideal_bytes as u64;
        return Err(if needed > MAX_BYTES { needed } else { u64::MAX });
    }
    let fitted = fitted_bytes(ideal_bytes as u64);
    if fitted > MAX_BYTES { Err(fitted) } else { Ok(fitted) }
}

impl ShardedBloom {
    /// Capacity and budget share of a shard started at `now`: `capacity`
    /// when no live shard saw items; else a forecast from the newest live
    /// shard's count, following the trend from the one before it (within
    /// [`MAX_TREND_FALL`] and [`MAX_TREND_RISE`]) but never below the
    /// count of a live shard that outgrew its forecast (stacked), plus up
    /// to [`GROWTH_MARGIN`] (up to [`HEADROOM`] with one shard of
    /// history): see [`headroom_within_size`](Self::headroom_within_size).
    /// Only shards live at `now` count, so a plan made before
    /// [`drop_expired`](Self::drop_expired) sizes what an insertion after
    /// it allocates.
    pub(super) fn new_shard_sizing(&self, now: Millis) -> (u64, Share) {
        let mut live = self.shards.iter().rev().filter(|shard| self.is_live(shard, now));
        let (newest, previous) = match (live.next(), live.next()) {
            (Some(newest), previous) if newest.items() > 0 => (newest.items(), previous.map_or(0, Shard::items)),
            _ => return (self.params.capacity, Share::Reserved),
        };
        let (forecast, headroom) = match previous {
            0 => (newest as f64, HEADROOM),
            _ => {
                let trend = (newest as f64 / previous as f64).clamp(MAX_TREND_FALL, MAX_TREND_RISE);
                (newest as f64 * trend, 1.0 + GROWTH_MARGIN)
            }
        };
        // Never below a live shard that outgrew its forecast: traffic that
        // swings (quiet nights or weekends between busy periods) comes back
        // to its high, and a shard sized after the quiet one stacks a dozen
        // sub-filters to get there, every busy period, until the window
        // holds hundreds. Once one did, the shards after it are sized for
        // that high while it is in the window; a quiet one costs its arrays
        // only while it is the current one: closed, it folds to what its
        // items need. Traffic that falls steadily never stacks, and is
        // followed.
        let beaten = self.shards.iter().filter(|shard| shard.filters.len() > 1 && self.is_live(shard, now));
        let forecast = forecast.max(beaten.map(Shard::items).max().unwrap_or(0) as f64);
        let (least, most) = (forecast.ceil() as u64, (forecast * headroom).ceil() as u64);
        (self.headroom_within_size(least, most), Share::Most)
    }

    /// A new shard's capacity from `least` (the forecast) to `most` (with
    /// its headroom): `most`, unless the allocation size it needs is a step
    /// above the one before it; then the most that size before holds, if
    /// that is at least `least`. Sizes are close for large arrays, and 2-3%
    /// apart around 10,000 items, where a step would cost more than the
    /// headroom it buys.
    pub(super) fn headroom_within_size(&self, least: u64, most: u64) -> u64 {
        let bytes = |capacity| sub_filter_bytes(capacity, self.params.shard_error(), Share::Most);
        let (Ok(at_least), Ok(at_most)) = (bytes(least), bytes(most)) else { return most };
        if at_least == at_most {
            return most;
        }
        // The largest capacity whose size is below `most`'s.
        let (mut fits, mut over) = (least, most);
        while over - fits > 1 {
            let middle = fits + (over - fits) / 2;
            match bytes(middle) {
                Ok(needs) if needs < at_most => fits = middle,
                _ => over = middle,
            }
        }
        fits
    }
}
