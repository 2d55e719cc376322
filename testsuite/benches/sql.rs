//! SQL backends, one run: dlock against two floors and the peer `distributed-lock`
//! (XuHaoJun's `distributed-lock-postgres` / `-mysql`, advisory-lock based), in
//! interleaved rounds (see `testsuite::bench::interleaved`).
//!
//! Scenarios:
//! * **one task, uncontended** (acquire+release cycles/s): the *lease floor* — the
//!   least a lease lock needs, one set-if-absent statement with a database-clock
//!   expiry and one owner-guarded delete; the *advisory floor* (PostgreSQL
//!   `pg_try_advisory_lock`/`pg_advisory_unlock`, MySQL `GET_LOCK(name, 0)`/
//!   `RELEASE_LOCK` on one dedicated connection: no lease, no fencing token — the
//!   lock lives and dies with the session); the *fenced lease floor* (a control: the
//!   lease floor keeping its row, whose counter gives each grant a fencing token, as
//!   dlock's rows do); on PostgreSQL the floors' releases commit without waiting
//!   for the WAL flush and their grants wait for it, as dlock's do; on PostgreSQL
//!   the lease floor on a session
//!   with asynchronous commit (a control: the floor without waiting for the WAL
//!   flush); dlock's SPI and user API; the peer.
//! * **8 processes on one lock** (each holds 1 ms, waits ≤ 5 s): separate OS
//!   processes (this binary, re-run as a child), each with its own connections,
//!   new every round, which all cycle the lock for a second (or the round, if
//!   shorter) before their cycles count (a warm-up: connections opened, statements
//!   prepared); cycles/s,
//!   per-process min and max, median wait (of the processes' medians per round),
//!   longest single wait, timeouts.
//!
//! Run: `cargo bench -p testsuite --bench sql` (backends from DLOCK_TEST_BACKENDS,
//! default sqlite,mysql,postgres; DLOCK_BENCH_SECS per implementation and scenario,
//! default 6, split into rounds; DLOCK_BENCH_ONLY=one,contended picks scenarios,
//! DLOCK_BENCH_IMPL=floor,dlock implementations). Under `cargo test` it runs a short
//! smoke pass.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::cell::RefCell;
use std::io::{BufRead, Write};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use distributed_lock_core::{DistributedLock, LockHandle, LockProvider};
use dlock_api::DistributeLockManager;
use dlock_jdbc::{sqlx, JdbcBackend, SqlPool};
use dlock_spi::LockRemoteResource;
use testsuite::backends::async_commit_url;
use testsuite::bench::{api_contestant, cycles, interleaved, spi_contestant, Contestant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

/// The SQL labels among `labels`, each with the suite's URL (SQLite: a temporary
/// file, removed when its URL is dropped).
fn urls(labels: &str) -> Vec<(String, testsuite::backends::TestUrl)> {
    labels
        .split(',')
        .map(str::trim)
        .filter(|l| matches!(*l, "sqlite" | "mysql" | "postgres"))
        .filter_map(|l| Some((l.to_owned(), testsuite::backends::server_url(l)?)))
        .collect()
}

/// Whether a floor's acquire granted: it inserted or updated a row — or, for a floor
/// that hands out tokens (`by_token`) on MySQL, which reports found rows (a refusal
/// that changes nothing counts 1), its token `LAST_INSERT_ID` is not 0.
trait FloorGrant {
    fn granted(&self, by_token: bool) -> bool;
}

impl FloorGrant for sqlx::sqlite::SqliteQueryResult {
    fn granted(&self, _: bool) -> bool {
        self.rows_affected() >= 1
    }
}

impl FloorGrant for sqlx::postgres::PgQueryResult {
    fn granted(&self, _: bool) -> bool {
        self.rows_affected() >= 1
    }
}

impl FloorGrant for sqlx::mysql::MySqlQueryResult {
    fn granted(&self, by_token: bool) -> bool {
        match by_token {
            true => self.last_insert_id() > 0,
            false => self.rows_affected() >= 1,
        }
    }
}

/// One floor cycle of `floor`'s statements on executor `$e`: the acquire (must
/// grant), a hold of `$hold` (none when zero), then the owner-guarded release (must
/// free the lock).
macro_rules! floor_cycle {
    ($floor:expr, $e:expr, $name:expr, $owner:expr, $hold:expr) => {{
        let got = sqlx::query($floor.acquire)
            .bind($name)
            .bind($owner)
            .execute($e)
            .await
            .unwrap();
        assert!(
            got.granted($floor.by_token),
            "floor acquire failed: the lock is taken"
        );
        if !$hold.is_zero() {
            tokio::time::sleep($hold).await;
        }
        let gone = sqlx::query($floor.release)
            .bind($name)
            .bind($owner)
            .execute($e)
            .await
            .unwrap();
        assert_eq!(gone.rows_affected(), 1);
    }};
}

/// The lease floor: the minimum a lease lock needs, one statement each way.
struct LeaseFloor {
    pool: SqlPool,
    acquire: &'static str,
    release: &'static str,
    /// Whether the acquire hands out a token (the fenced floor).
    by_token: bool,
}

/// The fenced lease floor (a control): the minimum a lease lock needs that hands out
/// a fencing token, increasing across holders, from its row — the row stays, and its
/// counter with it: an upsert that takes a free or expired row and advances the
/// counter (returning it), and an owner-guarded update that frees the row. dlock's
/// locks keep their row for the same reason.
const FENCED_FLOOR: &str = "fenced lease floor: the row keeps a token counter (control)";

/// The fenced floor's table and statements (`create`, `acquire`, `release`).
fn fenced_floor_statements(pool: &SqlPool) -> (&'static str, &'static str, &'static str) {
    match pool {
        SqlPool::Sqlite(_) => (
            "CREATE TABLE IF NOT EXISTS bench_fenced (name TEXT PRIMARY KEY, owner TEXT NULL, token INTEGER NOT NULL, expires_at INTEGER NOT NULL)",
            "INSERT INTO bench_fenced (name, owner, token, expires_at) VALUES (?1, ?2, 1, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) + 30000) \
             ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, token = bench_fenced.token + 1, expires_at = excluded.expires_at \
             WHERE bench_fenced.owner IS NULL OR bench_fenced.expires_at <= CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) \
             RETURNING token",
            "UPDATE bench_fenced SET owner = NULL, expires_at = 0 WHERE name = ?1 AND owner = ?2",
        ),
        SqlPool::MySql(_) => (
            "CREATE TABLE IF NOT EXISTS bench_fenced (name VARBINARY(512) PRIMARY KEY, owner VARCHAR(255) NULL, token BIGINT NOT NULL, expires_at BIGINT NOT NULL)",
            // The token comes back as the statement's LAST_INSERT_ID, as dlock's does
            // (0 for a refusal: `VALUES` set it to 1 whether or not the row existed).
            "INSERT INTO bench_fenced (name, owner, token, expires_at) VALUES (?, ?, LAST_INSERT_ID(1), CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) + 30000) \
             ON DUPLICATE KEY UPDATE \
               token = IF(@bench_free := (owner IS NULL OR expires_at <= CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)), LAST_INSERT_ID(token + 1), token + LAST_INSERT_ID(0)), \
               owner = IF(@bench_free, VALUES(owner), owner), \
               expires_at = IF(@bench_free, VALUES(expires_at), expires_at)",
            "UPDATE bench_fenced SET owner = NULL, expires_at = 0 WHERE name = ? AND owner = ?",
        ),
        SqlPool::Postgres(_) => (
            "CREATE TABLE IF NOT EXISTS bench_fenced (name TEXT PRIMARY KEY, owner TEXT NULL, token BIGINT NOT NULL, expires_at BIGINT NOT NULL)",
            "INSERT INTO bench_fenced (name, owner, token, expires_at) VALUES ($1, $2, 1, (EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::BIGINT + 30000) \
             ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, token = bench_fenced.token + 1, expires_at = excluded.expires_at \
             WHERE bench_fenced.owner IS NULL OR bench_fenced.expires_at <= (EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::BIGINT \
             RETURNING token",
            // Commits quickly, as dlock's release does (see `LeaseFloor::new`).
            "UPDATE bench_fenced SET owner = NULL, expires_at = 0 WHERE name = $1 AND owner = $2 \
             AND set_config('synchronous_commit', 'off', true) = 'off'",
        ),
        _ => unreachable!("all drivers are enabled in the testsuite"),
    }
}

impl LeaseFloor {
    /// The fenced lease floor ([`FENCED_FLOOR`]) on `pool`.
    async fn fenced(pool: SqlPool) -> Self {
        let (create, acquire, release) = fenced_floor_statements(&pool);
        Self::with_statements(pool, create, acquire, release, true).await
    }

    async fn new(pool: SqlPool) -> Self {
        let (create, acquire, release) = match &pool {
            SqlPool::Sqlite(_) => (
                "CREATE TABLE IF NOT EXISTS bench_floor (name TEXT PRIMARY KEY, owner TEXT NOT NULL, expires_at INTEGER NOT NULL)",
                "INSERT INTO bench_floor (name, owner, expires_at) VALUES (?1, ?2, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) + 30000) ON CONFLICT (name) DO NOTHING",
                "DELETE FROM bench_floor WHERE name = ?1 AND owner = ?2",
            ),
            SqlPool::MySql(_) => (
                "CREATE TABLE IF NOT EXISTS bench_floor (name VARBINARY(512) PRIMARY KEY, owner VARCHAR(255) NOT NULL, expires_at BIGINT NOT NULL)",
                "INSERT IGNORE INTO bench_floor (name, owner, expires_at) VALUES (?, ?, CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) + 30000)",
                "DELETE FROM bench_floor WHERE name = ? AND owner = ?",
            ),
            SqlPool::Postgres(_) => (
                "CREATE TABLE IF NOT EXISTS bench_floor (name TEXT PRIMARY KEY, owner TEXT NOT NULL, expires_at BIGINT NOT NULL)",
                "INSERT INTO bench_floor (name, owner, expires_at) VALUES ($1, $2, (EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::BIGINT + 30000) ON CONFLICT (name) DO NOTHING",
                // The release commits without waiting for the WAL flush, as dlock's
                // does on PostgreSQL (its `COMMIT_QUICKLY`): a crash that forgets it
                // leaves the lock held until its lease ends, never a second holder,
                // and the next grant's flush makes it durable. A floor that flushed
                // its release would do more than dlock must.
                "DELETE FROM bench_floor WHERE name = $1 AND owner = $2 \
                 AND set_config('synchronous_commit', 'off', true) = 'off'",
            ),
            _ => unreachable!("all drivers are enabled in the testsuite"),
        };
        Self::with_statements(pool, create, acquire, release, false).await
    }

    /// A floor of `acquire` and `release` (handing out a token: `by_token`), its
    /// table made by `create`.
    async fn with_statements(
        pool: SqlPool,
        create: &'static str,
        acquire: &'static str,
        release: &'static str,
        by_token: bool,
    ) -> Self {
        // Processes that start together race to create the table, and PostgreSQL's
        // `IF NOT EXISTS` can then fail on its catalog's unique index: the loser
        // tries again, and finds the table.
        for tries_left in (0..3).rev() {
            let created = match &pool {
                SqlPool::Sqlite(p) => sqlx::query(create).execute(p).await.map(drop),
                SqlPool::MySql(p) => sqlx::query(create).execute(p).await.map(drop),
                SqlPool::Postgres(p) => sqlx::query(create).execute(p).await.map(drop),
                _ => Ok(()),
            };
            match created {
                Ok(()) => break,
                Err(e) if tries_left == 0 => panic!("creating the lease floor's table: {e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        LeaseFloor {
            pool,
            acquire,
            release,
            by_token,
        }
    }

    /// One cycle on the pool: grant, a hold of `hold`, release.
    async fn cycle(&self, name: &str, owner: &str, hold: Duration) {
        match &self.pool {
            SqlPool::Sqlite(p) => floor_cycle!(self, p, name, owner, hold),
            SqlPool::MySql(p) => floor_cycle!(self, p, name, owner, hold),
            SqlPool::Postgres(p) => floor_cycle!(self, p, name, owner, hold),
            _ => {}
        }
    }
}

/// The lease floor's statements on one dedicated PostgreSQL session with
/// asynchronous commit (`synchronous_commit = off`: a commit returns before its WAL is
/// flushed) — a control: what the lease floor costs without waiting for the disk.
async fn async_commit_cycle(
    mut conn: sqlx::pool::PoolConnection<sqlx::Postgres>,
    floor: &LeaseFloor,
    name: &str,
) -> sqlx::pool::PoolConnection<sqlx::Postgres> {
    floor_cycle!(floor, &mut *conn, name, "owner", Duration::ZERO);
    conn
}

/// A dedicated connection of the advisory floor (session-level advisory locks).
enum AdvisoryConn {
    Postgres(sqlx::pool::PoolConnection<sqlx::Postgres>),
    MySql(sqlx::pool::PoolConnection<sqlx::MySql>),
}

/// One advisory-floor cycle on lock `key`/`name`: take it without waiting, give it back.
async fn advisory_cycle(mut conn: AdvisoryConn, key: i64, name: &str) -> AdvisoryConn {
    match &mut conn {
        AdvisoryConn::Postgres(c) => {
            let (got,): (bool,) = sqlx::query_as("SELECT pg_try_advisory_lock($1)")
                .bind(key)
                .fetch_one(&mut **c)
                .await
                .unwrap();
            assert!(got, "advisory floor: the lock was taken");
            let (gone,): (bool,) = sqlx::query_as("SELECT pg_advisory_unlock($1)")
                .bind(key)
                .fetch_one(&mut **c)
                .await
                .unwrap();
            assert!(gone);
        }
        AdvisoryConn::MySql(c) => {
            let (got,): (Option<i64>,) = sqlx::query_as("SELECT GET_LOCK(?, 0)")
                .bind(name)
                .fetch_one(&mut **c)
                .await
                .unwrap();
            assert_eq!(got, Some(1), "advisory floor: the lock was taken");
            let (gone,): (Option<i64>,) = sqlx::query_as("SELECT RELEASE_LOCK(?)")
                .bind(name)
                .fetch_one(&mut **c)
                .await
                .unwrap();
            assert_eq!(gone, Some(1));
        }
    }
    conn
}

/// The peer on `label`'s server, when it has one (PostgreSQL, MySQL).
enum Peer {
    Postgres(distributed_lock_postgres::PostgresLockProvider),
    MySql(distributed_lock_mysql::MySqlLockProvider),
}

impl Peer {
    async fn connect(label: &str, url: &str) -> Option<Peer> {
        Some(match label {
            "postgres" => Peer::Postgres(
                distributed_lock_postgres::PostgresLockProvider::new(url)
                    .await
                    .unwrap(),
            ),
            "mysql" => Peer::MySql(
                distributed_lock_mysql::MySqlLockProvider::new(url)
                    .await
                    .unwrap(),
            ),
            _ => return None,
        })
    }

    /// Acquires `name` (waiting up to `wait`, or not at all), holds `hold`, releases;
    /// false when it was not granted.
    async fn cycle(&self, name: &str, wait: Option<Duration>, hold: Duration) -> bool {
        macro_rules! run {
            ($p:expr) => {{
                let lock = $p.create_lock(name);
                let handle = match wait {
                    None => lock.try_acquire().await.unwrap(),
                    Some(w) => lock.acquire(Some(w)).await.ok(),
                };
                match handle {
                    Some(h) => {
                        if !hold.is_zero() {
                            tokio::time::sleep(hold).await;
                        }
                        h.release().await.unwrap();
                        true
                    }
                    None => false,
                }
            }};
        }
        match self {
            Peer::Postgres(p) => run!(p),
            Peer::MySql(p) => run!(p),
        }
    }
}

const PEER: &str = "distributed-lock 0.2 (advisory locks)";

/// dlock on PostgreSQL with asynchronous commit, opted into in the URL.
const ASYNC_COMMIT: &str = "dlock non-fair, asynchronous commit (opt-in)";
/// The contended control (MySQL, PostgreSQL): the lease floor's row, taken by
/// waiters that block inside the server on a named lock beside it.
/// dlock on SQLite with its release notices turned off in the URL: waiters poll,
/// as every SQLite waiter did before the notices (a control).
const NOTICES_OFF: &str = "dlock non-fair, release notices off (control: polling)";
/// dlock in its session mode (PostgreSQL's advisory locks, MariaDB's named locks),
/// opted into in the URL.
const SESSION: &str = "dlock session mode (opt-in)";

/// `url` with dlock's session mode asked for.
fn session_url(url: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}dlock_mode=session")
}
const WOKEN_FLOOR: &str = "lease floor, waiters blocked in the server (control)";
/// The contended controls of the session mode on MariaDB (where it misses the peer at
/// 8 processes): the peer's protocol with the least client work — `GET_LOCK(name, t)`
/// on a dedicated connection, `RELEASE_LOCK` — and the same with dlock's grant
/// around it (a multi-statement query: the wait, then the token from a sequence and
/// the holder row in a `MEMORY` table, `REPLACE … RETURNING`, as the session mode
/// sends it), to price the fencing token and the holder record apart.
const NAMED_WAIT: &str = "named-lock wait floor: GET_LOCK(name, t) + RELEASE_LOCK (control)";
const NAMED_WAIT_FENCED: &str =
    "named-lock wait floor + token and holder row, as dlock's grant (control)";
/// The same with the token alone (no holder row): prices the row apart.
const NAMED_WAIT_TOKEN: &str = "named-lock wait floor + token only (control)";
/// The token alone in one prepared statement, `SELECT IF(GET_LOCK(?, ?) = 1,
/// NEXTVAL(…), NULL)` (binary protocol, no multi-statement query).
const NAMED_WAIT_TOKEN_PREPARED: &str =
    "named-lock wait floor + token only, one prepared statement (control)";
/// The fenced control's tables (the parent creates them once).
const FENCED_HOLDS: &str = "bench_session_holds";
const FENCED_SEQ: &str = "bench_session_fence";

/// A floor's contestant: one task cycling `name` on `floor`.
fn floor_contestant(
    label: &'static str,
    floor: &Arc<LeaseFloor>,
    name: String,
) -> Contestant<'static> {
    let floor = Arc::clone(floor);
    Contestant::tasks(label, 1, move |_, end| {
        let (floor, name) = (Arc::clone(&floor), name.clone());
        cycles((floor, name), end, |(floor, name)| async move {
            floor.cycle(&name, "owner", Duration::ZERO).await;
            (floor, name)
        })
    })
}

/// One task, uncontended, every implementation in interleaved rounds.
async fn uncontended(
    label: &str,
    url: &str,
    secs: Duration,
    rounds: u32,
) -> Vec<(&'static str, f64)> {
    let backend = JdbcBackend::connect(url)
        .await
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    let tag = format!("bench{:x}", fastrand::u32(..));
    let floor = Arc::new(LeaseFloor::new(backend.sqlx_pool().clone()).await);
    let fenced = Arc::new(LeaseFloor::fenced(backend.sqlx_pool().clone()).await);
    let mut contestants = vec![
        floor_contestant(
            "lease floor (1+1 statements)",
            &floor,
            format!("{tag}:floor"),
        ),
        floor_contestant(FENCED_FLOOR, &fenced, format!("{tag}:fenced")),
    ];
    // The advisory floor's connection, taken from the backend's own pool for the run.
    let advisory = match backend.sqlx_pool() {
        SqlPool::Postgres(p) => Some(AdvisoryConn::Postgres(p.acquire().await.unwrap())),
        SqlPool::MySql(p) => Some(AdvisoryConn::MySql(p.acquire().await.unwrap())),
        _ => None,
    };
    if let Some(conn) = advisory {
        let conn = Rc::new(RefCell::new(Some(conn)));
        let name = format!("{tag}:advisory");
        let key = i64::from(fastrand::u32(..));
        contestants.push(Contestant::new(
            "advisory floor (try-lock + unlock, one session)",
            Box::new(move |d| {
                let (conn, name) = (Rc::clone(&conn), name.clone());
                Box::pin(async move {
                    let start = Instant::now();
                    let c = conn.borrow_mut().take().expect("one round at a time");
                    let mut c = Some(c);
                    let mut n = 0u64;
                    while start.elapsed() < d {
                        c = Some(advisory_cycle(c.take().expect("conn"), key, &name).await);
                        n += 1;
                    }
                    *conn.borrow_mut() = c;
                    (n, start.elapsed())
                })
            }),
        ));
    }
    if let SqlPool::Postgres(p) = backend.sqlx_pool() {
        let mut c = p.acquire().await.unwrap();
        sqlx::query("SET synchronous_commit = off")
            .execute(&mut *c)
            .await
            .unwrap();
        let conn = Rc::new(RefCell::new(Some(c)));
        let (floor, name) = (Arc::clone(&floor), format!("{tag}:async"));
        contestants.push(Contestant::new(
            "lease floor, asynchronous commit (control)",
            Box::new(move |d| {
                let (conn, floor, name) = (Rc::clone(&conn), Arc::clone(&floor), name.clone());
                Box::pin(async move {
                    let start = Instant::now();
                    let mut c = conn.borrow_mut().take();
                    let mut n = 0u64;
                    while start.elapsed() < d {
                        let next = async_commit_cycle(c.take().expect("conn"), &floor, &name);
                        c = Some(next.await);
                        n += 1;
                    }
                    *conn.borrow_mut() = c;
                    (n, start.elapsed())
                })
            }),
        ));
    }
    let resource: Arc<dyn LockRemoteResource> = Arc::new(backend.clone());
    contestants.push(spi_contestant(1, resource, {
        let t = tag.clone();
        move |_| format!("{t}:spi")
    }));
    let manager = DistributeLockManager::builder(backend.clone())
        .build()
        .unwrap();
    contestants.push(api_contestant(1, manager.clone(), {
        let t = tag.clone();
        move |_| format!("{t}:api")
    }));
    let mut async_manager = None;
    let mut session_manager = None;
    if label == "postgres" {
        let backend = JdbcBackend::connect(&async_commit_url(url)).await.unwrap();
        let m = DistributeLockManager::builder(backend).build().unwrap();
        let contestant = api_contestant(1, m.clone(), {
            let t = tag.clone();
            move |_| format!("{t}:async")
        });
        contestants.push(contestant.labelled("dlock (user API), asynchronous commit (opt-in)"));
        async_manager = Some(m);
    }
    if matches!(label, "postgres" | "mysql") {
        let session = JdbcBackend::connect(&session_url(url)).await.unwrap();
        let resource: Arc<dyn LockRemoteResource> = Arc::new(session.clone());
        contestants.push(
            spi_contestant(1, resource, {
                let t = tag.clone();
                move |_| format!("{t}:session-spi")
            })
            .labelled("dlock SPI, session mode (opt-in)"),
        );
        let m = DistributeLockManager::builder(session).build().unwrap();
        contestants.push(
            api_contestant(1, m.clone(), {
                let t = tag.clone();
                move |_| format!("{t}:session-api")
            })
            .labelled("dlock (user API), session mode (opt-in)"),
        );
        session_manager = Some(m);
    }
    if let Some(peer) = Peer::connect(label, url).await {
        let peer = Arc::new(peer);
        let name = format!("{tag}peer");
        contestants.push(Contestant::tasks(PEER, 1, move |_, end| {
            let (peer, name) = (Arc::clone(&peer), name.clone());
            cycles((peer, name), end, |(peer, name)| async move {
                assert!(peer.cycle(&name, None, Duration::ZERO).await, "uncontended");
                (peer, name)
            })
        }));
    }
    let rows = interleaved(contestants, rounds, secs / rounds).await;
    for m in [async_manager, session_manager].into_iter().flatten() {
        m.close().await;
    }
    manager.close().await;
    backend.close().await;
    rows
}

const PROCESSES: usize = 8;
const MAX_WAIT: Duration = Duration::from_secs(5);
const HOLD: Duration = Duration::from_millis(1);
/// How long each process of a contended round cycles before its cycles count: a
/// round's processes are new, and what a long-running process has already done —
/// open its pool's connections, prepare its statements — is not what is measured.
const WARMUP: Duration = Duration::from_secs(1);
/// Rounds per implementation in the contended scenario.
const CONTENDED_ROUNDS: u32 = 4;
/// Set in a child process: `<implementation>|<label>|<url>|<lock>|<ms to run>|<ms
/// to warm up first>`.
const CHILD: &str = "DLOCK_SQL_BENCH_CHILD";

/// The contended implementations (the peer only where it exists).
fn contended_impls(label: &str) -> Vec<&'static str> {
    let mut v = vec!["dlock non-fair", "dlock fair"];
    if label == "postgres" {
        v.push(ASYNC_COMMIT);
    }
    if matches!(label, "postgres" | "mysql") {
        v.push(SESSION);
    }
    if label == "sqlite" {
        v.push(NOTICES_OFF);
    }
    if matches!(label, "postgres" | "mysql") {
        v.push(WOKEN_FLOOR);
        v.push(PEER);
    }
    if label == "mysql" {
        v.push(NAMED_WAIT);
        v.push(NAMED_WAIT_TOKEN);
        v.push(NAMED_WAIT_TOKEN_PREPARED);
        v.push(NAMED_WAIT_FENCED);
    }
    v
}

