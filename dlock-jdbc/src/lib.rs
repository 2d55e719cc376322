//! # dlock-jdbc — SQL backend for dlock
//!
//! A [`LockRemoteResource`](dlock_spi::LockRemoteResource) on `sqlx` for SQLite,
//! MariaDB/MySQL and PostgreSQL (features `sqlite`, `mysql`, `postgres`).
//!
//! ```no_run
//! # async fn demo() -> dlock_spi::Result<()> {
//! let backend = dlock_jdbc::JdbcBackend::connect("sqlite://locks.db").await?;
//! # Ok(()) }
//! ```
//!
//! ## URLs
//!
//! | URL | database |
//! |---|---|
//! | `sqlite://path/to/locks.db` | SQLite file (created if missing; WAL mode, 5 s busy timeout) |
//! | `mysql://user:pass@127.0.0.1:3306/db` (or `mariadb://…`) | MariaDB 10.6+ / MySQL 8 |
//! | `postgres://user@127.0.0.1:5432/db` | PostgreSQL 12+ |
//!
//! With the `tls` feature, MySQL and PostgreSQL connect over TLS as their URL
//! parameters say (`?sslmode=verify-full&sslrootcert=ca.pem`,
//! `?ssl-mode=VERIFY_IDENTITY&ssl-ca=ca.pem`). The TLS is sqlx's: rustls with ring
//! as a provider of its own for each connection. It neither reads nor installs the
//! process's default crypto provider, so an application's choice there is left
//! alone but not used for SQL (sqlx 0.9 takes no provider; its rustls features are
//! being reworked upstream, sqlx RFC #4408).
//!
//! dlock's own options ride in the query string and are removed before the URL
//! reaches the driver: `dlock_table_prefix=dlock_` (tables `<prefix>locks`,
//! `<prefix>readers`, `<prefix>schema_version`), `dlock_pool_max=10`,
//! `dlock_acquire_timeout=5s` (how long connecting, and waiting for a free
//! connection of the pool, may take: `500ms`, `30s`, `1m`),
//! `dlock_migrate=false` (do not create tables; an operator applied them),
//! `dlock_wake_sessions=4` (MariaDB/MySQL: the connections waiters block on, see
//! [`JdbcOptions::wake_sessions`]; `0`: waiters poll), `dlock_local_notices=true`
//! (SQLite: release notices among this host's processes, see
//! [`JdbcOptions::local_notices`]; `false`: waiters poll), `dlock_mode=session`
//! (PostgreSQL: advisory locks; MariaDB: named locks; see below) with
//! `dlock_session_timeout=10s`, `dlock_tls=verified` (refuse a connection that does
//! not verify the server's certificate — the drivers' default `prefer` and
//! `require` do not: see [`JdbcOptions::verified_tls`]).
//!
//! ### PostgreSQL and MariaDB: the session mode (opt-in)
//!
//! `dlock_mode=session` ([`JdbcMode::Session`]) holds each lock as a session-level
//! advisory lock on a connection kept for the hold: one round trip per acquire and
//! per release, no commit, waits blocked in the server (`pg_advisory_lock` with a
//! `lock_timeout`), exclusive and shared locks, fencing tokens from a sequence. A
//! hold has no lease: it lasts until released or its session ends, and a client
//! that vanishes has its locks freed by the server within the session timeout
//! (PostgreSQL 14+'s `idle_session_timeout`). No fair queues, semaphores,
//! downgrades or upgrades (`Unsupported`). Refused behind a transaction pooler. A
//! session ended from outside (`pg_terminate_backend`, a restart, a reset
//! connection) frees the lock with no margin: guard writes with the fencing token
//! (SAFETY.md, "SQL, session modes"). The row mode stays the default.
//!
//! On MariaDB (10.5 or later: its tokens come from a `SEQUENCE`; MySQL has none and
//! is refused) a hold is a named lock (`GET_LOCK`): exclusive only (a shared
//! request is `Unsupported`), one round trip per acquire (a try: one prepared
//! statement; a wait: two statements in one query) and per release, holders
//! recorded in a `MEMORY` table (no commit), waits blocked in the
//! server in slices of at most a second (a dropped wait is ended with `KILL
//! QUERY`), and the session timeout as the hold session's `wait_timeout` (whole
//! seconds, rounded up).
//!
//! A pooled connection idle for half a second or more is checked (pinged) before
//! it is used, and replaced if the server has ended it; one used more recently is
//! used as it is — sqlx's default checks every one, a round trip per statement.
//! Each connection that died within that half second fails the one statement
//! handed it with a retryable error, and is then replaced (as with HikariCP).
//! A pool the application hands over ([`JdbcBackend::from_pool`]) keeps its own
//! settings.
//!
//! ### PostgreSQL: asynchronous commit (opt-in)
//!
//! By default every grant and renewal is a durable commit: it returns once
//! PostgreSQL has flushed its WAL record, which is most of an uncontended cycle's
//! time. The release of an exclusive lock and a waiter's queue entry (and its
//! removal) commit asynchronously whatever the setting: a crash that forgets one
//! leaves the lock held until its lease ends (nobody uses it meanwhile), or a
//! waiter's place to be written again at its next refresh — never a second holder
//! — and the next grant's flush makes them durable with it. (Every other write
//! stays durable: a term of leadership's end, which observers act on, and read-lock
//! and permit releases.) `options[synchronous_commit]=off` in the URL (sqlx's way
//! of setting a session parameter; it reaches every session of the backend's pool)
//! makes every grant, renewal and other write commit asynchronously too — about
//! 1.3× the cycles per second on one task (BENCHMARKS.md) — with the lease and the
//! fencing token unchanged. What it
//! costs: a PostgreSQL **crash** (not a clean shutdown) forgets the commits of up
//! to its last `3 × wal_writer_delay` (600 ms by default), and a forgotten grant
//! lets the lock be granted again while its first holder still works, as a Redis
//! failover without replica acknowledgement can. Tokens stay increasing across it
//! (each is at least the database clock in µs), so a resource that checks fencing
//! tokens still refuses the older holder. Use it where the lock saves work rather
//! than guards correctness, or where the guarded resource checks tokens. MariaDB
//! and MySQL have no per-session equivalent (`innodb_flush_log_at_trx_commit` is
//! global).
//!
//! ## Semantics
//!
//! * **Time is the database's**: leases are compared with the database clock in
//!   milliseconds (`julianday('now')`, `NOW(3)` in UTC, `statement_timestamp()`).
//! * **Acquire** is one atomic statement on every dialect: an upsert guarded by "free,
//!   expired, or mine" that also bumps the fencing counter (`RETURNING` on SQLite and
//!   PostgreSQL; `LAST_INSERT_ID(expr)` on MariaDB/MySQL). **Release** and **renew** are
//!   single `UPDATE`s guarded by the owner and the lease. Shared (read) holds use short
//!   transactions that lock the lock's row first.
//! * **Semaphores**: the permit holders live in the semaphore's own row (a JSON
//!   array of owner, permits, lease, token); a grant is one `UPDATE` of that row,
//!   decided on the live holders' permits, in arrival order, and a release or renewal
//!   is one `UPDATE` too — the writes of an exclusive lock's cycle.
//! * **Fencing tokens** live in the lock's row, which outlives releases, and advance
//!   as `token = max(token + 1, database clock in µs)`: strictly increasing, and still
//!   above every earlier token if the row is deleted and recreated later — later than
//!   the clock's resolution: µs on MariaDB/MySQL and PostgreSQL, ms on SQLite (a row
//!   deleted and recreated within the millisecond of its last grant could repeat it).
//! * **Waiting** polls with [`Backoff`](dlock_spi::Backoff) (equal jitter), never past
//!   the deadline and never past the holder's lease end; on PostgreSQL a release with
//!   a waiter queued also sends `NOTIFY` (so does the end of a term of leadership, for
//!   the election's observers), and the waiter it names wakes at once — a queued
//!   writer there waits for that notice, pausing the backoff's longest delay between
//!   looks of its own (half to all of it, with equal jitter; a lost notice, a waiter
//!   ahead gone without a release, cost it that long). SQLite's processes on one
//!   host send each other the same notices over Unix datagram sockets beside the
//!   database file, and its waiters wait for them as PostgreSQL's do (on Unix; see
//!   `local_bus`). On
//!   MariaDB/MySQL a waiter for an exclusive lock blocks inside the server on the
//!   *bell* of the waiter just ahead of it in the queue (or of the holder): a named
//!   lock (`GET_LOCK`) of its own that each waiter takes, and that a hold granted after
//!   such a wait keeps and lets go right after its release, which wakes the waiter
//!   behind it; the row still decides every grant (see [`JdbcOptions::wake_sessions`]).
//! * **Waiters queue** in a table of their own (arrival and liveness on the database
//!   clock; a waiter re-checks at least every third of its liveness, a crashed one
//!   lapses, a cancelled one leaves at once). **Fair mode** grants in arrival order:
//!   a free lock goes to the earliest live waiter (readers together, up to the first
//!   waiting writer). **Non-fair mode** lets newcomers take a free lock ahead of the
//!   queue, until a queued waiter has waited [`JdbcOptions::starvation_after`]; then
//!   it goes first, so no waiter starves. In both modes new readers stand back for a
//!   writer queued before them.
//! * Names are bound parameters, never SQL text; names longer than
//!   [`MAX_NAME_LEN`] bytes are refused with `InvalidName`.
//!
//! ## Privileges
//!
//! Connecting migrates by default, which needs `CREATE` on the database (PostgreSQL:
//! on the schema). At run time the user needs `SELECT, INSERT, UPDATE, DELETE` on the
//! three tables; with `dlock_migrate=false` that is all.
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(not(any(feature = "sqlite", feature = "mysql", feature = "postgres")))]
compile_error!(
    "dlock-jdbc: enable at least one database feature: `sqlite`, `mysql` or `postgres` (dlock-api: the features of the same names)"
);

