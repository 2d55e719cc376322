//! Backends on the application's client or Cluster client, beside one from a URL.

use std::time::Duration;

use dlock_api::{DistributeLockManager, ErrorKind, LockGuard};
use dlock_redis::{RedisBackend, RedisOptions};
use testsuite::backends::server_url;
use testsuite::conformance::take;
use testsuite::runner::selected;

use super::fixtures::*;

/// Backends built on the application's client and on its connection manager share
/// locks with one built from the URL, and wake their waiters by release notices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_on_the_applications_client_share_locks_with_one_from_the_url() {
    let Some(url) = redis_url() else { return };
    let client = redis::Client::open(url.as_str()).unwrap();
    let conn = client
        .get_connection_manager_with_config(
            redis::aio::ConnectionManagerConfig::new().set_response_timeout(None),
        )
        .await
        .unwrap();
    let built = [
        RedisBackend::from_client(client.clone(), RedisOptions::default())
            .await
            .unwrap(),
        RedisBackend::from_connection_manager(client, conn, RedisOptions::default())
            .await
            .unwrap(),
    ];
    let (_, theirs) = dlock_client(&url, RedisOptions::default()).await;
    for backend in built {
        assert!(backend.notices_connected(), "no release notices");
        let mine = DistributeLockManager::builder(backend.clone())
            .build()
            .unwrap();
        let lock = name("app-client");
        let held = take(&theirs.lock(&lock), Duration::ZERO).await;
        assert!(mine
            .lock(&lock)
            .try_lock(Duration::ZERO)
            .await
            .unwrap()
            .is_none());
        // A waiter on the application's client is woken by the release's notice.
        let woke = wake_after_release(held, mine.lock(&lock), &backend, Duration::ZERO).await;
        assert!(woke < Duration::from_millis(500), "woken after {woke:?}");
        mine.close().await;
    }
    theirs.close().await;
}

/// A backend built on the application's Cluster client (with clients for its nodes)
/// shares locks with one built from the `redis+cluster://` URL, wakes its waiters by
/// release notices and lists the locks held on every node; without a node client it
/// is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_on_the_applications_cluster_client_shares_locks_with_one_from_the_url() {
    if !selected().iter().any(|l| l == "redis-cluster") {
        eprintln!("redis-cluster is not selected in DLOCK_TEST_BACKENDS; nothing to check here");
        return;
    }
    let url = server_url("redis-cluster").unwrap();
    let seeds: Vec<String> = url
        .trim_start_matches("redis+cluster://")
        .split(',')
        .map(|h| format!("redis://{h}"))
        .collect();
    let cluster = || redis::cluster::ClusterClient::new(seeds.clone()).unwrap();
    let err = RedisBackend::from_cluster_client(cluster(), Vec::new(), RedisOptions::default())
        .await
        .map(drop)
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err:#}");
    let nodes = seeds
        .iter()
        .map(|u| redis::Client::open(u.as_str()).unwrap())
        .collect();
    let backend = RedisBackend::from_cluster_client(cluster(), nodes, RedisOptions::default())
        .await
        .unwrap();
    assert!(backend.notices_connected(), "no release notices");
    let (_, theirs) = dlock_client(&url, RedisOptions::default()).await;
    let mine = DistributeLockManager::builder(backend.clone())
        .build()
        .unwrap();
    // Names spread over the Cluster's slots: every node holds some.
    let prefix = name("app-cluster");
    let held: Vec<LockGuard> = {
        let mut held = Vec::new();
        for i in 0..12 {
            held.push(take(&theirs.lock(format!("{prefix}-{i}")), Duration::ZERO).await);
        }
        held
    };
    let listed = dlock_api::spi::LockAdmin::live_locks(&backend, &prefix)
        .await
        .unwrap();
    assert_eq!(
        listed, 12,
        "locks listed through the application's node clients"
    );
    let mut held = held.into_iter();
    let first = held.next().unwrap();
    assert!(mine
        .lock(format!("{prefix}-0"))
        .try_lock(Duration::ZERO)
        .await
        .unwrap()
        .is_none());
    let woke = wake_after_release(
        first,
        mine.lock(format!("{prefix}-0")),
        &backend,
        Duration::ZERO,
    )
    .await;
    assert!(woke < Duration::from_millis(500), "woken after {woke:?}");
    for g in held {
        g.unlock().await.unwrap();
    }
    mine.close().await;
    theirs.close().await;
}

/// A URL naming a database the server does not have (`/99` of 16) is a `Config`
/// error that says so; it was a `Backend` error telling the user to check the
/// server's version and their right to run EVALSHA.
#[tokio::test]
async fn a_database_the_server_does_not_have_is_a_config_error_saying_so() {
    let Some(url) = redis_url() else { return };
    let url = format!("{}/99", url.trim_end_matches('/'));
    let refused = match DistributeLockManager::connect(&url).await {
        Ok(manager) => manager.lock("db-99").try_lock(Duration::ZERO).await.err(),
        Err(e) => Some(e),
    };
    let refused = refused.expect("the server has no database 99");
    assert_eq!(refused.kind(), ErrorKind::Config, "{refused:#}");
    let said = refused.to_string();
    assert!(
        said.contains("database") && !said.contains("EVALSHA"),
        "{said}"
    );
}
