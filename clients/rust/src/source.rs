//! Where an [`Idem`](crate::Idem) gets its connections: a `redis::Client`
//! (one server) or a `redis::cluster::ClusterClient`. The consumer loop
//! needs more than the caller's connection: the heartbeat sends EXTEND on
//! its own while the work runs, and a WAIT holds its connection.
use redis::{Cmd, ConnectionLike, RedisResult, Value};
use std::time::Duration;

/// A sync connection factory.
pub trait ConnectionSource: Send + Sync + 'static {
    type Connection: ConnectionLike + Send;
    /// A new connection whose replies may take up to `response_timeout`
    /// (the longest WAIT plus a margin).
    fn connect(&self, response_timeout: Duration) -> RedisResult<Self::Connection>;
    /// Sends `cmd` to the node that owns `key` (in a cluster, the batch
    /// commands' keys are not where redis-rs looks for them).
    fn route(&self, con: &mut Self::Connection, cmd: &Cmd, _key: &[u8]) -> RedisResult<Value> {
        con.req_command(cmd)
    }
    /// True for a cluster: batches are split by slot.
    fn is_cluster(&self) -> bool {
        false
    }
    /// One slot of each primary, for what every primary must be asked (a
    /// scan sees one node's keys); one server: `[0]`, itself.
    fn primaries(&self, _con: &mut Self::Connection) -> Result<Vec<u16>, crate::Error> {
        Ok(vec![0])
    }
    /// Sends `cmd` to the primary serving `slot` (one server: itself).
    fn route_to_slot(&self, con: &mut Self::Connection, cmd: &Cmd, _slot: u16) -> RedisResult<Value> {
        con.req_command(cmd)
    }
    /// Sends `cmds` to the node that owns `key`, on one connection, in one
    /// round trip where the connection can pipeline: one reply per command.
    fn route_pipeline(&self, con: &mut Self::Connection, cmds: &[Cmd], _key: &[u8]) -> Vec<RedisResult<Value>> {
        pipelined(con, cmds)
    }
}

/// `cmds` in one write, their replies in order (a connection's failure
/// fails each).
fn pipelined(con: &mut impl ConnectionLike, cmds: &[Cmd]) -> Vec<RedisResult<Value>> {
    let mut pipe = redis::Pipeline::with_capacity(cmds.len());
    for cmd in cmds {
        pipe.add_command(cmd.clone());
    }
    match con.req_packed_commands(&pipe.get_packed_pipeline(), 0, cmds.len()) {
        Ok(values) => values.into_iter().map(Ok).collect(),
        Err(e) => cmds.iter().map(|_| Err(e.clone())).collect(),
    }
}

/// `CLUSTER SLOTS`, whose reply says where the primaries are.
#[cfg(feature = "cluster")]
fn cluster_slots() -> Cmd {
    redis::cmd("CLUSTER").arg("SLOTS").to_owned()
}

#[cfg(feature = "cluster")]
fn to_slot(slot: u16) -> redis::cluster_routing::RoutingInfo {
    use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master)))
}

impl ConnectionSource for redis::Client {
    type Connection = redis::Connection;
    fn connect(&self, response_timeout: Duration) -> RedisResult<redis::Connection> {
        let con = self.get_connection()?;
        con.set_read_timeout(Some(response_timeout))?;
        con.set_write_timeout(Some(response_timeout))?;
        Ok(con)
    }
}

#[cfg(feature = "cluster")]
fn route_to(key: &[u8]) -> redis::cluster_routing::RoutingInfo {
    use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::with_key(key, SlotAddr::Master)))
}

#[cfg(feature = "cluster")]
impl ConnectionSource for redis::cluster::ClusterClient {
    type Connection = redis::cluster::ClusterConnection;
    fn connect(&self, response_timeout: Duration) -> RedisResult<Self::Connection> {
        self.get_connection_with_config(redis::cluster::ClusterConfig::new().set_response_timeout(response_timeout))
    }
    fn route(&self, con: &mut Self::Connection, cmd: &Cmd, key: &[u8]) -> RedisResult<Value> {
        con.route_command(cmd, route_to(key))
    }
    fn is_cluster(&self) -> bool {
        true
    }
    fn primaries(&self, con: &mut Self::Connection) -> Result<Vec<u16>, crate::Error> {
        crate::scan::primary_slots(crate::commands::decode(con.req_command(&cluster_slots()))?)
    }
    fn route_to_slot(&self, con: &mut Self::Connection, cmd: &Cmd, slot: u16) -> RedisResult<Value> {
        con.route_command(cmd, to_slot(slot))
    }
    /// redis-rs's sync cluster connection cannot route a pipeline: the
    /// commands go one after the other on the key's node connection (the
    /// same connection, so a `WAIT` still follows its write).
    fn route_pipeline(&self, con: &mut Self::Connection, cmds: &[Cmd], key: &[u8]) -> Vec<RedisResult<Value>> {
        cmds.iter().map(|cmd| con.route_command(cmd, route_to(key))).collect()
    }
}

/// Sentinel (feature `sentinel`): each new connection asks the Sentinels
/// for the primary of the service, so after a failover the loop's next
/// connection reaches the new one. `Mutex<SentinelClient>` because
/// redis-rs's `SentinelClient` takes `&mut self` to connect.
#[cfg(feature = "sentinel")]
impl ConnectionSource for std::sync::Mutex<redis::sentinel::SentinelClient> {
    type Connection = redis::Connection;
    fn connect(&self, response_timeout: Duration) -> RedisResult<redis::Connection> {
        let client = self.lock().map_err(|_| poisoned())?.get_client()?;
        ConnectionSource::connect(&client, response_timeout)
    }
}

