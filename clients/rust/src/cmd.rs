//! The commands as `redis::Cmd`s, for either edition: `IDEM.*` for the
//! module, `FCALL idem_*` for the Functions library (docs/functions.md),
//! which refuses what it cannot do before anything is sent.
use crate::error::Error;
use redis::{Cmd, ToRedisArgs};
use std::time::Duration;

/// Which redis-idem a server has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Edition {
    /// The module: every command, WAIT, BLOOM, batches, INFO counters.
    Module,
    /// The Functions library (`functions/idem.lua`), for servers that do not
    /// load modules: the record commands without WAIT, BLOOM and batches.
    Functions,
}

impl Edition {
    /// `COMMAND INFO IDEM.CLAIM` (a description where the module is loaded,
    /// nil where not), then `FCALL_RO idem_edition 0`. A server with both
    /// uses the module.
    pub(crate) fn detect_cmds() -> (Cmd, Cmd) {
        (
            redis::cmd("COMMAND").arg("INFO").arg("IDEM.CLAIM").to_owned(),
            redis::cmd("FCALL_RO").arg("idem_edition").arg(0).to_owned(),
        )
    }

    pub(crate) fn from_replies(
        command_info: redis::RedisResult<redis::Value>,
        edition: impl FnOnce() -> redis::RedisResult<redis::Value>,
    ) -> Result<Edition, Error> {
        use redis::Value;
        let lift = |reply: redis::RedisResult<Value>| match reply {
            Ok(Value::ServerError(e)) => Err(redis::RedisError::from(e)),
            other => other,
        };
        match lift(command_info)? {
            Value::Array(items) if items.iter().any(|item| *item != Value::Nil) => return Ok(Edition::Module),
            Value::Map(items) if !items.is_empty() => return Ok(Edition::Module),
            _ => {}
        }
        match lift(edition()) {
            Ok(_) => Ok(Edition::Functions),
            Err(e) if e.to_string().contains("not found") => Err(Error::NotInstalled),
            Err(e) => Err(e.into()),
        }
    }
}

/// Options of a claim.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClaimOptions {
    /// `PAYLOAD`: the content the key stands for; a later claim of the key
    /// with other content answers MISMATCH.
    pub payload: Option<Vec<u8>>,
    /// `MAXTRIES n`: after n attempts a claim answers EXHAUSTED.
    pub max_tries: Option<u32>,
    /// `BLOOM filterkey` (module only).
    pub bloom: Option<String>,
    /// `WAIT`: on BUSY, wait this long for the holder (module only; the
    /// server takes whole milliseconds, at most one hour).
    pub wait: Option<Duration>,
    /// `OWNER`: who holds the claim (1 to 64 bytes), shown by `IDEM.GET`.
    pub owner: Option<String>,
}

impl ClaimOptions {
    pub fn new() -> ClaimOptions {
        ClaimOptions::default()
    }
    pub fn payload(mut self, payload: impl Into<Vec<u8>>) -> Self {
        self.payload = Some(payload.into());
        self
    }
    pub fn max_tries(mut self, n: u32) -> Self {
        self.max_tries = Some(n);
        self
    }
    pub fn bloom(mut self, filter_key: impl Into<String>) -> Self {
        self.bloom = Some(filter_key.into());
        self
    }
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }
}

/// Options of a completion.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DoneOptions {
    /// `RESULT`: kept and replayed to every later claim.
    pub result: Option<Vec<u8>>,
    /// `RETAIN`: how long the done record is kept (else `idem.retain`).
    pub retain: Option<Duration>,
    /// `BLOOM filterkey` (module only).
    pub bloom: Option<String>,
}

impl DoneOptions {
    pub fn new() -> DoneOptions {
        DoneOptions::default()
    }
    pub fn result(mut self, result: impl Into<Vec<u8>>) -> Self {
        self.result = Some(result.into());
        self
    }
    pub fn retain(mut self, retain: Duration) -> Self {
        self.retain = Some(retain);
        self
    }
    pub fn bloom(mut self, filter_key: impl Into<String>) -> Self {
        self.bloom = Some(filter_key.into());
        self
    }
}

/// A duration the server takes in whole seconds (>= 1): refused before
/// sending when it is not one.
pub(crate) fn whole_seconds(what: &str, d: Duration) -> Result<u64, Error> {
    if d.subsec_nanos() != 0 || d.as_secs() == 0 {
        return Err(Error::InvalidArgument(format!("{what} must be whole seconds, at least 1, not {d:?}")));
    }
    Ok(d.as_secs())
}

