//! What backends answer.

use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::hold_watch::HoldWatch;
use crate::types::{FencingToken, GrantId, LockMode, OwnerId};

/// The answer to an acquire. Contention is an answer, not an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquireResult {
    /// The lock is yours.
    #[non_exhaustive]
    Acquired {
        /// Strictly greater than every token issued for this lock before.
        token: FencingToken,
        /// When the lease ends, as a conservative estimate on this process's monotonic
        /// clock: the send time of the request that was granted + the lease (the store
        /// started the lease no earlier). The manager counts the hold's lease — and
        /// so its lost signal — from it, not from the start of a long wait. It may
        /// be sooner than the lease after the call began: a grant the store made on
        /// the waiter's behalf (a release handing the lock over) with a shorter,
        /// provisional lease; the manager then renews the hold a third into that lease
        /// (a hold released sooner sends no renewal). `None`
        /// when the hold is tied to a session rather than a lease.
        lease_until: Option<Instant>,
        /// How the hold stands, pushed by session-bound backends (ZooKeeper); `None`
        /// for lease-based holds, which the manager's watchdog looks after.
        watch: Option<HoldWatch>,
        /// The grant replaced a holder whose lease had run out without a release
        /// (RheaKV's "took over"), when the backend can tell; false otherwise.
        took_over: bool,
    },
    /// Someone else holds it and the deadline passed (or there was none).
    #[non_exhaustive]
    NotAcquired {
        /// A current holder, when the backend can tell.
        holder: Option<OwnerId>,
        /// When trying again may succeed (e.g. the holder's remaining lease).
        retry_after: Option<Duration>,
    },
}

impl AcquireResult {
    /// Builds [`AcquireResult::Acquired`].
    pub fn acquired(token: FencingToken, lease_until: Option<Instant>) -> Self {
        AcquireResult::Acquired {
            token,
            lease_until,
            watch: None,
            took_over: false,
        }
    }

    /// Marks a grant as having replaced a holder whose lease had run out (no effect
    /// on `NotAcquired`).
    pub fn with_took_over(mut self, replaced_expired: bool) -> Self {
        if let AcquireResult::Acquired { took_over, .. } = &mut self {
            *took_over = replaced_expired;
        }
        self
    }

    /// Attaches the backend's status feed of a session-bound hold to a grant (no
    /// effect on `NotAcquired`). See [`HoldWatch`].
    pub fn with_watch(mut self, hold_watch: HoldWatch) -> Self {
        if let AcquireResult::Acquired { watch, .. } = &mut self {
            *watch = Some(hold_watch);
        }
        self
    }

    /// Builds [`AcquireResult::NotAcquired`].
    pub fn not_acquired(holder: Option<OwnerId>, retry_after: Option<Duration>) -> Self {
        AcquireResult::NotAcquired {
            holder,
            retry_after,
        }
    }

    /// Whether the lock was granted.
    pub fn is_acquired(&self) -> bool {
        matches!(self, AcquireResult::Acquired { .. })
    }

    /// The fencing token, when acquired.
    pub fn token(&self) -> Option<FencingToken> {
        match self {
            AcquireResult::Acquired { token, .. } => Some(*token),
            AcquireResult::NotAcquired { .. } => None,
        }
    }
}

/// The answer to a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseResult {
    /// The caller's hold was removed.
    Released,
    /// The caller does not hold the lock (expired, stolen, never held); nothing changed.
    NotOwner,
}

/// The answer to a renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewResult {
    /// The lease was extended.
    #[non_exhaustive]
    Renewed {
        /// The new end of the lease, estimated on this process's monotonic clock.
        lease_until: Option<Instant>,
    },
    /// The caller no longer holds the lock; the hold is lost.
    NotOwner,
}

impl RenewResult {
    /// Builds [`RenewResult::Renewed`].
    pub fn renewed(lease_until: Option<Instant>) -> Self {
        RenewResult::Renewed { lease_until }
    }
}

/// One current holder of a lock, as seen by `inspect`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HolderInfo {
    /// Who holds it.
    pub owner: OwnerId,
    /// Which grant of the owner, when the backend stored one.
    pub grant: Option<GrantId>,
    /// In which mode.
    pub mode: LockMode,
    /// The token of the grant.
    pub token: FencingToken,
    /// The context bytes given at acquire.
    pub context: Bytes,
    /// Lease left, by the backend's clock; `None` for session-bound holds.
    pub remaining_lease: Option<Duration>,
    /// With an election's transition window
    /// ([`Election::transition`](https://docs.rs/dlock-api/latest/dlock_api/struct.Election.html#method.transition)):
    /// the holder's own lease left before the window (zero once in it), on backends
    /// that record both instants (SQL); `None` where they do not. Without a window,
    /// where recorded, the same as `remaining_lease`.
    pub remaining_ttl: Option<Duration>,
}

impl HolderInfo {
    /// Builds a holder description.
    pub fn new(
        owner: OwnerId,
        mode: LockMode,
        token: FencingToken,
        context: Bytes,
        remaining_lease: Option<Duration>,
    ) -> Self {
        HolderInfo {
            owner,
            grant: None,
            mode,
            token,
            context,
            remaining_lease,
            remaining_ttl: None,
        }
    }

    /// Sets the holder's own lease left before its transition window.
    pub fn with_remaining_ttl(mut self, ttl: Option<Duration>) -> Self {
        self.remaining_ttl = ttl;
        self
    }
}

impl HolderInfo {
    /// Describes a holder from the [`crate::HolderKey`] text a backend stored.
    pub fn from_stored(
        stored: &str,
        mode: LockMode,
        token: FencingToken,
        context: Bytes,
        remaining_lease: Option<Duration>,
    ) -> Self {
        let (owner, grant) = crate::HolderKey::parse(stored);
        HolderInfo::new(owner, mode, token, context, remaining_lease).with_grant(grant)
    }

    /// Sets the grant.
    pub fn with_grant(mut self, grant: Option<GrantId>) -> Self {
        self.grant = grant;
        self
    }
}

/// A snapshot of one lock, for status pages and operations.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LockState {
    /// Current holders: one exclusive holder, or any number of shared ones.
    pub holders: Vec<HolderInfo>,
    /// Waiters the backend knows of (queued or registered), when it can tell.
    pub waiters: Option<usize>,
}

impl LockState {
    /// Builds a snapshot.
    pub fn new(holders: Vec<HolderInfo>, waiters: Option<usize>) -> Self {
        LockState { holders, waiters }
    }
}
