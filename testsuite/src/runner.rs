//! Runs conformance cases on the backends `DLOCK_TEST_BACKENDS` selects.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::{backends, TestBackend};

/// The environment variable that selects backends (comma-separated labels).
pub const BACKENDS_VAR: &str = "DLOCK_TEST_BACKENDS";

/// How long one case may run on one backend before it counts as hung.
pub const CASE_TIMEOUT: Duration = Duration::from_secs(120);

/// A conformance case: takes a fresh test backend, panics on failure.
pub type Case = fn(Arc<dyn TestBackend>) -> Pin<Box<dyn Future<Output = ()> + Send>>;

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

/// Runs `case` on every selected backend in turn. A backend that cannot be opened,
/// a failing case and a case that exceeds [`CASE_TIMEOUT`] all fail with the
/// backend's label in the message.
pub async fn run(name: &str, case: Case) {
    for label in selected() {
        let backend = match backends::open(&label).await {
            Ok(b) => b,
            Err(err) => panic!(
                "backend {label:?} was requested by {BACKENDS_VAR} but could not be opened: {err}"
            ),
        };
        let task = tokio::spawn(tokio::time::timeout(CASE_TIMEOUT, case(backend)));
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => {
                panic!("case {name} on backend {label}: timed out after {CASE_TIMEOUT:?}")
            }
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
                panic!("case {name} on backend {label}: {msg}");
            }
        }
    }
}