/// Creates the fenced named-lock control's tables, as the session mode's own.
async fn create_fenced_tables(url: &str) {
    use sqlx::Connection;
    let mut c = sqlx::MySqlConnection::connect(url).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE IF NOT EXISTS {FENCED_HOLDS} (conn BIGINT UNSIGNED NOT NULL PRIMARY KEY, \
           lk CHAR(44) CHARACTER SET ascii NOT NULL, holder VARBINARY(255) NOT NULL, \
           name VARBINARY(512) NOT NULL, token BIGINT NOT NULL, context VARBINARY(1024) NOT NULL) \
           ENGINE=MEMORY; \
         CREATE SEQUENCE IF NOT EXISTS {FENCED_SEQ}"
    )))
    .execute(&mut c)
    .await
    .unwrap();
}

/// What a named-lock control sends with its wait (its implementation's name).
#[derive(Clone, Copy, PartialEq, Eq)]
enum NamedWait {
    /// The wait alone ([`NAMED_WAIT`]).
    Bare,
    /// The token in the wait's prepared statement ([`NAMED_WAIT_TOKEN_PREPARED`]).
    TokenPrepared,
    /// The token after the wait, one multi-statement query ([`NAMED_WAIT_TOKEN`]).
    Token,
    /// The token and the holder row after it, as dlock's grant ([`NAMED_WAIT_FENCED`]).
    TokenAndRow,
}

