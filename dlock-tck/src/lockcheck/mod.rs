//! The lock-history checker's backend-neutral parts (DESIGN.md §9): the workload
//! worker processes run on a backend ([`workload`]), the fenced register they write
//! through ([`register`]), the histories they record ([`history`]), and the checker
//! that judges the histories ([`check`]) — overlap, stale writes, token order, late
//! losses, leaks, starvation and fair order — and the runs that tie them together
//! ([`coordinator`]): worker processes under the [`nemesis`] (a fault proxy per
//! worker, SIGSTOP and SIGKILL; server-side faults through the
//! [`ServerFaults`] hook a backend's test may give).
//!
//! A backend's own test runs the checker in a few lines — a [`Deployment`] (where
//! the store is and how to open it) and one [`trial`] per nemesis, the test's
//! binary re-executed as the workers ([`as_worker`]):
//!
//! ```no_run
//! // tests/lockcheck.rs of a backend crate ([[test]] harness = false)
//! use std::sync::Arc;
//! use std::time::Duration;
//! use dlock_tck::lockcheck::{as_worker, trial, Deployment, Nemesis};
//! use dlock_tck::{AdminTestBackend, TestBackend};
//!
//! struct Mine;
//!
//! #[dlock_spi::async_trait]
//! impl Deployment for Mine {
//!     fn label(&self) -> String {
//!         "mine".to_owned()
//!     }
//!     fn url(&self) -> Option<String> {
//!         Some("mine://127.0.0.1:7000/locks".to_owned())
//!     }
//!     async fn open(&self, url: &str) -> Result<Arc<dyn TestBackend>, String> {
//!         let url = url.to_owned();
//!         let backend = AdminTestBackend::open("mine", move || {
//!             let url = url.clone();
//!             async move { my_backend::connect(&url).await }
//!         })
//!         .await
//!         .map_err(|e| e.to_string())?;
//!         Ok(Arc::new(backend))
//!     }
//! }
//! # mod my_backend {
//! #     // Stands for the backend's own connect function.
//! #     pub async fn connect(url: &str) -> dlock_spi::Result<dlock_spi::InMemoryBackend> {
//! #         let _ = url;
//! #         Ok(dlock_spi::InMemoryBackend::new())
//! #     }
//! # }
//!
//! fn main() -> std::process::ExitCode {
//!     if let Some(exit) = as_worker(|_| Ok(Arc::new(Mine))) {
//!         return exit;
//!     }
//!     let seconds = Duration::from_secs(6);
//!     let trials = [Nemesis::Stop, Nemesis::Kill, Nemesis::Proxy]
//!         .map(|n| trial(Arc::new(Mine), n, seconds));
//!     dlock_tck::libtest_mimic::run(&dlock_tck::libtest_mimic::Arguments::from_args(), trials.into())
//!         .exit_code()
//! }
//! ```

pub mod check;
pub mod coordinator;
mod deployment;
mod entry;
pub mod history;
mod inject;
pub mod nemesis;
pub mod procs;
pub mod register;
pub mod workload;

pub use coordinator::{run, RunOptions, RunOutcome};
pub use deployment::{
    default_not_applicable, in_process_not_applicable, Deployment, FaultRun, ServerFaults,
    SERVER_FAULT_BOUND,
};
pub use entry::{as_worker, run_blocking, trial, SEED_VAR};
pub use nemesis::{Choice, Nemesis};
