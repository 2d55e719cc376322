//! Read-write locks: one owner for the read, write and upgradeable sides.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock_spi::{Error, Fairness, FencingToken, LockMode, LockName, Result};

use crate::guard::{parts_accessors, LockGuard};
use crate::handle::{HoldSpec, Place, Side, Slot};
use crate::inner::ManagerInner;
use crate::lock::DistributeLock;
use crate::options::LockOptions;

/// What the upgradeable side's lock name adds to the read-write lock's name. The
/// upgradeable hold is an exclusive lock of its own on `<name>` + this suffix (so
/// one upgradeable reader at a time), beside a read hold of `<name>`.
pub const UPGRADEABLE_SUFFIX: &str = "::upgradeable";

/// A read-write lock (ylock's, Java's `ReentrantReadWriteLock`, DistributedLock's
/// upgradeable one): [`read`](Self::read) holders share the lock, a
/// [`write`](Self::write) holder has it alone, and an
/// [`upgradeable_read`](Self::upgradeable_read) holder reads beside the plain readers
/// but can turn into the writer without letting another writer in between. Queued
/// writers are not starved by a stream of readers.
///
/// **One owner for every side**, shared by the handle's clones:
/// - reentrant in both modes (a side's guards share its hold, as a
///   [`DistributeLock`]'s do);
/// - a writer may take the read side (it is granted at once, beside the write
///   hold), and so **downgrade** without releasing: take the read side, then let the
///   write side go ([`LockGuard::downgrade`]) — no other writer gets in between;
/// - a plain reader may *not* take the write side, nor the upgradeable side (two
///   readers doing so would wait for each other forever): both are refused with
///   [`ErrorKind::InvalidArgument`](dlock_spi::ErrorKind::InvalidArgument). Release
///   the read, then take the upgradeable side and
///   [`upgrade`](UpgradeableReadGuard::upgrade) it.
///
/// For mutual exclusion between tasks of one process, give each task its own
/// `ReadWriteLock` from
/// [`DistributeLockManager::read_write_lock`](crate::DistributeLockManager::read_write_lock).
///
/// Backends need [`Capabilities::cross_mode`](dlock_spi::Capabilities::cross_mode)
/// for a writer's read and a downgrade, and
/// [`Capabilities::upgrade`](dlock_spi::Capabilities::upgrade) for the upgradeable
/// side: memory, SQL's row mode, Redis (single, Cluster, Sentinel) and ZooKeeper
/// have both; etcd, NATS, Redlock and the SQL session modes neither. Without, those
/// are refused with `Unsupported`.
///
/// ```
/// # async fn demo(manager: dlock_api::DistributeLockManager) -> dlock_api::spi::Result<()> {
/// let doc = manager.read_write_lock("doc:7");
/// let write = doc.write().lock().await?;
/// // ... write, then keep reading without letting another writer in:
/// let read = write.downgrade().await?;
/// drop(read);
///
/// let mut maybe = doc.upgradeable_read().lock().await?;
/// // ... read beside plain readers; decide to write:
/// maybe.upgrade().await?;
/// // ... write: nobody else has written since the read.
/// maybe.unlock().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ReadWriteLock {
    read: DistributeLock,
    write: DistributeLock,
    upgradeable: UpgradeableReadLock,
    /// How many references the read, write and upgradeable sides' handles have
    /// from one value of this lock alone (the sides refer to each other).
    baseline: [usize; 3],
}

