//! An in-process backend: the reference implementation of every semantic in the
//! SPI, used by the chain's unit tests and by single-process applications.
//!
//! Leases are judged on this process's monotonic clock. Waiting is push-based: every
//! waiter parks on its own [`Notify`] in an arrival-ordered queue, and a release wakes
//! the first waiter only (plus the run of shared waiters behind it, who can all hold
//! together). Only the queue's head also wakes when the holder's lease runs out, so an
//! expiry does not stampede either. A waiter whose future is dropped leaves the queue
//! in `Drop` and passes on any wake-up it had been given. Non-fair requesters may take
//! a free lock ahead of the queue, but not ahead of a waiter queued for 20 ms: no
//! waiter starves.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::{watch, Notify};

use crate::capabilities::Capabilities;
use crate::error::Result;
use crate::events::{ChangeFeed, LockEvents};
use crate::name::LockName;
use crate::outcome::{AcquireResult, HolderInfo, LockState, ReleaseResult, RenewResult};
use crate::request::{AcquireRequest, ReleaseRequest, RenewRequest};
use crate::resource::{LockAdmin, LockRemoteResource};
use crate::types::{Fairness, FencingToken, GrantId, LockMode, OwnerId};

/// Non-fair mode: how long a queued waiter may be passed by requesters that came
/// after it. Once it has waited this long it goes first, so no waiter starves.
const STARVATION_AFTER: Duration = Duration::from_millis(20);

/// The in-memory backend. Clones share the same locks, so several managers in one
/// process can contend through it.
#[derive(Clone, Default)]
pub struct InMemoryBackend {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    attempts: AtomicU64,
}

#[derive(Default)]
struct State {
    locks: HashMap<LockName, Entry>,
    /// Per-name fencing counters; they outlive releases so tokens never repeat.
    fences: HashMap<LockName, u64>,
    /// Change feeds of followed locks ([`LockEvents`]).
    followers: HashMap<LockName, watch::Sender<u64>>,
    next_waiter: u64,
}

#[derive(Default)]
struct Entry {
    holders: Vec<Holder>,
    waiters: VecDeque<Waiter>,
    /// A semaphore's total permits, set by the first permit request while it has no
    /// permit holders or waiters.
    capacity: u32,
    /// A holder's lease ran out without a release since the last grant: the next
    /// grant takes over from it.
    expired_since_grant: bool,
}

struct Holder {
    owner: OwnerId,
    grant: GrantId,
    mode: LockMode,
    token: u64,
    expires_at: Instant,
    context: Bytes,
}

impl Holder {
    /// Whether this hold is grant `grant` of `owner` in `mode` (never another grant
    /// of the same owner).
    fn is(&self, owner: &OwnerId, grant: GrantId, mode: LockMode) -> bool {
        self.grant == grant && self.mode == mode && self.owner == *owner
    }
}

struct Waiter {
    id: u64,
    mode: LockMode,
    /// When it queued.
    since: Instant,
    notify: Arc<Notify>,
    /// Woken and not yet back: the next wake-up goes past it.
    woken: bool,
}

impl Entry {
    fn is_idle(&self) -> bool {
        self.holders.is_empty() && self.waiters.is_empty()
    }

    /// Drops expired holders; true if any were dropped.
    fn purge_expired(&mut self, now: Instant) -> bool {
        let before = self.holders.len();
        self.holders.retain(|h| h.expires_at > now);
        let dropped = self.holders.len() != before;
        self.expired_since_grant |= dropped;
        dropped
    }

    fn position(&self, waiter: Option<u64>) -> usize {
        waiter
            .and_then(|id| self.waiters.iter().position(|w| w.id == id))
            .unwrap_or(self.waiters.len())
    }

