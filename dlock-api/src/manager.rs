//! The manager: one per backend connection, handing out locks.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use dlock_spi::{
    lease_out_of_range, spawn_cleanup, Backoff, Capabilities, Error, ErrorKind, Fairness,
    HandlerChain, HoldStatus, HoldWatch, LockHandler, LockMode, LockName, LockRemoteResource,
    LockState, LostReason, OwnerId, ReleaseRequest, ReleaseResult, Result,
};
use tokio::sync::watch;

use crate::election::{Contender, Contention, Election};
use crate::group::LockGroup;
use crate::hold::Hold;
use crate::ids::{id_map, IdMap};
use crate::lock::DistributeLock;
use crate::rwlock::ReadWriteLock;
use crate::semaphore::Semaphore;
use crate::watchdog::Watchdog;

/// Defaults every lock of a manager starts from.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) lease: Duration,
    pub(crate) watchdog: bool,
    pub(crate) fairness: Fairness,
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
    pub(crate) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn new_owner(&self) -> OwnerId {
        OwnerId::new(format!("{}:{}", self.id, self.next_id()))
    }

    fn holds(&self) -> MutexGuard<'_, IdMap<Arc<Hold>>> {
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

    pub(crate) fn full_name(&self, name: &str) -> Result<LockName> {
        LockName::with_prefix(&self.config.namespace, name)
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

/// Hands out distributed locks backed by one [`LockRemoteResource`], passing every
/// acquire and release through the handler chain.
///
/// Cheap to clone; clones share the backend, the chain and the watchdog.
///
/// ```
/// # async fn demo() -> dlock_spi::Result<()> {
/// use std::time::Duration;
/// use dlock_api::DistributeLockManager;
///
/// let manager = DistributeLockManager::connect("memory://").await?;
/// let lock = manager.lock("orders:42");
/// if let Some(guard) = lock.try_lock(Duration::from_secs(1)).await? {
///     println!("fencing token {}", guard.fencing_token());
///     guard.unlock().await?;
/// }
/// manager.close().await;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct DistributeLockManager {
    pub(crate) inner: Arc<ManagerInner>,
}

impl DistributeLockManager {
    /// Starts building a manager over `resource`.
    pub fn builder<R: LockRemoteResource>(resource: R) -> DistributeLockManagerBuilder {
        DistributeLockManagerBuilder::new(Arc::new(resource))
    }

    /// Opens the backend a URL names (see [`crate::open_backend`]) and builds a manager
    /// with default settings.
    pub async fn connect(url: &str) -> Result<Self> {
        let resource = crate::connect::open_backend(url).await?;
        DistributeLockManagerBuilder::new(resource).build()
    }

    /// A lock handle for `name` (prefixed with the manager's namespace). Each call gives
    /// a new owner: two handles for the same name exclude each other, while a handle and
    /// its clones share ownership and re-enter. An invalid name is reported by the first
    /// operation on the handle as [`ErrorKind::InvalidName`].
    pub fn lock(&self, name: &str) -> DistributeLock {
        DistributeLock::new(
            Arc::clone(&self.inner),
            self.inner.full_name(name),
            LockMode::Exclusive,
            self.inner.config.fairness,
        )
    }

    /// Like [`lock`](Self::lock) but granted in arrival order (needs a backend with fair locks).
    pub fn fair_lock(&self, name: &str) -> DistributeLock {
        DistributeLock::new(
            Arc::clone(&self.inner),
            self.inner.full_name(name),
            LockMode::Exclusive,
            Fairness::Fair,
        )
    }

    /// A read-write lock for `name`: many readers together, or one writer.
    pub fn read_write_lock(&self, name: &str) -> ReadWriteLock {
        ReadWriteLock::new(
            Arc::clone(&self.inner),
            self.inner.full_name(name),
            self.inner.config.fairness,
        )
    }

    /// A family of locks whose names share `prefix` (ylock's `Locks`): `group.lock(id)`
    /// locks `"<prefix>:<id>"`, the same owner for the same id (handles kept in a
    /// bounded cache; see [`LockGroup`]).
    pub fn group(&self, prefix: &str) -> LockGroup {
        LockGroup::new(self.clone(), prefix)
    }

