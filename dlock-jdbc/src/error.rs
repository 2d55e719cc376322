//! The one place sqlx errors become dlock errors, and the one place a statement
//! that lost a transaction conflict is run again.

use std::future::Future;
use std::time::Duration;

use dlock_spi::{Error, ErrorKind};

/// SQLSTATEs of a statement the database aborted for a transaction conflict and
/// rolled back whole: a serialization failure (40001 — MySQL's deadlock victim 1213
/// among them) and PostgreSQL's deadlock victim (40P01). (SQLite's busy and locked
/// results: [`sqlite_failure`].)
const CONFLICT_CODES: [&str; 2] = ["40001", "40P01"];
/// SQLite's primary result codes for "busy" and "locked" (an extended code keeps
/// its primary code in its low byte).
const SQLITE_BUSY: u32 = 5;
const SQLITE_LOCKED: u32 = 6;
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
    /// PostgreSQL: a prepared statement the connection made is gone or another's
    /// (`duplicate_prepared_statement` 42P05, `invalid_sql_statement_name` 26000) —
    /// what sqlx's statements meet behind a pooler in transaction mode, which hands
    /// each transaction another server session. A configuration to fix.
    Pooled,
    /// The database user lacks a privilege the statement needs (PostgreSQL
    /// 42501; MariaDB/MySQL 1044, 1142, 1143, 1227): a configuration to fix.
    Denied,
    /// Anything else: privileges, missing tables, syntax — retrying will not help.
    Refused,
}

/// Classifies a database's error answer. PostgreSQL is read by its SQLSTATE,
/// SQLite by its extended result code, MySQL/MariaDB by their error numbers first,
/// since most of theirs share the SQLSTATE `HY000` (sqlx's `code()` is SQLite's
/// result code, and the others' SQLSTATE).
fn database_failure(db: &dyn sqlx::error::DatabaseError) -> DatabaseFailure {
    #[cfg(feature = "mysql")]
    if let Some(mysql) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return mysql_failure(mysql.number(), mysql.code().unwrap_or_default());
    }
    #[cfg(feature = "sqlite")]
    if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
        return sqlite_failure(db.code().as_deref().unwrap_or_default());
    }
    failure_of_code(db.code().as_deref().unwrap_or_default())
}

/// Classifies MySQL's (or MariaDB's) error `number`, or else its SQLSTATE `code`.
#[cfg_attr(not(any(feature = "mysql", test)), allow(dead_code))]
fn mysql_failure(number: u16, code: &str) -> DatabaseFailure {
    match number {
        // ER_LOCK_DEADLOCK (SQLSTATE 40001); MySQL's
        // ER_TRANSACTION_ROLLBACK_DURING_COMMIT (Group Replication's certification
        // rolled the transaction back whole at its commit).
        1213 | 3101 => DatabaseFailure::Conflict,
        // ER_LOCK_WAIT_TIMEOUT, MySQL's max_execution_time, MariaDB's
        // max_statement_time.
        1205 | 3024 | 1969 => DatabaseFailure::GaveUp,
        // Too many connections (all, the user's), a user's resource limit reached
        // (connections, or per hour), server shutdown, query interrupted (KILL
        // QUERY), connection killed (MariaDB). (Not MySQL 8's idle-client 4031:
        // MariaDB numbers its own errors from 4000 up.)
        1040 | 1203 | 1226 | 1053 | 1317 | 1927 => DatabaseFailure::Dropped,
        // ER_DBACCESS_DENIED_ERROR, ER_TABLEACCESS_DENIED_ERROR,
        // ER_COLUMNACCESS_DENIED_ERROR, ER_SPECIFIC_ACCESS_DENIED_ERROR.
        1044 | 1142 | 1143 | 1227 => DatabaseFailure::Denied,
        _ => failure_of_code(code),
    }
}

/// Classifies SQLite's extended result code: every kind of busy (primary code 5:
/// another connection writes, recovers the WAL, or holds a snapshot this one cannot
/// upgrade) and of locked (6: a conflict inside one shared cache) is a conflict —
/// the statement did not run. Anything else (I/O, corruption, constraints, a
/// read-only file) a retry would not change.
#[cfg_attr(not(any(feature = "sqlite", test)), allow(dead_code))]
fn sqlite_failure(code: &str) -> DatabaseFailure {
    match code.parse::<u32>() {
        Ok(code) if matches!(code & 0xff, SQLITE_BUSY | SQLITE_LOCKED) => DatabaseFailure::Conflict,
        _ => DatabaseFailure::Refused,
    }
}

/// Classifies an SQLSTATE.
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
        "42P05" | "26000" => DatabaseFailure::Pooled,
        "42501" => DatabaseFailure::Denied,
        _ => DatabaseFailure::Refused,
    }
}

/// Whether `err` is a database's answer that a later try may not get: a conflict,
/// a statement it gave up on or dropped, a connection it refused for now (too many
/// connections, starting up) — not a refusal for good (a wrong password, a missing
/// database).
pub(crate) fn is_transient_answer(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Database(db) => !matches!(
            database_failure(db.as_ref()),
            DatabaseFailure::Refused | DatabaseFailure::Pooled | DatabaseFailure::Denied
        ),
        _ => false,
    }
}

/// The startup parameter a pooler refused, if that is what `err` says: PgBouncer
/// refuses any it does not know unless its `ignore_startup_parameters` lists it,
/// and sqlx sends `extra_float_digits` (PgBouncer's answer: `unsupported startup
/// parameter: extra_float_digits`). A configuration to fix, however often tried.
pub(crate) fn refused_startup_parameter(err: &sqlx::Error) -> Option<String> {
    let sqlx::Error::Database(db) = err else {
        return None;
    };
    let param = db.message().strip_prefix("unsupported startup parameter")?;
    let param = param.trim_start_matches([':', ' ']).trim();
    Some(
        if param.is_empty() {
            "extra_float_digits"
        } else {
            param
        }
        .to_owned(),
    )
}

