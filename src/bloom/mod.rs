//! Date-sharded Bloom filters: `IDEM.BF.*` and the internal
//! `IDEM.BF.APPLY` and `IDEM.BF.LOAD`.
//!
//! Every write is one call of `idem_core::bloom::ShardedBloom::write` (no
//! Redis) from one function of [`commands`] per command, which also holds
//! the command-table rows; the stored value is in [`data_type`]. The
//! [`sweeper`] drops the shards of idle filters in the background.

pub mod commands;
pub mod data_type;
pub mod sweeper;