impl ReadWriteLock {
    pub(crate) fn new(
        manager: Arc<ManagerInner>,
        name: Result<LockName>,
        fairness: Fairness,
    ) -> Self {
        let owner = manager.new_owner();
        let write_slot: Slot = Arc::new(Mutex::new(None));
        let upgrade_slot: Slot = Arc::new(Mutex::new(None));
        let family = Arc::new(tokio::sync::watch::Sender::new(0u64));
        let spec = HoldSpec::lock(&manager.config);
        let upgrade_name = name.as_ref().map_err(Error::duplicate).and_then(|n| {
            LockName::new(format!("{n}{UPGRADEABLE_SUFFIX}")).map_err(|e| {
                Error::new(
                    e.kind(),
                    format!(
                        "{} (the upgradeable side locks the name with {UPGRADEABLE_SUFFIX:?} appended; use a name at most {} bytes long)",
                        e.message(),
                        LockName::MAX_LEN - UPGRADEABLE_SUFFIX.len()
                    ),
                )
            })
        });
        let read = DistributeLock::with_place(
            Arc::clone(&manager),
            name.as_ref().cloned().map_err(Error::duplicate),
            LockMode::Shared,
            fairness,
            spec.clone(),
            Place {
                owner: owner.clone(),
                current: Arc::new(Mutex::new(None)),
                side: Side::Read {
                    write: Arc::clone(&write_slot),
                },
                family: Some(Arc::clone(&family)),
            },
        );
        let write = DistributeLock::with_place(
            Arc::clone(&manager),
            name,
            LockMode::Exclusive,
            fairness,
            spec.clone(),
            Place {
                owner: owner.clone(),
                current: write_slot,
                side: Side::Write {
                    read: Arc::clone(read.handle()),
                    upgrade: Arc::clone(&upgrade_slot),
                },
                family: Some(Arc::clone(&family)),
            },
        );
        let upgrade = DistributeLock::with_place(
            manager,
            upgrade_name,
            LockMode::Exclusive,
            fairness,
            spec,
            Place {
                owner,
                current: upgrade_slot,
                side: Side::Alone,
                family: Some(family),
            },
        );
        let mut rw = ReadWriteLock {
            upgradeable: UpgradeableReadLock {
                upgrade,
                read: read.clone(),
                write: write.clone(),
            },
            read,
            write,
            baseline: [0; 3],
        };
        rw.baseline = rw.references();
        rw
    }

    fn references(&self) -> [usize; 3] {
        [
            Arc::strong_count(self.read.handle()),
            Arc::strong_count(self.write.handle()),
            Arc::strong_count(self.upgradeable.upgrade.handle()),
        ]
    }

    /// Whether nothing but this value refers to the lock: no clone, no guard (of any
    /// side), no hold kept by an upgrade.
    pub(crate) fn is_unshared(&self) -> bool {
        self.references() == self.baseline
    }

    /// The shared side.
    pub fn read(&self) -> &DistributeLock {
        &self.read
    }

    /// The exclusive side. Taken while this owner holds the upgradeable side, it is
    /// that hold's upgrade (see [`UpgradeableReadGuard::upgrade`]).
    pub fn write(&self) -> &DistributeLock {
        &self.write
    }

    /// The upgradeable side: a read that excludes writers and other upgradeable
    /// readers, admits plain readers, and can be upgraded to the write side.
    pub fn upgradeable_read(&self) -> &UpgradeableReadLock {
        &self.upgradeable
    }
}

impl fmt::Debug for ReadWriteLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadWriteLock")
            .field("read", &self.read)
            .field("write", &self.write)
            .field("upgradeable", &self.upgradeable.upgrade)
            .finish()
    }
}

/// A read-write lock's upgradeable side (see
/// [`ReadWriteLock::upgradeable_read`]): DistributedLock's upgradeable read lock.
///
/// Held, it is two holds of its owner: the exclusive lock `<name>::upgradeable`
/// (one upgradeable reader at a time) and a read hold of `<name>` (writers stay
/// out, plain readers come and go). Its upgrade is a write hold of `<name>` beside
/// that read hold: it waits for the other readers to leave, new readers stand back
/// for it, and no writer can take the lock in between, as the read hold is kept
/// throughout.
#[derive(Clone)]
pub struct UpgradeableReadLock {
    upgrade: DistributeLock,
    read: DistributeLock,
    write: DistributeLock,
}

impl UpgradeableReadLock {
    /// Waits until the upgradeable side is held.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped while waiting, it leaves nothing held (a hold already
    /// taken is given back) and no waiter behind.
    pub async fn lock(&self) -> Result<UpgradeableReadGuard> {
        self.lock_with(&LockOptions::new()).await
    }

