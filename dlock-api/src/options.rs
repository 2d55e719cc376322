//! How one acquisition is made: [`LockOptions`].

use std::time::Duration;

use bytes::Bytes;
use dlock_spi::{Error, Result};

/// What one acquisition asks for beyond its wait — a fixed lease, a bound on how
/// long it may be held, what to store about the holder — for
/// [`DistributeLock::try_lock_with`](crate::DistributeLock::try_lock_with) and
/// [`lock_with`](crate::DistributeLock::lock_with). Unset fields take the manager's
/// settings.
///
/// A reentrant acquisition shares the hold its handle already has, and with it
/// that hold's lease, bound and context: options apply to the acquisition that
/// reaches the backend.
///
/// ```
/// # async fn demo() -> dlock_api::Result<()> {
/// use std::time::Duration;
/// use dlock_api::{DistributeLockManager, LockOptions};
///
/// let manager = DistributeLockManager::connect("memory://").await?;
/// let options = LockOptions::new()
///     .max_hold(Duration::from_secs(60))         // never longer than a minute
///     .context("job=nightly-report host=web-3"); // shown by inspect / dlock status
/// let lock = manager.lock("reports");
/// if let Some(guard) = lock.try_lock_with(Duration::ZERO, &options).await? {
///     assert_eq!(manager.inspect("reports").await?.unwrap().holders[0].context, "job=nightly-report host=web-3");
///     guard.unlock().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct LockOptions {
    pub(crate) lease: Option<Duration>,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) context: Option<Bytes>,
}

impl LockOptions {
    /// The manager's settings.
    pub fn new() -> Self {
        LockOptions::default()
    }

    /// A fixed lease that the watchdog does not renew: the lock frees itself when
    /// it ends and the guard's lost signal fires a loss margin before. Refused with
    /// `Unsupported` on session-bound backends (ZooKeeper).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// The longest this acquisition is held: at `max_hold` after the grant, the
    /// watchdog stops renewing it, the lost signal fires with
    /// [`LostReason::MaxHold`](crate::LostReason::MaxHold) (before the store's lease
    /// runs out) and the hold is given back. Overrides the manager's
    /// [`max_hold`](crate::DistributeLockManagerBuilder::max_hold).
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// The bytes stored with this hold instead of the manager's context (at most
    /// [`MAX_CONTEXT_LEN`](crate::spi::MAX_CONTEXT_LEN)): who holds it and why,
    /// shown by [`inspect`](crate::DistributeLockManager::inspect) (to see who holds
    /// a lock `try_lock` was refused) and `dlock status`.
    pub fn context(mut self, context: impl Into<Bytes>) -> Self {
        self.context = Some(context.into());
        self
    }
}

/// Checks a `max_hold` bound.
pub(crate) fn check_max_hold(max_hold: Duration) -> Result<()> {
    if max_hold.is_zero() {
        return Err(Error::invalid_argument(
            "max_hold is zero; give the longest a hold may last, e.g. 10 minutes",
        ));
    }
    Ok(())
}