/// Milliseconds for WAIT, at most the server's one hour.
pub(crate) fn wait_ms(d: Duration) -> u64 {
    (d.as_millis() as u64).min(3_600_000)
}

fn unsupported(what: &str) -> Error {
    Error::ModuleRequired(format!(
        "{what} needs the redis-idem module: the Functions edition on this server cannot do it"
    ))
}

/// The command's name and its leading arguments for one key.
fn head(edition: Edition, command: &str, function: &str, key: impl ToRedisArgs) -> Cmd {
    match edition {
        Edition::Module => redis::cmd(command).arg(key).to_owned(),
        Edition::Functions => redis::cmd("FCALL").arg(function).arg(1).arg(key).to_owned(),
    }
}

pub(crate) fn claim(
    edition: Edition,
    key: impl ToRedisArgs,
    lease: Duration,
    options: &ClaimOptions,
) -> Result<Cmd, Error> {
    let lease = whole_seconds("lease", lease)?;
    let mut cmd = head(edition, "IDEM.CLAIM", "idem_claim", key);
    cmd.arg(lease);
    if let Some(payload) = &options.payload {
        cmd.arg("PAYLOAD").arg(payload);
    }
    if let Some(n) = options.max_tries {
        cmd.arg("MAXTRIES").arg(n);
    }
    if let Some(owner) = &options.owner {
        cmd.arg("OWNER").arg(owner);
    }
    if let Some(filter) = &options.bloom {
        if edition == Edition::Functions {
            return Err(unsupported("BLOOM"));
        }
        cmd.arg("BLOOM").arg(filter);
    }
    if let Some(wait) = options.wait.filter(|w| wait_ms(*w) > 0) {
        if edition == Edition::Functions {
            return Err(unsupported("WAIT (a function cannot block; retry a BUSY claim after a backoff)"));
        }
        cmd.arg("WAIT").arg(wait_ms(wait));
    }
    Ok(cmd)
}

pub(crate) fn done(edition: Edition, key: impl ToRedisArgs, token: &str, options: &DoneOptions) -> Result<Cmd, Error> {
    let mut cmd = head(edition, "IDEM.DONE", "idem_done", key);
    cmd.arg(token);
    if let Some(result) = &options.result {
        cmd.arg("RESULT").arg(result);
    }
    if let Some(retain) = options.retain {
        cmd.arg("RETAIN").arg(whole_seconds("retain", retain)?);
    }
    if let Some(filter) = &options.bloom {
        if edition == Edition::Functions {
            return Err(unsupported("BLOOM"));
        }
        cmd.arg("BLOOM").arg(filter);
    }
    Ok(cmd)
}

pub(crate) fn release(edition: Edition, key: impl ToRedisArgs, token: &str) -> Cmd {
    head(edition, "IDEM.RELEASE", "idem_release", key).arg(token).to_owned()
}

pub(crate) fn extend(edition: Edition, key: impl ToRedisArgs, token: &str, lease: Duration) -> Result<Cmd, Error> {
    let lease = whole_seconds("lease", lease)?;
    Ok(head(edition, "IDEM.EXTEND", "idem_extend", key).arg(token).arg(lease).to_owned())
}

pub(crate) fn get(edition: Edition, key: impl ToRedisArgs) -> Cmd {
    match edition {
        Edition::Module => redis::cmd("IDEM.GET").arg(key).to_owned(),
        Edition::Functions => redis::cmd("FCALL_RO").arg("idem_get").arg(1).arg(key).to_owned(),
    }
}

/// `IDEM.REQUEUE key` / `FCALL idem_requeue 1 key`.
pub(crate) fn requeue(edition: Edition, key: impl ToRedisArgs) -> Cmd {
    head(edition, "IDEM.REQUEUE", "idem_requeue", key)
}

pub(crate) fn once(edition: Edition, key: impl ToRedisArgs, retain: Duration) -> Result<Cmd, Error> {
    let retain = whole_seconds("retain", retain)?;
    Ok(head(edition, "IDEM.ONCE", "idem_once", key).arg(retain).to_owned())
}

/// At most this many keys in one batch command (the server's limit).
pub const MAX_BATCH: usize = 10_000;