    /// Like [`lock`](Self::lock), with this acquisition's own options (a fixed
    /// lease, a `max_hold` bound, the holder context), for both its holds and for
    /// the write side an upgrade takes.
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](Self::lock).
    pub async fn lock_with(&self, options: &LockOptions) -> Result<UpgradeableReadGuard> {
        self.check_usable()?;
        let upgrade = self.upgrade.lock_with(options).await?;
        let read = self.read.lock_with(options).await?;
        Ok(self.guard(upgrade, read, options))
    }

    /// Tries to hold the upgradeable side within `wait` (zero: try once); `Ok(None)`
    /// when another upgradeable reader or a writer kept it.
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](Self::lock).
    pub async fn try_lock(&self, wait: Duration) -> Result<Option<UpgradeableReadGuard>> {
        self.try_lock_with(wait, &LockOptions::new()).await
    }

    /// Like [`try_lock`](Self::try_lock), with this acquisition's own options, as
    /// [`lock_with`](Self::lock_with).
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](Self::lock).
    pub async fn try_lock_with(
        &self,
        wait: Duration,
        options: &LockOptions,
    ) -> Result<Option<UpgradeableReadGuard>> {
        self.check_usable()?;
        let deadline = Instant::now() + wait;
        let Some(upgrade) = self.upgrade.try_lock_with(wait, options).await? else {
            return Ok(None);
        };
        let left = deadline.saturating_duration_since(Instant::now());
        let Some(read) = self.read.try_lock_with(left, options).await? else {
            return Ok(None);
        };
        Ok(Some(self.guard(upgrade, read, options)))
    }

    /// Whether this owner holds the upgradeable side.
    pub fn is_held(&self) -> bool {
        self.upgrade.is_held() && self.read.is_held()
    }

    /// An error when the backend cannot upgrade, or when this owner holds a plain
    /// read: waiting for the upgradeable side while reading could wait forever for
    /// another upgradeable reader, whose upgrade waits for that read.
    fn check_usable(&self) -> Result<()> {
        let manager = &self.upgrade.handle().manager;
        let name = self.read.name()?;
        if !manager.capabilities.upgrade {
            return Err(Error::unsupported(format!(
                "the {} backend cannot upgrade a read in place; release the read, then take the write side",
                manager.chain.resource().backend_name()
            ))
            .with_context("lock", name));
        }
        if self.read.is_held() && !self.upgrade.is_held() {
            return Err(Error::invalid_argument(
                "this read-write lock's owner holds a plain read: taking the upgradeable side beside it could wait forever for another upgradeable reader whose upgrade waits for this read; release the read first",
            )
            .with_context("lock", name));
        }
        Ok(())
    }

    fn guard(
        &self,
        upgrade: LockGuard,
        read: LockGuard,
        options: &LockOptions,
    ) -> UpgradeableReadGuard {
        UpgradeableReadGuard {
            write: None,
            read,
            upgrade,
            writer: self.write.clone(),
            options: options.clone(),
        }
    }
}

impl fmt::Debug for UpgradeableReadLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpgradeableReadLock")
            .field("upgrade", &self.upgrade)
            .field("read", &self.read)
            .finish()
    }
}

/// Holding a read-write lock's upgradeable side, and after
/// [`upgrade`](Self::upgrade) its write side too. Dropping it releases everything
/// (the write side first); [`unlock`](Self::unlock) does so and reports.
#[must_use = "dropping the guard releases the lock at once"]
pub struct UpgradeableReadGuard {
    // Dropped in this order: the write side before the read hold it stands beside.
    write: Option<LockGuard>,
    read: LockGuard,
    upgrade: LockGuard,
    writer: DistributeLock,
    /// The acquisition's options, for the write side an upgrade takes.
    options: LockOptions,
}

