//! A filter's settings, their bounds and defaults, `IDEM.BF.RESERVE`'s
//! arguments, and why a filter write is refused.

use super::{DAY, HOUR, Seconds};
use crate::args::{ArgList, parse_options, require};
use crate::error::CmdError;

/// Largest window of a new filter: a year of daily shards (366 with a
/// leap day), or 15 days of hourly ones. Every query probes every live
/// shard, so the window is bounded with the sub-filters in all: a window
/// of 366 leaves [`MAX_TOTAL_SUB_FILTERS`] room for 145 stacked
/// sub-filters besides one a shard (and the window + 1 shards live at a
/// shard's last millisecond).
pub const MAX_WINDOW: u32 = 366;
/// `SHARD` when none is given: a UTC day.
pub const DEFAULT_PERIOD: Seconds = DAY;
/// `EXPANSION` when none is given.
pub const DEFAULT_EXPANSION: u32 = 2;
/// Largest expansion factor between stacked sub-filters.
pub const MAX_EXPANSION: u32 = 1_024;
/// Most sub-filters one shard stacks; with expansion 1 that is 2^28
/// times the first one's capacity (see [`super::EXPANSION_HEIGHT`]).
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
/// 1.2-1.5 s and 7.7-9.9 s.
pub const MAX_TOTAL_SUB_FILTERS: usize = 512;
/// Redis's largest bulk string (`proto-max-bulk-len`'s default and most
/// operators' value): a `DUMP` payload larger than this cannot be
/// `RESTORE`d or `MIGRATE`d.
pub const PROTO_MAX_BULK_LEN: u64 = 512 * 1024 * 1024;
/// Hard ceiling on a filter's bit arrays, all shards together, whatever
/// the configured limit. One MiB under [`PROTO_MAX_BULK_LEN`] leaves room
/// for the encoding around the bits (at most
/// [`codec::MAX_OVERHEAD`](super::codec::MAX_OVERHEAD)) and the `DUMP`
/// envelope, so the largest filter still `DUMP`s, `RESTORE`s and
/// `MIGRATE`s.
pub const MAX_BYTES: u64 = PROTO_MAX_BULK_LEN - 1024 * 1024;
/// Smallest error rate of a new filter, chosen from the sizes rates
/// imply. A shard's budget is the rate over the window, and each stacked
/// sub-filter gets part of what is left, so sub-filters aim far below the
/// rate; past a rate of about 1e-6 they need more than
/// [`MAX_HASHES`](super::MAX_HASHES) probes at the optimum, and the
/// capped count costs more bits than the optimum (`-ln(rate) / ln(2)^2`),
/// more so the lower the rate. Measured by
/// `sizes_at_the_rate_bound_stay_in_proportion` (first sub-filter of a
/// 7-day window, then the 32nd of a full stack): 1e-6 costs 35 and 116
/// bits an item, 1e-9 54 and 170 (an eighth over the optimum; a 1% filter
/// takes 10.5), 1e-12 81 and 243, 1e-15 118 and 344 (half over the
/// optimum). One false positive in a billion queries is far below what a
/// prefilter in front of an exact record can use; below it each factor of
/// 1000 costs 25 to 40 more bits an item, and 5e-324 has no size at all.
pub const MIN_ERROR_RATE: f64 = 1e-9;
/// Largest period: a century.
pub const MAX_PERIOD: Seconds = 100 * 365 * DAY;

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
    Window,
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
            OutOfRange::Window => format!("WINDOW must be between 1 and {MAX_WINDOW}"),
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

impl Params {
    /// Settings with the default `SHARD` ([`DEFAULT_PERIOD`]) and
    /// `EXPANSION` ([`DEFAULT_EXPANSION`]).
    pub fn with_defaults(error_rate: f64, capacity: u64, window: u32) -> Params {
        Params { error_rate, capacity, window, period: DEFAULT_PERIOD, expansion: DEFAULT_EXPANSION }
    }

    /// Whether a filter may have these settings.
    pub fn check(&self) -> Result<(), BloomError> {
        let invalid = |which| Err(BloomError::Invalid(which));
        if self.error_rate > 0.0 && self.error_rate < MIN_ERROR_RATE {
            return invalid(OutOfRange::ErrorRateTooLow);
        }
        if !(self.error_rate >= MIN_ERROR_RATE && self.error_rate < 1.0) {
            return invalid(OutOfRange::ErrorRate);
        }
        if self.capacity < 1 {
            return invalid(OutOfRange::Capacity);
        }
        if !(1..=MAX_WINDOW).contains(&self.window) {
            return invalid(OutOfRange::Window);
        }
        if !(1..=MAX_PERIOD).contains(&self.period) {
            return invalid(OutOfRange::Shard);
        }
        if !(1..=MAX_EXPANSION).contains(&self.expansion) {
            return invalid(OutOfRange::Expansion);
        }
        Ok(())
    }

    /// The error budget of one shard.
    pub(super) fn shard_error(&self) -> f64 {
        self.error_rate / self.window as f64
    }

    /// How long a shard stays in the window after it starts.
    pub(super) fn span(&self) -> Seconds {
        self.period * self.window as Seconds
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