fn batch_guard(edition: Edition, what: &str, count: usize) -> Result<(), Error> {
    if edition == Edition::Functions {
        return Err(Error::ModuleRequired(format!(
            "{what} needs the redis-idem module: the Functions edition has no batch commands (the batch helpers send one command per key)"
        )));
    }
    if count == 0 || count > MAX_BATCH {
        return Err(Error::InvalidArgument(format!("{what} takes 1 to {MAX_BATCH} keys, not {count}")));
    }
    Ok(())
}

/// What every key of an `IDEM.MCLAIM` shares.
#[derive(Clone, Copy, Default)]
pub(crate) struct Shared<'a> {
    pub max_tries: Option<u32>,
    pub bloom: Option<&'a str>,
    pub owner: Option<&'a str>,
}

/// `IDEM.MCLAIM lease numkeys key... [PAYLOADS p...] [MAXTRIES n] [OWNER o] [BLOOM f]`;
/// `payloads`, when given, has one per key.
pub(crate) fn mclaim<K: ToRedisArgs>(
    edition: Edition,
    keys: &[K],
    lease: Duration,
    payloads: Option<&[Vec<u8>]>,
    shared: Shared<'_>,
) -> Result<Cmd, Error> {
    let Shared { max_tries, bloom, owner } = shared;
    batch_guard(edition, "IDEM.MCLAIM", keys.len())?;
    let mut cmd = redis::cmd("IDEM.MCLAIM");
    cmd.arg(whole_seconds("lease", lease)?).arg(keys.len()).arg(keys);
    if let Some(payloads) = payloads {
        if payloads.len() != keys.len() {
            return Err(Error::InvalidArgument(format!("{} payloads for {} keys", payloads.len(), keys.len())));
        }
        cmd.arg("PAYLOADS").arg(payloads);
    }
    if let Some(n) = max_tries {
        cmd.arg("MAXTRIES").arg(n);
    }
    if let Some(owner) = owner {
        cmd.arg("OWNER").arg(owner);
    }
    if let Some(filter) = bloom {
        cmd.arg("BLOOM").arg(filter);
    }
    Ok(cmd)
}

/// `WAIT replicas ms`, or with `fsync` `WAITAOF 1 replicas ms`.
pub(crate) fn wait_for(durable: &crate::options::Durable) -> Cmd {
    let ms = (durable.timeout.as_millis() as u64).max(1);
    match durable.fsync {
        false => redis::cmd("WAIT").arg(durable.replicas).arg(ms).to_owned(),
        true => redis::cmd("WAITAOF").arg(1).arg(durable.replicas).arg(ms).to_owned(),
    }
}

/// `IDEM.MDONE numkeys key token... [RESULTS r...] [RETAIN s] [BLOOM f]`;
/// `results`, when given, has one per key.
pub(crate) fn mdone<K: ToRedisArgs>(
    edition: Edition,
    keys_tokens: &[(K, String)],
    results: Option<&[Vec<u8>]>,
    retain: Option<Duration>,
    bloom: Option<&str>,
) -> Result<Cmd, Error> {
    batch_guard(edition, "IDEM.MDONE", keys_tokens.len())?;
    let mut cmd = redis::cmd("IDEM.MDONE");
    cmd.arg(keys_tokens.len());
    for (key, token) in keys_tokens {
        cmd.arg(key).arg(token);
    }
    if let Some(results) = results {
        if results.len() != keys_tokens.len() {
            return Err(Error::InvalidArgument(format!("{} results for {} keys", results.len(), keys_tokens.len())));
        }
        cmd.arg("RESULTS").arg(results);
    }
    if let Some(retain) = retain {
        cmd.arg("RETAIN").arg(whole_seconds("retain", retain)?);
    }
    if let Some(filter) = bloom {
        cmd.arg("BLOOM").arg(filter);
    }
    Ok(cmd)
}

/// `IDEM.MRELEASE numkeys key token...`
pub(crate) fn mrelease<K: ToRedisArgs>(edition: Edition, keys_tokens: &[(K, String)]) -> Result<Cmd, Error> {
    batch_guard(edition, "IDEM.MRELEASE", keys_tokens.len())?;
    let mut cmd = redis::cmd("IDEM.MRELEASE");
    cmd.arg(keys_tokens.len());
    for (key, token) in keys_tokens {
        cmd.arg(key).arg(token);
    }
    Ok(cmd)
}
