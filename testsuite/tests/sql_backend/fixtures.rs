//! What the SQL backend's tests share: the selected databases, managers and backends on them, waiters, raw SQL, and the fault proxy.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_api::{DistributeLockManager, LockGuard};
use dlock_jdbc::{JdbcBackend, JdbcOptions};
use dlock_spi::{
    AcquireRequest, Backoff, FencingToken, GrantId, Jitter, LockMode, LockName, LockRemoteResource,
    OwnerId, ReleaseRequest,
};
use sqlx::Connection;
use testsuite::backends::{server_url, TestUrl};
use testsuite::conformance::eventually;
use testsuite::proxy::{split_url, FaultProxy};
use testsuite::runner::selected;

/// The selected SQL labels with a URL each.
pub(crate) fn sql_backends() -> Vec<(String, TestUrl)> {
    let chosen: Vec<(String, TestUrl)> = selected()
        .into_iter()
        .filter(|l| matches!(l.as_str(), "sqlite" | "mysql" | "postgres"))
        .map(|l| {
            let url = server_url(&l).unwrap();
            (l, url)
        })
        .collect();
    if chosen.is_empty() {
        eprintln!("no SQL backend selected in DLOCK_TEST_BACKENDS; nothing to check here");
    }
    chosen
}

/// The URL of `label` when the run selected it (the tests of one database's own
/// behaviour run only there).
pub(crate) fn sql_url(label: &str) -> Option<TestUrl> {
    sql_backends()
        .into_iter()
        .find(|(l, _)| l == label)
        .map(|(_, url)| url)
}

/// The selected labels whose releases notify waiters: PostgreSQL (`LISTEN/NOTIFY`)
/// and SQLite (the local bus of its file).
pub(crate) fn notified_backends() -> Vec<(String, TestUrl)> {
    sql_backends()
        .into_iter()
        .filter(|(l, _)| matches!(l.as_str(), "postgres" | "sqlite"))
        .collect()
}

/// A lease no test outlives (the manager's default).
pub(crate) const LONG_LEASE: Duration = Duration::from_secs(30);

pub(crate) async fn manager(
    url: &str,
    options: JdbcOptions,
    lease: Duration,
) -> DistributeLockManager {
    backend_and_manager(url, options, lease).await.1
}

/// A backend on `url` and a manager over it (the backend kept for its counters).
pub(crate) async fn backend_and_manager(
    url: &str,
    options: JdbcOptions,
    lease: Duration,
) -> (JdbcBackend, DistributeLockManager) {
    let backend = JdbcBackend::connect_with(url, options)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"));
    let manager = DistributeLockManager::builder(backend.clone())
        .lease(lease)
        .build()
        .unwrap();
    (backend, manager)
}

/// Options of a waiter that polls only every `secs` seconds (no jitter).
pub(crate) fn polling_every(secs: u64) -> JdbcOptions {
    JdbcOptions::default()
        .backoff(Backoff::constant(Duration::from_secs(secs)).with_jitter(Jitter::None))
}

/// Starts `lock`'s wait (up to `wait`) in a task of its own and returns once the
/// waiter has been refused, queued (the lock's inspection shows one more waiter),
/// and made its `looks` looks before its backoff's pause — 2: its first, then one
/// after the short pause that follows its queueing; 1 for a PostgreSQL writer
/// (`lock()`, told by release notices) queued behind a writer, which skips that
/// one — with its backend's attempt count by then.
pub(crate) async fn queued_waiter(
    backend: &JdbcBackend,
    lock: dlock_api::DistributeLock,
    wait: Duration,
    looks: u64,
    label: &str,
) -> (
    tokio::task::JoinHandle<dlock_api::Result<Option<LockGuard>>>,
    u64,
) {
    let name = lock.name().unwrap().clone();
    let before = waiters_of(backend, &name).await;
    let waiting = tokio::spawn(async move { lock.try_lock(wait).await });
    assert!(
        eventually(Duration::from_secs(5), || async {
            backend.acquire_attempts() >= looks && waiters_of(backend, &name).await > before
        })
        .await,
        "{label}: the waiter never looked {looks} times and queued"
    );
    // The counter moves as an attempt starts, and nothing marks its end: let its
    // statements finish (a few ms), well inside the pause that follows.
    tokio::time::sleep(Duration::from_millis(300)).await;
    (waiting, backend.acquire_attempts())
}

/// The live waiters queued for `name`, as `backend` inspects it.
pub(crate) async fn waiters_of(backend: &JdbcBackend, name: &LockName) -> usize {
    let state = backend.inspect(name).await.unwrap();
    state.and_then(|s| s.waiters).unwrap_or(0)
}

/// Expects the acquire `waiting` to end granted within `within`, and lets the lock
/// go; `late` says what a timeout means (its failure message).
pub(crate) async fn granted_within(
    waiting: tokio::task::JoinHandle<dlock_api::Result<Option<LockGuard>>>,
    within: Duration,
    late: impl FnOnce() -> String,
) {
    let Ok(ended) = tokio::time::timeout(within, waiting).await else {
        panic!("{}", late())
    };
    let got = ended.unwrap().unwrap();
    let got = got.unwrap_or_else(|| panic!("the wait ended without the lock: {}", late()));
    got.unlock().await.unwrap();
}