impl NamedWait {
    fn of(imp: &str) -> Option<Self> {
        [
            (NAMED_WAIT, NamedWait::Bare),
            (NAMED_WAIT_TOKEN_PREPARED, NamedWait::TokenPrepared),
            (NAMED_WAIT_TOKEN, NamedWait::Token),
            (NAMED_WAIT_FENCED, NamedWait::TokenAndRow),
        ]
        .into_iter()
        .find_map(|(name, kind)| (name == imp).then_some(kind))
    }
}

/// One cycle of a named-lock control of `kind` on its own connection: wait for
/// `name` (≤ [`MAX_WAIT`]), hold [`HOLD`], release.
async fn named_wait_cycle(c: &mut sqlx::MySqlConnection, name: &str, kind: NamedWait) -> bool {
    let secs = MAX_WAIT.as_secs_f64();
    let prepared = kind == NamedWait::TokenPrepared;
    let got = if matches!(kind, NamedWait::Bare | NamedWait::TokenPrepared) {
        let statement = if prepared {
            format!("SELECT IF(GET_LOCK(?, ?) = 1, NEXTVAL({FENCED_SEQ}), NULL)")
        } else {
            "SELECT GET_LOCK(?, ?)".to_owned()
        };
        let (got,): (Option<i64>,) = sqlx::query_as(sqlx::AssertSqlSafe(statement))
            .bind(name)
            .bind(secs)
            .fetch_one(&mut *c)
            .await
            .unwrap();
        // GET_LOCK answers 1 when granted; the prepared control, the token (NULL
        // when not granted).
        if prepared {
            got.is_some()
        } else {
            got == Some(1)
        }
    } else {
        // Built per call, hexadecimal literals, as the session mode's waiting grant.
        let hex = |b: &[u8]| {
            let mut out = String::from("X'");
            for x in b {
                out.push_str(&format!("{x:02x}"));
            }
            out + "'"
        };
        let after = if kind == NamedWait::TokenAndRow {
            format!(
                "REPLACE INTO {FENCED_HOLDS} (conn, lk, holder, name, token, context) \
                   SELECT CONNECTION_ID(), '{name}', {holder}, {lname}, NEXTVAL({FENCED_SEQ}), {context} \
                   FROM DUAL WHERE @dlock_t = 1 RETURNING token",
                holder = hex(b"16|0123456789abcdef:1"),
                lname = hex(name.as_bytes()),
                context = hex(b""),
            )
        } else {
            format!("SELECT NEXTVAL({FENCED_SEQ}) AS token FROM DUAL WHERE @dlock_t = 1")
        };
        let statement = format!("SET @dlock_t = GET_LOCK('{name}', {secs:.3}); {after}");
        let rows = sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .fetch_all(&mut *c)
            .await
            .unwrap();
        rows.last()
            .map(|r| sqlx::Row::get::<i64, _>(r, "token"))
            .is_some()
    };
    if !got {
        return false;
    }
    tokio::time::sleep(HOLD).await;
    let (gone,): (Option<i64>,) = sqlx::query_as("SELECT RELEASE_LOCK(?)")
        .bind(name)
        .fetch_one(&mut *c)
        .await
        .unwrap();
    assert_eq!(gone, Some(1));
    true
}

