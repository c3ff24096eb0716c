//! The module's commands as methods on any redis-rs connection, as
//! redis-rs's own `Commands` / `AsyncCommands` are: `con.idem_claim(...)`.
//! They send `IDEM.*` (the module); [`Idem`](crate::Idem) picks the edition
//! the server has and offers the same calls on both.
use crate::cmd::{self, ClaimOptions, DoneOptions, Edition};
use crate::error::Error;
use crate::reply::{Claim, Done, Record};
use crate::scan::{ScanOptions, scan_cmd};
use redis::{ConnectionLike, FromRedisValue, RedisResult, ToRedisArgs, Value};
use std::time::Duration;

/// One reply, with the server's errors sorted into [`Error`]'s variants.
pub(crate) fn decode<T: FromRedisValue>(reply: RedisResult<Value>) -> Result<T, Error> {
    match reply {
        Err(e) => Err(Error::from_server(e)),
        Ok(Value::ServerError(e)) => Err(Error::from_server(e.into())),
        Ok(v) => T::from_redis_value(v).map_err(|e| Error::UnexpectedReply(e.to_string())),
    }
}

/// A batch command's reply: one result per key, an error element failing
/// only its own key.
pub(crate) fn decode_each<T: FromRedisValue>(
    reply: RedisResult<Value>,
    count: usize,
) -> Result<Vec<Result<T, Error>>, Error> {
    match reply {
        Err(e) => Err(Error::from_server(e)),
        Ok(Value::ServerError(e)) => Err(Error::from_server(e.into())),
        Ok(Value::Array(items)) if items.len() == count => Ok(items.into_iter().map(|item| decode(Ok(item))).collect()),
        Ok(other) => Err(Error::UnexpectedReply(format!("an array of {count} answers, not {other:?}"))),
    }
}

/// RELEASE's and ONCE's 1/0.
pub(crate) fn flag(reply: RedisResult<Value>) -> Result<bool, Error> {
    decode::<i64>(reply).map(|n| n == 1)
}

/// EXTEND's 1 (STALE is an error).
pub(crate) fn extended(reply: RedisResult<Value>) -> Result<(), Error> {
    match decode::<i64>(reply)? {
        1 => Ok(()),
        n => Err(Error::UnexpectedReply(format!("IDEM.EXTEND answers 1 or STALE, not {n}"))),
    }
}

/// Asks the server which edition it has, on a sync connection.
pub(crate) fn detect_edition(con: &mut dyn ConnectionLike) -> Result<Edition, Error> {
    let (info, edition) = Edition::detect_cmds();
    let info = con.req_command(&info);
    Edition::from_replies(info, || con.req_command(&edition))
}

/// Asks the server which edition it has, on an async connection.
#[cfg(feature = "tokio")]
pub(crate) async fn detect_edition_async<C: redis::aio::ConnectionLike + Send>(con: &mut C) -> Result<Edition, Error> {
    let (info, edition) = Edition::detect_cmds();
    let info = con.req_packed_command(&info).await;
    let edition = con.req_packed_command(&edition).await;
    Edition::from_replies(info, || edition)
}

