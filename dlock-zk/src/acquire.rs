//! The acquire algorithm: a contender's node, then the wait for its turn — the node ahead deleted, the deadline, or the session's end.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use dlock_spi::{AcquireRequest, AcquireResult, Error, HolderKey, LockMode, Result};
use zookeeper_client::Error as ZkError;

use crate::backend::{HeldKey, HeldNode, ZkBackend, MAX_ENQUEUES};
use crate::error::map_zk;
use crate::layout::{self, Contender};
use crate::nodes::{deadline_passed, live_deadline, node_data, token_of, PendingNode};
use crate::queue::{Contending, Enqueued, Place};
use crate::session::Session;

/// How a contender waits for its turn.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Turn<'a> {
    /// Until when it may wait (`None`: look once).
    pub(crate) deadline: Option<Instant>,
    /// For a writer's read: its owner's write node, which it is placed beside (at
    /// that node's sequence, instead of ZooKeeper's next one) and which never
    /// blocks it.
    pub(crate) beside: Option<&'a Contender>,
}

impl Turn<'_> {
    /// A plain turn: queued last, by Curator's rules.
    pub(crate) fn until(deadline: Option<Instant>) -> Self {
        Turn {
            deadline,
            beside: None,
        }
    }
}

impl ZkBackend {
    /// One acquire in one session.
    pub(crate) async fn acquire_in(
        &self,
        session: &Arc<Session>,
        req: &AcquireRequest,
    ) -> Result<AcquireResult> {
        if let LockMode::Permits(n) = req.mode {
            return self.acquire_permits_in(session, req, n).await;
        }
        let inner = &self.inner;
        let lock = layout::lock_path(&inner.root, &req.name);
        // Nodes belong to the grant: its key makes the protection id and the data, so
        // each grant has its own node, and releasing one never deletes — or adopts —
        // another's.
        let holder = req.holder();
        let prefix = layout::node_prefix(&holder, req.mode, inner.exclusive, req.purpose);
        let data = node_data(&holder, &req.context);
        let key = HeldKey::new(&req.name, holder, req.mode);
        // A read beside the owner's own write node is placed at that node's key, so
        // it stays ahead of every writer queued behind the write — and keeps them
        // out once the write goes (a downgrade). A write beside the owner's read is
        // an upgrade (the `upgrade` module), which finds that read in its own
        // listings.
        let other = req.alongside_holder();
        let upgrading = other
            .as_ref()
            .filter(|_| req.mode != LockMode::Shared)
            .map(layout::protected_prefix);
        let beside = match &other {
            Some(own) if req.mode == LockMode::Shared => self.own_node(session, &lock, own).await?,
            _ => None,
        };
        let who = Contending {
            session,
            key: &key,
            lock: &lock,
            prefix: &prefix,
            data: &data,
        };
        let waited = match &upgrading {
            Some(read) => self.wait_upgrade(who, read, req.deadline).await?,
            None => {
                let turn = Turn {
                    deadline: req.deadline,
                    beside: beside.as_ref(),
                };
                self.wait_turn(who, turn).await?
            }
        };
        let Some((mine, mut pending)) = waited else {
            return Ok(AcquireResult::not_acquired(None, None));
        };
        pending.disarm();
        // A read placed beside its owner's write carries the write's token: it goes
        // on with that tenure. Its own node's zxid is newer than those of the writers
        // queued behind the write, which are granted after it and must have newer
        // tokens. An upgrade carries its read's token for the same reason: the
        // writers queued behind that read are granted after the upgrade. (Only if
        // the other node was still there at the grant: else it was granted by the
        // plain rules, and its own zxid is its token.)
        let stood_on = match (&upgrading, &beside) {
            (Some(read), _) => mine
                .children
                .iter()
                .find(|c| c.starts_with(read.as_str()))
                .map(|node| (node.as_str(), LockMode::Shared)),
            (None, Some(write)) => mine
                .children
                .contains(&write.node)
                .then_some((write.node.as_str(), LockMode::Exclusive)),
            (None, None) => None,
        };
        let token = match (other, stood_on) {
            (Some(own), Some((node, mode))) => {
                let known = inner
                    .held()
                    .get(&HeldKey::new(&req.name, own, mode))
                    .map(|h| h.token);
                match known {
                    Some(token) => token,
                    None => match session.client.check_stat(&format!("{lock}/{node}")).await {
                        Ok(Some(stat)) => token_of(stat.czxid),
                        Ok(None) | Err(_) => mine.token,
                    },
                }
            }
            _ => mine.token,
        };
        inner.held().insert(
            key.clone(),
            HeldNode {
                path: format!("{lock}/{}", mine.node),
                token,
                extra: Vec::new(),
            },
        );
        let watch = self.watch_hold(session, key, lock, mine.node, token, mine.watch);
        Ok(AcquireResult::acquired(token, None).with_watch(watch))
    }

