//! Runs the conformance cases on a backend: one test trial per case
//! ([`trials`]), each on a fresh backend in a runtime of its own, bounded.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use libtest_mimic::{Failed, Trial};

use crate::conformance::{Case, CASES};
use crate::TestBackend;

/// The environment variable a workspace's test scripts set to the backend labels
/// a run selects (comma-separated).
pub const SELECTED_VAR: &str = "DLOCK_TEST_BACKENDS";

/// Whether a run selects backend `label`: [`SELECTED_VAR`] unset (a run that
/// selects nothing runs every backend, and needs its server), or naming it. A
/// backend's `harness = false` tests run none of their trials when it is left out.
pub fn selected(label: &str) -> bool {
    std::env::var(SELECTED_VAR).map_or(true, |v| v.split(',').any(|l| l.trim() == label))
}

/// How long one case may run on one backend before it counts as hung.
pub const CASE_TIMEOUT: Duration = Duration::from_secs(120);

/// One test trial per conformance case, named `LABEL::CASE`, each running the case
/// on a backend `open` makes afresh ([`run_case`]). A backend that cannot be opened
/// fails every trial, saying why: a run that asked for a backend never passes
/// without it.
pub fn trials<F, Fut>(label: &str, open: F) -> Vec<Trial>
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = dlock_spi::Result<Arc<dyn TestBackend>>>,
{
    let open = Arc::new(open);
    CASES
        .iter()
        .map(|case| {
            let (label, open) = (label.to_owned(), Arc::clone(&open));
            Trial::test(format!("{label}::{}", case.name), move || {
                run_case(&label, case, || open()).map_err(Failed::from)
            })
        })
        .collect()
}

/// Runs `case` once on a backend `open` makes, in a runtime of its own (two worker
/// threads), and says how it failed: a backend that cannot be opened, a panicking
/// case and a case that exceeds [`CASE_TIMEOUT`] are each an `Err` naming the case
/// and the backend (`label`).
pub fn run_case<F, Fut>(label: &str, case: &Case, open: F) -> Result<(), String>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = dlock_spi::Result<Arc<dyn TestBackend>>>,
{
    let name = case.name;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("case {name} on backend {label}: no runtime: {e}"))?;
    let outcome = runtime.block_on(async {
        let backend = open().await.map_err(|err| {
            format!("backend {label:?} was asked for but could not be opened: {err}")
        })?;
        let task = tokio::spawn(tokio::time::timeout(CASE_TIMEOUT, (case.run)(backend)));
        match task.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(format!(
                "case {name} on backend {label}: timed out after {CASE_TIMEOUT:?}"
            )),
            Err(err) => {
                let msg = err
                    .try_into_panic()
                    .ok()
                    .and_then(|p| {
                        p.downcast_ref::<String>()
                            .cloned()
                            .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    })
                    .unwrap_or_else(|| "cancelled".to_owned());
                Err(format!("case {name} on backend {label}: {msg}"))
            }
        }
    });
    // A task the case left stuck (a blocking call) cannot hang the trial.
    runtime.shutdown_timeout(Duration::from_secs(5));
    outcome
}

/// A test trial that runs `test` on a new runtime with two worker threads — what
/// `#[tokio::test(flavor = "multi_thread", worker_threads = 2)]` gives a test — for
/// test binaries whose trials are made at run time (one per backend, say). A panic
/// fails the trial with its message.
pub fn tokio_trial<F, Fut>(name: impl Into<String>, test: F) -> Trial
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    Trial::test(name, move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| Failed::from(format!("no runtime: {e}")))?;
        runtime.block_on(test());
        Ok(())
    })
}

/// A test trial that runs the plain function `test` (a `#[test]`). A panic fails
/// the trial with its message.
pub fn plain_trial(name: impl Into<String>, test: impl FnOnce() + Send + 'static) -> Trial {
    Trial::test(name, move || {
        test();
        Ok(())
    })
}
