//! What only the SQL backend promises, on every SQL database in `DLOCK_TEST_BACKENDS`:
//! fencing across a deleted row, the name-length limit, semaphores across the
//! schema's upgrade, PostgreSQL's push wake-up, and behaviour while the database is
//! unreachable (through the fault proxy).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_api::{DistributeLockManager, ErrorKind, LockGuard, LostReason};
use dlock_jdbc::{JdbcBackend, JdbcOptions};
use dlock_spi::{
    AcquireRequest, AcquireResult, Backoff, FencingToken, GrantId, Jitter, LockMode, LockName,
    LockRemoteResource, OwnerId, ReleaseRequest, ReleaseResult,
};
use sqlx::Connection;
use testsuite::backends::{
    async_commit_url, server_url, sql_tls_url, TestUrl, SESSION_MODE_TIMEOUT,
};
use testsuite::conformance::{eventually, lock_once, take, take_permits};
use testsuite::proxy::{split_url, Fault, FaultProxy};
use testsuite::runner::selected;

/// The selected SQL labels with a URL each.
fn sql_backends() -> Vec<(String, TestUrl)> {
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
fn sql_url(label: &str) -> Option<TestUrl> {
    sql_backends()
        .into_iter()
        .find(|(l, _)| l == label)
        .map(|(_, url)| url)
}

/// The selected labels whose releases notify waiters: PostgreSQL (`LISTEN/NOTIFY`)
/// and SQLite (the local bus of its file).
fn notified_backends() -> Vec<(String, TestUrl)> {
    sql_backends()
        .into_iter()
        .filter(|(l, _)| matches!(l.as_str(), "postgres" | "sqlite"))
        .collect()
}

/// SQLite on a runtime without tokio's I/O driver (SQLite never needed it): the
/// backend opens, and a lock is taken and released — the release notices' socket
/// is read on a thread of the backend's own. (It panicked when it was read by a
/// task: tokio's Unix sockets need the I/O driver.)
#[test]
fn sqlite_works_on_a_runtime_without_the_io_driver() {
    let Some(url) = sql_url("sqlite") else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let m = manager(&url, JdbcOptions::default(), LONG_LEASE).await;
        let name = format!("no-io-{:x}", fastrand::u64(..));
        let g = take(&m.lock(&name), Duration::ZERO).await;
        g.unlock().await.unwrap();
        m.close().await;
    });
}

/// A lease no test outlives (the manager's default).
const LONG_LEASE: Duration = Duration::from_secs(30);

async fn manager(url: &str, options: JdbcOptions, lease: Duration) -> DistributeLockManager {
    backend_and_manager(url, options, lease).await.1
}

/// A backend on `url` and a manager over it (the backend kept for its counters).
async fn backend_and_manager(
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
fn polling_every(secs: u64) -> JdbcOptions {
    JdbcOptions::default()
        .backoff(Backoff::constant(Duration::from_secs(secs)).with_jitter(Jitter::None))
}

/// Starts `lock`'s wait (up to `wait`) in a task of its own and returns once the
/// waiter has been refused, queued (the lock's inspection shows one more waiter),
/// and made its `looks` looks before its backoff's pause — 2: its first, then one
/// after the short pause that follows its queueing; 1 for a PostgreSQL writer
/// (`lock()`, told by release notices) queued behind a writer, which skips that
/// one — with its backend's attempt count by then.
async fn queued_waiter(
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
async fn waiters_of(backend: &JdbcBackend, name: &LockName) -> usize {
    let state = backend.inspect(name).await.unwrap();
    state.and_then(|s| s.waiters).unwrap_or(0)
}

/// Expects the acquire `waiting` to end granted within `within`, and lets the lock
/// go; `late` says what a timeout means (its failure message).
async fn granted_within(
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
async fn handed_over(
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
async fn wait_for_sqlite_clock_past(url: &str, ms: u64) {
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
async fn raw_scalars(label: &str, url: &str, sql: &'static str, name: &str) -> Vec<i64> {
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
fn permit_request(name: &LockName, owner: &str, grant: u64, n: u32) -> AcquireRequest {
    AcquireRequest::new(name.clone(), OwnerId::new(owner), GrantId::new(grant))
        .with_mode(LockMode::Permits(n))
        .with_capacity(3)
        .with_lease(Duration::from_secs(30))
}

/// The release of what [`permit_request`] asked for.
fn permit_release(name: &LockName, owner: &str, grant: u64, n: u32) -> ReleaseRequest {
    ReleaseRequest::new(
        name.clone(),
        OwnerId::new(owner),
        GrantId::new(grant),
        LockMode::Permits(n),
        FencingToken::new(0),
    )
}

/// The database's clock counts whole milliseconds, truncated: a hold it stored as
/// expiring at `NOW + lease` could lapse up to a tick before the lease had passed since
/// the request was sent (the lock-history checker saw a grant 0.1 ms early on
/// SQLite). Every stored expiry is one tick beyond the lease, exclusive and shared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_outlives_its_lease_by_the_clock_tick() {
    for (label, url) in sql_backends() {
        let lease = Duration::from_secs(2);
        let m = manager(&url, JdbcOptions::default(), lease).await;
        let name = format!("tick-{:x}", fastrand::u64(..));
        let x = m
            .lock(&name)
            .try_lock_with_lease(Duration::ZERO, lease)
            .await
            .unwrap()
            .unwrap();
        let span = raw_scalars(
            &label,
            &url,
            "SELECT expires_at - acquired_at FROM dlock_locks WHERE name = ?",
            &name,
        )
        .await;
        assert_eq!(span, [2001], "{label}: exclusive hold's stored span (ms)");
        x.unlock().await.unwrap();
        let r = m
            .read_write_lock(&name)
            .read()
            .try_lock_with_lease(Duration::ZERO, lease)
            .await
            .unwrap()
            .unwrap();
        let span = raw_scalars(
            &label,
            &url,
            "SELECT expires_at - acquired_at FROM dlock_readers WHERE name = ?",
            &name,
        )
        .await;
        assert_eq!(span, [2001], "{label}: shared hold's stored span (ms)");
        r.unlock().await.unwrap();
        m.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_survive_the_row_being_deleted() {
    for (label, url) in sql_backends() {
        let m = manager(&url, JdbcOptions::default(), LONG_LEASE).await;
        let name = format!("fence-del-{:x}", fastrand::u64(..));
        let mut last = 0;
        for round in 0..4 {
            let g = take(&m.lock(&name), Duration::ZERO).await;
            let token = g.fencing_token().get();
            assert!(
                token > last,
                "{label}: token {token} after {last} in round {round}"
            );
            last = token;
            g.unlock().await.unwrap();
            // An operator (or a cleanup job) deletes the lock's row entirely.
            raw_scalars(
                &label,
                &url,
                "DELETE FROM dlock_locks WHERE name = ?",
                &name,
            )
            .await;
            if label == "sqlite" {
                // SQLite's clock has millisecond resolution: the documented promise
                // holds once the clock has left the last grant's millisecond (the
                // servers' clocks count microseconds, which a round trip always
                // outlasts).
                wait_for_sqlite_clock_past(&url, last / 1000).await;
            }
        }
        m.close().await;
    }
}

/// Schema version 5 keeps a semaphore's holders in its own row; a process still on
/// version 4 wrote a `readers` row per holder instead. While such a row is live, no
/// permit is granted (the new grant cannot count it): an upgrade never over-grants
/// past a holder from before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_holder_from_schema_4_keeps_the_permits_from_being_granted() {
    for (label, url) in sql_backends() {
        let m = manager(&url, JdbcOptions::default(), LONG_LEASE).await;
        let name = format!("sem-v4-{:x}", fastrand::u64(..));
        let sem = m.semaphore(&name, 3);
        // The semaphore's row exists (a first grant), then a version-4 holder of 1.
        take_permits(&sem, 1).await.release().await.unwrap();
        raw_scalars(
            &label,
            &url,
            "INSERT INTO dlock_readers (name, owner, token, context, acquired_at, expires_at, permits) \
             VALUES (?, 'v4-holder', 1, NULL, 0, 9000000000000000, 1)",
            &name,
        )
        .await;
        let refused = sem.try_acquire(1, Duration::ZERO).await.unwrap();
        assert!(
            refused.is_none(),
            "{label}: a permit was granted past a version-4 holder"
        );
        raw_scalars(
            &label,
            &url,
            "DELETE FROM dlock_readers WHERE name = ?",
            &name,
        )
        .await;
        let granted = sem.try_acquire(1, Duration::ZERO).await.unwrap();
        assert!(
            granted.is_some(),
            "{label}: the holder left, the permits did not come back"
        );
        granted.unwrap().release().await.unwrap();
        m.close().await;
    }
}

/// A semaphore's holders live in its row, which does not grow with holders that
/// died: a lapsed entry leaves at the next renewal of a live holder, and a lapsed
/// oldest entry with the next grant (on SQLite and PostgreSQL every lapsed entry
/// does; MySQL's grant drops the oldest only, keeping one `JSON_TABLE` per grant).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lapsed_permit_holders_leave_the_semaphores_row() {
    for (label, url) in sql_backends() {
        // Short, so the lapses are quick, yet long enough for the live holder's
        // renewals (every third) on a loaded machine: at 300 ms one came too late
        // once, the live holder lapsed too and nobody renewed to drop the entries.
        let lease = Duration::from_millis(900);
        let live = manager(&url, JdbcOptions::default(), lease).await;
        let dead = DistributeLockManager::builder(JdbcBackend::connect(&url).await.unwrap())
            .lease(lease)
            .watchdog(false)
            .build()
            .unwrap();
        let name = format!("sem-row-{:x}", fastrand::u64(..));
        let entries_sql = match label.as_str() {
            "sqlite" => "SELECT json_array_length(holders) FROM dlock_locks WHERE name = ?",
            "mysql" => "SELECT JSON_LENGTH(holders) FROM dlock_locks WHERE name = ?",
            _ => "SELECT jsonb_array_length(holders)::bigint FROM dlock_locks WHERE name = ?",
        };
        let entries = || raw_scalars(&label, &url, entries_sql, &name);
        let sem = live.semaphore(&name, 3);
        let lapse = |what: &'static str| {
            let dead = &dead;
            let name = &name;
            let label = &label;
            async move {
                let lapsing = take_permits(&dead.semaphore(name, 3), 1).await;
                let lost =
                    tokio::time::timeout(Duration::from_secs(5), lapsing.lost_signal().lost())
                        .await;
                assert!(
                    lost.is_ok(),
                    "{label}: {what}: the unrenewed holder kept its permit"
                );
                lapsing
            }
        };
        // A live (renewed) holder first, then one that lapses behind it.
        let renewed = take_permits(&sem, 1).await;
        let lapsed = lapse("behind a renewed holder").await;
        let dropped = eventually(Duration::from_secs(5), || async { entries().await == [1] }).await;
        assert!(
            dropped,
            "{label}: a renewal kept the lapsed entry: {:?}",
            entries().await
        );
        renewed.release().await.unwrap();
        assert_eq!(entries().await, [0], "{label}: entries after the release");
        drop(lapsed);
        // A lapsed oldest entry leaves with the next grant.
        let lapsed = lapse("alone").await;
        // The lost signal fires a margin before the lease ends: wait for the end.
        let ended = eventually(Duration::from_secs(5), || async {
            sem.held().await.is_ok_and(|n| n == 0)
        })
        .await;
        assert!(ended, "{label}: the unrenewed holder's lease did not end");
        let granted = take_permits(&sem, 1).await;
        assert_eq!(
            entries().await,
            [1],
            "{label}: entries after a grant past a lapsed holder"
        );
        granted.release().await.unwrap();
        drop(lapsed);
        live.close().await;
        dead.close().await;
    }
}

/// A grant asked for again (the same owner and grant: a retried statement) is
/// granted and keeps one entry — the retry's, with the token it returned — which one
/// release removes. On MySQL a holder identity longer than its 255-byte column is
/// refused with `InvalidArgument` (it would be cut short when read back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_permit_grant_keeps_one_entry() {
    for (label, url) in sql_backends() {
        let backend = JdbcBackend::connect(&url).await.unwrap();
        let name = LockName::new(format!("sem-retry-{:x}", fastrand::u64(..))).unwrap();
        let req = permit_request(&name, "retrier", 7, 2);
        let mut token = None;
        for attempt in 0..2 {
            token = backend.try_acquire(&req).await.unwrap().token();
            assert!(token.is_some(), "{label}: attempt {attempt} refused");
        }
        // The entry is the retry's: the token it returned.
        let state = backend.inspect(&name).await.unwrap().unwrap();
        assert_eq!(state.holders.len(), 1, "{label}: {state:?}");
        assert_eq!(Some(state.holders[0].token), token, "{label}: {state:?}");
        let release = permit_release(&name, "retrier", 7, 2);
        assert_eq!(
            backend.release(&release).await.unwrap(),
            ReleaseResult::Released
        );
        assert!(
            backend.inspect(&name).await.unwrap().is_none(),
            "{label}: holders left"
        );
        let long = permit_request(&name, &"o".repeat(300), 1, 1);
        let answer = backend.try_acquire(&long).await;
        if label == "mysql" {
            let err = answer.expect_err("a 300-byte holder identity on MySQL");
            assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        } else {
            assert!(
                answer.unwrap().token().is_some(),
                "{label}: a long owner was refused"
            );
        }
        backend.close().await;
    }
}

/// Owners are any text (`OwnerId::new`): a release finds its own entry in the
/// semaphore's row byte for byte, never another owner's that a pattern would match
/// (MySQL looks it up with `JSON_SEARCH`, whose `%` and `_` are wildcards).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_release_finds_its_owner_exactly() {
    for (label, url) in sql_backends() {
        let backend = JdbcBackend::connect(&url).await.unwrap();
        let name = LockName::new(format!("sem-owner-{:x}", fastrand::u64(..))).unwrap();
        // Granted in this order: the first would match the others' text as a pattern.
        let owners = ["oX1%", "o_1%", "O_1\\%"];
        for owner in owners {
            let granted = backend
                .try_acquire(&permit_request(&name, owner, 1, 1))
                .await
                .unwrap();
            assert!(granted.token().is_some(), "{label}: {owner} was refused");
        }
        for owner in owners.iter().rev() {
            assert_eq!(
                backend
                    .release(&permit_release(&name, owner, 1, 1))
                    .await
                    .unwrap(),
                ReleaseResult::Released,
                "{label}: {owner}'s release"
            );
        }
        assert!(
            backend.inspect(&name).await.unwrap().is_none(),
            "{label}: holders left"
        );
        backend.close().await;
    }
}

/// Closing a backend returns at once, on PostgreSQL too, whose release-notice
/// listener holds a connection of the pool (a pool's close waits for every
/// connection to come back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_backend_returns_at_once() {
    for (label, url) in sql_backends() {
        let backend = JdbcBackend::connect(&url).await.unwrap();
        let name = LockName::new(format!("close-{:x}", fastrand::u64(..))).unwrap();
        let granted = backend
            .try_acquire(&permit_request(&name, "closer", 1, 1))
            .await
            .unwrap();
        assert!(granted.token().is_some(), "{label}");
        let closed = tokio::time::timeout(Duration::from_secs(5), backend.close()).await;
        assert!(closed.is_ok(), "{label}: close() did not return within 5 s");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_longer_than_the_column_are_invalid_not_truncated() {
    for (label, url) in sql_backends() {
        let m = manager(&url, JdbcOptions::default(), LONG_LEASE).await;
        let base = format!("long-{:x}-", fastrand::u64(..));
        let fits = format!(
            "{base}{}",
            "é".repeat((dlock_jdbc::MAX_NAME_LEN - base.len()) / 2)
        );
        let too_long = format!("{fits}xx");
        assert!(
            fits.len() <= dlock_jdbc::MAX_NAME_LEN && too_long.len() > dlock_jdbc::MAX_NAME_LEN
        );
        let g = m
            .lock(&fits)
            .try_lock(Duration::ZERO)
            .await
            .unwrap()
            .unwrap();
        let err = m
            .lock(&too_long)
            .try_lock(Duration::ZERO)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidName, "{label}: {err}");
        // The long name did not land on the one that fits.
        assert_eq!(m.inspect(&fits).await.unwrap().unwrap().holders.len(), 1);
        g.unlock().await.unwrap();
        m.close().await;
    }
}

/// The `synchronous_commit` setting of a session of `backend`'s pool.
async fn synchronous_commit(backend: &JdbcBackend) -> String {
    let dlock_jdbc::SqlPool::Postgres(pool) = backend.sqlx_pool() else {
        panic!("a PostgreSQL backend")
    };
    let (setting,): (String,) = sqlx::query_as("SHOW synchronous_commit")
        .fetch_one(pool)
        .await
        .unwrap();
    setting
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_asynchronous_commit_is_opted_into_in_the_url() {
    let Some(url) = sql_url("postgres") else {
        return;
    };
    let durable = JdbcBackend::connect(&url).await.unwrap();
    assert_eq!(synchronous_commit(&durable).await, "on");
    let fast = JdbcBackend::connect(&async_commit_url(&url)).await.unwrap();
    assert_eq!(synchronous_commit(&fast).await, "off");
    // Locks on it work with the durable backend's: one row, one counter.
    let name = format!("async-commit-{:x}", fastrand::u64(..));
    let (a, b) = (
        DistributeLockManager::builder(durable).build().unwrap(),
        DistributeLockManager::builder(fast).build().unwrap(),
    );
    let first = a.lock(&name).lock().await.unwrap();
    assert!(b
        .lock(&name)
        .try_lock(Duration::ZERO)
        .await
        .unwrap()
        .is_none());
    let token = first.fencing_token();
    first.unlock().await.unwrap();
    let second = take(&b.lock(&name), Duration::ZERO).await;
    assert!(second.fencing_token() > token);
    second.unlock().await.unwrap();
    a.close().await;
    b.close().await;
}

/// PostgreSQL: a release and a waiter's queue entry and its removal commit
/// asynchronously, each for its own transaction alone: the session they ran on
/// (the pool's only one) is back at the server's durable setting after them, so
/// the grants and renewals it runs next still wait for their flush.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_quick_commit_ends_with_its_own_transaction() {
    let Some(url) = sql_url("postgres") else {
        return;
    };
    let (backend, locks) =
        backend_and_manager(&url, JdbcOptions::default().max_connections(1), LONG_LEASE).await;
    let name = format!("quick-{:x}", fastrand::u64(..));
    let held = take(&locks.lock(&name), Duration::ZERO).await;
    // Refused after a short wait: queued, then out of the queue again.
    let waited = locks.lock(&name).try_lock(Duration::from_millis(50)).await;
    assert!(waited.unwrap().is_none(), "postgres: granted a held lock");
    held.unlock().await.unwrap();
    assert_eq!(synchronous_commit(&backend).await, "on");
    locks.close().await;
}

/// A pool of one connection is enough: every statement shares it, the release
/// notices come on PostgreSQL's own listening session (which used to hold the
/// pool's only connection, so every statement timed out), and a waiter is woken
/// by the release — its own pool's or the application's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_one_connection_is_enough() {
    for (label, url) in sql_backends() {
        let one = JdbcOptions::default()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(2));
        let own = JdbcBackend::connect_with(&url, one.clone()).await.unwrap();
        let shared = match label.as_str() {
            "postgres" => {
                let pool = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(1)
                    .connect(&url)
                    .await
                    .unwrap();
                Some(JdbcBackend::from_pool(pool, one).await.unwrap())
            }
            _ => None,
        };
        for backend in std::iter::once(own).chain(shared) {
            let locks = DistributeLockManager::builder(backend).build().unwrap();
            let name = format!("one-conn-{:x}", fastrand::u64(..));
            let held = locks
                .lock(&name)
                .try_lock(Duration::ZERO)
                .await
                .unwrap_or_else(|e| panic!("{label}: a pool of one: {e}"))
                .unwrap_or_else(|| panic!("{label}: a free lock refused"));
            let waiting = {
                let lock = locks.lock(&name);
                tokio::spawn(async move { lock.try_lock(Duration::from_secs(10)).await })
            };
            handed_over(held, waiting, &label).await;
            locks.close().await;
        }
    }
}

