//! The schema, shipped with the crate and applied on connect.
//!
//! Versioned and idempotent: `{prefix}schema_version` records each applied version;
//! every statement is `CREATE … IF NOT EXISTS`, and concurrent first connects are
//! serialised (PostgreSQL: one transaction under a transaction-scoped advisory lock;
//! MySQL `GET_LOCK`; SQLite's write lock).
//!
//! Tables (prefix `dlock_` by default):
//! * `locks` — one row per lock name ever taken: the exclusive holder (`owner` NULL
//!   when free), its lease (`expires_at`, database ms), the readers' horizon
//!   (`shared_until`), the queue's mark (`writer_wait_until`, below), and the
//!   fencing counter `token`. The row outlives releases so the counter never repeats; it holds
//!   no holder state once released.
//! * `readers` — one row per shared holder, deleted on release.
//! * `waiters` (version 2) — one row per waiting acquire: its arrival and liveness
//!   (database ms). Queued waiters ahead of a caller go first: all of them in fair
//!   mode, the starving ones in non-fair mode, and waiting writers before new
//!   readers. A row leaves with its waiter (granted, gave up or cancelled) or lapses
//!   with its liveness; a granted writer's row leaves beside its hold (PostgreSQL: in
//!   the granting statement), before its release. Since version 2
//!   `locks.writer_wait_until` holds no writer's mark; MariaDB/MySQL use it as the
//!   queue's mark: a waiter sets it (to twice its liveness) before it queues or
//!   refreshes its entry, whose liveness never passes it, so while it is in the past
//!   no live waiter is queued and a caller not queued need not read the queue. (A
//!   dlock of an earlier version on the same tables does not set it: mixed with
//!   this one, its waiters can be passed by this one's newcomers in fair mode.)
//! * `locks.ttl_at` (version 3) — the holder's own lease end, before a transition
//!   window (Simba's `ttl_at`; an election's leader may renew until `expires_at`,
//!   which plays Simba's `transition_at`, and nobody else may take the row before
//!   it). Equal to `expires_at` for holds without a window; 0 on rows from before.
//! * Semaphores (version 4): a semaphore is a `locks` row whose `capacity` is its
//!   total permits (0 for a plain lock), and each holder of permits a `readers` row
//!   whose `permits` says how many it holds (0 for a read lock). A grant raises
//!   `shared_until` as a reader's does, so exclusive requests on the name wait for
//!   the permit holders; permit waiters queue in `waiters` with mode `p`.
//! * `locks.holders` (version 5) — a semaphore's permit holders, in its own row: a
//!   JSON array of `[owner, permits, expires_at, token, acquired_at, context (hex)]`,
//!   so a grant, renewal or release writes one row. `readers.permits` is no longer
//!   written; a live `readers` row (a version-4 permit holder) keeps permits from
//!   being granted until it lapses. Upgrade every process that uses a semaphore
//!   together: a version-4 process does not see version-5 holders.

use dlock_spi::{Error, ErrorKind, Result};
use sqlx::{AssertSqlSafe, Row};

use crate::dialect::Dialect;
use crate::error::map_sqlx;
use crate::pool::Pool;

struct Migration {
    version: i64,
    sqlite: &'static [&'static str],
    mysql: &'static [&'static str],
    postgres: &'static [&'static str],
}

