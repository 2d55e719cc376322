//! The proof of holding a lock.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_spi::{
    Error, ErrorKind, FencingToken, LockMode, LockName, LostReason, ReleaseResult, RenewRequest,
    RenewResult, Result, MAX_LEASE,
};

use crate::hold::Hold;
use crate::lock::Handle;

/// Holding a lock. Release with [`unlock`](Self::unlock) to see the outcome; dropping
/// the guard releases in the background.
///
/// The guard never pretends: once the lock is lost (renewal refused, lease passed
/// without renewal, session expired, manager closed) [`is_lost`](Self::is_lost) is true
/// and [`lost`](Self::lost) completes — `select!` on it to abandon work in time.
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    handle: Arc<Handle>,
    hold: Arc<Hold>,
    runtime: Option<tokio::runtime::Handle>,
    released: bool,
}

impl LockGuard {
    pub(crate) fn new(handle: Arc<Handle>, hold: Arc<Hold>) -> Self {
        LockGuard {
            handle,
            hold,
            runtime: tokio::runtime::Handle::try_current().ok(),
            released: false,
        }
    }

    /// The hold behind this guard.
    pub(crate) fn hold(&self) -> &Arc<Hold> {
        &self.hold
    }

    /// The manager that granted it.
    pub(crate) fn manager(&self) -> &Arc<crate::manager::ManagerInner> {
        &self.handle.manager
    }

    /// The fencing token of this hold: pass it to the resource you protect and have
    /// it refuse writes with a smaller token than it has seen.
    pub fn fencing_token(&self) -> FencingToken {
        self.hold.token
    }

    /// The lock's full name.
    pub fn name(&self) -> &LockName {
        &self.hold.name
    }

    /// Exclusive or shared.
    pub fn mode(&self) -> LockMode {
        self.hold.mode
    }

    /// When the hold began: when the acquire that was granted was sent (for a
    /// reentrant hold, its first acquire). Its lease runs from here.
    pub fn acquired_at(&self) -> Instant {
        self.hold.acquired_at
    }

    /// Whether the backend's connection is down while the hold may still be alive
    /// (session-bound backends such as ZooKeeper): pause protected work until it
    /// clears or [`lost`](Self::lost) fires. Always false for lease-based backends,
    /// whose guards are lost or held.
    pub fn is_suspended(&self) -> bool {
        self.hold.is_suspended()
    }

    /// How many guards (reentrant acquisitions) share this hold.
    pub fn hold_count(&self) -> usize {
        self.hold.guards()
    }

    /// Whether the lock has been lost.
    pub fn is_lost(&self) -> bool {
        self.hold.lost_reason().is_some()
    }

