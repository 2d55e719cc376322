//! The manager's core, shared by every lock, guard and primitive it hands out: its
//! configuration, its holds, the watchdog, and how holds are released (at once, in
//! the background, or given back after a cancelled acquire). The facade users hold
//! is [`crate::DistributeLockManager`] (`manager.rs`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use dlock_spi::{
    spawn_cleanup, Backoff, Capabilities, Error, ErrorKind, HandlerChain, HoldStatus, HoldWatch,
    LockName, LockRemoteResource, LostReason, OwnerId, ReleaseRequest, ReleaseResult, Result,
};
use tokio::sync::watch;

use crate::hold::Hold;
use crate::ids::{id_map, IdMap};
use crate::watchdog::Watchdog;

/// Defaults every lock of a manager starts from.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) lease: Duration,
    pub(crate) watchdog: bool,
    pub(crate) namespace: String,
    pub(crate) context: Bytes,
    /// A fixed loss margin; `None`: the watchdog's default rule.
    pub(crate) loss_margin: Option<Duration>,
    /// The longest a lock or permit is held before the watchdog gives it up.
    pub(crate) max_hold: Option<Duration>,
}

pub(crate) struct ManagerInner {
    pub(crate) id: String,
    pub(crate) chain: HandlerChain,
    pub(crate) capabilities: Capabilities,
    pub(crate) config: Config,
    next_id: AtomicU64,
    holds: Mutex<IdMap<Arc<Hold>>>,
    pub(crate) watchdog: Watchdog,
    closed: watch::Sender<bool>,
}

impl ManagerInner {
    /// A new manager's core over `chain` (whose backend has `capabilities`).
    pub(crate) fn new(chain: HandlerChain, capabilities: Capabilities, config: Config) -> Self {
        ManagerInner {
            id: uuid::Uuid::new_v4().simple().to_string(),
            watchdog: Watchdog::new(chain.clone(), config.loss_margin),
            chain,
            capabilities,
            config,
            next_id: AtomicU64::new(1),
            holds: Mutex::new(id_map()),
            closed: watch::Sender::new(false),
        }
    }

    /// [`crate::DistributeLockManager::close`].
    pub(crate) async fn close(self: &Arc<Self>) {
        self.closed.send_replace(true);
        let holds: Vec<Arc<Hold>> = self.holds().values().cloned().collect();
        // All lost before any release is awaited (and before the watchdog drops
        // waiting extends, so they hear why): no guard says "held" after close.
        for hold in &holds {
            hold.lose(&self.chain, LostReason::ManagerClosed);
        }
        self.watchdog.shutdown();
        for hold in holds {
            if let Err(err) = self.release(&hold).await {
                tracing::warn!(lock = %hold.name, error = &err as &dyn std::error::Error, "dlock: release on close failed; the lease will expire on the server");
            }
        }
    }

    pub(crate) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn new_owner(&self) -> OwnerId {
        OwnerId::new(format!("{}:{}", self.id, self.next_id()))
    }

    pub(crate) fn holds(&self) -> MutexGuard<'_, IdMap<Arc<Hold>>> {
        self.holds.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn is_closed(&self) -> bool {
        *self.closed.borrow()
    }

    pub(crate) fn closed_signal(&self) -> watch::Receiver<bool> {
        self.closed.subscribe()
    }

    pub(crate) fn closed_error(&self) -> Error {
        Error::new(
            ErrorKind::Closed,
            "the lock manager has been closed; create a new manager to take locks again",
        )
    }

    /// Whether a grant of `lease` whose request was sent at `sent_at` is already past
    /// its lost signal when its answer arrives (the answer took longer than the lease
    /// less the loss margin): such a grant is never handed out.
    pub(crate) fn arrived_lost(&self, sent_at: std::time::Instant, lease: Duration) -> bool {
        self.capabilities.lease
            && std::time::Instant::now() >= self.watchdog.lost_at(sent_at, lease)
    }

    /// Records a new hold and has it looked after: by the watchdog when it has a lease
    /// or a cap (`watching.lease` is ignored on session-bound backends), by its
    /// backend's status feed when it is session-bound (`watch`).
    pub(crate) fn track(
        self: &Arc<Self>,
        hold: &Arc<Hold>,
        mut watching: crate::watchdog::Watch,
        watch: Option<HoldWatch>,
    ) {
        self.holds().insert(hold.id, Arc::clone(hold));
        if self.capabilities.lease {
            watching.renew = watching.renew && self.capabilities.renew;
        } else {
            watching.lease = None;
        }
        self.watchdog.register(Arc::clone(hold), watching);
        if let Some(watch) = watch {
            self.follow(hold, watch);
        }
    }

