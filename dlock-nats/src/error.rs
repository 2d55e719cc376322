//! The one place NATS errors become dlock errors: connection trouble and timeouts
//! are retryable [`ErrorKind::Backend`] errors, anything else a backend error that
//! is not; the chain's tail adds backend, operation and lock.

use dlock_spi::{Error, ErrorKind};

/// A NATS client error from `op` (e.g. `"create key"`).
pub(crate) fn map_nats(err: impl std::fmt::Display, op: &str) -> Error {
    let text = err.to_string();
    let lower = text.to_ascii_lowercase();
    let retryable = [
        "timed out",
        "timeout",
        "connection",
        "disconnected",
        "no responders",
        "broken pipe",
        "io error",
    ]
    .iter()
    .any(|hint| lower.contains(hint));
    Error::new(ErrorKind::Backend, format!("NATS {op} failed: {text}")).set_retryable(retryable)
}