/// The contended control's wake-up: a session-level named lock beside the row, on
/// a dedicated connection (`GET_LOCK(name, t)` on MySQL; `pg_advisory_lock` under
/// `lock_timeout` on PostgreSQL) — what the peer uses as the lock itself.
async fn woken_floor_cycle(floor: &LeaseFloor, bell: &mut AdvisoryConn, name: &str) -> bool {
    let secs = MAX_WAIT.as_secs_f64();
    let rang = match bell {
        AdvisoryConn::MySql(c) => {
            let (got,): (Option<i64>,) = sqlx::query_as("SELECT GET_LOCK(?, ?)")
                .bind(name)
                .bind(secs)
                .fetch_one(&mut **c)
                .await
                .unwrap();
            got == Some(1)
        }
        AdvisoryConn::Postgres(c) => sqlx::query("SELECT pg_advisory_lock(hashtext($1))")
            .bind(name)
            .execute(&mut **c)
            .await
            .is_ok(),
    };
    if !rang {
        return false;
    }
    floor.cycle(name, "owner", HOLD).await;
    match bell {
        AdvisoryConn::MySql(c) => drop(
            sqlx::query("DO RELEASE_LOCK(?)")
                .bind(name)
                .execute(&mut **c)
                .await
                .unwrap(),
        ),
        AdvisoryConn::Postgres(c) => drop(
            sqlx::query("SELECT pg_advisory_unlock(hashtext($1))")
                .bind(name)
                .execute(&mut **c)
                .await
                .unwrap(),
        ),
    }
    true
}

