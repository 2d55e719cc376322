//! Runs conformance cases on the backends `DLOCK_TEST_BACKENDS` selects (the
//! trials themselves are [`dlock_tck::runner`]'s).

use crate::backends;
use crate::conformance::Case;

/// The environment variable that selects backends (comma-separated labels).
pub const BACKENDS_VAR: &str = "DLOCK_TEST_BACKENDS";

pub use dlock_tck::runner::{plain_trial, tokio_trial, CASE_TIMEOUT};

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

/// Runs `case` once on a fresh backend of `label` ([`dlock_tck::runner::run_case`]):
/// a requested backend that cannot be opened fails it.
pub fn run_case(label: &str, case: &Case) -> Result<(), String> {
    dlock_tck::runner::run_case(label, case, || backends::open(label))
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