/// Releases `held` and expects the queued acquire `waiting` to be granted within
/// 3 s; lets that go too.
pub(crate) async fn handed_over(
    held: LockGuard,
    waiting: tokio::task::JoinHandle<dlock_api::Result<Option<LockGuard>>>,
    label: &str,
) {
    held.unlock().await.unwrap();
    granted_within(waiting, Duration::from_secs(3), || {
        format!("{label}: the waiter was not granted after the release")
    })
    .await;
}

/// Waits (bounded) until SQLite's clock, in epoch ms, is past `ms`.
pub(crate) async fn wait_for_sqlite_clock_past(url: &str, ms: u64) {
    let mut c = sqlx::SqliteConnection::connect(url).await.unwrap();
    for _ in 0..1000 {
        let (now,): (i64,) =
            sqlx::query_as("SELECT CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)")
                .fetch_one(&mut c)
                .await
                .unwrap();
        if u64::try_from(now).unwrap() > ms {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("SQLite's clock did not pass {ms} ms");
}

/// Runs one statement outside dlock with the lock name bound to its `?` placeholder
/// (`$1` on PostgreSQL) and returns the first column of every row it returns.
pub(crate) async fn raw_scalars(label: &str, url: &str, sql: &'static str, name: &str) -> Vec<i64> {
    match label {
        "sqlite" => {
            let mut c = sqlx::SqliteConnection::connect(url).await.unwrap();
            sqlx::query_scalar(sql).bind(name).fetch_all(&mut c).await
        }
        "mysql" => {
            let mut c = sqlx::MySqlConnection::connect(url).await.unwrap();
            sqlx::query_scalar(sql).bind(name).fetch_all(&mut c).await
        }
        _ => {
            let mut c = sqlx::PgConnection::connect(url).await.unwrap();
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql.replace('?', "$1")))
                .bind(name)
                .fetch_all(&mut c)
                .await
        }
    }
    .unwrap_or_else(|e| panic!("{label}: {sql}: {e}"))
}

/// A request for `n` of 3 permits of `name` by grant `grant` of `owner` (30 s lease),
/// straight to a backend.
pub(crate) fn permit_request(name: &LockName, owner: &str, grant: u64, n: u32) -> AcquireRequest {
    AcquireRequest::new(name.clone(), OwnerId::new(owner), GrantId::new(grant))
        .with_mode(LockMode::Permits(n))
        .with_capacity(3)
        .with_lease(Duration::from_secs(30))
}

/// The release of what [`permit_request`] asked for.
pub(crate) fn permit_release(name: &LockName, owner: &str, grant: u64, n: u32) -> ReleaseRequest {
    ReleaseRequest::new(
        name.clone(),
        OwnerId::new(owner),
        GrantId::new(grant),
        LockMode::Permits(n),
        FencingToken::new(0),
    )
}

/// The `synchronous_commit` setting of a session of `backend`'s pool.
pub(crate) async fn synchronous_commit(backend: &JdbcBackend) -> String {
    let dlock_jdbc::SqlPool::Postgres(pool) = backend.sqlx_pool() else {
        panic!("a PostgreSQL backend")
    };
    let (setting,): (String,) = sqlx::query_as("SHOW synchronous_commit")
        .fetch_one(pool)
        .await
        .unwrap();
    setting
}

/// The release notices naming `lock` that reach a listener on the release channel
/// before a marker notice sent after them (notices arrive in commit order).
pub(crate) async fn release_notices_for(
    listener: &mut sqlx::postgres::PgListener,
    url: &str,
    lock: &str,
) -> usize {
    let marker = format!("marker-{:x}", fastrand::u64(..));
    let mut c = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::query("SELECT pg_notify('dlock_release', $1)")
        .bind(&marker)
        .execute(&mut c)
        .await
        .unwrap();
    let mut seen = 0;
    loop {
        let note = tokio::time::timeout(Duration::from_secs(5), listener.recv())
            .await
            .expect("the marker notice within 5 s")
            .unwrap();
        if note.payload() == marker {
            return seen;
        }
        seen += usize::from(note.payload().contains(lock));
    }
}

/// How long after `held`'s release a waiter on `waiter` (whose backend is
/// `backend`) is granted `name`: it waits up to 20 s, and `held` is released once
/// it is queued (refused, so it waits its turn).
pub(crate) async fn granted_after_release(
    waiter: &DistributeLockManager,
    backend: &JdbcBackend,
    name: &str,
    held: LockGuard,
) -> Duration {
    let lock = waiter.lock(name);
    let task = tokio::spawn(async move {
        let got = lock
            .try_lock(Duration::from_secs(20))
            .await
            .unwrap()
            .unwrap();
        let at = Instant::now();
        got.unlock().await.unwrap();
        at
    });
    let lock_name = LockName::new(name).unwrap();
    assert!(
        eventually(Duration::from_secs(5), || async {
            waiters_of(backend, &lock_name).await >= 1
        })
        .await,
        "the waiter never queued"
    );
    let released = Instant::now();
    held.unlock().await.unwrap();
    task.await.unwrap().duration_since(released)
}

