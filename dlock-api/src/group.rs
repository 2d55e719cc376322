//! Keyed lock groups (ylock's `Locks` and LockKeeper): one logical lock per key,
//! handles kept in a bounded cache.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::lock::DistributeLock;
use crate::manager::DistributeLockManager;
use crate::rwlock::ReadWriteLock;

/// How many handles a group keeps by default.
pub const DEFAULT_GROUP_CAPACITY: usize = 10_000;

/// How long an unused handle stays cached by default.
pub const DEFAULT_GROUP_IDLE: Duration = Duration::from_secs(60);

/// Locks whose names share a prefix, one per key — e.g. one lock per user id
/// (ylock's `Locks`): `group.lock(42)` locks `"<prefix>:42"`.
///
/// The same key gives the same logical lock: the handle for a key is kept, so two
/// calls of `group.lock(key)` are one owner and re-enter each other's hold (as a
/// handle and its clones do). Handles are kept in a bounded cache: when it is full,
/// a new key evicts handles nobody uses — no guard, no clone outside the cache —
/// idle longest first, and any idle longer than the idle time. A handle in use is
/// never evicted (that would split one owner in two), so the cache holds at most
/// its capacity plus the handles in use. Clones of a group share its cache.
///
/// ```
/// # async fn demo() -> dlock_api::Result<()> {
/// use std::time::Duration;
/// use dlock_api::DistributeLockManager;
///
/// let manager = DistributeLockManager::connect("memory://").await?;
/// let users = manager.group("user").capacity(50_000);
/// let outer = users.lock(42).lock().await?;
/// let inner = users.lock(42).lock().await?; // the same lock: re-entered
/// assert_eq!(inner.fencing_token(), outer.fencing_token());
/// assert_eq!(users.cached(), 1);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LockGroup {
    manager: DistributeLockManager,
    prefix: String,
    capacity: usize,
    idle: Duration,
    cache: Arc<Mutex<HashMap<Key, Cached>>>,
}

/// A cached handle's key: which kind of lock, for which key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Lock(String),
    Fair(String),
    ReadWrite(String),
    FairReadWrite(String),
}

#[derive(Clone)]
enum Handle {
    Lock(DistributeLock),
    ReadWrite(ReadWriteLock),
}

struct Cached {
    handle: Handle,
    used: Instant,
}

impl Cached {
    /// Whether only the cache has the handle (no guard, no clone elsewhere).
    fn unused(&self) -> bool {
        match &self.handle {
            Handle::Lock(lock) => lock.is_unshared(),
            Handle::ReadWrite(rw) => rw.is_unshared(),
        }
    }
}

