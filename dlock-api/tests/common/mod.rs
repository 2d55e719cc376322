//! Test doubles shared by the API's test files: the in-memory backend with hooks a
//! test can turn on, and a handler that records what the chain reports.
#![allow(dead_code, clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use dlock_api::spi::async_trait;
use dlock_api::spi::{
    AcquireChain, AcquireContext, AcquireRequest, AcquireResult, Capabilities, Error, HoldStatus,
    HoldWatch, InMemoryBackend, LockAdmin, LockHandler, LockName, LockRemoteResource, LockState,
    LostEvent, LostReason, ReleaseChain, ReleaseContext, ReleaseRequest, ReleaseResult, RenewEvent,
    RenewRequest, RenewResult, Result,
};
use tokio::sync::Notify;

/// The in-memory backend, changed as a test needs: renewals that fail (a backend
/// that became unreachable) or hang (a black-holed connection); session-bound holds
/// (no lease; every grant carries a status feed the test publishes on, as
/// ZooKeeper's do); acquire requests recorded; an acquire held back after its grant
/// (until `release_gate` is notified) so a test can act while the answer is in flight.
#[derive(Clone, Default)]
pub(crate) struct Wrapped {
    pub inner: InMemoryBackend,
    pub renew_fails: Arc<AtomicBool>,
    /// Renewals panic (a bug in a backend).
    pub renew_panics: Arc<AtomicBool>,
    /// Renewals answer this many milliseconds late (after deciding to fail or not).
    pub renew_delay_ms: Arc<std::sync::atomic::AtomicU64>,
    pub swallow_renewals: Arc<AtomicBool>,
    pub session_bound: bool,
    /// Session-bound grants carry a [`QuietFeed`] quiet for this long.
    pub quiet: Option<std::time::Duration>,
    /// How often the grants' quiet feeds were polled.
    pub polls: Arc<AtomicUsize>,
    pub feeds: Arc<Mutex<Vec<tokio::sync::watch::Sender<HoldStatus>>>>,
    pub requests: Arc<Mutex<Vec<AcquireRequest>>>,
    pub stall_after_grant: Arc<AtomicBool>,
    /// Answers an error after granting (a committed grant whose answer was lost).
    pub error_after_grant: Arc<AtomicBool>,
    pub granted: Arc<Notify>,
    pub release_gate: Arc<Notify>,
    /// When each grant was made: taken as the inner backend answers, before the
    /// caller's task is scheduled again.
    pub grants_at: Arc<Mutex<Vec<std::time::Instant>>>,
}

impl Wrapped {
    pub(crate) fn session_bound() -> Self {
        Wrapped {
            session_bound: true,
            ..Wrapped::default()
        }
    }
}

#[async_trait]
impl LockRemoteResource for Wrapped {
    fn backend_name(&self) -> &'static str {
        "memory"
    }
    fn capabilities(&self) -> Capabilities {
        let mut caps = self.inner.capabilities();
        if self.session_bound {
            caps.lease = false;
            caps.renew = false;
        }
        caps
    }
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<AcquireResult> {
        self.requests.lock().unwrap().push(req.clone());
        let got = self.inner.try_acquire(req).await?;
        if got.is_acquired() {
            self.grants_at
                .lock()
                .unwrap()
                .push(std::time::Instant::now());
        }
        if got.is_acquired() && self.error_after_grant.load(Ordering::SeqCst) {
            return Err(Error::backend("connection reset after the grant (test)"));
        }
        if got.is_acquired() && self.stall_after_grant.load(Ordering::SeqCst) {
            self.granted.notify_one();
            self.release_gate.notified().await;
        }
        if !self.session_bound || !got.is_acquired() {
            return Ok(got);
        }
        let watch = match self.quiet {
            Some(quiet) => {
                let (tx, rx) = tokio::sync::watch::channel(HoldStatus::Held);
                self.feeds.lock().unwrap().push(tx);
                HoldWatch::new(QuietFeed {
                    until: std::time::Instant::now() + quiet,
                    polls: Arc::clone(&self.polls),
                    rx,
                })
            }
            None => {
                let (tx, watch) = HoldWatch::channel();
                self.feeds.lock().unwrap().push(tx);
                watch
            }
        };
        Ok(got.with_watch(watch))
    }
    async fn release(&self, req: &ReleaseRequest) -> Result<ReleaseResult> {
        self.inner.release(req).await
    }
    async fn renew(&self, req: &RenewRequest) -> Result<RenewResult> {
        assert!(
            !self.renew_panics.load(Ordering::SeqCst),
            "a backend's renewal panicked (test)"
        );
        let fails = self.renew_fails.load(Ordering::SeqCst);
        let delay = self.renew_delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
        }
        if fails {
            return Err(Error::backend("connection refused (test)"));
        }
        if self.swallow_renewals.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        self.inner.renew(req).await
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<LockState>> {
        self.inner.inspect(name).await
    }
    fn admin(&self) -> Option<&dyn LockAdmin> {
        self.inner.admin()
    }

    fn events(&self) -> Option<&dyn dlock_spi::LockEvents> {
        self.inner.events()
    }

    fn batch_renew(&self) -> Option<&dyn dlock_spi::BatchRenew> {
        None
    }
}

