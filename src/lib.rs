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

use redis_module::configuration::ConfigurationFlags;
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
    if let Err(message) = config::check_module_args(args) {
        ctx.log_warning(&format!("redis-idem: {message}"));
        return Status::Err;
    }
    // Without it a crafted RESTORE payload can crash the server; with it a
    // failed read makes the load fail with an error.
    context.set_module_options(redis_module::ModuleOptions::HANDLE_IO_ERRORS);
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
        &[&record::commands::COMMANDS, &record::batch::COMMANDS, &bloom::commands::COMMANDS],
    ) {
        ctx.log_warning(&message);
        return Status::Err;
    }
    if let Err(message) = host::owed::start(ctx) {
        ctx.log_warning(&message);
        return Status::Err;
    }
    warn_if_records_can_be_evicted(ctx);
    bloom::sweeper::start(ctx);
    host::info::register(ctx, metrics::fields);
    log_loaded(context);
    Status::Ok
}

/// What the module supports, in the load messages (README: "Servers").
const SUPPORTED: &str = "redis-idem supports Redis 7.0.5+ and Valkey 8+ \
                         (tested: Redis 7.0.15, Redis 8.2.3, Valkey 9.1).";

/// Says, once at load, which optional API features this server has: what
/// differs between servers is read from there, not from a version.
fn log_loaded(context: &Context) {
    let features = host::api_features();
    let has = |present: bool| if present { "yes" } else { "no" };
    context.log_notice(&format!(
        "redis-idem {} loaded. {SUPPORTED} This server: ACL categories on commands \
         (SetCommandACLCategories): {}; the @idem category (AddACLCategory): {}; \
         blocking on keys with flags (BlockClientOnKeysWithFlags): {}.",
        env!("CARGO_PKG_VERSION"),
        has(features.command_acl_categories),
        has(features.module_acl_category),
        has(features.block_on_keys_with_flags),
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

redis_module! {
    name: "idem",
    version: MODULE_VERSION,
    allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
    data_types: [RECORD_TYPE, BLOOM_TYPE],
    init: init,
    configurations: [
        i64: [
            [NUMERIC[0].name, NUMERIC[0].value, NUMERIC[0].default, NUMERIC[0].min, NUMERIC[0].max, ConfigurationFlags::DEFAULT, None],
            [NUMERIC[1].name, NUMERIC[1].value, NUMERIC[1].default, NUMERIC[1].min, NUMERIC[1].max, ConfigurationFlags::DEFAULT, None],
            [NUMERIC[2].name, NUMERIC[2].value, NUMERIC[2].default, NUMERIC[2].min, NUMERIC[2].max, ConfigurationFlags::DEFAULT, None],
            [NUMERIC[3].name, NUMERIC[3].value, NUMERIC[3].default, NUMERIC[3].min, NUMERIC[3].max, ConfigurationFlags::DEFAULT, None],
            [NUMERIC[4].name, NUMERIC[4].value, NUMERIC[4].default, NUMERIC[4].min, NUMERIC[4].max, ConfigurationFlags::DEFAULT, None],
            [NUMERIC[5].name, NUMERIC[5].value, NUMERIC[5].default, NUMERIC[5].min, NUMERIC[5].max, ConfigurationFlags::DEFAULT, None],
            [NUMERIC[6].name, NUMERIC[6].value, NUMERIC[6].default, NUMERIC[6].min, NUMERIC[6].max, ConfigurationFlags::DEFAULT, None],
        ],
        string: [
            ["bf-error-rate", &config::BF_ERROR_RATE, config::DEFAULT_BF_ERROR_RATE, ConfigurationFlags::DEFAULT, None],
        ],
        bool: [],
        enum: [],
        module_args_as_configuration: true,
    ]
}
