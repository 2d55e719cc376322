//! Lock handles: exclusive locks, read-write locks and groups of locks.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use dlock_spi::{
    AcquireContext, AcquireRequest, AcquireResult, Error, Fairness, GrantId, HoldPurpose, LockMode,
    LockName, OwnerId, ReleaseRequest, Result,
};

use crate::guard::LockGuard;
use crate::hold::Hold;
use crate::manager::{DistributeLockManager, ManagerInner};

/// The deadline [`DistributeLock::lock`] gives its one backend wait: in effect no
/// deadline. One wait, one grant, one place in a fair queue for as long as it takes
/// (re-issuing the wait in slices put the waiter back at the tail each time).
const LOCK_WAIT_FOREVER: Duration = Duration::from_secs(365 * 24 * 3600);

pub(crate) struct Handle {
    pub(crate) manager: Arc<ManagerInner>,
    name: std::result::Result<LockName, Error>,
    owner: OwnerId,
    mode: LockMode,
    fairness: Fairness,
    /// What every grant of the handle asks for besides name, owner and mode.
    spec: HoldSpec,
    /// The current hold of this handle (shared by its clones), if any.
    current: Mutex<Option<Arc<Hold>>>,
    /// Serialises remote acquires of this handle's clones, so they re-enter instead
    /// of racing to the backend with the same owner.
    gate: tokio::sync::Mutex<()>,
}

/// What a handle's grants carry beyond name, owner, mode and fairness: a lock's
/// take the manager's context and nothing else; an election's and a semaphore's set
/// the rest.
#[derive(Debug, Clone)]
pub(crate) struct HoldSpec {
    /// Stored with every grant and shown by `inspect` (an election's value).
    pub(crate) context: Bytes,
    /// A lock's or a leadership's grants.
    pub(crate) purpose: HoldPurpose,
    /// A transition window added to every lease (an election's; zero otherwise).
    pub(crate) transition: Duration,
    /// A semaphore's total permits (zero otherwise).
    pub(crate) capacity: u32,
}

impl HoldSpec {
    /// A lock's: the manager's context.
    pub(crate) fn lock(context: Bytes) -> Self {
        HoldSpec {
            context,
            purpose: HoldPurpose::Lock,
            transition: Duration::ZERO,
            capacity: 0,
        }
    }
}

impl Handle {
    pub(crate) fn current(&self) -> MutexGuard<'_, Option<Arc<Hold>>> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A distributed lock on one name, held by one owner.
///
/// Clones are the *same* owner: they share the hold and re-enter it (counted
/// locally, one remote release when the count returns to zero, same fencing token).
/// For mutual exclusion between tasks, give each task its own handle from
/// [`DistributeLockManager::lock`].
///
/// A guard is handed out only while its hold is live: a grant whose answer arrives
/// after its lease less the loss margin (a stalled connection) is given back, and
/// the call asks again while its wait lasts, or answers "not acquired".
#[derive(Clone)]
pub struct DistributeLock {
    handle: Arc<Handle>,
}

impl DistributeLock {
    pub(crate) fn new(
        manager: Arc<ManagerInner>,
        name: Result<LockName>,
        mode: LockMode,
        fairness: Fairness,
    ) -> Self {
        let spec = HoldSpec::lock(manager.config.context.clone());
        Self::with_spec(manager, name, mode, fairness, spec)
    }

    /// A handle whose grants carry `spec`.
    pub(crate) fn with_spec(
        manager: Arc<ManagerInner>,
        name: Result<LockName>,
        mode: LockMode,
        fairness: Fairness,
        spec: HoldSpec,
    ) -> Self {
        let owner = manager.new_owner();
        DistributeLock {
            handle: Arc::new(Handle {
                manager,
                name,
                owner,
                mode,
                fairness,
                spec,
                current: Mutex::new(None),
                gate: tokio::sync::Mutex::new(()),
            }),
        }
    }

    /// The full (namespaced) lock name, or the validation error.
    pub fn name(&self) -> Result<&LockName> {
        self.handle.name.as_ref().map_err(clone_error)
    }

    /// The owner this handle acquires as.
    pub fn owner(&self) -> &OwnerId {
        &self.handle.owner
    }

    /// Exclusive or shared.
    pub fn mode(&self) -> LockMode {
        self.handle.mode
    }

    /// Fair or not.
    pub fn fairness(&self) -> Fairness {
        self.handle.fairness
    }

    /// Whether this handle (or a clone) currently holds the lock and has not lost it.
    pub fn is_held(&self) -> bool {
        self.handle
            .current()
            .as_ref()
            .is_some_and(|h| h.lost_reason().is_none())
    }

