//! The manager: one per backend connection, handing out locks (each primitive's
//! constructor lives beside it: `lock`, `read_write_lock`, `semaphore`, …; the
//! shared machinery in [`crate::inner`]).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use dlock_spi::{
    lease_out_of_range, Capabilities, Error, ErrorKind, HandlerChain, IntoResource, LockHandler,
    LockName, LockRemoteResource, LockState, Result,
};

use crate::inner::{Config, ManagerInner};

/// Hands out distributed locks backed by one [`LockRemoteResource`], passing every
/// acquire and release through the handler chain.
///
/// Cheap to clone; clones share the backend, the chain and the watchdog.
///
/// ```
/// # async fn demo() -> dlock_spi::Result<()> {
/// use std::time::Duration;
/// use dlock_api::DistributeLockManager;
///
/// let manager = DistributeLockManager::connect("memory://").await?;
/// let lock = manager.lock("orders:42");
/// if let Some(guard) = lock.try_lock(Duration::from_secs(1)).await? {
///     println!("fencing token {}", guard.fencing_token());
///     guard.unlock().await?;
/// }
/// manager.close().await;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct DistributeLockManager {
    pub(crate) inner: Arc<ManagerInner>,
}

impl DistributeLockManager {
    /// Starts building a manager over `resource`: a backend crate's value (one
    /// built on the application's own pool or client, say), or the one a URL opens
    /// to ([`open_backend`](crate::open_backend)).
    ///
    /// ```
    /// # async fn demo() -> dlock_api::Result<()> {
    /// use std::time::Duration;
    /// use dlock_api::{open_backend, DistributeLockManager};
    ///
    /// let manager = DistributeLockManager::builder(open_backend("memory://").await?)
    ///     .lease(Duration::from_secs(10))
    ///     .namespace("billing:")
    ///     .build()?;
    /// # let _ = manager; Ok(()) }
    /// ```
    pub fn builder(resource: impl IntoResource) -> DistributeLockManagerBuilder {
        DistributeLockManagerBuilder::new(resource.into_resource())
    }

    /// Opens the backend a URL names (see [`crate::open_backend`]) and builds a manager
    /// with default settings: `builder(open_backend(url).await?).build()`.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before it completes, nothing is held and the
    /// connections opened so far are dropped with it.
    pub async fn connect(url: &str) -> Result<Self> {
        let resource = crate::connect::open_backend(url).await?;
        DistributeLockManagerBuilder::new(resource).build()
    }

    /// Who holds `name` and how many wait, straight from the backend (bounded by
    /// the operation timeout).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn inspect(&self, name: impl std::fmt::Display) -> Result<Option<LockState>> {
        let name = self.inner.full_name(name)?;
        self.inner.chain.inspect(&name).await
    }

    /// The backend's capabilities.
    pub fn capabilities(&self) -> Capabilities {
        self.inner.capabilities
    }

    /// The backend's short name (`"memory"`, `"redis"`, …).
    pub fn backend_name(&self) -> &'static str {
        self.inner.chain.resource().backend_name()
    }

    /// This manager's random id, the prefix of every owner it creates.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// How many locks this manager holds right now (reentrant holds count once).
    pub fn held_count(&self) -> usize {
        self.inner.holds().len()
    }

    /// How many held locks the watchdog is watching.
    pub fn watched_count(&self) -> usize {
        self.inner.watchdog.watched()
    }

    /// Whether [`close`](Self::close) has been called.
    pub fn is_closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// Stops the watchdog, wakes every waiting `lock()` with [`ErrorKind::Closed`],
    /// releases every lock still held (their guards' lost signals fire with
    /// [`LostReason::ManagerClosed`](dlock_spi::LostReason::ManagerClosed)), and refuses new acquires. Idempotent.
    ///
    /// # Cancel safety
    ///
    /// Every guard reports its hold lost before the first await; dropped later, the
    /// releases not yet sent are left to expire on the server.
    pub async fn close(&self) {
        self.inner.close().await;
    }
}

impl fmt::Debug for DistributeLockManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DistributeLockManager")
            .field("id", &self.inner.id)
            .field("backend", &self.backend_name())
            .field("config", &self.inner.config)
            .field("held", &self.held_count())
            .finish()
    }
}

/// Builds a [`DistributeLockManager`].
///
/// Defaults: lease 30 s renewed by the watchdog every 10 s, no namespace, context
/// `pid=<pid>`, 10 s bound on each backend call beyond the caller's wait. (Locks are
/// non-fair unless taken by [`fair_lock`](DistributeLockManager::fair_lock) or
/// [`fair_read_write_lock`](DistributeLockManager::fair_read_write_lock).)
///
/// # Handler order
///
/// Handlers run in the order they are registered: `with_handler(a).with_handler(b)`
/// gives `Head → a → b → Tail → backend` on the way in, and `b` then `a` see the
/// result on the way out. Put flow control after logging and metrics if rejected calls
/// should still be logged and counted.
pub struct DistributeLockManagerBuilder {
    resource: Arc<dyn LockRemoteResource>,
    handlers: Vec<Arc<dyn LockHandler>>,
    config: Config,
    operation_timeout: Duration,
}