/// The module's commands on a sync connection (`redis::Connection`,
/// `redis::cluster::ClusterConnection`, ...).
///
/// ```no_run
/// use redis_idem_client::{Claim, ClaimOptions, DoneOptions, IdemCommands};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut con = redis::Client::open("redis://127.0.0.1/")?.get_connection()?;
/// if let Claim::New { token, attempt } = con.idem_claim("order:1001", std::time::Duration::from_secs(30), &ClaimOptions::new())? {
///     // ... the work, fenced by `attempt` ...
///     con.idem_done("order:1001", &token, &DoneOptions::new().result("charged"))?;
/// }
/// # Ok(()) }
/// ```
pub trait IdemCommands: ConnectionLike + Sized {
    /// `IDEM.CLAIM key lease [PAYLOAD p] [MAXTRIES n] [BLOOM f] [WAIT ms]`.
    /// A WAIT needs a read timeout above it on the connection.
    fn idem_claim<K: ToRedisArgs>(&mut self, key: K, lease: Duration, options: &ClaimOptions) -> Result<Claim, Error> {
        let cmd = cmd::claim(Edition::Module, key, lease, options)?;
        decode(self.req_command(&cmd))
    }
    /// `IDEM.DONE key token [RESULT r] [RETAIN s] [BLOOM f]`; STALE is
    /// [`Error::Stale`].
    fn idem_done<K: ToRedisArgs>(&mut self, key: K, token: &str, options: &DoneOptions) -> Result<Done, Error> {
        let cmd = cmd::done(Edition::Module, key, token, options)?;
        decode(self.req_command(&cmd))
    }
    /// `IDEM.RELEASE key token`: true when the live claim was given up.
    fn idem_release<K: ToRedisArgs>(&mut self, key: K, token: &str) -> Result<bool, Error> {
        flag(self.req_command(&cmd::release(Edition::Module, key, token)))
    }
    /// `IDEM.EXTEND key token lease`; STALE is [`Error::Stale`].
    fn idem_extend<K: ToRedisArgs>(&mut self, key: K, token: &str, lease: Duration) -> Result<(), Error> {
        extended(self.req_command(&cmd::extend(Edition::Module, key, token, lease)?))
    }
    /// `IDEM.GET key`: None when the key has no record.
    fn idem_get<K: ToRedisArgs>(&mut self, key: K) -> Result<Option<Record>, Error> {
        decode(self.req_command(&cmd::get(Edition::Module, key)))
    }
    /// `IDEM.ONCE key retain`: true when the key was absent and is now done.
    fn idem_once<K: ToRedisArgs>(&mut self, key: K, retain: Duration) -> Result<bool, Error> {
        flag(self.req_command(&cmd::once(Edition::Module, key, retain)?))
    }
    /// `IDEM.REQUEUE key`: true when the record is now released, false
    /// when there is none; a live lease is [`Error::LiveLease`](crate::Error::LiveLease).
    fn idem_requeue<K: ToRedisArgs>(&mut self, key: K) -> Result<bool, Error> {
        flag(self.req_command(&cmd::requeue(Edition::Module, key)))
    }
    /// One `IDEM.SCAN` call on this connection's node: `(next cursor,
    /// keys)`, cursor 0 at the end. [`Idem::scan`](crate::Idem::scan)
    /// walks every primary to the end.
    fn idem_scan(&mut self, cursor: u64, options: &ScanOptions) -> Result<(u64, Vec<String>), Error> {
        let cmd = scan_cmd(Edition::Module, cursor, options, "")?;
        decode(self.req_command(&cmd))
    }
    /// `IDEM.MCLAIM` on keys of one slot (at most 10000), with `OWNER`
    /// when given: one answer per key. [`Idem::claim_many`](crate::Idem::claim_many)
    /// splits any set.
    fn idem_mclaim<K: ToRedisArgs>(
        &mut self,
        keys: &[K],
        lease: Duration,
        payloads: Option<&[Vec<u8>]>,
        max_tries: Option<u32>,
        owner: Option<&str>,
    ) -> Result<Vec<Result<Claim, Error>>, Error> {
        let shared = cmd::Shared { max_tries, owner, bloom: None };
        let cmd = cmd::mclaim(Edition::Module, keys, lease, payloads, shared)?;
        decode_each(self.req_command(&cmd), keys.len())
    }
    /// `IDEM.MDONE` on keys of one slot: one answer per key.
    fn idem_mdone<K: ToRedisArgs>(
        &mut self,
        keys_tokens: &[(K, String)],
        results: Option<&[Vec<u8>]>,
        retain: Option<Duration>,
    ) -> Result<Vec<Result<Done, Error>>, Error> {
        let cmd = cmd::mdone(Edition::Module, keys_tokens, results, retain, None)?;
        decode_each(self.req_command(&cmd), keys_tokens.len())
    }
    /// `IDEM.MRELEASE` on keys of one slot: one answer per key.
    fn idem_mrelease<K: ToRedisArgs>(
        &mut self,
        keys_tokens: &[(K, String)],
    ) -> Result<Vec<Result<bool, Error>>, Error> {
        let cmd = cmd::mrelease(Edition::Module, keys_tokens)?;
        let each: Vec<Result<i64, Error>> = decode_each(self.req_command(&cmd), keys_tokens.len())?;
        Ok(each.into_iter().map(|r| r.map(|n| n == 1)).collect())
    }
}

impl<T: ConnectionLike> IdemCommands for T {}

#[cfg(feature = "tokio")]
pub use self::r#async::AsyncIdemCommands;