/// The release notices naming `lock` that reach a listener on the release channel
/// before a marker notice sent after them (notices arrive in commit order).
async fn release_notices_for(
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_release_notices_go_out_when_someone_waits_or_a_term_ends() {
    let Some(url) = sql_url("postgres") else {
        return;
    };
    let backend = JdbcBackend::connect(&url).await.unwrap();
    let mut listener = sqlx::postgres::PgListener::connect(&url).await.unwrap();
    listener.listen("dlock_release").await.unwrap();
    let lock = format!("quiet-{:x}", fastrand::u64(..));
    let name = LockName::new(lock.clone()).unwrap();
    let ask = |owner: &str| {
        AcquireRequest::new(name.clone(), OwnerId::new(owner), GrantId::new(1))
            .with_lease(Duration::from_secs(30))
    };
    // Nobody waits: no notice.
    let alone = ask("a");
    assert!(backend.try_acquire(&alone).await.unwrap().is_acquired());
    let released = backend.release(&alone.release_of_grant()).await.unwrap();
    assert_eq!(released, ReleaseResult::Released);
    assert_eq!(release_notices_for(&mut listener, &url, &lock).await, 0);
    // A term of leadership ends: its observers hear of it, waiters or not.
    let term = ask("a").with_purpose(dlock_spi::HoldPurpose::Leadership);
    assert!(backend.try_acquire(&term).await.unwrap().is_acquired());
    backend.release(&term.release_of_grant()).await.unwrap();
    assert_eq!(release_notices_for(&mut listener, &url, &lock).await, 1);
    // Someone waits: the release tells it.
    assert!(backend.try_acquire(&alone).await.unwrap().is_acquired());
    let waiter = {
        let backend = backend.clone();
        let req = ask("b").with_deadline(Some(Instant::now() + Duration::from_secs(10)));
        tokio::spawn(async move { backend.try_acquire(&req).await.unwrap() })
    };
    assert!(
        eventually(Duration::from_secs(5), || async {
            backend
                .inspect(&name)
                .await
                .unwrap()
                .is_some_and(|state| state.waiters.is_some_and(|n| n > 0))
        })
        .await,
        "the waiter never queued"
    );
    backend.release(&alone.release_of_grant()).await.unwrap();
    assert!(waiter.await.unwrap().is_acquired());
    assert_eq!(release_notices_for(&mut listener, &url, &lock).await, 1);
    backend.close().await;
}

/// How long after `held`'s release a waiter on `waiter` (whose backend is
/// `backend`) is granted `name`: it waits up to 20 s, and `held` is released once
/// it is queued (refused, so it waits its turn).
async fn granted_after_release(
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_notice_wakes_a_slow_poller_at_once() {
    for (label, url) in notified_backends() {
        // Pollers that would otherwise sleep 3 s between tries.
        let holder = manager(&url, JdbcOptions::default(), LONG_LEASE).await;
        let (backend, waiter) = backend_and_manager(&url, polling_every(3), LONG_LEASE).await;
        let name = format!("notify-{:x}", fastrand::u64(..));
        let g = take(&holder.lock(&name), Duration::ZERO).await;
        let delay = granted_after_release(&waiter, &backend, &name, g).await;
        assert!(
            delay < Duration::from_millis(1000),
            "{label}: woken {delay:?} after the release; the release notice did not arrive"
        );
        holder.close().await;
        waiter.close().await;
    }
}

/// A release on PostgreSQL or SQLite wakes the writer first in the queue, not a
/// waiter in every process: six waiters, each on a backend of its own (its own
/// `LISTEN` connection or notice socket, as a process of its own has), polling
/// only every 10 s; one release makes at most two acquire attempts among them (the head's, and at most one more), and the lock
/// passes on down the queue, one notice per release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_notice_wakes_the_writer_first_in_line_only() {
    const WAITERS: usize = 6;
    for (label, url) in notified_backends() {
        let slow = polling_every(10).waiter_liveness(Duration::from_secs(30));
        let holder = manager(&url, JdbcOptions::default(), LONG_LEASE).await;
        let name = format!("head-{:x}", fastrand::u64(..));
        let g = take(&holder.lock(&name), Duration::ZERO).await;
        let (mut backends, mut managers, mut tasks) = (Vec::new(), Vec::new(), Vec::new());
        let granted = Arc::new(tokio::sync::Semaphore::new(0));
        for _ in 0..WAITERS {
            let (backend, m) = backend_and_manager(&url, slow.clone(), LONG_LEASE).await;
            let (lock, granted) = (m.lock(&name), Arc::clone(&granted));
            tasks.push(tokio::spawn(async move {
                let got = lock
                    .try_lock(Duration::from_secs(30))
                    .await
                    .unwrap()
                    .unwrap();
                granted.add_permits(1);
                got.unlock().await.unwrap();
            }));
            backends.push(backend);
            managers.push(m);
        }
        let attempts = || {
            backends
                .iter()
                .map(JdbcBackend::acquire_attempts)
                .sum::<u64>()
        };
        let lock_name = LockName::new(name.clone()).unwrap();
        let queued = eventually(Duration::from_secs(5), || async {
            waiters_of(&backends[0], &lock_name).await == WAITERS
        })
        .await;
        assert!(queued, "{label}: the waiters did not all queue");
        // Each waiter looks once more soon after it queued (a release may have
        // missed its entry), then waits for its notice (its own next look is 10 s
        // off): count from when those looks are over — no attempt for 100 ms.
        let settled = eventually(Duration::from_secs(5), || {
            let last = attempts();
            async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                attempts() == last
            }
        })
        .await;
        assert!(settled, "{label}: the queued waiters kept looking");
        let before = attempts();
        g.unlock().await.unwrap();
        let first = tokio::time::timeout(Duration::from_secs(5), granted.acquire())
            .await
            .unwrap_or_else(|_| {
                panic!("{label}: no waiter was granted the lock within 5 s of the release")
            });
        first.unwrap().forget();
        tokio::time::sleep(Duration::from_millis(200)).await;
        // By now the first waiter has released and the next ones taken it in turn;
        // every release woke exactly its successor.
        let passed = granted.available_permits() + 1;
        let woken = attempts() - before;
        assert!(
            woken <= passed as u64 + 1,
            "{label}: {passed} grant(s) took {woken} acquire attempts among {WAITERS} waiters"
        );
        let all = tokio::time::timeout(Duration::from_secs(10), async {
            for t in tasks {
                t.await.unwrap();
            }
        })
        .await;
        assert!(all.is_ok(), "{label}: the lock did not pass down the queue");
        holder.close().await;
        for m in managers {
            m.close().await;
        }
    }
}

