//! Connecting: a backend from a database URL or the application's pool, its pool
//! opened per database, the schema migrated, the mode's parts assembled.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use dlock_spi::{redact_url, Error, ErrorKind, Result};

use crate::backend::{Inner, JdbcBackend};
#[cfg(any(feature = "mysql", feature = "postgres"))]
use crate::config::unverified_as_read;
use crate::config::{split_options, verified_tls_url, JdbcMode, JdbcOptions, JdbcPooler};
use crate::dialect::Dialect;
use crate::listener::start_listener;
use crate::pool::Pool;
use crate::statements::{validate_prefix, Statements};
use crate::{migrate, pool, SqlPool};

impl JdbcBackend {
    /// Connects with default options (and any `dlock_*` options in the URL), and
    /// migrates the schema.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, JdbcOptions::default()).await
    }

    /// Connects with `options` (URL `dlock_*` options override them).
    pub async fn connect_with(url: &str, options: JdbcOptions) -> Result<Self> {
        let (url, options) = split_options(url, options)?;
        validate_prefix(&options.table_prefix)?;
        let scheme = url.split(':').next().unwrap_or("").to_ascii_lowercase();
        let url = if options.verified_tls {
            verified_tls_url(&url, &scheme)?
        } else {
            url
        };
        if options.mode == JdbcMode::Session
            && !matches!(
                scheme.as_str(),
                "postgres" | "postgresql" | "mysql" | "mariadb"
            )
        {
            return Err(Error::new(
                ErrorKind::Config,
                format!("dlock_mode=session (JdbcMode::Session) is for PostgreSQL and MariaDB; {scheme}:// holds its locks in rows (drop the option)"),
            ));
        }
        let pool = match scheme.as_str() {
            #[cfg(feature = "sqlite")]
            "sqlite" => open_sqlite(&url, &options)?,
            #[cfg(feature = "mysql")]
            "mysql" | "mariadb" => open_mysql(&url, &options)?,
            #[cfg(feature = "postgres")]
            "postgres" | "postgresql" => open_postgres(&url, &options)?,
            #[allow(unreachable_patterns)]
            "sqlite" | "mysql" | "mariadb" | "postgres" | "postgresql" => {
                return Err(Error::new(
                    ErrorKind::Config,
                    format!("{scheme}:// needs dlock-jdbc's \"{}\" feature; enable it in Cargo.toml", feature_of(&scheme)),
                ))
            }
            _ => {
                return Err(Error::new(
                    ErrorKind::Config,
                    format!(
                        "{:?} is not a SQL URL; use sqlite://file.db, mysql://user@host/db or postgres://user@host/db",
                        redact_url(&url)
                    ),
                ))
            }
        };
        // Fail now, with the real cause, if the database is unreachable: a direct
        // connection reports "connection refused" where the pool says only "timed out".
        let probe: std::result::Result<(), sqlx::Error> = pool::on_pool!(&pool, p => {
            use sqlx::{ConnectOptions, Connection};
            match tokio::time::timeout(options.acquire_timeout, p.connect_options().connect()).await {
                Ok(Ok(conn)) => conn.close().await,
                Ok(Err(e)) => Err(e),
                Err(_) => Err(sqlx::Error::PoolTimedOut),
            }
        });
        probe.map_err(|e| connect_error(&url, e, options.acquire_timeout))?;
        Self::assemble(pool, options).await
    }

    /// Builds the backend on the application's pool — its connections, limits, TLS
    /// and credentials — and migrates the schema (unless [`JdbcOptions::migrate`]
    /// says not to). [`JdbcOptions`]' pool settings (`max_connections`,
    /// `acquire_timeout`) do not apply to the pool: it has its own. The backend also
    /// opens sessions of its own beside it, with the pool's connect options (read
    /// again at each reconnect) and without its `after_connect`, each connect
    /// bounded by `acquire_timeout`: on MariaDB/MySQL up to
    /// [`JdbcOptions::wake_sessions`] (they only run `GET_LOCK`/`RELEASE_LOCK`), on
    /// PostgreSQL one listening for release notices (it only runs `LISTEN`).
    ///
    /// dlock needs of the pool's sessions what [`JdbcBackend::connect`] sets up itself:
    ///
    /// * **MySQL / MariaDB**: UTC (`time_zone = '+00:00'`: leases are judged by
    ///   `NOW(3)`, which must not jump at a DST change) and `READ COMMITTED` (the
    ///   statements' reads of the waiters' queue take gap locks under `REPEATABLE
    ///   READ` that deadlock). Give the pool [`prepare_mysql_session`] as its
    ///   `after_connect`; a pool whose session shows otherwise is refused
    ///   ([`ErrorKind::Config`]) with what to do.
    /// * **SQLite**: a file database (not `:memory:`, which is private to one
    ///   connection); WAL mode and a busy timeout, as [`JdbcBackend::connect`] sets,
    ///   keep writers from failing with `SQLITE_BUSY` under contention.
    /// * **PostgreSQL**: nothing.
    ///
    /// [`JdbcBackend::close`] closes the pool, which is the application's too: drop
    /// the backend instead while the application still uses the pool.
    ///
    /// ```no_run
    /// # async fn demo() -> dlock_spi::Result<()> {
    /// # #[cfg(feature = "postgres")] {
    /// use dlock_jdbc::{sqlx, JdbcBackend, JdbcOptions};
    /// let pool = sqlx::PgPool::connect_lazy("postgres://app@db/app")
    ///     .map_err(|e| dlock_spi::Error::backend(e.to_string()))?;
    /// let backend = JdbcBackend::from_pool(pool.clone(), JdbcOptions::default()).await?;
    /// # let _ = backend; }
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before it returns, it leaves at most a migration step
    /// done (each is idempotent and recorded) and no listener running.
    pub async fn from_pool(pool: impl Into<SqlPool>, options: JdbcOptions) -> Result<Self> {
        let pool = pool.into();
        validate_prefix(&options.table_prefix)?;
        if options.verified_tls {
            return Err(Error::new(
                ErrorKind::Config,
                "dlock_tls=verified (JdbcOptions::verified_tls) is for the connections dlock opens; an application's own pool connects as its options say (sslmode=verify-full / ssl-mode=VERIFY_IDENTITY there), so the option is refused here",
            ));
        }
        // (With one database feature, each pattern below is the only one.)
        #[cfg(feature = "sqlite")]
        #[allow(irrefutable_let_patterns)]
        if let Pool::Sqlite(p) = &pool {
            let options = p.connect_options();
            let file = options.get_filename().to_string_lossy();
            if file.is_empty() || file.contains(":memory:") {
                return Err(Error::new(
                    ErrorKind::Config,
                    "the pool's SQLite database is in memory, private to one connection; use a file database or the memory:// backend",
                ));
            }
        }
        #[cfg(feature = "mysql")]
        #[allow(irrefutable_let_patterns)]
        if let Pool::MySql(p) = &pool {
            check_mysql_session(p).await?;
        }
        Self::assemble(pool, options).await
    }

    /// Migrates (if asked), prepares the statements and starts the listener.
    async fn assemble(pool: Pool, options: JdbcOptions) -> Result<Self> {
        let pooled = options.pooler == JdbcPooler::Transaction;
        if pooled && pool.dialect() != Dialect::Postgres {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "dlock_pooler=transaction (JdbcPooler::Transaction) is for PostgreSQL behind a pooler such as PgBouncer; the {} backend connects to its database directly (drop the option)",
                    pool.dialect().name()
                ),
            ));
        }
        if pooled && options.mode == JdbcMode::Session {
            return Err(Error::new(
                ErrorKind::Config,
                "dlock_mode=session holds each lock on a session of its own, which a pooler in transaction mode does not keep; behind the pooler use the row mode (drop dlock_mode=session), or connect the session mode to PostgreSQL directly",
            ));
        }
        if options.mode == JdbcMode::Session {
            return Self::assemble_session(pool, options).await;
        }
        if options.migrate {
            migrate::migrate(&pool, &options.table_prefix).await?;
        }
        let statements = Statements::new(pool.dialect(), &options.table_prefix, pooled);
        // Behind a transaction pooler a LISTEN session is not kept: waiters poll.
        let (wakeups, listener, bus) = if pooled {
            (None, None, None)
        } else {
            start_listener(&pool, &options).await
        };
        let bells = match &pool {
            #[cfg(feature = "mysql")]
            Pool::MySql(p) if options.wake_sessions > 0 => Some(crate::bell::Bells::new(
                (*p.connect_options()).clone(),
                &options.table_prefix,
                options.wake_sessions,
                options.acquire_timeout,
            )),
            _ => None,
        };
        Ok(JdbcBackend {
            inner: Arc::new(Inner {
                pool,
                statements,
                options,
                attempts: AtomicU64::new(0),
                wakeups,
                listener,
                bells,
                bus,
                departures: Default::default(),
                session: None,
            }),
        })
    }

    /// The session mode's backend: its sessions beside the pool (which it uses
    /// for nothing else), no row tables, no listener.
    #[cfg_attr(
        not(any(feature = "postgres", feature = "mysql")),
        allow(unused_variables)
    )]
    async fn assemble_session(pool: Pool, options: JdbcOptions) -> Result<Self> {
        // The mode of the pool's database, opened with the pool's connect options.
        #[cfg_attr(
            not(any(feature = "postgres", feature = "mysql")),
            allow(unused_macros)
        )]
        macro_rules! open {
            ($p:expr, $variant:ident, $db:ident) => {{
                let sessions = crate::session::$db::Sessions::open(
                    (*$p.connect_options()).clone(),
                    &options.table_prefix,
                    options.session_timeout,
                    options.acquire_timeout,
                    options.migrate,
                )
                .await?;
                let session = crate::session::Sessions::$variant(Box::new(sessions));
                return Ok(Self::on_sessions(pool, options, session));
            }};
        }
        #[cfg(feature = "postgres")]
        #[allow(irrefutable_let_patterns)] // PostgreSQL may be the only database built in
        if let Pool::Postgres(p) = &pool {
            open!(p, Postgres, postgres);
        }
        #[cfg(feature = "mysql")]
        #[allow(irrefutable_let_patterns)] // MariaDB may be the only database built in
        if let Pool::MySql(p) = &pool {
            open!(p, Mysql, mysql);
        }
        Err(Error::new(
            ErrorKind::Config,
            format!(
                "dlock_mode=session (JdbcMode::Session) is for PostgreSQL and MariaDB; the {} backend holds its locks in rows (drop the option)",
                pool.dialect().name()
            ),
        ))
    }

    /// A backend whose every lock call goes to `session`.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    fn on_sessions(pool: Pool, options: JdbcOptions, session: crate::session::Sessions) -> Self {
        let statements = Statements::new(pool.dialect(), &options.table_prefix, false);
        JdbcBackend {
            inner: Arc::new(Inner {
                pool,
                statements,
                options,
                attempts: AtomicU64::new(0),
                wakeups: None,
                listener: None,
                bells: None,
                bus: None,
                departures: Default::default(),
                session: Some(session),
            }),
        }
    }
}

