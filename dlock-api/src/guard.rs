//! The proof of holding a lock.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_spi::{
    lease_out_of_range, Error, ErrorKind, FencingToken, LockMode, LockName, LostReason,
    ReleaseResult, Result,
};

use crate::handle::Handle;
use crate::hold::Hold;

/// Holding a lock. Release with [`unlock`](Self::unlock) to see the outcome; dropping
/// the guard releases in the background.
///
/// The guard never pretends: once the lock is lost (renewal refused, lease passed
/// without renewal, session expired, manager closed) [`is_lost`](Self::is_lost) is true
/// and [`lost`](Self::lost) completes — `select!` on it to abandon work in time.
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    pub(crate) handle: Arc<Handle>,
    pub(crate) hold: Arc<Hold>,
    acquisition: Acquisition,
    runtime: Option<tokio::runtime::Handle>,
    released: bool,
}

/// How a guard's acquisition was granted (RheaKV's acquire outcomes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Acquisition {
    /// A new grant from the backend.
    New,
    /// A new grant that replaced a holder whose lease had run out without a
    /// release — its work may have been cut short. Reported where the backend can
    /// tell (see [`AcquireResult::Acquired`](dlock_spi::AcquireResult::Acquired));
    /// elsewhere such a grant is [`New`](Self::New).
    TookOver,
    /// The handle already held the lock: this guard shares that hold (same grant,
    /// same fencing token), and the last guard's release gives it back.
    Reentered,
}

impl LockGuard {
    pub(crate) fn new(handle: Arc<Handle>, hold: Arc<Hold>, acquisition: Acquisition) -> Self {
        LockGuard {
            handle,
            hold,
            acquisition,
            runtime: tokio::runtime::Handle::try_current().ok(),
            released: false,
        }
    }

    /// How this acquisition was granted: new, took over an expired holder, or
    /// reentered the handle's hold.
    pub fn acquisition(&self) -> Acquisition {
        self.acquisition
    }

    /// The instant until which the hold is guaranteed: the loss margin before the
    /// store may let it go (counted from the last successful renewal's send time),
    /// or its `max_hold` bound if sooner. Moves on with every renewal. `None` when no
    /// instant is guaranteed: the hold is lost, or it is tied to a session rather
    /// than a lease (ZooKeeper: watch [`is_suspended`](Self::is_suspended) and
    /// [`lost`](Self::lost) instead).
    pub fn valid_until(&self) -> Option<Instant> {
        self.hold.valid_until()
    }

    /// `Ok` when the hold can be acted on right now — call it just before a side
    /// effect. Errors: [`ErrorKind::LockLost`] once the lock is lost or its
    /// guaranteed instant ([`valid_until`](Self::valid_until)) has passed (even if
    /// the lost signal has not fired yet); [`ErrorKind::Backend`] while the hold is
    /// suspended (connection down, or a leader in its transition window) — it may
    /// still be held, but must not be acted on.
    pub fn check(&self) -> Result<()> {
        check_hold(&self.hold)
    }

