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
//! (SAFETY.md, "The SQL session modes"). The row mode stays the default.
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
//! * **Waiting** polls with [`Backoff`] (equal jitter), never past
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
mod departures;
mod dialect;
mod error;
mod grant;
mod holds;
mod inline;
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
mod run_to_end;
mod session;
mod statements;
mod wait;
mod wakeups;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use dlock_spi::{redact_url, Backoff, Error, ErrorKind, Result};

pub use backend::JdbcBackend;
pub use dialect::Dialect;
pub use migrate::SCHEMA_VERSION;
pub use pool::Pool as SqlPool;

/// The sqlx version dlock-jdbc is built on, for code that uses [`SqlPool`].
pub use sqlx;

use crate::backend::Inner;
use crate::pool::Pool;
use crate::statements::{validate_prefix, Statements};
use crate::wakeups::Wakeups;

/// The longest lock name stored, in bytes (the width of MySQL's key column).
pub const MAX_NAME_LEN: usize = 512;

/// Settings of a [`JdbcBackend`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct JdbcOptions {
    /// Prefix of the table names (identifier characters only). Default `dlock_`.
    pub table_prefix: String,
    /// Most connections in the pool the statements run on (1 is enough). Default 10.
    /// Beside it, PostgreSQL keeps one session listening for release notices, and
    /// MariaDB/MySQL up to [`Self::wake_sessions`] sessions waiters block on.
    pub max_connections: u32,
    /// How long to wait for a free connection of the pool, and for a new connection
    /// to be established (URL `dlock_acquire_timeout=`); on MariaDB/MySQL it also
    /// bounds each statement on a wake-up session beyond its own wait (a release
    /// lets its bell go before it answers). Default 5 s.
    pub acquire_timeout: Duration,
    /// Delays between polls of a waiting acquire. Default 5 ms doubling to 250 ms,
    /// equal jitter. A queued PostgreSQL writer, which the release notice names,
    /// pauses the longest delay between looks of its own from its second on (each
    /// still cut at the holder's lease end, a third of its queue liveness and its
    /// deadline): a longest delay of seconds, as MariaDB/MySQL waiters may want
    /// (below), makes a lost notice cost that long there.
    pub backoff: Backoff,
    /// Create or upgrade the tables on connect. Default true.
    pub migrate: bool,
    /// How long a queued waiter stays in the queue without re-checking; a waiter
    /// re-checks at least every third of it, so only a crashed waiter lapses.
    /// Default 3 s.
    pub waiter_liveness: Duration,
    /// Non-fair mode: how long a queued waiter may be passed by callers that arrived
    /// after it (barging, for throughput). Once it has waited this long it goes
    /// first, so no waiter starves. Default 20 ms.
    pub starvation_after: Duration,
    /// MariaDB/MySQL: how many dedicated connections waiting acquires may block on
    /// (URL `dlock_wake_sessions=`). A waiter for an exclusive lock takes a named
    /// lock of its own (`GET_LOCK`) and blocks inside the server on the one of the
    /// waiter just ahead of it in the queue (first in the queue: the holder's),
    /// which that waiter lets go when it gives up, or, granted, right after its
    /// release commits: the hand-over takes a round trip, not a poll, and wakes only
    /// the next waiter. A waiter keeps its session for its whole wait; one that
    /// finds no session free polls with [`Self::backoff`]; `0` turns this off.
    /// MySQL reads `GET_LOCK`'s timeout in whole seconds (MariaDB takes fractions),
    /// so there a waiter blocks only for the whole seconds its wait allows, and
    /// polls when that is less than one: with the default backoff, whose longest
    /// delay is 250 ms, it always polls — give MySQL waiters a backoff whose longest
    /// delay is a few seconds (and a `waiter_liveness` of at least three times it)
    /// for them to block. Each session is connected when first needed, and a hold
    /// that was granted after such a wait keeps its session until its release.
    /// Ignored by SQLite and PostgreSQL (PostgreSQL wakes waiters with `NOTIFY`).
    /// Default 4.
    pub wake_sessions: u32,
    /// SQLite (on Unix): whether this backend sends and receives release notices
    /// among the processes of this host that use the database file (URL
    /// `dlock_local_notices=`): Unix datagram sockets in a directory beside the
    /// file (`<file>-dlock-wake/`, created with the process's umask), through
    /// which a release wakes the waiter first in the lock's queue at once, as
    /// `NOTIFY` does on PostgreSQL; a queued writer then waits for its notice,
    /// pausing the backoff's longest delay between looks of its own. A notice
    /// only says when to look at the lock: a lost or forged one costs waiting
    /// time, never a double grant. `false`: waiters poll with [`Self::backoff`]
    /// alone, and releases send no notice — turn it off in every process sharing
    /// the file or in none, or a told waiter learns of those releases only at its
    /// own next look. A file whose path is too long for a socket address beside it
    /// (about 70 bytes) has no notices. Ignored by MariaDB/MySQL and PostgreSQL.
    /// Default true.
    pub local_notices: bool,
    /// How locks are held (URL `dlock_mode=row|session`). Default
    /// [`JdbcMode::Row`].
    pub mode: JdbcMode,
    /// Session mode: how long the server keeps the session of a client that went
    /// silent (URL `dlock_session_timeout=`; PostgreSQL's `idle_session_timeout`,
    /// MariaDB's `wait_timeout` in whole seconds rounded up, on each hold session). A vanished client's locks come free within it; a
    /// holder that cannot reach its session for half of it declares the hold lost,
    /// and closes the session only when the server would have ended it (the whole
    /// timeout after its last answered probe), so the lost signal leads the next
    /// grant by half of it. At least 1 s. Default 10 s.
    pub session_timeout: Duration,
    /// What stands between dlock and the database (URL `dlock_pooler=none|transaction`).
    /// Default [`JdbcPooler::None`].
    pub pooler: JdbcPooler,
    /// Refuse a connection that does not verify the server's certificate (URL
    /// `dlock_tls=verified`): the URL's TLS mode must verify it — PostgreSQL
    /// `sslmode=verify-full` or `verify-ca`, MySQL/MariaDB `ssl-mode=VERIFY_IDENTITY`
    /// or `VERIFY_CA` — and one that names none gets `verify-full` /
    /// `VERIFY_IDENTITY` (checked against the Mozilla roots, or the CA the URL
    /// names with `sslrootcert=` / `ssl-ca=`). A weaker mode in the URL
    /// (`prefer`, the drivers' default, and `require` encrypt without checking
    /// who answers) is a [`ErrorKind::Config`] error, as is the option on SQLite
    /// (a file: nothing to verify) and without the `tls` feature. Applies to
    /// [`JdbcBackend::connect`] and its kin, not to an application's own pool
    /// ([`JdbcBackend::from_pool`]). Default false: the URL's mode as the driver
    /// reads it.
    pub verified_tls: bool,
}