/// PostgreSQL and SQLite: a queued writer waits for the release notice that names it, and
/// looks on its own only as often as the backoff's longest delay — not climbing
/// the backoff from its shortest, which costs every waiter of a hot lock a refused
/// attempt every few milliseconds. With the default backoff (5 ms doubling to
/// 250 ms, equal jitter) the climb makes 6 attempts within the first 160–320 ms of
/// a wait; a waiter that waits for its notice makes at most 4 in 300 ms (the first,
/// the look soon after it queued, then one every 125–250 ms). (That the release wakes
/// it at once: `a_release_notice_wakes_a_slow_poller_at_once`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_writer_waits_for_its_notice_not_a_climbing_backoff() {
    for (label, url) in notified_backends() {
        let holder = manager(&url, JdbcOptions::default(), LONG_LEASE).await;
        let (backend, waiter) = backend_and_manager(&url, JdbcOptions::default(), LONG_LEASE).await;
        let name = format!("told-{:x}", fastrand::u64(..));
        let held = take(&holder.lock(&name), Duration::ZERO).await;
        let started = Instant::now();
        let waiting = {
            let lock = waiter.fair_lock(&name);
            tokio::spawn(async move { lock.try_lock(Duration::from_secs(20)).await })
        };
        assert!(
            eventually(Duration::from_secs(5), || async {
                backend.acquire_attempts() >= 1
            })
            .await,
            "{label}: the waiter never looked"
        );
        tokio::time::sleep(Duration::from_millis(300).saturating_sub(started.elapsed())).await;
        let looks = backend.acquire_attempts();
        assert!(
            looks <= 4,
            "{label}: a queued writer looked {looks} times in its first 300 ms"
        );
        handed_over(held, waiting, &label).await;
        holder.close().await;
        waiter.close().await;
    }
}

/// PostgreSQL: a writer that queues behind another queued writer does not look again
/// right after it queued — a release it raced would have named the writer ahead,
/// whose own release names it — so until its turn its first look is its only one;
/// then the chain of release notices hands the lock to both in turn. Both waiters
/// poll only every 5 s, so each hand-over within 3 s is a notice's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_writer_queued_behind_a_writer_looks_again_only_when_told() {
    let Some(url) = sql_url("postgres") else {
        return;
    };
    let holder = manager(&url, JdbcOptions::default(), LONG_LEASE).await;
    let slow = || polling_every(5).waiter_liveness(Duration::from_secs(30));
    let (ahead_backend, ahead) = backend_and_manager(&url, slow(), LONG_LEASE).await;
    let (backend, behind) = backend_and_manager(&url, slow(), LONG_LEASE).await;
    let name = format!("behind-{:x}", fastrand::u64(..));
    let held = take(&holder.lock(&name), Duration::ZERO).await;
    let wait = Duration::from_secs(30);
    let (ahead_waiting, _) =
        queued_waiter(&ahead_backend, ahead.fair_lock(&name), wait, 2, "postgres").await;
    // Its just-queued look would come 10 ms after its entry; its next poll, 5 s.
    let (behind_waiting, looks) =
        queued_waiter(&backend, behind.lock(&name), wait, 1, "postgres").await;
    assert_eq!(
        looks, 1,
        "postgres: a writer queued behind a writer looked {looks} times in its first 300 ms"
    );
    handed_over(held, ahead_waiting, "postgres").await;
    granted_within(behind_waiting, Duration::from_secs(3), || {
        "postgres: the writer behind was not told when the writer ahead released".into()
    })
    .await;
    holder.close().await;
    ahead.close().await;
    behind.close().await;
}

/// PostgreSQL: notices sent while a backend's `LISTEN` connection is down are lost;
/// when it has connected and listened again, every queued waiter looks at once, so
/// a release it missed costs it a round trip, not its next poll. The waiter polls
/// only every 5 s; the server ends its backend's listener (this test's table prefix
/// names the channel).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_listener_that_comes_back_has_every_waiter_look() {
    let Some(url) = sql_url("postgres") else {
        return;
    };
    let prefix = "dlock_relisten_";
    let holder = manager(
        &url,
        JdbcOptions::default().table_prefix(prefix),
        LONG_LEASE,
    )
    .await;
    let slow = polling_every(5)
        .table_prefix(prefix)
        .waiter_liveness(Duration::from_secs(30));
    let (backend, waiter) = backend_and_manager(&url, slow, LONG_LEASE).await;
    let name = format!("relisten-{:x}", fastrand::u64(..));
    let held = take(&holder.lock(&name), Duration::ZERO).await;
    let (waiting, seen) = queued_waiter(
        &backend,
        waiter.lock(&name),
        Duration::from_secs(30),
        2,
        "postgres",
    )
    .await;
    let mut admin = sqlx::PgConnection::connect(&url).await.unwrap();
    let ended: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE query LIKE 'LISTEN%dlock_relisten_release%'",
    )
    .fetch_all(&mut admin)
    .await
    .unwrap();
    assert!(
        ended.contains(&true),
        "postgres: no listener ended: {ended:?}"
    );
    assert!(
        eventually(Duration::from_secs(2), || async {
            backend.acquire_attempts() > seen
        })
        .await,
        "postgres: the waiter did not look again when its listener came back"
    );
    handed_over(held, waiting, "postgres").await;
    holder.close().await;
    waiter.close().await;
}

/// PostgreSQL: a listener whose connection cannot come back at once — the database
/// refusing connections for longer than the pool's connect bound, so sqlx's own
/// reconnect fails — listens again once it can, and every queued waiter then looks:
/// a release sent while it was down costs the waiter a round trip after the outage,
/// not its next poll (5 s here). (Before, the next `try_recv` reconnected and then
/// waited for a notice; the lost ones were never made up for.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_listener_back_after_a_failed_reconnect_has_every_waiter_look() {
    let Some(url) = sql_url("postgres") else {
        return;
    };
    let prefix = "dlock_relisten_late_";
    let holder = manager(
        &url,
        JdbcOptions::default().table_prefix(prefix),
        LONG_LEASE,
    )
    .await;
    let (proxy, via_proxy) = proxied(&url).await;
    let slow = polling_every(5)
        .table_prefix(prefix)
        .waiter_liveness(Duration::from_secs(30))
        .acquire_timeout(Duration::from_millis(300));
    let (backend, waiter) = backend_and_manager(&via_proxy, slow, LONG_LEASE).await;
    let name = format!("relisten-late-{:x}", fastrand::u64(..));
    let held = take(&holder.lock(&name), Duration::ZERO).await;
    let (waiting, _) = queued_waiter(
        &backend,
        waiter.lock(&name),
        Duration::from_secs(30),
        2,
        "postgres",
    )
    .await;
    // The outage being tested: over three times the pool's connect bound. The
    // release's notice, sent meanwhile, is lost to the waiter's backend.
    proxy.set(Fault::Reset);
    tokio::time::sleep(Duration::from_secs(1)).await;
    held.unlock().await.unwrap();
    proxy.set(Fault::Pass);
    granted_within(waiting, Duration::from_millis(2500), || {
        "postgres: the waiter did not look again once its listener was back".into()
    })
    .await;
    holder.close().await;
    waiter.close().await;
}

/// PostgreSQL: a waiter first in the queue that leaves it while the lock is free —
/// cancelled after the release notice named it, before it took the lock — passes
/// the notice on: the writer queued behind it looks at once instead of at its next
/// poll (5 s here). The first waiter's connections are slowed (100 ms each way), so
/// it is cancelled before the notice reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_waiter_leaving_a_free_lock_passes_the_notice_on() {
    let Some(url) = sql_url("postgres") else {
        return;
    };
    let prefix = "dlock_pass_on_";
    let holder = manager(
        &url,
        JdbcOptions::default().table_prefix(prefix),
        LONG_LEASE,
    )
    .await;
    let slow = || {
        polling_every(5)
            .table_prefix(prefix)
            .waiter_liveness(Duration::from_secs(30))
    };
    let (proxy, via_proxy) = proxied(&url).await;
    let (first_backend, first) = backend_and_manager(&via_proxy, slow(), LONG_LEASE).await;
    let (next_backend, next) = backend_and_manager(&url, slow(), LONG_LEASE).await;
    let name = format!("pass-on-{:x}", fastrand::u64(..));
    let held = take(&holder.lock(&name), Duration::ZERO).await;
    let (first_waiting, _) = queued_waiter(
        &first_backend,
        first.lock(&name),
        Duration::from_secs(30),
        2,
        "postgres",
    )
    .await;
    let (next_waiting, _) = queued_waiter(
        &next_backend,
        next.lock(&name),
        Duration::from_secs(30),
        1,
        "postgres",
    )
    .await;
    proxy.set(Fault::Delay(Duration::from_millis(100)));
    let released = Instant::now();
    held.unlock().await.unwrap();
    first_waiting.abort();
    assert!(first_waiting.await.is_err_and(|e| e.is_cancelled()));
    granted_within(next_waiting, Duration::from_secs(3), || {
        format!(
            "postgres: the next writer was not told when the first left a free lock ({:?} since the release)",
            released.elapsed()
        )
    })
    .await;
    proxy.set(Fault::Pass);
    holder.close().await;
    first.close().await;
    next.close().await;
}

/// PostgreSQL: a refused acquire leaves the lock's row alone. An upsert whose
/// `DO UPDATE` condition fails still locks the row, so its transaction takes an id,
/// writes the lock to the WAL and waits for the disk at commit — and the grant or
/// release the lock is waiting for queues behind it (on a contended lock, every
/// newcomer's refusal lands in the hand-over). Here another session holds the row
/// (as a statement in flight does): a newcomer refused because the lock is held,
/// and a fair one refused because a waiter is queued ahead of a free lock, must
/// both answer at once, not when that session ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_refused_acquire_does_not_wait_for_the_locks_row() {
    let Some(url) = sql_url("postgres") else {
        return;
    };
    let options = JdbcOptions::default().table_prefix("dlock_rowlock_");
    let holder = manager(&url, options.clone(), LONG_LEASE).await;
    let newcomer = manager(&url, options, LONG_LEASE).await;
    let name = format!("rowlock-{:x}", fastrand::u64(..));
    /// Another session holds the lock's row (as a statement in flight does) while
    /// `lock` asks once: it must be refused, at once.
    async fn refused_beside_the_row_held(
        other: &mut sqlx::PgConnection,
        lock: dlock_api::DistributeLock,
        case: &str,
    ) {
        let mut row_held = other.begin().await.unwrap();
        sqlx::query("SELECT 1 FROM dlock_rowlock_locks WHERE name = $1 FOR UPDATE")
            .bind(lock.name().unwrap().as_str())
            .execute(&mut *row_held)
            .await
            .unwrap();
        let refused = tokio::time::timeout(Duration::from_secs(3), lock.try_lock(Duration::ZERO))
            .await
            .unwrap_or_else(|_| panic!("postgres: a refusal waited for the lock's row ({case})"));
        assert!(refused.unwrap().is_none(), "postgres: granted ({case})");
        row_held.rollback().await.unwrap();
    }
    let held = take(&holder.lock(&name), Duration::ZERO).await;
    let mut other = sqlx::PgConnection::connect(&url).await.unwrap();
    refused_beside_the_row_held(&mut other, newcomer.lock(&name), "the lock held").await;

    // Free, with a live waiter (another process's, written here) queued.
    held.unlock().await.unwrap();
    sqlx::query(
        "INSERT INTO dlock_rowlock_waiters (name, waiter, mode, arrived, alive_until) \
         SELECT $1, 'elsewhere#1', 'x', now_ms - 1000, now_ms + 60000 \
         FROM (SELECT (EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::BIGINT AS now_ms) t",
    )
    .bind(&name)
    .execute(&mut other)
    .await
    .unwrap();
    refused_beside_the_row_held(
        &mut other,
        newcomer.fair_lock(&name),
        "fair, a waiter ahead",
    )
    .await;
    sqlx::query("DELETE FROM dlock_rowlock_waiters WHERE name = $1")
        .bind(&name)
        .execute(&mut other)
        .await
        .unwrap();
    holder.close().await;
    newcomer.close().await;
}

