//! The one place sqlx errors become dlock errors, and the one place a statement
//! that lost a transaction conflict is run again.

use std::future::Future;
use std::time::Duration;

use dlock_spi::{Error, ErrorKind};

/// Codes of a statement the database aborted for a transaction conflict and rolled
/// back whole: a deadlock victim, a serialization failure (SQLSTATE 40001 — MySQL's
/// 1213 among them — and PostgreSQL's 40P01), SQLite busy or locked (5, 6, 517).
const CONFLICT_CODES: [&str; 5] = ["40001", "40P01", "5", "6", "517"];
/// How often a statement that lost a transaction conflict is run again.
const CONFLICT_RETRIES: u32 = 5;

/// Whether `err` (made by [`map_sqlx`]) is a transaction conflict: the statement was
/// rolled back whole, so running it again is safe and changes nothing else.
pub(crate) fn is_conflict(err: &Error) -> bool {
    std::error::Error::source(err)
        .and_then(|s| s.downcast_ref::<sqlx::Error>())
        .is_some_and(|e| match e {
            sqlx::Error::Database(db) => database_failure(db.as_ref()) == DatabaseFailure::Conflict,
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

/// What a database's error answer means for the caller.
#[derive(Debug, PartialEq, Eq)]
enum DatabaseFailure {
    /// A transaction conflict: the statement was rolled back whole (see
    /// [`is_conflict`]).
    Conflict,
    /// The database stopped waiting or was told to stop: a row lock held by another
    /// transaction past the session's limit, a statement time limit, a cancel
    /// (PostgreSQL's `pg_cancel_backend`). Nothing was changed.
    GaveUp,
    /// The statement was cut off with its connection or its server: killed, shut
    /// down, restarting, out of connections.
    Dropped,
    /// Anything else: privileges, missing tables, syntax — retrying will not help.
    Refused,
}

/// Classifies a database's error answer. PostgreSQL and SQLite are read by their
/// codes; MySQL/MariaDB by their error numbers as well, since most of theirs share
/// the SQLSTATE `HY000` (sqlx's `code()` is the SQLSTATE).
fn database_failure(db: &dyn sqlx::error::DatabaseError) -> DatabaseFailure {
    #[cfg(feature = "mysql")]
    if let Some(mysql) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return match mysql.number() {
            // ER_LOCK_DEADLOCK (SQLSTATE 40001).
            1213 => DatabaseFailure::Conflict,
            // ER_LOCK_WAIT_TIMEOUT, MySQL's max_execution_time, MariaDB's
            // max_statement_time.
            1205 | 3024 | 1969 => DatabaseFailure::GaveUp,
            // Too many connections (all, the user's), a user's resource limit
            // reached (connections, or per hour), server shutdown, query interrupted
            // (KILL QUERY), connection killed (MariaDB). (Not MySQL 8's idle-client
            // 4031: MariaDB numbers its own errors from 4000 up.)
            1040 | 1203 | 1226 | 1053 | 1317 | 1927 => DatabaseFailure::Dropped,
            _ => failure_of_code(mysql.code().unwrap_or_default()),
        };
    }
    failure_of_code(db.code().as_deref().unwrap_or_default())
}

/// Classifies an SQLSTATE (or SQLite's extended result code).
fn failure_of_code(code: &str) -> DatabaseFailure {
    match code {
        _ if CONFLICT_CODES.contains(&code) => DatabaseFailure::Conflict,
        // lock_not_available (lock_timeout), query_canceled (statement_timeout, a
        // cancel).
        "55P03" | "57014" => DatabaseFailure::GaveUp,
        // Connection exceptions (class 08), admin/crash shutdown, cannot connect
        // now, idle session timeouts, too many connections, an interrupted MySQL
        // statement.
        _ if code.starts_with("08") => DatabaseFailure::Dropped,
        "57P01" | "57P02" | "57P03" | "57P05" | "25P03" | "53300" | "70100" => {
            DatabaseFailure::Dropped
        }
        _ => DatabaseFailure::Refused,
    }
}

/// Whether `err` is a database's answer that a later try may not get: a conflict,
/// a statement it gave up on or dropped, a connection it refused for now (too many
/// connections, starting up) — not a refusal for good (a wrong password, a missing
/// database).
pub(crate) fn is_transient_answer(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Database(db) => database_failure(db.as_ref()) != DatabaseFailure::Refused,
        _ => false,
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
        sqlx::Error::Database(db) => match database_failure(db.as_ref()) {
            DatabaseFailure::Conflict => (
                ErrorKind::Backend,
                true,
                "the database aborted the statement to break a deadlock or a serialization conflict; retry",
            ),
            // (`Backend`, not `Timeout`: that kind is the caller's own wait or the
            // operation timeout, and metrics label it so.)
            DatabaseFailure::GaveUp => (
                ErrorKind::Backend,
                true,
                "the database gave up on the statement or cancelled it (a row lock another transaction held too long, a statement time limit, an operator's cancel); retry",
            ),
            DatabaseFailure::Dropped => (
                ErrorKind::Backend,
                true,
                "the database dropped the statement (connection killed, server restarting or out of connections); retry — the pool reconnects by itself",
            ),
            DatabaseFailure::Refused => (
                ErrorKind::Backend,
                false,
                "the database refused the statement; check the user's privileges on the dlock tables and that migrations ran",
            ),
        },
        _ => (ErrorKind::Backend, true, "the database call failed"),
    };
    Error::new(kind, hint)
        .set_retryable(retryable)
        .with_context("backend", backend)
        .with_context("op", op)
        .with_source(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates_are_classified_by_what_a_retry_would_do() {
        for code in ["40001", "40P01", "5", "6", "517"] {
            assert_eq!(failure_of_code(code), DatabaseFailure::Conflict, "{code}");
        }
        for code in ["55P03", "57014"] {
            assert_eq!(failure_of_code(code), DatabaseFailure::GaveUp, "{code}");
        }
        for code in [
            "08006", "08S01", "08004", "57P01", "57P02", "57P03", "57P05", "25P03", "53300",
            "70100",
        ] {
            assert_eq!(failure_of_code(code), DatabaseFailure::Dropped, "{code}");
        }
        for code in ["42501", "42P01", "42S02", "HY000", "23505", ""] {
            assert_eq!(failure_of_code(code), DatabaseFailure::Refused, "{code}");
        }
    }
}
