//! What a SQL backend is told: its options, and dlock's own options in a database URL
//! (`dlock_*`), the rest of which is the driver's.

use std::time::Duration;

use dlock_spi::{Backoff, Error, ErrorKind, Result};

/// Settings of a [`JdbcBackend`](crate::JdbcBackend).
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
    /// [`JdbcBackend::connect`](crate::JdbcBackend::connect) and its kin, not to an application's own pool
    /// ([`JdbcBackend::from_pool`](crate::JdbcBackend::from_pool)). Default false: the URL's mode as the driver
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
pub(crate) fn verified_tls_url(url: &str, scheme: &str) -> Result<String> {
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
pub(crate) fn unverified_as_read() -> Error {
    Error::new(
        ErrorKind::Config,
        "dlock_tls=verified: the driver reads the URL's TLS mode as one that does not verify the server's certificate; name sslmode=verify-full (PostgreSQL) or ssl-mode=VERIFY_IDENTITY (MySQL) once, with the CA",
    )
}

/// dlock's own URL options, each `dlock_*`: what [`split_options`] takes.
pub(crate) const OWN_OPTIONS: &[&str] = &[
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
pub(crate) fn split_options(url: &str, mut options: JdbcOptions) -> Result<(String, JdbcOptions)> {
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
}