    /// Why the lock was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.hold.lost_reason()
    }

    /// Completes when the lock is lost (at once if it already is).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only waits.
    pub async fn lost(&self) -> LostReason {
        self.hold.wait_lost().await
    }

    /// The instant before which the hold is guaranteed: the loss margin before the
    /// store may let it go, counted from when the last acquire or renewal that
    /// succeeded was sent — the lost signal fires then unless a renewal moves it.
    /// `None` for a hold bound to a session rather than a lease (ZooKeeper: held
    /// until [`lost`](Self::lost) fires; see [`is_suspended`](Self::is_suspended)),
    /// and once the hold is lost.
    pub fn valid_until(&self) -> Option<Instant> {
        if self.hold.lost_reason().is_some() {
            return None;
        }
        self.handle.manager.watchdog.valid_until(self.hold.id)
    }

    /// `Ok` while the hold can be acted on; call it right before a side effect.
    ///
    /// Errors: [`ErrorKind::LockLost`] once the hold is lost, or when its
    /// [`valid_until`](Self::valid_until) has passed (the lost signal is due);
    /// [`ErrorKind::Backend`] while it is suspended (the connection to a
    /// session-bound backend is down: it may still be held, but must not be acted
    /// on until that clears).
    pub fn check(&self) -> Result<()> {
        if let Some(reason) = self.hold.lost_reason() {
            return Err(lost_error(&self.hold.name, reason));
        }
        if self
            .valid_until()
            .is_some_and(|until| Instant::now() >= until)
        {
            return Err(lost_error(&self.hold.name, LostReason::LeaseExpired));
        }
        if self.hold.is_suspended() {
            return Err(Error::new(
                ErrorKind::Backend,
                "the hold is suspended: the backend's connection is down and it may or may not still be held; wait until it clears (or the lost signal fires) before acting on it",
            )
            .with_context("lock", &self.hold.name));
        }
        Ok(())
    }

    /// Renews the hold now for `lease` (counted from this call), and from then on
    /// for `lease` each time the watchdog renews it. For a lock taken with a fixed
    /// lease, this is how it is made longer (or shorter) on purpose.
    ///
    /// ```
    /// # async fn demo() -> dlock_api::Result<()> {
    /// use std::time::Duration;
    /// use dlock_api::DistributeLockManager;
    ///
    /// let manager = DistributeLockManager::connect("memory://").await?;
    /// let guard = manager.lock("report").lock_with_lease(Duration::from_secs(10)).await?;
    /// // A long step ahead: make the hold outlast it before starting.
    /// guard.extend(Duration::from_secs(60)).await?;
    /// assert!(guard.valid_until().is_some());
    /// guard.check()?; // right before the side effect
    /// guard.unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before the store answers, the renewal may or may not
    /// have happened; the guard's [`valid_until`](Self::valid_until) is unchanged
    /// either way (it never counts on an answer it did not get).
    ///
    /// Errors: [`ErrorKind::Unsupported`] on session-bound backends (no lease);
    /// [`ErrorKind::InvalidArgument`] for a lease outside 1 ms ..= 30 days (nothing
    /// changes); [`ErrorKind::LockLost`] if the hold is lost or its lease has passed
    /// — it is never revived — or the store says another owner has it now (the hold
    /// is then lost); backend errors as they come (the hold keeps its old lease).
    pub async fn extend(&self, lease: Duration) -> Result<()> {
        let manager = &self.handle.manager;
        let name = &self.hold.name;
        if !manager.capabilities.lease {
            return Err(Error::unsupported(format!(
                "the {} backend ties holds to its session, not to a lease: there is no lease to extend (the hold lasts until released or the session ends)",
                manager.chain.resource().backend_name()
            ))
            .with_context("lock", name));
        }
        if lease < Duration::from_millis(1) || lease > MAX_LEASE {
            return Err(Error::invalid_argument(format!(
                "lease {lease:?} is out of range; use between 1 ms and {} days",
                MAX_LEASE.as_secs() / 86_400
            ))
            .with_context("lock", name));
        }
        self.check()?;
        let request = RenewRequest::new(
            name.clone(),
            self.hold.owner.clone(),
            self.hold.grant,
            self.hold.mode,
            lease,
            self.hold.token,
        );
        let sent = Instant::now();
        match manager.chain.renew(&request).await? {
            RenewResult::Renewed { .. } => {
                manager.watchdog.extended(self.hold.id, sent, lease);
                // Lost while the renewal was in flight: the loss stands.
                match self.hold.lost_reason() {
                    Some(reason) => Err(lost_error(name, reason)),
                    None => Ok(()),
                }
            }
            RenewResult::NotOwner => {
                self.hold.lose(&manager.chain, LostReason::NotOwner);
                Err(lost_error(name, LostReason::NotOwner))
            }
        }
    }

    /// An owned, cloneable signal to hand to another task.
    pub fn lost_signal(&self) -> LostSignal {
        LostSignal {
            hold: Arc::clone(&self.hold),
        }
    }

    /// Releases this acquisition. For a reentrant hold, only the last unlock reaches
    /// the backend.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before it completes, the release goes on in the
    /// background (as when the guard is dropped); the hold is never left taken.
    ///
    /// Errors: [`ErrorKind::LockLost`] if the lock had been lost while held (the
    /// protected work may have overlapped another holder's); [`ErrorKind::NotOwner`]
    /// if the backend says someone else owns it now (nothing was released);
    /// backend errors as they come (the lease then expires on the server).
    pub async fn unlock(mut self) -> Result<()> {
        self.released = true;
        let lost = self.hold.lost_reason();
        let result = match self.leave() {
            Some(hold) => Some(self.handle.manager.release(&hold).await),
            None => None,
        };
        if let Some(reason) = lost {
            return Err(lost_error(&self.hold.name, reason));
        }
        match result {
            None | Some(Ok(ReleaseResult::Released)) => Ok(()),
            Some(Ok(ReleaseResult::NotOwner)) => {
                self.hold
                    .lose(&self.handle.manager.chain, LostReason::NotOwner);
                Err(Error::new(
                    ErrorKind::NotOwner,
                    "the lock was no longer held by this owner when released (lease expired or force-released); nothing was released — guard writes with the fencing token",
                )
                .with_context("lock", &self.hold.name))
            }
            Some(Err(err)) => Err(err),
        }
    }

    /// Leaves the hold; returns it when this was the last guard (remote release due).
    fn leave(&self) -> Option<Arc<Hold>> {
        let mut current = self.handle.current();
        if self.hold.count.fetch_sub(1, Ordering::AcqRel) != 1 {
            return None;
        }
        if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, &self.hold)) {
            *current = None;
        }
        Some(Arc::clone(&self.hold))
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let Some(hold) = self.leave() else { return };
        Arc::clone(&self.handle.manager).release_in_background(hold, self.runtime.take());
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.hold.name)
            .field("mode", &self.hold.mode)
            .field("token", &self.hold.token)
            .field("lost", &self.hold.lost_reason())
            .finish()
    }
}