thread_local! {
    /// The statements sqlx has run on this thread (see [`statements_here`]).
    static STATEMENTS_HERE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Counts sqlx's statement events (`sqlx::query`) per thread, as the process's
/// global subscriber. (A thread's own default subscriber is not enough: when it is
/// the only one, a statement site another thread meets first is cached as of no
/// interest for every thread.)
struct StatementCounter;

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
fn statements_here() -> u64 {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        tracing::subscriber::set_global_default(StatementCounter)
            .expect("no other global subscriber in this test binary");
    });
    STATEMENTS_HERE.with(std::cell::Cell::get)
}

/// PostgreSQL: a refused writer that needs no place in the queue — one that does not
/// wait, or a queued writer, which waits for the release notice naming it — learns
/// what the lock is busy with from its grant statement: one statement per refused
/// look, not a grant and then a contention read. (Every waiter of a busy lock sends
/// these, and they load the server the hand-over runs on.) Counted on the client:
/// sqlx's statement events, on this test's single thread ([`statements_here`]).
#[tokio::test]
async fn postgres_a_refused_writer_reads_the_lock_in_its_grant_statement() {
    let Some(url) = sql_url("postgres") else {
        return;
    };
    let backend = JdbcBackend::connect(&url).await.unwrap();
    let name = LockName::new(format!("one-read-{:x}", fastrand::u64(..))).unwrap();
    let ask = |owner: &str| {
        AcquireRequest::new(name.clone(), OwnerId::new(owner), GrantId::new(1))
            .with_lease(LONG_LEASE)
    };
    let held = ask("holder");
    assert!(backend.try_acquire(&held).await.unwrap().is_acquired());
    let before = statements_here();

    // Not waiting: one statement, which says who holds the lock and for how long.
    let refused = backend.try_acquire(&ask("newcomer")).await.unwrap();
    let sent = statements_here() - before;
    let AcquireResult::NotAcquired {
        holder,
        retry_after,
        ..
    } = refused
    else {
        panic!("postgres: granted a held lock")
    };
    assert_eq!(
        sent, 1,
        "postgres: a refusal without a wait ran {sent} statements"
    );
    assert_eq!(holder, Some(OwnerId::new("holder")));
    assert!(
        retry_after.is_some_and(|left| left > LONG_LEASE - Duration::from_secs(10)),
        "postgres: the holder's lease left read as {retry_after:?}"
    );

    // Waiting 300 ms: each look is its grant statement; the wait adds its queue
    // entry and its removal.
    let looks_before = backend.acquire_attempts();
    let waited = backend
        .try_acquire(
            &ask("waiter").with_deadline(Some(Instant::now() + Duration::from_millis(300))),
        )
        .await
        .unwrap();
    let looks = backend.acquire_attempts() - looks_before;
    let sent = statements_here() - before - sent;
    assert!(!waited.is_acquired(), "postgres: granted a held lock");
    assert!(looks >= 2, "postgres: the waiter looked {looks} times");
    assert!(
        sent <= looks + 2,
        "postgres: {looks} looks ran {sent} statements (a grant each, the queue entry and its removal)"
    );
    backend.release(&held.release_of_grant()).await.unwrap();
    backend.close().await;
}

/// MariaDB/MySQL: a waiter blocked on the lock's bell is granted as soon as the
/// holder releases, though it would poll only every 3 s. The holder waited for the
/// lock itself (on the bell, which it found free and kept), so it holds the bell,
/// and its release rings it — after the release committed: a ring before it wakes
/// the waiter to a lock still held, and it goes back to polling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_release_rings_the_bell_its_waiter_blocks_on() {
    let Some(url) = sql_url("mysql") else {
        return;
    };
    let first = manager(&url, JdbcOptions::default(), LONG_LEASE).await;
    let (holder_backend, holder) =
        backend_and_manager(&url, JdbcOptions::default(), LONG_LEASE).await;
    // Polls every 3 s, and blocks on a bell at most a third of its 9 s liveness.
    let slow = polling_every(3).waiter_liveness(Duration::from_secs(9));
    let (waiter_backend, waiter) = backend_and_manager(&url, slow, LONG_LEASE).await;
    let name = format!("bell-{:x}", fastrand::u64(..));

    // The holder waits for `first`'s hold: it takes the free bell and keeps it.
    let g = take(&first.lock(&name), Duration::ZERO).await;
    let lock = holder.lock(&name);
    let holding = tokio::spawn(async move { lock.try_lock(Duration::from_secs(20)).await });
    assert!(
        eventually(Duration::from_secs(5), || async {
            holder_backend.bells_taken() >= 1
        })
        .await,
        "the holder never took the bell"
    );
    g.unlock().await.unwrap();
    let held = holding.await.unwrap().unwrap().expect("the holder's grant");

    // The waiter blocks on the holder's bell; the release wakes it.
    let delay = granted_after_release(&waiter, &waiter_backend, &name, held).await;
    assert_eq!(
        waiter_backend.bells_taken(),
        1,
        "the waiter was granted without the bell ringing"
    );
    assert!(
        delay < Duration::from_millis(1500),
        "woken {delay:?} after the release (its bell wait ends after 3 s)"
    );
    for m in [first, holder, waiter] {
        m.close().await;
    }
}

/// The session modes: a new context (a leader proclaiming) whose statement fails
/// (here: on a session an operator killed) closes the hold's connection: the hold's
/// feed reports the loss within its next ask — it read the empty slot as a release
/// and ended quietly before — and another client gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_mode_a_failed_context_write_is_reported_lost() {
    for label in ["postgres-session", "mysql-session"] {
        if !selected().iter().any(|l| l == label) {
            continue;
        }
        let url = server_url(label).unwrap();
        let backend = JdbcBackend::connect(&url).await.unwrap();
        let rival = JdbcBackend::connect(&url).await.unwrap();
        let name = LockName::new(format!("ctx-drop-{:x}", fastrand::u64(..))).unwrap();
        let req = AcquireRequest::new(
            name.clone(),
            OwnerId::new("holder".to_owned()),
            GrantId::new(1),
        );
        let AcquireResult::Acquired { token, watch, .. } = backend.try_acquire(&req).await.unwrap()
        else {
            panic!("{label}: uncontended grant refused");
        };
        let mut feed = watch
            .and_then(|w| w.take())
            .expect("a session hold has a feed");
        let renew = dlock_spi::RenewRequest::new(
            name.clone(),
            req.owner.clone(),
            req.grant,
            LockMode::Exclusive,
            Duration::from_secs(4),
            token,
        )
        .with_context(dlock_spi::Bytes::from_static(b"proclaimed"));
        // The session ended from outside (an operator's kill), then a new
        // context: its statement fails on the dead connection, which closes.
        let killed = dlock_spi::LockAdmin::force_release(&rival, &name)
            .await
            .unwrap();
        assert_eq!(killed, 1, "{label}: kill");
        assert!(
            backend.renew(&renew).await.is_err(),
            "{label}: a context written on a killed session"
        );
        let status = tokio::time::timeout(Duration::from_secs(3), feed.next())
            .await
            .unwrap_or_else(|_| panic!("{label}: no status within 3 s"));
        assert!(
            matches!(status, Some(dlock_spi::HoldStatus::Lost(_))),
            "{label}: the broken hold's feed said {status:?}"
        );
        let other = AcquireRequest::new(
            name.clone(),
            OwnerId::new("rival".to_owned()),
            GrantId::new(1),
        )
        .with_deadline(Some(Instant::now() + Duration::from_secs(2)));
        assert!(
            matches!(
                rival.try_acquire(&other).await.unwrap(),
                AcquireResult::Acquired { .. }
            ),
            "{label}: the lock did not come free with the broken session"
        );
        backend.close().await;
        rival.close().await;
    }
}

/// The session modes: a holder whose process stood still past half the session
/// timeout `K` (4 s) — here its runtime is not run for 2.5 s, as under a SIGSTOP or
/// a long pause: its feed's asks at `K/5` and its loss at `K/2` fall due meanwhile —
/// is told its hold is lost as soon as it runs again, and the lock passes to the
/// waiter only when the server would have ended the silent session on its own (`K`
/// after the hold's last answered ask): the lost signal leads the next grant by `K`
/// less the stall (1.5 s). The feed used to close the session the moment it
/// declared the loss, and the waiter was granted within milliseconds of the signal
/// — the lock-history checker's `mysql-session` stop run (seed 3702187) saw a
/// process continued from a 3 s stop write 5 ms after its lost signal, 2 ms after
/// the next grant.
#[test]
fn session_mode_a_stalled_holder_is_told_before_its_lock_passes_on() {
    const STALL: Duration = Duration::from_millis(2500);
    for label in ["postgres-session", "mysql-session"] {
        if !selected().iter().any(|l| l == label) {
            continue;
        }
        let url = server_url(label).unwrap().to_string();
        let name = format!("stalled-{:x}", fastrand::u64(..));
        // The holder's runtime runs only inside its `block_on` calls.
        let holder_rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (holder, guard) = holder_rt.block_on(async {
            let m = manager(&url, JdbcOptions::default(), LONG_LEASE).await;
            let g = take(&m.lock(&name), Duration::ZERO).await;
            (m, g)
        });
        let granted = Instant::now();
        let waiter = std::thread::spawn({
            let (url, name) = (url.clone(), name.clone());
            move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    let m = manager(&url, JdbcOptions::default(), LONG_LEASE).await;
                    let g = take(&m.lock(&name), Duration::from_secs(10)).await;
                    let at = Instant::now();
                    g.unlock().await.unwrap();
                    m.close().await;
                    at
                })
            }
        });
        // The stall is the fault under test: nothing of the holder's runs.
        std::thread::sleep(STALL);
        // From here on the holder's runtime runs (its tasks close what it must)
        // until the waiter is done.
        let (told, next_grant) = holder_rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(1), guard.lost())
                .await
                .unwrap_or_else(|_| panic!("{label}: not told of the loss once running again"));
            let told = Instant::now();
            let next_grant = tokio::task::spawn_blocking(move || waiter.join().unwrap())
                .await
                .unwrap();
            (told, next_grant)
        });
        let lead = next_grant.saturating_duration_since(told);
        println!(
            "{label}: told {:?} after the grant, the next grant {:?} after it",
            told - granted,
            lead
        );
        assert!(
            lead >= Duration::from_secs(1),
            "{label}: the lost signal led the next grant by {lead:?}, not K less the stall (1.5 s)"
        );
        assert!(
            next_grant - granted < SESSION_MODE_TIMEOUT + Duration::from_secs(1),
            "{label}: the lock passed on {:?} after the grant, not by K",
            next_grant - granted
        );
        holder_rt.block_on(async {
            drop(guard);
            holder.close().await;
        });
    }
}

/// PostgreSQL's session mode behind a transaction pooler (PgBouncer in transaction
/// mode, which `scripts/test` starts with the `postgres-session` label) is refused
/// with a `Config` error that names the pooler, before any lock is granted: each
/// statement may reach another server session, so an advisory lock would outlive
/// or miss its hold. (It granted a lock there before: `dlock exec` ran its
/// command.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_session_refuses_a_transaction_pooler() {
    if !selected().iter().any(|l| l == "postgres-session") {
        return;
    }
    let pooler = std::env::var("DLOCK_PGBOUNCER_URL")
        .expect("DLOCK_PGBOUNCER_URL: scripts/test starts PgBouncer for postgres-session");
    for round in 0..3 {
        let url = format!("{pooler}?dlock_mode=session&dlock_session_timeout=4s");
        let err = match JdbcBackend::connect(&url).await {
            Ok(backend) => {
                backend.close().await;
                panic!("round {round}: the session mode opened behind a transaction pooler");
            }
            Err(err) => err,
        };
        assert_eq!(
            err.kind(),
            dlock_spi::ErrorKind::Config,
            "round {round}: {err}"
        );
        assert!(err.message().contains("pooler"), "round {round}: {err}");
    }
}