    /// The owner's node named by `own` (its protection id, whatever its marker)
    /// among the children of `lock`, if it is there.
    pub(crate) async fn own_node(
        &self,
        session: &Session,
        lock: &str,
        own: &HolderKey,
    ) -> Result<Option<Contender>> {
        let prefix = layout::protected_prefix(own);
        match session.client.list_children(lock).await {
            Ok(children) => Ok(children
                .iter()
                .filter(|c| c.starts_with(&prefix))
                .find_map(|c| Contender::parse(c))),
            Err(ZkError::NoNode) => Ok(None),
            Err(err) => Err(map_zk(err, "list")),
        }
    }

    /// Queues a contender node (`prefix`, `data`) under `lock` and waits until it
    /// stands first by Curator's rules ([`layout::standing`]): `Some` with the node
    /// (still armed to be deleted: the caller disarms it to keep it), or `None` once
    /// the turn's deadline passes (the node deleted). Watches only the node just
    /// ahead.
    pub(crate) async fn wait_turn(
        &self,
        who: Contending<'_>,
        turn: Turn<'_>,
    ) -> Result<Option<(Enqueued, PendingNode)>> {
        let inner = &self.inner;
        let (session, lock) = (who.session, who.lock);
        let Turn { deadline, beside } = turn;
        let place = beside.map_or(Place::Next, |own| Place::At(&own.key));
        let mut mine = inner.enqueue(who, place, deadline).await?;
        let mut pending = who.pending(&inner.sessions, &mine.node);
        // A read placed beside a write that was gone by the time it was made (the
        // writers queued behind that write may hold now) must not stand there: it
        // queues at the back, as any other.
        let mut beside = beside.map(|own| own.node.as_str());
        if beside.is_some_and(|own| !mine.children.iter().any(|c| c == own)) {
            pending.delete().await;
            mine = inner.enqueue(who, Place::Next, deadline).await?;
            pending = who.pending(&inner.sessions, &mine.node);
            beside = None;
        }
        let mut enqueues = 1;
        loop {
            inner.attempts.fetch_add(1, Ordering::Relaxed);
            let queue = layout::contenders(&mine.children);
            let Some(index) = queue.iter().position(|c| c.node == mine.node) else {
                // Our node vanished (deleted by an operator, or its session ended).
                pending.disarm();
                if enqueues >= MAX_ENQUEUES || deadline_passed(deadline) {
                    return Ok(None);
                }
                // Queued again at the back, by the plain rules (the hold it stood
                // beside may be gone by now too).
                beside = None;
                mine = inner.enqueue(who, Place::Next, deadline).await?;
                pending = who.pending(&inner.sessions, &mine.node);
                enqueues += 1;
                continue;
            };
            let ahead = match layout::standing(&queue, index, beside) {
                Ok(ahead) => ahead.map(|c| format!("{lock}/{}", c.node)),
                Err(()) => {
                    return Err(Error::new(
                        dlock_spi::ErrorKind::Backend,
                        "dlock-zk lost track of its node in the queue (a bug); retry",
                    ))
                }
            };
            let Some(ahead) = ahead else {
                return Ok(Some((mine, pending)));
            };
            if !self
                .wait_behind(session, lock, &ahead, deadline, &mut mine, &mut pending)
                .await?
            {
                return Ok(None);
            }
        }
    }

    /// Waits for the node at `ahead` to go (or change), then lists the lock's queue
    /// again into `mine`; `false`, with our node deleted, when the deadline passed
    /// first.
    pub(crate) async fn wait_behind(
        &self,
        session: &Arc<Session>,
        lock: &str,
        ahead: &str,
        deadline: Option<Instant>,
        mine: &mut Enqueued,
        pending: &mut PendingNode,
    ) -> Result<bool> {
        let Some(deadline) = live_deadline(deadline) else {
            pending.delete().await;
            return Ok(false);
        };
        if !self.await_change(session, ahead, deadline).await? {
            pending.delete().await;
            return Ok(false);
        }
        let listed = self
            .inner
            .sessions
            .across_blips(session, Some(deadline), || {
                session.client.list_and_watch_children(lock)
            })
            .await;
        match listed {
            Ok((children, watch)) => (mine.children, mine.watch) = (children, watch),
            // The lock node is gone, and our node with it.
            Err(ZkError::NoNode) => mine.children.clear(),
            Err(err) => return Err(map_zk(err, "list")),
        }
        Ok(true)
    }

    /// Waits until the node at `ahead` goes (or changes); `false` when `deadline`
    /// comes first.
    pub(crate) async fn await_change(
        &self,
        session: &Arc<Session>,
        ahead: &str,
        deadline: Instant,
    ) -> Result<bool> {
        match session.client.check_and_watch_stat(ahead).await {
            Ok((None, _)) => Ok(true),
            Ok((Some(_), watcher)) => Ok(tokio::select! {
                _ = watcher.changed() => true,
                () = tokio::time::sleep_until(deadline.into()) => false,
            }),
            // A blip: our node survives it with the session; look again.
            Err(err)
                if self
                    .inner
                    .sessions
                    .back_from_blip(session, &err, Some(deadline))
                    .await =>
            {
                Ok(true)
            }
            Err(err) => Err(map_zk(err, "watch")),
        }
    }
}