/// Prepares a MySQL / MariaDB session as dlock's statements need it: UTC
/// (`time_zone = '+00:00'`) and `READ COMMITTED`. Give it to the application's pool
/// as its `after_connect` before [`JdbcBackend::from_pool`]:
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use dlock_jdbc::{prepare_mysql_session, sqlx, JdbcBackend, JdbcOptions};
/// let pool = sqlx::mysql::MySqlPoolOptions::new()
///     .after_connect(prepare_mysql_session)
///     .connect_lazy("mysql://app@db/app")?;
/// let backend = JdbcBackend::from_pool(pool, JdbcOptions::default()).await?;
/// # let _ = backend; Ok(()) }
/// ```
///
/// Other statements of the application on those connections run in UTC and
/// `READ COMMITTED` too.
#[cfg(feature = "mysql")]
pub fn prepare_mysql_session(
    conn: &mut sqlx::MySqlConnection,
    _: sqlx::pool::PoolConnectionMetadata,
) -> std::pin::Pin<
    Box<dyn std::future::Future<Output = std::result::Result<(), sqlx::Error>> + Send + '_>,
> {
    use sqlx::Executor;
    Box::pin(async move {
        // Lease arithmetic uses NOW(3); in UTC it never jumps at DST changes.
        conn.execute("SET time_zone = '+00:00'").await?;
        // Statements read the waiters' queue to decide a grant; under REPEATABLE
        // READ those reads take gap locks that deadlock against waiters joining and
        // leaving. Every decision that must be serialised is already serialised by
        // the lock's row, which each statement locks.
        conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            .await?;
        Ok(())
    })
}

