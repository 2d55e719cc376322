//! Change feeds: every change wakes the feed, not only the first.

use std::time::Duration;

use dlock_spi::{AcquireRequest, LockName, LockRemoteResource, OwnerId};
use dlock_zk::ZkBackend;

use super::fixtures::*;

/// A change feed's watches are one-shot: each event must set them again and ping
/// the feed, so a grant, its release and the next grant each wake it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_feed_wakes_on_every_change_not_only_the_first() {
    let Some(url) = url_for("zk") else { return };
    let backend = ZkBackend::connect(&url).await.unwrap();
    let other = ZkBackend::connect(&url).await.unwrap();
    let lock = LockName::new(name("fed")).unwrap();
    let events = backend.events().expect("ZooKeeper follows locks");
    let mut feed = events.follow(&lock).await.unwrap();
    let within = Duration::from_secs(3);
    for (round, owner) in ["a", "b", "c"].into_iter().enumerate() {
        let req = AcquireRequest::new(
            lock.clone(),
            OwnerId::new(owner),
            dlock_spi::GrantId::new(round as u64 + 1),
        )
        .with_lease(Duration::from_secs(10));
        let token = other.try_acquire(&req).await.unwrap().token().unwrap();
        let pinged = tokio::time::timeout(within, feed.changed()).await;
        assert_eq!(
            pinged.ok(),
            Some(true),
            "round {round}: the grant was not reported"
        );
        let release = dlock_spi::ReleaseRequest::new(
            lock.clone(),
            OwnerId::new(owner),
            dlock_spi::GrantId::new(round as u64 + 1),
            dlock_spi::LockMode::Exclusive,
            token,
        );
        other.release(&release).await.unwrap();
        let pinged = tokio::time::timeout(within, feed.changed()).await;
        assert_eq!(
            pinged.ok(),
            Some(true),
            "round {round}: the release was not reported"
        );
    }
}