#[cfg(feature = "sentinel")]
fn poisoned() -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::Client, "the SentinelClient's lock is poisoned"))
}

#[cfg(feature = "tokio")]
pub use self::r#async::AsyncConnectionSource;

#[cfg(feature = "tokio")]
mod r#async {
    use super::*;
    use std::future::Future;

    /// An async connection factory: `redis::Client` (multiplexed
    /// connections) or `redis::cluster::ClusterClient` (with `cluster-async`).
    pub trait AsyncConnectionSource: Send + Sync + 'static {
        type Connection: redis::aio::ConnectionLike + Clone + Send + Sync + 'static;
        fn connect(&self, response_timeout: Duration) -> impl Future<Output = RedisResult<Self::Connection>> + Send;
        fn route(
            &self,
            con: &mut Self::Connection,
            cmd: Cmd,
            _key: Vec<u8>,
        ) -> impl Future<Output = RedisResult<Value>> + Send {
            async move { redis::aio::ConnectionLike::req_packed_command(con, &cmd).await }
        }
        fn is_cluster(&self) -> bool {
            false
        }
        /// As [`ConnectionSource::primaries`].
        fn primaries(
            &self,
            _con: &mut Self::Connection,
        ) -> impl Future<Output = Result<Vec<u16>, crate::Error>> + Send {
            async { Ok(vec![0]) }
        }
        /// As [`ConnectionSource::route_to_slot`].
        fn route_to_slot(
            &self,
            con: &mut Self::Connection,
            cmd: Cmd,
            _slot: u16,
        ) -> impl Future<Output = RedisResult<Value>> + Send {
            async move { redis::aio::ConnectionLike::req_packed_command(con, &cmd).await }
        }
        /// As [`ConnectionSource::route_pipeline`].
        fn route_pipeline(
            &self,
            con: &mut Self::Connection,
            cmds: Vec<Cmd>,
            _key: Vec<u8>,
        ) -> impl Future<Output = Vec<RedisResult<Value>>> + Send {
            async move {
                let pipe = pipeline(&cmds);
                let replies = redis::aio::ConnectionLike::req_packed_commands(con, &pipe, 0, cmds.len()).await;
                spread(replies, cmds.len())
            }
        }
    }

    fn pipeline(cmds: &[Cmd]) -> redis::Pipeline {
        let mut pipe = redis::Pipeline::with_capacity(cmds.len());
        for cmd in cmds {
            pipe.add_command(cmd.clone());
        }
        pipe
    }

    fn spread(replies: RedisResult<Vec<Value>>, count: usize) -> Vec<RedisResult<Value>> {
        match replies {
            Ok(values) => values.into_iter().map(Ok).collect(),
            Err(e) => (0..count).map(|_| Err(e.clone())).collect(),
        }
    }

    /// As the sync `Mutex<SentinelClient>`, with tokio's mutex (held while
    /// the Sentinels are asked).
    #[cfg(feature = "sentinel")]
    impl AsyncConnectionSource for tokio::sync::Mutex<redis::sentinel::SentinelClient> {
        type Connection = redis::aio::MultiplexedConnection;
        async fn connect(&self, response_timeout: Duration) -> RedisResult<Self::Connection> {
            let client = self.lock().await.async_get_client().await?;
            AsyncConnectionSource::connect(&client, response_timeout).await
        }
    }

    impl AsyncConnectionSource for redis::Client {
        type Connection = redis::aio::MultiplexedConnection;
        fn connect(&self, response_timeout: Duration) -> impl Future<Output = RedisResult<Self::Connection>> + Send {
            let config = redis::AsyncConnectionConfig::new().set_response_timeout(Some(response_timeout));
            async move { self.get_multiplexed_async_connection_with_config(&config).await }
        }
    }

    #[cfg(feature = "cluster-async")]
    impl AsyncConnectionSource for redis::cluster::ClusterClient {
        type Connection = redis::cluster_async::ClusterConnection;
        fn connect(&self, response_timeout: Duration) -> impl Future<Output = RedisResult<Self::Connection>> + Send {
            let config = redis::cluster::ClusterConfig::new().set_response_timeout(response_timeout);
            async move { self.get_async_connection_with_config(config).await }
        }
        async fn route(&self, con: &mut Self::Connection, cmd: Cmd, key: Vec<u8>) -> RedisResult<Value> {
            con.route_command(cmd, route_to(&key)).await
        }
        fn is_cluster(&self) -> bool {
            true
        }
        async fn primaries(&self, con: &mut Self::Connection) -> Result<Vec<u16>, crate::Error> {
            let reply = redis::aio::ConnectionLike::req_packed_command(con, &cluster_slots()).await;
            crate::scan::primary_slots(crate::commands::decode(reply)?)
        }
        async fn route_to_slot(&self, con: &mut Self::Connection, cmd: Cmd, slot: u16) -> RedisResult<Value> {
            con.route_command(cmd, to_slot(slot)).await
        }
        async fn route_pipeline(
            &self,
            con: &mut Self::Connection,
            cmds: Vec<Cmd>,
            key: Vec<u8>,
        ) -> Vec<RedisResult<Value>> {
            use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
            let route = SingleNodeRoutingInfo::SpecificNode(Route::with_key(&key, SlotAddr::Master));
            spread(con.route_pipeline(pipeline(&cmds), 0, cmds.len(), route).await, cmds.len())
        }
    }
}
