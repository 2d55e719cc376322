//! What the manager asks a backend to do.
//!
//! The structs are `#[non_exhaustive]` so fields can be added without breaking
//! backends: build them with `new` and the `with_*` methods, read the public fields.

use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::name::LockName;
use crate::types::{Fairness, FencingToken, GrantId, HoldPurpose, HolderKey, LockMode, OwnerId};

/// A request to take a lock.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AcquireRequest {
    /// The lock.
    pub name: LockName,
    /// Who asks; the same owner must be presented on release and renewal.
    pub owner: OwnerId,
    /// Which acquisition of the owner this is: new for every acquire call, kept by
    /// its retries. The grant, if made, belongs to `(owner, grant)` — see [`GrantId`].
    pub grant: GrantId,
    /// Exclusive or shared.
    pub mode: LockMode,
    /// How long the grant lasts unless renewed. Backends judge it on their own clock.
    pub lease: Duration,
    /// Until when the backend may wait for the lock (by its best means: push, watch,
    /// polling). `None`: try once and answer.
    pub deadline: Option<Instant>,
    /// Arrival-order granting or not.
    pub fairness: Fairness,
    /// Opaque bytes stored with the holder and shown by `inspect` (who holds it; a
    /// leader's value).
    pub context: Bytes,
    /// What the hold is for; backends may lay leadership terms out differently
    /// (same semantics).
    pub purpose: HoldPurpose,
    /// For [`LockMode::Permits`]: the semaphore's total permits. Every holder and
    /// waiter of one semaphore must name the same total; a request naming another
    /// while the semaphore has holders or waiters is refused with
    /// [`crate::ErrorKind::InvalidArgument`] (once it is idle, the next request sets
    /// it). 0 for locks.
    pub capacity: u32,
    /// The last part of `lease` that is a transition window (Simba's
    /// `transition_at`; zero for none): the holder counts itself suspended in it and
    /// may still renew, nobody else may take the hold before `lease` ends. Backends
    /// that record the holder's own end, `lease − transition` (SQL's `ttl_at`), show
    /// it through [`crate::HolderInfo::remaining_ttl`]; the others need do nothing.
    pub transition: Duration,
    /// The grant by which the same owner holds this lock now in the other mode (a
    /// writer taking the read side, an upgradeable reader taking the write side),
    /// or `None`. That hold never blocks this request: the request is judged against
    /// the other owners' holds only, and it does not queue behind other waiters (it
    /// goes first, or it could wait for a waiter that waits for it). A backend that
    /// cannot judge so has [`crate::Capabilities::cross_mode`] off and never sees
    /// one. If the named hold is gone, the request is judged as any other.
    ///
    /// Only [`LockMode::Exclusive`] and [`LockMode::Shared`] requests name one.
    pub alongside: Option<GrantId>,
}

impl AcquireRequest {
    /// An exclusive, non-fair, try-once request for grant `grant` of `owner`, with a
    /// 30 s lease and no context.
    pub fn new(name: LockName, owner: OwnerId, grant: GrantId) -> Self {
        AcquireRequest {
            name,
            owner,
            grant,
            mode: LockMode::Exclusive,
            lease: Duration::from_secs(30),
            deadline: None,
            fairness: Fairness::NonFair,
            context: Bytes::new(),
            purpose: HoldPurpose::Lock,
            capacity: 0,
            transition: Duration::ZERO,
            alongside: None,
        }
    }

    /// Names the grant by which the same owner holds the lock in the other mode
    /// (see [`Self::alongside`]).
    pub fn with_alongside(mut self, grant: Option<GrantId>) -> Self {
        self.alongside = grant;
        self
    }

    /// The stored identity of the owner's hold named by [`Self::alongside`].
    pub fn alongside_holder(&self) -> Option<HolderKey> {
        self.alongside.map(|g| HolderKey::new(&self.owner, g))
    }

    /// Sets the semaphore's total permits (for [`LockMode::Permits`]).
    pub fn with_capacity(mut self, capacity: u32) -> Self {
        self.capacity = capacity;
        self
    }

    /// Sets the transition window at the end of the lease.
    pub fn with_transition(mut self, transition: Duration) -> Self {
        self.transition = transition;
        self
    }

    /// Sets what the hold is for.
    pub fn with_purpose(mut self, purpose: HoldPurpose) -> Self {
        self.purpose = purpose;
        self
    }

    /// Sets the mode.
    pub fn with_mode(mut self, mode: LockMode) -> Self {
        self.mode = mode;
        self
    }

