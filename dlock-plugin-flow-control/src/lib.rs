//! # dlock-plugin-flow-control — rate, concurrency and hot-lock control for dlock
//!
//! Two handlers, each a small piece you register where it belongs in the chain:
//!
//! * [`FlowControlHandler`] — per group (the lock name up to `:`), a **rate limit**
//!   (acquire calls per second, via the `governor` crate) and a **concurrency limit**
//!   (acquire calls in flight to the backend). Over a limit it either rejects at once
//!   with `ErrorKind::Rejected` ([`OnLimit::Reject`], the default) or waits for room
//!   within the caller's own wait ([`OnLimit::Wait`]) and rejects when that runs out.
//! * [`CoalescingHandler`] — **hot-lock coalescing**: concurrent acquirers of the same
//!   exclusive lock *in this process* queue locally; only the head of that local queue
//!   talks to the backend, and the next one starts only when the current holder
//!   releases. A lock many tasks of one service contend on then costs about one backend
//!   acquire per acquisition instead of one per waiter per wake-up or poll.
//!
//! Register logging and metrics before flow control if rejected calls should still be
//! logged and counted.
//!
//! ```no_run
//! use std::num::NonZeroU32;
//! use dlock_plugin_flow_control::{CoalescingHandler, FlowControlHandler, OnLimit};
//! let flow = FlowControlHandler::default()
//!     .with_rate_limit(NonZeroU32::new(100).unwrap())
//!     .with_concurrency_limit(8)
//!     .with_on_limit(OnLimit::Wait);
//! let coalesce = CoalescingHandler::default();
//! # let _ = (flow, coalesce);
//! ```
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use dlock_spi::{
    AcquireChain, AcquireContext, AcquireResult, Error, ErrorKind, LockHandler, LockMode, LockName,
    LostEvent, OwnerId, ReleaseChain, ReleaseContext, ReleaseResult, Result,
};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tokio::sync::Semaphore;

/// What to do when a limit is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnLimit {
    /// Fail at once with `ErrorKind::Rejected`.
    #[default]
    Reject,
    /// Wait for room, within the caller's wait; then fail with `ErrorKind::Rejected`.
    Wait,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One group's limiters.
struct GroupLimits {
    rate: Option<DefaultDirectRateLimiter>,
    in_flight: Option<Arc<Semaphore>>,
}

/// Per-group rate and concurrency limits in front of the backend.
pub struct FlowControlHandler {
    separator: char,
    on_limit: OnLimit,
    rate: Option<NonZeroU32>,
    concurrency: Option<usize>,
    groups: Mutex<std::collections::HashMap<String, Arc<GroupLimits>>>,
}

impl Default for FlowControlHandler {
    /// No limits (add them with the `with_*` methods), reject when over, groups by `:`.
    fn default() -> Self {
        FlowControlHandler {
            separator: ':',
            on_limit: OnLimit::Reject,
            rate: None,
            concurrency: None,
            groups: Mutex::new(std::collections::HashMap::default()),
        }
    }
}

impl std::fmt::Debug for FlowControlHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlowControlHandler")
            .field("on_limit", &self.on_limit)
            .field("rate_per_second", &self.rate.map(NonZeroU32::get))
            .field("concurrency", &self.concurrency)
            .finish()
    }
}

impl FlowControlHandler {
    /// At most `per_second` acquire calls per second per group (bursts up to that many).
    pub fn with_rate_limit(mut self, per_second: NonZeroU32) -> Self {
        self.rate = Some(per_second);
        self
    }

    /// At most `limit` acquire calls per group in flight to the backend at once.
    pub fn with_concurrency_limit(mut self, limit: usize) -> Self {
        self.concurrency = Some(limit);
        self
    }

    /// Reject or wait when over a limit.
    pub fn with_on_limit(mut self, on_limit: OnLimit) -> Self {
        self.on_limit = on_limit;
        self
    }

    /// The character that ends a name's group prefix (default `:`).
    pub fn with_group_separator(mut self, separator: char) -> Self {
        self.separator = separator;
        self
    }

    fn rejected(what: String, ctx: &AcquireContext) -> Error {
        Error::new(ErrorKind::Rejected, what).with_context("lock", &ctx.request.name)
    }

    /// The limiters of `group`, created on first use (looked up without allocating).
    fn limits(&self, group: &str) -> Arc<GroupLimits> {
        let mut groups = lock(&self.groups);
        if let Some(l) = groups.get(group) {
            return Arc::clone(l);
        }
        let limits = Arc::new(GroupLimits {
            rate: self.rate.map(|r| RateLimiter::direct(Quota::per_second(r))),
            in_flight: self.concurrency.map(|n| Arc::new(Semaphore::new(n))),
        });
        groups.insert(group.to_owned(), Arc::clone(&limits));
        limits
    }

    async fn admit_rate(
        &self,
        limits: &GroupLimits,
        group: &str,
        ctx: &AcquireContext,
    ) -> Result<()> {
        let Some(limiter) = &limits.rate else {
            return Ok(());
        };
        if limiter.check().is_ok() {
            return Ok(());
        }
        let per_second = self.rate.map_or(0, NonZeroU32::get);
        let over = || {
            Self::rejected(
                format!(
                    "rate limit of {per_second}/s for lock group {group:?} reached; slow down, raise the limit, or use OnLimit::Wait"
                ),
                ctx,
            )
        };
        match (self.on_limit, ctx.request.deadline) {
            (OnLimit::Wait, Some(deadline)) => {
                tokio::time::timeout_at(deadline.into(), limiter.until_ready())
                    .await
                    .map_err(|_| over())
            }
            _ => Err(over()),
        }
    }