#[cfg(feature = "tokio")]
mod r#async {
    use super::*;
    use redis::Cmd;
    use std::future::Future;

    async fn send(
        con: &mut (impl redis::aio::ConnectionLike + Send),
        cmd: Result<Cmd, Error>,
    ) -> Result<RedisResult<Value>, Error> {
        let cmd = cmd?;
        Ok(con.req_packed_command(&cmd).await)
    }

    /// The module's commands on an async connection
    /// (`MultiplexedConnection`, `ConnectionManager`,
    /// `cluster_async::ClusterConnection`), as [`IdemCommands`].
    pub trait AsyncIdemCommands: redis::aio::ConnectionLike + Send + Sized {
        fn idem_claim<K: ToRedisArgs>(
            &mut self,
            key: K,
            lease: Duration,
            options: &ClaimOptions,
        ) -> impl Future<Output = Result<Claim, Error>> + Send {
            let cmd = cmd::claim(Edition::Module, key, lease, options);
            async move { decode(send(self, cmd).await?) }
        }
        fn idem_done<K: ToRedisArgs>(
            &mut self,
            key: K,
            token: &str,
            options: &DoneOptions,
        ) -> impl Future<Output = Result<Done, Error>> + Send {
            let cmd = cmd::done(Edition::Module, key, token, options);
            async move { decode(send(self, cmd).await?) }
        }
        fn idem_release<K: ToRedisArgs>(
            &mut self,
            key: K,
            token: &str,
        ) -> impl Future<Output = Result<bool, Error>> + Send {
            let cmd = cmd::release(Edition::Module, key, token);
            async move { flag(send(self, Ok(cmd)).await?) }
        }
        fn idem_extend<K: ToRedisArgs>(
            &mut self,
            key: K,
            token: &str,
            lease: Duration,
        ) -> impl Future<Output = Result<(), Error>> + Send {
            let cmd = cmd::extend(Edition::Module, key, token, lease);
            async move { extended(send(self, cmd).await?) }
        }
        fn idem_get<K: ToRedisArgs>(&mut self, key: K) -> impl Future<Output = Result<Option<Record>, Error>> + Send {
            let cmd = cmd::get(Edition::Module, key);
            async move { decode(send(self, Ok(cmd)).await?) }
        }
        fn idem_once<K: ToRedisArgs>(
            &mut self,
            key: K,
            retain: Duration,
        ) -> impl Future<Output = Result<bool, Error>> + Send {
            let cmd = cmd::once(Edition::Module, key, retain);
            async move { flag(send(self, cmd).await?) }
        }
        fn idem_requeue<K: ToRedisArgs>(&mut self, key: K) -> impl Future<Output = Result<bool, Error>> + Send {
            let cmd = cmd::requeue(Edition::Module, key);
            async move { flag(send(self, Ok(cmd)).await?) }
        }
        fn idem_scan(
            &mut self,
            cursor: u64,
            options: &ScanOptions,
        ) -> impl Future<Output = Result<(u64, Vec<String>), Error>> + Send {
            let cmd = scan_cmd(Edition::Module, cursor, options, "");
            async move { decode(send(self, cmd).await?) }
        }
        fn idem_mclaim<K: ToRedisArgs>(
            &mut self,
            keys: &[K],
            lease: Duration,
            payloads: Option<&[Vec<u8>]>,
            max_tries: Option<u32>,
            owner: Option<&str>,
        ) -> impl Future<Output = Result<Vec<Result<Claim, Error>>, Error>> + Send {
            let shared = cmd::Shared { max_tries, owner, bloom: None };
            let (cmd, count) = (cmd::mclaim(Edition::Module, keys, lease, payloads, shared), keys.len());
            async move { decode_each(send(self, cmd).await?, count) }
        }
        fn idem_mdone<K: ToRedisArgs>(
            &mut self,
            keys_tokens: &[(K, String)],
            results: Option<&[Vec<u8>]>,
            retain: Option<Duration>,
        ) -> impl Future<Output = Result<Vec<Result<Done, Error>>, Error>> + Send {
            let (cmd, count) = (cmd::mdone(Edition::Module, keys_tokens, results, retain, None), keys_tokens.len());
            async move { decode_each(send(self, cmd).await?, count) }
        }
        fn idem_mrelease<K: ToRedisArgs>(
            &mut self,
            keys_tokens: &[(K, String)],
        ) -> impl Future<Output = Result<Vec<Result<bool, Error>>, Error>> + Send {
            let (cmd, count) = (cmd::mrelease(Edition::Module, keys_tokens), keys_tokens.len());
            async move {
                let each: Vec<Result<i64, Error>> = decode_each(send(self, cmd).await?, count)?;
                Ok(each.into_iter().map(|r| r.map(|n| n == 1)).collect())
            }
        }
    }

    impl<T: redis::aio::ConnectionLike + Send> AsyncIdemCommands for T {}
}