thread_local! {
    /// The statements sqlx has run on this thread (see [`statements_here`]).
    static STATEMENTS_HERE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Counts sqlx's statement events (`sqlx::query`) per thread, as the process's
/// global subscriber. (A thread's own default subscriber is not enough: when it is
/// the only one, a statement site another thread meets first is cached as of no
/// interest for every thread.)
pub(crate) struct StatementCounter;

impl tracing::Subscriber for StatementCounter {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        metadata.target() == "sqlx::query"
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, _: &tracing::Event<'_>) {
        STATEMENTS_HERE.with(|n| n.set(n.get() + 1));
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// The statements sqlx has run on this thread since [`StatementCounter`] was
/// installed (by the first call): on a current-thread runtime, every statement of
/// the code under test.
pub(crate) fn statements_here() -> u64 {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        tracing::subscriber::set_global_default(StatementCounter)
            .expect("no other global subscriber in this test binary");
    });
    STATEMENTS_HERE.with(std::cell::Cell::get)
}

/// Drops the row mode's tables of a test's own `prefix` on PostgreSQL.
pub(crate) async fn drop_row_tables(direct: &mut sqlx::PgConnection, prefix: &str) {
    for table in ["waiters", "readers", "locks", "schema_version"] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP TABLE IF EXISTS {prefix}{table}"
        )))
        .execute(&mut *direct)
        .await
        .unwrap();
    }
}

/// A fault proxy in front of the database at `url`, and the URL through it.
pub(crate) async fn proxied(url: &str) -> (FaultProxy, String) {
    let split = split_url(url).unwrap();
    let proxy = FaultProxy::start(split.hosts[0]).await.unwrap();
    let url = split.with_hosts(&[proxy.addr()]);
    (proxy, url)
}

/// A manager over an application's own pool of `connections`, whose sessions first
/// run `setup` (MySQL's are also prepared as dlock needs them), and — on MySQL — the
/// id of the session connected last (0 on PostgreSQL). Its operation timeout (60 s)
/// is longer than any wait the tests make the database do.
pub(crate) async fn manager_on_own_sessions(
    label: &str,
    url: &str,
    setup: &'static str,
    connections: u32,
) -> (DistributeLockManager, Arc<AtomicU64>) {
    use sqlx::{Executor, Row};
    let session = Arc::new(AtomicU64::new(0));
    let seen = Arc::clone(&session);
    let backend = match label {
        "mysql" => {
            let pool = sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(connections)
                .after_connect(move |conn, meta| {
                    let seen = Arc::clone(&seen);
                    Box::pin(async move {
                        dlock_jdbc::prepare_mysql_session(conn, meta).await?;
                        conn.execute(setup).await?;
                        let row = conn.fetch_one("SELECT CONNECTION_ID()").await?;
                        seen.store(row.try_get(0)?, Ordering::SeqCst);
                        Ok(())
                    })
                })
                .connect(url)
                .await
                .unwrap();
            // No bell sessions: every statement of the backend runs on the pool.
            JdbcBackend::from_pool(pool, JdbcOptions::default().wake_sessions(0)).await
        }
        _ => {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(connections)
                .after_connect(move |conn, _| {
                    Box::pin(async move {
                        conn.execute(setup).await?;
                        Ok(())
                    })
                })
                .connect(url)
                .await
                .unwrap();
            JdbcBackend::from_pool(pool, JdbcOptions::default()).await
        }
    };
    let manager = DistributeLockManager::builder(backend.unwrap())
        .lease(Duration::from_secs(10))
        .operation_timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    (manager, session)
}

/// A connection of the test's own (MySQL or PostgreSQL) that runs raw SQL — e.g.
/// holding a lock's row inserted and uncommitted, so that dlock's statements on that
/// lock wait for it.
pub(crate) enum RawConn {
    MySql(sqlx::MySqlConnection),
    Postgres(sqlx::PgConnection),
}

impl RawConn {
    pub(crate) async fn connect(label: &str, url: &str) -> Self {
        match label {
            "mysql" => Self::MySql(sqlx::MySqlConnection::connect(url).await.unwrap()),
            _ => Self::Postgres(sqlx::PgConnection::connect(url).await.unwrap()),
        }
    }

    pub(crate) async fn insert_uncommitted(label: &str, url: &str, name: &str) -> Self {
        let mut holder = Self::connect(label, url).await;
        holder.run("BEGIN".to_owned()).await;
        // The name is the test's own hex: safe inline.
        holder
            .run(format!(
                "INSERT INTO dlock_locks (name, token) VALUES ('{name}', 0)"
            ))
            .await;
        holder
    }

    pub(crate) async fn run(&mut self, sql: String) {
        let sql = sqlx::raw_sql(sqlx::AssertSqlSafe(sql));
        match self {
            Self::MySql(c) => sql.execute(c).await.map(drop),
            Self::Postgres(c) => sql.execute(c).await.map(drop),
        }
        .unwrap();
    }

    pub(crate) async fn rollback(mut self) {
        self.run("ROLLBACK".to_owned()).await;
    }
}