    /// Whether `mode` may be granted now to a requester at queue position `pos`
    /// (`waiters.len()` for a newcomer). Non-fair requesters may pass queued waiters,
    /// but not one that has waited `STARVATION_AFTER` already. A request made
    /// alongside the owner's live hold `beside` is judged against the other holders
    /// only, whatever the queue.
    fn grantable(
        &self,
        mode: LockMode,
        fairness: Fairness,
        pos: usize,
        now: Instant,
        beside: Option<usize>,
    ) -> bool {
        if let Some(own) = beside {
            let mut others = self
                .holders
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != own)
                .map(|(_, h)| h);
            return match mode {
                LockMode::Exclusive => others.next().is_none(),
                _ => others.all(|h| h.mode == LockMode::Shared),
            };
        }
        let mut ahead = self.waiters.iter().take(pos);
        match mode {
            LockMode::Exclusive => {
                self.holders.is_empty()
                    && match fairness {
                        Fairness::Fair => pos == 0,
                        Fairness::NonFair => {
                            !ahead.any(|w| now.duration_since(w.since) >= STARVATION_AFTER)
                        }
                    }
            }
            // Readers never pass a queued writer, so a stream of readers cannot starve it.
            LockMode::Shared => {
                self.holders.iter().all(|h| h.mode == LockMode::Shared)
                    && !ahead.any(|w| w.mode == LockMode::Exclusive)
            }
            // Permits go in arrival order, whatever the fairness: a request for many
            // is never starved by a stream of requests for few.
            LockMode::Permits(n) => {
                let mut used = 0u64;
                for h in &self.holders {
                    match h.mode.permits() {
                        Some(p) => used += u64::from(p),
                        None => return false,
                    }
                }
                pos == 0 && used + u64::from(n) <= u64::from(self.capacity)
            }
        }
    }

    /// Whether the semaphore has permit holders or waiters (its total is then fixed).
    fn has_permit_state(&self) -> bool {
        self.holders.iter().any(|h| h.mode.permits().is_some())
            || self.waiters.iter().any(|w| w.mode.permits().is_some())
    }

    /// Wakes the first waiter that is not already woken, and the run of shared
    /// waiters right behind a shared one. Never wakes an exclusive (or permit)
    /// waiter behind another waiter: it could not take the lock anyway (a permit
    /// waiter that is granted wakes the next one itself while permits remain).
    fn wake_next(&mut self) {
        let mut shared_run = false;
        for (i, w) in self.waiters.iter_mut().enumerate() {
            if w.woken {
                if w.mode != LockMode::Shared {
                    return;
                }
                shared_run = true;
                continue;
            }
            if i == 0 || (shared_run && w.mode == LockMode::Shared) {
                w.woken = true;
                w.notify.notify_one();
                if w.mode != LockMode::Shared {
                    return;
                }
                shared_run = true;
            } else {
                return;
            }
        }
    }

    fn remove_waiter(&mut self, id: u64) -> Option<Waiter> {
        let pos = self.waiters.iter().position(|w| w.id == id)?;
        self.waiters.remove(pos)
    }

    fn earliest_expiry(&self) -> Option<Instant> {
        self.holders.iter().map(|h| h.expires_at).min()
    }
}

/// Removes a parked waiter if its acquire future is dropped.
struct WaiterSlot {
    shared: Arc<Shared>,
    name: LockName,
    id: Option<u64>,
}

impl Drop for WaiterSlot {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else { return };
        let mut state = self.shared.lock_state();
        if let Some(entry) = state.locks.get_mut(&self.name) {
            if let Some(w) = entry.remove_waiter(id) {
                // Pass on a wake-up this waiter will never use, and let a new queue
                // head arm its expiry timer.
                if w.woken || entry.waiters.front().is_some_and(|f| !f.woken) {
                    entry.wake_next();
                }
            }
            if entry.is_idle() {
                state.locks.remove(&self.name);
            }
        }
    }
}

