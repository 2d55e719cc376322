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

/// One grant of a lock to an owner: the manager picks a new one for every acquire
/// call (the retries inside one call keep it, so a retried acquire stays idempotent).
///
/// Backends store the grant with the holder and release or renew only the grant a
/// request names, so a late release or renewal of an *earlier* grant — a dropped
/// guard's background release racing the same handle's next acquire — can never touch
/// a later grant by the same owner. Store it through [`HolderKey`], the one encoding
/// of "owner + grant" every backend shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GrantId(u64);

impl GrantId {
    /// Wraps a raw grant number.
    pub const fn new(value: u64) -> Self {
        GrantId(value)
    }

    /// The raw value.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for GrantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:x}", self.0)
    }
}

/// The identity of one grant as a backend stores it: `<owner>#<grant in hex>`.
///
/// Backends that keep a holder as one string (a Redis value, a SQL column, a
/// ZooKeeper node's data and protection id) store this key wherever they used to
/// store the owner, compare it on release and renewal, and recover owner and grant
/// with [`HolderKey::parse`] for `inspect`. The split is at the *last* `#`, so any
/// owner text round-trips.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HolderKey(String);

impl HolderKey {
    /// The key of `grant` by `owner` (one allocation: built on every release and
    /// renewal).
    pub fn new(owner: &OwnerId, grant: GrantId) -> Self {
        // The grant in lowercase hex without leading zeros, as `GrantId`'s Display,
        // written by hand: the formatting machinery cost a third of a Redis
        // backend's own work per cycle (issue 51).
        let mut digits = [0u8; 16];
        let mut n = grant.0;
        let mut at = digits.len();
        loop {
            at -= 1;
            digits[at] = b"0123456789abcdef"[(n & 0xf) as usize];
            n >>= 4;
            if n == 0 {
                break;
            }
        }
        let mut key = String::with_capacity(owner.as_str().len() + 1 + digits.len() - at);
        key.push_str(owner.as_str());
        key.push('#');
        // (ASCII digits: always UTF-8.)
        if let Ok(digits) = std::str::from_utf8(&digits[at..]) {
            key.push_str(digits);
        }
        HolderKey(key)
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Owner and grant of a stored key; a key without a grant part (written by an
    /// older dlock or another client) is all owner, with no grant.
    pub fn parse(stored: &str) -> (OwnerId, Option<GrantId>) {
        if let Some((owner, grant)) = stored.rsplit_once('#') {
            if !grant.is_empty() && grant.len() <= 16 {
                if let Ok(g) = u64::from_str_radix(grant, 16) {
                    return (OwnerId::new(owner), Some(GrantId(g)));
                }
            }
        }
        (OwnerId::new(stored), None)
    }
}

impl fmt::Display for HolderKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for HolderKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

/// Exclusive (write) or shared (read) ownership, or permits of a semaphore.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LockMode {
    /// One holder at a time.
    #[default]
    Exclusive,
    /// Many holders together, but never alongside an exclusive holder.
    Shared,
    /// This many permits of a semaphore: holders together as long as their permits
    /// add up to at most the semaphore's total ([`crate::AcquireRequest::capacity`]).
    /// Only backends with [`crate::Capabilities::semaphore`] see it (the chain's head
    /// refuses it for the others).
    Permits(u32),
}

impl LockMode {
    /// `"exclusive"`, `"shared"` or `"permits"`.
    pub fn as_str(self) -> &'static str {
        match self {
            LockMode::Exclusive => "exclusive",
            LockMode::Shared => "shared",
            LockMode::Permits(_) => "permits",
        }
    }

    /// The permits a hold in this mode takes (`None` for locks).
    pub fn permits(self) -> Option<u32> {
        match self {
            LockMode::Permits(n) => Some(n),
            LockMode::Exclusive | LockMode::Shared => None,
        }
    }
}

impl fmt::Display for LockMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockMode::Permits(n) => write!(f, "permits({n})"),
            _ => f.write_str(self.as_str()),
        }
    }
}

/// What a hold is for. Every purpose has the same semantics (an exclusive leadership
/// is an exclusive lock); a backend may lay it out so that other clients of the same
/// store recognise it — ZooKeeper writes leadership contenders as Curator's
/// `LeaderLatch` participants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum HoldPurpose {
    /// A lock (the default).
    #[default]
    Lock,
    /// A term of leadership of an election (exclusive, fair).
    Leadership,
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
    /// The hold reached its `max_hold` bound: the watchdog stopped renewing it, fired
    /// the lost signal and gave it back (a holder that is alive but stuck cannot keep
    /// a lock forever).
    MaxHold,
}

impl LostReason {
    /// A short lower-case label.
    pub fn as_str(self) -> &'static str {
        match self {
            LostReason::NotOwner => "not_owner",
            LostReason::LeaseExpired => "lease_expired",
            LostReason::SessionExpired => "session_expired",
            LostReason::ManagerClosed => "manager_closed",
            LostReason::MaxHold => "max_hold",
        }
    }
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_keys_round_trip_any_owner() {
        for owner in ["m:1", "a#b", "#", "", "x#zz", "ends#"] {
            let o = OwnerId::new(owner);
            let key = HolderKey::new(&o, GrantId::new(0xabc));
            assert_eq!(
                HolderKey::parse(key.as_str()),
                (o, Some(GrantId::new(0xabc)))
            );
        }
        assert_eq!(HolderKey::parse("plain"), (OwnerId::new("plain"), None));
        assert_ne!(
            HolderKey::new(&OwnerId::new("m:1"), GrantId::new(1)),
            HolderKey::new(&OwnerId::new("m:1"), GrantId::new(2))
        );
    }

    /// The key is `<owner>#<grant in lowercase hex>`, exactly as stores already hold
    /// it (written with `format!` before).
    #[test]
    fn holder_keys_are_owner_hash_hex_grant() {
        let grants = [
            0,
            1,
            9,
            0xa,
            0xf,
            0x10,
            0xff,
            0x100,
            0xdead_beef,
            u64::MAX - 1,
            u64::MAX,
        ];
        for g in grants.into_iter().chain((0..64).map(|i| 1u64 << i)) {
            let key = HolderKey::new(&OwnerId::new("m:7"), GrantId::new(g));
            assert_eq!(key.as_str(), format!("m:7#{g:x}"));
        }
    }
}
