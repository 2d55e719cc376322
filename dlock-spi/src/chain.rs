//! The interceptor chain every acquire and release passes through.
//!
//! ```text
//! Head ─► handler 1 ─► handler 2 ─► … ─► Tail ─► LockRemoteResource
//! ```
//!
//! * **Head** (built in) validates and normalises the request against the backend's
//!   [`Capabilities`]: unsupported modes are refused here, never sent.
//! * **Handlers** run in registration order on the way in (and so in reverse order
//!   on the way out). Each gets the context and the rest of the chain; calling
//!   `next.invoke(ctx)` continues, returning without calling it short-circuits
//!   (flow control rejects this way).
//! * **Tail** (built in) calls the backend, bounded by the request's deadline plus
//!   the chain's operation timeout so a silent network cannot hang a caller.
//!
//! When a call fails, [`LockHandler::on_acquire_error`] / [`LockHandler::on_release_error`]
//! run for every handler the call passed through, innermost first.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::capabilities::Capabilities;
use crate::deadline;
use crate::error::{Error, ErrorKind, Result};
use crate::extensions::Extensions;
use crate::name::LockName;
use crate::outcome::{AcquireResult, LockState, ReleaseResult, RenewResult};
use crate::request::{AcquireRequest, ReleaseRequest, RenewRequest};
use crate::resource::LockRemoteResource;
use crate::types::{Fairness, FencingToken, LockMode, LostReason, OwnerId};

/// Runs a handler's notification hook (`name`, for the reader); a panic in it is
/// not passed on — hooks only observe, and one that fails must not stop renewals
/// or the other handlers. The process's panic hook has reported it already.
fn hook(_name: &'static str, call: impl FnOnce()) {
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(call));
}

