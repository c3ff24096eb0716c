//! Date-sharded Bloom filters: `IDEM.BF.*` and the internal
//! `IDEM.BF.APPLY` and `IDEM.BF.LOAD`.
//!
//! A command's whole path is three files: the filter and its arguments in
//! `idem_core::bloom` (no Redis), its handler and command-table row in
//! [`commands`], and the stored value in [`data_type`]. The [`sweeper`]
//! drops the shards of idle filters in the background.

pub mod commands;
pub mod data_type;
pub mod sweeper;
