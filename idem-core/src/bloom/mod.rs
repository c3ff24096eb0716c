//! The date-sharded Bloom filter: pure Rust, the clock passed in.
//!
//! One filter holds a shard per period (a UTC day by default). An item is
//! "seen" when any shard of the last `window` periods holds it; older shards
//! are dropped. Each shard stacks sub-filters as it fills, each taking a
//! share of what is left of the shard's error budget (see [`Share`]), so a
//! shard never exceeds `error_rate / window` and the whole window never
//! exceeds `error_rate`, however many items arrive.
//!
//! A new shard's capacity follows the previous shards' counts. In format 4
//! ([`Scheme::Fitted`]) its arrays are sized to the byte in chunks of the
//! allocator's classes, and when the next shard opens they fold to what
//! their items need (see [`Bits::fold`]).
//!
//! Every decision depends only on the filter's state and the `now` passed
//! in, so a replica or an AOF replay given the primary's `now` ends up with
//! the same bits.

pub mod bits;
pub mod codec;
mod write;

use bits::Bits;
pub use bits::{Scheme, allocated_bytes, allocation_class, fitted_bytes};
use xxhash_rust::xxh3::xxh3_128_with_seed;

use crate::Millis;
use crate::args::{ArgList, parse_options, require};
use crate::error::CmdError;
pub use write::{Answers, Effect, FixedLimits, HardLimits, KeyChange, Limits, NewFilter, WhenGone, Written};

/// Unix time or a duration in whole seconds.
pub type Seconds = i64;

pub const DAY: Seconds = 86_400;
pub const HOUR: Seconds = 3_600;

/// Largest window of a new filter: a year of daily shards (366 with a
/// leap day), or 15 days of hourly ones. Every query probes every live
/// shard, so the window is bounded with the sub-filters in all: a window
/// of 366 leaves [`MAX_TOTAL_SUB_FILTERS`] room for 145 stacked
/// sub-filters besides one a shard (and the window + 1 shards live at a
/// shard's last millisecond).
pub const MAX_WINDOW: u32 = 366;
/// Largest window of format 1 filters, made before the bound above: a
/// year of hourly shards. They keep working (up to the limit on
/// sub-filters for growth).
pub const FORMAT_1_MAX_WINDOW: u32 = 8_784;
/// `SHARD` when none is given: a UTC day.
pub const DEFAULT_PERIOD: Seconds = DAY;
/// `EXPANSION` when none is given.
pub const DEFAULT_EXPANSION: u32 = 2;
/// Largest expansion factor between stacked sub-filters.
pub const MAX_EXPANSION: u32 = 1_024;
/// Most sub-filters one shard stacks; with expansion 1 that is the limit on
/// growth, with 2 a billion-fold.
pub const MAX_SUB_FILTERS: usize = 32;
/// Most sub-filters of one filter, all shards together. A query probes
/// every sub-filter of every live shard until one holds the item: a miss
/// costs a few ns a sub-filter when the filter is in cache, about 150
/// when every probe goes to memory, and over 1 us (20 probes) for bits
/// crafted so that chosen queries make every probe; only `RESTORE` can
/// bring those. Measured (`bench_worst_mexists` in the tests, on a busy
/// 2-core machine), `MEXISTS` of 1,000 items on the costliest filters the
/// decoder accepts, 512 sub-filters filling [`MAX_BYTES`]: 50-120 ms with
/// ordinary bits, 0.4-0.9 s with crafted ones. At 16,384 sub-filters:
/// 1.2-1.5 s and 7.7-9.9 s (the payload of 8,784 x 32 blocked a
/// server for 6-7 s).
pub const MAX_TOTAL_SUB_FILTERS: usize = 512;
/// Redis's largest bulk string (`proto-max-bulk-len`'s default and most
/// operators' value): a `DUMP` payload larger than this cannot be
/// `RESTORE`d or `MIGRATE`d.
pub const PROTO_MAX_BULK_LEN: u64 = 512 * 1024 * 1024;
/// Hard ceiling on a filter's bit arrays, all shards together, whatever
/// the configured limit. One MiB under [`PROTO_MAX_BULK_LEN`] leaves room
/// for the encoding around the bits (a header, 20 bytes a shard, 32 a
/// sub-filter: at most [`codec::MAX_OVERHEAD`]) and the `DUMP` envelope,
/// so the largest filter still `DUMP`s, `RESTORE`s and `MIGRATE`s.
pub const MAX_BYTES: u64 = PROTO_MAX_BULK_LEN - 1024 * 1024;
/// Smallest error rate of a new filter, chosen from the sizes rates
/// imply. A shard's budget is the rate over the window, and each stacked
/// sub-filter gets part of what is left, so sub-filters aim far below the
/// rate; past a rate of about 1e-6 they need more than [`MAX_HASHES`]
/// probes at the optimum, and the capped count costs more bits than the
/// optimum (`-ln(rate) / ln(2)^2`), more so the lower the rate. Measured
/// by `sizes_at_the_rate_bound_stay_in_proportion` (first sub-filter of a
/// 7-day window, then the 32nd of a full stack): 1e-6 costs 34 and 84
/// bits an item, 1e-9 59 and 101 (a fifth over the optimum; a 1% filter
/// takes 10.5), 1e-12 84 and 168, 1e-15 117 and 168 (half over the
/// optimum), 1e-20 235 and 336, 1e-30 805 and 940. One false positive in
/// a billion queries is far below what a prefilter in front of an exact
/// record can use; below it each factor of 1000 costs 25 to 35 more bits
/// an item, and 5e-324 has no size at all.
pub const MIN_ERROR_RATE: f64 = 1e-9;
/// Largest period: a century.
pub const MAX_PERIOD: Seconds = 100 * 365 * DAY;
/// A new shard's capacity is the previous shard's item count times this
/// when that is the only period of history: no trend to follow yet, so
/// room for ordinary day-to-day variation without stacking a second
/// sub-filter.
pub const HEADROOM: f64 = 1.1;
/// [`HEADROOM`] in format 4, where a shard that outgrows its forecast
/// costs little once it closes: the sub-filter it stacked folds down to
/// the items it took.
pub const FITTED_HEADROOM: f64 = 1.05;
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
/// Format 4's bounds on the trend a new shard follows: the newest shard's
/// count over the one before, times the newest count, is the forecast. A
/// rise is followed up to fourfold: a forecast too high costs only until
/// the shard closes, when its arrays fold to what its items need. A fall
/// is followed down to half: a forecast too low makes the shard stack
/// sub-filters at tighter rates, which cost more than the fall saved.
/// Neither goes below the count of a live shard that outgrew its own
/// forecast (see `new_shard_sizing`).
pub const MAX_TREND_RISE: f64 = 4.0;
pub const MAX_TREND_FALL: f64 = 0.5;
/// Format 4 stacks this many sub-filters in a shard at the filter's own
/// `EXPANSION`; each one past them holds at least twice the one below.
/// A shard that beats its forecast by far (a quiet period's forecast,
/// then a busy one) then reaches its volume in a few sub-filters more,
/// whatever the expansion, instead of filling [`MAX_SUB_FILTERS`] equal
/// ones (with `EXPANSION 1` that was 32 times the forecast, and then
/// every add refused). Every sub-filter still takes half of what is left
/// of its shard's error budget, so the rate holds.
pub const EXPANSION_HEIGHT: usize = 4;

