//! One remote acquisition, shared by the reentrant guards of a handle.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Instant;

use dlock_spi::{
    FencingToken, GrantId, HandlerChain, HoldPurpose, LockMode, LockName, LostEvent, LostReason,
    OwnerId, ReleaseContext, ReleaseRequest,
};
use tokio::sync::Notify;

/// A lock granted by the backend. Reentrant acquisitions share it and bump `count`;
/// the remote release happens when `count` returns to zero.
pub(crate) struct Hold {
    pub(crate) id: u64,
    pub(crate) name: LockName,
    pub(crate) owner: OwnerId,
    /// The grant the backend made: releases and renewals name it, so they can never
    /// touch a later grant of the same owner.
    pub(crate) grant: GrantId,
    pub(crate) mode: LockMode,
    /// A lock's or a leadership's: releases say which.
    pub(crate) purpose: HoldPurpose,
    pub(crate) token: FencingToken,
    pub(crate) acquired_at: Instant,
    /// The session's connection is down: the hold may or may not still be held.
    suspended: AtomicBool,
    /// A hold with a transition window is suspended from this instant (its own
    /// lease, less the margin, passed without a renewal) until a renewal moves it.
    suspend_after: Mutex<Option<Instant>>,
    /// Until when a lease-based hold is guaranteed (the watchdog's loss instant, or
    /// the cap if sooner); `None` for a session-bound one.
    valid_until: Mutex<Option<Instant>>,
    /// Guards alive for this hold. Changed only under the handle's `current` mutex.
    pub(crate) count: AtomicUsize,
    /// Why the hold was lost; set once. With `lost_notify` instead of a watch
    /// channel: a hold costs no allocation for it, and dropping one wakes no one.
    lost: OnceLock<LostReason>,
    lost_notify: Notify,
    /// For a write granted beside its owner's read (an upgrade): a guard of that
    /// read, let go only once this hold is released — so the read outlasts the
    /// write, and no writer queued behind the read gets in while the write lasts
    /// (on ZooKeeper the read's node is what keeps them out).
    kept: Mutex<Option<Kept>>,
    /// The holds that keep this one (upgraded writes beside this read): lost
    /// with this one, so none is left standing when this one goes.
    keepers: Mutex<Vec<Weak<Hold>>>,
}

/// The read an upgraded write keeps ([`Hold::keep`]): its hold, and the guard
/// that keeps it (let go with this).
pub(crate) struct Kept {
    hold: Arc<Hold>,
    _guard: Box<dyn Send>,
}

impl Hold {
    pub(crate) fn new(
        id: u64,
        name: LockName,
        owner: OwnerId,
        grant: GrantId,
        mode: LockMode,
        token: FencingToken,
        acquired_at: Instant,
    ) -> Self {
        Hold {
            id,
            name,
            owner,
            grant,
            mode,
            purpose: HoldPurpose::Lock,
            token,
            acquired_at,
            suspended: AtomicBool::new(false),
            suspend_after: Mutex::new(None),
            valid_until: Mutex::new(None),
            count: AtomicUsize::new(1),
            lost: OnceLock::new(),
            lost_notify: Notify::new(),
            kept: Mutex::new(None),
            keepers: Mutex::new(Vec::new()),
        }
    }

    /// Keeps `guard` (a guard of `kept`, the hold this one was granted beside)
    /// until this hold is released; this hold is guaranteed no longer than that
    /// one, and lost first when that one is lost.
    pub(crate) fn keep(
        self: &Arc<Self>,
        kept: &Arc<Hold>,
        guard: impl Send + 'static,
        chain: &HandlerChain,
    ) {
        {
            let mut keepers = kept.keepers.lock().unwrap_or_else(PoisonError::into_inner);
            keepers.retain(|k| k.strong_count() > 0);
            keepers.push(Arc::downgrade(self));
        }
        *self.kept.lock().unwrap_or_else(PoisonError::into_inner) = Some(Kept {
            hold: Arc::clone(kept),
            _guard: Box::new(guard),
        });
        // Lost already (before the push was seen): so is this one.
        if let Some(reason) = kept.lost_reason() {
            self.lose(chain, reason);
        }
    }

    /// The guard kept by [`keep`](Self::keep), to let go once this hold is released.
    pub(crate) fn take_kept(&self) -> Option<Kept> {
        self.kept
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// Marks what the hold is for.
    pub(crate) fn for_purpose(mut self, purpose: HoldPurpose) -> Self {
        self.purpose = purpose;
        self
    }

    /// The one entry point for "this hold is lost", whoever finds out (the watchdog,
    /// a session feed, `unlock`, `close`): records the reason (the first one wins),
    /// wakes the guards' lost signals, logs, and tells the chain's handlers
    /// ([`dlock_spi::LockHandler::on_lost`]). Once only; true the first time.
    pub(crate) fn lose(&self, chain: &HandlerChain, reason: LostReason) -> bool {
        if self.lost.set(reason).is_err() {
            return false;
        }
        // The holds standing on this one are lost with it, before its caller gives
        // it back. (Set first, taken second: a `keep` in between sees the loss.)
        let keepers =
            std::mem::take(&mut *self.keepers.lock().unwrap_or_else(PoisonError::into_inner));
        for keeper in keepers.iter().filter_map(Weak::upgrade) {
            keeper.lose(chain, reason);
        }
        self.lost_notify.notify_waiters();
        tracing::warn!(
            lock = %self.name, owner = %self.owner, grant = %self.grant,
            token = self.token.get(), reason = %reason,
            "dlock: lock lost"
        );
        chain.notify_lost(&LostEvent::new(
            chain.resource().backend_name(),
            &self.name,
            &self.owner,
            self.mode,
            self.token,
            reason,
        ));
        true
    }

    pub(crate) fn set_suspended(&self, suspended: bool) {
        self.suspended.store(suspended, Ordering::Release);
    }

    pub(crate) fn is_suspended(&self) -> bool {
        self.suspended.load(Ordering::Acquire)
            || self
                .suspend_after
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_some_and(|at| Instant::now() >= at)
    }

    /// Sets when the hold's own lease (before its transition window) counts as over.
    pub(crate) fn set_suspend_after(&self, at: Option<Instant>) {
        *self
            .suspend_after
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = at;
    }

    /// Sets until when the hold is guaranteed.
    pub(crate) fn set_valid_until(&self, at: Option<Instant>) {
        *self
            .valid_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = at;
    }

    /// Until when the hold is guaranteed: `None` once lost, or when session-bound.
    pub(crate) fn valid_until(&self) -> Option<Instant> {
        if self.lost_reason().is_some() {
            return None;
        }
        let own = *self
            .valid_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // No later than the read an upgrade keeps (nothing once that read is lost).
        let kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        match kept.as_ref().map(|read| &read.hold) {
            Some(read) if read.lost_reason().is_some() => None,
            Some(read) => match (own, read.valid_until()) {
                (Some(own), Some(read)) => Some(own.min(read)),
                (own, _) => own,
            },
            None => own,
        }
    }

    /// The release of this hold's grant, as the chain takes it.
    pub(crate) fn release_context(&self, chain: &HandlerChain) -> ReleaseContext {
        ReleaseContext::new(
            ReleaseRequest::new(
                self.name.clone(),
                self.owner.clone(),
                self.grant,
                self.mode,
                self.token,
            )
            .with_purpose(self.purpose),
            chain.resource().backend_name(),
            Some(self.acquired_at),
        )
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
