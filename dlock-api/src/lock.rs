//! Lock handles: one name, one owner, one mode.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use dlock_spi::{
    AcquireContext, AcquireRequest, AcquireResult, Error, Fairness, GrantId, HoldPurpose, LockMode,
    LockName, OwnerId, ReleaseRequest, RenewRequest, RenewResult, Result,
};

use crate::guard::{check_lost, Acquisition, LockGuard};
use crate::handle::{live, Handle, HoldSpec, Place, Side};
use crate::hold::Hold;
use crate::inner::ManagerInner;
pub(crate) use crate::options::check_max_hold;
use crate::options::LockOptions;
use crate::watchdog::Watch;

/// The deadline [`DistributeLock::lock`] gives its one backend wait: in effect no
/// deadline. One wait, one grant, one place in a fair queue for as long as it takes
/// (re-issuing the wait in slices put the waiter back at the tail each time).
const LOCK_WAIT_FOREVER: Duration = Duration::from_secs(365 * 24 * 3600);

/// Completes when a side of the family was granted since the receiver last looked;
/// never without a family (or once it is gone).
async fn side_granted(changes: Option<&mut tokio::sync::watch::Receiver<u64>>) -> Option<()> {
    match changes {
        Some(rx) => rx.changed().await.ok(),
        None => std::future::pending().await,
    }
}

