//! The `idem.*` configs: `CONFIG GET/SET idem.<name>`, or name/value pairs
//! after the module path in `loadmodule`. [`NUMERIC`] holds each numeric
//! config's default and range, which `lib.rs` registers (one loop over the
//! table: a new config is one more row) and Redis then enforces;
//! `loadmodule` arguments are checked against the same table.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use idem_core::Millis;
use idem_core::bloom::{self, Params};
use idem_core::record::codec::RECORD_OVERHEAD;
use idem_core::record::{Lifetimes, MAX_SECONDS};
use redis_module::configuration::{ConfigurationContext, ConfigurationValue};
use redis_module::{RedisError, RedisString};

/// A numeric config as registered: its value, default and range.
pub struct Numeric {
    pub name: &'static str,
    pub value: &'static AtomicI64,
    pub default: i64,
    pub min: i64,
    pub max: i64,
}

/// Every numeric config, in the order `lib.rs` registers them.
pub static NUMERIC: [Numeric; 7] = [
    Numeric { name: "retain", value: &RETAIN, default: 86_400, min: 1, max: MAX_SECONDS },
    Numeric { name: "history", value: &HISTORY, default: 3_600, min: 1, max: MAX_SECONDS },
    Numeric { name: "max-result", value: &MAX_RESULT, default: 1_048_576, min: 0, max: MAX_RESULT_LIMIT },
    Numeric { name: "bf-capacity", value: &BF_CAPACITY, default: 100_000, min: 1, max: MAX_BF_CAPACITY },
    Numeric { name: "bf-window", value: &BF_WINDOW, default: 7, min: 1, max: bloom::MAX_WINDOW as i64 },
    Numeric {
        name: "bf-max-bytes",
        value: &BF_MAX_BYTES,
        default: DEFAULT_BF_MAX_BYTES,
        min: MIN_BF_MAX_BYTES,
        max: bloom::MAX_BYTES as i64,
    },
    Numeric { name: "max-waiters", value: &MAX_WAITERS, default: 10_000, min: 0, max: 1_000_000 },
];

/// Largest `max-result`: Redis's string limit (512 MB, the default
/// `proto-max-bulk-len`) less what a record adds to its result, so that a
/// record with the largest RESULT can still be DUMPed, RESTOREd and
/// MIGRATEd. (A lower `proto-max-bulk-len` is checked when DONE stores a
/// large RESULT.)
const MAX_RESULT_LIMIT: i64 = 512 * 1024 * 1024 - RECORD_OVERHEAD as i64;
/// Largest default capacity of a filter made by an ADD on a missing key.
const MAX_BF_CAPACITY: i64 = 1 << 40;
/// Default `bf-max-bytes`: a quarter of Redis's default string limit, so
/// that any filter can be DUMPed and MIGRATEd in a resharding without
/// raising `proto-max-bulk-len`, and freeing or copying one stays quick.
const DEFAULT_BF_MAX_BYTES: i64 = 128 * 1024 * 1024;
/// Smallest `bf-max-bytes`: one page of bits.
const MIN_BF_MAX_BYTES: i64 = 4096;

// The values start at 0; Redis sets each config to its default (or the
// `loadmodule` argument) when the module loads, before any command runs.

/// Seconds a done record is kept (`RETAIN` overrides it per call).
static RETAIN: AtomicI64 = AtomicI64::new(0);
/// Seconds a released or expired record is kept after its lease ended.
static HISTORY: AtomicI64 = AtomicI64::new(0);
/// Largest `RESULT` in bytes.
static MAX_RESULT: AtomicI64 = AtomicI64::new(0);
/// Capacity of the first shard of a filter that `ADD` creates.
static BF_CAPACITY: AtomicI64 = AtomicI64::new(0);
/// Window, in shards, of a filter that `ADD` creates.
static BF_WINDOW: AtomicI64 = AtomicI64::new(0);
/// Largest filter, in bytes of bit arrays over all its live shards.
static BF_MAX_BYTES: AtomicI64 = AtomicI64::new(0);
/// Most clients waiting in `IDEM.CLAIM ... WAIT` at once: each costs the
/// server two clients of its own (docs/operations.md).
static MAX_WAITERS: AtomicI64 = AtomicI64::new(0);