impl Shared {
    fn lock_state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

enum Step {
    Done(AcquireResult),
    Fail(crate::Error),
    Park {
        notify: Arc<Notify>,
        wake_at: Option<Instant>,
    },
}

/// Tells the followers of `name`, if any, that its holders changed.
fn ping(followers: &HashMap<LockName, watch::Sender<u64>>, name: &LockName) {
    // Nobody follows anything (the usual case): no hashing on the hot path.
    if followers.is_empty() {
        return;
    }
    if let Some(tx) = followers.get(name) {
        tx.send_modify(|n| *n = n.wrapping_add(1));
    }
}

impl InMemoryBackend {
    /// An empty backend.
    pub fn new() -> Self {
        Self::default()
    }

    /// Test and operations hook: removes every holder of `name` behind their backs
    /// (as an operator's force-unlock would), wakes a waiter, and returns how many
    /// holds were removed. The fencing counter is kept.
    pub fn force_release(&self, name: &LockName) -> usize {
        let mut state = self.shared.lock_state();
        let Some(entry) = state.locks.get_mut(name) else {
            return 0;
        };
        let removed = entry.holders.len();
        entry.holders.clear();
        entry.wake_next();
        if entry.is_idle() {
            state.locks.remove(name);
        }
        ping(&state.followers, name);
        removed
    }

    /// Test hook: how many locks have live holder or waiter state (expired holders
    /// are not counted). Zero when nothing leaks.
    pub fn active_locks(&self) -> usize {
        self.live_with_prefix("")
    }

    fn live_with_prefix(&self, prefix: &str) -> usize {
        let now = Instant::now();
        let state = self.shared.lock_state();
        state
            .locks
            .iter()
            .filter(|(name, e)| {
                name.as_str().starts_with(prefix)
                    && (!e.waiters.is_empty() || e.holders.iter().any(|h| h.expires_at > now))
            })
            .count()
    }

    /// Test hook: how many times any acquire evaluated a lock's state (first tries and
    /// every re-check after a wake-up or timer). Shows whether a release woke one
    /// waiter or all of them.
    pub fn acquire_attempts(&self) -> u64 {
        self.shared.attempts.load(Ordering::Relaxed)
    }

