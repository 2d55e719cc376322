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
pub mod conformance;
pub mod curator;
pub mod faults;
pub mod handover;
pub mod lockcheck;
pub mod proxy;
pub mod runner;
pub mod zk_cut;

use std::sync::Arc;

use async_trait::async_trait;
use dlock_spi::{LockName, LockRemoteResource, Result};

/// What a backend provides to the conformance suite.
#[async_trait]
pub trait TestBackend: Send + Sync + 'static {
    /// The label used in `DLOCK_TEST_BACKENDS` and in failure messages.
    fn label(&self) -> &'static str;

    /// A new client of the same store, as another process would have (a new
    /// connection or pool where the backend has them).
    async fn client(&self) -> Result<Arc<dyn LockRemoteResource>>;

    /// Removes every hold of `name` behind the holders' backs (an operator's force
    /// unlock, a lost row or key).
    async fn steal(&self, name: &LockName) -> Result<()>;

    /// How many locks whose names start with `prefix` have holder or waiter state
    /// (fencing counters excluded). Zero when nothing leaks.
    async fn live_state(&self, prefix: &str) -> Result<usize>;

    /// Backend-side acquire evaluations since this test backend was opened, when the
    /// backend can count them (shows whether a release woke one waiter or all).
    fn acquire_attempts(&self) -> Option<u64>;

    /// A new client (as [`Self::client`]) whose waiters look at a lock again only
    /// when the backend tells them of a release — a notice, a bell, a watch — their
    /// own periodic looks (polls, liveness re-checks) put seconds apart; `None` when
    /// this backend's waiters learn of releases only by polling. The herd checks
    /// count the acquire attempts one release causes among such clients' waiters.
    /// The default is [`Self::client`]: a backend whose waiters do not poll.
    async fn told_client(&self) -> Option<Result<Arc<dyn LockRemoteResource>>> {
        Some(self.client().await)
    }
}