/// `wait-hooks-at-load`: where the server does not wake the clients blocked
/// on a deleted key (Redis 7.0), hear every data type's writes from the
/// load on, rather than from the first `IDEM.CLAIM ... WAIT` (see
/// `host::owed::hear_changes`): the cost per write that a wait brings is
/// paid from the start, and measured from the start (benchmarks, Redis's
/// own test suite). Only at load: it cannot be changed while running.
pub const WAIT_HOOKS_AT_LOAD_NAME: &str = "wait-hooks-at-load";
pub static WAIT_HOOKS_AT_LOAD: AtomicBool = AtomicBool::new(false);

pub fn wait_hooks_at_load() -> bool {
    WAIT_HOOKS_AT_LOAD.load(Ordering::Relaxed)
}

/// Default `bf-error-rate`, as registered.
pub const DEFAULT_BF_ERROR_RATE: &str = "0.01";
/// Error rate of a filter that `ADD` creates.
pub static BF_ERROR_RATE: ErrorRate = ErrorRate(AtomicU64::new(0));

pub fn retain() -> Millis {
    RETAIN.load(Ordering::Relaxed) * 1000
}

pub fn lifetimes() -> Lifetimes {
    Lifetimes { history: HISTORY.load(Ordering::Relaxed) * 1000 }
}

pub fn max_result() -> usize {
    MAX_RESULT.load(Ordering::Relaxed) as usize
}

pub fn max_waiters() -> usize {
    MAX_WAITERS.load(Ordering::Relaxed) as usize
}

pub fn bf_max_bytes() -> u64 {
    BF_MAX_BYTES.load(Ordering::Relaxed) as u64
}

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
            .ok_or_else(|| RedisError::String(format!("idem.{}", error_rate_range())))?;
        self.0.store(rate.to_bits(), Ordering::Relaxed);
        Ok(())
    }
}

/// The range `IDEM.BF.RESERVE` accepts, for the config too.
fn valid_error_rate(rate: f64) -> bool {
    (bloom::MIN_ERROR_RATE..1.0).contains(&rate)
}

/// What a bad `bf-error-rate` is told.
fn error_rate_range() -> String {
    format!("bf-error-rate must be a number from {:e} to 1 (exclusive)", bloom::MIN_ERROR_RATE)
}

/// Parameters of a filter made by an `ADD` (or `DONE ... BLOOM`) on a
/// missing key.
pub fn default_filter() -> Params {
    Params::with_defaults(
        BF_ERROR_RATE.get(),
        BF_CAPACITY.load(Ordering::Relaxed) as u64,
        BF_WINDOW.load(Ordering::Relaxed) as u32,
    )
}

/// `loadmodule` arguments are name/value pairs of the configs. The crate
/// hands them to Redis as the configs' defaults, which Redis checks against
/// no range, so they are checked here: a bad one stops the module from
/// loading, as `CONFIG SET` would refuse it.
pub fn check_module_args(args: &[RedisString]) -> Result<(), String> {
    if !args.len().is_multiple_of(2) {
        return Err("module arguments must be config name/value pairs".into());
    }
    for pair in args.chunks(2) {
        let name = pair[0].to_string_lossy();
        let value = pair[1].to_string_lossy();
        if name == WAIT_HOOKS_AT_LOAD_NAME {
            match value.as_str() {
                "yes" | "no" => continue,
                _ => return Err(format!("{name} must be yes or no, not '{value}'")),
            }
        }
        if name == "bf-error-rate" {
            match value.trim().parse::<f64>() {
                Ok(rate) if valid_error_rate(rate) => continue,
                _ => return Err(format!("{}, not '{value}'", error_rate_range())),
            }
        }
        let Some(&Numeric { min, max, .. }) = NUMERIC.iter().find(|config| config.name == name) else {
            return Err(format!("unknown config '{name}'"));
        };
        match value.parse::<i64>() {
            Ok(number) if (min..=max).contains(&number) => {}
            _ => return Err(format!("{name} must be an integer from {min} to {max}, not '{value}'")),
        }
    }
    Ok(())
}
