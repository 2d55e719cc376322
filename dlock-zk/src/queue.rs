//! A contender's node in a lock's queue: created (or adopted after a lost answer), found again, and the lock node it lives under.

use std::sync::Arc;
use std::time::Instant;

use dlock_spi::{Error, FencingToken, Result};
use zookeeper_client::{Error as ZkError, OneshotWatcher};

use crate::backend::{HeldKey, Inner};
use crate::error::{connection_failure, map_zk};
use crate::layout::{self, Contender};
use crate::nodes::{live_deadline, token_of, PendingNode};
use crate::session::{Session, Sessions};

/// Our contender node, while we wait: found in the queue, or gone.
pub(crate) struct Enqueued {
    pub(crate) node: String,
    pub(crate) token: FencingToken,
    pub(crate) children: Vec<String>,
    /// The child watch set by the latest listing: the holder's steal detector.
    pub(crate) watch: OneshotWatcher,
    /// Whether `children` is the queue exactly as it was when our node was created
    /// (no child came or went in between).
    pub(crate) at_creation: bool,
}

/// A contender node to be made: on which session, for which grant, under which
/// lock node, with which name prefix and data.
#[derive(Clone, Copy)]
pub(crate) struct Contending<'a> {
    pub(crate) session: &'a Arc<Session>,
    pub(crate) key: &'a HeldKey,
    pub(crate) lock: &'a str,
    pub(crate) prefix: &'a str,
    pub(crate) data: &'a [u8],
}

impl Contending<'_> {
    /// The node `node` of this contender, armed to be deleted unless disarmed.
    pub(crate) fn pending(&self, sessions: &Arc<Sessions>, node: &str) -> PendingNode {
        PendingNode::new(sessions, self.session, format!("{}/{node}", self.lock))
    }
}

