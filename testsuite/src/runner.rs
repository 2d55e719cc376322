//! Runs conformance cases on the backends `DLOCK_TEST_BACKENDS` selects.

use std::future::Future;
use std::time::Duration;

use libtest_mimic::{Failed, Trial};

use crate::backends;
use crate::conformance::Case;

/// The environment variable that selects backends (comma-separated labels).
pub const BACKENDS_VAR: &str = "DLOCK_TEST_BACKENDS";

/// How long one case may run on one backend before it counts as hung.
pub const CASE_TIMEOUT: Duration = Duration::from_secs(120);

/// The selected backend labels (default: `memory`).
pub fn selected() -> Vec<String> {
    let raw = std::env::var(BACKENDS_VAR).unwrap_or_else(|_| "memory".to_owned());
    let labels: Vec<String> = raw
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    assert!(
        !labels.is_empty(),
        "{BACKENDS_VAR} is set but names no backend; use e.g. {BACKENDS_VAR}=memory,sqlite"
    );
    labels
}

/// Runs `case` once on a fresh backend of `label`, in a runtime of its own (two
/// worker threads), and says how it failed: a backend that cannot be opened, a
/// panicking case and a case that exceeds [`CASE_TIMEOUT`] are each an `Err` naming
/// the case and the backend.
pub fn run_case(label: &str, case: &Case) -> Result<(), String> {
    let name = case.name;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("case {name} on backend {label}: no runtime: {e}"))?;
    let outcome = runtime.block_on(async {
        let backend = backends::open(label).await.map_err(|err| {
            format!(
                "backend {label:?} was requested by {BACKENDS_VAR} but could not be opened: {err}"
            )
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
/// test binaries whose trials are made at run time (one per selected backend, say).
/// A panic fails the trial with its message.
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

/// Trials for test functions named in a list, each a [`plain_trial`] (`sync name`)
/// or a [`tokio_trial`] (`tokio name`), named after the function:
/// `trials![sync a_plain_test, tokio an_async_test]`.
#[macro_export]
macro_rules! trials {
    ($($kind:ident $name:ident),* $(,)?) => {
        vec![$($crate::trials!(@one $kind $name)),*]
    };
    (@one sync $name:ident) => {
        $crate::runner::plain_trial(stringify!($name), $name)
    };
    (@one tokio $name:ident) => {
        $crate::runner::tokio_trial(stringify!($name), $name)
    };
}