    /// Drives a session-bound hold's status feed: suspended while the backend's
    /// connection is down, lost when the backend says so. One small task per hold,
    /// ending when the hold is released or lost, or the feed ends — started when
    /// the feed's quiet time ends ([`dlock_spi::HoldFeed::quiet_for`], by the
    /// watchdog's scheduler), so a hold released sooner starts none.
    fn follow(self: &Arc<Self>, hold: &Arc<Hold>, watch: HoldWatch) {
        let Some(mut feed) = watch.take() else {
            return;
        };
        let (quiet, id) = (feed.quiet_for(), hold.id);
        let manager = Arc::downgrade(self);
        let hold = Arc::clone(hold);
        let watched = Arc::clone(&hold);
        let apply = move |status: HoldStatus| -> bool {
            let Some(manager) = manager.upgrade() else {
                return false;
            };
            if !manager.holds().contains_key(&hold.id) {
                return false;
            }
            match status {
                HoldStatus::Held => hold.set_suspended(false),
                HoldStatus::Suspended => hold.set_suspended(true),
                HoldStatus::Lost(reason) => {
                    hold.set_suspended(false);
                    hold.lose(&manager.chain, reason);
                    return false;
                }
                _ => {}
            }
            true
        };
        let work = async move {
            loop {
                tokio::select! {
                    status = feed.next() => match status {
                        Some(status) if apply(status) => {}
                        _ => return,
                    },
                    _ = watched.wait_lost() => return,
                }
            }
        };
        if quiet.is_zero() {
            tokio::spawn(work);
        } else {
            self.watchdog
                .defer(id, Instant::now() + quiet, Box::pin(work));
        }
    }

    /// Releases a hold through the chain and forgets it. A release the backend could
    /// not answer (a retryable error: the connection broke, the server restarts) is
    /// returned as it failed and sent again in the background
    /// ([`send_until_answered`]).
    ///
    /// # Cancel safety
    ///
    /// Dropped before the backend has answered, the release goes on in a background
    /// task: the hold is never left registered and taken. Sending the release twice is
    /// harmless — it names the grant, and a grant released already answers `NotOwner`.
    pub(crate) async fn release(self: &Arc<Self>, hold: &Arc<Hold>) -> Result<ReleaseResult> {
        let mut pending = PendingRelease {
            manager: Some(Arc::clone(self)),
            hold: Arc::clone(hold),
        };
        let result = self.release_now(hold).await;
        pending.manager = None;
        if result.as_ref().is_err_and(Error::is_retryable) {
            let (manager, hold) = (Arc::clone(self), Arc::clone(hold));
            tokio::spawn(async move { manager.finish_release(&hold).await });
        }
        result
    }

    /// Releases a hold in a background task (a dropped guard, a cancelled `unlock`),
    /// on `runtime` when called outside one; sent again while the backend cannot
    /// answer it ([`send_until_answered`]).
    pub(crate) fn release_in_background(
        self: Arc<Self>,
        hold: Arc<Hold>,
        runtime: Option<tokio::runtime::Handle>,
    ) {
        let kept = Arc::clone(&hold);
        let work = async move {
            match self.release_now(&hold).await {
                Err(err) if err.is_retryable() => self.finish_release(&hold).await,
                answered => warn_unreleased(&hold.name, answered),
            }
        };
        let what = format_args!("the hold of lock {}", kept.name);
        if !spawn_cleanup(&what, runtime.as_ref(), work) {
            // The read an upgrade kept goes too (it refers back to the manager).
            drop(kept.take_kept());
        }
    }

    async fn release_now(&self, hold: &Hold) -> Result<ReleaseResult> {
        self.watchdog.unregister(hold.id);
        let ctx = hold.release_context(&self.chain);
        let result = self.chain.release(&ctx).await;
        self.holds().remove(&hold.id);
        // The read an upgraded write kept goes now (its own release, if last).
        drop(hold.take_kept());
        result
    }

    /// Sends the release of a hold the backend could not answer again, straight to
    /// the backend (the handlers saw the first attempt: a retry is not another
    /// release to log or count), while the grant may still stand: a lease-based hold
    /// until its lease is up, a session-bound or lost one (ZooKeeper's node lives as
    /// long as the session, which survives a reconnect) — and either — for at most
    /// [`RELEASE_RETRIES`].
    async fn release_again(&self, hold: &Hold) -> Result<ReleaseResult> {
        let most = Instant::now() + RELEASE_RETRIES;
        let until = hold.valid_until().map_or(most, |lease| lease.min(most));
        let request = hold.release_context(&self.chain).request;
        let resource = self.chain.resource();
        resend_release(resource, self.chain.operation_timeout(), &request, until).await
    }

