//! What every Redis connection of this crate is opened and bounded with (the single,
//! Cluster, Sentinel and notice connections alike).

use std::time::Duration;

/// `fut`, failing with a timeout error after `limit`.
pub(crate) async fn bounded<T>(
    limit: Duration,
    fut: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> redis::RedisResult<T> {
    tokio::time::timeout(limit, fut).await.unwrap_or_else(|_| {
        Err(redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer within {limit:?}"),
        )))
    })
}

/// dlock's settings for a multiplexed connection: connecting bounded by `connect`,
/// no reply timeout (a script that ran but answered late must not be reported as
/// failed; the chain bounds every call).
pub(crate) fn connection_config(connect: Duration) -> redis::AsyncConnectionConfig {
    redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(connect))
        .set_response_timeout(None)
}
