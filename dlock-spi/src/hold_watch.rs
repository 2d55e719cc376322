//! Status feeds of session-bound holds.
//!
//! A ZooKeeper hold is an ephemeral node: it needs no lease renewal, but it can be
//! lost without the holder doing anything — the session expires, an operator deletes
//! the node. Such backends attach a [`HoldWatch`] to each grant
//! ([`crate::AcquireResult::with_watch`]) and publish on it; the manager marks the
//! guard suspended while the status is [`HoldStatus::Suspended`] and fires its lost
//! signal on [`HoldStatus::Lost`].

use std::fmt;

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

/// The receiving end of a hold's status feed. The backend keeps the sender and
/// publishes every change; when it drops the sender without publishing `Lost`, the
/// hold was released normally.
#[derive(Clone)]
pub struct HoldWatch(watch::Receiver<HoldStatus>);

impl HoldWatch {
    /// A new feed starting at [`HoldStatus::Held`]: the backend keeps the sender.
    pub fn channel() -> (watch::Sender<HoldStatus>, HoldWatch) {
        let (tx, rx) = watch::channel(HoldStatus::Held);
        (tx, HoldWatch(rx))
    }

    /// The latest status.
    pub fn status(&self) -> HoldStatus {
        *self.0.borrow()
    }

    /// Waits for the next change; `None` once the backend has dropped the sender.
    pub async fn changed(&mut self) -> Option<HoldStatus> {
        self.0.changed().await.ok()?;
        Some(*self.0.borrow_and_update())
    }
}

impl fmt::Debug for HoldWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("HoldWatch").field(&self.status()).finish()
    }
}

/// Two watches are equal when they follow the same hold.
impl PartialEq for HoldWatch {
    fn eq(&self, other: &Self) -> bool {
        self.0.same_channel(&other.0)
    }
}

impl Eq for HoldWatch {}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_feed_reports_changes_and_its_end() {
        let (tx, mut watch) = HoldWatch::channel();
        assert_eq!(watch.status(), HoldStatus::Held);
        assert_eq!(watch, watch.clone());
        assert_ne!(watch, HoldWatch::channel().1);
        tx.send_replace(HoldStatus::Suspended);
        assert_eq!(watch.changed().await, Some(HoldStatus::Suspended));
        tx.send_replace(HoldStatus::Lost(LostReason::SessionExpired));
        drop(tx);
        assert_eq!(
            watch.changed().await,
            Some(HoldStatus::Lost(LostReason::SessionExpired))
        );
        assert_eq!(watch.changed().await, None);
    }
}
