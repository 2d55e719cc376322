//! # dlock — distributed locks for Rust services
//!
//! One API over the store you already run, with an interceptor chain for logging,
//! metrics and flow control.
//!
//! ```no_run
//! # async fn demo() -> dlock_api::Result<()> {
//! use std::time::Duration;
//! use dlock_api::DistributeLockManager;
//!
//! let manager = DistributeLockManager::connect("memory://").await?;
//! let lock = manager.lock("orders:42");
//! if let Some(guard) = lock.try_lock(Duration::from_secs(1)).await? {
//!     // Hand the token to the store you write to; it refuses stale writers.
//!     let token = guard.fencing_token();
//!     tokio::select! {
//!         _ = do_work(token.get()) => {}
//!         reason = guard.lost() => eprintln!("lock lost ({reason}); abandoning work"),
//!     }
//!     guard.unlock().await?;
//! }
//! # Ok(()) }
//! # async fn do_work(_t: u64) {}
//! ```
//!
//! ## What you get
//!
//! * [`DistributeLockManager`] — [`connect`](DistributeLockManager::connect)`(url)`,
//!   or [`builder`](DistributeLockManager::builder)`(backend)` over any
//!   [`LockRemoteResource`] (a [`DistributeLockManagerBuilder`]).
//! * [`DistributeLock`] — `lock()`, `try_lock(wait)` and their `lock_with` /
//!   `try_lock_with` forms taking [`LockOptions`] (a fixed lease too); reentrant per
//!   handle; fair or not; per-acquisition [`LockOptions`] (lease, `max_hold`,
//!   holder context). [`ReadWriteLock`] (one owner for its read, write and
//!   upgradeable sides: a writer reads and downgrades, an [`UpgradeableReadGuard`]
//!   upgrades without a writer in between), [`LockGroup`] (one lock per key,
//!   cached), [`MultiLock`] (all or none).
//! * [`LockGuard`] — fencing token, lost signal, `unlock().await`, release on drop;
//!   `valid_until()`, `check()`, `extend(lease)`, `acquisition()`.
//! * [`Election`] — leader election (etcd's `campaign` / `leader` / `observe` /
//!   `proclaim` / `resign`), and [`Election::contend`] — Simba's
//!   contention service calling a [`Contender`] as leadership comes and goes.
//! * [`Semaphore`] — N permits per name; each [`SemaphorePermit`] is a hold with a
//!   lease, fencing token and lost signal.
//! * [`Hold`] — what a lock guard, a permit, a leadership and an upgradeable read
//!   share (fencing token, lost signal, `valid_until`, `check`, `release`), for code
//!   generic over what it holds.
//! * A watchdog per manager that renews held locks every lease/3 and fires the lost
//!   signal when a renewal is refused or the lease passes without one.
//!
//! ## Guarantees, stated plainly
//!
//! A lease-based lock is safe only while its holder renews in time. A process that
//! stalls longer than its lease (GC pause, SIGSTOP, partition) can keep running while
//! another holds the lock; the lost signal tells it as soon as this process can know,
//! and the fencing token lets the protected resource reject its late writes.
//!
//! A ZooKeeper lock is tied to its client's session instead of a lease. The guard is
//! *suspended* ([`LockGuard::is_suspended`]) while the connection is down, and lost
//! once the session expires or stays disconnected for 0.4 × its timeout — before the
//! server can expire the session and grant the lock to someone else, given equal clock
//! rates and round trips plus timer delays under 15 % of the session timeout (see
//! `dlock-zk`).
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod connect;
mod election;
mod group;
mod guard;
mod handle;
mod hold;
mod holds;
mod ids;
mod inner;
mod lock;
mod manager;
mod multi;
mod options;
mod rwlock;
mod semaphore;
#[cfg(feature = "tower")]
pub mod tower;
mod watchdog;

pub use connect::{open_backend, open_existing_backend, ExistingBackend, SUPPORTED};
pub use dlock_spi::redact_url;

/// The SQL backend (features `sqlite`, `mysql`, `postgres`).
#[cfg(any(feature = "sqlite", feature = "mysql", feature = "postgres"))]
pub use dlock_jdbc as jdbc;

/// The Redis backend (feature `redis`).
#[cfg(feature = "redis")]
pub use dlock_redis as redis;

/// The etcd backend (feature `etcd`; building it needs `protoc`).
#[cfg(feature = "etcd")]
pub use dlock_etcd as etcd;
/// The NATS JetStream backend (feature `nats`).
#[cfg(feature = "nats")]
pub use dlock_nats as nats;
/// The ZooKeeper backend (feature `zk`).
#[cfg(feature = "zk")]
pub use dlock_zk as zk;

/// The logging plugin: [`LoggingHandler`](dlock_plugin_logging::LoggingHandler)
/// (feature `logging`).
#[cfg(feature = "logging")]
pub use dlock_plugin_logging as logging;

/// The metrics plugin: [`MetricsHandler`](dlock_plugin_metrics::MetricsHandler), its
/// names, labels and [`SECONDS_BUCKETS`](dlock_plugin_metrics::SECONDS_BUCKETS)
/// (feature `metrics`).
#[cfg(feature = "metrics")]
pub use dlock_plugin_metrics as metrics;

/// Flow control and hot-lock coalescing:
/// [`FlowControlHandler`](dlock_plugin_flow_control::FlowControlHandler),
/// [`CoalescingHandler`](dlock_plugin_flow_control::CoalescingHandler) (feature
/// `flow-control`).
#[cfg(feature = "flow-control")]
pub use dlock_plugin_flow_control as flow_control;
pub use election::{
    Contender, Contention, Election, Leader, LeaderObserver, Leadership, Term, TermEnd,
    DEFAULT_OBSERVE_INTERVAL, DEFAULT_STOP_GRACE,
};
pub use group::{LockGroup, DEFAULT_GROUP_CAPACITY, DEFAULT_GROUP_IDLE};
pub use guard::{Acquisition, LockGuard, LostSignal};
pub use holds::Hold;
pub use lock::DistributeLock;
pub use manager::{DistributeLockManager, DistributeLockManagerBuilder};
pub use multi::{MultiGuard, MultiLock};
pub use options::LockOptions;
pub use rwlock::{ReadWriteLock, UpgradeableReadGuard, UpgradeableReadLock, UPGRADEABLE_SUFFIX};
pub use semaphore::{Semaphore, SemaphorePermit};

pub use dlock_spi::{
    AcquireResult, Backoff, Capabilities, Error, ErrorKind, Fairness, FencingToken, HolderInfo,
    InMemoryBackend, LockAdmin, LockHandler, LockMode, LockName, LockRemoteResource, LockState,
    LostReason, OwnerId, Result,
};

/// The SPI crate, for handler and backend authors.
pub use dlock_spi as spi;

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