    /// Several locks taken together, all or none, in a fixed order (see
    /// [`MultiLock`](crate::MultiLock)); one guard and one lost signal for all.
    pub fn multi_lock<I>(&self, names: I) -> crate::MultiLock
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let names = names.into_iter().map(|n| n.as_ref().to_owned()).collect();
        crate::MultiLock::new(self, names)
    }

    /// The election `name` (prefixed with the manager's namespace): campaign to lead
    /// it, see who leads, follow the changes. It shares its name with the lock
    /// `name` — `dlock status name` shows the leader.
    pub fn election(&self, name: &str) -> Election {
        Election::new(self.clone(), name)
    }

    /// Keeps `contender` in the running for the leadership of `name` (Simba's
    /// contention service), with the manager's context as its leader value: whenever
    /// it wins a term, [`Contender::on_acquired`] runs the leader's work; when the
    /// term ends, [`Contender::on_released`] follows, then the leadership is given
    /// back, and the contender queues again — until [`Contention::stop`].
    ///
    /// Errors: the name is invalid, or there is no tokio runtime to run it in.
    pub fn contend<C: Contender>(&self, name: &str, contender: C) -> Result<Contention> {
        self.election(name)
            .contend_as(self.inner.config.context.clone(), contender)
    }

    /// The semaphore `name` with `permits` permits in total (every client must name
    /// the same total while it is in use; see [`Semaphore`]). Needs a backend with
    /// semaphores ([`Capabilities::semaphore`]); others refuse its acquires with
    /// [`ErrorKind::Unsupported`].
    pub fn semaphore(&self, name: &str, permits: u32) -> Semaphore {
        Semaphore::new(self.clone(), name, permits)
    }

    /// Who holds `name` and how many wait, straight from the backend (bounded by
    /// the operation timeout).
    pub async fn inspect(&self, name: &str) -> Result<Option<LockState>> {
        let name = self.inner.full_name(name)?;
        self.inner.chain.inspect(&name).await
    }

    /// The backend's capabilities.
    pub fn capabilities(&self) -> Capabilities {
        self.inner.capabilities
    }

    /// The backend's short name (`"memory"`, `"redis"`, …).
    pub fn backend_name(&self) -> &'static str {
        self.inner.chain.resource().backend_name()
    }

    /// This manager's random id, the prefix of every owner it creates.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// How many locks this manager holds right now (reentrant holds count once).
    pub fn held_count(&self) -> usize {
        self.inner.holds().len()
    }

    /// How many held locks the watchdog is watching.
    pub fn watched_count(&self) -> usize {
        self.inner.watchdog.watched()
    }

    /// Whether [`close`](Self::close) has been called.
    pub fn is_closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// Stops the watchdog, wakes every waiting `lock()` with [`ErrorKind::Closed`],
    /// releases every lock still held (their guards' lost signals fire with
    /// [`LostReason::ManagerClosed`]), and refuses new acquires. Idempotent.
    ///
    /// # Cancel safety
    ///
    /// Every guard reports its hold lost before the first await; dropped later, the
    /// releases not yet sent are left to expire on the server.
    pub async fn close(&self) {
        self.inner.closed.send_replace(true);
        let holds: Vec<Arc<Hold>> = self.inner.holds().values().cloned().collect();
        // All lost before any release is awaited (and before the watchdog drops
        // waiting extends, so they hear why): no guard says "held" after close.
        for hold in &holds {
            hold.lose(&self.inner.chain, LostReason::ManagerClosed);
        }
        self.inner.watchdog.shutdown();
        for hold in holds {
            if let Err(err) = self.inner.release(&hold).await {
                tracing::warn!(lock = %hold.name, error = &err as &dyn std::error::Error, "dlock: release on close failed; the lease will expire on the server");
            }
        }
    }
}

impl fmt::Debug for DistributeLockManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DistributeLockManager")
            .field("id", &self.inner.id)
            .field("backend", &self.backend_name())
            .field("config", &self.inner.config)
            .field("held", &self.held_count())
            .finish()
    }
}

/// Builds a [`DistributeLockManager`].
///
/// Defaults: lease 30 s renewed by the watchdog every 10 s, non-fair, no namespace,
/// context `pid=<pid>`, 10 s bound on each backend call beyond the caller's wait.
///
/// # Handler order
///
/// Handlers run in the order they are registered: `with_handler(a).with_handler(b)`
/// gives `Head → a → b → Tail → backend` on the way in, and `b` then `a` see the
/// result on the way out. Put flow control after logging and metrics if rejected calls
/// should still be logged and counted.
pub struct DistributeLockManagerBuilder {
    resource: Arc<dyn LockRemoteResource>,
    handlers: Vec<Arc<dyn LockHandler>>,
    config: Config,
    operation_timeout: Duration,
}

impl DistributeLockManagerBuilder {
    /// A builder over a shared backend.
    pub fn new(resource: Arc<dyn LockRemoteResource>) -> Self {
        DistributeLockManagerBuilder {
            resource,
            handlers: Vec::new(),
            config: Config {
                lease: Duration::from_secs(30),
                watchdog: true,
                fairness: Fairness::NonFair,
                namespace: String::new(),
                context: Bytes::from(format!("pid={}", std::process::id())),
                loss_margin: None,
                max_hold: None,
            },
            operation_timeout: HandlerChain::DEFAULT_OPERATION_TIMEOUT,
        }
    }

