//! redis-idem: idempotent message consumption as a Redis module.
//!
//! Everything that decides lives in the `idem-core` crate, which knows no
//! Redis. This crate is the module around it:
//!
//! - [`host`]: the only layer that talks to Redis's C API (context, keys,
//!   arguments, dispatch, registration, persistence IO, timers, INFO).
//! - [`record`]: the record commands, their command-table rows, and the
//!   record data type.
//! - [`bloom`]: the filter commands, their rows, the filter data type and
//!   the background sweeper of old shards.
//! - [`config`]: the `idem.*` configs; [`limits`]: size and memory limits
//!   on writes; [`metrics`]: the `INFO idem` counters.

// Unsafe code lives in `host` alone (the compiler checks it), and every block
// there says why it is sound.
#![deny(unsafe_code)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod bloom;
pub mod config;
#[allow(unsafe_code)]
pub mod host;
pub mod limits;
pub mod metrics;
pub mod record;

use redis_module::configuration::{
    ConfigurationFlags, get_bool_default_config_value, get_i64_default_config_value, get_string_default_config_value,
    register_bool_configuration, register_i64_configuration, register_string_configuration,
};
use redis_module::{Context, RedisString, Status, redis_module};

use bloom::data_type::BLOOM_TYPE;
use config::NUMERIC;
use host::Ctx;
use record::data_type::RECORD_TYPE;

/// `MODULE LIST` version: major * 10000 + minor * 100 + patch.
const MODULE_VERSION: i32 = parse_decimal(env!("CARGO_PKG_VERSION_MAJOR")) * 10000
    + parse_decimal(env!("CARGO_PKG_VERSION_MINOR")) * 100
    + parse_decimal(env!("CARGO_PKG_VERSION_PATCH"));

const fn parse_decimal(text: &str) -> i32 {
    let bytes = text.as_bytes();
    let mut value = 0;
    let mut i = 0;
    while i < bytes.len() {
        value = value * 10 + (bytes[i] - b'0') as i32;
        i += 1;
    }
    value
}

fn init(context: &Context, args: &[RedisString]) -> Status {
    let ctx = Ctx::of(context);
    if let Err(message) = config::check_module_args(args).and_then(|()| register_configs(context, args)) {
        ctx.log_warning(&format!("redis-idem: {message}"));
        return Status::Err;
    }
    // IO errors (a crafted RESTORE payload), async loading of a full sync,
    // and on Valkey atomic slot migration: see host::options.
    let atomic_slot_migration = host::options::declare(ctx);
    // Absolute expiry arrived in 7.0.5; older servers cannot keep records
    // exact across replicas, so refuse to load rather than drift. The gate
    // is the API function, not a version number.
    if !host::has_absolute_expiry() {
        context.log_warning(&format!(
            "redis-idem: cannot load: this server has no RedisModule_SetAbsExpire (absolute key expiry). {SUPPORTED}"
        ));
        return Status::Err;
    }
    if let Err(message) = host::command::register(
        ctx,
        &[
            &record::commands::COMMANDS,
            &record::batch::COMMANDS,
            &record::operator::COMMANDS,
            &bloom::commands::COMMANDS,
        ],
    ) {
        ctx.log_warning(&message);
        return Status::Err;
    }
    if let Err(message) = host::owed::start(ctx, config::wait_hooks_at_load()) {
        ctx.log_warning(&message);
        return Status::Err;
    }
    warn_if_records_can_be_evicted(ctx);
    bloom::sweeper::start(ctx);
    host::info::register(ctx, metrics::fields);
    log_loaded(context, atomic_slot_migration);
    Status::Ok
}

/// Registers every `idem.*` config of config.rs's tables, a `loadmodule`
/// argument as its default (`check_module_args` checked them), then has
/// Redis apply the `idem.*` lines of its config file.
fn register_configs(context: &Context, args: &[RedisString]) -> Result<(), String> {
    for numeric in &NUMERIC {
        let default = get_i64_default_config_value(args, numeric.name, numeric.default).map_err(|e| e.to_string())?;
        let (min, max, flags) = (numeric.min, numeric.max, ConfigurationFlags::DEFAULT);
        register_i64_configuration(context, numeric.name, numeric.value, default, min, max, flags, None);
    }
    let error_rate = get_string_default_config_value(args, "bf-error-rate", config::DEFAULT_BF_ERROR_RATE)
        .map_err(|e| e.to_string())?;
    let flags = ConfigurationFlags::DEFAULT;
    register_string_configuration(context, "bf-error-rate", &config::BF_ERROR_RATE, error_rate, flags, None);
    let hooks =
        get_bool_default_config_value(args, config::WAIT_HOOKS_AT_LOAD_NAME, false).map_err(|e| e.to_string())?;
    let immutable = ConfigurationFlags::IMMUTABLE;
    register_bool_configuration(
        context,
        config::WAIT_HOOKS_AT_LOAD_NAME,
        &config::WAIT_HOOKS_AT_LOAD,
        hooks,
        immutable,
        None,
    );
    Ctx::of(context).load_configs()
}

/// What the module supports, in the load messages (README: "Servers").
const SUPPORTED: &str = "redis-idem supports Redis 7.0.5+ and Valkey 8+ \
                         (tested: Redis 7.0.15, Redis 8.2.3, Valkey 9.1).";

/// Says, once at load, which optional API features this server has: what
/// differs between servers is read from there, not from a version.
fn log_loaded(context: &Context, atomic_slot_migration: bool) {
    let features = host::api_features();
    let has = |present: bool| if present { "yes" } else { "no" };
    context.log_notice(&format!(
        "redis-idem {} loaded. {SUPPORTED} This server: ACL categories on commands \
         (SetCommandACLCategories): {}; the @idem category (AddACLCategory): {}; \
         blocking on keys with flags (BlockClientOnKeysWithFlags): {}; reading keys \
         without effects (OPEN_KEY_NOEFFECTS): {}; Valkey's atomic slot migration declared: {}.",
        env!("CARGO_PKG_VERSION"),
        has(features.command_acl_categories),
        has(features.module_acl_category),
        has(features.block_on_keys_with_flags),
        has(host::access::has_no_effects_mode()),
        has(atomic_slot_migration),
    ));
}

/// Every record has a TTL, so every eviction policy but `noeviction` can
/// pick one, and an evicted record is a message processed twice. Said
/// once, at load time, where an operator reads the log.
fn warn_if_records_can_be_evicted(ctx: Ctx) {
    let Some(policy) = ctx.config("maxmemory-policy") else { return };
    if policy != "noeviction" {
        ctx.log_warning(&format!(
            "redis-idem: maxmemory-policy is {policy}: when maxmemory is reached Redis may evict \
             idempotency records and filters, and a redelivered message would then look new. \
             Use maxmemory-policy noeviction."
        ));
    }
}

/// Redis's allocator, which exists only inside a server; the system's for
/// the unit tests.
#[cfg(not(test))]
type Allocator = redis_module::alloc::RedisAlloc;
#[cfg(not(test))]
const ALLOCATOR: Allocator = redis_module::alloc::RedisAlloc;
#[cfg(test)]
type Allocator = std::alloc::System;
#[cfg(test)]
const ALLOCATOR: Allocator = std::alloc::System;

redis_module! {
    name: "idem",
    version: MODULE_VERSION,
    allocator: (Allocator, ALLOCATOR),
    data_types: [RECORD_TYPE, BLOOM_TYPE],
    init: init,
}
