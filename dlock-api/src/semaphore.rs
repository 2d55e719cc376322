//! Semaphores: a name with N permits; each acquisition takes some of them and is a
//! hold like a lock guard's — lease renewed by the watchdog, fencing token, lost
//! signal, released on drop, cancel-safe.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use dlock_spi::{Error, Fairness, LockMode, LockName, Result};

use crate::guard::{hold_accessors, LockGuard};
use crate::handle::HoldSpec;
use crate::lock::DistributeLock;
use crate::manager::DistributeLockManager;
use crate::options::LockOptions;

/// A distributed semaphore: at most [`permits`](Self::permits) permits are held at
/// once across all clients. Waiters are served in arrival order (a request for many
/// permits is not starved by requests for few); a holder that dies gives its permits
/// back when its lease runs out (its session ends, on ZooKeeper).
///
/// The total is a property of the semaphore while it is in use: every client must
/// name the same total; a different one is refused with
/// [`crate::ErrorKind::InvalidArgument`] while anyone holds permits (memory, SQL and
/// etcd: or waits for them), and takes effect once the semaphore is idle.
///
/// Every backend has semaphores but Redlock and the SQL session modes, which refuse them with
/// [`crate::ErrorKind::Unsupported`] (permits counted on each node do not add up
/// across quorums). On ZooKeeper they are Curator's `InterProcessSemaphoreV2` (Java
/// services and dlock share one); a name is a lock or a semaphore, not both.
///
/// ```
/// # async fn demo() -> dlock_api::Result<()> {
/// use std::time::Duration;
/// use dlock_api::DistributeLockManager;
///
/// let manager = DistributeLockManager::connect("memory://").await?;
/// let pool = manager.semaphore("db-connections", 10);
/// let permit = pool.acquire(2).await?;             // waits for 2 of the 10
/// assert!(pool.try_acquire(9, Duration::ZERO).await?.is_none());
/// permit.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Semaphore {
    manager: DistributeLockManager,
    /// The full name, checked once (each acquisition is a holder of its own on it).
    full_name: Arc<Result<LockName>>,
    permits: u32,
}

impl Semaphore {
    pub(crate) fn new(
        manager: DistributeLockManager,
        name: impl fmt::Display,
        permits: u32,
    ) -> Self {
        Semaphore {
            full_name: Arc::new(manager.inner.full_name(name)),
            manager,
            permits,
        }
    }

    /// The semaphore's total permits.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The full (namespaced) name, or why it is invalid.
    pub fn name(&self) -> Result<&LockName> {
        self.full_name.as_ref().as_ref().map_err(Error::duplicate)
    }

    /// A new holder of `n` permits (the chain's head checks `n` against the total).
    fn holder(&self, n: u32) -> DistributeLock {
        let inner = &self.manager.inner;
        let spec = HoldSpec {
            capacity: self.permits,
            ..HoldSpec::lock(&inner.config)
        };
        DistributeLock::with_spec(
            Arc::clone(inner),
            self.name().cloned(),
            LockMode::Permits(n),
            Fairness::Fair,
            spec,
        )
    }

    /// Waits until `n` permits are free and takes them (renewed by the watchdog
    /// until released). Fails with [`crate::ErrorKind::Closed`] when the manager closes.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped while waiting, the request leaves the queue (the next
    /// waiter may go); dropped after the backend may have granted, the permits are
    /// given back in the background.
    pub async fn acquire(&self, n: u32) -> Result<SemaphorePermit> {
        self.acquire_with(n, &LockOptions::new()).await
    }

    /// Like [`acquire`](Self::acquire), with this acquisition's own options (the
    /// holder context `inspect` shows, a `max_hold` bound, a fixed lease).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    pub async fn acquire_with(&self, n: u32, options: &LockOptions) -> Result<SemaphorePermit> {
        let guard = self.holder(n).lock_with(options).await?;
        Ok(SemaphorePermit { guard, n })
    }

    /// Like [`acquire`](Self::acquire), giving up after `wait` (`Ok(None)`).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    pub async fn try_acquire(&self, n: u32, wait: Duration) -> Result<Option<SemaphorePermit>> {
        self.try_acquire_with(n, wait, &LockOptions::new()).await
    }

    /// Like [`try_acquire`](Self::try_acquire), with this acquisition's own options.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    pub async fn try_acquire_with(
        &self,
        n: u32,
        wait: Duration,
        options: &LockOptions,
    ) -> Result<Option<SemaphorePermit>> {
        let guard = self.holder(n).try_lock_with(wait, options).await?;
        Ok(guard.map(|guard| SemaphorePermit { guard, n }))
    }

    /// How many permits are held now, straight from the backend.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn held(&self) -> Result<u32> {
        let state = self.manager.inner.chain.inspect(self.name()?).await?;
        Ok(state
            .map(|s| s.holders.iter().filter_map(|h| h.mode.permits()).sum())
            .unwrap_or(0))
    }
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.name().ok())
            .field("permits", &self.permits)
            .finish()
    }
}

/// Permits held; from [`Semaphore::acquire`]. Release with
/// [`release`](Self::release); dropping it releases in the background.
#[must_use = "dropping the permit releases it at once"]
pub struct SemaphorePermit {
    guard: LockGuard,
    n: u32,
}

impl SemaphorePermit {
    /// How many permits this holds.
    pub fn permits(&self) -> u32 {
        self.n
    }

    hold_accessors!("the permits");

    /// Gives the permits back; the next waiter is woken.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before it completes, the release goes on in the
    /// background.
    ///
    /// Errors as [`LockGuard::unlock`].
    pub async fn release(self) -> Result<()> {
        self.guard.unlock().await
    }
}

impl fmt::Debug for SemaphorePermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SemaphorePermit")
            .field("name", self.guard.name())
            .field("permits", &self.n)
            .field("token", &self.fencing_token())
            .field("lost", &self.lost_reason())
            .finish()
    }
}

/// The manager's constructor of this primitive.
impl crate::DistributeLockManager {
    /// The semaphore `name` with `permits` permits in total (every client must name
    /// the same total while it is in use; see [`Semaphore`]). Needs a backend with
    /// semaphores ([`Capabilities::semaphore`](dlock_spi::Capabilities::semaphore)); others refuse its acquires with
    /// [`ErrorKind::Unsupported`](dlock_spi::ErrorKind::Unsupported).
    pub fn semaphore(&self, name: impl fmt::Display, permits: u32) -> Semaphore {
        Semaphore::new(self.clone(), name, permits)
    }
}
