//! Several locks taken together, all or none (Redisson's `RedissonMultiLock`).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_spi::{Error, LockName, LostReason, Result};

use crate::guard::{parts_accessors, LockGuard};
use crate::lock::DistributeLock;
use crate::manager::DistributeLockManager;
use crate::options::LockOptions;

/// Several locks acquired as one: all or none, one guard, one lost signal for any
/// member. From [`DistributeLockManager::multi_lock`].
///
/// Members are taken one at a time in the order of their full names, whatever
/// order they were given in, so two multi-locks over overlapping names cannot
/// deadlock each other; names given twice are taken once. When one member cannot
/// be had (the wait ran out, an error), the members already taken are released
/// before the call returns. Clones are the same owners and re-enter, as a lock
/// handle's do.
///
/// ```
/// # async fn demo() -> dlock_api::Result<()> {
/// use std::time::Duration;
/// use dlock_api::DistributeLockManager;
///
/// let manager = DistributeLockManager::connect("memory://").await?;
/// let transfer = manager.multi_lock(["account:7", "account:3"]);
/// if let Some(guard) = transfer.try_lock(Duration::from_secs(1)).await? {
///     for member in guard.guards() {
///         println!("{} token {}", member.name(), member.fencing_token());
///     }
///     guard.unlock().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MultiLock {
    members: Arc<[DistributeLock]>,
}

impl MultiLock {
    pub(crate) fn new(manager: &DistributeLockManager, names: Vec<String>) -> Self {
        let mut members: Vec<(String, DistributeLock)> = names
            .into_iter()
            .map(|name| {
                let lock = manager.lock(&name);
                let key = lock
                    .name()
                    .map(|full| full.as_str().to_owned())
                    .unwrap_or(name);
                (key, lock)
            })
            .collect();
        members.sort_by(|(a, _), (b, _)| a.cmp(b));
        members.dedup_by(|(a, _), (b, _)| a == b);
        MultiLock {
            members: members.into_iter().map(|(_, lock)| lock).collect(),
        }
    }

    /// The members, in the order they are taken.
    pub fn members(&self) -> &[DistributeLock] {
        &self.members
    }

    /// Refuses an empty multi-lock and one with an invalid name, before any member
    /// is taken.
    fn validate(&self) -> Result<()> {
        if self.members.is_empty() {
            return Err(Error::invalid_argument(
                "a multi-lock of no names; give at least one lock name",
            ));
        }
        for member in self.members.iter() {
            member.name().map_err(|e| e.duplicate())?;
        }
        Ok(())
    }

    /// Tries to take every member within `wait` in all; `Ok(None)` (with nothing
    /// held) when one of them stayed taken.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped at any point, the members taken so far are released in
    /// the background and no waiter is left behind.
    pub async fn try_lock(&self, wait: Duration) -> Result<Option<MultiGuard>> {
        self.try_lock_with(wait, &LockOptions::new()).await
    }

    /// Like [`try_lock`](Self::try_lock), with options applied to every member.
    ///
    /// # Cancel safety
    ///
    /// As [`try_lock`](Self::try_lock).
    pub async fn try_lock_with(
        &self,
        wait: Duration,
        options: &LockOptions,
    ) -> Result<Option<MultiGuard>> {
        self.validate()?;
        let deadline = Instant::now() + wait;
        let mut taken = Vec::with_capacity(self.members.len());
        for member in self.members.iter() {
            let left = deadline.saturating_duration_since(Instant::now());
            match member.try_lock_with(left, options).await {
                Ok(Some(guard)) => taken.push(guard),
                Ok(None) => {
                    give_back(taken).await;
                    return Ok(None);
                }
                Err(err) => {
                    give_back(taken).await;
                    return Err(err);
                }
            }
        }
        Ok(Some(MultiGuard { guards: taken }))
    }

    /// Waits until every member is taken, holding the earlier ones while it waits
    /// for the next; fails with `Closed` when the manager closes.
    ///
    /// # Cancel safety
    ///
    /// As [`try_lock`](Self::try_lock).
    pub async fn lock(&self) -> Result<MultiGuard> {
        self.lock_with(&LockOptions::new()).await
    }

    /// Like [`lock`](Self::lock), with options applied to every member.
    ///
    /// # Cancel safety
    ///
    /// As [`try_lock`](Self::try_lock).
    pub async fn lock_with(&self, options: &LockOptions) -> Result<MultiGuard> {
        self.validate()?;
        let mut taken = Vec::with_capacity(self.members.len());
        for member in self.members.iter() {
            match member.lock_with(options).await {
                Ok(guard) => taken.push(guard),
                Err(err) => {
                    give_back(taken).await;
                    return Err(err);
                }
            }
        }
        Ok(MultiGuard { guards: taken })
    }
}

/// Gives back members taken by an acquisition that could not finish, as a
/// guard's unlock does (last first; dropped part-way, the rest are released in the
/// background). Its outcome is not the caller's: the acquisition failed already.
async fn give_back(taken: Vec<LockGuard>) {
    if let Err(err) = (MultiGuard { guards: taken }).unlock().await {
        tracing::debug!(
            error = &err as &dyn std::error::Error,
            "dlock: giving back a multi-lock's members"
        );
    }
}

impl fmt::Debug for MultiLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.members.iter()).finish()
    }
}

/// Holding every member of a [`MultiLock`]. Dropping it releases them all in the
/// background.
#[must_use = "dropping the guard releases the locks at once"]
pub struct MultiGuard {
    guards: Vec<LockGuard>,
}

impl MultiGuard {
    parts_accessors!("member");

    fn parts(&self) -> impl Iterator<Item = &LockGuard> {
        self.guards.iter()
    }

    /// Each member's guard (name, fencing token, …), in the order they were taken.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// The members' names, in the order they were taken.
    pub fn names(&self) -> impl Iterator<Item = &LockName> {
        self.guards.iter().map(LockGuard::name)
    }

    /// Why a member was lost (the first member's, in order, that was), if any was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.guards.iter().find_map(LockGuard::lost_reason)
    }

    /// The members' guards, to release (or keep) one by one; the multi-lock's
    /// signal then no longer exists — watch each guard's.
    pub fn into_guards(self) -> Vec<LockGuard> {
        self.guards
    }

    /// Releases every member, last taken first. All are released even if one
    /// fails; the first error is returned (a lost member: `LockLost`).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped part-way, the members not yet released are released
    /// in the background.
    pub async fn unlock(self) -> Result<()> {
        let mut first = None;
        for guard in self.guards.into_iter().rev() {
            if let Err(err) = guard.unlock().await {
                first.get_or_insert(err);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.guards.iter()).finish()
    }
}

/// The manager's constructor of this primitive.
impl crate::DistributeLockManager {
    /// Several locks taken together, all or none, in a fixed order (see
    /// [`MultiLock`](crate::MultiLock)); one guard and one lost signal for all.
    pub fn multi_lock<I>(&self, names: I) -> crate::MultiLock
    where
        I: IntoIterator,
        I::Item: std::fmt::Display,
    {
        let names = names.into_iter().map(|n| n.to_string()).collect();
        crate::MultiLock::new(self, names)
    }
}