    fn step(&self, req: &AcquireRequest, slot: &mut WaiterSlot) -> Step {
        self.shared.attempts.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let mut guard = self.shared.lock_state();
        let state = &mut *guard;
        let entry = state.locks.entry(req.name.clone()).or_default();
        if entry.purge_expired(now) {
            entry.wake_next();
            ping(&state.followers, &req.name);
        }

        // The holding grant asking again (a retry whose answer was lost): idempotent.
        if let Some(h) = entry
            .holders
            .iter_mut()
            .find(|h| h.is(&req.owner, req.grant, req.mode))
        {
            h.expires_at = now + req.lease;
            let result = AcquireResult::acquired(FencingToken::new(h.token), Some(h.expires_at));
            if let Some(id) = slot.id.take() {
                entry.remove_waiter(id);
            }
            return Step::Done(result);
        }

        if req.mode.permits().is_some() {
            // One total per semaphore: set while it is idle, refused when it differs.
            if !entry.has_permit_state() {
                entry.capacity = req.capacity;
            } else if entry.capacity != req.capacity {
                let held = entry.capacity;
                if let Some(id) = slot.id.take() {
                    entry.remove_waiter(id);
                    entry.wake_next();
                }
                if entry.is_idle() {
                    state.locks.remove(&req.name);
                }
                return Step::Fail(crate::Error::semaphore_total_differs(held, req.capacity));
            }
        }
        let pos = entry.position(slot.id);
        // The owner's own hold in the other mode, if the request names a live one.
        let beside = req.alongside.and_then(|grant| {
            entry
                .holders
                .iter()
                .position(|h| h.grant == grant && h.owner == req.owner && h.mode != req.mode)
        });
        if entry.grantable(req.mode, req.fairness, pos, now, beside) {
            if let Some(id) = slot.id.take() {
                entry.remove_waiter(id);
            }
            let fence = state.fences.entry(req.name.clone()).or_insert(0);
            *fence += 1;
            let token = *fence;
            let expires_at = now + req.lease;
            entry.holders.push(Holder {
                owner: req.owner.clone(),
                grant: req.grant,
                mode: req.mode,
                token,
                expires_at,
                context: req.context.clone(),
            });
            ping(&state.followers, &req.name);
            if req.mode != LockMode::Exclusive {
                // Readers queued behind this one can hold together with it; the next
                // permit waiter may fit in what is left.
                entry.wake_next();
            }
            let took_over = std::mem::take(&mut entry.expired_since_grant);
            return Step::Done(
                AcquireResult::acquired(FencingToken::new(token), Some(expires_at))
                    .with_took_over(took_over),
            );
        }

        let deadline = match req.deadline {
            Some(d) if d > now => d,
            _ => {
                let holder = entry.holders.first().map(|h| h.owner.clone());
                let retry_after = entry
                    .earliest_expiry()
                    .map(|e| e.saturating_duration_since(now));
                if let Some(id) = slot.id.take() {
                    entry.remove_waiter(id);
                    entry.wake_next();
                }
                if entry.is_idle() {
                    state.locks.remove(&req.name);
                }
                return Step::Done(AcquireResult::not_acquired(holder, retry_after));
            }
        };

        park(
            entry,
            &mut state.next_waiter,
            req.mode,
            slot,
            beside.is_some(),
            now,
            deadline,
        )
    }
}

/// Queues the request of `slot` in the lock's `entry` (or finds it queued), numbered from
/// `next_waiter` — first when it goes `beside` its owner's own hold — and says how it waits:
/// woken by a release, or at `deadline` (the head, whose turn comes when the
/// holder's lease ends, at that end if sooner).
fn park(
    entry: &mut Entry,
    next_waiter: &mut u64,
    mode: LockMode,
    slot: &mut WaiterSlot,
    beside: bool,
    now: Instant,
    deadline: Instant,
) -> Step {
    let id = match slot.id {
        Some(id) => id,
        None => {
            *next_waiter += 1;
            let id = *next_waiter;
            let waiter = Waiter {
                id,
                mode,
                since: now,
                notify: Arc::new(Notify::new()),
                woken: false,
            };
            // Beside its own hold, a request goes first: the waiters ahead may
            // wait for that hold.
            if beside {
                entry.waiters.push_front(waiter);
            } else {
                entry.waiters.push_back(waiter);
            }
            slot.id = Some(id);
            id
        }
    };
    let is_head = entry.waiters.front().is_some_and(|w| w.id == id);
    let Some(me) = entry.waiters.iter_mut().find(|w| w.id == id) else {
        // Unreachable: the waiter was just found or inserted under the same mutex.
        return Step::Park {
            notify: Arc::new(Notify::new()),
            wake_at: Some(deadline),
        };
    };
    me.woken = false;
    let notify = Arc::clone(&me.notify);
    // Only the head watches the holder's lease, so an expiry wakes one waiter.
    let wake_at = match entry.earliest_expiry() {
        Some(expiry) if is_head => Some(expiry.min(deadline)),
        _ => Some(deadline),
    };
    Step::Park { notify, wake_at }
}

#[async_trait]
impl LockRemoteResource for InMemoryBackend {
    fn backend_name(&self) -> &'static str {
        "memory"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            lease: true,
            renew: true,
            reentrant: true,
            fair: true,
            shared: true,
            semaphore: true,
            push_wakeup: true,
            fencing: true,
            takeover: true,
            cross_mode: true,
            upgrade: true,
            min_lease: None,
            max_name_len: None,
        }
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<AcquireResult> {
        let mut slot = WaiterSlot {
            shared: Arc::clone(&self.shared),
            name: req.name.clone(),
            id: None,
        };
        loop {
            match self.step(req, &mut slot) {
                Step::Done(result) => return Ok(result),
                Step::Fail(err) => return Err(err),
                Step::Park { notify, wake_at } => {
                    let notified = notify.notified();
                    match wake_at {
                        Some(at) => {
                            let _ = tokio::time::timeout_at(at.into(), notified).await;
                        }
                        None => notified.await,
                    }
                }
            }
        }
    }