/// Capacity of the sub-filter stacked at `height` (0-based) of a shard's
/// stack over one of `below` items.
fn stacked_capacity(scheme: Scheme, expansion: u32, height: usize, below: u64) -> u64 {
    let factor = match scheme {
        Scheme::Fitted if height >= EXPANSION_HEIGHT => expansion.max(2),
        _ => expansion,
    };
    below.saturating_mul(factor as u64).max(1)
}
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

/// A filter setting out of range, named in the error's message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutOfRange {
    ErrorRate,
    /// Below [`MIN_ERROR_RATE`].
    ErrorRateTooLow,
    Capacity,
    /// Above `max` (or 0).
    Window {
        max: u32,
    },
    Shard,
    Expansion,
}

impl OutOfRange {
    /// The error message, its bounds taken from the constants.
    pub fn message(self) -> String {
        match self {
            OutOfRange::ErrorRate => "error_rate must be between 0 and 1".into(),
            OutOfRange::ErrorRateTooLow => format!("error_rate must be at least {MIN_ERROR_RATE:e}"),
            OutOfRange::Capacity => "capacity must be at least 1".into(),
            OutOfRange::Window { max } => format!("WINDOW must be between 1 and {max}"),
            OutOfRange::Shard => "SHARD must be DAY, HOUR or a number of seconds >= 1".into(),
            OutOfRange::Expansion => format!("EXPANSION must be between 1 and {MAX_EXPANSION}"),
        }
    }
}

/// Why a filter cannot be created or take more items.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BloomError {
    /// A setting out of range.
    Invalid(OutOfRange),
    /// The filter's bit arrays would exceed the size limit: `needed` is
    /// the bytes of every live shard's bit arrays after the write (at
    /// least that much when a single sub-filter alone is past the hard
    /// ceiling), `limit` the limit applied (the configured one, at most
    /// [`MAX_BYTES`]).
    SizeLimit { needed: u64, limit: u64 },
    /// The current shard's stack already holds [`MAX_SUB_FILTERS`]
    /// sub-filters and its top one is full.
    StackFull,
    /// The filter would hold more than [`MAX_TOTAL_SUB_FILTERS`]
    /// sub-filters in all.
    TooManySubFilters,
}

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