/// A connection pooler between dlock and the database ([`JdbcOptions::pooler`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum JdbcPooler {
    /// None: each connection of the pool is a session of the database's own.
    #[default]
    None,
    /// PostgreSQL behind a pooler in transaction mode (PgBouncer's
    /// `pool_mode = transaction`, the default of most managed poolers), which gives
    /// each transaction whichever server session is free. The row mode then keeps
    /// nothing in a session: each statement goes in the simple protocol, its
    /// parameters written into its text as escaped, typed literals (sqlx's prepared
    /// statements are per session: behind such a pooler they fail with `prepared
    /// statement "sqlx_s_1" already exists` or `does not exist`); the migration
    /// runs in one transaction under a transaction-scoped advisory lock; and there
    /// is no `LISTEN` session, so waiters poll with [`JdbcOptions::backoff`]
    /// instead of waking on release notices, and election followers and observers
    /// poll too (the backend offers no change events). Rows come back as text
    /// there: contexts are read in PostgreSQL's `bytea_output = hex` (its default
    /// since 9.0; a role or database set to `escape` makes `inspect` fail). No
    /// client may `LISTEN` through the pooler — a dlock connected there without this
    /// option does: the server session it listened on keeps listening after it
    /// leaves and hands its notifications to whichever client the pooler gives it
    /// next, which sqlx refuses (`unexpected message: NotificationResponse`). Set
    /// the option on every dlock behind the pooler. Guarantees are those of the row mode
    /// (every hold is a row with its lease). The session mode needs a session and
    /// refuses this ([`ErrorKind::Config`]), as do MariaDB/MySQL and SQLite.
    Transaction,
}

/// How a SQL backend holds its locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum JdbcMode {
    /// A row per hold, with a lease the watchdog renews (every database; works
    /// behind a transaction pooler). Fair queues, semaphores, read-write locks
    /// with downgrades and upgrades.
    #[default]
    Row,
    /// PostgreSQL and MariaDB 10.5+: a hold is a session-level lock of the
    /// database's own (PostgreSQL's advisory locks, MariaDB's named locks) on a
    /// connection kept for it — one round trip per acquire and per release, no
    /// commit, waits blocked in the server; lost when its session ends (no lease).
    /// Fencing tokens from a sequence; shared locks on PostgreSQL only; no fair
    /// queues, semaphores, downgrades or upgrades. Refused behind a pooler that
    /// shares sessions. See the crate docs.
    Session,
}