/// A distributed lock on one name, held by one owner.
///
/// Clones are the *same* owner: they share the hold and re-enter it (counted
/// locally, one remote release when the count returns to zero, same fencing token).
/// For mutual exclusion between tasks, give each task its own handle from
/// [`DistributeLockManager::lock`](crate::DistributeLockManager::lock).
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
        let spec = HoldSpec::lock(&manager.config);
        Self::with_spec(manager, name, mode, fairness, spec)
    }

    /// A handle at `place` (its owner, slot and side) whose grants carry `spec`.
    pub(crate) fn with_place(
        manager: Arc<ManagerInner>,
        name: Result<LockName>,
        mode: LockMode,
        fairness: Fairness,
        spec: HoldSpec,
        place: Place,
    ) -> Self {
        let Place {
            owner,
            current,
            side,
            family,
        } = place;
        DistributeLock {
            handle: Arc::new(Handle {
                manager,
                name,
                owner,
                mode,
                fairness,
                spec,
                current,
                side,
                family,
                gate: tokio::sync::Mutex::new(()),
            }),
        }
    }

    /// The handle of `handle` (another value of the same owner and hold).
    pub(crate) fn of_handle(handle: Arc<Handle>) -> Self {
        DistributeLock { handle }
    }

    /// The handle's shared state.
    pub(crate) fn handle(&self) -> &Arc<Handle> {
        &self.handle
    }

    /// A handle whose grants carry `spec`.
    pub(crate) fn with_spec(
        manager: Arc<ManagerInner>,
        name: Result<LockName>,
        mode: LockMode,
        fairness: Fairness,
        spec: HoldSpec,
    ) -> Self {
        let place = Place {
            owner: manager.new_owner(),
            current: Arc::new(Mutex::new(None)),
            side: Side::Alone,
            family: None,
        };
        Self::with_place(manager, name, mode, fairness, spec, place)
    }

    /// The full (namespaced) lock name, or the validation error.
    pub fn name(&self) -> Result<&LockName> {
        self.handle.name.as_ref().map_err(Error::duplicate)
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

    /// Whether nothing but this value refers to the handle: no clone, no guard.
    pub(crate) fn is_unshared(&self) -> bool {
        Arc::strong_count(&self.handle) == 1
    }

    /// Whether this handle (or a clone) currently holds the lock and has not lost it.
    pub fn is_held(&self) -> bool {
        live(&self.handle.current).is_some()
    }

    /// Tries to take the lock, waiting up to `wait` (zero: try once). The lock is
    /// renewed by the watchdog until released. `Ok(None)` when it stayed taken.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped while waiting, it leaves no waiter behind; dropped after
    /// the backend may have granted, the grant is given back in the background.
    pub async fn try_lock(&self, wait: Duration) -> Result<Option<LockGuard>> {
        self.acquire(Some(Instant::now() + wait), &LockOptions::new())
            .await
    }

    /// Like [`try_lock`](Self::try_lock), with this acquisition's own options (a
    /// fixed lease, a `max_hold` bound, the holder context to store).
    ///
    /// # Cancel safety
    ///
    /// As [`try_lock`](Self::try_lock).
    pub async fn try_lock_with(
        &self,
        wait: Duration,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>> {
        self.acquire(Some(Instant::now() + wait), options).await
    }

    /// Waits until the lock is taken (renewed by the watchdog), or fails with
    /// `Closed` when the manager closes.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future cancels the wait and leaves no waiter
    /// behind; a grant the backend may have made meanwhile is given back.
    pub async fn lock(&self) -> Result<LockGuard> {
        self.lock_with(&LockOptions::new()).await
    }

    /// Like [`lock`](Self::lock), with this acquisition's own options.
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](Self::lock).
    pub async fn lock_with(&self, options: &LockOptions) -> Result<LockGuard> {
        let manager = &self.handle.manager;
        let mut closed = manager.closed_signal();
        loop {
            let deadline = Instant::now() + LOCK_WAIT_FOREVER;
            tokio::select! {
                acquired = self.acquire(Some(deadline), options) => {
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
                Some(LockGuard::new(
                    Arc::clone(&self.handle),
                    Arc::clone(hold),
                    Acquisition::Reentered,
                ))
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
        options: &LockOptions,
    ) -> Result<Option<LockGuard>> {
        let manager = &self.handle.manager;
        if manager.is_closed() {
            return Err(manager.closed_error());
        }
        let name = self.name()?.clone();
        let spec = &self.handle.spec;
        let max_hold = options.max_hold.or(spec.max_hold);
        if let Some(max_hold) = max_hold {
            check_max_hold(max_hold).map_err(|e| e.with_context("lock", &name))?;
        }
        if let Some(guard) = self.reenter() {
            return Ok(Some(guard));
        }
        // A free gate is taken at once, without arming a timer (the common case).
        let _gate = match (self.handle.gate.try_lock(), deadline) {
            (Ok(gate), _) => gate,
            (Err(_), Some(deadline)) => {
                match tokio::time::timeout_at(deadline.into(), self.handle.gate.lock()).await {
                    Ok(gate) => gate,
                    Err(_) => return Ok(None),
                }
            }
            (Err(_), None) => self.handle.gate.lock().await,
        };
        if let Some(guard) = self.reenter() {
            return Ok(Some(guard));
        }
        if options.lease.is_some() && !manager.capabilities.lease {
            return Err(Error::unsupported(format!(
                "the {} backend ties holds to its session, not to a lease; take the lock without an explicit lease (it is held until released or the session ends)",
                manager.chain.resource().backend_name()
            ))
            .with_context("lock", &name));
        }
        // The store holds the grant for the holder's own lease plus the window.
        let plan = Plan {
            lease: options
                .lease
                .unwrap_or(manager.config.lease)
                .saturating_add(spec.transition),
            renew: options.lease.is_none() && manager.config.watchdog,
            context: options.context.as_ref().unwrap_or(&spec.context),
            max_hold,
            deadline,
            name,
        };
        loop {
            if let Attempt::Done(guard) = self.attempt(&plan).await? {
                return Ok(guard);
            }
        }
    }

    /// One request for a new grant, and what became of it: a guard, a refusal, or
    /// ask again (another side of the owner granted meanwhile, or a grant given
    /// back: too late to be of use, unconfirmed, or an upgrade whose read is gone).
    ///
    /// # Cancel safety
    ///
    /// Dropped while the backend may be granting, the grant is given back.
    async fn attempt(&self, plan: &Plan<'_>) -> Result<Attempt> {
        let manager = &self.handle.manager;
        let (spec, name) = (&self.handle.spec, &plan.name);
        // A new grant for every attempt: a late release of an earlier grant of this
        // handle (a dropped guard's) cannot touch it.
        let grant = GrantId::new(manager.next_id());
        // Heard before the owner's other holds are read: a grant of another side
        // after this read is not missed.
        let mut changes = self.handle.family.as_ref().map(|f| f.subscribe());
        let alongside = self.handle.alongside(name)?;
        let request = AcquireRequest::new(name.clone(), self.handle.owner.clone(), grant)
            .with_mode(self.handle.mode)
            .with_lease(plan.lease)
            .with_deadline(plan.deadline)
            .with_fairness(self.handle.fairness)
            .with_context(plan.context.clone())
            .with_purpose(spec.purpose)
            .with_transition(spec.transition)
            .with_capacity(spec.capacity)
            .with_alongside(alongside);
        let mut ctx = AcquireContext::new(request, manager.chain.resource().backend_name());
        let sent_at = ctx.started;
        // Dropped while the backend may be granting, the grant is given back.
        let mut in_flight = InFlightAcquire {
            manager,
            grant: Some(AskedGrant {
                name,
                owner: &self.handle.owner,
                grant,
                mode: self.handle.mode,
                purpose: spec.purpose,
            }),
        };
        let result = {
            let acquire = manager.chain.acquire(&mut ctx);
            tokio::pin!(acquire);
            loop {
                tokio::select! {
                    result = &mut acquire => break Some(result),
                    // Another side of the owner was granted meanwhile: a request
                    // queued behind that hold (made before it was granted) asks
                    // again beside it, or it would wait for its own owner.
                    Some(()) = side_granted(changes.as_mut()) => {
                        // (A refusal now — a write beside a plain read — is given
                        // by asking again.)
                        match self.handle.alongside(name) {
                            Ok(now) if now == alongside => {}
                            _ => break None,
                        }
                    }
                }
            }
        };
        // Asked again: the request in flight is given back by `in_flight`.
        let Some(result) = result else {
            return Ok(Attempt::Again);
        };
        // An error leaves the outcome unknown (the store may have granted, and the
        // answer been lost): `in_flight` gives the grant back when dropped. A grant
        // stays in its care until the manager tracks it: cut short before, at the
        // confirming renewal, the grant is given back too.
        let granted = match result? {
            AcquireResult::Acquired {
                token,
                lease_until,
                watch,
                took_over,
                ..
            } => Granted {
                grant,
                token,
                sent_at,
                lease_until,
                watch,
                took_over,
                alongside,
            },
            AcquireResult::NotAcquired { .. } => {
                in_flight.grant = None;
                return Ok(Attempt::Done(None));
            }
        };
        self.keep(plan, granted, &mut in_flight).await
    }

    /// Keeps a grant the backend made: dates its lease (confirming a provisional
    /// one a release handed over when the watchdog would not extend it at once),
    /// gives it back when it arrived too late or an upgrade's read is gone, and
    /// otherwise hands it to the manager and the caller.
    async fn keep(
        &self,
        plan: &Plan<'_>,
        g: Granted,
        in_flight: &mut InFlightAcquire<'_>,
    ) -> Result<Attempt> {
        let manager = &self.handle.manager;
        let transition = self.handle.spec.transition;
        // The lease runs from the granting attempt's send time, which the backend
        // reports as the lease's end; a wait before it does not count. A grant a
        // release handed over has a provisional lease that may end sooner than
        // `lease` after this call began: the watchdog counts it as granted `lease`
        // before its end, and renews it a third into what is left (its first
        // renewal extends it); the hold itself dates from the call.
        let counted_from = g.lease_until.map(|until| until.checked_sub(plan.lease));
        let mut granted_at = match counted_from {
            Some(Some(at)) => at.min(Instant::now()),
            _ => g.sent_at,
        };
        // A provisional lease the watchdog would not extend at once as a plain
        // renewal — a fixed lease (no renewals), a `max_hold` cap, a transition
        // window — or one with less left than the loss margin is extended here,
        // before the guard exists.
        if granted_at < g.sent_at
            && (!plan.renew
                || plan.max_hold.is_some()
                || !transition.is_zero()
                || manager.arrived_lost(granted_at, plan.lease))
        {
            match self.confirm(plan, &g).await {
                Some(confirmed) => granted_at = confirmed,
                None => return Ok(give_back(in_flight, plan.deadline)),
            }
        }
        let acquired_at = granted_at.clamp(g.sent_at, Instant::now());
        // With a transition window, a grant must arrive within the holder's own
        // lease: one that arrives suspended is of no use either. (A lease end too
        // close to this clock's origin to count a lease back from counts as lost.)
        if counted_from == Some(None)
            || manager.arrived_lost(granted_at, plan.lease.saturating_sub(transition))
        {
            // The answer came too late to be of use (a stalled connection): the store
            // may let the grant go any moment. Give it back and, while the wait
            // lasts, ask again.
            return Ok(give_back(in_flight, plan.deadline));
        }
        let hold = Arc::new(
            Hold::new(
                manager.next_id(),
                plan.name.clone(),
                self.handle.owner.clone(),
                g.grant,
                self.handle.mode,
                g.token,
                acquired_at,
            )
            .for_purpose(self.handle.spec.purpose),
        );
        let watching = Watch {
            lease: Some(plan.lease),
            transition,
            renew: plan.renew,
            sent_at: granted_at,
            cap: plan.max_hold.map(|d| acquired_at + d),
            // Still on the provisional lease a release handed over (not confirmed
            // above).
            provisional: granted_at < g.sent_at,
        };
        // An upgrade keeps its owner's read until it is released itself. That read
        // gone meanwhile, the grant stands on nothing (on ZooKeeper the writers
        // queued behind the read may hold): give it back, ask again.
        if let (Some(_), LockMode::Exclusive, Side::Write { read, .. }) =
            (g.alongside, self.handle.mode, &self.handle.side)
        {
            match DistributeLock::of_handle(Arc::clone(read)).reenter() {
                Some(read) => hold.keep(&Arc::clone(read.hold()), read, &manager.chain),
                None => return Ok(give_back(in_flight, plan.deadline)),
            }
        }
        // Tracked from here on: the manager releases it (guard, close, loss).
        in_flight.grant = None;
        manager.track(&hold, watching, g.watch);
        if manager.is_closed() {
            // `close` ran while the grant was in flight and may have missed it:
            // registered first, checked second, so one of the two releases it.
            hold.lose(&manager.chain, dlock_spi::LostReason::ManagerClosed);
            let _ = manager.release(&hold).await;
            return Err(manager.closed_error());
        }
        *self.handle.current() = Some(Arc::clone(&hold));
        if let Some(family) = &self.handle.family {
            family.send_modify(|n| *n = n.wrapping_add(1));
        }
        let acquisition = if g.took_over {
            Acquisition::TookOver
        } else {
            Acquisition::New
        };
        Ok(Attempt::Done(Some(LockGuard::new(
            Arc::clone(&self.handle),
            hold,
            acquisition,
        ))))
    }

    /// Extends a provisional lease a release handed over with a renewal sent now;
    /// the instant it was sent once it renewed, `None` if it did not.
    async fn confirm(&self, plan: &Plan<'_>, g: &Granted) -> Option<Instant> {
        let confirm_sent = Instant::now();
        let confirm = RenewRequest::new(
            plan.name.clone(),
            self.handle.owner.clone(),
            g.grant,
            self.handle.mode,
            plan.lease,
            g.token,
        )
        .with_transition(self.handle.spec.transition);
        match self.handle.manager.chain.renew(&confirm).await {
            Ok(RenewResult::Renewed { .. }) => Some(confirm_sent),
            _ => None,
        }
    }
}

/// What one acquire call asks for, the same for each of its attempts.
struct Plan<'a> {
    name: LockName,
    /// The lease the store holds a grant for (the holder's own plus the window).
    lease: Duration,
    /// Whether the watchdog renews the hold (no explicit lease).
    renew: bool,
    context: &'a Bytes,
    max_hold: Option<Duration>,
    deadline: Option<Instant>,
}

/// What became of one attempt.
enum Attempt {
    /// The call's answer: a guard, or not granted.
    Done(Option<LockGuard>),
    /// Ask again.
    Again,
}

/// What the backend granted one attempt.
struct Granted {
    grant: GrantId,
    token: dlock_spi::FencingToken,
    /// When the attempt was sent.
    sent_at: Instant,
    lease_until: Option<Instant>,
    watch: Option<dlock_spi::HoldWatch>,
    took_over: bool,
    /// The owner's hold in the other mode the request went beside.
    alongside: Option<GrantId>,
}

/// Gives an unusable grant back; asks again while the wait lasts, else answers
/// not granted.
fn give_back(in_flight: &mut InFlightAcquire<'_>, deadline: Option<Instant>) -> Attempt {
    in_flight.give_back();
    if deadline.is_some_and(|d| Instant::now() < d) {
        Attempt::Again
    } else {
        Attempt::Done(None)
    }
}

/// A write guard becomes a read guard through its lock's read side (here, beside
/// the lock calls it makes).
impl LockGuard {
    /// Turns a read-write lock's write guard into a read guard without letting
    /// another writer in: takes the read side beside the write hold (granted at
    /// once), then lets this guard go (the write side is released once its last
    /// guard is). A reentered write hold stays until its other guards go too.
    ///
    /// Errors: [`ErrorKind::InvalidArgument`](dlock_spi::ErrorKind::InvalidArgument) for a guard that is not a read-write
    /// lock's write side; [`ErrorKind::LockLost`](dlock_spi::ErrorKind::LockLost) when the write hold is lost (it is
    /// let go, and nothing is held); the backend's errors (the write guard is let go
    /// as well: nothing is held).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before the read side is granted, nothing is held (the
    /// write guard is dropped with the future, a grant in flight given back).
    pub async fn downgrade(self) -> Result<LockGuard> {
        let Side::Write { read, .. } = self.handle.side() else {
            return Err(Error::invalid_argument(
                "only a read-write lock's write guard can be downgraded; this guard is a plain lock's or a read guard",
            )
            .with_context("lock", &self.hold.name));
        };
        check_lost(&self.hold)?;
        let reader = DistributeLock::of_handle(Arc::clone(read));
        let read = reader.lock().await?;
        drop(self);
        Ok(read)
    }
}

/// An acquire sent to the chain and not yet answered, or answered with an error.
/// Dropped in that state (the caller's future was cancelled, or the call failed), it
/// gives back the grant the backend may have made.
struct InFlightAcquire<'a> {
    manager: &'a ManagerInner,
    /// The grant asked for; `None` once the backend has refused or the manager
    /// tracks the grant (an error keeps it: the grant may have been made).
    grant: Option<AskedGrant<'a>>,
}

/// What the release of an asked-for grant names (built only when one is given back:
/// not on every acquire).
struct AskedGrant<'a> {
    name: &'a LockName,
    owner: &'a OwnerId,
    grant: GrantId,
    mode: LockMode,
    purpose: HoldPurpose,
}