/// Refuses a MySQL pool whose sessions are not as [`prepare_mysql_session`] makes them.
#[cfg(feature = "mysql")]
pub(crate) async fn check_mysql_session(pool: &sqlx::MySqlPool) -> Result<()> {
    use sqlx::Row;
    let rows = sqlx::query(
        "SHOW SESSION VARIABLES WHERE Variable_name IN ('time_zone', 'tx_isolation', 'transaction_isolation')",
    )
    .fetch_all(pool)
    .await
    .map_err(|e| crate::error::map_sqlx(e, "mysql", "connect"))?;
    let mut utc = false;
    let mut read_committed = false;
    for row in rows {
        let name: String = row.try_get(0).unwrap_or_default();
        let value: String = row.try_get(1).unwrap_or_default();
        match name.as_str() {
            "time_zone" => utc = matches!(value.as_str(), "+00:00" | "UTC" | "+0:00"),
            _ => read_committed |= value.eq_ignore_ascii_case("READ-COMMITTED"),
        }
    }
    if utc && read_committed {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::Config,
        format!(
            "the pool's MySQL sessions run{}{}; dlock needs UTC and READ COMMITTED: build the pool with `.after_connect(dlock_jdbc::prepare_mysql_session)`",
            if utc { "" } else { " outside UTC" },
            if read_committed { "" } else { " without READ COMMITTED" },
        ),
    ))
}