/// Runs `futures` concurrently on the caller's task; their outputs in order.
async fn join_all<F: std::future::Future>(futures: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut pending: Vec<_> = futures.map(|f| Some(Box::pin(f))).collect();
    let mut outputs: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut done = true;
        for (slot, output) in pending.iter_mut().zip(outputs.iter_mut()) {
            if let Some(fut) = slot {
                match fut.as_mut().poll(cx) {
                    std::task::Poll::Ready(out) => {
                        *output = Some(out);
                        *slot = None;
                    }
                    std::task::Poll::Pending => done = false,
                }
            }
        }
        if done {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

/// A batched renewal's error as the watchdog may act on it: stamped with the
/// backend, the operation and its own lock ([`Error::locate`]), and never of a kind
/// that says the hold is gone — a batch's failure says nothing about one hold's
/// owner (a `NotOwner` answer does), so such kinds become a plain backend error.
fn batch_member_error(err: Error, backend: &str, req: &RenewRequest) -> Error {
    let err = if matches!(err.kind(), ErrorKind::NotOwner | ErrorKind::LockLost) {
        Error::new(ErrorKind::Backend, err.message().to_owned())
            .set_retryable(err.is_retryable())
            .with_source(err)
    } else {
        err
    };
    err.locate(backend, "renew", &req.name)
}

/// The shortest lease a manager, a hold's extension or the CLI accepts: shorter
/// ones end before a renewal could reach the store.
pub const MIN_LEASE: Duration = Duration::from_millis(3);

/// The longest lease the head accepts; longer ones are almost always a unit mistake.
pub const MAX_LEASE: Duration = Duration::from_secs(30 * 24 * 3600);

/// Why `lease` is outside [`MIN_LEASE`]`..=`[`MAX_LEASE`] (`"… is out of range; use
/// between 3ms and 30 days"`), or `None` when it is within: the one check of a
/// manager's lease, a hold's extension and the CLI's `--lease`.
pub fn lease_out_of_range(lease: Duration) -> Option<String> {
    (lease < MIN_LEASE || lease > MAX_LEASE).then(|| {
        format!(
            "{lease:?} is out of range; use between {MIN_LEASE:?} and {} days",
            MAX_LEASE.as_secs() / 86_400
        )
    })
}

/// The most context bytes an acquire may store with its hold: enough to say who
/// holds it and why, small enough for every backend's column, node or value.
pub const MAX_CONTEXT_LEN: usize = 4096;

/// Everything a handler knows about one acquire.
#[derive(Debug)]
#[non_exhaustive]
pub struct AcquireContext {
    /// The request as it will reach the backend.
    pub request: AcquireRequest,
    /// The backend's name (`"redis"`, …), for labels.
    pub backend: &'static str,
    /// When the caller started the acquire (monotonic).
    pub started: Instant,
    /// Data handlers pass to each other.
    pub extensions: Extensions,
}

impl AcquireContext {
    /// A context for `request` started now.
    pub fn new(request: AcquireRequest, backend: &'static str) -> Self {
        AcquireContext {
            request,
            backend,
            started: Instant::now(),
            extensions: Extensions::new(),
        }
    }

    /// The time the caller is willing to wait, from the start (zero for try-once).
    pub fn wait(&self) -> Duration {
        self.request.deadline.map_or(Duration::ZERO, |d| {
            d.saturating_duration_since(self.started)
        })
    }

    /// What `result`, this acquire's, comes to for logs and metrics: the one place
    /// that tells a try-once that found the lock held ([`AcquireOutcome::Busy`]) from
    /// a wait that gave up ([`AcquireOutcome::Timeout`]).
    pub fn outcome(&self, result: &Result<AcquireResult>) -> AcquireOutcome {
        match result {
            Ok(AcquireResult::Acquired { .. }) => AcquireOutcome::Acquired,
            // A try-once that found the lock held did not time out: it never waited.
            Ok(AcquireResult::NotAcquired { .. }) if self.wait().is_zero() => AcquireOutcome::Busy,
            Ok(AcquireResult::NotAcquired { .. }) => AcquireOutcome::Timeout,
            Err(e) => AcquireOutcome::Failed(e.kind()),
        }
    }
}

/// How an acquire ended, as logs and metrics name it ([`AcquireContext::outcome`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AcquireOutcome {
    /// Granted.
    Acquired,
    /// Not granted by a try-once (no wait): the lock was held.
    Busy,
    /// Not granted within the caller's wait.
    Timeout,
    /// An error of this kind.
    Failed(ErrorKind),
}

impl AcquireOutcome {
    /// The label: `acquired`, `busy`, `timeout`, or the error kind's
    /// ([`ErrorKind::as_str`]).
    pub fn as_str(self) -> &'static str {
        match self {
            AcquireOutcome::Acquired => "acquired",
            AcquireOutcome::Busy => "busy",
            AcquireOutcome::Timeout => "timeout",
            AcquireOutcome::Failed(kind) => kind.as_str(),
        }
    }
}

/// Everything a handler knows about one release.
#[derive(Debug)]
#[non_exhaustive]
pub struct ReleaseContext {
    /// The request as it will reach the backend.
    pub request: ReleaseRequest,
    /// The backend's name, for labels.
    pub backend: &'static str,
    /// When the release started (monotonic).
    pub started: Instant,
    /// When the hold began (first acquire of a reentrant hold), if known.
    pub acquired_at: Option<Instant>,
    /// Data handlers pass to each other.
    pub extensions: Extensions,
}

impl ReleaseContext {
    /// A context for `request` started now.
    pub fn new(
        request: ReleaseRequest,
        backend: &'static str,
        acquired_at: Option<Instant>,
    ) -> Self {
        ReleaseContext {
            request,
            backend,
            started: Instant::now(),
            acquired_at,
            extensions: Extensions::new(),
        }
    }
}

/// A renewal the watchdog made, reported to every handler after the fact.
#[derive(Debug)]
#[non_exhaustive]
pub struct RenewEvent<'a> {
    /// The backend's name (`"redis"`, …), for labels.
    pub backend: &'static str,
    /// The renewal sent.
    pub request: &'a RenewRequest,
    /// The backend's answer.
    pub outcome: std::result::Result<&'a RenewResult, &'a Error>,
    /// How long the renewal took.
    pub elapsed: Duration,
}

/// A hold that ended without its owner releasing it, reported to every handler.
#[derive(Debug)]
#[non_exhaustive]
pub struct LostEvent<'a> {
    /// The backend's name (`"redis"`, …), for labels.
    pub backend: &'static str,
    /// The lock.
    pub name: &'a LockName,
    /// The owner that lost it.
    pub owner: &'a OwnerId,
    /// The mode it was held in.
    pub mode: LockMode,
    /// The grant's token.
    pub token: FencingToken,
    /// Why it was lost.
    pub reason: LostReason,
}

