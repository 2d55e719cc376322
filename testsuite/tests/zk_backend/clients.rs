//! A backend on the application's connector, beside one from a URL.

use std::time::Duration;

use dlock_api::DistributeLockManager;
use dlock_zk::{ZkBackend, ZkOptions};
use zookeeper_client::Client;

use super::fixtures::*;

/// A backend built on the application's connector opens its sessions with it (the
/// connector's session timeout, not dlock's default) and shares locks with one built
/// from the URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_on_the_applications_connector_shares_locks_with_one_from_the_url() {
    let Some(url) = url_for("zk") else { return };
    let hosts = hosts_of(&url);
    let root = format!("/dlock-connector-{:x}", fastrand::u64(..));
    let connector = Client::connector().with_session_timeout(Duration::from_secs(4));
    let backend = ZkBackend::from_connector(connector, &hosts, ZkOptions::default().root(&root))
        .await
        .unwrap();
    assert_eq!(backend.session_timeout(), Duration::from_secs(4));
    let mine = DistributeLockManager::builder(backend).build().unwrap();
    let theirs = DistributeLockManager::builder(
        ZkBackend::connect(&format!("zk://{hosts}{root}"))
            .await
            .unwrap(),
    )
    .build()
    .unwrap();
    let held = mine.lock("shared").try_lock(Duration::ZERO).await.unwrap();
    let held = held.expect("the connector's backend was refused");
    assert!(theirs
        .lock("shared")
        .try_lock(Duration::ZERO)
        .await
        .unwrap()
        .is_none());
    held.unlock().await.unwrap();
    let g = theirs
        .lock("shared")
        .try_lock(Duration::from_secs(5))
        .await
        .unwrap();
    assert!(g.is_some(), "not free after the release");
    mine.close().await;
    theirs.close().await;
}