pub(crate) fn feature_of(scheme: &str) -> &'static str {
    match scheme {
        "sqlite" => "sqlite",
        "mysql" | "mariadb" => "mysql",
        _ => "postgres",
    }
}

pub(crate) fn config_error(url: &str, e: sqlx::Error) -> Error {
    Error::new(
        ErrorKind::Config,
        format!("invalid database URL {}: {e}", redact_url(url)),
    )
}

/// The database file a `sqlite:` URL names (its `dlock_*` options set aside, the
/// rest read as sqlx reads it) — so a reader (a status page, `dlock status`) can
/// tell whether the file exists before it connects: connecting creates the file.
///
/// A URL sqlx cannot read, a bad `dlock_*` option and an in-memory database (private
/// to one connection: no file to look for) are [`ErrorKind::Config`], as
/// [`JdbcBackend::connect`] would say.
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub fn sqlite_file(url: &str) -> Result<std::path::PathBuf> {
    let (url, _) = split_options(url, JdbcOptions::default())?;
    Ok(sqlite_options(&url)?.get_filename().to_owned())
}

/// sqlx's reading of a `sqlite:` URL (dlock's own options already taken off). An
/// in-memory database is private to one connection: refused.
#[cfg(feature = "sqlite")]
pub(crate) fn sqlite_options(url: &str) -> Result<sqlx::sqlite::SqliteConnectOptions> {
    use std::str::FromStr;
    if url.contains(":memory:") || url.contains("mode=memory") {
        return Err(Error::new(
            ErrorKind::Config,
            "an in-memory SQLite database is private to one connection; use a file (sqlite://locks.db) or the memory:// backend",
        ));
    }
    sqlx::sqlite::SqliteConnectOptions::from_str(url).map_err(|e| config_error(url, e))
}

