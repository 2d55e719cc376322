//! One remote acquisition, shared by the reentrant guards of a handle.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use dlock_spi::{FencingToken, HandlerChain, LockMode, LockName, LostEvent, LostReason, OwnerId};
use tokio::sync::watch;

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
    lost: watch::Sender<Option<LostReason>>,
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
            lost: watch::Sender::new(None),
        }
    }

    /// Records the loss; true the first time only.
    pub(crate) fn mark_lost(&self, reason: LostReason) -> bool {
        self.lost.send_if_modified(|slot| {
            if slot.is_none() {
                *slot = Some(reason);
                true
            } else {
                false
            }
        })
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
        *self.lost.borrow()
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<Option<LostReason>> {
        self.lost.subscribe()
    }

    pub(crate) fn guards(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }
}
