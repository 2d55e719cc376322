//! The waiters' queue: a refused acquire's reads, a grant leaving the queue, newcomers standing back, an upgrade beside a reader.

use std::time::{Duration, Instant};

use dlock_jdbc::{JdbcBackend, JdbcOptions};
use dlock_spi::{
    AcquireRequest, AcquireResult, GrantId, LockName, LockRemoteResource, OwnerId, ReleaseResult,
};
use sqlx::Connection;
use testsuite::conformance::{eventually, take};

use super::fixtures::*;

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