mod backend;
#[cfg(feature = "mysql")]
mod bell;
#[cfg(not(feature = "mysql"))]
#[path = "bell_off.rs"]
mod bell;
mod config;
mod connect;
mod departures;
mod dialect;
mod error;
mod grant;
mod holds;
mod inline;
mod listener;
#[cfg(all(feature = "sqlite", unix))]
mod local_bus;
#[cfg(not(all(feature = "sqlite", unix)))]
#[path = "local_bus_off.rs"]
mod local_bus;
mod migrate;
mod param;
mod permits;
pub(crate) mod pool;
mod queue;
mod renew_batch;
mod run_to_end;
mod session;
mod statements;
mod wait;
mod wakeups;

pub use backend::JdbcBackend;
pub use config::{JdbcMode, JdbcOptions, JdbcPooler};
#[cfg(feature = "mysql")]
pub use connect::prepare_mysql_session;
#[cfg(feature = "sqlite")]
pub use connect::sqlite_file;
pub use dialect::Dialect;
pub use migrate::SCHEMA_VERSION;
pub use pool::Pool as SqlPool;

/// The sqlx version dlock-jdbc is built on, for code that uses [`SqlPool`].
pub use sqlx;

/// The longest lock name stored, in bytes (the width of MySQL's key column).
pub const MAX_NAME_LEN: usize = 512;

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
