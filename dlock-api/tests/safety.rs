//! Safety of the user API on the in-memory backend: cancellation at every await,
//! `close` racing an acquire, one entry point for losses, one wait per `lock()`, and
//! the loss margin. Each test failed on the code before its fix.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock_api::spi::async_trait;
use dlock_api::spi::{
    AcquireChain, AcquireContext, AcquireRequest, AcquireResult, Capabilities, ErrorKind,
    InMemoryBackend, LockAdmin, LockHandler, LockName, LockRemoteResource, LockState, LostEvent,
    LostReason, ReleaseChain, ReleaseContext, ReleaseRequest, ReleaseResult, RenewRequest,
    RenewResult, Result,
};
use dlock_api::DistributeLockManager;
use tokio::sync::Notify;

/// The in-memory backend with hooks: records acquire requests, can hold an acquire
/// after the grant is made (until `release_gate` is notified), and can swallow
/// renewals (a black-holed connection).
#[derive(Clone, Default)]
struct Hooked {
    inner: InMemoryBackend,
    requests: Arc<Mutex<Vec<AcquireRequest>>>,
    stall_after_grant: Arc<AtomicBool>,
    granted: Arc<Notify>,
    release_gate: Arc<Notify>,
    swallow_renewals: Arc<AtomicBool>,
}

#[async_trait]
impl LockRemoteResource for Hooked {
    fn backend_name(&self) -> &'static str {
        "hooked"
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<AcquireResult> {
        self.requests.lock().unwrap().push(req.clone());
        let result = self.inner.try_acquire(req).await?;
        if result.is_acquired() && self.stall_after_grant.load(Ordering::SeqCst) {
            self.granted.notify_one();
            self.release_gate.notified().await;
        }
        Ok(result)
    }
    async fn release(&self, req: &ReleaseRequest) -> Result<ReleaseResult> {
        self.inner.release(req).await
    }
    async fn renew(&self, req: &RenewRequest) -> Result<RenewResult> {
        if self.swallow_renewals.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        self.inner.renew(req).await
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<LockState>> {
        self.inner.inspect(name).await
    }
    fn admin(&self) -> Option<&dyn LockAdmin> {
        Some(&self.inner)
    }
}

/// Counts the losses handlers are told of.
#[derive(Clone, Default)]
struct LossCounter(Arc<Mutex<Vec<LostReason>>>);

#[async_trait]
impl LockHandler for LossCounter {
    async fn acquire(&self, ctx: &AcquireContext, next: AcquireChain<'_>) -> Result<AcquireResult> {
        next.invoke(ctx).await
    }
    async fn release(&self, ctx: &ReleaseContext, next: ReleaseChain<'_>) -> Result<ReleaseResult> {
        next.invoke(ctx).await
    }
    fn on_lost(&self, event: &LostEvent<'_>) {
        self.0.lock().unwrap().push(event.reason);
    }
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
    let backend = Hooked::default();
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
    let backend = Hooked::default();
    let m = DistributeLockManager::builder(backend.clone())
        .build()
        .unwrap();
    backend.stall_after_grant.store(true, Ordering::SeqCst);
    let lock = m.lock("race");
    let acquire =
        tokio::spawn(async move { lock.try_lock(Duration::ZERO).await.map(|g| g.is_some()) });
    backend.granted.notified().await; // the backend granted; the answer is held back
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
    let backend = Hooked::default();
    let m = DistributeLockManager::builder(backend.clone())
        .build()
        .unwrap();
    backend.stall_after_grant.store(true, Ordering::SeqCst);
    let lock = m.lock("cut");
    let acquire = tokio::spawn(async move { lock.try_lock(Duration::ZERO).await.map(drop) });
    backend.granted.notified().await;
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
    let backend = Hooked::default();
    let losses = LossCounter::default();
    let m = DistributeLockManager::builder(backend.clone())
        .with_handler(losses.clone())
        .build()
        .unwrap();
    let g = m.lock("stolen").lock().await.unwrap();
    backend
        .inner
        .force_release(&LockName::new("stolen").unwrap());
    assert_eq!(g.unlock().await.unwrap_err().kind(), ErrorKind::NotOwner);
    assert_eq!(*losses.0.lock().unwrap(), [LostReason::NotOwner]);

    let _held = m.lock("closing").lock().await.unwrap();
    m.close().await;
    assert_eq!(
        *losses.0.lock().unwrap(),
        [LostReason::NotOwner, LostReason::ManagerClosed]
    );
}

/// Deliver 2: with renewals black-holed, the lost signal fires at least the configured
/// margin before the store expires the hold, and the store grants the lock to someone
/// else only after it.
#[tokio::test]
async fn the_lost_signal_leads_the_expiry_by_the_margin() {
    let backend = Hooked::default();
    let lease = Duration::from_millis(600);
    let margin = Duration::from_millis(120);
    let m = DistributeLockManager::builder(backend.clone())
        .lease(lease)
        .loss_margin(margin)
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
        let at = Instant::now();
        drop(g);
        at
    });
    let reason = tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .unwrap();
    let lost_at = Instant::now();
    assert_eq!(reason, LostReason::LeaseExpired);
    let granted_at = taken.await.unwrap();
    let lead = granted_at.saturating_duration_since(lost_at);
    assert!(
        lead >= margin,
        "the lost signal led the next grant by {lead:?}, less than the {margin:?} margin"
    );
}
