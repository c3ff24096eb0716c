//! Every filter write in one entry point, [`ShardedBloom::write`], in the
//! shape of the record side's transitions: it plans the write, checks it
//! against the server's limits (passed in as [`Limits`]), executes it, and
//! hands back the answers, what the key must become ([`KeyChange`]) and
//! what to replicate ([`Effect`]). `IDEM.BF.ADD`, `MADD`, `RESERVE`, a
//! `DONE ... BLOOM`'s add, the sweeper's drop of old shards and the
//! replicated `IDEM.BF.APPLY` all go through it; nothing changes unless
//! every check passed.

use super::{MAX_BYTES, Params, ShardedBloom, codec};
use crate::Millis;
use crate::error::CmdError;

/// The server's limits on a write, as its host knows them: the configured
/// ceiling on a filter's bit arrays (`idem.bf-max-bytes`), the largest
/// value a key may hold and still move (`proto-max-bulk-len`), and the
/// memory left under `maxmemory`. Asked only for a write that allocates.
pub trait Limits {
    /// Most bytes of bit arrays a filter may grow to (capped at
    /// [`MAX_BYTES`] whatever this says).
    fn max_bytes(&self) -> u64;
    /// Refuses a write that would leave the key's `DUMP` payload
    /// `dumped` bytes long.
    fn check_value_size(&self, dumped: u64) -> Result<(), CmdError>;
    /// Refuses a write that allocates `bytes` more.
    fn check_memory_for(&self, bytes: u64) -> Result<(), CmdError>;
}

/// Only the hard limits, which no filter may pass: for a write the primary
/// already made (a replica, an AOF replay do what it did) and for the
/// sweeper's, which allocates nothing.
pub struct HardLimits;

impl Limits for HardLimits {
    fn max_bytes(&self) -> u64 {
        MAX_BYTES
    }

    fn check_value_size(&self, _: u64) -> Result<(), CmdError> {
        Ok(())
    }

    fn check_memory_for(&self, _: u64) -> Result<(), CmdError> {
        Ok(())
    }
}

/// Limits held in memory, for tests and tools without a server.
#[derive(Clone, Copy, Debug)]
pub struct FixedLimits {
    pub max_bytes: u64,
    /// The largest `DUMP` payload allowed.
    pub max_value: u64,
    /// Bytes that may still be allocated.
    pub memory_left: u64,
}

impl Limits for FixedLimits {
    fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    fn check_value_size(&self, dumped: u64) -> Result<(), CmdError> {
        match dumped > self.max_value {
            true => Err(CmdError::new(format!("ERR the key would be {dumped} bytes, over {}", self.max_value))),
            false => Ok(()),
        }
    }

    fn check_memory_for(&self, bytes: u64) -> Result<(), CmdError> {
        match bytes > self.memory_left {
            true => Err(CmdError::new(format!("OOM {bytes} bytes needed, {} left", self.memory_left))),
            false => Ok(()),
        }
    }
}

/// A filter to create: its settings and hash seed.
#[derive(Clone, Copy, Debug)]
pub struct NewFilter {
    pub params: Params,
    pub seed: u64,
}

/// What a write does with a filter that is gone: a missing key, or a
/// filter with no shard left in its window (see
/// [`ShardedBloom::is_alive`]).
pub enum WhenGone<F: FnOnce() -> Result<NewFilter, CmdError>> {
    /// Replace it with the filter `F` gives: a write that adds items,
    /// `RESERVE`, and their replicated effect.
    Create(F),
    /// Write it as it is: a filter with no live shard is emptied, and its
    /// key deleted (the sweeper's drop); a missing key stays missing.
    Leave,
}

impl WhenGone<fn() -> Result<NewFilter, CmdError>> {
    /// [`WhenGone::Leave`], with its type spelled out.
    pub const LEAVE: Self = WhenGone::Leave;
}

/// What a write leaves for its key.
pub enum KeyChange {
    /// A new filter to store (boxed, as a key holds it).
    Store(Box<ShardedBloom>),
    /// The filter was left with no shard in its window: a filter key never
    /// outlives its window, whatever TTL a user gave it.
    Delete,
    /// The filter changed in place and now expires at `expire_at`.
    Updated { expire_at: Option<Millis> },
    /// Nothing changed (every item already in the current shard): nothing
    /// to store, replicate or notify, as `SADD` of a member already there.
    Unchanged,
}

/// What a write replicates: `IDEM.BF.APPLY key <header> item...`, the
/// header [`codec::decode_effect_header`] reads and the write's own items,
/// or nothing when nothing changed. The header is the primary's time
/// (8 bytes, little-endian ms) and, for a write that created the filter,
/// its parameters and seed, which a replica needs to create the same one.
/// The time travels inside the header because `RM_Replicate` turns a
/// number argument into a string object of its own.
#[derive(Clone, Debug)]
pub struct Effect(EffectHeader);