    /// Tries to take the lock, waiting up to `wait` (zero: try once). The lock is
    /// renewed by the watchdog until released. `Ok(None)` when it stayed taken.
    pub async fn try_lock(&self, wait: Duration) -> Result<Option<LockGuard>> {
        self.acquire(Some(Instant::now() + wait), None).await
    }

    /// Tries to take the lock for a fixed `lease` that is not renewed: the lock frees
    /// itself when the lease ends and the guard's lost signal fires then.
    pub async fn try_lock_with_lease(
        &self,
        wait: Duration,
        lease: Duration,
    ) -> Result<Option<LockGuard>> {
        self.acquire(Some(Instant::now() + wait), Some(lease)).await
    }

    /// Waits until the lock is taken (renewed by the watchdog), or fails with
    /// `Closed` when the manager closes. Dropping the future cancels the wait and
    /// leaves no waiter behind.
    pub async fn lock(&self) -> Result<LockGuard> {
        self.lock_inner(None).await
    }

    /// Like [`lock`](Self::lock) with a fixed, unrenewed `lease`.
    pub async fn lock_with_lease(&self, lease: Duration) -> Result<LockGuard> {
        self.lock_inner(Some(lease)).await
    }

    async fn lock_inner(&self, lease: Option<Duration>) -> Result<LockGuard> {
        let manager = &self.handle.manager;
        let mut closed = manager.closed_signal();
        loop {
            let deadline = Instant::now() + LOCK_WAIT_FOREVER;
            tokio::select! {
                acquired = self.acquire(Some(deadline), lease) => {
                    if let Some(guard) = acquired? {
                        return Ok(guard);
                    }
                }
                _ = closed.wait_for(|closed| *closed) => return Err(manager.closed_error()),
            }
        }
    }

    /// Re-enters the current hold if there is a live one.
    fn reenter(&self) -> Option<LockGuard> {
        let mut current = self.handle.current();
        match current.as_ref() {
            Some(hold) if hold.lost_reason().is_none() => {
                hold.count.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                Some(LockGuard::new(Arc::clone(&self.handle), Arc::clone(hold)))
            }
            Some(_) => {
                // Lost: forget it; its guards keep reporting the loss.
                *current = None;
                None
            }
            None => None,
        }
    }

    async fn acquire(
        &self,
        deadline: Option<Instant>,
        lease: Option<Duration>,
    ) -> Result<Option<LockGuard>> {
        let manager = &self.handle.manager;
        if manager.is_closed() {
            return Err(manager.closed_error());
        }
        let name = self.name()?.clone();
        if let Some(guard) = self.reenter() {
            return Ok(Some(guard));
        }
        let _gate = match deadline {
            Some(deadline) => {
                match tokio::time::timeout_at(deadline.into(), self.handle.gate.lock()).await {
                    Ok(gate) => gate,
                    Err(_) => return Ok(None),
                }
            }
            None => self.handle.gate.lock().await,
        };
        if let Some(guard) = self.reenter() {
            return Ok(Some(guard));
        }

        if lease.is_some() && !manager.capabilities.lease {
            return Err(Error::unsupported(format!(
                "the {} backend ties holds to its session, not to a lease; take the lock without an explicit lease (it is held until released or the session ends)",
                manager.chain.resource().backend_name()
            ))
            .with_context("lock", &name));
        }
        let renew = lease.is_none() && manager.config.watchdog;
        let spec = &self.handle.spec;
        let transition = spec.transition;
        // The store holds the grant for the holder's own lease plus the window.
        let lease = lease
            .unwrap_or(manager.config.lease)
            .saturating_add(transition);
        loop {
            // A new grant for every attempt: a late release of an earlier grant of
            // this handle (a dropped guard's) cannot touch it.
            let grant = GrantId::new(manager.next_id());
            let request = AcquireRequest::new(name.clone(), self.handle.owner.clone(), grant)
                .with_mode(self.handle.mode)
                .with_lease(lease)
                .with_deadline(deadline)
                .with_fairness(self.handle.fairness)
                .with_context(spec.context.clone())
                .with_purpose(spec.purpose)
                .with_transition(transition)
                .with_capacity(spec.capacity);
            let mut ctx = AcquireContext::new(request, manager.chain.resource().backend_name());
            let sent_at = ctx.started;
            // Dropped while the backend may be granting, the grant is given back.
            let mut in_flight = InFlightAcquire {
                manager,
                release: Some(ctx.request.release_of_grant()),
            };
            let result = manager.chain.acquire(&mut ctx).await;
            // An error leaves the outcome unknown (the store may have granted, and the
            // answer been lost): `in_flight` gives the grant back when dropped.
            if result.is_ok() {
                in_flight.release = None;
            }
            let (token, lease_until, watch) = match result? {
                AcquireResult::Acquired {
                    token,
                    lease_until,
                    watch,
                    ..
                } => (token, lease_until, watch),
                AcquireResult::NotAcquired { .. } => return Ok(None),
            };
            // The lease runs from the granting attempt's send time, which the backend
            // reports; a wait before it does not count.
            let granted_at = lease_until
                .and_then(|until| until.checked_sub(lease))
                .map_or(sent_at, |at| at.clamp(sent_at, Instant::now()));
            // With a transition window, a grant must arrive within the holder's own
            // lease: one that arrives suspended is of no use either.
            if manager.arrived_lost(granted_at, lease.saturating_sub(transition)) {
                // The answer came too late to be of use (a stalled connection): the
                // store may let the grant go any moment. Give it back and, while the
                // wait lasts, ask again.
                manager.abandon(ctx.request.release_of_grant());
                if deadline.is_some_and(|d| Instant::now() < d) {
                    continue;
                }
                return Ok(None);
            }
            let hold = Arc::new(
                Hold::new(
                    manager.next_id(),
                    name,
                    self.handle.owner.clone(),
                    grant,
                    self.handle.mode,
                    token,
                    granted_at,
                )
                .for_purpose(spec.purpose),
            );
            manager.track(&hold, (lease, transition), renew, granted_at, watch);
            if manager.is_closed() {
                // `close` ran while the grant was in flight and may have missed it:
                // registered first, checked second, so one of the two releases it.
                hold.lose(&manager.chain, dlock_spi::LostReason::ManagerClosed);
                let _ = manager.release(&hold).await;
                return Err(manager.closed_error());
            }
            *self.handle.current() = Some(Arc::clone(&hold));
            return Ok(Some(LockGuard::new(Arc::clone(&self.handle), hold)));
        }
    }
}

/// An acquire sent to the chain and not yet answered, or answered with an error.
/// Dropped in that state (the caller's future was cancelled, or the call failed), it
/// gives back the grant the backend may have made.
struct InFlightAcquire<'a> {
    manager: &'a ManagerInner,
    /// The release of the grant asked for; `None` once the backend has granted or
    /// refused (an error keeps it: the grant may have been made).
    release: Option<ReleaseRequest>,
}

