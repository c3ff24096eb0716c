//! Idempotency records: `IDEM.CLAIM`, `DONE`, `RELEASE`, `EXTEND`, `GET`,
//! `ONCE` and the internal `IDEM.APPLY`; the operators' `IDEM.SCAN` and
//! `IDEM.REQUEUE` ([`operator`]).
//!
//! A command's whole path is three files: its arguments and transition in
//! `idem_core::record` (the state machine, no Redis), its handler and
//! command-table row in [`commands`], and the stored value in
//! [`data_type`].

pub mod batch;
pub mod commands;
pub mod data_type;
pub mod operator;