/// A child process's lock.
enum Side {
    Dlock(DistributeLockManager, dlock_api::DistributeLock),
    Peer(Peer),
    WokenFloor(LeaseFloor, AdvisoryConn),
    /// A named-lock control's connection and what it sends with its wait.
    NamedWait(sqlx::MySqlConnection, NamedWait),
}

/// One contended cycle of `side` on `lock`: wait (≤ [`MAX_WAIT`]), hold [`HOLD`],
/// release; `false` when the wait timed out.
async fn contended_cycle(side: &mut Side, lock: &str) -> bool {
    match side {
        Side::Dlock(_, l) => match l.try_lock(MAX_WAIT).await.unwrap() {
            Some(g) => {
                tokio::time::sleep(HOLD).await;
                g.unlock().await.unwrap();
                true
            }
            None => false,
        },
        Side::Peer(p) => p.cycle(lock, Some(MAX_WAIT), HOLD).await,
        Side::WokenFloor(floor, bell) => woken_floor_cycle(floor, bell, lock).await,
        Side::NamedWait(c, kind) => named_wait_cycle(c, lock, *kind).await,
    }
}

/// A child process: connects, says `ready`, waits for `go`, warms up (uncounted;
/// [`WARMUP`], or the round's time if shorter), cycles the lock for the given time
/// and prints `<cycles in time> <cycles> <longest wait µs> <timeouts>`.
fn child(spec: &str) {
    let parts: Vec<&str> = spec.splitn(6, '|').collect();
    let [imp, label, url, lock, ms, warm_ms] = parts[..] else {
        panic!("bad {CHILD}: {spec}")
    };
    let run_for = Duration::from_millis(ms.parse().unwrap());
    let warmup = Duration::from_millis(warm_ms.parse().unwrap());
    let rt = testsuite::bench::runtime();
    rt.block_on(async {
        let mut side = if let Some(kind) = NamedWait::of(imp) {
            use sqlx::Connection;
            let c = sqlx::MySqlConnection::connect(url).await.unwrap();
            Side::NamedWait(c, kind)
        } else if imp == WOKEN_FLOOR {
            let backend = JdbcBackend::connect(url).await.unwrap();
            let pool = backend.sqlx_pool().clone();
            let bell = match &pool {
                SqlPool::MySql(p) => AdvisoryConn::MySql(p.acquire().await.unwrap()),
                SqlPool::Postgres(p) => {
                    let mut c = p.acquire().await.unwrap();
                    sqlx::query(sqlx::AssertSqlSafe(format!(
                        "SET lock_timeout = '{}ms'",
                        MAX_WAIT.as_millis()
                    )))
                    .execute(&mut *c)
                    .await
                    .unwrap();
                    AdvisoryConn::Postgres(c)
                }
                _ => unreachable!("the woken floor runs on MySQL and PostgreSQL"),
            };
            Side::WokenFloor(LeaseFloor::new(pool).await, bell)
        } else if imp == PEER {
            Side::Peer(
                Peer::connect(label, url)
                    .await
                    .expect("a peer on this backend"),
            )
        } else {
            let url = if imp == ASYNC_COMMIT {
                async_commit_url(url)
            } else if imp == SESSION {
                session_url(url)
            } else if imp == NOTICES_OFF {
                let sep = if url.contains('?') { '&' } else { '?' };
                format!("{url}{sep}dlock_local_notices=false")
            } else {
                url.to_owned()
            };
            let backend = JdbcBackend::connect(&url).await.unwrap();
            let m = DistributeLockManager::builder(backend).build().unwrap();
            let l = if imp == "dlock fair" {
                m.fair_lock(lock)
            } else {
                m.lock(lock)
            };
            Side::Dlock(m, l)
        };
        println!("ready");
        std::io::stdout().flush().unwrap();
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line).unwrap();
        // Every process warms up on the lock first, together (its pool opens the
        // connections contention needs, its statements are prepared), uncounted.
        let counted_from = Instant::now() + warmup;
        while Instant::now() < counted_from {
            let _ = contended_cycle(&mut side, lock).await;
        }
        let end = Instant::now() + run_for;
        let (mut n, mut in_time, mut timeouts) = (0u64, 0u64, 0u64);
        let mut waits = Vec::new();
        while Instant::now() < end {
            let t = Instant::now();
            let ok = contended_cycle(&mut side, lock).await;
            if ok {
                n += 1;
                in_time += u64::from(Instant::now() <= end);
                waits.push(t.elapsed().saturating_sub(HOLD));
            } else {
                timeouts += 1;
            }
        }
        waits.sort_unstable();
        let longest = waits.last().copied().unwrap_or_default();
        let median = waits.get(waits.len() / 2).copied().unwrap_or_default();
        println!(
            "{in_time} {n} {} {timeouts} {}",
            longest.as_micros(),
            median.as_micros()
        );
        if let Side::Dlock(m, _) = side {
            m.close().await;
        }
    });
}