/// A status feed that says it is quiet until `until` (as the SQL session modes'
/// probe, which first asks its session a fifth of the session timeout after the
/// grant): counts its polls, and once polled reports what the test sends.
pub(crate) struct QuietFeed {
    pub until: std::time::Instant,
    pub polls: Arc<AtomicUsize>,
    pub rx: tokio::sync::watch::Receiver<HoldStatus>,
}

#[async_trait]
impl dlock_api::spi::HoldFeed for QuietFeed {
    fn quiet_for(&self) -> std::time::Duration {
        self.until
            .saturating_duration_since(std::time::Instant::now())
    }

    async fn next(&mut self) -> Option<HoldStatus> {
        self.polls.fetch_add(1, Ordering::SeqCst);
        self.rx.changed().await.ok()?;
        Some(*self.rx.borrow_and_update())
    }
}

/// Counts renewals and records losses reported to handlers.
#[derive(Default)]
pub(crate) struct Observer {
    pub renewed: AtomicUsize,
    pub renew_failed: AtomicUsize,
    pub lost: Mutex<Vec<LostReason>>,
    /// When each loss reached the handler: the moment the chain was told, before
    /// the guard's owner is scheduled to see it.
    pub lost_at: Mutex<Vec<std::time::Instant>>,
    /// When each successful renewal reached the handler, with its lock's name.
    pub renewed_at: Mutex<Vec<(String, std::time::Instant)>>,
}

/// The handler that feeds an [`Observer`].
pub(crate) struct ObserverHandler(pub Arc<Observer>);

#[async_trait]
impl LockHandler for ObserverHandler {
    async fn acquire(&self, ctx: &AcquireContext, next: AcquireChain<'_>) -> Result<AcquireResult> {
        next.invoke(ctx).await
    }
    async fn release(&self, ctx: &ReleaseContext, next: ReleaseChain<'_>) -> Result<ReleaseResult> {
        next.invoke(ctx).await
    }
    fn on_renew(&self, event: &RenewEvent<'_>) {
        match event.outcome {
            Ok(RenewResult::Renewed { .. }) => {
                self.0.renewed_at.lock().unwrap().push((
                    event.request.name.as_str().to_owned(),
                    std::time::Instant::now(),
                ));
                self.0.renewed.fetch_add(1, Ordering::SeqCst)
            }
            _ => self.0.renew_failed.fetch_add(1, Ordering::SeqCst),
        };
    }
    fn on_lost(&self, event: &LostEvent<'_>) {
        self.0.lost.lock().unwrap().push(event.reason);
        self.0
            .lost_at
            .lock()
            .unwrap()
            .push(std::time::Instant::now());
    }
}

/// A [`Wrapped`] backend and a manager on it with `lease` (and defaults otherwise).
pub(crate) fn wrapped_manager(
    lease: std::time::Duration,
) -> (Wrapped, dlock_api::DistributeLockManager) {
    let backend = Wrapped::default();
    let manager = dlock_api::DistributeLockManager::builder(backend.clone())
        .lease(lease)
        .build()
        .unwrap();
    (backend, manager)
}