impl InFlightAcquire<'_> {
    /// Gives the grant back now (in the background), if it is still in its care.
    fn give_back(&mut self) {
        if let Some(g) = self.grant.take() {
            let release =
                ReleaseRequest::of_grant(g.name, g.owner, g.grant, g.mode).with_purpose(g.purpose);
            self.manager.abandon(release);
        }
    }
}

impl Drop for InFlightAcquire<'_> {
    fn drop(&mut self) {
        self.give_back();
    }
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

/// The manager's constructor of this primitive.
impl crate::DistributeLockManager {
    /// A lock handle for `name` (prefixed with the manager's namespace). Each call gives
    /// a new owner: two handles for the same name exclude each other, while a handle and
    /// its clones share ownership and re-enter. An invalid name is reported by the first
    /// operation on the handle as [`ErrorKind::InvalidName`](dlock_spi::ErrorKind::InvalidName).
    pub fn lock(&self, name: impl std::fmt::Display) -> DistributeLock {
        DistributeLock::new(
            Arc::clone(&self.inner),
            self.inner.full_name(name),
            LockMode::Exclusive,
            Fairness::NonFair,
        )
    }

    /// Like [`lock`](Self::lock) but granted in arrival order (needs a backend with fair locks).
    pub fn fair_lock(&self, name: impl std::fmt::Display) -> DistributeLock {
        DistributeLock::new(
            Arc::clone(&self.inner),
            self.inner.full_name(name),
            LockMode::Exclusive,
            Fairness::Fair,
        )
    }
}