    /// Sets the lease.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Sets the deadline (`None` = try once).
    pub fn with_deadline(mut self, deadline: Option<Instant>) -> Self {
        self.deadline = deadline;
        self
    }

    /// Sets the fairness.
    pub fn with_fairness(mut self, fairness: Fairness) -> Self {
        self.fairness = fairness;
        self
    }

    /// Sets the context bytes.
    pub fn with_context(mut self, context: Bytes) -> Self {
        self.context = context;
        self
    }

    /// The grant's identity as backends store it.
    pub fn holder(&self) -> HolderKey {
        HolderKey::new(&self.owner, self.grant)
    }

    /// The release of the grant this request asks for (token unknown: 0), for a
    /// backend or manager that must give back a grant whose caller is gone. Harmless
    /// if the grant was never made: it answers `NotOwner`.
    pub fn release_of_grant(&self) -> ReleaseRequest {
        ReleaseRequest::of_grant(&self.name, &self.owner, self.grant, self.mode)
            .with_purpose(self.purpose)
    }

    /// How long the backend may still wait, from now (zero when trying once).
    pub fn remaining_wait(&self) -> Duration {
        self.deadline
            .map(|d| d.saturating_duration_since(Instant::now()))
            .unwrap_or(Duration::ZERO)
    }
}

/// A request to give a lock back.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ReleaseRequest {
    /// The lock.
    pub name: LockName,
    /// The owner that acquired it.
    pub owner: OwnerId,
    /// The grant to give back: only this grant of `owner` is released, never a later one.
    pub grant: GrantId,
    /// The mode it was acquired in.
    pub mode: LockMode,
    /// The token the grant carried (informational; ownership is judged by owner and grant).
    pub token: FencingToken,
    /// What the hold was for (as acquired).
    pub purpose: HoldPurpose,
}

impl ReleaseRequest {
    /// A release of grant `grant` of `name` by `owner`.
    pub fn new(
        name: LockName,
        owner: OwnerId,
        grant: GrantId,
        mode: LockMode,
        token: FencingToken,
    ) -> Self {
        ReleaseRequest {
            name,
            owner,
            grant,
            mode,
            token,
            purpose: HoldPurpose::Lock,
        }
    }

    /// The release of a grant whose token is not known (0), for a caller that gives
    /// back a grant it asked for and never saw answered (see
    /// [`AcquireRequest::release_of_grant`]). Harmless if the grant was never made: it
    /// answers `NotOwner`.
    pub fn of_grant(name: &LockName, owner: &OwnerId, grant: GrantId, mode: LockMode) -> Self {
        ReleaseRequest::new(
            name.clone(),
            owner.clone(),
            grant,
            mode,
            FencingToken::new(0),
        )
    }

    /// Sets what the hold was for.
    pub fn with_purpose(mut self, purpose: HoldPurpose) -> Self {
        self.purpose = purpose;
        self
    }

    /// The grant's identity as backends store it.
    pub fn holder(&self) -> HolderKey {
        HolderKey::new(&self.owner, self.grant)
    }
}

/// A request to extend a held lock's lease.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RenewRequest {
    /// The lock.
    pub name: LockName,
    /// The owner that acquired it.
    pub owner: OwnerId,
    /// The grant to renew: only this grant of `owner`, never a later one.
    pub grant: GrantId,
    /// The mode it was acquired in.
    pub mode: LockMode,
    /// The new lease, counted from when the backend handles the request.
    pub lease: Duration,
    /// The token the grant carried.
    pub token: FencingToken,
    /// New context bytes to store with the hold in the same step (a leader
    /// proclaiming a new value); `None` keeps the stored context.
    pub context: Option<Bytes>,
    /// The transition window at the end of `lease`, as at acquire.
    pub transition: Duration,
}

impl RenewRequest {
    /// A renewal of grant `grant` of `name` by `owner` for `lease`.
    pub fn new(
        name: LockName,
        owner: OwnerId,
        grant: GrantId,
        mode: LockMode,
        lease: Duration,
        token: FencingToken,
    ) -> Self {
        RenewRequest {
            name,
            owner,
            grant,
            mode,
            lease,
            token,
            context: None,
            transition: Duration::ZERO,
        }
    }

    /// Sets the transition window at the end of the lease.
    pub fn with_transition(mut self, transition: Duration) -> Self {
        self.transition = transition;
        self
    }

    /// Also replaces the hold's context bytes, atomically with the ownership check.
    pub fn with_context(mut self, context: Bytes) -> Self {
        self.context = Some(context);
        self
    }

    /// The grant's identity as backends store it.
    pub fn holder(&self) -> HolderKey {
        HolderKey::new(&self.owner, self.grant)
    }
}
