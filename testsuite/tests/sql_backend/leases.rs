//! Holds on every SQL database: the lease and its clock tick, fencing across a deleted row, the name-length limit, closing, a pool of one, an application's pool.

use std::time::Duration;

use dlock_api::{DistributeLockManager, ErrorKind};
use dlock_jdbc::{JdbcBackend, JdbcOptions};
use dlock_spi::{LockName, LockRemoteResource};
use testsuite::backends::server_url;
use testsuite::conformance::take;

use super::fixtures::*;

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
            .try_lock_with(Duration::ZERO, &dlock_api::LockOptions::new().lease(lease))
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
            .try_lock_with(Duration::ZERO, &dlock_api::LockOptions::new().lease(lease))
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

#[test]
fn the_suite_knows_every_sql_label() {
    for label in ["sqlite", "mysql", "postgres"] {
        assert!(testsuite::backends::KNOWN.contains(&label));
        assert!(server_url(label).is_some());
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