/// One process's totals over all rounds.
#[derive(Default, Clone, Copy)]
struct Proc {
    cycles: u64,
    longest_wait: Duration,
    timeouts: u64,
    /// The median wait of each round.
    medians: [Duration; CONTENDED_ROUNDS as usize],
    rounds: usize,
}

/// One round of `imp`: `PROCESSES` children on `lock` for `d`; adds to `totals` and
/// returns the cycles that ended in time.
async fn contended_round(
    spec: String,
    d: Duration,
    totals: &RefCell<Vec<Proc>>,
) -> (u64, Duration) {
    let exe = std::env::current_exe().unwrap();
    let mut children = Vec::new();
    for _ in 0..PROCESSES {
        let mut c = tokio::process::Command::new(&exe)
            .env(
                CHILD,
                format!("{spec}|{}|{}", d.as_millis(), d.min(WARMUP).as_millis()),
            )
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let out = tokio::io::BufReader::new(c.stdout.take().unwrap()).lines();
        let stdin = c.stdin.take().unwrap();
        children.push((c, stdin, out));
    }
    let mut ready = children;
    for (_, _, out) in ready.iter_mut() {
        assert_eq!(out.next_line().await.unwrap().as_deref(), Some("ready"));
    }
    let start = Instant::now();
    for (_, stdin, _) in ready.iter_mut() {
        stdin.write_all(b"go\n").await.unwrap();
        stdin.flush().await.unwrap();
    }
    let mut in_time = 0;
    for (i, (mut c, _, mut out)) in ready.into_iter().enumerate() {
        let line = out.next_line().await.unwrap().expect("a child's result");
        let v: Vec<u64> = line.split(' ').map(|x| x.parse().unwrap()).collect();
        in_time += v[0];
        {
            let p = &mut totals.borrow_mut()[i];
            p.cycles += v[1];
            p.longest_wait = p.longest_wait.max(Duration::from_micros(v[2]));
            p.timeouts += v[3];
            if let Some(m) = p.medians.get_mut(p.rounds) {
                *m = Duration::from_micros(v[4]);
            }
            p.rounds += 1;
        }
        assert!(c.wait().await.unwrap().success());
    }
    // The rate is over the round's own time (from `go`), not the start-up.
    (in_time, d.max(start.elapsed().min(d)))
}