/// The row mode behind PgBouncer (transaction pooling) with `dlock_pooler=transaction`:
/// its statements carry their parameters as literals, so names, owners and contexts
/// that look like SQL (quotes, backslashes, `$1`, `E'`, a comment, non-ASCII) reach
/// the database as they were given and touch nothing else: each lock is taken and
/// inspected with its own name, owner and context (every byte value), a lock whose
/// name is a prefix of theirs stays free, and each release frees its own lock only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_pooler_mode_keeps_names_owners_and_contexts_as_given() {
    if !selected().iter().any(|l| l == "postgres-pgbouncer") {
        return;
    }
    let url = server_url("postgres-pgbouncer").unwrap();
    let backend = JdbcBackend::connect(&url).await.unwrap();
    let run = format!("{:x}", fastrand::u64(..));
    let plain = LockName::new(format!("lit-{run}")).unwrap();
    let context: Vec<u8> = (0..=255u8).collect();
    let tricky = [
        "'",
        "''; DELETE FROM dlock_locks; --",
        "\\'",
        "\\",
        "$1 $2 E'x'",
        "é ü \u{1F512} \\x41",
        "') OR ('1'='1",
    ];
    for (i, suffix) in tricky.iter().enumerate() {
        let name = LockName::new(format!("lit-{run}{suffix}")).unwrap();
        let owner = OwnerId::new(format!("owner{suffix}"));
        let req = AcquireRequest::new(name.clone(), owner.clone(), GrantId::new(i as u64 + 1))
            .with_context(dlock_spi::Bytes::from(context.clone()));
        let AcquireResult::Acquired { token, .. } = backend.try_acquire(&req).await.unwrap() else {
            panic!("{suffix:?}: an uncontended grant was refused");
        };
        let state = backend
            .inspect(&name)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{suffix:?}: the held lock is not found by its name"));
        assert_eq!(state.holders.len(), 1, "{suffix:?}: {state:?}");
        let holder = &state.holders[0];
        assert_eq!(holder.owner, owner, "{suffix:?}");
        assert_eq!(holder.token, token, "{suffix:?}");
        assert_eq!(
            &holder.context[..],
            &context[..],
            "{suffix:?}: the context changed"
        );
        let free = backend.inspect(&plain).await.unwrap();
        assert!(
            free.as_ref().is_none_or(|s| s.holders.is_empty()),
            "{suffix:?}: the lock named by the prefix is held: {free:?}"
        );
        let release =
            ReleaseRequest::new(name.clone(), owner, req.grant, LockMode::Exclusive, token);
        assert_eq!(
            backend.release(&release).await.unwrap(),
            ReleaseResult::Released,
            "{suffix:?}"
        );
        let after = backend.inspect(&name).await.unwrap();
        assert!(
            after.as_ref().is_none_or(|s| s.holders.is_empty()),
            "{suffix:?}: still held after its release: {after:?}"
        );
    }
    backend.close().await;
}

/// Behind PgBouncer without `dlock_pooler=transaction`, the row mode's prepared
/// statements meet other clients' on the pooler's shared server sessions: the first
/// such failure is a `Config` error that names the option, not an opaque driver
/// message or a retryable one. Two backends take turns (the pooler hands the second
/// the server session the first just prepared its statements on); the failure comes
/// within a few rounds. (On a PgBouncer of its own: these backends LISTEN, and a
/// server session left listening would break the other tests' pooled clients.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_row_mode_behind_a_pooler_without_the_option_says_what_to_set() {
    if !selected().iter().any(|l| l == "postgres-pgbouncer") {
        return;
    }
    let pooler = std::env::var("DLOCK_PGBOUNCER_SCRATCH_URL")
        .expect("DLOCK_PGBOUNCER_SCRATCH_URL: scripts/test starts a third PgBouncer");
    let opened = [
        JdbcBackend::connect(&pooler).await,
        JdbcBackend::connect(&pooler).await,
    ];
    let mut failure = None;
    let mut backends = Vec::new();
    for b in opened {
        match b {
            Ok(b) => backends.push(b),
            Err(e) => failure = failure.or(Some(e)),
        }
    }
    let name = LockName::new(format!("no-option-{:x}", fastrand::u64(..))).unwrap();
    'rounds: for _ in 0..10 {
        if failure.is_some() {
            break;
        }
        for b in &backends {
            if let Err(e) = b.inspect(&name).await {
                failure = Some(e);
                break 'rounds;
            }
        }
    }
    for b in &backends {
        b.close().await;
    }
    let err =
        failure.expect("the row mode's prepared statements ran behind the pooler for 10 rounds");
    assert_eq!(err.kind(), dlock_spi::ErrorKind::Config, "{err}");
    assert!(!err.is_retryable(), "{err}");
    assert!(err.message().contains("dlock_pooler=transaction"), "{err}");
}

/// A PgBouncer as it ships refuses a startup parameter sqlx sends
/// (`extra_float_digits`): connecting through it is a `Config` error that names the
/// pooler's setting to add, not "refused for now" (retryable: a caller would retry
/// a configuration forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooler_refusing_sqlx_startup_is_a_configuration_error() {
    if !selected().iter().any(|l| l == "postgres-pgbouncer") {
        return;
    }
    let strict = std::env::var("DLOCK_PGBOUNCER_STRICT_URL")
        .expect("DLOCK_PGBOUNCER_STRICT_URL: scripts/test starts a second PgBouncer");
    let err = JdbcBackend::connect(&format!("{strict}?dlock_pooler=transaction"))
        .await
        .expect_err("sqlx's startup went through a PgBouncer that refuses it");
    assert_eq!(err.kind(), dlock_spi::ErrorKind::Config, "{err}");
    assert!(!err.is_retryable(), "{err}");
    assert!(err.message().contains("ignore_startup_parameters"), "{err}");
}

/// `dlock_pooler=transaction` is for PostgreSQL's row mode only: with the session
/// mode, and on SQLite, it is refused with a `Config` error that says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pooler_option_is_refused_where_it_cannot_hold() {
    let mut checked = 0;
    if selected().iter().any(|l| l == "postgres-pgbouncer") {
        let pooler = std::env::var("DLOCK_PGBOUNCER_URL").unwrap();
        let url = format!("{pooler}?dlock_mode=session&dlock_pooler=transaction");
        let err = JdbcBackend::connect(&url)
            .await
            .expect_err("session mode behind a pooler opened");
        assert_eq!(err.kind(), dlock_spi::ErrorKind::Config, "{err}");
        assert!(err.message().contains("row mode"), "{err}");
        checked += 1;
    }
    if let Some(url) = sql_url("sqlite") {
        let err = JdbcBackend::connect(&format!("{}?dlock_pooler=transaction", &*url))
            .await
            .expect_err("SQLite with a pooler option opened");
        assert_eq!(err.kind(), dlock_spi::ErrorKind::Config, "{err}");
        assert!(err.message().contains("PostgreSQL"), "{err}");
        checked += 1;
    }
    if checked == 0 {
        eprintln!("neither postgres-pgbouncer nor sqlite is selected; nothing to check here");
    }
}

/// The migration through PgBouncer runs in one transaction under a
/// transaction-scoped advisory lock: a fresh table prefix, migrated by several
/// backends at once through the pooler, ends with its tables at the newest version
/// and no advisory lock left on any server session (a session-level lock taken on
/// one of the pooler's server sessions and "released" on another would stay).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_migrations_through_a_pooler_leave_no_lock_behind() {
    if !selected().iter().any(|l| l == "postgres-pgbouncer") {
        return;
    }
    let url = server_url("postgres-pgbouncer").unwrap();
    let prefix = format!("mig{:x}_", fastrand::u32(..));
    let opens = (0..4).map(|_| {
        let url = format!("{}&dlock_table_prefix={prefix}", &*url);
        async move { JdbcBackend::connect(&url).await }
    });
    let backends: Vec<JdbcBackend> = futures_util::future::join_all(opens)
        .await
        .into_iter()
        .map(|b| b.expect("migrate through the pooler"))
        .collect();
    let mut direct = sqlx::PgConnection::connect("postgres://postgres@127.0.0.1:5432/test")
        .await
        .unwrap();
    let version: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT MAX(version) FROM {prefix}schema_version"
    )))
    .fetch_one(&mut direct)
    .await
    .unwrap();
    assert_eq!(version, dlock_jdbc::SCHEMA_VERSION);
    let held: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = (hashtext($1)::bigint & 4294967295)::oid",
    )
    .bind(format!("{prefix}migrate"))
    .fetch_one(&mut direct)
    .await
    .unwrap();
    assert_eq!(held, 0, "the migration's advisory lock is still held");
    for b in &backends {
        b.close().await;
    }
    drop_row_tables(&mut direct, &prefix).await;
}

/// Drops the row mode's tables of a test's own `prefix` on PostgreSQL.
async fn drop_row_tables(direct: &mut sqlx::PgConnection, prefix: &str) {
    for table in ["waiters", "readers", "locks", "schema_version"] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP TABLE IF EXISTS {prefix}{table}"
        )))
        .execute(&mut *direct)
        .await
        .unwrap();
    }
}

/// PostgreSQL's migration reads what an earlier migrator committed whatever the
/// server's default isolation: four backends migrating a fresh table prefix at once,
/// their sessions `SERIALIZABLE` by default (`default_transaction_isolation`), all
/// open. (The migration's transaction took its snapshot at its lock statement,
/// before the wait: a migrator that waited read the versions as not applied and
/// failed recording them again — `could not serialize access`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_migrations_see_each_other_under_serializable_defaults() {
    let Some(url) = sql_url("postgres") else {
        return;
    };
    let prefix = format!("ser{:x}_", fastrand::u32(..));
    let sep = if url.contains('?') { '&' } else { '?' };
    let url = format!(
        "{}{sep}options=-c%20default_transaction_isolation%3Dserializable&dlock_table_prefix={prefix}",
        &*url
    );
    let opens = (0..4).map(|_| JdbcBackend::connect(&url));
    let opened = futures_util::future::join_all(opens).await;
    let mut direct = sqlx::PgConnection::connect("postgres://postgres@127.0.0.1:5432/test")
        .await
        .unwrap();
    let failures: Vec<String> = opened
        .iter()
        .filter_map(|b| b.as_ref().err().map(ToString::to_string))
        .collect();
    for b in opened.into_iter().flatten() {
        b.close().await;
    }
    drop_row_tables(&mut direct, &prefix).await;
    assert!(failures.is_empty(), "migrations failed: {failures:?}");
}

/// MariaDB's session mode: a dropped wait ends its statement in the server at once
/// (`KILL QUERY` from a task of its own), not when its `GET_LOCK` slice (1 s) runs
/// out — the server does not notice a client gone while a statement runs. The wait
/// is dropped as soon as the server shows it waiting, with most of its slice left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_session_a_dropped_wait_ends_its_statement_at_once() {
    if !selected().iter().any(|l| l == "mysql-session") {
        return;
    }
    let url = server_url("mysql-session").unwrap();
    let holder = manager(&url, JdbcOptions::default(), LONG_LEASE).await;
    let (backend, waiter) = backend_and_manager(&url, JdbcOptions::default(), LONG_LEASE).await;
    let name = format!("dropped-wait-{:x}", fastrand::u64(..));
    let g = take(&holder.lock(&name), Duration::ZERO).await;
    let full = g.name().clone();
    for round in 0..3 {
        let lock = waiter.lock(&name);
        let waiting = tokio::spawn(async move { lock.try_lock(Duration::from_secs(10)).await });
        assert!(
            eventually(Duration::from_secs(5), || async {
                waiters_of(&backend, &full).await == 1
            })
            .await,
            "round {round}: the wait never showed in the server"
        );
        waiting.abort();
        let dropped = Instant::now();
        assert!(
            eventually(Duration::from_millis(400), || async {
                waiters_of(&backend, &full).await == 0
            })
            .await,
            "round {round}: the dropped wait still waited in the server {:?} later",
            dropped.elapsed()
        );
    }
    g.unlock().await.unwrap();
    holder.close().await;
    waiter.close().await;
}

/// MariaDB/MySQL: a granted writer's queue entry is removed beside its hold, off the
/// hand-over's path, and its release waits for the removal. A trigger on the queue
/// table (tables of this test's own prefix) holds every removal until the test lets a
/// named lock go: the waiter is still granted when the holder releases (before, the
/// grant waited for its removal), and its own release does not return until the
/// removal has run — the queue is empty when it does. Meanwhile the entry counts as
/// no waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_grant_leaves_the_queue_beside_its_hold_and_its_release_waits_for_it() {
    let Some(url) = sql_url("mysql") else {
        return;
    };
    const GATE: &str = "dlock-test-departure-gate";
    // A queue entry refreshed only every 10 s: none while the test runs.
    let options = JdbcOptions::default()
        .table_prefix("dlock_depart_")
        .waiter_liveness(Duration::from_secs(30));
    let backend = JdbcBackend::connect_with(&url, options).await.unwrap();
    let mut gate = sqlx::MySqlConnection::connect(&url).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP TRIGGER IF EXISTS dlock_depart_gate; \
         CREATE TRIGGER dlock_depart_gate BEFORE DELETE ON dlock_depart_waiters FOR EACH ROW \
           SET @dlock_gate = IF(GET_LOCK('{GATE}', 30) = 1, RELEASE_LOCK('{GATE}'), 0)"
    )))
    .execute(&mut gate)
    .await
    .unwrap();
    // `GET_LOCK`/`RELEASE_LOCK` of the gate on the test's own session: 1 when done.
    async fn gate_call(gate: &mut sqlx::MySqlConnection, call: &'static str) -> i64 {
        sqlx::query_scalar(call)
            .bind(GATE)
            .fetch_one(gate)
            .await
            .unwrap()
    }
    assert_eq!(
        gate_call(&mut gate, "SELECT GET_LOCK(?, 0)").await,
        1,
        "gate closed"
    );

    let name = LockName::new(format!("depart-{:x}", fastrand::u64(..))).unwrap();
    let request = |owner: &str, grant: u64| {
        AcquireRequest::new(name.clone(), OwnerId::new(owner), GrantId::new(grant))
            .with_lease(LONG_LEASE)
    };
    let holder = request("holder", 1);
    assert!(backend.try_acquire(&holder).await.unwrap().is_acquired());
    let waiter = request("waiter", 2).with_deadline(Some(Instant::now() + Duration::from_secs(20)));
    let waiting = {
        let (backend, waiter) = (backend.clone(), waiter.clone());
        tokio::spawn(async move { backend.try_acquire(&waiter).await })
    };
    let queued = "SELECT COUNT(*) FROM dlock_depart_waiters WHERE name = ?";
    assert!(
        eventually(Duration::from_secs(5), || async {
            raw_scalars("mysql", &url, queued, name.as_str()).await == [1]
        })
        .await,
        "the waiter never queued"
    );
    assert_eq!(
        backend.release(&holder.release_of_grant()).await.unwrap(),
        ReleaseResult::Released
    );
    let granted = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the grant waited for its queue row's removal")
        .unwrap()
        .unwrap();
    assert!(granted.is_acquired(), "{granted:?}");
    // The entry is still there, and it is the holder's: no waiter.
    assert_eq!(
        raw_scalars("mysql", &url, queued, name.as_str()).await,
        [1],
        "the queue while the removal is held"
    );
    let state = backend.inspect(&name).await.unwrap().unwrap();
    assert_eq!(state.waiters, Some(0), "{state:?}");

    let mut release = {
        let (backend, release) = (backend.clone(), waiter.release_of_grant());
        tokio::spawn(async move { backend.release(&release).await })
    };
    // Nothing signals "still waiting": a bound well past a statement's round trip.
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut release)
            .await
            .is_err(),
        "the release returned while the hold's queue row was still there"
    );
    assert_eq!(
        gate_call(&mut gate, "SELECT RELEASE_LOCK(?)").await,
        1,
        "gate opened"
    );
    let released = tokio::time::timeout(Duration::from_secs(10), release)
        .await
        .expect("the release never returned")
        .unwrap()
        .unwrap();
    assert_eq!(released, ReleaseResult::Released);
    assert_eq!(
        raw_scalars("mysql", &url, queued, name.as_str()).await,
        [0],
        "the queue after the release"
    );
    sqlx::raw_sql("DROP TRIGGER dlock_depart_gate")
        .execute(&mut gate)
        .await
        .unwrap();
    backend.close().await;
}