    /// Renews the lease now, for `lease`, and makes `lease` the one the watchdog
    /// renews for from here on (a hold taken with a fixed lease gets one renewal
    /// and keeps its fixed end, `lease` later). Shortening is allowed: the guard's
    /// guaranteed instant drops at once, before the store is asked.
    ///
    /// Errors: [`ErrorKind::InvalidArgument`] for a lease outside 3 ms – 30 days;
    /// [`ErrorKind::LockLost`] when the hold is lost or past its guaranteed instant
    /// (an expired hold is never revived); [`ErrorKind::Unsupported`] on
    /// session-bound backends (ZooKeeper), whose holds have no lease; a backend
    /// error as it comes — the store may or may not have applied it: a renewed
    /// hold's watchdog retries with the new lease until the loss instant, a fixed
    /// one keeps its end, and from then on no renewal counts for longer than the
    /// shorter of the two leases (a late answer cannot lengthen the guarantee). A
    /// `max_hold` bound still ends the hold where it did.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: the renewal is sent by the manager's watchdog, after any
    /// renewal of this hold already in flight; dropped, it is still sent and its
    /// lease still applies. One renewal per hold is in flight at a time, so the
    /// store sees them in order.
    pub async fn extend(&self, lease: Duration) -> Result<()> {
        let manager = &self.handle.manager;
        if let Some(why) = lease_out_of_range(lease) {
            return Err(
                Error::invalid_argument(format!("extending by a lease of {why}"))
                    .with_context("lock", &self.hold.name),
            );
        }
        if !manager.capabilities.lease {
            return Err(Error::unsupported(format!(
                "the {} backend ties holds to its session, not to a lease: there is nothing to extend (the hold lasts until released or the session ends)",
                manager.chain.resource().backend_name()
            ))
            .with_context("lock", &self.hold.name));
        }
        check_lost(&self.hold)?;
        let answer = match manager.watchdog.extend(self.hold.id, lease) {
            Some(answer) => answer.await,
            None => return Err(self.gone()),
        };
        match answer {
            // (Stamped with the lock where the error arose: the chain's tail, or the
            // watchdog's batch.)
            Ok(result) => result,
            Err(_) => Err(self.gone()),
        }
    }

    /// The error for a hold that is lost or past its guaranteed instant.
    fn gone(&self) -> Error {
        match self.hold.lost_reason() {
            Some(reason) => lost_error(&self.hold.name, reason),
            None => past_error(&self.hold.name),
        }
    }

    /// The hold behind this guard.
    pub(crate) fn hold(&self) -> &Arc<Hold> {
        &self.hold
    }

    /// The manager that granted it.
    pub(crate) fn manager(&self) -> &Arc<crate::inner::ManagerInner> {
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
        LostSignal::of(Arc::from([Arc::clone(&self.hold)]))
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
    /// backend errors as they come. A release the backend could not answer (a
    /// retryable error: the connection broke, the server restarts) is sent again in
    /// the background, straight to the backend (handlers see the first attempt
    /// only), backing off up to 2 s, until the backend answers or the grant could no
    /// longer stand (its lease, as the watchdog last saw it, is up), for at most 60 s
    /// — as Curator's guaranteed delete; a dropped guard's release too. On
    /// ZooKeeper a release first waits up to 2 s for a dropped connection to come
    /// back, then deletes on the same session.
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
            .field("acquisition", &self.acquisition)
            .field("token", &self.hold.token)
            .field("lost", &self.hold.lost_reason())
            .finish()
    }
}

/// An owned handle on a guard's lost signal, for another task (a multi-lock's: of
/// any of its members).
#[derive(Clone)]
pub struct LostSignal {
    holds: Arc<[Arc<Hold>]>,
}

impl LostSignal {
    pub(crate) fn of(holds: Arc<[Arc<Hold>]>) -> Self {
        LostSignal { holds }
    }

    /// Completes when the lock is lost (at once if it already is).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only waits.
    pub async fn lost(&self) -> LostReason {
        wait_any_lost(&self.holds).await
    }

    /// Whether the lock has been lost.
    pub fn is_lost(&self) -> bool {
        self.holds.iter().any(|h| h.lost_reason().is_some())
    }

    /// Whether the hold is suspended (see [`LockGuard::is_suspended`]).
    pub fn is_suspended(&self) -> bool {
        self.holds.iter().any(|h| h.is_suspended())
    }
}

impl fmt::Debug for LostSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("LostSignal");
        for hold in self.holds.iter() {
            d.field("lock", &hold.name)
                .field("lost", &hold.lost_reason());
        }
        d.finish()
    }
}