impl Drop for InFlightAcquire<'_> {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            self.manager.abandon(release);
        }
    }
}

pub(crate) fn clone_error(err: &Error) -> Error {
    Error::new(err.kind(), err.message().to_owned())
}

impl fmt::Debug for DistributeLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DistributeLock")
            .field("name", &self.handle.name.as_ref().ok())
            .field("owner", &self.handle.owner)
            .field("mode", &self.handle.mode)
            .field("fairness", &self.handle.fairness)
            .field("held", &self.is_held())
            .finish()
    }
}

/// A read-write lock: [`read`](Self::read) holders share the lock, a
/// [`write`](Self::write) holder has it alone. Queued writers are not starved by a
/// stream of readers.
///
/// The two sides are separate owners: a writer cannot take the read side while it
/// holds the write side (no upgrade or downgrade).
#[derive(Clone, Debug)]
pub struct ReadWriteLock {
    read: DistributeLock,
    write: DistributeLock,
}

impl ReadWriteLock {
    pub(crate) fn new(
        manager: Arc<ManagerInner>,
        name: Result<LockName>,
        fairness: Fairness,
    ) -> Self {
        let read_name = name.as_ref().map(Clone::clone).map_err(clone_error);
        ReadWriteLock {
            read: DistributeLock::new(Arc::clone(&manager), read_name, LockMode::Shared, fairness),
            write: DistributeLock::new(manager, name, LockMode::Exclusive, fairness),
        }
    }

    /// The shared side.
    pub fn read(&self) -> &DistributeLock {
        &self.read
    }

    /// The exclusive side.
    pub fn write(&self) -> &DistributeLock {
        &self.write
    }
}

/// Locks whose names share a prefix, e.g. one lock per user id (ylock's `Locks`).
#[derive(Clone, Debug)]
pub struct LockGroup {
    manager: DistributeLockManager,
    prefix: String,
}

impl LockGroup {
    pub(crate) fn new(manager: DistributeLockManager, prefix: &str) -> Self {
        LockGroup {
            manager,
            prefix: format!("{prefix}:"),
        }
    }

    /// The group's name prefix, separator included.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The lock for `key` (named `"<prefix>:<key>"`).
    pub fn lock(&self, key: impl fmt::Display) -> DistributeLock {
        self.manager.lock(&format!("{}{key}", self.prefix))
    }

    /// The fair lock for `key`.
    pub fn fair_lock(&self, key: impl fmt::Display) -> DistributeLock {
        self.manager.fair_lock(&format!("{}{key}", self.prefix))
    }

    /// The read-write lock for `key`.
    pub fn read_write_lock(&self, key: impl fmt::Display) -> ReadWriteLock {
        self.manager
            .read_write_lock(&format!("{}{key}", self.prefix))
    }
}
