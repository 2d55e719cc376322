//! What a guard says about its hold, where only a stalled scheduler shows it: `check`
//! judges the guaranteed instant itself, not only the lost signal.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use dlock_api::spi::ErrorKind;
use dlock_api::DistributeLockManager;

/// A process stalled past its hold's guaranteed instant (here: the only runtime
/// thread blocked, so the watchdog cannot fire the lost signal) must not be told by
/// `check` that it can act: `check` compares the clock with `valid_until` itself.
#[tokio::test(flavor = "current_thread")]
async fn check_fails_past_valid_until_before_the_lost_signal_fires() {
    let m = DistributeLockManager::connect("memory://").await.unwrap();
    let lease = Duration::from_millis(200);
    let guard = m
        .lock("stalled")
        .try_lock_with_lease(Duration::ZERO, lease)
        .await
        .unwrap()
        .unwrap();
    guard.check().unwrap();
    let until = guard.valid_until().unwrap();
    // The stall is the subject: block the runtime's only thread past the instant.
    std::thread::sleep(
        until.saturating_duration_since(std::time::Instant::now()) + Duration::from_millis(20),
    );
    assert!(
        !guard.is_lost(),
        "the watchdog ran during the stall; the test shows nothing"
    );
    let err = guard.check().expect_err("check past valid_until");
    assert_eq!(err.kind(), ErrorKind::LockLost, "{err}");
    drop(guard);
    m.close().await;
}

/// A keyed group under a million keys keeps its cache bounded (capacity plus the
/// handles in use), and never evicts a handle in use: the held keys still re-enter.
#[tokio::test]
async fn a_group_stays_bounded_under_a_million_keys() {
    let m = DistributeLockManager::connect("memory://").await.unwrap();
    let capacity = 1_000;
    let group = m.group("k").capacity(capacity);
    let mut held = Vec::new();
    for key in 0..10u32 {
        held.push(
            group
                .lock(format!("held-{key}"))
                .try_lock(Duration::ZERO)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    let mut most = 0;
    for key in 0..1_000_000u32 {
        let _ = group.lock(key);
        most = most.max(group.cached());
    }
    assert!(most <= capacity + held.len(), "{most} handles cached");
    for (key, guard) in held.iter().enumerate() {
        let again = group
            .lock(format!("held-{key}"))
            .try_lock(Duration::ZERO)
            .await
            .unwrap()
            .expect("the held key's handle re-enters");
        assert_eq!(again.acquisition(), dlock_api::Acquisition::Reentered);
        assert_eq!(again.fencing_token(), guard.fencing_token());
    }
    m.close().await;
}
