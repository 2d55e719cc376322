//! Small value types shared by requests, results and the user API.

use std::fmt;
use std::sync::Arc;

/// A number that strictly increases every time a lock is granted, across all clients.
///
/// Pass it to the resource you protect and have that resource reject writes carrying
/// a smaller token than it has seen: a client that paused past its lease then cannot
/// overwrite the work of the client that took the lock after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a raw token value as issued by a backend.
    pub const fn new(value: u64) -> Self {
        FencingToken(value)
    }

    /// The raw value.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// Who holds (or wants) a lock: unique per manager × lock handle, never a thread id.
///
/// Backends store it verbatim and compare it on release and renewal.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerId(Arc<str>);

impl OwnerId {
    /// Wraps an owner string. Callers are responsible for uniqueness; the manager
    /// builds them from a random per-manager id and a per-handle counter.
    pub fn new(owner: impl Into<Arc<str>>) -> Self {
        OwnerId(owner.into())
    }

    /// The owner as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

/// Exclusive (write) or shared (read) ownership.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LockMode {
    /// One holder at a time.
    #[default]
    Exclusive,
    /// Many holders together, but never alongside an exclusive holder.
    Shared,
}

impl LockMode {
    /// `"exclusive"` or `"shared"`.
    pub fn as_str(self) -> &'static str {
        match self {
            LockMode::Exclusive => "exclusive",
            LockMode::Shared => "shared",
        }
    }
}

impl fmt::Display for LockMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether waiters are granted the lock in arrival order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Fairness {
    /// A newcomer may take a free lock ahead of parked waiters (higher throughput).
    #[default]
    NonFair,
    /// Waiters are granted the lock strictly in the order they arrived.
    Fair,
}

impl fmt::Display for Fairness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Fairness::NonFair => "non-fair",
            Fairness::Fair => "fair",
        })
    }
}

/// Why a held lock stopped being held without the holder releasing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// The backend answered a renewal with "you are not the owner" (expired, stolen, force-released).
    NotOwner,
    /// The lease ran out locally without a successful renewal (backend unreachable,
    /// or an explicit lease that is not renewed).
    LeaseExpired,
    /// The backend session that owned the lock ended (ZooKeeper session expiry).
    SessionExpired,
    /// The manager was closed while the lock was held; it released the lock.
    ManagerClosed,
}

impl LostReason {
    /// A short lower-case label.
    pub fn as_str(self) -> &'static str {
        match self {
            LostReason::NotOwner => "not_owner",
            LostReason::LeaseExpired => "lease_expired",
            LostReason::SessionExpired => "session_expired",
            LostReason::ManagerClosed => "manager_closed",
        }
    }
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