impl Params {
    /// Settings with the default `SHARD` ([`DEFAULT_PERIOD`]) and
    /// `EXPANSION` ([`DEFAULT_EXPANSION`]).
    pub fn with_defaults(error_rate: f64, capacity: u64, window: u32) -> Params {
        Params { error_rate, capacity, window, period: DEFAULT_PERIOD, expansion: DEFAULT_EXPANSION }
    }

    /// Whether a new filter may have these settings.
    pub fn check(&self) -> Result<(), BloomError> {
        self.check_for(Scheme::CURRENT)
    }

    /// Whether a filter of `scheme` may have these settings. Format 1
    /// filters were made before the rate had a lower bound; those that
    /// exist keep working.
    pub fn check_for(&self, scheme: Scheme) -> Result<(), BloomError> {
        let lowest = match scheme {
            Scheme::DoubleHashing => f64::MIN_POSITIVE,
            Scheme::Mixed | Scheme::Bounded | Scheme::Fitted => MIN_ERROR_RATE,
        };
        if !(self.error_rate >= lowest && self.error_rate < 1.0) {
            return Err(match scheme {
                Scheme::Mixed | Scheme::Bounded | Scheme::Fitted
                    if self.error_rate > 0.0 && self.error_rate < lowest =>
                {
                    BloomError::Invalid(OutOfRange::ErrorRateTooLow)
                }
                _ => BloomError::Invalid(OutOfRange::ErrorRate),
            });
        }
        if self.capacity < 1 {
            return Err(BloomError::Invalid(OutOfRange::Capacity));
        }
        match scheme {
            Scheme::DoubleHashing if !(1..=FORMAT_1_MAX_WINDOW).contains(&self.window) => {
                return Err(BloomError::Invalid(OutOfRange::Window { max: FORMAT_1_MAX_WINDOW }));
            }
            Scheme::Mixed | Scheme::Bounded | Scheme::Fitted if !(1..=MAX_WINDOW).contains(&self.window) => {
                return Err(BloomError::Invalid(OutOfRange::Window { max: MAX_WINDOW }));
            }
            _ => {}
        }
        if !(1..=MAX_PERIOD).contains(&self.period) {
            return Err(BloomError::Invalid(OutOfRange::Shard));
        }
        if !(1..=MAX_EXPANSION).contains(&self.expansion) {
            return Err(BloomError::Invalid(OutOfRange::Expansion));
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
    /// How many times its array was halved since it was sized (see
    /// [`Bits::fold`]): `bits` holds its sized bytes over `2^folds`, and
    /// over `odd_fold` more.
    pub folds: u32,
    /// The odd factor its array was then divided by, where halving
    /// stopped at an odd number of words (see [`Bits::fold_by`]); 1 when
    /// it was not.
    pub odd_fold: u32,
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
    /// How every sub-filter of this filter probes, for its whole life.
    pub scheme: Scheme,
    /// Oldest first.
    pub shards: Vec<Shard>,
}

/// The largest allocation class not above `size` (`size` >= 8).
fn allocation_class_below(size: u64) -> u64 {
    // A class at most `size`, then up through the classes.
    let mut below = allocation_class(size / 2).clamp(8, size.max(8));
    loop {
        let next = allocation_class(below + 1);
        if next > size {
            return below;
        }
        below = next;
    }
}

/// [`allocation_class_below`] as format 1 sized with it: where three
/// quarters of `size` is no class and no class lies between it and
/// `size` (at 64 bytes and below), it answers that, no class: 9 to 11 for
/// 12 to 15, 17 to 23 for 23 to 31, 33 to 35 for 44 to 47. Such a
/// sub-filter holds the whole words of it (8, 16 or 32 bytes) but took
/// its hash count and error from all of it; format 1 filters keep doing
/// so, so that they grow exactly as they always did (a replica of an
/// older primary gets the same bits).
fn format_1_class_below(size: u64) -> u64 {
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

/// A floor under the false-positive rate of small bit arrays probed by
/// [`Scheme::DoubleHashing`], times the array's size: an item whose probe
/// step maps to less than one bit (one in `m`) puts all its probes on a
/// few neighbouring bits, and is "seen" if those are set, about half the
/// time at capacity. Negligible for large arrays; it keeps small ones
/// honest, at the price of sizing every array to at least `1.5 / rate`
/// bits whatever its capacity.
const COLLAPSE_FLOOR: f64 = 0.75;

/// How many standard deviations of an array's fill [`Scheme::Bounded`]
/// sizing allows for.
const FILL_DEVIATIONS: f64 = 3.0;

/// False-positive rate of `bits` bits holding `items` items.
///
/// [`Scheme::Mixed`] probes are independent and uniform, so a bit is still
/// clear after `k * items` probes with probability `(1 - 1/m)^(k items)`.
/// A query's rate is the mean of `(set bits / m)^k`, a little above the
/// mean's `k`-th power when the count of set bits varies, as it does in
/// small arrays (and a query's own probes may coincide); the factor
/// `1 + k (k - 1) / m` bounds that excess (about `0.15 k (k - 1) / m` at
/// half full, measured in the tests) and vanishes for large arrays.
///
/// That is the rate of the average filter. One filter's rate is its own
/// fill to the `k`-th power, and the fill of a small array varies: the
/// count of clear bits after `n = k * items` probes has a variance of
/// about `m (c - (1 + n / m) c^2)`, `c` being the mean clear fraction. A
/// 1,000-bit array at capacity misses its rate by 12% at one standard
/// deviation (measured: one filter in five of 3,000 items stacked in
/// sub-filters of 100 went over its rate, by up to 25%). [`Scheme::Bounded`]
/// counts a fill [`FILL_DEVIATIONS`] deviations above the mean, so almost
/// every filter keeps its rate; the margin vanishes for large arrays (a
/// million bits: about 1%).
fn false_positive_rate(bits: u64, items: u64, scheme: Scheme) -> f64 {
    rate_with_hashes(bits, items, hash_count(bits, items), scheme)
}

/// [`false_positive_rate`] for `hashes` hash functions, whether or not
/// they are the optimum for `bits` and `items`.
fn rate_with_hashes(bits: u64, items: u64, hashes: u32, scheme: Scheme) -> f64 {
    let k = hashes as f64;
    let m = bits as f64;
    match scheme {
        // Unchanged since format 1: the sizes of its filters depend on it.
        Scheme::DoubleHashing => (1.0 - (-k * items as f64 / m).exp()).powf(k) + COLLAPSE_FLOOR / m,
        // Unchanged since format 2, for the same reason.
        Scheme::Mixed => {
            let clear = (k * items as f64 * (-1.0 / m).ln_1p()).exp();
            (1.0 - clear).powf(k) * (1.0 + k * (k - 1.0) / m)
        }
        Scheme::Bounded | Scheme::Fitted => {
            let probes = k * items as f64;
            let clear = (probes * (-1.0 / m).ln_1p()).exp();
            let variance = ((clear - (1.0 + probes / m) * clear * clear) / m).max(0.0);
            let fill = (1.0 - clear + FILL_DEVIATIONS * variance.sqrt()).min(1.0);
            fill.powf(k) * (1.0 + k * (k - 1.0) / m)
        }
    }
}

/// How much of its shard's remaining error budget a sub-filter takes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Share {
    /// A stacked sub-filter that the one below overflowed into: aim at
    /// half the budget left, keeping the other half for more growth.
    Half,
    /// The first sub-filter of a shard whose capacity is the user's
    /// (reserved or configured). Formats 1 to 3 aim at half, as
    /// [`Share::Half`]; format 4 at 85%: a user who reserves for a volume
    /// usually gets it, and a first sub-filter at half the budget costs a
    /// bit and a half an item more for the growth it insures.
    Reserved,
    /// Capacity comes from the previous shards' real counts: growth is
    /// unlikely, so aim at nine tenths (format 4: 93%, as a sub-filter
    /// stacked on it folds down to its items when the shard closes; the
    /// window's rate measures 0.75-0.8% at steady volumes).
    Most,
}

impl Share {
    /// The fraction aimed at, and (formats 1 to 3) the most it may take
    /// after rounding to an allocation class.
    fn fractions(self, scheme: Scheme) -> (f64, f64) {
        match self {
            Share::Reserved if scheme == Scheme::Fitted => (0.85, 0.85),
            Share::Half | Share::Reserved => (0.5, 0.9),
            Share::Most if scheme == Scheme::Fitted => (0.93, 0.93),
            Share::Most => (0.9, 0.97),
        }
    }
}

/// Bit-array bytes for a sub-filter of `capacity` items with `budget` of
/// error left in its shard. It aims at its share of the budget. Format 4
/// then takes the fitted size at or above the ideal one ([`fitted_bytes`]:
/// stored in chunks, it pays the allocator for hardly a byte it does not
/// use). Older formats fill an allocation class exactly: the class just
/// below the ideal size if that stays within the share's limit, else the
/// one above. `Err` with (at least) the bytes it would need when that is
/// more than [`MAX_BYTES`].
fn sub_filter_bytes(capacity: u64, budget: f64, share: Share, scheme: Scheme) -> Result<u64, u64> {
    let (aim, limit) = share.fractions(scheme);
    let ln2_squared = std::f64::consts::LN_2 * std::f64::consts::LN_2;
    let target = budget * aim;
    let floor = match scheme {
        Scheme::DoubleHashing => 2.0 * COLLAPSE_FLOOR / target,
        Scheme::Mixed | Scheme::Bounded | Scheme::Fitted => 0.0,
    };
    // The optimum for the rate alone, then grown until the capped hash
    // count (and, for double hashing, the collapse floor) fit the target
    // too.
    let optimum = ((capacity as f64) * -target.ln() / ln2_squared).max(floor);
    let mut ideal_bits = optimum;
    while ideal_bits.is_finite() && ideal_bits < 8.0 * MAX_BYTES as f64 {
        if false_positive_rate(ideal_bits.ceil() as u64, capacity, scheme) <= target {
            break;
        }
        ideal_bits *= 1.05;
    }
    // Format 4 then takes back what the coarse steps overshot, to within
    // 0.2%: a 5% step is half a bit an item.
    if scheme == Scheme::Fitted {
        loop {
            let smaller = ideal_bits / 1.002;
            if smaller < optimum || false_positive_rate(smaller.ceil() as u64, capacity, scheme) > target {
                break;
            }
            ideal_bits = smaller;
        }
    }
    let ideal_bytes = (ideal_bits / 8.0).ceil().max(8.0);
    if !ideal_bytes.is_finite() || ideal_bytes > MAX_BYTES as f64 {
        // Saturates; NaN (a spent budget) becomes 0, so say "all".
        let needed = ideal_bytes as u64;
        return Err(if needed > MAX_BYTES { needed } else { u64::MAX });
    }
    // Allocation classes are multiples of 8 bytes: whole words.
    let ideal_bytes = ideal_bytes as u64;
    let below = match scheme {
        Scheme::DoubleHashing => format_1_class_below(ideal_bytes),
        Scheme::Mixed | Scheme::Bounded => allocation_class_below(ideal_bytes),
        Scheme::Fitted => {
            let fitted = fitted_bytes(ideal_bytes);
            return if fitted > MAX_BYTES { Err(fitted) } else { Ok(fitted) };
        }
    };
    let bytes = if false_positive_rate(below * 8, capacity, scheme) <= limit * budget {
        below
    } else {
        allocation_class(ideal_bytes)
    };
    Ok(bytes)
}

impl SubFilter {
    /// A clear sub-filter as [`sub_filter_bytes`] sized it: `sizing` bytes
    /// give its hash count and error, whole words of them its array (the
    /// same but for format 1's strays: see [`format_1_class_below`]).
    fn new(capacity: u64, sizing: u64, scheme: Scheme) -> SubFilter {
        let bits = Bits::new(sizing / 8 * 8, hash_count(sizing * 8, capacity), scheme);
        let error = false_positive_rate(sizing * 8, capacity, scheme);
        SubFilter { capacity, items: 0, error, folds: 0, odd_fold: 1, bits }
    }

    pub fn bytes(&self) -> u64 {
        self.bits.bytes()
    }

    /// The rate of its array halved, holding the items it holds.
    #[cfg(test)]
    fn folded_rate(&self) -> f64 {
        rate_with_hashes(self.bits.bytes() * 4, self.items, self.bits.hashes(), self.bits.scheme())
    }

    /// The bytes it was sized with: its array's, times what it was
    /// folded by.
    pub fn sized_bytes(&self) -> u64 {
        (self.bits.bytes() * self.odd_fold as u64) << self.folds
    }

    /// Whether its array holds its items within its error at `words`.
    fn fits_in(&self, words: u64) -> bool {
        rate_with_hashes(words * 64, self.items, self.bits.hashes(), self.bits.scheme()) <= self.error
    }

    /// Folds its array to the fewest words its items need within the
    /// error it was sized for: a sub-filter that will take no more items
    /// (its shard is closed) then costs what its items need, not what was
    /// forecast. The array's length can be divided by any divisor of its
    /// word count, exactly (see [`Bits::fold_by`]): of those that keep the
    /// error, the one the allocator charges least for (the smallest on a
    /// tie). The halvings of that factor are done in place (see
    /// [`Bits::fold`]), its odd part by a copy of what is left. Fitted
    /// sizes are odd multiples of powers of two: 10 items in a 10M
    /// reservation halve only to 935 words, and 935 divides by 187.
    fn fold_to_items(&mut self) {
        let words = self.bits.bytes() / 8;
        let (mut best_cost, mut best) = (allocated_bytes(words * 8), words);
        let mut consider = |result: u64| {
            let cost = allocated_bytes(result * 8);
            if (cost < best_cost || (cost == best_cost && result < best)) && self.fits_in(result) {
                (best_cost, best) = (cost, result);
            }
        };
        let mut divisor = 1;
        while divisor * divisor <= words {
            if words.is_multiple_of(divisor) {
                consider(divisor);
                consider(words / divisor);
            }
            divisor += 1;
        }
        let factor = words / best;
        let (halvings, odd) = (factor.trailing_zeros(), factor >> factor.trailing_zeros());
        for _ in 0..halvings {
            self.bits.fold();
        }
        if odd > 1 {
            self.bits.fold_by(odd);
        }
        self.folds += halvings;
        self.odd_fold *= odd as u32;
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

    /// Capacity of the sub-filter that would come next.
    fn next_capacity(&self, params: &Params, scheme: Scheme) -> u64 {
        let last = self.filters.last().map_or(0, |f| f.capacity);
        stacked_capacity(scheme, params.expansion, self.filters.len(), last)
    }
}

/// The next sub-filter a write would allocate, and what the filter would
/// then hold: the one reckoning [`ShardedBloom::plan`] plans with
/// and [`ShardedBloom::insert_planned`] allocates by past a plan, so that
/// they cannot disagree.
struct Growth {
    scheme: Scheme,
    expansion: u32,
    shard_error: f64,
    /// Bytes of the live shards' bit arrays and their sub-filter count.
    bytes: u64,
    sub_filters: usize,
    /// Height of the stack that takes the items (0 for a new shard).
    height: usize,
    /// The errors of that stack's sub-filters, summed in order: the
    /// budget left is the shard's minus this, the same to the last bit
    /// whether planned or allocated, and as format 1 computed it.
    spent: f64,
    capacity: u64,
    share: Share,
}

/// A sub-filter [`Growth`] sized.
#[derive(Clone, Debug, PartialEq)]
struct PlannedSubFilter {
    capacity: u64,
    /// What [`sub_filter_bytes`] gave, and the array's bytes.
    sizing: u64,
    bytes: u64,
}

impl Growth {
    /// Sizes the next sub-filter against the hard limits and `limit`
    /// (bytes of bit arrays, at most [`MAX_BYTES`]), counts it in and
    /// moves on to the one after it. What it is, or why it cannot be.
    fn allocate(&mut self, limit: u64) -> Result<PlannedSubFilter, BloomError> {
        if self.height >= MAX_SUB_FILTERS {
            return Err(BloomError::StackFull);
        }
        if self.sub_filters >= MAX_TOTAL_SUB_FILTERS {
            return Err(BloomError::TooManySubFilters);
        }
        let limit = limit.min(MAX_BYTES);
        let capacity = self.capacity;
        let sizing = sub_filter_bytes(capacity, self.shard_error - self.spent, self.share, self.scheme)
            .map_err(|needed| BloomError::SizeLimit { needed: self.bytes.saturating_add(needed), limit })?;
        let bytes = sizing / 8 * 8;
        let total = self.bytes + bytes;
        if total > limit {
            return Err(BloomError::SizeLimit { needed: total, limit });
        }
        self.bytes = total;
        self.sub_filters += 1;
        self.height += 1;
        self.spent += false_positive_rate(sizing * 8, capacity, self.scheme);
        self.capacity = stacked_capacity(self.scheme, self.expansion, self.height, capacity);
        self.share = Share::Half;
        Ok(PlannedSubFilter { capacity, sizing, bytes })
    }
}

impl ShardedBloom {
    /// A filter with its first shard allocated at `capacity`, as `RESERVE`
    /// and an `ADD` on a missing key make it, probing by the current
    /// scheme. `max_bytes` limits its bit arrays (and is itself capped at
    /// [`MAX_BYTES`]).
    pub fn new(params: Params, seed: [u8; 32], now: Millis, max_bytes: u64) -> Result<ShardedBloom, BloomError> {
        ShardedBloom::with_scheme(params, Scheme::CURRENT, seed, now, max_bytes)
    }

    /// As [`new`](Self::new), probing by `scheme`: what a replica or an AOF
    /// replay does for a filter the primary created in an older format.
    pub fn with_scheme(
        params: Params,
        scheme: Scheme,
        seed: [u8; 32],
        now: Millis,
        max_bytes: u64,
    ) -> Result<ShardedBloom, BloomError> {
        params.check_for(scheme)?;
        let mut filter = ShardedBloom { params, seed, scheme, shards: Vec::new() };
        let first = filter.plan(1, now, max_bytes)?.planned.pop().ok_or(BloomError::StackFull)?;
        filter.open_shard(now, first);
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
    /// [`plan`](Self::plan) before
    /// [`drop_expired`](Self::drop_expired) sizes what an insertion
    /// after it allocates.
    ///
    /// Format 4 follows the trend both ways: the newest count times its
    /// growth or fall from the shard before, within [`MAX_TREND_FALL`] and
    /// [`MAX_TREND_RISE`], but never below the count of a live shard that
    /// outgrew its forecast (stacked), plus up to [`GROWTH_MARGIN`]
    /// (up to [`FITTED_HEADROOM`] with one shard of history): see
    /// [`headroom_within_size`](Self::headroom_within_size).
    fn new_shard_sizing(&self, now: Millis) -> (u64, Share) {
        let mut live = self.shards.iter().rev().filter(|shard| self.is_live(shard, now));
        let (newest, previous) = match (live.next(), live.next()) {
            (Some(newest), previous) if newest.items > 0 => (newest.items, previous.map_or(0, |shard| shard.items)),
            _ => return (self.params.capacity, Share::Reserved),
        };
        if self.scheme == Scheme::Fitted {
            let (forecast, headroom) = match previous {
                0 => (newest as f64, FITTED_HEADROOM),
                _ => {
                    let trend = (newest as f64 / previous as f64).clamp(MAX_TREND_FALL, MAX_TREND_RISE);
                    (newest as f64 * trend, 1.0 + GROWTH_MARGIN)
                }
            };
            // Never below a live shard that outgrew its forecast: traffic
            // that swings (quiet nights or weekends between busy periods)
            // comes back to its high, and a shard sized after the quiet
            // one stacks a dozen sub-filters to get there, every busy
            // period, until the window holds hundreds. Once one did, the
            // shards after it are sized for that high while it is in the
            // window; a quiet one costs its arrays only while it is the
            // current one: closed, it folds to what its items need.
            // Traffic that falls steadily never stacks, and is followed.
            let beaten = self.shards.iter().filter(|shard| shard.filters.len() > 1 && self.is_live(shard, now));
            let forecast = forecast.max(beaten.map(|shard| shard.items).max().unwrap_or(0) as f64);
            let (least, most) = (forecast.ceil() as u64, (forecast * headroom).ceil() as u64);
            return (self.headroom_within_size(least, most), Share::Most);
        }
        let headroom = if previous > 0 {
            let growth = (newest as f64 / previous as f64 - 1.0).max(0.0);
            (1.0 + growth + GROWTH_MARGIN).min(MAX_GROWTH_HEADROOM)
        } else {
            HEADROOM
        };
        ((newest as f64 * headroom).ceil() as u64, Share::Most)
    }

    /// A new shard's capacity from `least` (the forecast) to `most` (with
    /// its headroom): `most`, unless the allocation size it needs is a step
    /// above the one before it; then the most that size before holds, if
    /// that is at least `least`. Sizes are close for large arrays, and 2-3%
    /// apart around 10,000 items, where a step would cost more than the
    /// headroom it buys.
    fn headroom_within_size(&self, least: u64, most: u64) -> u64 {
        let bytes = |capacity| sub_filter_bytes(capacity, self.params.shard_error(), Share::Most, self.scheme);
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

    /// The shard that takes items at `now`: the newest one if `now` falls
    /// in it, or later (a clock that stepped back never writes into an
    /// older shard than one already written), else none yet.
    fn shard_for(&self, now: Millis) -> Option<&Shard> {
        self.shards.last().filter(|newest| newest.start >= self.shard_start(now))
    }

    /// The next sub-filter of the stack that takes items at `now` (a new
    /// shard's first if none does yet), with the live shards' totals so
    /// far; and the room left in that stack's top sub-filter.
    fn growth(&self, now: Millis) -> (Growth, u64) {
        let live = self.shards.iter().filter(|shard| self.is_live(shard, now));
        let (bytes, sub_filters) =
            live.fold((0, 0), |(bytes, count), shard| (bytes + shard.bytes(), count + shard.filters.len()));
        let params = &self.params;
        let mut growth = Growth {
            scheme: self.scheme,
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
                growth.capacity = shard.next_capacity(params, self.scheme);
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
    fn next_sub_filter(&self, now: Millis) -> Result<PlannedSubFilter, BloomError> {
        self.growth(now).0.allocate(MAX_BYTES)
    }

    /// Starts the shard for `now` with `first` as its first sub-filter.
    /// In format 4 the shard it follows takes no more items: its arrays
    /// fold to what its items need.
    fn open_shard(&mut self, now: Millis, first: PlannedSubFilter) {
        let first = SubFilter::new(first.capacity, first.sizing, self.scheme);
        let start = self.shard_start(now);
        if self.scheme == Scheme::Fitted
            && let Some(closed) = self.shards.last_mut()
        {
            closed.filters.iter_mut().for_each(SubFilter::fold_to_items);
        }
        // Tables exactly as long as their contents: a filter per tenant
        // pays every spare slot per tenant (a table of 8 shards cost a
        // 1,000-item filter 320 bytes besides its 1,792 of bits).
        self.shards.reserve_exact(1);
        self.shards.push(Shard { start, items: 0, filters: vec![first] });
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
    fn insert(
        &mut self,
        item: ItemHash,
        now: Millis,
        mut next: impl FnMut(&Self) -> Result<PlannedSubFilter, BloomError>,
    ) -> Result<Added, BloomError> {
        if self.shard_for(now).is_none() {
            let first = next(self)?;
            self.open_shard(now, first);
        }
        let scheme = self.scheme;
        let span = self.params.span();
        let current = self.shards.last().expect("a shard exists");
        let (top, lower) = current.filters.split_last().expect("a shard has a sub-filter");
        if lower.iter().any(|filter| filter.bits.check(item)) {
            return Ok(Added::AlreadyThere);
        }
        if top.items >= top.capacity {
            if top.bits.check(item) {
                return Ok(Added::AlreadyThere);
            }
            let next = next(self)?;
            let next = SubFilter::new(next.capacity, next.sizing, scheme);
            let filters = &mut self.shards.last_mut().expect("a shard exists").filters;
            filters.reserve_exact(1);
            filters.push(next);
        }
        let (current, older) = self.shards.split_last_mut().expect("a shard exists");
        let top = current.filters.last_mut().expect("a shard has a sub-filter");
        if !top.bits.insert(item) {
            return Ok(Added::AlreadyThere);
        }
        top.items += 1;
        current.items += 1;
        let seen = older.iter().rev().any(|shard| shard.live_at(span, now) && shard.contains(item));
        Ok(if seen { Added::Seen } else { Added::New })
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

impl From<BloomError> for CmdError {
    /// The error reply of a refused filter write, naming its cause.
    fn from(error: BloomError) -> CmdError {
        match error {
            BloomError::Invalid(which) => CmdError::new(format!("ERR {}", which.message())),
            BloomError::SizeLimit { needed, .. } if needed > MAX_BYTES => CmdError::new(format!(
                "ERR filter too large: it would need {needed} bytes, over the largest filter ({MAX_BYTES}); \
                 lower its capacity or raise its error rate"
            )),
            BloomError::SizeLimit { needed, limit } => CmdError::new(format!(
                "ERR the filter would grow to {needed} bytes, over idem.bf-max-bytes ({limit}); \
                 raise idem.bf-max-bytes, or spread the items over more filter keys"
            )),
            BloomError::StackFull => CmdError::new(format!(
                "ERR filter full: the current shard already stacks {MAX_SUB_FILTERS} sub-filters; \
                 spread the items over more filter keys, or recreate the filter with a shorter SHARD period"
            )),
            BloomError::TooManySubFilters => CmdError::new(format!(
                "ERR filter full: it would hold more than {MAX_TOTAL_SUB_FILTERS} sub-filters in all; \
                 recreate the filter with a shorter WINDOW or a longer SHARD period"
            )),
        }
    }
}

/// `IDEM.BF.RESERVE key error_rate capacity [WINDOW n] [SHARD
/// DAY|HOUR|seconds] [EXPANSION n]`, checked; `window` is the default
/// `WINDOW`.
pub fn parse_reserve<A: ArgList + ?Sized>(args: &A, window: u32) -> Result<Params, CmdError> {
    require(args, 4)?;
    let mut params = Params::with_defaults(args.double(2)?, args.int(3)?.max(0) as u64, window);
    let to_u32 = |value: i64| u32::try_from(value).unwrap_or(0);
    parse_options(args, 4, &["WINDOW", "SHARD", "EXPANSION"], |option, value| {
        match option {
            0 => params.window = to_u32(args.int(value)?),
            1 => {
                let text = args.bytes(value);
                params.period = if text.eq_ignore_ascii_case(b"DAY") {
                    DAY
                } else if text.eq_ignore_ascii_case(b"HOUR") {
                    HOUR
                } else {
                    args.int(value).map_err(|_| BloomError::Invalid(OutOfRange::Shard))?
                };
            }
            _ => params.expansion = to_u32(args.int(value)?),
        }
        Ok(())
    })?;
    params.check()?;
    Ok(params)
}

#[cfg(test)]
mod tests;