impl Default for JdbcOptions {
    fn default() -> Self {
        JdbcOptions {
            table_prefix: "dlock_".to_owned(),
            max_connections: 10,
            acquire_timeout: Duration::from_secs(5),
            backoff: Backoff::default(),
            migrate: true,
            waiter_liveness: Duration::from_secs(3),
            starvation_after: Duration::from_millis(20),
            wake_sessions: 4,
            local_notices: true,
            mode: JdbcMode::Row,
            session_timeout: Duration::from_secs(10),
            pooler: JdbcPooler::None,
            verified_tls: false,
        }
    }
}

impl JdbcOptions {
    /// Sets the table prefix.
    pub fn table_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.table_prefix = prefix.into();
        self
    }

    /// Sets the pool size.
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n;
        self
    }

    /// Sets how long to wait for a free connection.
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }

    /// Sets the polling backoff.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Sets whether to migrate on connect.
    pub fn migrate(mut self, migrate: bool) -> Self {
        self.migrate = migrate;
        self
    }

    /// Sets how long a queued waiter stays queued without re-checking (at least
    /// 30 ms; shorter values are raised to it).
    pub fn waiter_liveness(mut self, liveness: Duration) -> Self {
        self.waiter_liveness = liveness.max(Duration::from_millis(30));
        self
    }

    /// Sets how long a queued waiter may be passed in non-fair mode before it goes
    /// first (`Duration::ZERO`: never passed, like fair mode).
    pub fn starvation_after(mut self, after: Duration) -> Self {
        self.starvation_after = after;
        self
    }

    /// Sets how many wake-up sessions waiters may block on (MariaDB/MySQL; `0`:
    /// waiters poll).
    pub fn wake_sessions(mut self, sessions: u32) -> Self {
        self.wake_sessions = sessions;
        self
    }

    /// Sets how locks are held ([`JdbcMode`]).
    pub fn mode(mut self, mode: JdbcMode) -> Self {
        self.mode = mode;
        self
    }

    /// Sets the session mode's session timeout (at least 1 s; shorter values are
    /// raised to it).
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout.max(Duration::from_secs(1));
        self
    }

    /// Sets what stands between dlock and the database ([`JdbcPooler`]).
    pub fn pooler(mut self, pooler: JdbcPooler) -> Self {
        self.pooler = pooler;
        self
    }

    /// Sets whether SQLite waiters wake on release notices from this host's
    /// processes ([`Self::local_notices`]; `false`: they poll).
    pub fn local_notices(mut self, on: bool) -> Self {
        self.local_notices = on;
        self
    }

    /// Sets whether a connection that does not verify the server's certificate is
    /// refused ([`Self::verified_tls`]).
    pub fn verified_tls(mut self, on: bool) -> Self {
        self.verified_tls = on;
        self
    }
}

