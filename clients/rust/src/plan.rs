//! The batch helpers' commands without I/O: one per slot and per 10000
//! keys on the module, one per key on the Functions edition ([`Plan`]),
//! and the items of `done_many` / `release_many`.
use crate::cmd::{self, Edition, MAX_BATCH};
use crate::commands::{decode, decode_each};
use crate::error::{DurableStage, Error};
use crate::flow::Core;
use crate::reply::{Claim, Done};
use redis::{Cmd, FromRedisValue, RedisResult, Value};
use std::collections::HashMap;
use std::time::Duration;

/// A batch helper's commands: groups of keys, each group one pipeline
/// (one batch command on the module, one single command per key on the
/// Functions edition) to one node, followed by `WAIT` with `durable`.
pub(crate) struct Plan {
    count: usize,
    pub sends: Vec<Group>,
    single: bool,
}

pub(crate) struct Group {
    indices: Vec<usize>,
    pub cmds: Vec<Cmd>,
    /// A key of the group: where it goes.
    pub route: String,
}

/// A key's answer in a batch, with its group's `WAIT` reply (`durable`).
pub(crate) type Answer<R> = (Result<R, Error>, Option<RedisResult<Value>>);

/// A group's replies: one per command, and the `WAIT`'s when sent.
pub(crate) type Replies = (Vec<RedisResult<Value>>, Option<RedisResult<Value>>);

impl Plan {
    /// Each key's reply as the single command's would be (a batch
    /// command's element), in order; a command's failure fails its keys.
    #[cfg(feature = "tokio")]
    pub fn split(self, replies: Vec<Replies>) -> Vec<RedisResult<Value>> {
        let mut each: Vec<RedisResult<Value>> = (0..self.count).map(|_| Ok(Value::Nil)).collect();
        for (group, (replies, _)) in self.sends.into_iter().zip(replies) {
            let replies: Vec<RedisResult<Value>> = match (self.single, replies.first()) {
                (true, _) => replies,
                (false, Some(Ok(Value::Array(items)))) if items.len() == group.indices.len() => {
                    items.iter().cloned().map(Ok).collect()
                }
                (false, reply) => {
                    let reply = reply.cloned().unwrap_or(Ok(Value::Nil));
                    group.indices.iter().map(|_| reply.clone()).collect()
                }
            };
            for (i, reply) in group.indices.into_iter().zip(replies) {
                each[i] = reply;
            }
        }
        each
    }

    /// Each key's answer, in order, with its group's `WAIT` reply; a
    /// command's failure fails its keys.
    pub fn gather<R: FromRedisValue>(self, replies: Vec<Replies>) -> Vec<Answer<R>> {
        let mut answers: Vec<Option<Answer<R>>> = (0..self.count).map(|_| None).collect();
        for (group, (replies, ack)) in self.sends.into_iter().zip(replies) {
            let each: Vec<Result<R, Error>> = if self.single {
                replies.into_iter().map(decode).collect()
            } else {
                let reply = replies.into_iter().next().unwrap_or_else(|| Ok(Value::Nil));
                match decode_each(reply.clone(), group.indices.len()) {
                    Ok(each) => each,
                    Err(_) => group.indices.iter().map(|_| decode::<R>(reply.clone())).collect(),
                }
            };
            for (i, answer) in group.indices.into_iter().zip(each) {
                answers[i] = Some((answer, ack.clone()));
            }
        }
        answers.into_iter().map(|a| a.expect("every key answered")).collect()
    }
}

/// A completion of a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DoneItem {
    pub key: String,
    pub token: String,
    /// `RESULT`, kept and replayed.
    pub result: Option<Vec<u8>>,
}

impl DoneItem {
    pub fn new(key: impl Into<String>, token: impl Into<String>) -> DoneItem {
        DoneItem { key: key.into(), token: token.into(), result: None }
    }
    pub fn result(mut self, result: impl Into<Vec<u8>>) -> DoneItem {
        self.result = Some(result.into());
        self
    }
}

/// A release of a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReleaseItem {
    pub key: String,
    pub token: String,
}

impl ReleaseItem {
    pub fn new(key: impl Into<String>, token: impl Into<String>) -> ReleaseItem {
        ReleaseItem { key: key.into(), token: token.into() }
    }
}

impl<C> Core<C> {
    /// The groups of `keys` (prefixed), by `class` (a batch command of one
    /// shape) and, in a cluster, by slot; each at most 10000 keys, the
    /// keys' indices in order.
    fn groups(&self, keys: &[&str], class: impl Fn(usize) -> bool) -> Vec<Vec<usize>> {
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut by_slot: HashMap<(bool, Slot), usize> = HashMap::new();
        for (i, key) in keys.iter().enumerate() {
            let slot = if self.cluster { slot(key.as_bytes()) } else { Slot::default() };
            let group = *by_slot.entry((class(i), slot)).or_insert_with(|| {
                groups.push(Vec::new());
                groups.len() - 1
            });
            groups[group].push(i);
        }
        groups.into_iter().flat_map(|g| g.chunks(MAX_BATCH).map(<[usize]>::to_vec).collect::<Vec<_>>()).collect()
    }