impl<'a> LostEvent<'a> {
    /// Describes a hold on `backend` that was lost.
    pub fn new(
        backend: &'static str,
        name: &'a LockName,
        owner: &'a OwnerId,
        mode: LockMode,
        token: FencingToken,
        reason: LostReason,
    ) -> Self {
        LostEvent {
            backend,
            name,
            owner,
            mode,
            token,
            reason,
        }
    }
}

/// An interceptor on the acquire and release paths (logging, metrics, flow control, yours).
///
/// Implement `acquire` and `release`, each ending in `next.invoke(ctx).await` unless
/// the handler means to short-circuit. The observer hooks have empty defaults.
/// A handler that only observes should not allocate on the hot path.
///
/// ```
/// use async_trait::async_trait;
/// use dlock_spi::{AcquireChain, AcquireContext, AcquireResult, LockHandler,
///                 ReleaseChain, ReleaseContext, ReleaseResult, Result};
///
/// /// Counts acquires.
/// #[derive(Default)]
/// struct Counting(std::sync::atomic::AtomicU64);
///
/// #[async_trait]
/// impl LockHandler for Counting {
///     async fn acquire(&self, ctx: &AcquireContext, next: AcquireChain<'_>) -> Result<AcquireResult> {
///         self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
///         next.invoke(ctx).await
///     }
///     async fn release(&self, ctx: &ReleaseContext, next: ReleaseChain<'_>) -> Result<ReleaseResult> {
///         next.invoke(ctx).await
///     }
/// }
/// ```
#[async_trait]
pub trait LockHandler: Send + Sync + 'static {
    /// Intercepts an acquire. Call `next.invoke(ctx)` to continue.
    async fn acquire(&self, ctx: &AcquireContext, next: AcquireChain<'_>) -> Result<AcquireResult>;

    /// Intercepts a release. Call `next.invoke(ctx)` to continue.
    async fn release(&self, ctx: &ReleaseContext, next: ReleaseChain<'_>) -> Result<ReleaseResult>;

    /// Called when an acquire that passed through this handler failed.
    fn on_acquire_error(&self, ctx: &AcquireContext, err: &Error) {
        let _ = (ctx, err);
    }

    /// Called when a release that passed through this handler failed.
    fn on_release_error(&self, ctx: &ReleaseContext, err: &Error) {
        let _ = (ctx, err);
    }

    /// Called after each watchdog renewal (successful or not). A panic here is
    /// contained: the renewal and the other handlers go on.
    fn on_renew(&self, event: &RenewEvent<'_>) {
        let _ = event;
    }

    /// Called when a hold is lost (renewal refused, lease passed, session expired).
    /// A panic here is contained: the other handlers still hear, the watchdog goes on.
    fn on_lost(&self, event: &LostEvent<'_>) {
        let _ = event;
    }
}

/// The rest of the acquire chain, handed to each handler.
pub struct AcquireChain<'a> {
    handlers: &'a [Arc<dyn LockHandler>],
    tail: &'a Tail,
}

impl AcquireChain<'_> {
    /// Runs the remaining handlers and then the backend.
    pub async fn invoke(self, ctx: &AcquireContext) -> Result<AcquireResult> {
        match self.handlers.split_first() {
            Some((handler, rest)) => {
                let next = AcquireChain {
                    handlers: rest,
                    tail: self.tail,
                };
                let result = handler.acquire(ctx, next).await;
                if let Err(err) = &result {
                    handler.on_acquire_error(ctx, err);
                }
                result
            }
            None => self.tail.acquire(&ctx.request).await,
        }
    }
}

impl fmt::Debug for AcquireChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AcquireChain")
            .field("remaining_handlers", &self.handlers.len())
            .finish()
    }
}

/// The rest of the release chain, handed to each handler.
pub struct ReleaseChain<'a> {
    handlers: &'a [Arc<dyn LockHandler>],
    tail: &'a Tail,
}

