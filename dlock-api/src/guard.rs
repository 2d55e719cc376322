//! The proof of holding a lock.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use dlock_spi::{
    Error, ErrorKind, FencingToken, LockMode, LockName, LostReason, ReleaseResult, Result,
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