    async fn release(&self, req: &ReleaseRequest) -> Result<ReleaseResult> {
        let now = Instant::now();
        let mut state = self.shared.lock_state();
        let state = &mut *state;
        let Some(entry) = state.locks.get_mut(&req.name) else {
            return Ok(ReleaseResult::NotOwner);
        };
        let expired = entry.purge_expired(now);
        let pos = entry
            .holders
            .iter()
            .position(|h| h.is(&req.owner, req.grant, req.mode));
        let result = match pos {
            Some(pos) => {
                entry.holders.swap_remove(pos);
                entry.wake_next();
                ReleaseResult::Released
            }
            None => {
                if expired {
                    entry.wake_next();
                }
                ReleaseResult::NotOwner
            }
        };
        if expired || result == ReleaseResult::Released {
            ping(&state.followers, &req.name);
        }
        if entry.is_idle() {
            state.locks.remove(&req.name);
        }
        Ok(result)
    }

    async fn renew(&self, req: &RenewRequest) -> Result<RenewResult> {
        let now = Instant::now();
        let mut state = self.shared.lock_state();
        let state = &mut *state;
        let Some(entry) = state.locks.get_mut(&req.name) else {
            return Ok(RenewResult::NotOwner);
        };
        let mut changed = entry.purge_expired(now);
        if changed {
            entry.wake_next();
        }
        let holder = entry
            .holders
            .iter_mut()
            .find(|h| h.is(&req.owner, req.grant, req.mode));
        let result = match holder {
            Some(h) => {
                h.expires_at = now + req.lease;
                if let Some(context) = &req.context {
                    h.context = context.clone();
                    changed = true;
                }
                RenewResult::renewed(Some(h.expires_at))
            }
            None => RenewResult::NotOwner,
        };
        if changed {
            ping(&state.followers, &req.name);
        }
        Ok(result)
    }

    fn admin(&self) -> Option<&dyn LockAdmin> {
        Some(self)
    }

    fn events(&self) -> Option<&dyn LockEvents> {
        Some(self)
    }

    fn batch_renew(&self) -> Option<&dyn crate::BatchRenew> {
        None
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockState>> {
        let now = Instant::now();
        let state = self.shared.lock_state();
        let Some(entry) = state.locks.get(name) else {
            return Ok(None);
        };
        let holders: Vec<HolderInfo> = entry
            .holders
            .iter()
            .filter(|h| h.expires_at > now)
            .map(|h| {
                HolderInfo::new(
                    h.owner.clone(),
                    h.mode,
                    FencingToken::new(h.token),
                    h.context.clone(),
                    Some(h.expires_at.saturating_duration_since(now)),
                )
                .with_grant(Some(h.grant))
            })
            .collect();
        if holders.is_empty() && entry.waiters.is_empty() {
            return Ok(None);
        }
        Ok(Some(LockState::new(holders, Some(entry.waiters.len()))))
    }
}

#[async_trait]
impl LockEvents for InMemoryBackend {
    async fn follow(&self, name: &LockName) -> Result<ChangeFeed> {
        let mut state = self.shared.lock_state();
        state.followers.retain(|_, tx| tx.receiver_count() > 0);
        let tx = state
            .followers
            .entry(name.clone())
            .or_insert_with(|| watch::channel(0).0);
        Ok(ChangeFeed::new(tx.subscribe(), ()))
    }
}

#[async_trait]
impl LockAdmin for InMemoryBackend {
    async fn force_release(&self, name: &LockName) -> Result<usize> {
        Ok(InMemoryBackend::force_release(self, name))
    }

    async fn live_locks(&self, prefix: &str) -> Result<usize> {
        Ok(self.live_with_prefix(prefix))
    }
}

impl std::fmt::Debug for InMemoryBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InMemoryBackend")
            .field("active_locks", &self.active_locks())
            .finish()
    }
}
