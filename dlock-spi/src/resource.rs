//! The backend contract.

use async_trait::async_trait;

use crate::capabilities::Capabilities;
use crate::error::Result;
use crate::events::LockEvents;
use crate::name::LockName;
use crate::outcome::{AcquireResult, LockState, ReleaseResult, RenewResult};
use crate::request::{AcquireRequest, ReleaseRequest, RenewRequest};

/// A store that holds locks: Redis, a SQL database, ZooKeeper, memory, yours.
///
/// Implement every method; there are no defaults to forget. Used as
/// `Arc<dyn LockRemoteResource>`, shared by all locks of a manager and called
/// concurrently.
///
/// # What each method must honour
///
/// Every hold belongs to one *grant*, `(req.owner, req.grant)` ([`crate::GrantId`];
/// store it as a [`crate::HolderKey`]). Releases and renewals name the grant, and
/// must never affect another grant — not even a later one of the same owner: a
/// dropped guard's late background release must leave the same handle's next grant
/// alone.
///
/// * **`try_acquire`** grants `req.mode` to `req.owner` if the lock is free for it,
///   otherwise waits — by the backend's best means (push, watch, polling with
///   [`crate::Backoff`]) — until `req.deadline`, and answers
///   [`AcquireResult::NotAcquired`] when it passes (`deadline: None` = try once).
///   Contention is never an error. Every grant carries a fencing token strictly
///   greater than every token issued for the name before, by any client, and a
///   lease judged on the store's clock. If the caller's future is dropped while
///   waiting, no waiter or queue entry may be left behind (clean up in `Drop`, or
///   make queue entries expire). If it is dropped after the request may have been
///   granted, the manager sends a release of that grant (harmless if it was never
///   made); the backend must make sure that release cannot overtake the grant. That
///   holds by itself where one client's requests are applied in order (one
///   multiplexed connection, one session); a backend that spreads requests over a
///   pool must release a grant made for a caller that is gone itself (as the SQL
///   backend does, after the statement). An acquire naming the grant that holds the lock
///   (a retry whose answer was lost) grants again with the same token (idempotent) if
///   [`Capabilities::reentrant`] is set; an acquire by the same owner under another
///   grant is a different holder and waits like anyone else.
///   Backends whose holds are tied to a session rather than a lease (no
///   [`Capabilities::lease`]) attach a [`crate::HoldWatch`] to the grant
///   ([`AcquireResult::with_watch`]) so the guard learns of suspension and loss.
///   Honour [`crate::Fairness::Fair`] when [`Capabilities::fair`] is set, and
///   [`crate::LockMode::Shared`] when [`Capabilities::shared`] is set (the chain's head
///   rejects them otherwise). When the lock frees, wake one waiter, not all.
/// * **`release`** removes only the hold of grant `req.grant` of `req.owner`, and answers
///   [`ReleaseResult::NotOwner`] (changing nothing) if it is not the holder. After
///   the last holder leaves, no holder or queue state may remain; a small per-name
///   fencing counter may.
/// * **`renew`** extends that grant's lease to `req.lease` from now (store clock), or
///   answers [`RenewResult::NotOwner`] if the hold is gone. When `req.context` is
///   set, it also replaces the context stored with the hold, in the same atomic step
///   as the ownership check (a leader proclaiming a new value: `inspect` shows it
///   from then on). Session-bound backends renew nothing but still check the hold
///   and store the context.
/// * **`inspect`** describes holders and waiters, or `None` when nobody holds or waits.
///   It sees every change the store committed before the call, whichever client
///   made it (a backend that reads from a replica which may lag brings it up to
///   date first).
///
/// Map driver errors to [`crate::Error`] in one place, with
/// [`crate::ErrorKind::Backend`] (retryable) for connection trouble.
#[async_trait]
pub trait LockRemoteResource: Send + Sync + 'static {
    /// A short stable name for logs and metrics labels: `"memory"`, `"redis"`, …
    fn backend_name(&self) -> &'static str;

    /// What this backend supports.
    fn capabilities(&self) -> Capabilities;

    /// Takes the lock, waiting until `req.deadline` by the backend's best means.
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<AcquireResult>;

    /// Gives the owner's hold back.
    async fn release(&self, req: &ReleaseRequest) -> Result<ReleaseResult>;

    /// Extends the owner's lease.
    async fn renew(&self, req: &RenewRequest) -> Result<RenewResult>;

    /// Describes the lock's holders and waiters; `None` when it is free and unwanted.
    async fn inspect(&self, name: &LockName) -> Result<Option<LockState>>;

    /// Operator actions (force-unlock, counting live locks), when the backend offers
    /// them; `None` otherwise. Used by `dlock unlock --force` and the test suite.
    fn admin(&self) -> Option<&dyn LockAdmin>;

    /// Change feeds, when the backend can push changes of a lock's holders to
    /// observers (leader election followers); `None`: observers poll `inspect`.
    fn events(&self) -> Option<&dyn LockEvents>;

    /// Renewing many holds in one call to the store, when the backend can; `None`:
    /// the manager's watchdog sends one `renew` per hold (concurrently).
    fn batch_renew(&self) -> Option<&dyn BatchRenew>;
}

