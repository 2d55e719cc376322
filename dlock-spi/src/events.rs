//! Change feeds: how a backend that can push tells observers (leader elections'
//! followers) that a lock's holders changed, so they need not poll.

use std::fmt;

use async_trait::async_trait;
use tokio::sync::watch;

use crate::error::Result;
use crate::name::LockName;
use crate::resubscribe::{Resubscribe, Subscription};

/// An optional ability of a backend ([`crate::LockRemoteResource::events`]): follow a
/// lock's holders without polling.
#[async_trait]
pub trait LockEvents: Send + Sync {
    /// Starts following `name`. The feed is live when this returns: every change made
    /// after it — a grant, a release, a renewal that stored a new context, and a hold
    /// the store removed (force-release; an expiry, where the store reports one) —
    /// wakes [`ChangeFeed::changed`] at least once. Spurious wake-ups are allowed;
    /// a feed that lost its connection wakes once it is back (changes may have been
    /// missed meanwhile), and ends (`false`) if it cannot follow any more.
    ///
    /// An expiry the store does not report is the observer's to notice: it re-reads
    /// when the holder's remaining lease runs out.
    async fn follow(&self, name: &LockName) -> Result<ChangeFeed>;
}

/// A feed of "something changed" pings for one lock. Dropping it stops following.
pub struct ChangeFeed {
    rx: watch::Receiver<u64>,
    _keep: Box<dyn Send + Sync>,
}

impl ChangeFeed {
    /// A feed the backend bumps through the sender (any new value is a ping); `keep`
    /// is dropped with the feed (a registration, a task's abort handle).
    pub fn new(rx: watch::Receiver<u64>, keep: impl Send + Sync + 'static) -> Self {
        ChangeFeed {
            rx,
            _keep: Box::new(keep),
        }
    }

    /// A sender and the feed it pings, with nothing else to keep.
    pub fn channel() -> (watch::Sender<u64>, ChangeFeed) {
        let (tx, rx) = watch::channel(0);
        (tx, ChangeFeed::new(rx, ()))
    }

    /// A feed kept up by `how` in a task of its own: `make` builds the
    /// [`Subscription`] around the feed's sender (it pings on each change and on
    /// [`Subscription::resubscribed`]); `live` is its first subscription, made
    /// before, so the feed is live when this returns. The task ends with the feed
    /// (or when `how` gives up: the sender dropped, [`ChangeFeed::changed`] says
    /// `false`). Call it within a Tokio runtime.
    pub fn kept_up<S>(
        how: Resubscribe,
        live: S::Live,
        make: impl FnOnce(watch::Sender<u64>) -> S,
    ) -> Self
    where
        S: Subscription + 'static,
        S::Live: 'static,
    {
        let (tx, rx) = watch::channel(0);
        let subscription = make(tx);
        let task = tokio::spawn(async move {
            how.run(subscription, Some(live)).await;
        });
        ChangeFeed::new(rx, crate::TaskGuard::new(task))
    }

    /// Waits for the next ping; `false` once the backend stopped feeding (the caller
    /// then polls).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a ping that arrives while nobody waits is kept for the next call.
    pub async fn changed(&mut self) -> bool {
        self.rx.changed().await.is_ok()
    }
}

impl fmt::Debug for ChangeFeed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChangeFeed")
            .field("pings", &*self.rx.borrow())
            .finish()
    }
}
