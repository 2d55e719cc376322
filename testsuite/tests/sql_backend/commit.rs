//! PostgreSQL's asynchronous commit of the writes whose loss is safe, opted into in the URL.

use std::time::Duration;

use dlock_api::DistributeLockManager;
use dlock_jdbc::{JdbcBackend, JdbcOptions};
use testsuite::backends::async_commit_url;
use testsuite::conformance::take;

use super::fixtures::*;

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
