//! redis-idem: idempotent message consumption as a Redis module.
//!
//! Layout: `record` is the pure state machine (no Redis); `commands` parses,
//! calls it, replies and propagates; `record_type` holds the data type and
//! its persistence callbacks; `command_table` registers the commands.

pub mod args;
pub mod bloom;
pub mod bloom_commands;
pub mod bloom_sweeper;
pub mod bloom_type;
pub mod command_table;
pub mod commands;
pub mod config;
pub mod limits;
pub mod metrics;
pub mod record;
pub mod record_type;
pub mod server;

use redis_module::configuration::ConfigurationFlags;
use redis_module::{Context, RedisString, RedisValue, Status, raw, redis_module};

use bloom_type::BLOOM_TYPE;
use record_type::RECORD_TYPE;

/// Unit tests and fuzz targets run without a server, hence without
/// Redis's allocator.
#[cfg(not(any(test, feature = "standalone")))]
type Allocator = redis_module::alloc::RedisAlloc;
#[cfg(not(any(test, feature = "standalone")))]
const ALLOCATOR: Allocator = redis_module::alloc::RedisAlloc;
#[cfg(any(test, feature = "standalone"))]
type Allocator = std::alloc::System;
#[cfg(any(test, feature = "standalone"))]
const ALLOCATOR: Allocator = std::alloc::System;

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

fn init(ctx: &Context, args: &[RedisString]) -> Status {
    if let Err(message) = config::check_module_args(args) {
        ctx.log_warning(&format!("redis-idem: {message}"));
        return Status::Err;
    }
    // Without it a crafted RESTORE payload can crash the server; with it a
    // failed read makes the load fail with an error.
    ctx.set_module_options(redis_module::ModuleOptions::HANDLE_IO_ERRORS);
    // Absolute expiry arrived in 7.0.5; older servers cannot keep records
    // exact across replicas, so refuse to load rather than drift.
    let has_abs_expire =
        unsafe { raw::RedisModule_SetAbsExpire }.is_some() && unsafe { raw::RedisModule_GetAbsExpire }.is_some();
    if !has_abs_expire {
        ctx.log_warning("redis-idem needs Redis 7.0.5+ or Valkey 8+ (RedisModule_SetAbsExpire)");
        return Status::Err;
    }
    if let Err(message) = command_table::register(ctx.ctx) {
        ctx.log_warning(&message);
        return Status::Err;
    }
    warn_if_records_can_be_evicted(ctx);
    bloom_sweeper::start(ctx.ctx);
    // Replaces the crate's default INFO callback with ours.
    unsafe { raw::RedisModule_RegisterInfoFunc.expect("RegisterInfoFunc")(ctx.ctx, Some(metrics::info)) };
    Status::Ok
}

/// Every record has a TTL, so every eviction policy but `noeviction` can
/// pick one, and an evicted record is a message processed twice. Said
/// once, at load time, where an operator reads the log.
fn warn_if_records_can_be_evicted(ctx: &Context) {
    let Ok(RedisValue::Array(reply)) = ctx.call("CONFIG", &["GET", "maxmemory-policy"]) else {
        return;
    };
    let policy = match reply.get(1) {
        Some(RedisValue::SimpleString(text) | RedisValue::BulkString(text)) => text.clone(),
        Some(RedisValue::BulkRedisString(text)) => text.to_string_lossy(),
        Some(RedisValue::StringBuffer(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
        _ => return,
    };
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
    allocator: (Allocator, ALLOCATOR),
    data_types: [RECORD_TYPE, BLOOM_TYPE],
    init: init,
    configurations: [
        i64: [
            ["retain", &config::RETAIN, config::DEFAULT_RETAIN, 1, config::MAX_SECONDS, ConfigurationFlags::DEFAULT, None],
            ["history", &config::HISTORY, config::DEFAULT_HISTORY, 1, config::MAX_SECONDS, ConfigurationFlags::DEFAULT, None],
            ["max-result", &config::MAX_RESULT, config::DEFAULT_MAX_RESULT, 0, config::MAX_RESULT_LIMIT, ConfigurationFlags::DEFAULT, None],
            ["bf-capacity", &config::BF_CAPACITY, config::DEFAULT_BF_CAPACITY, 1, config::MAX_BF_CAPACITY, ConfigurationFlags::DEFAULT, None],
            ["bf-window", &config::BF_WINDOW, config::DEFAULT_BF_WINDOW, 1, bloom::MAX_WINDOW as i64, ConfigurationFlags::DEFAULT, None],
            ["bf-max-bytes", &config::BF_MAX_BYTES, config::DEFAULT_BF_MAX_BYTES, config::MIN_BF_MAX_BYTES, bloom::MAX_BYTES as i64, ConfigurationFlags::DEFAULT, None],
        ],
        string: [
            ["bf-error-rate", &config::BF_ERROR_RATE, "0.01", ConfigurationFlags::DEFAULT, None],
        ],
        bool: [],
        enum: [],
        module_args_as_configuration: true,
    ]
}