#[derive(Clone, Debug)]
enum EffectHeader {
    /// A write to an existing filter: the time alone, built without
    /// allocating.
    Time([u8; 8]),
    /// A write that created the filter.
    Created(Vec<u8>),
}

impl Effect {
    /// `IDEM.BF.APPLY`'s header argument.
    pub fn header(&self) -> &[u8] {
        match &self.0 {
            EffectHeader::Time(time) => time,
            EffectHeader::Created(header) => header,
        }
    }
}

/// Whether each item of a write was new to the window, in order. Held in
/// one word up to 64 items, so an `ADD` allocates nothing for it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Answers {
    len: usize,
    first: u64,
    more: Vec<u64>,
}

impl Answers {
    #[inline]
    fn push(&mut self, new: bool) {
        let (word, bit) = (self.len / 64, self.len % 64);
        if word == 0 {
            self.first |= (new as u64) << bit;
        } else {
            if bit == 0 {
                self.more.push(0);
            }
            self.more[word - 1] |= (new as u64) << bit;
        }
        self.len += 1;
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `true` for each item that was new to the window.
    #[inline]
    pub fn iter(&self) -> impl Iterator<Item = bool> + '_ {
        (0..self.len).map(|at| {
            let word = if at < 64 { self.first } else { self.more[at / 64 - 1] };
            word >> (at % 64) & 1 == 1
        })
    }
}

/// A write's outcome: the answers, the key's change, and the effect to
/// replicate (`None` exactly when the key is unchanged).
pub type Written = (Answers, KeyChange, Option<Effect>);

impl ShardedBloom {
    /// Adds `items` at `now` to `filter` (the key's, if it holds one), or
    /// to the filter `when_gone` makes when it is gone; with no items, only
    /// drops the shards that left the window (or creates the filter:
    /// `RESERVE`). Checks the write against the limits first, the hard ones
    /// and `limits`' (for a write that allocates: its bit arrays, and the
    /// key's `DUMP` size after it), and changes nothing when it is refused.
    pub fn write<'i, F, I>(
        filter: Option<&mut ShardedBloom>,
        when_gone: WhenGone<F>,
        items: I,
        now: Millis,
        limits: &impl Limits,
    ) -> Result<Written, CmdError>
    where
        F: FnOnce() -> Result<NewFilter, CmdError>,
        I: IntoIterator<Item = &'i [u8]>,
        I::IntoIter: ExactSizeIterator,
    {
        let items = items.into_iter();
        let mut created = None;
        let existing = match (filter, when_gone) {
            (Some(filter), WhenGone::Leave) => Some(filter),
            (Some(filter), WhenGone::Create(_)) if filter.is_alive(now) => Some(filter),
            (_, WhenGone::Create(new)) => {
                let NewFilter { params, seed } = new()?;
                created = Some(ShardedBloom::new(params, seed, now, limits.max_bytes())?);
                None
            }
            (None, WhenGone::Leave) => return Ok((Answers::default(), KeyChange::Unchanged, None)),
        };
        let created_now = existing.is_none();
        let filter = match existing {
            Some(filter) => filter,
            None => created.as_mut().expect("created when not existing"),
        };
        let mut plan = filter.plan(items.len() as u64, now, limits.max_bytes())?;
        let allocate = plan.allocate + if created_now { filter.bytes() } else { 0 };
        if allocate > 0 {
            // At most the key's DUMP after the write: the shards it drops
            // are still counted.
            let encoded = codec::encoded_len(filter) + codec::encoded_growth(&plan);
            limits.check_value_size(codec::dumped_len(encoded))?;
            limits.check_memory_for(allocate)?;
        }
        let dropped = filter.drop_expired(now);
        let mut answers = Answers::default();
        let mut inserted = false;
        for item in items {
            let added = filter.insert_planned(&mut plan, filter.hash(item), now);
            answers.push(added.is_new());
            inserted |= added.is_inserted();
        }
        let time = || Some(Effect(EffectHeader::Time(now.to_le_bytes())));
        let written = match created_now {
            true => None,
            false if filter.shards.is_empty() => Some((KeyChange::Delete, time())),
            false if dropped || inserted => Some((KeyChange::Updated { expire_at: filter.expire_at() }, time())),
            false => Some((KeyChange::Unchanged, None)),
        };
        let (change, effect) = written.unwrap_or_else(|| {
            let new = created.take().expect("created when not existing");
            let mut header = Vec::with_capacity(8 + codec::PARAMS_LEN);
            header.extend_from_slice(&now.to_le_bytes());
            codec::encode_params(&new.params, new.seed, &mut header);
            (KeyChange::Store(Box::new(new)), Some(Effect(EffectHeader::Created(header))))
        });
        Ok((answers, change, effect))
    }

    /// Whether `item` may have been seen within the window at `now`
    /// (`EXISTS`, and the read of `CLAIM ... BLOOM`).
    pub fn may_contain(&self, item: &[u8], now: Millis) -> bool {
        self.contains(self.hash(item), now)
    }
}