/// A newcomer finds a free lock with a live waiter queued: in fair mode it stands
/// back, in non-fair mode it passes (the waiter has not starved). On MariaDB/MySQL a
/// caller not queued judges the queue by its mark on the lock's row, which every
/// waiter sets before it queues; without the mark the fair newcomer is granted. The
/// waiter polls every 10 s (no bells, no SQLite release notices), and the newcomers
/// come within that pause. (Not on PostgreSQL: its release wakes the waiter, which
/// races the newcomers.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_stands_back_for_a_queued_waiter_in_fair_mode_only() {
    for (label, url) in sql_backends() {
        if label == "postgres" {
            continue;
        }
        let holder = manager(&url, JdbcOptions::default(), LONG_LEASE).await;
        let slow = polling_every(10)
            .waiter_liveness(Duration::from_secs(30))
            .wake_sessions(0)
            .local_notices(false);
        let (waiter_backend, waiter) = backend_and_manager(&url, slow, LONG_LEASE).await;
        let patient = JdbcOptions::default().starvation_after(Duration::from_secs(60));
        let newcomer = manager(&url, patient, LONG_LEASE).await;
        let name = format!("newcomer-{:x}", fastrand::u64(..));

        let held = take(&holder.fair_lock(&name), Duration::ZERO).await;
        let (waiting, seen) = queued_waiter(
            &waiter_backend,
            waiter.fair_lock(&name),
            Duration::from_secs(60),
            2,
            &label,
        )
        .await;
        held.unlock().await.unwrap();

        let fair = newcomer.fair_lock(&name).try_lock(Duration::ZERO).await;
        assert!(
            fair.unwrap().is_none(),
            "{label}: a fair newcomer passed the queued waiter"
        );
        let non_fair = newcomer.lock(&name).try_lock(Duration::ZERO).await.unwrap();
        let non_fair = non_fair.unwrap_or_else(|| {
            panic!("{label}: a non-fair newcomer stood back for a waiter that has not starved")
        });
        assert_eq!(
            waiter_backend.acquire_attempts(),
            seen,
            "{label}: the waiter looked within its pause; the test's premise failed"
        );
        non_fair.unlock().await.unwrap();
        waiting.abort();
        for m in [holder, waiter, newcomer] {
            m.close().await;
        }
    }
}

/// A fault proxy in front of the database at `url`, and the URL through it.
async fn proxied(url: &str) -> (FaultProxy, String) {
    let split = split_url(url).unwrap();
    let proxy = FaultProxy::start(split.hosts[0]).await.unwrap();
    let url = split.with_hosts(&[proxy.addr()]);
    (proxy, url)
}

/// A manager over an application's own pool of `connections`, whose sessions first
/// run `setup` (MySQL's are also prepared as dlock needs them), and — on MySQL — the
/// id of the session connected last (0 on PostgreSQL). Its operation timeout (60 s)
/// is longer than any wait the tests make the database do.
async fn manager_on_own_sessions(
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
enum RawConn {
    MySql(sqlx::MySqlConnection),
    Postgres(sqlx::PgConnection),
}

impl RawConn {
    async fn connect(label: &str, url: &str) -> Self {
        match label {
            "mysql" => Self::MySql(sqlx::MySqlConnection::connect(url).await.unwrap()),
            _ => Self::Postgres(sqlx::PgConnection::connect(url).await.unwrap()),
        }
    }

    async fn insert_uncommitted(label: &str, url: &str, name: &str) -> Self {
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

    async fn run(&mut self, sql: String) {
        let sql = sqlx::raw_sql(sqlx::AssertSqlSafe(sql));
        match self {
            Self::MySql(c) => sql.execute(c).await.map(drop),
            Self::Postgres(c) => sql.execute(c).await.map(drop),
        }
        .unwrap();
    }

    async fn rollback(mut self) {
        self.run("ROLLBACK".to_owned()).await;
    }
}

/// A statement the database gave up on while it waited for a row lock (MySQL's
/// `innodb_lock_wait_timeout`, error 1205; PostgreSQL's `lock_timeout`, 55P03) is a
/// retryable error that says so — not "the database refused the statement; check the
/// privileges" — and once the row is free the same call is granted. The pool is the
/// application's, its sessions giving up after 1 s; another connection holds the lock
/// row's insert uncommitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_that_timed_out_on_a_row_lock_is_retryable() {
    for (label, url) in sql_backends() {
        let setup = match label.as_str() {
            "sqlite" => continue, // SQLite waits for a file lock (busy), retried in place
            "mysql" => "SET SESSION innodb_lock_wait_timeout = 1",
            _ => "SET lock_timeout = '1s'",
        };
        let (m, _) = manager_on_own_sessions(&label, &url, setup, 2).await;
        let name = format!("rowwait-{:x}", fastrand::u64(..));
        let lock = m.lock(&name);
        let holder = RawConn::insert_uncommitted(&label, &url, &name).await;
        let err = lock.try_lock(Duration::ZERO).await.map(|_| ()).unwrap_err();
        holder.rollback().await;
        println!("{label}: {err}");
        assert!(err.is_retryable(), "{label}: not retryable: {err}");
        assert_eq!(err.kind(), ErrorKind::Backend, "{label}: {err}");
        assert!(err.message().contains("gave up"), "{label}: {err}");
        let guard = lock
            .try_lock(Duration::ZERO)
            .await
            .unwrap_or_else(|e| panic!("{label}: the free row was not granted: {e}"))
            .unwrap_or_else(|| panic!("{label}: the free row was refused"));
        guard.unlock().await.unwrap();
        m.close().await;
    }
}

/// MySQL/MariaDB: a statement an operator (or a tool such as pt-kill) interrupts with
/// `KILL QUERY` fails with error 1317 (SQLSTATE 70100) — a retryable error that says
/// the statement was dropped, not a refusal. dlock's statement is made to wait on an
/// uncommitted insert of the lock's row, found running by its session's id, and
/// killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_statement_killed_by_an_operator_is_retryable() {
    for (label, url) in sql_backends() {
        if label != "mysql" {
            continue; // KILL QUERY is MySQL's; PostgreSQL's time limits are tested above
        }
        // One connection: the session whose id is kept runs the acquire.
        let (m, session) = manager_on_own_sessions(&label, &url, "DO 0", 1).await;
        let name = format!("killed-{:x}", fastrand::u64(..));
        let holder = RawConn::insert_uncommitted(&label, &url, &name).await;
        let lock = m.lock(&name);
        let attempt = tokio::spawn(async move { lock.try_lock(Duration::ZERO).await.map(|_| ()) });
        let mut operator = sqlx::MySqlConnection::connect(&url).await.unwrap();
        // Bounded: the statement waits on the row up to the server's lock wait (50 s)
        // and the manager's operation timeout (60 s); 10 s is plenty to start.
        let end = Instant::now() + Duration::from_secs(10);
        let mut waiting = false;
        let mut id = 0;
        while !waiting && Instant::now() < end {
            // The session connected last (read again: the pool may have replaced
            // it), executing — not preparing, which a kill may not interrupt — the
            // grant. (INNODB_TRX's thread ids do not always match the session's on
            // MariaDB.)
            id = session.load(Ordering::SeqCst);
            let running: Option<String> = sqlx::query_scalar(
                "SELECT INFO FROM information_schema.PROCESSLIST WHERE ID = ? AND COMMAND = 'Execute'",
            )
            .bind(id)
                    .fetch_optional(&mut operator)
                    .await
                    .unwrap()
                    .flatten();
            waiting = running.is_some_and(|q| q.starts_with("INSERT INTO dlock_locks"));
            if !waiting {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        assert!(
            waiting,
            "{label}: dlock's acquire (session {id}) never waited on the row lock; ended: {}",
            attempt.is_finished()
        );
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("KILL QUERY {id}")))
            .execute(&mut operator)
            .await
            .unwrap();
        let err = attempt.await.unwrap().unwrap_err();
        holder.rollback().await;
        println!("{label}: {err}");
        assert!(err.is_retryable(), "{label}: not retryable: {err}");
        assert_eq!(err.kind(), ErrorKind::Backend, "{label}: {err}");
        assert!(err.message().contains("dropped"), "{label}: {err}");
        m.close().await;
    }
}

/// A database that refuses a connection for now — a user at its connection limit
/// (PostgreSQL 53300, MariaDB 1226) — fails the connect with a retryable error that
/// says so, not a configuration error: the same URL works once a connection is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_refused_for_now_is_a_retryable_connect_error() {
    for (label, url) in sql_backends() {
        let (setup, limited) = match label.as_str() {
            "sqlite" => continue, // a file has no connection limit
            "mysql" => (
                [
                    "CREATE USER IF NOT EXISTS 'dlock_one_conn'@'%' WITH MAX_USER_CONNECTIONS 1",
                    "GRANT ALL ON test.* TO 'dlock_one_conn'@'%'",
                ],
                "mysql://dlock_one_conn@127.0.0.1:3306/test",
            ),
            _ => (
                [
                    "DO $$ BEGIN CREATE ROLE dlock_one_conn LOGIN CONNECTION LIMIT 1; \
                     EXCEPTION WHEN duplicate_object THEN NULL; END $$",
                    "SELECT 1",
                ],
                "postgres://dlock_one_conn@127.0.0.1:5432/test",
            ),
        };
        let mut admin = RawConn::connect(&label, &url).await;
        for statement in setup {
            admin.run(statement.to_owned()).await;
        }
        // The user's one connection, held by someone else.
        let held = RawConn::connect(&label, limited).await;
        let err = JdbcBackend::connect(limited).await.map(drop).unwrap_err();
        drop(held);
        println!("{label}: {err}");
        assert!(err.is_retryable(), "{label}: not retryable: {err}");
        assert_eq!(err.kind(), ErrorKind::Backend, "{label}: {err}");
        assert!(err.message().contains("for now"), "{label}: {err}");
    }
}

/// The database goes away (connections reset, new ones refused): calls fail with
/// typed retryable errors, the watchdog keeps trying until the lease ends and then
/// fires lost, and once the database is back the pool reconnects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_outage_is_typed_loses_on_time_and_recovers() {
    for (label, url) in sql_backends() {
        if label == "sqlite" {
            continue; // a file has no network between client and server
        }
        let (proxy, url) = proxied(&url).await;
        assert!(
            url.contains(&proxy.addr().to_string()),
            "{label}: URL {url} does not go through the proxy"
        );
        let lease = Duration::from_millis(900);
        let options = JdbcOptions::default().acquire_timeout(Duration::from_millis(500));
        let m = manager(&url, options, lease).await;
        testsuite::faults::outage_is_typed_loses_on_time_and_recovers(&label, &m, &proxy, lease)
            .await;
        m.close().await;
    }
}

