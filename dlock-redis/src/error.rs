//! The one place redis errors become dlock errors.

use dlock_spi::{redact_url, Error, ErrorKind};
use redis::ServerErrorKind;

/// The redis crate refused `url` (as the user wrote it; shown without its password).
pub(crate) fn config_error(url: &str, e: redis::RedisError) -> Error {
    Error::new(
        ErrorKind::Config,
        format!("invalid Redis URL {}: {e}", redact_url(url)),
    )
}

pub(crate) fn map_redis(err: redis::RedisError, op: &'static str) -> Error {
    let (kind, hint, transient) = classify(&err);
    Error::new(kind, hint)
        .set_retryable(transient)
        .with_context("backend", "redis")
        .with_context("op", op)
        .with_source(err)
}

/// The dlock kind of a redis error, what to do about it, and whether retrying can help.
pub(crate) fn classify(err: &redis::RedisError) -> (ErrorKind, &'static str, bool) {
    let transient = err.is_io_error()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_timeout()
        || matches!(
            err.kind(),
            redis::ErrorKind::Server(
                ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::BusyLoading
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::Moved
                    | ServerErrorKind::Ask
                    | ServerErrorKind::ReadOnly
            )
        );
    let (kind, hint) = if matches!(err.kind(), redis::ErrorKind::InvalidClientConfig) {
        (
            ErrorKind::Config,
            "the Redis URL or client settings are invalid",
        )
    } else if matches!(err.kind(), redis::ErrorKind::AuthenticationFailed) {
        (
            ErrorKind::Config,
            "Redis refused the credentials; check the user and password in the URL",
        )
    } else if err.to_string().contains("DB index is out of range") {
        (
            ErrorKind::Config,
            "the Redis database the URL names (its /N path) is not on the server; it has 16 (0–15) unless its `databases` setting says otherwise",
        )
    } else if transient {
        (
            ErrorKind::Backend,
            "cannot reach Redis or it is failing over; the client reconnects by itself — retry",
        )
    } else {
        (ErrorKind::Backend, "Redis refused the command; check that the server is Redis 6.2+ and the user may run EVALSHA")
    };
    (kind, hint, transient)
}