/// Every contended implementation on `label`, interleaved; prints the table rows.
async fn contended(label: &str, url: &str, secs: Duration, rounds: u32) {
    let tag = format!("bench{:x}", fastrand::u32(..));
    if contended_impls(label).contains(&NAMED_WAIT_FENCED) {
        create_fenced_tables(url).await;
    }
    let mut totals = Vec::new();
    let mut contestants = Vec::new();
    for imp in contended_impls(label) {
        let mine = Rc::new(RefCell::new(vec![Proc::default(); PROCESSES]));
        totals.push((imp, Rc::clone(&mine)));
        let spec = format!("{imp}|{label}|{url}|{tag}c{}", imp.len());
        contestants.push(Contestant::new(
            imp,
            Box::new(move |d| {
                let (spec, mine) = (spec.clone(), Rc::clone(&mine));
                Box::pin(async move { contended_round(spec, d, &mine).await })
            }),
        ));
    }
    let rates = interleaved(contestants, rounds, secs / rounds).await;
    for (name, rate) in rates {
        let Some((_, mine)) = totals.iter().find(|(n, _)| *n == name) else {
            continue;
        };
        let p = mine.borrow();
        let min = p.iter().map(|c| c.cycles).min().unwrap_or(0);
        let max = p.iter().map(|c| c.cycles).max().unwrap_or(0);
        // The median over every process's round medians.
        let mut medians: Vec<Duration> = p
            .iter()
            .flat_map(|c| c.medians.iter().take(c.rounds).copied())
            .collect();
        medians.sort_unstable();
        let median = medians.get(medians.len() / 2).copied().unwrap_or_default();
        println!(
            "| {label} | {name} | {rate:.0} | {min} | {max} | {:.2} | {:.1} ms | {:.0} ms | {} |",
            max as f64 / min.max(1) as f64,
            median.as_secs_f64() * 1000.0,
            p.iter()
                .map(|c| c.longest_wait)
                .max()
                .unwrap_or_default()
                .as_secs_f64()
                * 1000.0,
            p.iter().map(|c| c.timeouts).sum::<u64>(),
        );
    }
}