    /// [`Self::release_again`] after a first attempt the backend could not answer,
    /// and a warning if it never gets through.
    async fn finish_release(&self, hold: &Hold) {
        warn_unreleased(&hold.name, self.release_again(hold).await);
    }

    /// Gives back a grant whose acquire was cancelled after the backend may have made
    /// it (the request was sent, the answer never read): in a background task, straight
    /// to the backend, sent again while the backend cannot answer it (for at most
    /// [`RELEASE_RETRIES`]). A grant that was never made answers `NotOwner` and
    /// nothing changes — the release names the grant, so it cannot touch anyone
    /// else's.
    pub(crate) fn abandon(&self, request: ReleaseRequest) {
        let resource = Arc::clone(self.chain.resource());
        let limit = self.chain.operation_timeout();
        let name = request.name.clone();
        let what = format_args!("the give-back of a cancelled acquire's grant of lock {name}");
        spawn_cleanup(&what, None, async move {
            let until = Instant::now() + RELEASE_RETRIES;
            if let Err(err) = resend_release(&resource, limit, &request, until).await {
                tracing::warn!(lock = %request.name, error = &err as &dyn std::error::Error, "dlock: releasing a cancelled acquire's grant failed; it ends with its lease or session");
            }
        });
    }

    /// `name` in the manager's namespace, validated.
    pub(crate) fn full_name(&self, name: impl std::fmt::Display) -> Result<LockName> {
        LockName::with_prefix(&self.config.namespace, &name.to_string())
    }
}

/// A release in flight; finished in the background if its future is dropped.
struct PendingRelease {
    /// `None` once the release has been answered.
    manager: Option<Arc<ManagerInner>>,
    hold: Arc<Hold>,
}

impl Drop for PendingRelease {
    fn drop(&mut self) {
        if let Some(manager) = self.manager.take() {
            manager.release_in_background(Arc::clone(&self.hold), None);
        }
    }
}

impl Drop for ManagerInner {
    fn drop(&mut self) {
        self.watchdog.shutdown();
    }
}

/// The longest a release the backend cannot answer is sent again (a lease-based
/// hold's ends sooner if its lease does). A ZooKeeper session cannot outlive its
/// timeout without a connection (40 s at most by default), so past this the node has
/// gone with its session or the server is gone for good; and a long fixed lease does
/// not keep a task retrying (and the manager alive) for days.
const RELEASE_RETRIES: Duration = Duration::from_secs(60);

/// Sends a release (`send`) until the backend answers it: after a retryable error
/// (the connection broke, the server restarts, a Sentinel fails over) it is sent
/// again ([`Backoff::retry`]), pausing from 50 ms doubling to 2 s (jittered), while
/// the next attempt starts before `until`; returns the answer or the last error.
/// Sending a release again is safe: it names the grant, and a grant gone answers
/// `NotOwner`. Curator does the same (`guaranteed()` deletes); without it a dropped
/// ZooKeeper guard whose delete met a reconnect kept the lock for the rest of the
/// session.
async fn send_until_answered<F, Fut>(until: Instant, send: F) -> Result<ReleaseResult>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<ReleaseResult>>,
{
    Backoff::exponential(Duration::from_millis(50), Duration::from_secs(2))
        .retry(until, send)
        .await
}

/// [`send_until_answered`] of `request` straight to `resource`, each call bounded by
/// `limit` (the operation timeout).
async fn resend_release(
    resource: &Arc<dyn LockRemoteResource>,
    limit: Duration,
    request: &ReleaseRequest,
    until: Instant,
) -> Result<ReleaseResult> {
    send_until_answered(until, || async {
        tokio::time::timeout(limit, resource.release(request))
            .await
            .unwrap_or_else(|_| {
                Err(
                    Error::new(ErrorKind::Timeout, "the backend did not answer in time")
                        .set_retryable(true),
                )
            })
    })
    .await
}

/// Logs a background release that never got through.
fn warn_unreleased(name: &LockName, result: Result<ReleaseResult>) {
    if let Err(err) = result {
        tracing::warn!(lock = %name, error = &err as &dyn std::error::Error, "dlock: background release failed; the grant ends with its lease or session");
    }
}