/// What to do about a MySQL login refused for want of RSA.
pub(crate) const RSA_HINT: &str = "this MySQL login needs RSA (caching_sha2_password without TLS): enable dlock-api's `mysql-rsa` feature (dlock-jdbc's, used alone), or connect over TLS (`?ssl-mode=required`, with the `sql-tls` feature)";

/// Whether sqlx refused a configuration for want of RSA: MySQL 8's
/// caching_sha2_password over a connection without TLS sends the password
/// RSA-encrypted, which is opt-in (the rsa crate).
pub(crate) fn needs_rsa(e: &(dyn std::error::Error + Send + Sync)) -> bool {
    e.to_string().contains("RSA")
}

/// Maps a driver error, naming the operation that failed.
pub(crate) fn map_sqlx(err: sqlx::Error, backend: &'static str, op: &'static str) -> Error {
    let (kind, retryable, hint) = match &err {
        // MySQL 8's caching_sha2_password over a connection without TLS: the
        // password goes RSA-encrypted, which is opt-in (the rsa crate).
        sqlx::Error::Configuration(e) if needs_rsa(e.as_ref()) => (ErrorKind::Config, false, RSA_HINT),
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
            DatabaseFailure::Pooled => (
                ErrorKind::Config,
                false,
                "a prepared statement of this connection is gone or another session's: a pooler in transaction mode (PgBouncer's pool_mode = transaction) stands between dlock and PostgreSQL; add dlock_pooler=transaction to the URL (JdbcPooler::Transaction)",
            ),
            DatabaseFailure::Denied => (
                ErrorKind::Config,
                false,
                "permission denied: the database user lacks a privilege this needs — SELECT on the dlock tables to read locks (status), SELECT, INSERT, UPDATE and DELETE to take and release them, CREATE for the first connect's migration (or connect with dlock_migrate=false once an owner applied it)",
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

    /// MySQL 8's caching_sha2_password over a connection without TLS needs RSA,
    /// which is opt-in (`mysql-rsa`): the error names the feature of dlock's to
    /// enable and the alternative, not only sqlx's own.
    #[test]
    fn a_mysql_login_that_needs_rsa_names_the_feature_to_enable() {
        let sqlx_says = "RSA auth backend disabled; enable feature `mysql-rsa` (or `rsa` if using sqlx-mysql directly) or use TLS.";
        let err = map_sqlx(
            sqlx::Error::Configuration(sqlx_says.into()),
            "mysql",
            "connect",
        );
        assert_eq!(err.kind(), ErrorKind::Config);
        let text = err.to_string();
        assert!(text.contains("dlock-api's `mysql-rsa` feature"), "{text}");
        assert!(text.contains("ssl-mode=required"), "{text}");
    }

    #[test]
    fn sqlstates_are_classified_by_what_a_retry_would_do() {
        for code in ["40001", "40P01"] {
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
        for code in ["42P05", "26000"] {
            assert_eq!(failure_of_code(code), DatabaseFailure::Pooled, "{code}");
        }
        assert_eq!(failure_of_code("42501"), DatabaseFailure::Denied);
        for code in ["42P01", "42S02", "HY000", "23505", ""] {
            assert_eq!(failure_of_code(code), DatabaseFailure::Refused, "{code}");
        }
    }

    /// Every busy (5) and locked (6) result SQLite reports, its extended codes
    /// included: the statement did not run, and may be run again.
    #[test]
    fn every_sqlite_busy_and_locked_code_is_a_conflict() {
        // BUSY, BUSY_RECOVERY, BUSY_SNAPSHOT, BUSY_TIMEOUT; LOCKED, LOCKED_SHAREDCACHE,
        // LOCKED_VTAB.
        for code in ["5", "261", "517", "773", "6", "262", "518"] {
            assert_eq!(sqlite_failure(code), DatabaseFailure::Conflict, "{code}");
        }
        // ERROR, READONLY, IOERR_SHORT_READ, CORRUPT, CONSTRAINT_UNIQUE; none at all.
        for code in ["1", "8", "522", "11", "2067", ""] {
            assert_eq!(sqlite_failure(code), DatabaseFailure::Refused, "{code}");
        }
    }

    /// MySQL's error numbers, read before the SQLSTATE most of them share.
    #[test]
    fn mysql_numbers_are_classified_by_what_a_retry_would_do() {
        // ER_LOCK_DEADLOCK; ER_TRANSACTION_ROLLBACK_DURING_COMMIT (Group
        // Replication's certification rolled the transaction back whole).
        for number in [1213, 3101] {
            assert_eq!(
                mysql_failure(number, "HY000"),
                DatabaseFailure::Conflict,
                "{number}"
            );
        }
        for number in [1205, 3024, 1969] {
            assert_eq!(
                mysql_failure(number, "HY000"),
                DatabaseFailure::GaveUp,
                "{number}"
            );
        }
        for number in [1040, 1203, 1226, 1053, 1317, 1927] {
            assert_eq!(
                mysql_failure(number, "HY000"),
                DatabaseFailure::Dropped,
                "{number}"
            );
        }
        for number in [1044, 1142, 1143, 1227] {
            assert_eq!(
                mysql_failure(number, "42000"),
                DatabaseFailure::Denied,
                "{number}"
            );
        }
        // ER_DUP_ENTRY: by number; a number it does not know goes by its SQLSTATE.
        assert_eq!(mysql_failure(1062, "23000"), DatabaseFailure::Refused);
        assert_eq!(mysql_failure(9999, "08S01"), DatabaseFailure::Dropped);
    }
}
