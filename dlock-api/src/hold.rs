//! One remote acquisition, shared by the reentrant guards of a handle.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use dlock_spi::{FencingToken, HandlerChain, LockMode, LockName, LostEvent, LostReason, OwnerId};
use tokio::sync::Notify;

/// A lock granted by the backend. Reentrant acquisitions share it and bump `count`;
/// the remote release happens when `count` returns to zero.
pub(crate) struct Hold {
    pub(crate) id: u64,
    pub(crate) name: LockName,
    pub(crate) owner: OwnerId,
    pub(crate) mode: LockMode,
    pub(crate) token: FencingToken,
    pub(crate) acquired_at: Instant,
    /// The session's connection is down: the hold may or may not still be held.
    suspended: AtomicBool,
    /// Guards alive for this hold. Changed only under the handle's `current` mutex.
    pub(crate) count: AtomicUsize,
    /// Why the hold was lost; set once. With `lost_notify` instead of a watch
    /// channel: a hold costs no allocation for it, and dropping one wakes no one.
    lost: OnceLock<LostReason>,
    lost_notify: Notify,
}

impl Hold {
    pub(crate) fn new(
        id: u64,
        name: LockName,
        owner: OwnerId,
        mode: LockMode,
        token: FencingToken,
        acquired_at: Instant,
    ) -> Self {
        Hold {
            id,
            name,
            owner,
            mode,
            token,
            acquired_at,
            suspended: AtomicBool::new(false),
            count: AtomicUsize::new(1),
            lost: OnceLock::new(),
            lost_notify: Notify::new(),
        }
    }

    /// Records the loss; true the first time only.
    pub(crate) fn mark_lost(&self, reason: LostReason) -> bool {
        let first = self.lost.set(reason).is_ok();
        if first {
            self.lost_notify.notify_waiters();
        }
        first
    }

    /// Records the loss, logs it and tells the chain's observers; once only.
    pub(crate) fn report_lost(&self, chain: &HandlerChain, reason: LostReason) {
        if self.mark_lost(reason) {
            tracing::warn!(
                lock = %self.name, owner = %self.owner, token = self.token.get(), reason = %reason,
                "dlock: lock lost"
            );
            chain.notify_lost(&LostEvent::new(
                &self.name,
                &self.owner,
                self.mode,
                self.token,
                reason,
            ));
        }
    }

    pub(crate) fn set_suspended(&self, suspended: bool) {
        self.suspended.store(suspended, Ordering::Release);
    }

    pub(crate) fn is_suspended(&self) -> bool {
        self.suspended.load(Ordering::Acquire)
    }

    pub(crate) fn lost_reason(&self) -> Option<LostReason> {
        self.lost.get().copied()
    }

    /// Completes when the hold is lost (at once if it is already).
    pub(crate) async fn wait_lost(&self) -> LostReason {
        loop {
            let notified = self.lost_notify.notified();
            tokio::pin!(notified);
            // Registered before the check, so a loss in between still wakes us.
            notified.as_mut().enable();
            if let Some(reason) = self.lost_reason() {
                return reason;
            }
            notified.await;
        }
    }

    pub(crate) fn guards(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }
}
