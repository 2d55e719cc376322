//! A hold's watch: its node's deletion or its session's end, told to the manager.

use std::sync::{Arc, Weak};

use dlock_spi::{async_trait, FencingToken, HoldFeed, HoldStatus, HoldWatch, LostReason};
use tokio::sync::watch;
use zookeeper_client::{Error as ZkError, EventType, OneshotWatcher, WatchedEvent};

use crate::backend::{HeldKey, Inner, ZkBackend};
use crate::session::{Session, SessionPhase};

impl ZkBackend {
    /// The feed that tells the guard how the hold stands: suspended while the
    /// connection is down, lost when the session ends or our node is deleted by
    /// someone else. It rides on the child watch the acquire's listing already set
    /// (no extra request): a change among the lock's children makes it list again and
    /// check that our node is still there. The manager drives it; it ends on release.
    pub(crate) fn watch_hold(
        &self,
        session: &Arc<Session>,
        key: HeldKey,
        lock: String,
        node: String,
        token: FencingToken,
        children_watch: OneshotWatcher,
    ) -> HoldWatch {
        HoldWatch::new(ZkHoldFeed {
            client: session.client.clone(),
            session: session.id(),
            sessions: self.inner.sessions.subscribe(),
            inner: Arc::downgrade(&self.inner),
            key,
            token,
            lock,
            node,
            watcher: Some(Box::pin(children_watch.changed())),
            last: HoldStatus::Held,
        })
    }
}

/// How one hold stands, worked out when its follower polls: child-watch events on
/// the lock's node and the session's status.
pub(crate) struct ZkHoldFeed {
    client: zookeeper_client::Client,
    session: crate::session::SessionId,
    sessions: watch::Receiver<crate::session::SessionStatus>,
    inner: Weak<Inner>,
    key: HeldKey,
    /// The node's creation zxid: tells our node from a later one of the same owner.
    token: FencingToken,
    lock: String,
    node: String,
    /// The pending child-watch event; `None` while there is no watch (trouble).
    watcher: Option<PendingEvent>,
    last: HoldStatus,
}

impl ZkHoldFeed {
    /// Whether this backend still holds the node (not released by its owner).
    fn still_ours(&self) -> bool {
        self.inner.upgrade().is_some_and(|inner| {
            inner
                .held()
                .get(&self.key)
                .is_some_and(|h| h.token == self.token)
        })
    }

    /// Lists the lock's children with a new watch: `Some(Lost)` if our node is gone,
    /// `None` otherwise (watch renewed, or connection trouble: the session decides).
    async fn recheck(&mut self) -> Option<HoldStatus> {
        match self.client.list_and_watch_children(&self.lock).await {
            Ok((children, w)) if children.contains(&self.node) => {
                self.watcher = Some(Box::pin(w.changed()));
                None
            }
            Ok(_) | Err(ZkError::NoNode) => Some(HoldStatus::Lost(LostReason::NotOwner)),
            Err(_) => None,
        }
    }
}

#[async_trait]
impl HoldFeed for ZkHoldFeed {
    async fn next(&mut self) -> Option<HoldStatus> {
        loop {
            if matches!(self.last, HoldStatus::Lost(_)) {
                return None;
            }
            let status = tokio::select! {
                event = next_event(&mut self.watcher) => {
                    self.watcher = None;
                    if !self.still_ours() {
                        return None;
                    }
                    if event.event_type == EventType::Session {
                        // The session status below tells suspension from expiry.
                        continue;
                    }
                    match self.recheck().await {
                        Some(lost) => lost,
                        None => continue,
                    }
                }
                changed = self.sessions.changed() => {
                    if changed.is_err() {
                        return None;
                    }
                    let status = *self.sessions.borrow_and_update();
                    match status.phase {
                        _ if status.id != self.session => HoldStatus::Lost(LostReason::SessionExpired),
                        SessionPhase::Lost => HoldStatus::Lost(LostReason::SessionExpired),
                        SessionPhase::Suspended => HoldStatus::Suspended,
                        // Back after trouble that cost us the watch: check and watch again.
                        SessionPhase::Connected if self.watcher.is_none() => {
                            self.recheck().await.unwrap_or(HoldStatus::Held)
                        }
                        SessionPhase::Connected => HoldStatus::Held,
                    }
                }
            };
            if !self.still_ours() {
                return None;
            }
            if status != self.last {
                self.last = status;
                return Some(status);
            }
        }
    }
}

/// A child-watch event still to come.
pub(crate) type PendingEvent =
    std::pin::Pin<Box<dyn std::future::Future<Output = WatchedEvent> + Send>>;

/// The next child-watch event, or never when there is no watch.
pub(crate) async fn next_event(watcher: &mut Option<PendingEvent>) -> WatchedEvent {
    match watcher {
        Some(event) => event.await,
        None => std::future::pending().await,
    }
}