    /// Appends a handler to the chain (see the type docs for the order).
    pub fn with_handler<H: LockHandler>(self, handler: H) -> Self {
        self.with_shared_handler(Arc::new(handler))
    }

    /// Appends an already shared handler to the chain.
    pub fn with_shared_handler(mut self, handler: Arc<dyn LockHandler>) -> Self {
        self.handlers.push(handler);
        self
    }

    /// The lease of locks taken without an explicit one; the watchdog renews it every
    /// lease/3 while the lock is held.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = lease;
        self
    }

    /// Whether the watchdog renews locks taken without an explicit lease (default on).
    /// Off: such locks expire after the default lease like explicit-lease locks.
    pub fn watchdog(mut self, enabled: bool) -> Self {
        self.config.watchdog = enabled;
        self
    }

    /// The fairness of locks from [`DistributeLockManager::lock`] and read-write locks.
    pub fn fairness(mut self, fairness: Fairness) -> Self {
        self.config.fairness = fairness;
        self
    }

    /// A prefix put in front of every lock name, so applications sharing a store do
    /// not collide (e.g. `"billing:"`).
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.config.namespace = namespace.into();
        self
    }

    /// Bytes stored with every hold and shown by `inspect` / `dlock status`.
    pub fn context(mut self, context: impl Into<Bytes>) -> Self {
        self.config.context = context.into();
        self
    }

    /// How long before the store may expire a lease-based hold its guard's lost signal
    /// fires (counted from the send time of the last successful acquire or renewal).
    ///
    /// Default: 1 % of the lease (clock-rate drift), raised to the backend's observed
    /// renewal round trip when that is longer. The signal is scheduled 10 ms before
    /// the margin (timer and scheduling delay), and never more than a third of the
    /// lease before its end. A larger margin buys time to stop protected work
    /// before anyone else can be granted the lock; see SAFETY.md for what each
    /// backend guarantees. No effect on session-bound backends (ZooKeeper), whose
    /// holds end with the session.
    pub fn loss_margin(mut self, margin: Duration) -> Self {
        self.config.loss_margin = Some(margin);
        self
    }

    /// The longest any lock or semaphore permit of this manager is held (leaderships
    /// are not bounded): at `max_hold` after it was granted, the watchdog stops
    /// renewing it, its lost signal fires with [`LostReason::MaxHold`] — before the
    /// store's lease runs out — and it is given back. For services whose process may
    /// stay alive but stuck, where a lock must not be held forever. Per acquisition:
    /// [`LockOptions::max_hold`](crate::LockOptions::max_hold). Default: none.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.config.max_hold = Some(max_hold);
        self
    }

    /// The bound on one backend call beyond the caller's wait (default 10 s).
    pub fn operation_timeout(mut self, timeout: Duration) -> Self {
        self.operation_timeout = timeout;
        self
    }

    /// Checks the settings and builds the manager.
    pub fn build(self) -> Result<DistributeLockManager> {
        let lease = self.config.lease;
        if let Some(why) = lease_out_of_range(lease) {
            return Err(Error::new(
                ErrorKind::Config,
                format!("default lease {why} (30 s is usual)"),
            ));
        }
        if let Some(max_hold) = self.config.max_hold {
            crate::lock::check_max_hold(max_hold)
                .map_err(|e| Error::new(ErrorKind::Config, e.message().to_owned()))?;
        }
        if !self.resource.capabilities().lease && !self.config.watchdog {
            return Err(Error::unsupported(format!(
                "the {} backend ties holds to its session, not to a lease: there is no watchdog to turn off; leave watchdog(true)",
                self.resource.backend_name()
            )));
        }
        if self.operation_timeout.is_zero() {
            return Err(Error::new(
                ErrorKind::Config,
                "operation timeout is zero; use a positive bound such as 10 s",
            ));
        }
        if !self.config.namespace.is_empty() {
            LockName::new(&self.config.namespace).map_err(|e| {
                Error::new(
                    ErrorKind::Config,
                    format!("namespace is not a valid name prefix: {}", e.message()),
                )
            })?;
        }
        let chain = HandlerChain::new(self.resource, self.handlers)
            .with_operation_timeout(self.operation_timeout);
        let capabilities = chain.capabilities();
        Ok(DistributeLockManager {
            inner: Arc::new(ManagerInner {
                id: uuid::Uuid::new_v4().simple().to_string(),
                watchdog: Watchdog::new(chain.clone(), self.config.loss_margin),
                chain,
                capabilities,
                config: self.config,
                next_id: AtomicU64::new(1),
                holds: Mutex::new(id_map()),
                closed: watch::Sender::new(false),
            }),
        })
    }
}

impl fmt::Debug for DistributeLockManagerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DistributeLockManagerBuilder")
            .field("backend", &self.resource.backend_name())
            .field("handlers", &self.handlers.len())
            .field("config", &self.config)
            .finish()
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