/// Renews many holds in one call to the store — an optional ability
/// ([`LockRemoteResource::batch_renew`]). The manager's watchdog sends the renewals
/// due together (and those due soon after, early) as one batch, so holding many locks
/// costs the store one call per renewal period instead of one per lock.
#[async_trait]
pub trait BatchRenew: Send + Sync {
    /// Renews each request of `reqs` exactly as [`LockRemoteResource::renew`] would,
    /// and answers one result per request, in their order.
    ///
    /// The backend sends as few calls as it can (one for a Redis node); a request it
    /// cannot fold into the batch (one carrying a context, or a hold it must treat
    /// specially) it renews on its own, at the same time. An error answers only its
    /// own requests: each may or may not have been applied, as with a failed
    /// `renew`. `reqs` may be empty.
    ///
    /// # Cancel safety
    ///
    /// Dropped before it answers, each renewal may or may not have been applied, as
    /// with a dropped `renew`; nothing else is left behind.
    async fn renew_batch(&self, reqs: &[RenewRequest]) -> Vec<Result<RenewResult>>;
}

/// Operator actions on a backend's lock state, outside the owner protocol.
#[async_trait]
pub trait LockAdmin: Send + Sync {
    /// Removes every hold (exclusive and shared) and waiter mark of `name` behind the
    /// holders' backs; their next renewal finds them not owners. The fencing counter
    /// is kept. Returns how many holds were removed.
    async fn force_release(&self, name: &LockName) -> Result<usize>;

    /// How many locks whose names start with `prefix` have live holder or waiter state
    /// (expired holds and fencing counters are not counted).
    async fn live_locks(&self, prefix: &str) -> Result<usize>;
}

/// What a manager is built over: a backend value (shared from then on), or one
/// shared already — the `Arc<dyn LockRemoteResource>` a URL opens to. So
/// `DistributeLockManager::builder` takes either, and there is one way to build.
///
/// ```
/// use std::sync::Arc;
/// use dlock_spi::{InMemoryBackend, IntoResource, LockRemoteResource};
///
/// let mine: Arc<dyn LockRemoteResource> = InMemoryBackend::new().into_resource();
/// let same = Arc::clone(&mine).into_resource(); // shared already: the same backend
/// assert!(Arc::ptr_eq(&mine, &same));
/// ```
pub trait IntoResource {
    /// The backend, shared.
    fn into_resource(self) -> std::sync::Arc<dyn LockRemoteResource>;
}

impl<R: LockRemoteResource> IntoResource for R {
    fn into_resource(self) -> std::sync::Arc<dyn LockRemoteResource> {
        std::sync::Arc::new(self)
    }
}

impl IntoResource for std::sync::Arc<dyn LockRemoteResource> {
    fn into_resource(self) -> std::sync::Arc<dyn LockRemoteResource> {
        self
    }
}