impl ReleaseChain<'_> {
    /// Runs the remaining handlers and then the backend.
    pub async fn invoke(self, ctx: &ReleaseContext) -> Result<ReleaseResult> {
        match self.handlers.split_first() {
            Some((handler, rest)) => {
                let next = ReleaseChain {
                    handlers: rest,
                    tail: self.tail,
                };
                let result = handler.release(ctx, next).await;
                if let Err(err) = &result {
                    handler.on_release_error(ctx, err);
                }
                result
            }
            None => self.tail.release(&ctx.request).await,
        }
    }
}

impl fmt::Debug for ReleaseChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReleaseChain")
            .field("remaining_handlers", &self.handlers.len())
            .finish()
    }
}

/// The end of the chain: calls the backend, bounded in time.
struct Tail {
    resource: Arc<dyn LockRemoteResource>,
    operation_timeout: Duration,
}

impl Tail {
    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireResult> {
        // The operation timeout past the wait's end, or past now when the wait has
        // none or it has passed (one clock read).
        let now = Instant::now();
        let wait_end = req.deadline.map_or(now, |d| d.max(now));
        let budget = wait_end
            .saturating_duration_since(now)
            .saturating_add(self.operation_timeout);
        let fut = self.resource.try_acquire(req);
        self.bounded_from(now, budget, "acquire", &req.name, fut)
            .await
    }

    async fn release(&self, req: &ReleaseRequest) -> Result<ReleaseResult> {
        self.bounded(
            self.operation_timeout,
            "release",
            &req.name,
            self.resource.release(req),
        )
        .await
    }

    async fn bounded<T>(
        &self,
        budget: Duration,
        op: &'static str,
        name: &LockName,
        fut: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        self.bounded_from(Instant::now(), budget, op, name, fut)
            .await
    }

    /// [`Self::bounded`], the budget counted from `start` (a clock read the caller
    /// made already).
    async fn bounded_from<T>(
        &self,
        start: Instant,
        budget: Duration,
        op: &'static str,
        name: &LockName,
        fut: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        // A budget past the clock's range: no bound but the caller's.
        let result = match start.checked_add(budget) {
            None => fut.await,
            // (No timer per call: one sweeper bounds them all, `crate::deadline`.)
            Some(until) => deadline::within(until, fut)
                .await
                .unwrap_or_else(|| Err(self.timed_out(budget))),
        };
        // Every error stamped here, once: backends only classify theirs.
        result.map_err(|e| e.locate(self.resource.backend_name(), op, name))
    }

    /// The error of a call the backend did not answer within `budget`.
    fn timed_out(&self, budget: Duration) -> Error {
        Error::new(
            ErrorKind::Timeout,
            format!(
                "the {} backend did not answer within {budget:?}; check the server and the network, or raise the operation timeout",
                self.resource.backend_name()
            ),
        )
    }
}

/// Head + handlers + Tail over one backend. Cheap to clone.
///
/// The manager builds one; backends' and plugins' tests can build their own.
#[derive(Clone)]
pub struct HandlerChain {
    handlers: Arc<[Arc<dyn LockHandler>]>,
    tail: Arc<Tail>,
    capabilities: Capabilities,
}

impl HandlerChain {
    /// The default bound on one backend call beyond the caller's wait.
    pub const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(10);

    /// A chain over `resource` with `handlers` in call order (first = outermost).
    pub fn new(resource: Arc<dyn LockRemoteResource>, handlers: Vec<Arc<dyn LockHandler>>) -> Self {
        let capabilities = resource.capabilities();
        HandlerChain {
            handlers: handlers.into(),
            tail: Arc::new(Tail {
                resource,
                operation_timeout: Self::DEFAULT_OPERATION_TIMEOUT,
            }),
            capabilities,
        }
    }

    /// Sets the bound on one backend call beyond the caller's wait.
    pub fn with_operation_timeout(mut self, timeout: Duration) -> Self {
        let resource = Arc::clone(&self.tail.resource);
        self.tail = Arc::new(Tail {
            resource,
            operation_timeout: timeout,
        });
        self
    }

    /// The backend.
    pub fn resource(&self) -> &Arc<dyn LockRemoteResource> {
        &self.tail.resource
    }