impl UpgradeableReadGuard {
    /// Turns the hold into the write lock: waits until the other readers are gone
    /// (new readers stand back meanwhile), keeping the read hold throughout, so no
    /// writer gets in between. Does nothing if already upgraded.
    ///
    /// Errors: [`ErrorKind::LockLost`](dlock_spi::ErrorKind::LockLost) if the
    /// upgradeable hold is lost; the backend's errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped while waiting, the guard stays an upgradeable read and
    /// leaves no waiter behind.
    pub async fn upgrade(&mut self) -> Result<()> {
        if self.write.is_some() {
            return Ok(());
        }
        self.check()?;
        self.write = Some(self.writer.lock_with(&self.options).await?);
        Ok(())
    }

    /// Like [`upgrade`](Self::upgrade), waiting at most `wait`; `Ok(false)` when
    /// other readers stayed (the guard is still an upgradeable read).
    ///
    /// # Cancel safety
    ///
    /// As [`upgrade`](Self::upgrade).
    pub async fn try_upgrade(&mut self, wait: Duration) -> Result<bool> {
        if self.write.is_some() {
            return Ok(true);
        }
        self.check()?;
        self.write = self.writer.try_lock_with(wait, &self.options).await?;
        Ok(self.write.is_some())
    }

    /// The read hold (of the lock's name).
    pub fn read(&self) -> &LockGuard {
        &self.read
    }

    /// The write hold, once upgraded.
    pub fn write(&self) -> Option<&LockGuard> {
        self.write.as_ref()
    }

    /// The hold of the upgradeable side's own lock (`<name>::upgradeable`), which
    /// keeps other upgradeable readers out.
    pub fn upgradeable(&self) -> &LockGuard {
        &self.upgrade
    }

    /// Whether the guard holds the write side.
    pub fn is_upgraded(&self) -> bool {
        self.write.is_some()
    }

    /// Lets the write side go, keeping the upgradeable read (no writer gets in
    /// between). Does nothing if not upgraded. Errors as [`LockGuard::unlock`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: the write side is let go either way (dropped, in the background).
    pub async fn downgrade(&mut self) -> Result<()> {
        match self.write.take() {
            Some(write) => write.unlock().await,
            None => Ok(()),
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        self.read.name()
    }

    /// The fencing token of the strongest hold: the write side's once upgraded,
    /// else the read hold's.
    pub fn fencing_token(&self) -> FencingToken {
        self.write.as_ref().unwrap_or(&self.read).fencing_token()
    }

    parts_accessors!("hold of the guard");

    fn parts(&self) -> impl Iterator<Item = &LockGuard> {
        self.write.iter().chain([&self.read, &self.upgrade])
    }

    /// Releases the write side (if upgraded), then the read hold, then the
    /// upgradeable lock; the first error is returned (the others are released all
    /// the same).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: what is not yet released is released in the background.
    pub async fn unlock(self) -> Result<()> {
        let UpgradeableReadGuard {
            write,
            read,
            upgrade,
            ..
        } = self;
        let mut first = Ok(());
        for guard in write.into_iter().chain([read, upgrade]) {
            let result = guard.unlock().await;
            if first.is_ok() {
                first = result;
            }
        }
        first
    }
}

impl fmt::Debug for UpgradeableReadGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpgradeableReadGuard")
            .field("name", self.name())
            .field("upgraded", &self.is_upgraded())
            .field("token", &self.fencing_token())
            .field("lost", &self.is_lost())
            .finish()
    }
}

/// The manager's constructor of this primitive.
impl crate::DistributeLockManager {
    /// A read-write lock for `name`: many readers together, or one writer.
    pub fn read_write_lock(&self, name: impl std::fmt::Display) -> ReadWriteLock {
        ReadWriteLock::new(
            Arc::clone(&self.inner),
            self.inner.full_name(name),
            Fairness::NonFair,
        )
    }

    /// A fair read-write lock for `name`: granted in arrival order where the
    /// backend keeps a queue (a reader arriving behind a queued writer waits for
    /// it), as [`fair_lock`](Self::fair_lock).
    pub fn fair_read_write_lock(&self, name: impl std::fmt::Display) -> ReadWriteLock {
        ReadWriteLock::new(
            Arc::clone(&self.inner),
            self.inner.full_name(name),
            Fairness::Fair,
        )
    }
}
