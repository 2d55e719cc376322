//! [`Hold`]: what every kind of hold shares, so code can be generic over them.

use std::future::Future;
use std::time::Instant;

use dlock_spi::{FencingToken, Result};

use crate::election::Leadership;
use crate::guard::{LockGuard, LostSignal};
use crate::rwlock::UpgradeableReadGuard;
use crate::semaphore::SemaphorePermit;

/// Something held on one name until released or lost: a [`LockGuard`], a
/// [`SemaphorePermit`], a [`Leadership`] or an [`UpgradeableReadGuard`]. Each has
/// the same methods of its own; the trait lets code hold any of them — run a job
/// while holding, fence its writes, stop when the hold is lost, give it back.
///
/// A [`MultiGuard`](crate::MultiGuard) is not one: it holds several names, and a
/// fencing token is a name's (each name's tokens grow on their own, so no one
/// token fences the resources of several) — its
/// [`guards`](crate::MultiGuard::guards) are the holds, a token each.
///
/// The trait is sealed: dlock's hold types implement it, so methods can be added.
///
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock_api::Result<()> {
/// use dlock_api::{DistributeLockManager, Hold};
///
/// async fn while_held(hold: impl Hold) -> dlock_api::Result<()> {
///     let lost = hold.lost_signal();
///     tokio::select! {
///         reason = lost.lost() => println!("lost: {reason}"),
///         () = job(hold.fencing_token().get()) => {}
///     }
///     hold.release().await
/// }
/// # async fn job(_token: u64) {}
///
/// let manager = DistributeLockManager::connect("memory://").await?;
/// while_held(manager.lock("report").lock().await?).await?;
/// while_held(manager.semaphore("workers", 4).acquire(1).await?).await?;
/// while_held(manager.election("leader").campaign("node-a").await?).await?;
/// for name in ["report", "workers", "leader"] {
///     assert!(manager.inspect(name).await?.is_none(), "{name} given back");
/// }
/// # Ok(()) }
/// ```
pub trait Hold: sealed::Sealed + Send + Sync + 'static {
    /// The fencing token: greater than every earlier grant's of the same name
    /// (where the backend has fencing). An [`UpgradeableReadGuard`]'s is its write
    /// side's once upgraded, else its read hold's.
    fn fencing_token(&self) -> FencingToken;

    /// An owned signal of the hold's loss, for another task. An
    /// [`UpgradeableReadGuard`]'s covers the holds it has when asked: ask again
    /// after an upgrade to cover the write side too.
    fn lost_signal(&self) -> LostSignal;

    /// Until when the hold is guaranteed (see [`LockGuard::valid_until`]); `None`
    /// for a session-bound one (ZooKeeper). Of several parts, the earliest.
    fn valid_until(&self) -> Option<Instant>;

    /// `Ok` when the hold can be acted on now: not lost, not past
    /// [`valid_until`](Self::valid_until), not suspended (see
    /// [`LockGuard::check`]).
    fn check(&self) -> Result<()>;

    /// Gives the hold back and reports: [`LockGuard::unlock`],
    /// [`SemaphorePermit::release`], [`Leadership::resign`],
    /// [`UpgradeableReadGuard::unlock`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before it completes, the release goes on in the
    /// background (as each type's own).
    fn release(self) -> impl Future<Output = Result<()>> + Send
    where
        Self: Sized;
}

/// Only dlock's hold types implement [`Hold`].
mod sealed {
    pub trait Sealed {}
}

/// Implements [`Hold`] for `$ty` over its own methods, `$release` giving it back.
macro_rules! hold_over_inherent {
    ($ty:ty, $release:ident) => {
        impl sealed::Sealed for $ty {}

        impl Hold for $ty {
            fn fencing_token(&self) -> FencingToken {
                <$ty>::fencing_token(self)
            }

            fn lost_signal(&self) -> LostSignal {
                <$ty>::lost_signal(self)
            }

            fn valid_until(&self) -> Option<Instant> {
                <$ty>::valid_until(self)
            }

            fn check(&self) -> Result<()> {
                <$ty>::check(self)
            }

            fn release(self) -> impl Future<Output = Result<()>> + Send {
                <$ty>::$release(self)
            }
        }
    };
}

hold_over_inherent!(LockGuard, unlock);
hold_over_inherent!(SemaphorePermit, release);
hold_over_inherent!(Leadership, resign);
hold_over_inherent!(UpgradeableReadGuard, unlock);