    /// The backend's capabilities (read once at construction).
    pub fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    /// The registered handlers, in call order.
    pub fn handlers(&self) -> &[Arc<dyn LockHandler>] {
        &self.handlers
    }

    /// The bound on one backend call beyond the caller's wait.
    pub fn operation_timeout(&self) -> Duration {
        self.tail.operation_timeout
    }

    /// Runs an acquire through Head, the handlers and Tail.
    pub async fn acquire(&self, ctx: &mut AcquireContext) -> Result<AcquireResult> {
        self.head_acquire(&mut ctx.request)?;
        AcquireChain {
            handlers: &self.handlers,
            tail: &self.tail,
        }
        .invoke(ctx)
        .await
    }

    /// Runs a release through Head, the handlers and Tail.
    pub async fn release(&self, ctx: &ReleaseContext) -> Result<ReleaseResult> {
        ReleaseChain {
            handlers: &self.handlers,
            tail: &self.tail,
        }
        .invoke(ctx)
        .await
    }

    /// Renews directly on the backend (the watchdog's path) and reports the outcome
    /// to every handler's [`LockHandler::on_renew`].
    pub async fn renew(&self, req: &RenewRequest) -> Result<RenewResult> {
        let started = Instant::now();
        let result = self
            .tail
            .bounded(
                self.tail.operation_timeout,
                "renew",
                &req.name,
                self.tail.resource.renew(req),
            )
            .await;
        let event = RenewEvent {
            backend: self.tail.resource.backend_name(),
            request: req,
            outcome: result.as_ref(),
            elapsed: started.elapsed(),
        };
        for handler in self.handlers.iter() {
            hook("on_renew", || handler.on_renew(&event));
        }
        result
    }

    /// Whether the backend renews many holds in one call
    /// ([`LockRemoteResource::batch_renew`]).
    pub fn batches_renewals(&self) -> bool {
        self.tail.resource.batch_renew().is_some()
    }

    /// Renews many holds directly on the backend (the watchdog's path): in one call
    /// where the backend offers [`crate::BatchRenew`], else one renewal each,
    /// concurrently. Answers one result per request, in their order, and reports each
    /// to every handler's [`LockHandler::on_renew`], as [`HandlerChain::renew`] does.
    /// A batch not answered within the operation timeout fails each of its requests
    /// with a timeout error; an error is always retryable or not as the backend
    /// said, and never says the hold is gone (only [`RenewResult::NotOwner`] does).
    ///
    /// # Cancel safety
    ///
    /// As [`crate::BatchRenew::renew_batch`]: dropped, each renewal may or may not
    /// have been applied; handlers hear of none of them.
    pub async fn renew_batch(&self, reqs: &[RenewRequest]) -> Vec<Result<RenewResult>> {
        let Some(batch) = self.tail.resource.batch_renew().filter(|_| reqs.len() > 1) else {
            return join_all(reqs.iter().map(|req| self.renew(req))).await;
        };
        let started = Instant::now();
        let backend = self.tail.resource.backend_name();
        let timeout = self.tail.operation_timeout;
        let answers = match tokio::time::timeout(timeout, batch.renew_batch(reqs)).await {
            Ok(answers) if answers.len() == reqs.len() => answers,
            Ok(answers) => {
                let err = Error::backend(format!(
                    "the {backend} backend answered a batch of {} renewals with {} results (a bug in the backend); the renewals count as failed",
                    reqs.len(),
                    answers.len()
                ));
                reqs.iter().map(|_| Err(err.duplicate())).collect()
            }
            Err(_) => reqs
                .iter()
                .map(|_| Err(self.tail.timed_out(timeout)))
                .collect(),
        };
        let elapsed = started.elapsed();
        reqs.iter()
            .zip(answers)
            .map(|(req, result)| {
                let result = result.map_err(|e| batch_member_error(e, backend, req));
                let event = RenewEvent {
                    backend,
                    request: req,
                    outcome: result.as_ref(),
                    elapsed,
                };
                for handler in self.handlers.iter() {
                    hook("on_renew", || handler.on_renew(&event));
                }
                result
            })
            .collect()
    }

