//! Where a conformance case runs (cases.json's `topology`): the servers,
//! how the library's instance is made on them, and the steps that act on
//! the topology itself (`replica`, `failover`, `get` on the replica).
use super::calls::{Blocking, Loop};
use crate::common::*;
use crate::proxy::Proxy;
use redis::ConnectionLike;
use redis_idem_client::*;
use std::sync::Mutex;

pub trait Servers {
    /// The library's instance, sync or async, through `proxy` when given.
    fn idem(&self, options: Options, asynchronous: bool, proxy: Option<&Proxy>) -> Box<dyn Loop>;
    /// A plain connection to the primary (of the key, in a cluster).
    fn raw(&self) -> Box<dyn ConnectionLike>;
    /// The primaries now.
    fn primaries(&self) -> Vec<&Server>;
    /// The replica (`replicated` and `sentinel` topologies).
    fn replica(&self) -> &Server {
        panic!("this topology has no replica")
    }
    /// Before a case: a replica a case detached is attached again.
    fn reset(&self) {}
    /// `failover` (the `sentinel` topology).
    fn failover(&self) {
        panic!("this topology has no Sentinel")
    }
}

/// The instance on `source` (or on the proxy in front of one server).
fn standalone(source: redis::Client, options: Options, asynchronous: bool, proxy: Option<&Proxy>) -> Box<dyn Loop> {
    let source = proxy.map_or(source, |proxy| redis::Client::open(proxy.url()).unwrap());
    match asynchronous {
        true => Box::new(Blocking::new(source, options)),
        false => Box::new(Idem::with_options(source, options).unwrap()),
    }
}

impl Servers for Server {
    fn idem(&self, options: Options, asynchronous: bool, proxy: Option<&Proxy>) -> Box<dyn Loop> {
        standalone(self.client(), options, asynchronous, proxy)
    }
    fn raw(&self) -> Box<dyn ConnectionLike> {
        Box::new(self.conn())
    }
    fn primaries(&self) -> Vec<&Server> {
        vec![self]
    }
}

impl Servers for Cluster {
    fn idem(&self, options: Options, asynchronous: bool, _proxy: Option<&Proxy>) -> Box<dyn Loop> {
        match asynchronous {
            true => Box::new(Blocking::new(self.client(), options)),
            false => Box::new(Idem::with_options(self.client(), options).unwrap()),
        }
    }
    fn raw(&self) -> Box<dyn ConnectionLike> {
        Box::new(self.client().get_connection().unwrap())
    }
    fn primaries(&self) -> Vec<&Server> {
        self.nodes.iter().collect()
    }
}

impl Servers for Replicated {
    fn idem(&self, options: Options, asynchronous: bool, proxy: Option<&Proxy>) -> Box<dyn Loop> {
        standalone(self.primary.client(), options, asynchronous, proxy)
    }
    fn raw(&self) -> Box<dyn ConnectionLike> {
        Box::new(self.primary.conn())
    }
    fn primaries(&self) -> Vec<&Server> {
        vec![&self.primary]
    }
    fn replica(&self) -> &Server {
        &self.replica
    }
    fn reset(&self) {
        if self.replica.role() == "master" {
            self.replica.replicate(&self.primary);
        }
    }
}

impl Servers for Sentineled {
    /// Made from redis-rs's `SentinelClient`, as a user would.
    fn idem(&self, options: Options, asynchronous: bool, _proxy: Option<&Proxy>) -> Box<dyn Loop> {
        match asynchronous {
            true => Box::new(Blocking::new(tokio::sync::Mutex::new(self.client()), options)),
            false => Box::new(Idem::with_options(Mutex::new(self.client()), options).unwrap()),
        }
    }
    fn raw(&self) -> Box<dyn ConnectionLike> {
        Box::new(self.primary().conn())
    }
    fn primaries(&self) -> Vec<&Server> {
        vec![self.primary()]
    }
    fn replica(&self) -> &Server {
        Sentineled::replica(self)
    }
    fn failover(&self) {
        Sentineled::failover(self)
    }
}

/// `get` with `on: replica`: IDEM.GET (or `idem_get`) on the replica at
/// once, without waiting for replication.
pub fn get_on_replica(servers: &dyn Servers, key: &str, functions: bool) -> Option<Record> {
    let cmd = match functions {
        true => redis::cmd("FCALL_RO").arg("idem_get").arg(1).arg(key).to_owned(),
        false => redis::cmd("IDEM.GET").arg(key).to_owned(),
    };
    cmd.query(&mut servers.replica().conn()).unwrap()
}

/// `replica` `detach` / `attach`.
pub fn replica_action(servers: &dyn Servers, action: &str) {
    let replica = servers.replica();
    match action {
        "detach" => {
            let _: () = redis::cmd("REPLICAOF").arg("NO").arg("ONE").query(&mut replica.conn()).unwrap();
            let primary = servers.primaries()[0];
            eventually(std::time::Duration::from_secs(10), "the replica detached", || {
                primary.info_count("replication", "connected_slaves") == 0
            });
        }
        "attach" => replica.replicate(servers.primaries()[0]),
        other => panic!("no replica action {other}"),
    }
}