/// Where a new contender node goes in a lock's queue.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Place<'a> {
    /// At the back: ZooKeeper's next sequence.
    Next,
    /// At this key, not sequential (a writer's read, at its write node's key).
    At(&'a str),
    /// Right after the node with this key: the key followed by ZooKeeper's next
    /// sequence (an upgrade's write node).
    After(&'a str),
}

impl Inner {
    /// Puts our node into the lock's queue and lists the queue, in one round trip:
    /// the create and the listing go out back to back on the session, which the
    /// server serves in order. Creates the lock's node (a container) when missing,
    /// finds our node again after a connection loss, and keeps only the oldest when
    /// the owner already had one (a retried or repeated acquire). `place`: where the
    /// node goes in the queue. A blip that takes the answer to the create or to
    /// the listing is ridden out until `deadline` (`None`: not at all): once the
    /// connection is back, the session living on, the queue is listed again.
    pub(crate) async fn enqueue(
        &self,
        who: Contending<'_>,
        place: Place<'_>,
        deadline: Option<Instant>,
    ) -> Result<Enqueued> {
        let Contending {
            session,
            key,
            lock,
            prefix,
            data,
        } = who;
        let client = &session.client;
        let (name, options) = match place {
            Place::Next => (prefix.to_owned(), self.acls.contender()),
            Place::At(key) => (format!("{prefix}{key}"), self.acls.placed()),
            Place::After(key) => (format!("{prefix}{key}"), self.acls.contender()),
        };
        let sequential = !matches!(place, Place::At(_));
        let node_path = format!("{lock}/{name}");
        for _ in 0..3 {
            let create = client.create(&node_path, data, &options);
            let list = client.get_and_watch_children(lock);
            let (created, listed) = tokio::join!(create, list);
            let (node, token, czxid) = match created {
                Ok((stat, sequence)) => {
                    let node = if sequential {
                        format!("{name}{sequence}")
                    } else {
                        name.clone()
                    };
                    (node, token_of(stat.czxid), stat.czxid)
                }
                Err(ZkError::NoNode) => {
                    self.create_lock_node(session, lock).await?;
                    continue;
                }
                // A placed node made by an earlier try whose answer was lost.
                Err(lost)
                    if connection_failure(&lost)
                        || (!sequential && matches!(lost, ZkError::NodeExists)) =>
                {
                    // The create may have happened: look for our node by its prefix.
                    let (children, watch) = self
                        .sessions
                        .across_blips(session, live_deadline(deadline), || {
                            client.list_and_watch_children(lock)
                        })
                        .await
                        .map_err(|e| map_zk(e, "list"))?;
                    match self
                        .adopt(session, key, lock, prefix, &children, None)
                        .await?
                    {
                        Some((node, token)) => {
                            return Ok(Enqueued {
                                node,
                                token,
                                children,
                                watch,
                                at_creation: false,
                            })
                        }
                        None => continue,
                    }
                }
                Err(err) => return Err(map_zk(err, "create")),
            };
            // The node is made; a blip took the listing's answer: list again.
            let listed = match listed {
                Err(err) if self.sessions.back_from_blip(session, &err, deadline).await => {
                    self.sessions
                        .across_blips(session, deadline, || client.get_and_watch_children(lock))
                        .await
                }
                listed => listed,
            };
            let (children, parent, watch) = match listed {
                Ok(listed) => listed,
                Err(err) => {
                    self.sessions
                        .delete_later(session, format!("{lock}/{node}"));
                    return Err(map_zk(err, "list"));
                }
            };
            // Nothing changed among the children between our create and the listing.
            let at_creation = parent.pzxid == czxid;
            let created = node.clone();
            let (node, token) = self
                .adopt(session, key, lock, prefix, &children, Some((node, token)))
                .await?
                .ok_or_else(|| {
                    Error::new(
                        dlock_spi::ErrorKind::Backend,
                        "ZooKeeper lost a node it had just created; retry",
                    )
                })?;
            return Ok(Enqueued {
                at_creation: at_creation && node == created,
                node,
                token,
                children,
                watch,
            });
        }
        Err(Error::new(
            dlock_spi::ErrorKind::Backend,
            "could not queue for the lock: its ZooKeeper node keeps disappearing; retry",
        )
        .set_retryable(true))
    }

    /// Of the grant's nodes among `children` (same prefix), keeps the oldest one that
    /// belongs to `session` and deletes the others — also those of an earlier session
    /// of this backend (an acquire retried after its session ended), which must never
    /// be adopted: they vanish when that session expires. `created` is the node just
    /// made, with its token.
    pub(crate) async fn adopt(
        &self,
        session: &Session,
        key: &HeldKey,
        lock: &str,
        prefix: &str,
        children: &[String],
        created: Option<(String, FencingToken)>,
    ) -> Result<Option<(String, FencingToken)>> {
        let mut mine: Vec<Contender> = children
            .iter()
            .filter(|c| c.starts_with(prefix))
            .filter_map(|c| Contender::parse(c))
            .collect();
        mine.sort_by(|a, b| a.key.cmp(&b.key));
        // The common case: the node just created is the grant's only one.
        if let ([only], Some((node, _))) = (mine.as_slice(), &created) {
            if only.node == *node {
                return Ok(created);
            }
        }
        // Otherwise read every candidate's owner session, all requests out at once.
        let stats: Vec<_> = mine
            .iter()
            .map(|c| session.client.check_stat(&format!("{lock}/{}", c.node)))
            .collect();
        let mut kept: Option<(String, FencingToken)> = None;
        let mut extras = Vec::new();
        for (candidate, stat) in mine.iter().zip(stats) {
            match stat.await.map_err(|e| map_zk(e, "stat"))? {
                Some(stat) if stat.ephemeral_owner == session.id().0 && kept.is_none() => {
                    kept = Some((candidate.node.clone(), token_of(stat.czxid)));
                }
                Some(_) => extras.push(candidate.node.clone()),
                None => {}
            }
        }
        // Sent together, awaited together: the queue is clean when we answer.
        let deletes: Vec<_> = extras
            .iter()
            .map(|node| session.client.delete(&format!("{lock}/{node}"), None))
            .collect();
        for delete in deletes {
            match delete.await {
                Ok(()) | Err(ZkError::NoNode) => {}
                Err(err) => return Err(map_zk(err, "delete")),
            }
        }
        // A node this backend already tracks keeps its recorded token.
        Ok(kept.map(|(node, token)| {
            let path = format!("{lock}/{node}");
            let known = self
                .held()
                .get(key)
                .filter(|h| h.path == path)
                .map(|h| h.token);
            (node, known.unwrap_or(token))
        }))
    }

    /// Creates a lock's node (a container) — or a semaphore's `locks` or `leases`
    /// node below it — and what is missing above it, up to the root.
    pub(crate) async fn create_lock_node(&self, session: &Session, lock: &str) -> Result<()> {
        for _ in 0..2 {
            match session
                .client
                .create(lock, &[], &self.acls.lock_node())
                .await
            {
                Ok(_) | Err(ZkError::NodeExists) => return Ok(()),
                Err(ZkError::NoNode) => match lock.rsplit_once('/') {
                    Some((parent, _)) if parent.len() > self.root.len() => {
                        Box::pin(self.create_lock_node(session, parent)).await?;
                    }
                    // The root itself is gone (deleted by hand): put it back.
                    _ => session
                        .client
                        .mkdir(&self.root, &self.acls.root())
                        .await
                        .map_err(|e| map_zk(e, "create root"))?,
                },
                Err(err) => return Err(map_zk(err, "create lock node")),
            }
        }
        Ok(())
    }

    /// Finds an owner's node under a lock by its prefix (when this backend does not
    /// know it: another handle's stale guard, a restarted process).
    pub(crate) async fn find(&self, lock: &str, prefix: &str) -> Result<Option<String>> {
        let session = self.sessions.usable(None, None).await?;
        match session.client.list_children(lock).await {
            Ok(children) => Ok(children
                .into_iter()
                .filter(|c| c.starts_with(prefix))
                .min_by_key(|c| Contender::parse(c).map(|c| c.key))
                .map(|c| format!("{lock}/{c}"))),
            Err(ZkError::NoNode) => Ok(None),
            Err(err) => Err(map_zk(err, "list")),
        }
    }

    /// The path of the owner's node for a release or renewal (a semaphore grant's
    /// first lease).
    pub(crate) async fn node_of(&self, key: &HeldKey) -> Result<Option<String>> {
        if let Some(held) = self.held().get(key) {
            return Ok(Some(held.path.clone()));
        }
        let mut lock = layout::lock_path(&self.root, &key.name);
        if key.mode.permits().is_some() {
            lock = crate::layout::leases_dir(&lock);
        }
        // The protection id alone names the grant's node, whatever its marker.
        self.find(&lock, &layout::protected_prefix(&key.holder))
            .await
    }
}
