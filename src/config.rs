//! The `idem.*` configs: `CONFIG GET/SET idem.<name>`, or name/value pairs
//! after the module path in `loadmodule`. Redis enforces the ranges below
//! and refuses anything else with an error.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use redis_module::configuration::{ConfigurationContext, ConfigurationValue};
use redis_module::{RedisError, RedisString};

use crate::bloom::Params;
use crate::record::{Lifetimes, Millis};

/// Longest `retain`/`history`: 100 years. Time arguments are checked
/// against it, so `now + argument + history` can never overflow.
pub const MAX_SECONDS: i64 = 100 * 365 * 24 * 3600;
/// Largest `max-result`: Redis's string limit (512 MB, the default
/// `proto-max-bulk-len`) less what a record adds to its result, so that a
/// record with the largest RESULT can still be DUMPed, RESTOREd and
/// MIGRATEd. (A lower `proto-max-bulk-len` is checked when DONE stores a
/// large RESULT.)
pub const MAX_RESULT_LIMIT: i64 = 512 * 1024 * 1024 - crate::limits::RECORD_OVERHEAD as i64;

pub const DEFAULT_RETAIN: i64 = 86_400;
pub const DEFAULT_HISTORY: i64 = 3_600;
pub const DEFAULT_MAX_RESULT: i64 = 1_048_576;

/// Seconds a done record is kept (`RETAIN` overrides it per call).
pub static RETAIN: AtomicI64 = AtomicI64::new(DEFAULT_RETAIN);
/// Seconds a released or expired record is kept after its lease ended.
pub static HISTORY: AtomicI64 = AtomicI64::new(DEFAULT_HISTORY);
/// Largest `RESULT` in bytes.
pub static MAX_RESULT: AtomicI64 = AtomicI64::new(DEFAULT_MAX_RESULT);

pub fn retain() -> Millis {
    RETAIN.load(Ordering::Relaxed) * 1000
}

pub fn lifetimes() -> Lifetimes {
    Lifetimes { history: HISTORY.load(Ordering::Relaxed) * 1000 }
}

pub fn max_result() -> usize {
    MAX_RESULT.load(Ordering::Relaxed) as usize
}

pub const DEFAULT_BF_CAPACITY: i64 = 100_000;
pub const DEFAULT_BF_WINDOW: i64 = 7;
/// Largest default capacity of a filter made by an ADD on a missing key.
pub const MAX_BF_CAPACITY: i64 = 1 << 40;

/// Default `bf-max-bytes`: a quarter of Redis's default string limit, so
/// that any filter can be DUMPed and MIGRATEd in a resharding without
/// raising `proto-max-bulk-len`, and freeing or copying one stays quick.
pub const DEFAULT_BF_MAX_BYTES: i64 = 128 * 1024 * 1024;
/// Smallest `bf-max-bytes`: one page of bits.
pub const MIN_BF_MAX_BYTES: i64 = 4096;

/// Largest filter, in bytes of bit arrays over all its live shards.
pub static BF_MAX_BYTES: AtomicI64 = AtomicI64::new(DEFAULT_BF_MAX_BYTES);

pub fn bf_max_bytes() -> u64 {
    BF_MAX_BYTES.load(Ordering::Relaxed) as u64
}

/// Capacity of the first shard of a filter that `ADD` creates.
pub static BF_CAPACITY: AtomicI64 = AtomicI64::new(DEFAULT_BF_CAPACITY);
/// Window, in shards, of a filter that `ADD` creates.
pub static BF_WINDOW: AtomicI64 = AtomicI64::new(DEFAULT_BF_WINDOW);
/// Error rate of a filter that `ADD` creates.
pub static BF_ERROR_RATE: ErrorRate = ErrorRate(AtomicU64::new(0.01f64.to_bits()));

/// A float config: Redis's module API has no float type, so it is a string
/// config parsed and checked here, where a bad value can still be refused.
pub struct ErrorRate(AtomicU64);

impl ErrorRate {
    pub fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
}

impl ConfigurationValue<RedisString> for ErrorRate {
    fn get(&self, _ctx: &ConfigurationContext) -> RedisString {
        RedisString::create(None, ErrorRate::get(self).to_string().as_str())
    }

    fn set(&self, _ctx: &ConfigurationContext, value: RedisString) -> Result<(), RedisError> {
        let rate: f64 = value
            .try_as_str()
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .filter(|rate: &f64| valid_error_rate(*rate))
            .ok_or(RedisError::Str("idem.bf-error-rate must be a number from 1e-9 to 1 (exclusive)"))?;
        self.0.store(rate.to_bits(), Ordering::Relaxed);
        Ok(())
    }
}

/// The range `IDEM.BF.RESERVE` accepts, for the config too.
fn valid_error_rate(rate: f64) -> bool {
    (crate::bloom::MIN_ERROR_RATE..1.0).contains(&rate)
}

/// Parameters of a filter made by an `ADD` (or `DONE ... BLOOM`) on a
/// missing key.
pub fn default_filter() -> Params {
    Params {
        error_rate: BF_ERROR_RATE.get(),
        capacity: BF_CAPACITY.load(Ordering::Relaxed) as u64,
        window: BF_WINDOW.load(Ordering::Relaxed) as u32,
        period: crate::bloom::DAY,
        expansion: 2,
    }
}

/// The numeric configs and their ranges, as registered in `lib.rs`.
const NUMERIC: [(&str, i64, i64); 6] = [
    ("retain", 1, MAX_SECONDS),
    ("history", 1, MAX_SECONDS),
    ("max-result", 0, MAX_RESULT_LIMIT),
    ("bf-capacity", 1, MAX_BF_CAPACITY),
    ("bf-window", 1, crate::bloom::MAX_WINDOW as i64),
    ("bf-max-bytes", MIN_BF_MAX_BYTES, crate::bloom::MAX_BYTES as i64),
];

/// `loadmodule` arguments are name/value pairs of the configs. The crate
/// hands them to Redis as the configs' defaults, which Redis checks against
/// no range, so they are checked here: a bad one stops the module from
/// loading, as `CONFIG SET` would refuse it.
pub fn check_module_args(args: &[RedisString]) -> Result<(), String> {
    if args.len() % 2 != 0 {
        return Err("module arguments must be config name/value pairs".into());
    }
    for pair in args.chunks(2) {
        let name = pair[0].to_string_lossy();
        let value = pair[1].to_string_lossy();
        if name == "bf-error-rate" {
            match value.trim().parse::<f64>() {
                Ok(rate) if valid_error_rate(rate) => continue,
                _ => return Err(format!("bf-error-rate must be a number from 1e-9 to 1 (exclusive), not '{value}'")),
            }
        }
        let Some(&(_, min, max)) = NUMERIC.iter().find(|(known, _, _)| *known == name) else {
            return Err(format!("unknown config '{name}'"));
        };
        match value.parse::<i64>() {
            Ok(number) if (min..=max).contains(&number) => {}
            _ => return Err(format!("{name} must be an integer from {min} to {max}, not '{value}'")),
        }
    }
    Ok(())
}