impl LockGroup {
    pub(crate) fn new(manager: DistributeLockManager, prefix: &str) -> Self {
        LockGroup {
            manager,
            prefix: format!("{prefix}:"),
            capacity: DEFAULT_GROUP_CAPACITY,
            idle: DEFAULT_GROUP_IDLE,
            cache: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// How many handles the cache keeps before it evicts unused ones (default
    /// [`DEFAULT_GROUP_CAPACITY`]; at least 1).
    pub fn capacity(mut self, capacity: usize) -> Self {
        self.capacity = capacity.max(1);
        self
    }

    /// How long an unused handle stays cached (default [`DEFAULT_GROUP_IDLE`]).
    pub fn idle(mut self, idle: Duration) -> Self {
        self.idle = idle;
        self
    }

    /// The group's name prefix, separator included.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// How many handles are cached now.
    pub fn cached(&self) -> usize {
        self.cache().len()
    }

    /// The lock for `key` (named `"<prefix>:<key>"`): the same owner for the same
    /// key while its handle is cached or in use.
    pub fn lock(&self, key: impl fmt::Display) -> DistributeLock {
        self.exclusive(Key::Lock(key.to_string()), |m, name| m.lock(name))
    }

    /// The fair lock for `key` (a handle of its own, apart from [`lock`](Self::lock)'s).
    pub fn fair_lock(&self, key: impl fmt::Display) -> DistributeLock {
        self.exclusive(Key::Fair(key.to_string()), |m, name| m.fair_lock(name))
    }

    /// The cached exclusive handle for `key`, made by `make` from the full name.
    fn exclusive(
        &self,
        key: Key,
        make: fn(&DistributeLockManager, &str) -> DistributeLock,
    ) -> DistributeLock {
        let (Key::Lock(id) | Key::Fair(id) | Key::ReadWrite(id) | Key::FairReadWrite(id)) = &key;
        let name = format!("{}{id}", self.prefix);
        match self.get(key.clone(), || Handle::Lock(make(&self.manager, &name))) {
            Handle::Lock(lock) => lock,
            // A key's kind decides its handle's kind: not reached.
            Handle::ReadWrite(_) => make(&self.manager, &name),
        }
    }

    /// The read-write lock for `key`.
    pub fn read_write_lock(&self, key: impl fmt::Display) -> ReadWriteLock {
        let key = key.to_string();
        self.shared(Key::ReadWrite(key), |m, name| m.read_write_lock(name))
    }

    /// The fair read-write lock for `key` (a handle of its own, apart from
    /// [`read_write_lock`](Self::read_write_lock)'s).
    pub fn fair_read_write_lock(&self, key: impl fmt::Display) -> ReadWriteLock {
        let key = key.to_string();
        self.shared(Key::FairReadWrite(key), |m, name| {
            m.fair_read_write_lock(name)
        })
    }

    /// The cached read-write handle for `key`, made by `make` from the full name.
    fn shared(
        &self,
        key: Key,
        make: fn(&DistributeLockManager, &str) -> ReadWriteLock,
    ) -> ReadWriteLock {
        let (Key::Lock(id) | Key::Fair(id) | Key::ReadWrite(id) | Key::FairReadWrite(id)) = &key;
        let name = format!("{}{id}", self.prefix);
        match self.get(key.clone(), || {
            Handle::ReadWrite(make(&self.manager, &name))
        }) {
            Handle::ReadWrite(rw) => rw,
            // A key's kind decides its handle's kind: not reached.
            Handle::Lock(_) => make(&self.manager, &name),
        }
    }

    fn cache(&self) -> MutexGuard<'_, HashMap<Key, Cached>> {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The cached handle for `key`, or a new one (evicting unused handles first
    /// when the cache is full).
    fn get(&self, key: Key, make: impl FnOnce() -> Handle) -> Handle {
        let now = Instant::now();
        let mut cache = self.cache();
        if let Some(cached) = cache.get_mut(&key) {
            cached.used = now;
            return cached.handle.clone();
        }
        if cache.len() >= self.capacity {
            self.evict(&mut cache, now);
        }
        let handle = make();
        cache.insert(
            key,
            Cached {
                handle: handle.clone(),
                used: now,
            },
        );
        handle
    }

    /// Drops unused handles idle past the idle time, then — if the cache is still
    /// full — unused handles idle longest first, down to three quarters of the
    /// capacity (so a stream of new keys evicts in batches, not one per key).
    fn evict(&self, cache: &mut HashMap<Key, Cached>, now: Instant) {
        cache.retain(|_, c| !(c.unused() && now.duration_since(c.used) >= self.idle));
        // Below the capacity, so the new key fits (also for capacities under 4).
        let target = (self.capacity - self.capacity / 4).min(self.capacity - 1);
        if cache.len() < self.capacity {
            return;
        }
        let mut unused: Vec<(Instant, Key)> = cache
            .iter()
            .filter(|(_, c)| c.unused())
            .map(|(k, c)| (c.used, k.clone()))
            .collect();
        unused.sort_unstable_by_key(|(used, _)| *used);
        let excess = cache.len().saturating_sub(target);
        for (_, key) in unused.into_iter().take(excess) {
            cache.remove(&key);
        }
    }
}

impl fmt::Debug for LockGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGroup")
            .field("prefix", &self.prefix)
            .field("capacity", &self.capacity)
            .field("idle", &self.idle)
            .field("cached", &self.cached())
            .finish()
    }
}

/// The manager's constructor of this primitive.
impl crate::DistributeLockManager {
    /// A family of locks whose names share `prefix` (ylock's `Locks`): `group.lock(id)`
    /// locks `"<prefix>:<id>"`, the same owner for the same id (handles kept in a
    /// bounded cache; see [`LockGroup`]).
    pub fn group(&self, prefix: impl fmt::Display) -> LockGroup {
        LockGroup::new(self.clone(), &prefix.to_string())
    }
}
