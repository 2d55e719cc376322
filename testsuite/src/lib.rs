//! dlock's conformance suite.
//!
//! * [`TestBackend`] — the hooks a backend gives the suite: new clients, stealing a
//!   lock behind its holder's back, counting live state, counting acquire attempts.
//! * [`conformance`] — the cases, each a `pub async fn(Arc<dyn TestBackend>)`.
//! * [`lockcheck`] — the lock-history checker (DESIGN.md §9): workers, nemeses, a
//!   fenced register and a checker over the histories; binary `lockcheck`.
//! * [`handover`] — the starvation bound: processes handing one non-fair lock over;
//!   binary `handover`.
//! * [`runner`] — selects backends from `DLOCK_TEST_BACKENDS` (comma-separated,
//!   default `memory`) and runs one case on one of them; a requested backend that
//!   cannot be opened fails the case. The `conformance` test makes each case ×
//!   backend a test trial of its own (`LABEL::CASE`).
//! * [`proxy`] — a TCP proxy injecting network faults; [`zk_cut`] — one that reads
//!   ZooKeeper's protocol and cuts a connection just before a chosen answer.
#![deny(missing_docs)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod backends;
pub mod bench;
pub mod curator;
pub mod faults;
pub mod handover;
pub mod lockcheck;
pub mod runner;
pub mod zk_cut;

pub use dlock_tck::{conformance, proxy, TestBackend};

/// The repository's README: its examples compiled as doctests, the embedded
/// SQLite one run.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct RootReadme;