/// A pooled connection the server side ended (a restart, an operator's kill, an idle
/// timeout — here the proxy closing it) is checked and replaced before it is handed
/// out again once it has been idle for half a second: the next acquire is granted.
/// A connection used more recently is handed out unchecked (a round trip per
/// statement saved): one that died meanwhile fails its statement with a retryable
/// error, and is replaced. (On PostgreSQL the
/// `LISTEN` connection, reconnecting from the same pool, may take the dead idle
/// connections first; MariaDB shows the check alone.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_connection_that_died_is_replaced_before_use_once_idle() {
    for (label, url) in sql_backends() {
        if label == "sqlite" {
            continue; // a file has no connection to end
        }
        let (proxy, url) = proxied(&url).await;
        let m = manager(&url, JdbcOptions::default(), LONG_LEASE).await;
        let lock = m.lock(&format!("idle-check-{:x}", fastrand::u64(..)));
        take(&lock, Duration::ZERO).await.unlock().await.unwrap();
        // The server side ends the pool's connections; new ones pass.
        assert!(proxy.end_connections().await, "{label}: connections ended");
        // Idle past the window (the idle time is what is tested).
        tokio::time::sleep(Duration::from_millis(600)).await;
        let granted = lock.try_lock(Duration::ZERO).await;
        let guard = granted
            .unwrap_or_else(|e| panic!("{label}: a dead idle connection was handed out: {e}"))
            .unwrap_or_else(|| panic!("{label}: the free lock was refused"));
        guard.unlock().await.unwrap();
        // Used just now, then ended: not checked; each fails the one statement
        // handed it, retryably, and is replaced.
        let dead = proxy.open_connections();
        assert!(proxy.end_connections().await, "{label}: connections ended");
        let mut failed = 0;
        let guard = loop {
            match lock.try_lock(Duration::ZERO).await {
                Ok(Some(guard)) => break guard,
                Err(e) if e.is_retryable() && failed < dead => failed += 1,
                other => panic!("{label}: after {failed} of {dead} dead connections: {other:?}"),
            }
        };
        guard.unlock().await.unwrap();
        m.close().await;
    }
}

/// A database that takes the connection and never answers (a hung server, a
/// partition after the handshake): connecting fails in the bound the URL sets
/// (`dlock_acquire_timeout`), as a retryable `Timeout` that names the bound and the
/// option that sets it — not sqlx's "pool timed out" — and the same URL connects once
/// the database answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_nobody_answers_times_out_in_the_urls_bound() {
    for (label, url) in sql_backends() {
        if label == "sqlite" {
            continue; // a file has no network between client and server
        }
        let (proxy, url) = proxied(&url).await;
        let sep = if url.contains('?') { '&' } else { '?' };
        let url = format!("{url}{sep}dlock_acquire_timeout=300ms");
        proxy.set(Fault::Blackhole);
        let started = Instant::now();
        let err = JdbcBackend::connect(&url)
            .await
            .err()
            .unwrap_or_else(|| panic!("{label}: connected through a black hole"));
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(2),
            "{label}: gave up after {took:?}, not at the URL's 300 ms"
        );
        assert_eq!(err.kind(), ErrorKind::Timeout, "{label}: {err}");
        assert!(err.is_retryable(), "{label}: {err}");
        let text = err.to_string();
        assert!(
            text.contains("300ms") && text.contains("dlock_acquire_timeout"),
            "{label}: the error does not name the bound and its option: {text}"
        );
        proxy.set(Fault::Pass);
        let backend = JdbcBackend::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("{label}: the same URL once the database answers: {e}"));
        backend.close().await;
    }
}

/// The loss margin on real databases: the holder's connection is black-holed, and
/// its lost signal leads another client's grant by at least the margin — the
/// default (1 % of the lease, or the renewal round trip) and a configured 150 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_holder_hears_of_its_loss_a_margin_before_the_next_grant() {
    for (label, url) in sql_backends() {
        if label == "sqlite" {
            continue; // a file has no network between client and server
        }
        let lease = Duration::from_secs(2);
        let rival = manager(&url, JdbcOptions::default(), lease).await;
        for margin in [None, Some(Duration::from_millis(150))] {
            let (proxy, proxied_url) = proxied(&url).await;
            let backend = JdbcBackend::connect(&proxied_url).await.unwrap();
            let mut builder = DistributeLockManager::builder(backend).lease(lease);
            if let Some(margin) = margin {
                builder = builder.loss_margin(margin);
            }
            let holder = builder.build().unwrap();
            let lead = testsuite::faults::black_holed_loss_leads_the_next_grant(
                &label, &holder, &rival, &proxy, lease, margin,
            )
            .await;
            println!("{label}: margin {margin:?}: lost signal led the next grant by {lead:?}");
        }
        rival.close().await;
    }
}

/// A silent network (black hole): renewals hang, and the lock is declared lost a loss
/// margin before its lease ends, not when some socket timeout finally fires.
///
/// The lease is 4 s so that the default margin (1 % + 10 ms = 50 ms) is more than the
/// test task's own wake-up after the signal on a loaded machine (seen: 25 ms, which a
/// 900 ms lease's 19 ms margin did not cover). With no margin the signal comes at the
/// lease's end or later and the test fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_network_loses_the_lock_when_the_lease_ends() {
    for (label, url) in sql_backends() {
        if label == "sqlite" {
            continue;
        }
        let (proxy, url) = proxied(&url).await;
        let lease = Duration::from_secs(4);
        let m = manager(&url, JdbcOptions::default(), lease).await;
        let g = m
            .lock(&format!("silent-{:x}", fastrand::u64(..)))
            .try_lock(Duration::ZERO)
            .await
            .unwrap()
            .unwrap();
        proxy.set(Fault::Blackhole);
        let reason = tokio::time::timeout(lease * 2, g.lost())
            .await
            .expect("lost fired within the lease");
        assert_eq!(reason, LostReason::LeaseExpired);
        // A loss margin (1 % + 10 ms, or the observed round trip; at most a third of
        // the lease) before the store can expire the hold.
        let at = g.acquired_at().elapsed();
        assert!(
            at >= lease * 2 / 3 && at < lease,
            "{label}: lost after {at:?}, not a margin before the {lease:?} lease ended"
        );
        proxy.set(Fault::Reset);
        drop(g);
        m.close().await;
    }
}

#[test]
fn the_suite_knows_every_sql_label() {
    for label in ["sqlite", "mysql", "postgres"] {
        assert!(testsuite::backends::KNOWN.contains(&label));
        assert!(server_url(label).is_some());
    }
}

/// Shared releases and renewals run a transaction. Dropped at any point — a
/// cancelled unlock, a watchdog renewal cut off at its deadline — none may leave a
/// pooled connection inside an open transaction: a grant later run on that
/// connection would be seen by its own client only, and undone when the connection
/// dies, while another client is granted the same lock. (The lock-history checker
/// saw exactly that on PostgreSQL under the proxy nemesis.) The connection goes
/// through the fault proxy with 20 ms of delay, so a cut can fall inside `BEGIN`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_shared_call_leaves_no_open_transaction_behind() {
    use dlock_spi::{
        AcquireRequest, GrantId, LockMode, LockName, LockRemoteResource, OwnerId, ReleaseRequest,
        RenewRequest,
    };
    for (label, url) in sql_backends() {
        if label == "sqlite" {
            continue; // a file has no network between client and server
        }
        let (proxy, proxied_url) = proxied(&url).await;
        proxy.set(Fault::Delay(Duration::from_millis(20)));
        // One connection for calls (PostgreSQL's listener takes another), so every
        // call reuses the one a cancelled call used.
        let pool = if label == "postgres" { 2 } else { 1 };
        let options = JdbcOptions::default().max_connections(pool);
        let backend = JdbcBackend::connect_with(&proxied_url, options)
            .await
            .unwrap();
        let observer = JdbcBackend::connect(&url).await.unwrap();
        let prefix = format!("opentx-{:x}-", fastrand::u64(..));
        let owner = OwnerId::new("reader");
        for round in 0..30u64 {
            let rw = LockName::new(format!("{prefix}rw")).unwrap();
            let grant = GrantId::new(round);
            let req =
                AcquireRequest::new(rw.clone(), owner.clone(), grant).with_mode(LockMode::Shared);
            let token = backend.try_acquire(&req).await.unwrap().token().unwrap();
            let cut = Duration::from_millis(fastrand::u64(0..100));
            if round % 2 == 0 {
                let renew = RenewRequest::new(
                    rw.clone(),
                    owner.clone(),
                    grant,
                    LockMode::Shared,
                    Duration::from_secs(30),
                    token,
                );
                let _ = tokio::time::timeout(cut, backend.renew(&renew)).await;
            } else {
                let release =
                    ReleaseRequest::new(rw.clone(), owner.clone(), grant, LockMode::Shared, token);
                let _ = tokio::time::timeout(cut, backend.release(&release)).await;
            }
            // A grant on the same connection must be visible to everyone.
            let x = LockName::new(format!("{prefix}x{round}")).unwrap();
            let take = AcquireRequest::new(x.clone(), owner.clone(), GrantId::new(1000 + round));
            assert!(backend.try_acquire(&take).await.unwrap().is_acquired());
            let seen = observer.inspect(&x).await.unwrap();
            assert!(
                seen.is_some_and(|s| !s.holders.is_empty()),
                "{label} round {round}: a grant made after a shared call cut at {cut:?} is invisible to other clients (left inside a transaction)"
            );
        }
        backend.close().await;
        observer.close().await;
    }
}

/// An acquire cut off at any point — before its statement is sent, while it is in
/// flight, after the grant committed — leaves no grant behind: the statement runs to
/// its end, and a grant nobody took is given back at once, long before its lease
/// (30 s) would end it. Each round cuts an acquire (exclusive, shared or permits) at
/// a random moment through the fault proxy's 20 ms delay, and another client must
/// then take the whole lock within 3 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_cut_off_mid_statement_leaves_no_grant_behind() {
    use dlock_spi::{
        AcquireRequest, GrantId, LockMode, LockName, LockRemoteResource, OwnerId, ReleaseRequest,
    };
    for (label, url) in sql_backends() {
        if label == "sqlite" {
            continue; // a file has no network between client and server
        }
        let (proxy, proxied_url) = proxied(&url).await;
        proxy.set(Fault::Delay(Duration::from_millis(20)));
        let backend = JdbcBackend::connect(&proxied_url).await.unwrap();
        let other = JdbcBackend::connect(&url).await.unwrap();
        let prefix = format!("cut-acquire-{:x}-", fastrand::u64(..));
        let mut cut_in_flight = 0;
        for round in 0..24u64 {
            // A lock of each kind its own name; the next client takes all of it.
            let (mode, all) = match round % 3 {
                0 => (LockMode::Exclusive, LockMode::Exclusive),
                1 => (LockMode::Shared, LockMode::Exclusive),
                _ => (LockMode::Permits(1), LockMode::Permits(2)),
            };
            let name = LockName::new(format!("{prefix}{}", round % 3)).unwrap();
            let req = AcquireRequest::new(name.clone(), OwnerId::new("cut"), GrantId::new(round))
                .with_mode(mode)
                .with_capacity(2)
                .with_lease(Duration::from_secs(30));
            // A cut call's connection is closed: a pooled one is connected first,
            // so the cut falls on the statement (sent at once, answered after 40
            // ms or more), not on connecting.
            backend.inspect(&name).await.unwrap();
            let cut = Duration::from_millis(fastrand::u64(10..50));
            match tokio::time::timeout(cut, backend.try_acquire(&req)).await {
                Err(_) => cut_in_flight += 1,
                // Answered in time: the caller has the grant, and gives it back.
                Ok(answer) => {
                    if let Some(token) = answer.unwrap().token() {
                        let release = ReleaseRequest::new(
                            name.clone(),
                            OwnerId::new("cut"),
                            GrantId::new(round),
                            mode,
                            token,
                        );
                        backend.release(&release).await.unwrap();
                    }
                }
            }
            let take = AcquireRequest::new(name.clone(), OwnerId::new("next"), GrantId::new(round))
                .with_mode(all)
                .with_capacity(2)
                .with_deadline(Some(Instant::now() + Duration::from_secs(3)));
            let got = other.try_acquire(&take).await.unwrap();
            if !got.is_acquired() {
                let state = other.inspect(&name).await;
                panic!("{label} round {round} ({mode:?} cut at {cut:?}): the lock is still taken after the acquire was cut off: {state:?}");
            }
            let token = got.token().unwrap();
            let release =
                ReleaseRequest::new(name, OwnerId::new("next"), GrantId::new(round), all, token);
            other.release(&release).await.unwrap();
        }
        assert!(
            cut_in_flight >= 8,
            "{label}: only {cut_in_flight} of 24 acquires were cut before they answered"
        );
        backend.close().await;
        other.close().await;
    }
}