const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        sqlite: &[
            "CREATE TABLE IF NOT EXISTS {locks} (
            name TEXT NOT NULL PRIMARY KEY,
            owner TEXT NULL,
            token INTEGER NOT NULL,
            context BLOB NULL,
            acquired_at INTEGER NOT NULL DEFAULT 0,
            expires_at INTEGER NOT NULL DEFAULT 0,
            shared_until INTEGER NOT NULL DEFAULT 0,
            writer_wait_until INTEGER NOT NULL DEFAULT 0)",
            "CREATE TABLE IF NOT EXISTS {readers} (
            name TEXT NOT NULL,
            owner TEXT NOT NULL,
            token INTEGER NOT NULL,
            context BLOB NULL,
            acquired_at INTEGER NOT NULL,
            expires_at INTEGER NOT NULL,
            PRIMARY KEY (name, owner))",
        ],
        mysql: &[
            // Names are VARBINARY: compared byte for byte, so "A" ≠ "a" and "a" ≠ "a ".
            "CREATE TABLE IF NOT EXISTS {locks} (
            name VARBINARY(512) NOT NULL PRIMARY KEY,
            owner VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
            token BIGINT NOT NULL,
            context BLOB NULL,
            acquired_at BIGINT NOT NULL DEFAULT 0,
            expires_at BIGINT NOT NULL DEFAULT 0,
            shared_until BIGINT NOT NULL DEFAULT 0,
            writer_wait_until BIGINT NOT NULL DEFAULT 0) ENGINE=InnoDB",
            "CREATE TABLE IF NOT EXISTS {readers} (
            name VARBINARY(512) NOT NULL,
            owner VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
            token BIGINT NOT NULL,
            context BLOB NULL,
            acquired_at BIGINT NOT NULL,
            expires_at BIGINT NOT NULL,
            PRIMARY KEY (name, owner)) ENGINE=InnoDB",
        ],
        postgres: &[
            "CREATE TABLE IF NOT EXISTS {locks} (
            name TEXT NOT NULL PRIMARY KEY,
            owner TEXT NULL,
            token BIGINT NOT NULL,
            context BYTEA NULL,
            acquired_at BIGINT NOT NULL DEFAULT 0,
            expires_at BIGINT NOT NULL DEFAULT 0,
            shared_until BIGINT NOT NULL DEFAULT 0,
            writer_wait_until BIGINT NOT NULL DEFAULT 0)",
            "CREATE TABLE IF NOT EXISTS {readers} (
            name TEXT NOT NULL,
            owner TEXT NOT NULL,
            token BIGINT NOT NULL,
            context BYTEA NULL,
            acquired_at BIGINT NOT NULL,
            expires_at BIGINT NOT NULL,
            PRIMARY KEY (name, owner))",
        ],
    },
    Migration {
        version: 2,
        sqlite: &["CREATE TABLE IF NOT EXISTS {waiters} (
            name TEXT NOT NULL,
            waiter TEXT NOT NULL,
            mode TEXT NOT NULL,
            arrived INTEGER NOT NULL,
            alive_until INTEGER NOT NULL,
            PRIMARY KEY (name, waiter))"],
        mysql: &["CREATE TABLE IF NOT EXISTS {waiters} (
            name VARBINARY(512) NOT NULL,
            waiter VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
            mode CHAR(1) NOT NULL,
            arrived BIGINT NOT NULL,
            alive_until BIGINT NOT NULL,
            PRIMARY KEY (name, waiter)) ENGINE=InnoDB"],
        postgres: &["CREATE TABLE IF NOT EXISTS {waiters} (
            name TEXT NOT NULL,
            waiter TEXT NOT NULL,
            mode TEXT NOT NULL,
            arrived BIGINT NOT NULL,
            alive_until BIGINT NOT NULL,
            PRIMARY KEY (name, waiter))"],
    },
    Migration {
        version: 3,
        sqlite: &["ALTER TABLE {locks} ADD COLUMN ttl_at INTEGER NOT NULL DEFAULT 0"],
        mysql: &["ALTER TABLE {locks} ADD COLUMN ttl_at BIGINT NOT NULL DEFAULT 0"],
        postgres: &[
            "ALTER TABLE {locks} ADD COLUMN IF NOT EXISTS ttl_at BIGINT NOT NULL DEFAULT 0",
        ],
    },
    Migration {
        version: 4,
        sqlite: &[
            "ALTER TABLE {locks} ADD COLUMN capacity INTEGER NOT NULL DEFAULT 0",
            "ALTER TABLE {readers} ADD COLUMN permits INTEGER NOT NULL DEFAULT 0",
        ],
        mysql: &[
            "ALTER TABLE {locks} ADD COLUMN capacity BIGINT NOT NULL DEFAULT 0",
            "ALTER TABLE {readers} ADD COLUMN permits BIGINT NOT NULL DEFAULT 0",
        ],
        postgres: &[
            "ALTER TABLE {locks} ADD COLUMN IF NOT EXISTS capacity BIGINT NOT NULL DEFAULT 0",
            "ALTER TABLE {readers} ADD COLUMN IF NOT EXISTS permits BIGINT NOT NULL DEFAULT 0",
        ],
    },
    Migration {
        version: 5,
        sqlite: &["ALTER TABLE {locks} ADD COLUMN holders TEXT NULL"],
        mysql: &["ALTER TABLE {locks} ADD COLUMN holders JSON NULL"],
        postgres: &["ALTER TABLE {locks} ADD COLUMN IF NOT EXISTS holders JSONB NULL"],
    },
];

/// The newest schema version this crate knows.
pub const SCHEMA_VERSION: i64 = 5;

/// Whether a migration statement failed only because an earlier, interrupted run
/// already applied it (`ADD COLUMN` has no `IF NOT EXISTS` on SQLite and MySQL).
fn already_applied(err: &sqlx::Error) -> bool {
    err.as_database_error().is_some_and(|e| {
        e.message()
            .to_ascii_lowercase()
            .contains("duplicate column")
    })
}

fn fill(sql: &str, prefix: &str) -> String {
    sql.replace("{locks}", &format!("{prefix}locks"))
        .replace("{readers}", &format!("{prefix}readers"))
        .replace("{waiters}", &format!("{prefix}waiters"))
        .replace("{schema}", &format!("{prefix}schema_version"))
}