    async fn admit_concurrency(
        &self,
        limits: &GroupLimits,
        group: &str,
        ctx: &AcquireContext,
    ) -> Result<Option<tokio::sync::OwnedSemaphorePermit>> {
        let Some(semaphore) = &limits.in_flight else {
            return Ok(None);
        };
        let limit = self.concurrency.unwrap_or(0);
        let over = || {
            Self::rejected(
                format!(
                    "{limit} acquires of lock group {group:?} are already in flight; retry later, raise the limit, or use OnLimit::Wait"
                ),
                ctx,
            )
        };
        if let Ok(p) = Arc::clone(semaphore).try_acquire_owned() {
            return Ok(Some(p));
        }
        match (self.on_limit, ctx.request.deadline) {
            (OnLimit::Wait, Some(deadline)) => {
                match tokio::time::timeout_at(
                    deadline.into(),
                    Arc::clone(semaphore).acquire_owned(),
                )
                .await
                {
                    Ok(Ok(p)) => Ok(Some(p)),
                    _ => Err(over()),
                }
            }
            _ => Err(over()),
        }
    }
}

#[async_trait]
impl LockHandler for FlowControlHandler {
    async fn acquire(&self, ctx: &AcquireContext, next: AcquireChain<'_>) -> Result<AcquireResult> {
        if self.rate.is_none() && self.concurrency.is_none() {
            return next.invoke(ctx).await;
        }
        let group = ctx.request.name.group(self.separator);
        let limits = self.limits(group);
        self.admit_rate(&limits, group, ctx).await?;
        let _permit = self.admit_concurrency(&limits, group, ctx).await?;
        next.invoke(ctx).await
    }

    async fn release(&self, ctx: &ReleaseContext, next: ReleaseChain<'_>) -> Result<ReleaseResult> {
        // Releases are never limited: holding a lock longer helps nobody.
        next.invoke(ctx).await
    }
}

/// Hot-lock coalescing for exclusive locks: within this process, one acquirer per lock
/// at a time talks to the backend, and the local turn passes on only when that
/// acquirer releases (or loses) the lock — so a lock hot inside one service costs one
/// backend acquire per acquisition. Shared (read) acquires pass straight through.
#[derive(Debug, Default)]
pub struct CoalescingHandler {
    gates: Mutex<HashMap<LockName, Arc<tokio::sync::Mutex<()>>>>,
    turns: Mutex<HashMap<(LockName, OwnerId), tokio::sync::OwnedMutexGuard<()>>>,
}

impl CoalescingHandler {
    /// How many locks currently have a local queue or holder (for tests and status).
    pub fn queued_locks(&self) -> usize {
        lock(&self.gates).len()
    }

    fn gate(&self, name: &LockName) -> Arc<tokio::sync::Mutex<()>> {
        Arc::clone(lock(&self.gates).entry(name.clone()).or_default())
    }

    /// Drops the gate of `name` when nobody holds or waits on it any more.
    fn tidy(&self, name: &LockName) {
        let mut gates = lock(&self.gates);
        if gates.get(name).is_some_and(|g| Arc::strong_count(g) == 1) {
            gates.remove(name);
        }
    }

    fn end_turn(&self, name: &LockName, owner: &OwnerId) {
        let turn = lock(&self.turns).remove(&(name.clone(), owner.clone()));
        drop(turn);
        self.tidy(name);
    }
}

#[async_trait]
impl LockHandler for CoalescingHandler {
    async fn acquire(&self, ctx: &AcquireContext, next: AcquireChain<'_>) -> Result<AcquireResult> {
        let req = &ctx.request;
        // An upgrade (a write beside the owner's own read) goes straight on: the
        // local writers wait for that read, so it must not wait for them.
        if req.mode != LockMode::Exclusive || req.alongside.is_some() {
            return next.invoke(ctx).await;
        }
        let gate = self.gate(&req.name);
        let turn = match req.deadline {
            Some(deadline) => tokio::time::timeout_at(deadline.into(), gate.lock_owned())
                .await
                .ok(),
            None => gate.try_lock_owned().ok(),
        };
        let Some(turn) = turn else {
            // Someone in this process holds or is acquiring it, and our wait ran out.
            self.tidy(&req.name);
            return Ok(AcquireResult::not_acquired(None, None));
        };
        let result = next.invoke(ctx).await;
        if matches!(result, Ok(AcquireResult::Acquired { .. })) {
            // Keep the turn until this owner releases: local waiters stay local.
            lock(&self.turns).insert((req.name.clone(), req.owner.clone()), turn);
        } else {
            drop(turn);
            self.tidy(&req.name);
        }
        result
    }

    async fn release(&self, ctx: &ReleaseContext, next: ReleaseChain<'_>) -> Result<ReleaseResult> {
        let result = next.invoke(ctx).await;
        if ctx.request.mode == LockMode::Exclusive {
            self.end_turn(&ctx.request.name, &ctx.request.owner);
        }
        result
    }

    fn on_lost(&self, event: &LostEvent<'_>) {
        // A lost lock frees the local queue at once; the later release finds nothing.
        if event.mode == LockMode::Exclusive {
            self.end_turn(event.name, event.owner);
        }
    }
}

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