/// A backend built on the application's own sqlx pool shares locks with one built
/// from the URL (the same tables, the same grants), and a MySQL pool whose sessions
/// are not in UTC with READ COMMITTED is refused with what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_on_the_applications_pool_shares_locks_with_one_from_the_url() {
    use std::str::FromStr;
    for (label, url) in sql_backends() {
        let pool: dlock_jdbc::SqlPool = match label.as_str() {
            "sqlite" => sqlx::sqlite::SqlitePoolOptions::new()
                .connect_lazy_with(
                    sqlx::sqlite::SqliteConnectOptions::from_str(&url)
                        .unwrap()
                        .create_if_missing(true),
                )
                .into(),
            "mysql" => {
                let plain = sqlx::mysql::MySqlPoolOptions::new()
                    .connect_lazy(&url)
                    .unwrap();
                let err = JdbcBackend::from_pool(plain, JdbcOptions::default())
                    .await
                    .map(drop)
                    .unwrap_err();
                assert_eq!(err.kind(), ErrorKind::Config, "{label}: {err}");
                assert!(err.message().contains("prepare_mysql_session"), "{err}");
                sqlx::mysql::MySqlPoolOptions::new()
                    .after_connect(dlock_jdbc::prepare_mysql_session)
                    .connect_lazy(&url)
                    .unwrap()
                    .into()
            }
            _ => sqlx::postgres::PgPoolOptions::new()
                .connect_lazy(&url)
                .unwrap()
                .into(),
        };
        let mine = DistributeLockManager::builder(
            JdbcBackend::from_pool(pool, JdbcOptions::default())
                .await
                .unwrap_or_else(|e| panic!("{label}: {e}")),
        )
        .build()
        .unwrap();
        let theirs = manager(&url, JdbcOptions::default(), LONG_LEASE).await;
        let name = format!("app-pool-{:x}", fastrand::u64(..));
        let held = mine.lock(&name).try_lock(Duration::ZERO).await.unwrap();
        let held = held.unwrap_or_else(|| panic!("{label}: the pool's backend was refused"));
        assert!(
            theirs
                .lock(&name)
                .try_lock(Duration::ZERO)
                .await
                .unwrap()
                .is_none(),
            "{label}: both backends granted {name}"
        );
        held.unlock().await.unwrap();
        let g = theirs.lock(&name).try_lock(Duration::ZERO).await.unwrap();
        assert!(g.is_some(), "{label}: not free after the release");
        mine.close().await;
        theirs.close().await;
    }
}

/// MySQL and PostgreSQL over TLS (the project's script runs a second server of each —
/// MariaDB on 127.0.0.1:3307, PostgreSQL on 127.0.0.1:5433 — that takes TLS
/// connections only, its certificate signed by a throwaway CA): with the certificate
/// verified against that CA the backend works; against another CA it is refused
/// (a `Config` error naming the CA parameter), and so is a connection without TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_over_tls_verifies_the_server_certificate() {
    let chosen = selected();
    let mut checked = 0;
    for label in ["mysql", "postgres"] {
        if !chosen.iter().any(|l| l == label) {
            continue;
        }
        checked += 1;
        let url = |verify: bool, ca: &str| match (label, verify) {
            (_, true) => sql_tls_url(label, ca).unwrap(),
            ("mysql", false) => "mysql://root@127.0.0.1:3307/test?ssl-mode=DISABLED".to_owned(),
            (_, false) => "postgres://postgres@127.0.0.1:5433/postgres?sslmode=disable".to_owned(),
        };
        let backend = JdbcBackend::connect(&url(true, "ca.crt"))
            .await
            .unwrap_or_else(|e| panic!("{label} over TLS (started by scripts/test): {e:#}"));
        let m = DistributeLockManager::builder(backend).build().unwrap();
        let name = format!("tls-{:x}", fastrand::u64(..));
        let g = m.lock(&name).try_lock(Duration::ZERO).await.unwrap();
        g.unwrap_or_else(|| panic!("{label}: not granted over TLS"))
            .unlock()
            .await
            .unwrap();
        m.close().await;
        for (verify, ca, what) in [
            (true, "other-ca.crt", "a certificate another CA signed"),
            (false, "ca.crt", "a connection without TLS"),
        ] {
            let err = JdbcBackend::connect(&url(verify, ca))
                .await
                .map(drop)
                .expect_err(what);
            let text = format!("{err:#}");
            eprintln!("{label}: {what}: refused: {text}");
            if verify {
                assert!(
                    text.to_lowercase().contains("certificate"),
                    "{label}: {what}: {text}"
                );
                // Not a blip: retrying will not help, the configuration must change.
                assert_eq!(err.kind(), ErrorKind::Config, "{label}: {what}: {text}");
                assert!(!err.is_retryable(), "{label}: {what}: {text}");
                assert!(
                    err.message().contains("sslrootcert"),
                    "{label}: {what}: {text}"
                );
            }
        }
    }
    if checked == 0 {
        eprintln!("neither mysql nor postgres is selected; nothing to check here");
    }
}

/// `dlock_tls=verified` on the TLS-only servers (certificate signed by the script's
/// throwaway CA): a URL that encrypts without verifying (`sslmode=require`,
/// `ssl-mode=REQUIRED`) connects without the option — the server is not checked —
/// and is refused with it (a `Config` error naming the mode); a URL naming no
/// mode gets the strictest, which checks the server against the Mozilla roots and
/// so refuses this one; the verifying URL with the script's CA works with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verified_tls_refuses_a_url_that_does_not_verify_the_server() {
    for label in ["mysql", "postgres"] {
        if !selected().iter().any(|l| l == label) {
            continue;
        }
        let verifying = sql_tls_url(label, "ca.crt").unwrap();
        let (unverified, unnamed) = match label {
            "mysql" => (
                "mysql://root@127.0.0.1:3307/test?ssl-mode=REQUIRED",
                "mysql://root@127.0.0.1:3307/test",
            ),
            _ => (
                "postgres://postgres@127.0.0.1:5433/postgres?sslmode=require",
                "postgres://postgres@127.0.0.1:5433/postgres",
            ),
        };
        // The gap the option closes: the server's certificate is not checked.
        JdbcBackend::connect(unverified)
            .await
            .unwrap_or_else(|e| panic!("{label}: {unverified} without the option: {e:#}"))
            .close()
            .await;
        let err = JdbcBackend::connect(&format!("{unverified}&dlock_tls=verified"))
            .await
            .map(drop)
            .expect_err("an unverified mode with dlock_tls=verified");
        assert_eq!(err.kind(), ErrorKind::Config, "{label}: {err:#}");
        assert!(
            err.message().contains("does not verify"),
            "{label}: {err:#}"
        );
        let err = JdbcBackend::connect(&format!("{unnamed}?dlock_tls=verified"))
            .await
            .map(drop)
            .expect_err("the strictest mode against a CA the Mozilla roots do not hold");
        assert!(
            format!("{err:#}").to_lowercase().contains("certificate"),
            "{label}: {err:#}"
        );
        let backend = JdbcBackend::connect(&format!("{verifying}&dlock_tls=verified"))
            .await
            .unwrap_or_else(|e| panic!("{label}: the verifying URL with the option: {e:#}"));
        lock_once(backend).await;
    }
}

/// An upgrade (a write beside the owner's own read) is judged on the readers as
/// they are once the lock's row is free, not as they were when its statement
/// began: a reader whose transaction held the row and committed while the upgrade
/// waited for it keeps the upgrade out (PostgreSQL and MySQL read other tables
/// from the statement's snapshot).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_sees_a_reader_that_committed_while_it_waited() {
    use dlock_spi::{AcquireRequest, GrantId, LockMode, LockName, LockRemoteResource, OwnerId};
    for (label, url) in sql_backends() {
        if label == "sqlite" {
            continue; // one writer at a time: no statement waits on a row there
        }
        let backend = JdbcBackend::connect(&url).await.unwrap();
        let name = LockName::new(format!("upgrade-snapshot-{:x}", fastrand::u64(..))).unwrap();
        let owner = OwnerId::new("upgrader");
        let read = AcquireRequest::new(name.clone(), owner.clone(), GrantId::new(1))
            .with_mode(LockMode::Shared);
        assert!(backend.try_acquire(&read).await.unwrap().is_acquired());

        // Another client's reader takes the row (as a shared grant's transaction does).
        let (now, row_lock, wait_seen, intruder, horizon) = if label == "postgres" {
            (
                "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT",
                "UPDATE dlock_locks SET shared_until = shared_until WHERE name = $1",
                "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%dlock_locks%'",
                "INSERT INTO dlock_readers (name, owner, token, context, acquired_at, expires_at) VALUES ($1, 'intruder#1', 1, NULL, NOW_MS, NOW_MS + 60000)",
                "UPDATE dlock_locks SET shared_until = NOW_MS + 60000 WHERE name = $1",
            )
        } else {
            (
                "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)",
                "UPDATE dlock_locks SET shared_until = shared_until WHERE name = ?",
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE command <> 'Sleep' AND (info LIKE 'INSERT INTO dlock_locks%' OR info LIKE 'UPDATE dlock_locks SET shared_until = shared_until + 0%')",
                "INSERT INTO dlock_readers (name, owner, token, context, acquired_at, expires_at) VALUES (?, 'intruder#1', 1, NULL, NOW_MS, NOW_MS + 60000)",
                "UPDATE dlock_locks SET shared_until = NOW_MS + 60000 WHERE name = ?",
            )
        };
        let sql = |s: &str| sqlx::AssertSqlSafe(s.replace("NOW_MS", now));
        macro_rules! intrude {
            ($conn:ty) => {{
                let mut reader = <$conn>::connect(&url).await.unwrap();
                let mut watcher = <$conn>::connect(&url).await.unwrap();
                let mut tx = reader.begin().await.unwrap();
                sqlx::query(sql(row_lock))
                    .bind(name.as_str())
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                let upgrade = AcquireRequest::new(name.clone(), owner.clone(), GrantId::new(2))
                    .with_alongside(Some(GrantId::new(1)))
                    .with_deadline(Some(
                        std::time::Instant::now() + Duration::from_millis(1500),
                    ));
                let upgrader = backend.clone();
                let upgrading = tokio::spawn(async move { upgrader.try_acquire(&upgrade).await });
                // No signal to wait on: the server's view, polled (bounded).
                let mut waiting = false;
                for _ in 0..500 {
                    let n: i64 = sqlx::query_scalar(sql(wait_seen))
                        .fetch_one(&mut watcher)
                        .await
                        .unwrap();
                    if n > 0 {
                        waiting = true;
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                assert!(waiting, "{label}: the upgrade never waited for the row");
                for statement in [intruder, horizon] {
                    sqlx::query(sql(statement))
                        .bind(name.as_str())
                        .execute(&mut *tx)
                        .await
                        .unwrap();
                }
                tx.commit().await.unwrap();
                let answer = upgrading.await.unwrap().unwrap();
                assert!(
                    !answer.is_acquired(),
                    "{label}: the upgrade was granted beside another client's live reader"
                );
            }};
        }
        if label == "postgres" {
            intrude!(sqlx::PgConnection);
        } else {
            intrude!(sqlx::MySqlConnection);
        }
        backend.close().await;
    }
}

/// MariaDB/MySQL: waiters block in queue order, each on the bell of the waiter just
/// ahead of it, so a hand-over wakes the next waiter and nobody else: bells taken
/// stay near one per grant. (One bell per lock, whose line disagreed with the queue,
/// passed the bell down its line about 2.7 times per grant; without bells nobody
/// takes one.) Six backends cycle one fair lock for 2 s; their longest backoff
/// delay (2 s) lets waiters block on MySQL too, which reads `GET_LOCK`'s timeout in
/// whole seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_hand_over_wakes_the_next_waiter_in_queue_order() {
    const TASKS: usize = 6;
    let Some(url) = sql_url("mysql") else {
        return;
    };
    let name = format!("line-{:x}", fastrand::u64(..));
    let grants = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + Duration::from_secs(2);
    let (mut backends, mut tasks) = (Vec::new(), Vec::new());
    for _ in 0..TASKS {
        let options = JdbcOptions::default()
            .backoff(Backoff::exponential(
                Duration::from_millis(1),
                Duration::from_secs(2),
            ))
            .waiter_liveness(Duration::from_secs(6));
        let (backend, m) = backend_and_manager(&url, options, LONG_LEASE).await;
        let (lock, grants) = (m.fair_lock(&name), Arc::clone(&grants));
        tasks.push(tokio::spawn(async move {
            while Instant::now() < end {
                let g = lock
                    .try_lock(Duration::from_secs(5))
                    .await
                    .unwrap()
                    .expect("granted within 5 s");
                tokio::time::sleep(Duration::from_millis(1)).await;
                g.unlock().await.unwrap();
                grants.fetch_add(1, Ordering::Relaxed);
            }
            m.close().await;
        }));
        backends.push(backend);
    }
    for t in tasks {
        t.await.unwrap();
    }
    let grants = grants.load(Ordering::Relaxed);
    let taken: u64 = backends.iter().map(JdbcBackend::bells_taken).sum();
    assert!(grants >= 20, "only {grants} grants in 2 s");
    assert!(
        taken * 2 <= grants * 3,
        "{taken} bells taken for {grants} grants: the bells' line does not follow the queue"
    );
    assert!(
        taken * 2 >= grants,
        "{taken} bells taken for {grants} grants: most hand-overs did not wake a blocked waiter"
    );
}