/// How long a pooled connection may have been idle and still be handed out without
/// a check: one used this recently is taken as live, as HikariCP does (its
/// `aliveBypassWindowMs`, also 500 ms). One idle longer is pinged first — a round
/// trip — and replaced if the server has gone (restarted, or ended the session).
/// sqlx's default pings every connection it hands out, which on a busy lock costs a
/// round trip per statement. A connection that dies within the window fails the
/// one statement handed it with a retryable error, as one dying mid-statement does,
/// and is replaced.
pub(crate) const LIVE_WITHOUT_CHECK: Duration = Duration::from_millis(500);

/// `pool`, checking only connections idle longer than [`LIVE_WITHOUT_CHECK`]
/// before handing them out.
pub(crate) fn checked_after_idle<DB: sqlx::Database>(
    pool: sqlx::pool::PoolOptions<DB>,
) -> sqlx::pool::PoolOptions<DB> {
    pool.test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                // A connection that fails its ping is closed and another one
                // handed out (`false`: no warning logged for it).
                Ok(
                    meta.idle_for < LIVE_WITHOUT_CHECK
                        || sqlx::Connection::ping(conn).await.is_ok(),
                )
            })
        })
}

#[cfg(feature = "sqlite")]
pub(crate) fn open_sqlite(url: &str, options: &JdbcOptions) -> Result<Pool> {
    use sqlx::sqlite::{SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
    let connect = sqlite_options(url)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(Duration::from_secs(5));
    let pool = checked_after_idle(SqlitePoolOptions::new())
        .max_connections(options.max_connections)
        .acquire_timeout(options.acquire_timeout)
        .connect_lazy_with(connect);
    Ok(Pool::Sqlite(pool))
}

#[cfg(feature = "mysql")]
pub(crate) fn open_mysql(url: &str, options: &JdbcOptions) -> Result<Pool> {
    use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
    use std::str::FromStr;
    let url = url.replacen("mariadb://", "mysql://", 1);
    let connect = MySqlConnectOptions::from_str(&url).map_err(|e| config_error(&url, e))?;
    if options.verified_tls
        && !matches!(
            connect.get_ssl_mode(),
            sqlx::mysql::MySqlSslMode::VerifyIdentity | sqlx::mysql::MySqlSslMode::VerifyCa
        )
    {
        return Err(unverified_as_read());
    }
    let pool = checked_after_idle(MySqlPoolOptions::new())
        .max_connections(options.max_connections)
        .acquire_timeout(options.acquire_timeout)
        .after_connect(prepare_mysql_session)
        .connect_lazy_with(connect);
    Ok(Pool::MySql(pool))
}

#[cfg(feature = "postgres")]
pub(crate) fn open_postgres(url: &str, options: &JdbcOptions) -> Result<Pool> {
    use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
    use std::str::FromStr;
    let connect = PgConnectOptions::from_str(url).map_err(|e| config_error(url, e))?;
    if options.verified_tls
        && !matches!(
            connect.get_ssl_mode(),
            sqlx::postgres::PgSslMode::VerifyFull | sqlx::postgres::PgSslMode::VerifyCa
        )
    {
        return Err(unverified_as_read());
    }
    let pool = checked_after_idle(PgPoolOptions::new())
        .max_connections(options.max_connections)
        .acquire_timeout(options.acquire_timeout)
        .connect_lazy_with(connect);
    Ok(Pool::Postgres(pool))
}

/// The error of a connect the database (or the way to it) refused: typed by what
/// would fix it — the configuration, or time — with the server's own words and
/// what to check.
fn connect_error(url: &str, e: sqlx::Error, acquire_timeout: std::time::Duration) -> Error {
    let shown = redact_url(url);
    if matches!(e, sqlx::Error::PoolTimedOut) {
        // Only the connect's own bound gives this: the server took the connection
        // and did not answer in time (hung, overloaded, or a partition).
        return Error::new(
            ErrorKind::Timeout,
            format!(
                "cannot connect to {shown}: no answer within {acquire_timeout:?}; check that the server runs and is not overloaded, or wait longer (dlock_acquire_timeout=30s in the URL, JdbcOptions::acquire_timeout)"
            ),
        );
    }
    // The server's own words; the driver's Display of them adds the line of the
    // server's source that raised them, which means nothing to a user.
    let said = match &e {
        sqlx::Error::Database(db) => db.message().to_owned(),
        other => other.to_string(),
    };
    if let Some(param) = crate::error::refused_startup_parameter(&e) {
        return Error::new(
            ErrorKind::Config,
            format!(
                "cannot connect to {shown}: {said}; a pooler between dlock and PostgreSQL (PgBouncer) refuses the startup parameter {param} that the driver sends: add `ignore_startup_parameters = {param}` to its configuration (pgbouncer.ini)"
            ),
        )
        .with_source(e);
    }
    // A refused TLS handshake (rustls' errors reach sqlx as invalid data) is the
    // configuration's to fix, as a bad URL is; retrying will not help.
    let tls = matches!(&e, sqlx::Error::Tls(_))
        || matches!(&e, sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::InvalidData);
    // A database's answer is the configuration's to fix (a wrong password, a
    // missing database) unless it refused the connection for now.
    let transient = crate::error::is_transient_answer(&e);
    let retryable = transient
        || (!tls && !matches!(e, sqlx::Error::Configuration(_) | sqlx::Error::Database(_)));
    let hint = if transient {
        "the database refused the connection for now (too many connections, starting up or shutting down); retry later"
    } else if tls {
        "the TLS handshake failed: check the CA the URL names (PostgreSQL: sslrootcert=…, MySQL: ssl-ca=…), that the URL's host is the one the server's certificate names, and that dlock-jdbc's `tls` feature is on"
    } else if matches!(&e, sqlx::Error::Configuration(c) if crate::error::needs_rsa(c.as_ref())) {
        crate::error::RSA_HINT
    } else if matches!(e, sqlx::Error::Database(_)) {
        "the server answered: check the database, user and password the URL names, and that the user may log in to that database"
    } else {
        "check that the server runs, the URL is right and the user may log in"
    };
    let kind = if retryable {
        ErrorKind::Backend
    } else {
        ErrorKind::Config
    };
    Error::new(kind, format!("cannot connect to {shown}: {said}; {hint}"))
        .set_retryable(retryable)
        .with_source(e)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn bad_urls_are_config_errors() {
        for url in [
            "redis://x",
            "sqlite::memory:",
            "sqlite://x.db?dlock_table_prefix=a-b",
            // The session mode is PostgreSQL's.
            "sqlite://x.db?dlock_mode=session",
        ] {
            let err = JdbcBackend::connect(url).await.err().map(|e| e.kind());
            assert_eq!(err, Some(ErrorKind::Config), "{url}");
        }
    }

    /// MySQL 8's caching_sha2_password over a connection without TLS needs RSA,
    /// opt-in (`mysql-rsa`): refused at connect, the error names dlock's feature
    /// to enable and the TLS alternative (it gave only sqlx's words and "check that
    /// the server runs").
    #[test]
    fn a_login_that_needs_rsa_names_the_feature_at_connect() {
        let sqlx_says = "RSA auth backend disabled; enable feature `mysql-rsa` (or `rsa` if using sqlx-mysql directly) or use TLS.";
        let err = connect_error(
            "mysql://app:S3cret@127.0.0.1:3306/test",
            sqlx::Error::Configuration(sqlx_says.into()),
            Duration::from_secs(5),
        );
        assert_eq!(err.kind(), ErrorKind::Config);
        let text = err.to_string();
        assert!(text.contains("dlock-api's `mysql-rsa` feature"), "{text}");
        assert!(text.contains("ssl-mode=required"), "{text}");
        assert!(
            !text.contains("S3cret") && !text.contains("server runs"),
            "{text}"
        );
    }
}