/// An owned handle on a guard's lost signal, for another task.
#[derive(Clone)]
pub struct LostSignal {
    hold: Arc<Hold>,
}

impl LostSignal {
    /// Completes when the lock is lost (at once if it already is).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only waits.
    pub async fn lost(&self) -> LostReason {
        self.hold.wait_lost().await
    }

    /// Whether the lock has been lost.
    pub fn is_lost(&self) -> bool {
        self.hold.lost_reason().is_some()
    }

    /// Whether the hold is suspended (see [`LockGuard::is_suspended`]).
    pub fn is_suspended(&self) -> bool {
        self.hold.is_suspended()
    }
}

impl fmt::Debug for LostSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LostSignal")
            .field("lock", &self.hold.name)
            .field("lost", &self.hold.lost_reason())
            .finish()
    }
}

/// The accessors a type holding a [`LockGuard`] in its field `guard` shares with
/// the guard (a leadership's term, a semaphore's permits); `$what` names the hold
/// in the docs.
macro_rules! hold_accessors {
    ($what:literal) => {
        #[doc = concat!("The fencing token of ", $what, ": greater than every earlier one's of the name.")]
        pub fn fencing_token(&self) -> dlock_spi::FencingToken {
            self.guard.fencing_token()
        }

        #[doc = concat!("When ", $what, " began: when the granted request was sent.")]
        pub fn acquired_at(&self) -> std::time::Instant {
            self.guard.acquired_at()
        }

        #[doc = concat!("Whether ", $what, " is lost.")]
        pub fn is_lost(&self) -> bool {
            self.guard.is_lost()
        }

        #[doc = concat!("Why ", $what, " was lost, if it was.")]
        pub fn lost_reason(&self) -> Option<dlock_spi::LostReason> {
            self.guard.lost_reason()
        }

        #[doc = concat!("Completes when ", $what, " is lost (at once if it already is).")]
        ///
        /// # Cancel safety
        ///
        /// Cancel-safe: it only waits.
        pub async fn lost(&self) -> dlock_spi::LostReason {
            self.guard.lost().await
        }

        #[doc = concat!("The instant before which ", $what, " is guaranteed (see [`crate::LockGuard::valid_until`]); `None` on session-bound backends and once lost.")]
        pub fn valid_until(&self) -> Option<std::time::Instant> {
            self.guard.valid_until()
        }

        #[doc = concat!("`Ok` while ", $what, " can be acted on (see [`crate::LockGuard::check`]).")]
        ///
        /// # Errors
        ///
        /// As [`crate::LockGuard::check`].
        pub fn check(&self) -> dlock_spi::Result<()> {
            self.guard.check()
        }

        #[doc = concat!("An owned signal of the loss of ", $what, ", for another task.")]
        pub fn lost_signal(&self) -> crate::LostSignal {
            self.guard.lost_signal()
        }

        #[doc = concat!(
            "Whether ", $what, " may still hold but must not be acted on: the backend's ",
            "connection is down (session-bound backends), or — with a transition window — ",
            "its own lease passed without a renewal. Pause the work until it clears or the ",
            "loss fires."
        )]
        pub fn is_suspended(&self) -> bool {
            self.guard.is_suspended()
        }
    };
}
pub(crate) use hold_accessors;

fn lost_error(name: &LockName, reason: LostReason) -> Error {
    Error::new(
        ErrorKind::LockLost,
        format!(
            "the lock was lost while held ({reason}); work done under it may have overlapped another holder's — guard writes with the fencing token"
        ),
    )
    .with_context("lock", name)
}