    /// Describes a lock's holders and waiters, straight from the backend (no
    /// handlers), bounded by the operation timeout like every backend call.
    pub async fn inspect(&self, name: &LockName) -> Result<Option<LockState>> {
        // A name no acquire could take is refused here too, not answered "free".
        self.capabilities
            .check_name(self.tail.resource.backend_name(), name)?;
        self.tail
            .bounded(
                self.tail.operation_timeout,
                "inspect",
                name,
                self.tail.resource.inspect(name),
            )
            .await
    }

    /// Reports a lost hold to every handler's [`LockHandler::on_lost`]. A hook that
    /// panics is logged and skipped: the others still hear, and the caller (the
    /// manager's watchdog) goes on.
    pub fn notify_lost(&self, event: &LostEvent<'_>) {
        for handler in self.handlers.iter() {
            hook("on_lost", || handler.on_lost(event));
        }
    }

    /// Head: validates and normalises a request against the backend's capabilities.
    fn head_acquire(&self, req: &mut AcquireRequest) -> Result<()> {
        let caps = &self.capabilities;
        let backend = self.tail.resource.backend_name();
        caps.check_name(backend, &req.name)?;
        if req.mode == LockMode::Shared && !caps.shared {
            return Err(Error::unsupported(format!(
                "the {backend} backend has no shared (read) mode; use an exclusive lock or a backend that supports read-write locks"
            ))
            .with_context("lock", &req.name));
        }
        if req.alongside.is_some() {
            if !caps.cross_mode {
                return Err(Error::unsupported(format!(
                    "the {backend} backend cannot let one owner hold a lock in both modes (a writer reading, a downgrade or an upgrade); use separate read and write acquisitions"
                ))
                .with_context("lock", &req.name));
            }
            if req.mode == LockMode::Exclusive && !caps.upgrade {
                return Err(Error::unsupported(format!(
                    "the {backend} backend cannot upgrade a read in place (a write beside the owner's own read); release the read, then take the write side"
                ))
                .with_context("lock", &req.name));
            }
            if req.mode.permits().is_some() {
                return Err(Error::invalid_argument(
                    "a permit request cannot be made alongside another hold; only read and write requests can",
                )
                .with_context("lock", &req.name));
            }
        }
        if let LockMode::Permits(n) = req.mode {
            if !caps.semaphore {
                return Err(Error::no_semaphores(backend).with_context("lock", &req.name));
            }
            if n == 0 || n > req.capacity {
                return Err(Error::invalid_argument(format!(
                    "asked for {n} permit(s) of a semaphore of {}; ask for 1 to {} permits",
                    req.capacity, req.capacity
                ))
                .with_context("lock", &req.name));
            }
        }
        if req.fairness == Fairness::Fair && !caps.fair {
            return Err(Error::unsupported(format!(
                "the {backend} backend cannot grant in arrival order; use non-fair mode or a backend with fair locks"
            ))
            .with_context("lock", &req.name));
        }
        if req.lease < Duration::from_millis(1) || req.lease > MAX_LEASE {
            return Err(Error::invalid_argument(format!(
                "lease {:?} is out of range; use between 1 ms and {} days",
                req.lease,
                MAX_LEASE.as_secs() / 86_400
            ))
            .with_context("lock", &req.name));
        }
        if req.context.len() > MAX_CONTEXT_LEN {
            return Err(Error::invalid_argument(format!(
                "the holder context is {} bytes; store at most {} (who holds it and why, not a payload)",
                req.context.len(),
                MAX_CONTEXT_LEN
            ))
            .with_context("lock", &req.name));
        }
        if req.transition >= req.lease {
            return Err(Error::invalid_argument(format!(
                "transition window {:?} is not shorter than the lease {:?}; the lease must cover the holder's own time plus the window",
                req.transition, req.lease
            ))
            .with_context("lock", &req.name));
        }
        // A deadline already in the past means "try once".
        if req.deadline.is_some_and(|d| d <= Instant::now()) {
            req.deadline = None;
        }
        Ok(())
    }
}

impl fmt::Debug for HandlerChain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerChain")
            .field("backend", &self.tail.resource.backend_name())
            .field("handlers", &self.handlers.len())
            .field("operation_timeout", &self.tail.operation_timeout)
            .finish()
    }
}