    /// One pipeline per group: the group's single commands on the
    /// Functions edition, its batch command on the module.
    fn plan(
        &self,
        keys: &[&str],
        class: impl Fn(usize) -> bool,
        single: impl Fn(usize) -> Result<Cmd, Error>,
        batch: impl Fn(&[usize]) -> Result<Cmd, Error>,
    ) -> Result<Plan, Error> {
        let single_mode = self.edition == Edition::Functions;
        let sends = self
            .groups(keys, |i| single_mode || class(i))
            .into_iter()
            .map(|indices| {
                let cmds = match single_mode {
                    true => indices.iter().map(|&i| single(i)).collect::<Result<_, Error>>()?,
                    false => vec![batch(&indices)?],
                };
                Ok(Group { route: keys[indices[0]].to_string(), indices, cmds })
            })
            .collect::<Result<_, Error>>()?;
        Ok(Plan { count: keys.len(), sends, single: single_mode })
    }

    /// `keys` prefixed already.
    pub fn plan_claims(&self, keys: &[String], lease: Duration, payloads: Option<&[Vec<u8>]>) -> Result<Plan, Error> {
        if payloads.is_some_and(|p| p.len() != keys.len()) {
            return Err(Error::InvalidArgument("claim_many takes one payload per key".into()));
        }
        let owner = self.owner();
        let shared = cmd::Shared {
            max_tries: self.options.max_tries,
            bloom: self.options.bloom.as_deref(),
            owner: Some(&owner),
        };
        let routes: Vec<&str> = keys.iter().map(String::as_str).collect();
        self.plan(
            &routes,
            |_| true,
            |i| cmd::claim(self.edition, &keys[i], lease, &self.claim_options(payloads.map(|p| p[i].clone()), None)),
            |g| {
                let group_keys: Vec<&str> = g.iter().map(|&i| keys[i].as_str()).collect();
                let group_payloads: Option<Vec<Vec<u8>>> = payloads.map(|p| g.iter().map(|&i| p[i].clone()).collect());
                cmd::mclaim(self.edition, &group_keys, lease, group_payloads.as_deref(), shared)
            },
        )
    }

    /// Items with their keys prefixed already; those with and without a
    /// result go in separate MDONEs.
    pub fn plan_dones(&self, items: &[DoneItem]) -> Result<Plan, Error> {
        let (retain, bloom) = (self.options.retain, self.options.bloom.as_deref());
        let routes: Vec<&str> = items.iter().map(|item| item.key.as_str()).collect();
        self.plan(
            &routes,
            |i| items[i].result.is_some(),
            |i| self.done_cmd(&items[i].key, &items[i].token, items[i].result.clone()),
            |g| {
                let pairs: Vec<(&str, String)> =
                    g.iter().map(|&i| (items[i].key.as_str(), items[i].token.clone())).collect();
                let results: Option<Vec<Vec<u8>>> = items[g[0]]
                    .result
                    .is_some()
                    .then(|| g.iter().map(|&i| items[i].result.clone().unwrap_or_default()).collect());
                cmd::mdone(self.edition, &pairs, results.as_deref(), retain, bloom)
            },
        )
    }

    pub fn plan_releases(&self, items: &[ReleaseItem]) -> Result<Plan, Error> {
        let routes: Vec<&str> = items.iter().map(|item| item.key.as_str()).collect();
        self.plan(
            &routes,
            |_| true,
            |i| Ok(cmd::release(self.edition, &items[i].key, &items[i].token)),
            |g| {
                let pairs: Vec<(&str, String)> =
                    g.iter().map(|&i| (items[i].key.as_str(), items[i].token.clone())).collect();
                cmd::mrelease(self.edition, &pairs)
            },
        )
    }
}

#[cfg(feature = "cluster")]
pub(crate) type Slot = Option<redis::cluster_routing::Slot>;
#[cfg(feature = "cluster")]
pub(crate) fn slot(key: &[u8]) -> Slot {
    Some(redis::cluster_routing::Slot::for_key(key))
}

/// Without the `cluster` feature there are no slots (an `Option`, not
/// `()`, so that every feature set builds the same code lint-free).
#[cfg(not(feature = "cluster"))]
pub(crate) type Slot = Option<()>;
#[cfg(not(feature = "cluster"))]
pub(crate) fn slot(_key: &[u8]) -> Slot {
    None
}

impl<C> Core<C> {
    /// With `durable`, a granted key whose group's `WAIT` fell short is
    /// `NotDurable` (stage claim), its RELEASE returned to send; a key
    /// answered done is `NotDurable` (stage done), as in the loop.
    pub fn durable_claims(
        &self,
        keys: &[&str],
        records: &[String],
        answers: Vec<Answer<Claim>>,
    ) -> (Vec<Result<Claim, Error>>, Vec<ReleaseItem>) {
        let mut releases = Vec::new();
        let claims = answers
            .into_iter()
            .enumerate()
            .map(|(i, (claim, ack))| match claim {
                Ok(claim) => match self.claim_not_durable(keys[i], &claim, ack) {
                    Some(error) => {
                        if let Some(token) = claim.token() {
                            releases.push(ReleaseItem::new(records[i].clone(), token));
                        }
                        Err(error)
                    }
                    None => Ok(claim),
                },
                other => other,
            })
            .collect();
        (claims, releases)
    }

    /// With `durable`, a completed key whose group's `WAIT` fell short is
    /// `NotDurable` (stage done: it is done on the primary).
    pub fn durable_dones(&self, items: &[DoneItem], answers: Vec<Answer<Done>>) -> Vec<Result<Done, Error>> {
        let check = |(i, (done, ack)): (usize, Answer<Done>)| match done {
            Ok(Done::Completed { .. }) => match self.not_durable(&items[i].key, DurableStage::Done, ack) {
                Some(error) => Err(error),
                None => done,
            },
            other => other,
        };
        answers.into_iter().enumerate().map(check).collect()
    }
}
