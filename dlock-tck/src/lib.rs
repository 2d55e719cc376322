//! # dlock-tck — the compatibility kit for dlock backends
//!
//! The conformance cases every [`LockRemoteResource`] must pass to stand behind
//! dlock's lock, read-write lock, election and semaphore semantics (DESIGN.md §4):
//! mutual exclusion, bounded waits, leases and their renewal, fencing tokens,
//! re-entrancy, fairness, wake-ups, cancellation at any await, multi-locks, the
//! watchdog, and that nothing is left behind. Each case is one semantic, in a file
//! of its own under [`conformance`]; a case on an ability the backend does not
//! declare in its [`Capabilities`](dlock_spi::Capabilities) checks that the backend
//! refuses it with `ErrorKind::Unsupported`.
//!
//! A backend — this repository's or anyone's — runs them from a test of its own,
//! with `harness = false`, one test trial per case:
//!
//! ```no_run
//! // tests/tck.rs of a backend crate ([[test]] name = "tck", harness = false)
//! use std::sync::Arc;
//! use dlock_spi::{InMemoryBackend, LockAdmin, LockName, LockRemoteResource, Result};
//! use dlock_tck::TestBackend;
//!
//! /// The store under test (here dlock's in-memory reference backend: each client
//! /// is a clone sharing its state, as another process would share a server's).
//! struct MyStore(InMemoryBackend);
//!
//! #[dlock_spi::async_trait]
//! impl TestBackend for MyStore {
//!     fn label(&self) -> &'static str {
//!         "mine"
//!     }
//!     async fn client(&self) -> Result<Arc<dyn LockRemoteResource>> {
//!         Ok(Arc::new(self.0.clone()))
//!     }
//!     async fn steal(&self, name: &LockName) -> Result<()> {
//!         LockAdmin::force_release(&self.0, name).await.map(drop)
//!     }
//!     async fn live_state(&self, prefix: &str) -> Result<usize> {
//!         LockAdmin::live_locks(&self.0, prefix).await
//!     }
//!     fn acquire_attempts(&self) -> Option<u64> {
//!         None
//!     }
//! }
//!
//! fn main() -> std::process::ExitCode {
//!     dlock_tck::run("mine", || async {
//!         Ok(Arc::new(MyStore(InMemoryBackend::new())) as Arc<dyn TestBackend>)
//!     })
//! }
//! ```
//!
//! `cargo test --test tck` then runs every case; `-- mine::mutual_exclusion` one
//! of them; [`runner::trials`] gives the trials to add to a test binary's own.
//!
//! [`TestBackend`] is what the cases need of a backend beyond the SPI: new clients
//! as other processes would have them, an operator's removal of a lock behind its
//! holder's back, and a count of what is left under a prefix. A backend that
//! implements [`LockAdmin`](dlock_spi::LockAdmin) gets it from its connect function
//! alone: [`AdminTestBackend`].
//!
//! Beside the cases, the kit holds the lock-history checker ([`lockcheck`]: the
//! workload, the fenced register, the histories, the checker's rules, and the runs
//! that start worker processes under the nemeses — stopped, killed, and
//! network-faulted through the loopback fault [`proxy`]), with one entry a
//! backend's own test calls: a [`lockcheck::Deployment`] (its URL and how to open
//! it) and one [`lockcheck::trial`] per nemesis. Server-side faults (a restart, a
//! failover) come from a [`lockcheck::ServerFaults`] hook the test gives.
#![deny(missing_docs)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod admin;
pub mod conformance;
pub mod lockcheck;
pub mod proxy;
pub mod runner;

pub use admin::AdminTestBackend;
pub use libtest_mimic;

use std::sync::Arc;

use async_trait::async_trait;
use dlock_spi::{LockName, LockRemoteResource, Result};

/// Runs every conformance case on backends `open` makes, one test trial each
/// (named `LABEL::CASE`), with the test harness's command line (filters,
/// `--list`, `--test-threads`): the `main` of a backend's `harness = false` test.
pub fn run<F, Fut>(label: &str, open: F) -> std::process::ExitCode
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Arc<dyn TestBackend>>>,
{
    let args = libtest_mimic::Arguments::from_args();
    libtest_mimic::run(&args, runner::trials(label, open)).exit_code()
}

/// What a backend provides to the conformance cases.
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

/// The README's examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
