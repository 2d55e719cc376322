//! The one place sqlx errors become dlock errors.

use dlock_spi::{Error, ErrorKind};

/// Maps a driver error, naming the operation that failed.
pub(crate) fn map_sqlx(err: sqlx::Error, backend: &'static str, op: &'static str) -> Error {
    let (kind, retryable, hint) = match &err {
        sqlx::Error::Configuration(_) => (
            ErrorKind::Config,
            false,
            "check the database URL and its options",
        ),
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::Protocol(_) => (
            ErrorKind::Backend,
            true,
            "cannot talk to the database; check that it runs and is reachable — the pool reconnects by itself",
        ),
        sqlx::Error::PoolTimedOut => (
            ErrorKind::Timeout,
            true,
            "no database connection became free in time; the database may be down or the pool too small",
        ),
        sqlx::Error::PoolClosed => (
            ErrorKind::Closed,
            false,
            "the connection pool was closed; create a new backend",
        ),
        sqlx::Error::Database(db) => {
            // Deadlocks and serialization failures are worth a retry; the rest
            // (privileges, missing tables, syntax) are not.
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            let transient = matches!(
                code.as_str(),
                "40001" | "40P01" | "1213" | "1205" | "5" | "6" | "517" | "57P01" | "57P02" | "57P03"
            );
            if transient {
                (ErrorKind::Backend, true, "the database aborted the statement (deadlock, busy or restarting); retry")
            } else {
                (
                    ErrorKind::Backend,
                    false,
                    "the database refused the statement; check the user's privileges on the dlock tables and that migrations ran",
                )
            }
        }
        _ => (ErrorKind::Backend, true, "the database call failed"),
    };
    Error::new(kind, hint)
        .set_retryable(retryable)
        .with_context("backend", backend)
        .with_context("op", op)
        .with_source(err)
}