/// `url` (dlock's options already taken off) with a TLS mode that verifies the
/// server's certificate ([`JdbcOptions::verified_tls`]): the mode it names if that
/// one verifies, the strictest one if it names none; an error naming the mode
/// otherwise (and for SQLite, or without the `tls` feature). Nothing else of the
/// URL is echoed.
fn verified_tls_url(url: &str, scheme: &str) -> Result<String> {
    let refuse = |what: String| Err(Error::new(ErrorKind::Config, what));
    // The keys and values as sqlx reads them (`sqlx-postgres`, `sqlx-mysql`: either
    // key, the value in any case).
    #[allow(clippy::type_complexity)]
    let (keys, verifying, ca_keys, strictest, example): (&[&str], [&str; 2], &[&str], &str, &str) = match scheme {
        "postgres" | "postgresql" => (
            &["sslmode", "ssl-mode"],
            ["verify-full", "verify-ca"],
            &["sslrootcert", "ssl-root-cert", "ssl-ca"],
            "sslmode=verify-full",
            "sslmode=verify-full&sslrootcert=ca.pem",
        ),
        "mysql" | "mariadb" => (
            &["ssl-mode", "sslmode"],
            ["verify_identity", "verify_ca"],
            &["ssl-ca"],
            "ssl-mode=VERIFY_IDENTITY",
            "ssl-mode=VERIFY_IDENTITY&ssl-ca=ca.pem",
        ),
        _ => {
            return refuse(format!(
                "dlock_tls=verified (JdbcOptions::verified_tls) is for MySQL/MariaDB and PostgreSQL; {scheme}:// opens a file, with no connection to verify (drop the option)"
            ))
        }
    };
    if !cfg!(feature = "tls") {
        return refuse(
            "dlock_tls=verified (JdbcOptions::verified_tls) needs dlock-jdbc's \"tls\" feature (dlock-api: \"sql-tls\"); enable it in Cargo.toml".to_owned(),
        );
    }
    // A fragment ends the query for the driver (whatever follows `#` is not read),
    // and it drops tabs and line breaks: a URL with either is not read here as the
    // driver reads it, so it is refused rather than judged.
    if url.contains('#') || url.chars().any(|c| c.is_ascii_control()) {
        return refuse(
            "dlock_tls=verified: the URL has a fragment (#…) or a control character, which the driver reads differently; remove it".to_owned(),
        );
    }
    // Decoded as the driver decodes the query, and the last one named: the driver
    // applies each in turn, so the last is the one that holds.
    let query = url.split_once('?').map_or("", |(_, q)| q);
    let named = url::form_urlencoded::parse(query.as_bytes())
        .filter(|(key, _)| keys.contains(&key.as_ref()))
        .last();
    // `verify-ca` checks the chain, not the name: against the public roots any
    // publicly issued certificate passes, so it counts only with a CA of the URL's.
    let names_a_ca = url::form_urlencoded::parse(query.as_bytes())
        .any(|(key, _)| ca_keys.contains(&key.as_ref()));
    match named {
        Some((key, value))
            if value.eq_ignore_ascii_case(verifying[1]) && !names_a_ca =>
        {
            refuse(format!(
                "dlock_tls=verified: the URL's {key}={value} checks the certificate's chain but not the server's name, and names no CA: against the public roots any publicly issued certificate passes; name the CA that signed the server's certificate ({example}) or use {strictest}"
            ))
        }
        Some((_, value)) if verifying.iter().any(|v| value.eq_ignore_ascii_case(v)) => {
            Ok(url.to_owned())
        }
        Some((key, value)) => refuse(format!(
            "dlock_tls=verified: the URL's {key}={value} does not verify the server's certificate (it encrypts without checking who answers); use {example} (the CA that signed the server's certificate), or drop dlock_tls=verified"
        )),
        None if url.contains('?') => Ok(format!("{url}&{strictest}")),
        None => Ok(format!("{url}?{strictest}")),
    }
}

/// [`JdbcOptions::verified_tls`]'s second guard: the driver read the URL (after
/// [`verified_tls_url`]) as a mode that does not verify the server.
#[cfg(any(feature = "mysql", feature = "postgres"))]
fn unverified_as_read() -> Error {
    Error::new(
        ErrorKind::Config,
        "dlock_tls=verified: the driver reads the URL's TLS mode as one that does not verify the server's certificate; name sslmode=verify-full (PostgreSQL) or ssl-mode=VERIFY_IDENTITY (MySQL) once, with the CA",
    )
}

/// dlock's own URL options, each `dlock_*`: what [`split_options`] takes.
const OWN_OPTIONS: &[&str] = &[
    "dlock_table_prefix",
    "dlock_pool_max",
    "dlock_wake_sessions",
    "dlock_local_notices",
    "dlock_mode",
    "dlock_pooler",
    "dlock_session_timeout",
    "dlock_migrate",
    "dlock_tls",
    "dlock_acquire_timeout",
];