impl DistributeLockManagerBuilder {
    /// A builder over a shared backend.
    fn new(resource: Arc<dyn LockRemoteResource>) -> Self {
        DistributeLockManagerBuilder {
            resource,
            handlers: Vec::new(),
            config: Config {
                lease: Duration::from_secs(30),
                watchdog: true,
                namespace: String::new(),
                context: Bytes::from(format!("pid={}", std::process::id())),
                loss_margin: None,
                max_hold: None,
            },
            operation_timeout: HandlerChain::DEFAULT_OPERATION_TIMEOUT,
        }
    }

    /// Appends a handler to the chain (see the type docs for the order).
    pub fn with_handler<H: LockHandler>(self, handler: H) -> Self {
        self.with_shared_handler(Arc::new(handler))
    }

    /// Appends an already shared handler to the chain.
    pub fn with_shared_handler(mut self, handler: Arc<dyn LockHandler>) -> Self {
        self.handlers.push(handler);
        self
    }

    /// The lease of locks taken without an explicit one; the watchdog renews it every
    /// lease/3 while the lock is held.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = lease;
        self
    }

    /// Whether the watchdog renews locks taken without an explicit lease (default on).
    /// Off: such locks expire after the default lease like explicit-lease locks.
    pub fn watchdog(mut self, enabled: bool) -> Self {
        self.config.watchdog = enabled;
        self
    }

    /// A prefix put in front of every lock name, so applications sharing a store do
    /// not collide (e.g. `"billing:"`).
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.config.namespace = namespace.into();
        self
    }

    /// Bytes stored with every hold and shown by `inspect` / `dlock status`.
    pub fn context(mut self, context: impl Into<Bytes>) -> Self {
        self.config.context = context.into();
        self
    }

    /// How long before the store may expire a lease-based hold its guard's lost signal
    /// fires (counted from the send time of the last successful acquire or renewal).
    ///
    /// Default: 1 % of the lease (clock-rate drift), raised to the backend's observed
    /// renewal round trip when that is longer. The signal is scheduled 10 ms before
    /// the margin (timer and scheduling delay), and never more than a third of the
    /// lease before its end. A larger margin buys time to stop protected work
    /// before anyone else can be granted the lock; see SAFETY.md for what each
    /// backend guarantees. No effect on session-bound backends (ZooKeeper), whose
    /// holds end with the session.
    pub fn loss_margin(mut self, margin: Duration) -> Self {
        self.config.loss_margin = Some(margin);
        self
    }

    /// The longest any lock or semaphore permit of this manager is held (leaderships
    /// are not bounded): at `max_hold` after it was granted, the watchdog stops
    /// renewing it, its lost signal fires with [`LostReason::MaxHold`](dlock_spi::LostReason::MaxHold) — before the
    /// store's lease runs out — and it is given back. For services whose process may
    /// stay alive but stuck, where a lock must not be held forever. Per acquisition:
    /// [`LockOptions::max_hold`](crate::LockOptions::max_hold). Default: none.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.config.max_hold = Some(max_hold);
        self
    }

    /// The bound on one backend call beyond the caller's wait (default 10 s).
    pub fn operation_timeout(mut self, timeout: Duration) -> Self {
        self.operation_timeout = timeout;
        self
    }

    /// Checks the settings and builds the manager.
    pub fn build(self) -> Result<DistributeLockManager> {
        let lease = self.config.lease;
        if let Some(why) = lease_out_of_range(lease) {
            return Err(Error::new(
                ErrorKind::Config,
                format!("default lease {why} (30 s is usual)"),
            ));
        }
        if let Some(max_hold) = self.config.max_hold {
            crate::lock::check_max_hold(max_hold)
                .map_err(|e| Error::new(ErrorKind::Config, e.message().to_owned()))?;
        }
        if !self.resource.capabilities().lease && !self.config.watchdog {
            return Err(Error::unsupported(format!(
                "the {} backend ties holds to its session, not to a lease: there is no watchdog to turn off; leave watchdog(true)",
                self.resource.backend_name()
            )));
        }
        if self.operation_timeout.is_zero() {
            return Err(Error::new(
                ErrorKind::Config,
                "operation timeout is zero; use a positive bound such as 10 s",
            ));
        }
        if !self.config.namespace.is_empty() {
            LockName::new(&self.config.namespace).map_err(|e| {
                Error::new(
                    ErrorKind::Config,
                    format!("namespace is not a valid name prefix: {}", e.message()),
                )
            })?;
        }
        let chain = HandlerChain::new(self.resource, self.handlers)
            .with_operation_timeout(self.operation_timeout);
        let capabilities = chain.capabilities();
        Ok(DistributeLockManager {
            inner: Arc::new(ManagerInner::new(chain, capabilities, self.config)),
        })
    }
}

impl fmt::Debug for DistributeLockManagerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DistributeLockManagerBuilder")
            .field("backend", &self.resource.backend_name())
            .field("handlers", &self.handlers.len())
            .field("config", &self.config)
            .finish()
    }
}