fn main() {
    if let Ok(spec) = std::env::var(CHILD) {
        child(&spec);
        return;
    }
    let bench = testsuite::bench::is_bench();
    let labels =
        std::env::var("DLOCK_TEST_BACKENDS").unwrap_or_else(|_| "sqlite,mysql,postgres".into());
    let secs = if bench {
        Duration::from_secs_f64(
            std::env::var("DLOCK_BENCH_SECS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(6.0),
        )
    } else {
        Duration::from_millis(200) // smoke pass under `cargo test`
    };
    let (rounds, contended_rounds) = if bench {
        (12, CONTENDED_ROUNDS)
    } else {
        (1, 1)
    };
    let only = std::env::var("DLOCK_BENCH_ONLY").unwrap_or_default();
    let want = |s: &str| only.is_empty() || only.split(',').any(|o| o == s);
    let targets = urls(&labels);
    let rt = testsuite::bench::runtime();
    rt.block_on(async {
        if want("one") {
            println!("\n**One task, uncontended** (acquire+release cycles/s, median of {rounds} interleaved rounds)\n");
            println!("| backend | implementation | cycles/s | × lease floor |\n|---|---|---|---|");
            for (label, url) in &targets {
                let rows = uncontended(label, &url.to_string(), secs, rounds).await;
                let floor = rows.first().map_or(1.0, |r| r.1);
                for (name, r) in rows {
                    println!("| {label} | {name} | {r:.0} | {:.2} |", r / floor);
                }
            }
        }
        if want("contended") {
            println!("\n**{PROCESSES} processes on one lock** (hold {HOLD:?}, wait ≤ {MAX_WAIT:?}; cycles/s of the median of {contended_rounds} rounds, the rest over all rounds)\n");
            println!("| backend | implementation | cycles/s | per-process min | max | max/min | median wait | longest wait | timeouts |\n|---|---|---|---|---|---|---|---|---|");
            for (label, url) in &targets {
                contended(label, &url.to_string(), secs, contended_rounds).await;
            }
        }
    });
    // (A SQLite file of the suite's goes with its URL, here.)
    drop(targets);
}