/// Splits dlock's own `dlock_*` query parameters off a URL (the rest is the
/// driver's, as written); a `dlock_*` key dlock does not know is refused.
fn split_options(url: &str, mut options: JdbcOptions) -> Result<(String, JdbcOptions)> {
    let url = dlock_spi::DriverUrl::split(url, |key| key.starts_with("dlock_"))?;
    for (key, value) in url.own_options() {
        let (key, value) = (key.as_str(), value.as_str());
        let bad = |what: &str| url.option_error(key, value, what);
        let flag = || {
            value
                .parse::<bool>()
                .map_err(|_| bad("expected true or false"))
        };
        match key {
            "dlock_table_prefix" => options.table_prefix = value.to_owned(),
            "dlock_pool_max" => {
                options.max_connections = value
                    .parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| bad("expected a positive number of connections"))?;
            }
            "dlock_wake_sessions" => {
                options.wake_sessions = value
                    .parse()
                    .map_err(|_| bad("expected a number of sessions (0 turns them off)"))?;
            }
            "dlock_local_notices" => options.local_notices = flag()?,
            "dlock_mode" => {
                options.mode = match value {
                    "row" => JdbcMode::Row,
                    "session" => JdbcMode::Session,
                    _ => return Err(bad("expected row or session")),
                };
            }
            "dlock_pooler" => {
                options.pooler = match value {
                    "none" => JdbcPooler::None,
                    "transaction" => JdbcPooler::Transaction,
                    _ => return Err(bad("expected none or transaction (a pooler in transaction mode, such as PgBouncer's)")),
                };
            }
            "dlock_session_timeout" => {
                options.session_timeout = url.duration(key, value, Duration::from_secs(1))?;
            }
            "dlock_migrate" => options.migrate = flag()?,
            "dlock_tls" => {
                options.verified_tls = match value {
                    "verified" => true,
                    "driver" => false,
                    _ => return Err(bad("expected verified (refuse a connection that does not verify the server's certificate) or driver (the URL's TLS mode as the driver reads it)")),
                };
            }
            "dlock_acquire_timeout" => {
                options.acquire_timeout = url.duration(key, value, Duration::ZERO)?;
            }
            _ => {
                return Err(bad(&format!(
                    "dlock has no such option (known: {}); the driver's own options have no dlock_ prefix",
                    OWN_OPTIONS.join(", ")
                )))
            }
        }
    }
    Ok((url.driver_url().to_owned(), options))
}

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
        probe.map_err(|e| {
            if matches!(e, sqlx::Error::PoolTimedOut) {
                // Only the bound above gives this: the server took the connection
                // and did not answer in time (hung, overloaded, or a partition).
                return Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "cannot connect to {}: no answer within {:?}; check that the server runs and is not overloaded, or wait longer (dlock_acquire_timeout=30s in the URL, JdbcOptions::acquire_timeout)",
                        redact_url(&url),
                        options.acquire_timeout
                    ),
                );
            }
            // A refused TLS handshake (rustls' errors reach sqlx as invalid data) is
            // the configuration's to fix, as a bad URL is; retrying will not help.
            let tls = matches!(&e, sqlx::Error::Tls(_))
                || matches!(&e, sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::InvalidData);
            if let Some(param) = crate::error::refused_startup_parameter(&e) {
                return Error::new(
                    ErrorKind::Config,
                    format!(
                        "cannot connect to {}: {e}; a pooler between dlock and PostgreSQL (PgBouncer) refuses the startup parameter {param} that the driver sends: add `ignore_startup_parameters = {param}` to its configuration (pgbouncer.ini)",
                        redact_url(&url)
                    ),
                );
            }
            // A database's answer is the configuration's to fix (a wrong password, a
            // missing database) unless it refused the connection for now.
            let transient = crate::error::is_transient_answer(&e);
            let retryable = transient
                || (!tls
                    && !matches!(e, sqlx::Error::Configuration(_) | sqlx::Error::Database(_)));
            let hint = if transient {
                "the database refused the connection for now (too many connections, starting up or shutting down); retry later"
            } else if tls {
                "the TLS handshake failed: check the CA the URL names (PostgreSQL: sslrootcert=…, MySQL: ssl-ca=…), that the URL's host is the one the server's certificate names, and that dlock-jdbc's `tls` feature is on"
            } else {
                "check that the server runs, the URL is right and the user may log in"
            };
            Error::new(
                if retryable { ErrorKind::Backend } else { ErrorKind::Config },
                format!("cannot connect to {}: {e}; {hint}", redact_url(&url)),
            )
            .set_retryable(retryable)
        })?;
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
            Pool::MySql(p) if options.wake_sessions > 0 => Some(bell::Bells::new(
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
                let sessions = session::$db::Sessions::open(
                    (*$p.connect_options()).clone(),
                    &options.table_prefix,
                    options.session_timeout,
                    options.acquire_timeout,
                    options.migrate,
                )
                .await?;
                let session = session::Sessions::$variant(Box::new(sessions));
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
    fn on_sessions(pool: Pool, options: JdbcOptions, session: session::Sessions) -> Self {
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
async fn check_mysql_session(pool: &sqlx::MySqlPool) -> Result<()> {
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

fn feature_of(scheme: &str) -> &'static str {
    match scheme {
        "sqlite" => "sqlite",
        "mysql" | "mariadb" => "mysql",
        _ => "postgres",
    }
}

fn config_error(url: &str, e: sqlx::Error) -> Error {
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
fn sqlite_options(url: &str) -> Result<sqlx::sqlite::SqliteConnectOptions> {
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
const LIVE_WITHOUT_CHECK: Duration = Duration::from_millis(500);

/// `pool`, checking only connections idle longer than [`LIVE_WITHOUT_CHECK`]
/// before handing them out.
fn checked_after_idle<DB: sqlx::Database>(
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
fn open_sqlite(url: &str, options: &JdbcOptions) -> Result<Pool> {
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
fn open_mysql(url: &str, options: &JdbcOptions) -> Result<Pool> {
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
fn open_postgres(url: &str, options: &JdbcOptions) -> Result<Pool> {
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

/// What carries release notices to a backend's waiters: the waiters' wake-ups, the
/// task that receives the notices, and (SQLite) the bus they are sent on.
type Listener = (
    Option<Arc<Wakeups>>,
    Option<dlock_spi::TaskGuard>,
    Option<local_bus::LocalBus>,
);

/// The pause before each try to listen again after the listener broke (waiters poll
/// meanwhile).
#[cfg(feature = "postgres")]
const RELISTEN_PAUSE: dlock_spi::Backoff =
    dlock_spi::Backoff::constant(Duration::from_millis(500)).with_jitter(dlock_spi::Jitter::None);

/// On PostgreSQL, one listener connection per backend carries release notices to
/// local waiters, on a session of its own beside the statements' pool (see
/// `listen`); on SQLite (Unix), the local bus of the database file
/// ([`local_bus`]). Elsewhere (or if listening fails) waiters just poll.
async fn start_listener(pool: &Pool, options: &JdbcOptions) -> Listener {
    #[cfg(all(feature = "sqlite", unix))]
    #[allow(irrefutable_let_patterns)] // SQLite may be the only database built in
    if let (Pool::Sqlite(p), true) = (pool, options.local_notices) {
        let wakeups = Arc::new(Wakeups::default());
        let file = p.connect_options().get_filename().to_path_buf();
        return match local_bus::LocalBus::open(&file, &options.table_prefix, Arc::clone(&wakeups)) {
            // A backend that cannot receive notices has no waiters to wake: they poll.
            // (The bus's own thread receives; it ends with the bus.)
            Ok((bus, true)) => (Some(wakeups), None, Some(bus)),
            Ok((bus, false)) => (None, None, Some(bus)),
            Err(e) => {
                tracing::warn!(error = %e, file = %file.display(), "dlock-jdbc: no release notices beside the SQLite file; waiters will poll only");
                (None, None, None)
            }
        };
    }
    #[cfg(feature = "postgres")]
    #[allow(irrefutable_let_patterns)] // PostgreSQL may be the only database built in
    if let Pool::Postgres(pg) = pool {
        let channel = format!("{}release", options.table_prefix);
        let change = format!("{}change", options.table_prefix);
        let channels = [channel.clone(), change];
        let listener = match listen(pg, options.acquire_timeout, &channels).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "dlock-jdbc: LISTEN failed; waiters will poll only");
                return (None, None, None);
            }
        };
        let wakeups = Arc::new(Wakeups::default());
        let relisten = Relisten {
            statements: pg.clone(),
            timeout: options.acquire_timeout,
            channels,
            target: Arc::clone(&wakeups),
        };
        let task = tokio::spawn(async move {
            RELISTEN.run(relisten, Some(listener)).await;
        });
        return (Some(wakeups), Some(dlock_spi::TaskGuard::new(task)), None);
    }
    let _ = (pool, options);
    (None, None, None)
}

/// The PostgreSQL listener, kept up by [`RELISTEN`]: notices wake waiters and
/// followers; when its connection fails, a new listener (its connection given back
/// now, not after the outage), and every waiter re-checks. sqlx's own reconnect is
/// not relied on: `try_recv` would reconnect and then wait for the next notice, the
/// missed ones never made up for — or, its connection reset rather than closed,
/// keep failing on it.
#[cfg(feature = "postgres")]
struct Relisten {
    statements: sqlx::PgPool,
    timeout: Duration,
    channels: [String; 2],
    target: Arc<Wakeups>,
}

#[cfg(feature = "postgres")]
impl dlock_spi::Subscription for Relisten {
    type Live = sqlx::postgres::PgListener;

    async fn subscribe(&mut self) -> Option<sqlx::postgres::PgListener> {
        match listen(&self.statements, self.timeout, &self.channels).await {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::debug!(error = %e, "dlock-jdbc: LISTEN failed again");
                None
            }
        }
    }

    async fn drain(&mut self, mut listener: sqlx::postgres::PgListener) -> dlock_spi::Drained {
        loop {
            // `try_recv` answers `None` when the connection dropped, once it has
            // connected and listened again, and an error when that failed.
            match listener.try_recv().await {
                Ok(Some(note)) => {
                    if note.channel() == self.channels[0] {
                        let notice = wakeups::ReleaseNotice::parse(note.payload());
                        self.target.wake(&notice);
                        self.target.changed(notice.name);
                    } else {
                        self.target.changed(note.payload());
                    }
                }
                // Listening again (sqlx reconnects before it answers): notices sent
                // meanwhile are lost.
                Ok(None) => self.target.notices_missed(),
                Err(e) => {
                    tracing::debug!(error = %e, "dlock-jdbc: release listener interrupted");
                    return dlock_spi::Drained::Broke;
                }
            }
        }
    }

    fn resubscribed(&mut self) {
        self.target.notices_missed();
    }
}

/// How the PostgreSQL listener listens again: 500 ms after it failed and between
/// failed tries (polling covers the gap).
#[cfg(feature = "postgres")]
const RELISTEN: dlock_spi::Resubscribe = dlock_spi::Resubscribe::new(RELISTEN_PAUSE);

/// A session listening on `channels`, with the connect options `statements` (the
/// statements' pool) has now — an application may change them, e.g. rotating
/// credentials — in a pool of its own: taken from `statements`, it would hold one
/// of its connections for as long as it listens.
#[cfg(feature = "postgres")]
async fn listen(
    statements: &sqlx::PgPool,
    timeout: Duration,
    channels: &[String],
) -> std::result::Result<sqlx::postgres::PgListener, sqlx::Error> {
    let own = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(timeout)
        .connect_lazy_with((*statements.connect_options()).clone());
    let mut listener = sqlx::postgres::PgListener::connect_with(&own).await?;
    listener
        .listen_all(channels.iter().map(String::as_str))
        .await?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_options_are_split_off_and_checked() {
        let (url, o) = split_options(
            "mysql://root@127.0.0.1/test?ssl-mode=disabled&dlock_table_prefix=x_&dlock_pool_max=3",
            JdbcOptions::default(),
        )
        .unwrap();
        assert_eq!(url, "mysql://root@127.0.0.1/test?ssl-mode=disabled");
        assert_eq!((o.table_prefix.as_str(), o.max_connections), ("x_", 3));
        let (url, o) =
            split_options("sqlite://a.db?dlock_migrate=false", JdbcOptions::default()).unwrap();
        assert_eq!((url.as_str(), o.migrate), ("sqlite://a.db", false));
        let (url, o) = split_options(
            "postgres://u@h/db?dlock_acquire_timeout=30s",
            JdbcOptions::default(),
        )
        .unwrap();
        assert_eq!(
            (url.as_str(), o.acquire_timeout),
            ("postgres://u@h/db", Duration::from_secs(30))
        );
        let (url, o) = split_options(
            "mysql://u@h/db?dlock_wake_sessions=0",
            JdbcOptions::default(),
        )
        .unwrap();
        assert_eq!((url.as_str(), o.wake_sessions), ("mysql://u@h/db", 0));
        let (url, o) = split_options(
            "postgres://u@h/db?dlock_mode=session&dlock_session_timeout=4s&sslmode=require",
            JdbcOptions::default(),
        )
        .unwrap();
        assert_eq!(
            (url.as_str(), o.mode, o.session_timeout),
            (
                "postgres://u@h/db?sslmode=require",
                JdbcMode::Session,
                Duration::from_secs(4)
            )
        );
        for bad in [
            "postgres://u@h/db?dlock_mode=advisory",
            "postgres://u@h/db?dlock_session_timeout=500ms",
            "postgres://u@h/db?dlock_session_timeout=later",
            "sqlite://a?dlock_wake_sessions=-1",
            "sqlite://a?dlock_wake_sessions=many",
            "sqlite://a?dlock_pool_max=0",
            "sqlite://a?dlock_migrate=maybe",
            "sqlite://a?dlock_acquire_timeout=soon",
            "sqlite://a?dlock_acquire_timeout=0",
            "postgres://u@h/db?dlock_tls=yes",
            "postgres://u:secret@h/db?dlock_tabel_prefix=x_",
            "postgres://u:secret@h/db?dlock_table_prefix=50%",
        ] {
            let message = split_options(bad, JdbcOptions::default())
                .err()
                .map(|e| e.message().to_owned())
                .unwrap_or_default();
            assert!(!message.contains("secret"), "{bad}: {message}");
            assert_eq!(
                split_options(bad, JdbcOptions::default())
                    .map(drop)
                    .map_err(|e| e.kind()),
                Err(ErrorKind::Config)
            );
        }
    }

    /// `dlock_tls=verified`: a verifying mode named in the URL is kept, none gets
    /// the strictest, a weaker one is refused naming it (and nothing else of the
    /// URL: its password stays out), as is SQLite.
    #[cfg(feature = "tls")]
    #[test]
    fn verified_tls_asks_for_a_verifying_mode_or_refuses() {
        let (url, o) = split_options(
            "postgres://u@h/db?dlock_tls=verified",
            JdbcOptions::default(),
        )
        .unwrap();
        assert!(o.verified_tls);
        assert_eq!(
            verified_tls_url(&url, "postgres").unwrap(),
            "postgres://u@h/db?sslmode=verify-full"
        );
        for kept in [
            "postgres://u@h/db?sslmode=verify-ca&sslrootcert=/ca.pem",
            "postgres://u@h/db?sslmode=verify-full",
            "mysql://u@h/db?ssl-mode=VERIFY_IDENTITY&ssl-ca=/ca.pem",
            "mariadb://u@h/db?sslmode=verify_ca&ssl-ca=/ca.pem",
        ] {
            let scheme = kept.split(':').next().unwrap();
            assert_eq!(verified_tls_url(kept, scheme).unwrap(), kept);
        }
        assert_eq!(
            verified_tls_url("mysql://u@h/db?ssl-ca=/ca.pem", "mysql").unwrap(),
            "mysql://u@h/db?ssl-ca=/ca.pem&ssl-mode=VERIFY_IDENTITY"
        );
        for refused in [
            // A fragment ends the driver's query; a tab is dropped by it.
            "postgres://u@h/db?sslmode=prefer#&sslmode=verify-full",
            "postgres://u@h/db#?sslmode=verify-full",
            "postgres://u@h/db?sslmode=verify-full&ssl\tmode=prefer",
            // verify-ca with no CA of the URL's: the public roots, no name check.
            "postgres://u@h/db?sslmode=verify-ca",
            "mysql://u@h/db?ssl-mode=VERIFY_CA",
        ] {
            let scheme = refused.split(':').next().unwrap();
            assert_eq!(
                verified_tls_url(refused, scheme).map_err(|e| e.kind()),
                Err(ErrorKind::Config),
                "{refused}"
            );
        }
        // A key the driver does not read names no mode: the strictest is added.
        assert_eq!(
            verified_tls_url("postgres://u@h/db?SSLMODE=verify-full", "postgres").unwrap(),
            "postgres://u@h/db?SSLMODE=verify-full&sslmode=verify-full"
        );
        for (weak, mode) in [
            (
                "postgres://u:S3cret@h/db?sslmode=require",
                "sslmode=require",
            ),
            ("postgres://u:S3cret@h/db?sslmode=prefer", "sslmode=prefer"),
            (
                "mysql://u:S3cret@h/db?ssl-mode=REQUIRED",
                "ssl-mode=REQUIRED",
            ),
            (
                "mysql://u:S3cret@h/db?ssl-mode=PREFERRED",
                "ssl-mode=PREFERRED",
            ),
            (
                "mysql://u:S3cret@h/db?ssl-mode=DISABLED",
                "ssl-mode=DISABLED",
            ),
            // The driver reads either key and applies the last one named.
            (
                "postgres://u:S3cret@h/db?ssl-mode=require",
                "ssl-mode=require",
            ),
            (
                "postgres://u:S3cret@h/db?sslmode=verify-full&sslmode=prefer",
                "sslmode=prefer",
            ),
            // Percent-encoded as the driver decodes it.
            (
                "postgres://u:S3cret@h/db?ssl%2Dmode=allow",
                "ssl-mode=allow",
            ),
        ] {
            let scheme = weak.split(':').next().unwrap();
            let err = verified_tls_url(weak, scheme).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config, "{weak}");
            assert!(err.message().contains(mode), "{weak}: {err}");
            assert!(!err.message().contains("S3cret"), "{weak}: {err}");
        }
        let err = verified_tls_url("sqlite://a.db", "sqlite").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config);
    }

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
}

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