/// Completes when any of `holds` is lost (at once if one is); never for none.
pub(crate) async fn wait_any_lost(holds: &[Arc<Hold>]) -> LostReason {
    match holds {
        [] => std::future::pending().await,
        [one] => one.wait_lost().await,
        many => {
            let waits = many.iter().map(|h| Box::pin(h.wait_lost()));
            futures_util::future::select_all(waits).await.0
        }
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

        #[doc = concat!("Until when ", $what, " is guaranteed (see [`LockGuard::valid_until`](crate::LockGuard::valid_until)).")]
        pub fn valid_until(&self) -> Option<std::time::Instant> {
            self.guard.valid_until()
        }

        #[doc = concat!("`Ok` when ", $what, " can be acted on now (see [`LockGuard::check`](crate::LockGuard::check)).")]
        pub fn check(&self) -> dlock_spi::Result<()> {
            self.guard.check()
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

/// The accessors of a guard made of several holds (a multi-lock's members, an
/// upgradeable read's holds), over `self.parts()` (an iterator of their
/// [`LockGuard`]s); `$each` names one of them in the docs ("member").
macro_rules! parts_accessors {
    ($each:literal) => {
        /// Their holds.
        fn holds(&self) -> std::sync::Arc<[std::sync::Arc<crate::hold::Hold>]> {
            self.parts()
                .map(|g| std::sync::Arc::clone(g.hold()))
                .collect()
        }

        #[doc = concat!("Whether any ", $each, " has been lost.")]
        pub fn is_lost(&self) -> bool {
            self.parts().any(crate::LockGuard::is_lost)
        }

        #[doc = concat!("Completes when any ", $each, " is lost (at once if one already is).")]
        ///
        /// # Cancel safety
        ///
        /// Cancel-safe: it only waits.
        pub async fn lost(&self) -> dlock_spi::LostReason {
            crate::guard::wait_any_lost(&self.holds()).await
        }

        #[doc = concat!("An owned signal of the loss of any ", $each, ", for another task.")]
        pub fn lost_signal(&self) -> crate::LostSignal {
            crate::LostSignal::of(self.holds())
        }

        #[doc = concat!("Until when every ", $each, " is guaranteed: the earliest one's ")]
        /// [`valid_until`](crate::LockGuard::valid_until); `None` if any has none.
        pub fn valid_until(&self) -> Option<std::time::Instant> {
            // `None` orders first: any without an instant makes it `None`.
            self.parts()
                .map(crate::LockGuard::valid_until)
                .min()
                .flatten()
        }

        #[doc = concat!("`Ok` when every ", $each, " can be acted on now (see [`LockGuard::check`](crate::LockGuard::check)).")]
        pub fn check(&self) -> dlock_spi::Result<()> {
            self.parts().try_for_each(crate::LockGuard::check)
        }
    };
}
pub(crate) use parts_accessors;

/// `check()` of a hold: lost, past its guaranteed instant, or suspended.
fn check_hold(hold: &Hold) -> Result<()> {
    check_lost(hold)?;
    if hold.is_suspended() {
        return Err(Error::new(
            ErrorKind::Backend,
            "the hold is suspended (the backend's connection is down, or its own lease passed into the transition window); it may still be held but must not be acted on — wait until it clears or the loss fires",
        )
        .with_context("lock", &hold.name));
    }
    Ok(())
}

/// An error if the hold is lost or past its guaranteed instant.
pub(crate) fn check_lost(hold: &Hold) -> Result<()> {
    if let Some(reason) = hold.lost_reason() {
        return Err(lost_error(&hold.name, reason));
    }
    if hold
        .valid_until()
        .is_some_and(|until| Instant::now() >= until)
    {
        return Err(past_error(&hold.name));
    }
    Ok(())
}

fn past_error(name: &LockName) -> Error {
    Error::new(
        ErrorKind::LockLost,
        "the hold is past the instant it was guaranteed until (no renewal succeeded in time); its loss is being signalled — stop the protected work",
    )
    .with_context("lock", name)
}

fn lost_error(name: &LockName, reason: LostReason) -> Error {
    Error::new(
        ErrorKind::LockLost,
        format!(
            "the lock was lost while held ({reason}); work done under it may have overlapped another holder's — guard writes with the fencing token"
        ),
    )
    .with_context("lock", name)
}
