//! The one place sqlx errors become dlock errors, and the one place a statement
//! that lost a transaction conflict is run again.

use std::future::Future;
use std::time::Duration;

use dlock_spi::{Error, ErrorKind};

/// Error codes of a statement the database aborted for a transaction conflict and
/// rolled back whole: a deadlock victim, a serialization failure (MySQL 1213 and
/// SQLSTATE 40001, PostgreSQL 40001 and 40P01), SQLite busy or locked.
const CONFLICT_CODES: [&str; 6] = ["40001", "40P01", "1213", "5", "6", "517"];
/// How often a statement that lost a transaction conflict is run again.
const CONFLICT_RETRIES: u32 = 5;

fn is_conflict_code(code: &str) -> bool {
    CONFLICT_CODES.contains(&code)
}

/// Whether `err` (made by [`map_sqlx`]) is a transaction conflict: the statement was
/// rolled back whole, so running it again is safe and changes nothing else.
pub(crate) fn is_conflict(err: &Error) -> bool {
    std::error::Error::source(err)
        .and_then(|s| s.downcast_ref::<sqlx::Error>())
        .is_some_and(|e| match e {
            sqlx::Error::Database(db) => db.code().is_some_and(|c| is_conflict_code(&c)),
            _ => false,
        })
}

/// A short random pause before running again a statement that lost a transaction
/// conflict for the `tries`-th time (the rivals' next attempts spread out).
pub(crate) fn conflict_pause(tries: u32) -> Duration {
    Duration::from_millis(fastrand::u64(1..=5) * u64::from(tries.max(1)))
}

/// Runs `op` until it does not fail with a transaction conflict, at most
/// [`CONFLICT_RETRIES`] times more. Every statement of this backend is idempotent
/// for its grant (a grant asked again by the same grant gets the same token; a
/// release or renewal of a grant no longer held answers "not the owner"), so a
/// statement the database rolled back may simply be run again: concurrent clients
/// deadlocking each other on a hot lock's rows is the database's business, not the
/// caller's.
pub(crate) async fn retry_conflicts<T, Fut>(mut op: impl FnMut() -> Fut) -> Result<T, Error>
where
    Fut: Future<Output = Result<T, Error>>,
{
    let mut tries = 0;
    loop {
        match op().await {
            Err(e) if tries < CONFLICT_RETRIES && is_conflict(&e) => {
                tries += 1;
                tokio::time::sleep(conflict_pause(tries)).await;
            }
            done => return done,
        }
    }
}

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
            let transient = is_conflict_code(&code)
                || matches!(code.as_str(), "1205" | "57P01" | "57P02" | "57P03");
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
