//! What a backend can do, so the manager and the conformance suite adapt to it.

/// A backend's abilities. Unsupported requests get [`crate::ErrorKind::Unsupported`]
/// from the chain's head before they reach the backend.
///
/// `#[non_exhaustive]`: start from `Capabilities::default()` (everything off) and set
/// the fields that apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Capabilities {
    /// Holds expire after a lease unless renewed. `false`: holds are tied to a session
    /// (ZooKeeper) and the watchdog has nothing to renew.
    pub lease: bool,
    /// `renew` extends a lease.
    pub renew: bool,
    /// An acquire by the current owner is idempotent (grants again, same token), so a
    /// retried acquire whose first answer was lost does not deadlock.
    pub reentrant: bool,
    /// `Fairness::Fair` is honoured (grants in arrival order).
    pub fair: bool,
    /// `LockMode::Permits` is supported (semaphores), granted in arrival order.
    pub semaphore: bool,
    /// `LockMode::Shared` is supported (read-write locks).
    pub shared: bool,
    /// An owner holding a lock's write side may take its read side beside that hold
    /// ([`crate::AcquireRequest::alongside`]), and then let the write side go (a
    /// downgrade) without another writer getting in.
    pub cross_mode: bool,
    /// With `cross_mode`: a write beside the owner's own read (an upgrade) is
    /// granted once the other owners' readers are gone, ahead of queued writers, and
    /// no other reader becomes a holder while it lasts. A backend without it gets
    /// `Unsupported` from the chain's head for such a request.
    pub upgrade: bool,
    /// Waiters are woken by the backend when the lock frees (no polling), one at a time.
    pub push_wakeup: bool,
    /// Grants carry strictly increasing fencing tokens.
    pub fencing: bool,
    /// A grant says whether it replaced a holder whose lease ran out without a
    /// release (`AcquireResult::Acquired::took_over`).
    pub takeover: bool,
    /// The shortest lease the store holds, when it cannot hold any lease as short
    /// as asked: a shorter one is held this long, and longer ones are rounded up
    /// in steps no longer than this (etcd: whole seconds, at least its minimum
    /// TTL). The manager still counts the lease asked for, so the holder's view
    /// stays conservative; only others wait longer after a holder vanishes.
    /// `None`: leases are held as asked (to the millisecond).
    pub min_lease: Option<std::time::Duration>,
    /// The longest name the backend stores, when shorter than `LockName::MAX_LEN`.
    pub max_name_len: Option<usize>,
}

impl Capabilities {
    /// Refuses a name longer than the backend stores ([`Self::max_name_len`]) with
    /// [`crate::ErrorKind::InvalidName`], saying what to do. The one check every
    /// entry that takes a name runs (acquire, `inspect`, force-release), so a name
    /// one command refuses is refused by all (`backend`: the backend's name, for
    /// the message).
    ///
    /// ```
    /// # use dlock_spi::{Capabilities, ErrorKind, LockName};
    /// let mut caps = Capabilities::default();
    /// caps.max_name_len = Some(4);
    /// assert!(caps.check_name("sql", &LockName::new("abcd").unwrap()).is_ok());
    /// let err = caps.check_name("sql", &LockName::new("abcde").unwrap()).unwrap_err();
    /// assert_eq!(err.kind(), ErrorKind::InvalidName);
    /// ```
    pub fn check_name(&self, backend: &str, name: &crate::LockName) -> crate::Result<()> {
        match self.max_name_len {
            Some(max) if name.len() > max => Err(crate::Error::new(
                crate::ErrorKind::InvalidName,
                format!(
                    "lock name is {} bytes; the {backend} backend stores at most {max} — use a shorter name or hash it",
                    name.len()
                ),
            )
            .with_context("lock", name)),
            _ => Ok(()),
        }
    }
}
