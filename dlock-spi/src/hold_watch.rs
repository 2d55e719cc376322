//! Status feeds of session-bound holds.
//!
//! A ZooKeeper hold is an ephemeral node: it needs no lease renewal, but it can be
//! lost without the holder doing anything — the session expires, an operator deletes
//! the node. Such backends attach a [`HoldWatch`] to each grant
//! ([`crate::AcquireResult::with_watch`]). The manager drives the feed in one task per
//! hold: it marks the guard suspended while the status is [`HoldStatus::Suspended`]
//! and fires its lost signal on [`HoldStatus::Lost`]. A feed that has nothing to say
//! for a while after the grant ([`HoldFeed::quiet_for`]) is first polled that late,
//! and a hold released sooner costs no task at all.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use tokio::sync::watch;

use crate::types::LostReason;

/// How a session-bound hold stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HoldStatus {
    /// Held, connection up.
    Held,
    /// The connection is down; the session — and the hold — may still be alive on the
    /// server. Not a loss yet: protected work should pause.
    Suspended,
    /// Gone, for this reason. Final.
    Lost(LostReason),
}

/// The backend's side of a feed: produces status changes when polled. Driven by the
/// follower's task, so a backend needs no task of its own per hold.
#[async_trait]
pub trait HoldFeed: Send + 'static {
    /// Waits for the next change of status; `None` once the hold has ended without a
    /// loss (it was released) and nothing more will come.
    ///
    /// # Cancel safety
    ///
    /// The follower drops a pending call when the hold is released or lost; a feed
    /// is not asked again after that.
    async fn next(&mut self) -> Option<HoldStatus>;

    /// How long from now the feed will report nothing, whatever happens: a feed
    /// that first looks at its session some time after the grant (a probe every
    /// few seconds) says how long until that look. The follower may poll it first
    /// that late, and drops it unpolled if the hold is released sooner — so
    /// [`next`](Self::next) must not count on being polled before then (a probe
    /// due then, polled late, looks at once). Default zero: polled at once, as a
    /// feed that may report at any moment (a pushed session event) must be.
    fn quiet_for(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
}

/// A grant's status feed. Clones share one feed, which the follower
/// [`take`](Self::take)s once.
#[derive(Clone)]
pub struct HoldWatch {
    feed: Arc<Mutex<Option<Box<dyn HoldFeed>>>>,
}

impl HoldWatch {
    /// Wraps a backend's feed.
    pub fn new(feed: impl HoldFeed) -> Self {
        HoldWatch {
            feed: Arc::new(Mutex::new(Some(Box::new(feed)))),
        }
    }

    /// A feed the backend pushes into from its own task: publish on the sender; drop
    /// it (without publishing `Lost`) when the hold is released.
    pub fn channel() -> (watch::Sender<HoldStatus>, HoldWatch) {
        let (tx, rx) = watch::channel(HoldStatus::Held);
        (tx, HoldWatch::new(ChannelFeed(rx)))
    }

    /// Takes the feed to drive it; `None` if it was taken already.
    pub fn take(&self) -> Option<Box<dyn HoldFeed>> {
        self.feed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

struct ChannelFeed(watch::Receiver<HoldStatus>);

#[async_trait]
impl HoldFeed for ChannelFeed {
    async fn next(&mut self) -> Option<HoldStatus> {
        self.0.changed().await.ok()?;
        Some(*self.0.borrow_and_update())
    }
}

impl fmt::Debug for HoldWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HoldWatch").finish_non_exhaustive()
    }
}

/// Two watches are equal when they share one feed.
impl PartialEq for HoldWatch {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.feed, &other.feed)
    }
}

impl Eq for HoldWatch {}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_channel_feed_reports_changes_and_its_end_and_is_taken_once() {
        let (tx, watch) = HoldWatch::channel();
        assert_eq!(watch, watch.clone());
        assert_ne!(watch, HoldWatch::channel().1);
        let mut feed = watch.take().unwrap_or_else(|| panic!("first take"));
        assert!(watch.clone().take().is_none());
        tx.send_replace(HoldStatus::Suspended);
        assert_eq!(feed.next().await, Some(HoldStatus::Suspended));
        tx.send_replace(HoldStatus::Lost(LostReason::SessionExpired));
        drop(tx);
        assert_eq!(
            feed.next().await,
            Some(HoldStatus::Lost(LostReason::SessionExpired))
        );
        assert_eq!(feed.next().await, None);
    }
}
