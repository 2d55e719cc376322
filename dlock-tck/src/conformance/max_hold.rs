//! The bounded watchdog: a hold with `max_hold` is renewed until then, lost with
//! its own reason at that instant — before the store's lease runs out — and given
//! back, so another client gets the lock at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_api::{DistributeLockManager, LockGuard, LockOptions};
use dlock_spi::{ErrorKind, LostReason};

use super::Env;
use crate::TestBackend;

/// How soon after the loss another client must get the lock.
const GIVEN_BACK: Duration = Duration::from_millis(400);

/// How late the lost signal may fire after `max_hold` (timer and scheduling).
const LATE: Duration = Duration::from_millis(500);

/// Waits for `guard`'s loss and checks it came at its bound `max_hold`, with its
/// own reason, and that `rival` then gets the lock at once.
async fn ends_at_its_bound(
    guard: LockGuard,
    max_hold: Duration,
    holder: &DistributeLockManager,
    rival: &DistributeLockManager,
    name: &str,
) {
    let reason = tokio::time::timeout(max_hold + LATE * 4, guard.lost())
        .await
        .expect("the lost signal fires at max_hold");
    let at = Instant::now();
    assert_eq!(reason, LostReason::MaxHold);
    let held = at.duration_since(guard.acquired_at());
    assert!(
        held >= max_hold,
        "lost after {held:?}, before its max_hold {max_hold:?}"
    );
    assert!(
        held <= max_hold + LATE,
        "lost after {held:?}, late for its max_hold {max_hold:?}"
    );
    let err = guard.check().expect_err("check after max_hold");
    assert_eq!(err.kind(), ErrorKind::LockLost, "{err}");
    // Given back: another client gets it at once, not when the last renewal's
    // lease (600 ms or more beyond the bound here) runs out.
    let asked = Instant::now();
    let next = rival
        .lock(name)
        .try_lock(Duration::from_secs(5))
        .await
        .expect("no error")
        .expect("the bounded hold was given back");
    assert!(
        asked.elapsed() < GIVEN_BACK,
        "the lock came free {:?} after max_hold",
        asked.elapsed()
    );
    next.unlock().await.expect("unlock");
    let err = guard
        .unlock()
        .await
        .expect_err("unlock of a bounded-out hold");
    assert_eq!(err.kind(), ErrorKind::LockLost, "{err}");
    assert_eq!(holder.held_count(), 0);
}

/// `max_hold` per acquisition and per manager: the hold outlives several
/// renewals, is lost with [`LostReason::MaxHold`] at its bound and not before,
/// and the lock is free for another client right after; zero is refused.
pub async fn max_hold_ends_a_hold_before_its_lease(backend: Arc<dyn TestBackend>) {
    let env = Env::new(backend);
    // Renewed every 300 ms: the last renewal before a bound is at most 300 ms
    // before it, so its lease outlasts the bound by 600 ms or more.
    let lease = Duration::from_millis(900);
    let a = env.manager_with(|m| m.lease(lease)).await;
    let b = env.manager().await;

    // Longer than the lease: renewals keep it until the bound.
    let max_hold = Duration::from_millis(1000);
    let guard = a
        .lock("bounded")
        .try_lock_with(Duration::ZERO, &LockOptions::new().max_hold(max_hold))
        .await
        .expect("no error")
        .expect("free");
    ends_at_its_bound(guard, max_hold, &a, &b, "bounded").await;

    let c = env
        .manager_with(|m| m.lease(lease).max_hold(Duration::from_millis(600)))
        .await;
    let guard = c
        .lock("bounded")
        .try_lock(Duration::from_secs(5))
        .await
        .expect("no error")
        .expect("free");
    ends_at_its_bound(guard, Duration::from_millis(600), &c, &b, "bounded").await;

    let err = a
        .lock("bounded")
        .try_lock_with(Duration::ZERO, &LockOptions::new().max_hold(Duration::ZERO))
        .await
        .expect_err("a zero max_hold");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let client = env.backend().client().await.expect("client");
    let err = dlock_api::DistributeLockManager::builder(client)
        .max_hold(Duration::ZERO)
        .build()
        .expect_err("a manager with a zero max_hold");
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    env.finish(&[&a, &b, &c]).await;
}