/// Brings the schema up to [`SCHEMA_VERSION`].
///
/// Every statement goes in the simple protocol (`raw_sql`), without parameters:
/// no prepared statement is left in a session. On PostgreSQL the whole migration
/// is one transaction under a transaction-scoped advisory lock: the schema changes
/// all at once or not at all (its DDL is transactional), and nothing of it outlives
/// the transaction — behind a transaction pooler ([`crate::JdbcPooler`]), a
/// session's advisory lock or prepared statement would be left on a server session
/// other clients use next.
pub(crate) async fn migrate(pool: &Pool, prefix: &str) -> Result<()> {
    let dialect = pool.dialect();
    let backend = dialect.name();
    let err = |e| map_sqlx(e, backend, "migrate");
    // The key is the validated prefix (identifier characters) and a suffix of ours
    // (SQLite's write lock needs none).
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    let lock_key = format!("{prefix}migrate");
    /// Applies the migrations not yet recorded, on `$conn`.
    macro_rules! apply {
        ($conn:expr) => {{
            let create_version = fill(
                "CREATE TABLE IF NOT EXISTS {schema} (version BIGINT NOT NULL PRIMARY KEY, applied_at BIGINT NOT NULL)",
                prefix,
            );
            sqlx::raw_sql(AssertSqlSafe(create_version)).execute(&mut *$conn).await.map_err(err)?;
            let current: i64 = sqlx::raw_sql(AssertSqlSafe(fill("SELECT COALESCE(MAX(version), 0) FROM {schema}", prefix)))
                .fetch_one(&mut *$conn).await.map_err(err)?
                .try_get(0).map_err(err)?;
            if current > SCHEMA_VERSION {
                return Err(Error::new(ErrorKind::Config, format!(
                    "the database's dlock schema is version {current}, newer than this dlock's {SCHEMA_VERSION}; upgrade dlock or use another table prefix"
                )));
            }
            for m in MIGRATIONS.iter().filter(|m| m.version > current) {
                let statements = match dialect {
                    Dialect::Sqlite => m.sqlite,
                    Dialect::MySql => m.mysql,
                    Dialect::Postgres => m.postgres,
                };
                for sql in statements {
                    match sqlx::raw_sql(AssertSqlSafe(fill(sql, prefix))).execute(&mut *$conn).await {
                        // (PostgreSQL's statements say `IF NOT EXISTS`, and a failed
                        // one aborts its transaction: nothing to pass over there.)
                        Err(e) if dialect == Dialect::Postgres || !already_applied(&e) => {
                            return Err(err(e))
                        }
                        _ => {}
                    }
                }
                let record = match dialect {
                    Dialect::Sqlite => "INSERT OR IGNORE INTO {schema} (version, applied_at) VALUES (VERSION, 0)",
                    Dialect::MySql => "INSERT IGNORE INTO {schema} (version, applied_at) VALUES (VERSION, 0)",
                    Dialect::Postgres => "INSERT INTO {schema} (version, applied_at) VALUES (VERSION, 0) ON CONFLICT DO NOTHING",
                };
                let record = fill(record, prefix).replace("VERSION", &m.version.to_string());
                sqlx::raw_sql(AssertSqlSafe(record)).execute(&mut *$conn).await.map_err(err)?;
            }
            Ok::<(), Error>(())
        }};
    }
    match pool {
        #[cfg(feature = "postgres")]
        Pool::Postgres(p) => {
            // Dropped before the commit, the transaction is rolled back (sqlx's
            // `Transaction`), and its lock goes with it. READ COMMITTED whatever the
            // server's default: each statement sees what a migration that held the
            // lock before committed (under REPEATABLE READ the snapshot would be the
            // lock statement's, taken before its wait: the versions read as not
            // applied, and recording them again a serialization failure).
            let mut tx = p
                .begin_with("BEGIN ISOLATION LEVEL READ COMMITTED")
                .await
                .map_err(err)?;
            let lock = format!("SELECT pg_advisory_xact_lock(hashtext('{lock_key}'))");
            sqlx::raw_sql(AssertSqlSafe(lock))
                .execute(&mut *tx)
                .await
                .map_err(err)?;
            async { apply!(tx) }.await?;
            tx.commit().await.map_err(err)
        }
        #[cfg(feature = "mysql")]
        Pool::MySql(p) => {
            let mut conn = p.acquire().await.map_err(err)?;
            // Serialise concurrent first connects.
            let lock = format!("SELECT GET_LOCK('{lock_key}', 30)");
            sqlx::raw_sql(AssertSqlSafe(lock))
                .execute(&mut *conn)
                .await
                .map_err(err)?;
            let applied: Result<()> = async { apply!(conn) }.await;
            let unlock = format!("SELECT RELEASE_LOCK('{lock_key}')");
            let _ = sqlx::raw_sql(AssertSqlSafe(unlock))
                .execute(&mut *conn)
                .await;
            applied
        }
        // SQLite's write lock serialises concurrent first connects.
        #[cfg(feature = "sqlite")]
        Pool::Sqlite(p) => {
            let mut conn = p.acquire().await.map_err(err)?;
            async { apply!(conn) }.await
        }
    }
}
