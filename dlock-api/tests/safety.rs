//! Safety of the user API on the in-memory backend: cancellation at every await,
//! `close` racing an acquire, one entry point for losses, one wait per `lock()`, and
//! the loss margin. Each test failed on the code before its fix.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_api::spi::{ErrorKind, LockName, LostReason};
use dlock_api::DistributeLockManager;

mod common;
use common::{Observer, ObserverHandler, Wrapped};

/// A manager on a fresh backend and a `try_lock(name)` whose grant the backend has
/// made but not yet answered (held back until `release_gate` is notified).
async fn acquire_in_flight(
    name: &str,
) -> (
    Wrapped,
    DistributeLockManager,
    tokio::task::JoinHandle<dlock_api::Result<bool>>,
) {
    let backend = Wrapped::default();
    let m = DistributeLockManager::builder(backend.clone())
        .build()
        .unwrap();
    backend.stall_after_grant.store(true, Ordering::SeqCst);
    let lock = m.lock(name);
    let acquire =
        tokio::spawn(async move { lock.try_lock(Duration::ZERO).await.map(|g| g.is_some()) });
    backend.granted.notified().await;
    (backend, m, acquire)
}

async fn settle(check: impl Fn() -> bool) -> bool {
    for _ in 0..200 {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    check()
}

/// Item 6: `lock()` waits once, with one grant and no deadline in sight — a wait
/// re-issued in slices re-queued at the tail of a fair queue every slice.
#[tokio::test]
async fn lock_waits_in_one_request_with_one_grant() {
    let backend = Wrapped::default();
    let m = DistributeLockManager::builder(backend.clone())
        .build()
        .unwrap();
    let held = m.lock("once").lock().await.unwrap();
    let waiter = m.lock("once");
    let waiting = tokio::spawn(async move { waiter.lock().await.map(|g| g.fencing_token()) });
    assert!(settle(|| backend.requests.lock().unwrap().len() == 2).await);
    let wait = backend.requests.lock().unwrap()[1].clone();
    let horizon = wait
        .deadline
        .expect("lock() waits")
        .saturating_duration_since(Instant::now());
    assert!(
        horizon > Duration::from_secs(24 * 3600),
        "lock() waits with a deadline {horizon:?} away: it would re-queue when that passes"
    );
    held.unlock().await.unwrap();
    waiting.await.unwrap().unwrap();
    assert_eq!(backend.requests.lock().unwrap().len(), 2);
    m.close().await;
}

/// Item 10: `close()` while an acquire's grant is in flight: the grant is released,
/// the acquire fails with `Closed`, nothing stays taken.
#[tokio::test]
async fn close_racing_an_acquire_leaves_nothing_taken() {
    let (backend, m, acquire) = acquire_in_flight("race").await;
    m.close().await;
    backend.release_gate.notify_one();
    let outcome = acquire.await.unwrap();
    assert_eq!(outcome.map_err(|e| e.kind()), Err(ErrorKind::Closed));
    assert!(
        settle(|| backend.inner.active_locks() == 0).await,
        "the grant made while closing is still held"
    );
    assert_eq!(m.held_count(), 0);
}

/// Cancel safety of acquire: a try_lock dropped after the backend granted but before
/// the answer arrived gives that grant back (never taken and forgotten).
#[tokio::test]
async fn a_cancelled_acquire_gives_its_grant_back() {
    let (backend, _m, acquire) = acquire_in_flight("cut").await;
    acquire.abort();
    let _ = acquire.await;
    assert!(
        settle(|| backend.inner.active_locks() == 0).await,
        "the grant of the cancelled acquire is still held"
    );
    backend.stall_after_grant.store(false, Ordering::SeqCst);
    let other = DistributeLockManager::builder(backend.clone())
        .build()
        .unwrap();
    assert!(other
        .lock("cut")
        .try_lock(Duration::ZERO)
        .await
        .unwrap()
        .is_some());
}

/// Item 13: a loss found by `unlock()` (NotOwner) or by `close()` reaches the handlers'
/// `on_lost`, as one found by the watchdog does — one entry point for losses.
#[tokio::test]
async fn every_loss_reaches_the_handlers() {
    let backend = Wrapped::default();
    let losses = Arc::new(Observer::default());
    let m = DistributeLockManager::builder(backend.clone())
        .with_handler(ObserverHandler(Arc::clone(&losses)))
        .build()
        .unwrap();
    let g = m.lock("stolen").lock().await.unwrap();
    backend
        .inner
        .force_release(&LockName::new("stolen").unwrap());
    assert_eq!(g.unlock().await.unwrap_err().kind(), ErrorKind::NotOwner);
    assert_eq!(*losses.lost.lock().unwrap(), [LostReason::NotOwner]);

    let _held = m.lock("closing").lock().await.unwrap();
    m.close().await;
    assert_eq!(
        *losses.lost.lock().unwrap(),
        [LostReason::NotOwner, LostReason::ManagerClosed]
    );
}

/// Deliver 2: with renewals black-holed, the hold's guaranteed instant
/// (`valid_until`, which `check()` enforces) is at least the configured margin before
/// the store grants the lock to someone else, and the lost signal fires before that
/// grant. (The signal is scheduled at the guaranteed instant; the margin is the
/// budget for its timer running late — CI's busy run once saw it 15 ms late, the
/// signal 116 ms ahead of the grant, so the signal's own lead is not held to the
/// whole margin.)
#[tokio::test]
async fn the_lost_signal_leads_the_expiry_by_the_margin() {
    let backend = Wrapped::default();
    let lease = Duration::from_millis(600);
    let margin = Duration::from_millis(120);
    // Both moments are taken where they happen — the loss as the chain is told of
    // it, the grant as the store makes it — not when the tasks that wait for them
    // are next scheduled: on a loaded machine either task may run late, which says
    // nothing of the margin (a run on a fresh machine saw 116 ms measured after the
    // waits, the loss observed late).
    let losses = Arc::new(Observer::default());
    let m = DistributeLockManager::builder(backend.clone())
        .lease(lease)
        .loss_margin(margin)
        .with_handler(ObserverHandler(Arc::clone(&losses)))
        .build()
        .unwrap();
    let other = DistributeLockManager::builder(backend.clone())
        .build()
        .unwrap();
    let g = m.lock("margin").lock().await.unwrap();
    backend.swallow_renewals.store(true, Ordering::SeqCst);
    let rival = other.lock("margin");
    let taken = tokio::spawn(async move {
        let g = rival
            .try_lock(Duration::from_secs(5))
            .await
            .unwrap()
            .unwrap();
        drop(g);
    });
    // The last guaranteed instant before the loss (it moves only with a renewal).
    let mut until = g.valid_until();
    let reason = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            tokio::select! {
                reason = g.lost() => break reason,
                () = tokio::time::sleep(Duration::from_millis(2)) => {
                    until = g.valid_until().or(until);
                }
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(reason, LostReason::LeaseExpired);
    taken.await.unwrap();
    assert_eq!(*losses.lost.lock().unwrap(), [LostReason::LeaseExpired]);
    let lost_at = losses.lost_at.lock().unwrap()[0];
    // The first grant is the hold that was lost; the second, the rival's.
    let grants = backend.grants_at.lock().unwrap().clone();
    assert_eq!(grants.len(), 2, "{grants:?}");
    let until = until.expect("the hold had a guaranteed instant before its loss");
    let lead = grants[1].saturating_duration_since(until);
    assert!(
        lead >= margin,
        "the guaranteed instant led the next grant by {lead:?}, less than the {margin:?} margin"
    );
    assert!(
        lost_at < grants[1],
        "the lost signal came {:?} after the next grant",
        lost_at - grants[1]
    );
}

/// A grant whose answer arrives after its lease (less the loss margin) has run out —
/// the store may let it go any moment — is never handed out: a try-once call answers
/// "not acquired" and gives the grant back, a waiting call asks again and returns a
/// live guard. (Found by the lock-history checker on PostgreSQL: an answer that took
/// 2.9 s for a 2 s lease became a guard already lost.)
#[tokio::test]
async fn a_grant_that_arrives_after_its_lease_is_not_handed_out() {
    let lease = Duration::from_millis(300);
    for wait in [Duration::ZERO, Duration::from_secs(5)] {
        let backend = Wrapped::default();
        let m = DistributeLockManager::builder(backend.clone())
            .build()
            .unwrap();
        backend.stall_after_grant.store(true, Ordering::SeqCst);
        let lock = m.lock("late");
        let acquire = tokio::spawn(async move {
            lock.try_lock_with(wait, &dlock_api::LockOptions::new().lease(lease))
                .await
                .map(|g| g.map(|g| (g.is_lost(), g.fencing_token())))
        });
        backend.granted.notified().await;
        // The answer is held back past the lease.
        tokio::time::sleep(lease + Duration::from_millis(50)).await;
        backend.stall_after_grant.store(false, Ordering::SeqCst);
        backend.release_gate.notify_one();
        let got = acquire.await.unwrap().unwrap();
        if wait.is_zero() {
            assert_eq!(
                got, None,
                "a grant that arrived after its lease was handed out"
            );
            // ... and it was given back: another handle gets the lock.
            let other = m.lock("late");
            assert!(
                settle_async(|| async { other.try_lock(Duration::ZERO).await.unwrap().is_some() })
                    .await,
                "the late grant was not given back"
            );
        } else {
            let (lost, _) = got.expect("a waiting call asks again and gets a live guard");
            assert!(!lost, "the guard handed out was already lost");
            assert_eq!(backend.requests.lock().unwrap().len(), 2);
        }
        m.close().await;
    }
}

async fn settle_async<F, Fut>(mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..200 {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

/// An acquire that fails after the store may have granted it (the answer lost to a
/// reset connection) gives the grant back: the lock is free again at once, not when
/// the grant's lease ends.
#[tokio::test]
async fn a_failed_acquire_gives_back_the_grant_it_may_have_made() {
    let backend = Wrapped::default();
    let m = DistributeLockManager::builder(backend.clone())
        .build()
        .unwrap();
    backend.error_after_grant.store(true, Ordering::SeqCst);
    let err = m
        .lock("reset")
        .try_lock(Duration::ZERO)
        .await
        .expect_err("the acquire fails");
    assert_eq!(err.kind(), ErrorKind::Backend);
    backend.error_after_grant.store(false, Ordering::SeqCst);
    let other = m.lock("reset");
    assert!(
        settle_async(|| async { other.try_lock(Duration::ZERO).await.unwrap().is_some() }).await,
        "the grant behind the failed acquire was kept until its 30 s lease ends"
    );
    m.close().await;
}
