//! An upgradeable read's upgrade: a write node beside its owner's read node, safe
//! beside Curator's readers and writers on the same path.
//!
//! Curator's `InterProcessReadWriteLock` sorts a lock's children by the digits
//! after their marker, compared as strings, and a reader holds once no write node
//! sorts ahead of it. Nobody can tell a holding Curator reader from a waiting one —
//! and a reader queued behind a writer holds as soon as that writer leaves, which a
//! `try_lock` writer may do at any time. So an upgrade must know, of every reader,
//! whether it may hold now or ever, and it learns that from the queue as it was
//! the moment its write node was made:
//!
//! 1. The write node is placed right behind the last reader that stands before the
//!    first writer (or behind the last reader, with no writer): its name is that
//!    reader's key followed by ZooKeeper's next sequence, `…-__WRIT__<anchor
//!    key><sequence>`, which sorts right after the anchor for Curator and dlock
//!    alike. Every reader made later, and every reader behind a writer, sees a write
//!    node ahead of it from then on and never holds while the upgrade lasts.
//! 2. The create and a listing go out back to back; the listing is the queue as it
//!    was at the create exactly when the lock node's `pzxid` (the last child change)
//!    is the new node's `czxid`. Otherwise the node is deleted and placed again.
//! 3. In that listing, a reader made before the write node may hold unless a
//!    writer made before it was still there: such a reader saw that writer at each
//!    look until the write node came, and sees the write node after. The readers
//!    that may hold must all stand ahead of the write node — one behind it might
//!    look only now, see the write node and wait for it while the upgrade waits for
//!    the reader — else the node is placed again (a writer left in between).
//! 4. The upgrade holds once those readers are gone; its owner's read stays
//!    throughout, so writers queued behind that read keep waiting.
//!
//! Before each placement every node of the upgrade's grant still there (an earlier
//! placement whose delete failed) is deleted, and awaited: such a node would stand
//! in the way of every reader behind it. An upgrade whose read is gone is a write
//! as any other, queued at the back.
//!
//! Its fencing token is its read's: the writers queued behind that read, granted
//! after the upgrade, have newer ones (readers granted beside the read before the
//! upgrade may have newer ones too: an upgrade goes on with its read's tenure, as a
//! downgrade's read goes on with its write's).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use dlock_spi::{Error, ErrorKind, LockMode, Result};
use zookeeper_client::Error as ZkError;

use crate::acquire::Turn;
use crate::backend::ZkBackend;
use crate::error::map_zk;
use crate::layout::{self, Contender};
use crate::nodes::{deadline_passed, delete_children, live_deadline, PendingNode};
use crate::queue::{Contending, Enqueued, Place};
use crate::session::Session;

/// How often an upgrade places its write node again because the queue changed
/// while it was made (a reader came in the round trip before the create, or a
/// writer left), before giving up with a retryable error — if its deadline has not
/// ended it first.
const MAX_PLACEMENTS: usize = 256;

/// What an upgrade does on a listing of the lock's queue, before its write node is
/// made.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Plan<'q> {
    /// Make the write node right behind the node with key `anchor`; `read` is the
    /// owner's read node.
    After { anchor: &'q str, read: &'q str },
    /// A write node stands ahead of the owner's read (it cannot hold the read,
    /// then): wait for it to go, and look again.
    WaitFor(&'q Contender),
    /// The owner's read node is not in the queue.
    ReadGone,
}

/// Where the write node of an upgrade beside the read node of the grant whose
/// protected prefix is `read` goes in `queue` (which holds no node of the
/// upgrade's own grant: see `queue_without`).
pub(crate) fn plan<'q>(queue: &'q [Contender], read: &str) -> Plan<'q> {
    let Some(at) = queue
        .iter()
        .position(|c| c.mode == LockMode::Shared && c.node.starts_with(read))
    else {
        return Plan::ReadGone;
    };
    let first_writer = queue.iter().position(|c| c.mode != LockMode::Shared);
    if let Some(writer) = first_writer.map(|w| &queue[w]) {
        if writer.key <= queue[at].key {
            return Plan::WaitFor(writer);
        }
    }
    let anchor = queue[..first_writer.unwrap_or(queue.len())]
        .iter()
        .rfind(|c| c.mode == LockMode::Shared)
        .unwrap_or(&queue[at]);
    Plan::After {
        anchor: &anchor.key,
        read: &queue[at].node,
    }
}

/// Judges `queue` as it was when the upgrade's write node `me` was made, beside
/// the owner's `read` node: the readers that may hold (to wait for), or `None` when
/// the node must be placed again (a writer ahead of it, or a reader that may hold
/// behind it).
pub(crate) fn readers_to_wait_for(
    queue: &[Contender],
    me: &str,
    read: &str,
) -> Option<Vec<String>> {
    let me = queue.iter().find(|c| c.node == me)?;
    let made = me.created();
    let writers: Vec<&Contender> = queue
        .iter()
        .filter(|c| c.mode != LockMode::Shared && c.node != me.node)
        .collect();
    if writers.iter().any(|w| w.key < me.key) {
        return None;
    }
    let mut wait_for = Vec::new();
    for reader in queue.iter().filter(|c| c.mode == LockMode::Shared) {
        let behind_a_writer = writers
            .iter()
            .any(|w| w.key < reader.key && w.created() < reader.created());
        if reader.node == read || reader.created() >= made || behind_a_writer {
            continue;
        }
        if reader.key > me.key {
            return None;
        }
        wait_for.push(reader.node.clone());
    }
    Some(wait_for)
}

impl ZkBackend {
    /// Waits until an upgrade beside the owner's read (the node of the grant whose
    /// protected prefix is `read`) holds: `Some` with its write node (still armed to
    /// be deleted), `None` once the deadline passes (the node deleted).
    pub(crate) async fn wait_upgrade(
        &self,
        who: Contending<'_>,
        read: &str,
        deadline: Option<Instant>,
    ) -> Result<Option<(Enqueued, PendingNode)>> {
        let inner = &self.inner;
        let (session, lock) = (who.session, who.lock);
        let own = layout::protected_prefix(who.key.holder());
        let mut placements = 0;
        loop {
            let children = self.queue_without(session, lock, &own, deadline).await?;
            inner.attempts.fetch_add(1, Ordering::Relaxed);
            let queue = layout::contenders(&children);
            let (anchor, read) = match plan(&queue, read) {
                Plan::ReadGone => return self.wait_turn(who, Turn::until(deadline)).await,
                Plan::WaitFor(writer) => {
                    let writer = format!("{lock}/{}", writer.node);
                    let changed = match live_deadline(deadline) {
                        Some(until) => self.await_change(session, &writer, until).await?,
                        None => false,
                    };
                    if !changed {
                        return Ok(None);
                    }
                    continue;
                }
                Plan::After { anchor, read } => (anchor.to_owned(), read.to_owned()),
            };
            placements += 1;
            if placements > MAX_PLACEMENTS {
                return Err(Error::new(
                    ErrorKind::Backend,
                    "the lock's ZooKeeper queue kept changing while the upgrade took its place; retry",
                )
                .set_retryable(true));
            }
            let mut mine = inner.enqueue(who, Place::After(&anchor), deadline).await?;
            let mut pending = who.pending(&inner.sessions, &mine.node);
            let judged = if mine.at_creation {
                let queue = layout::contenders(&mine.children);
                readers_to_wait_for(&queue, &mine.node, &read)
            } else {
                None
            };
            let Some(readers) = judged else {
                // Placed again on a fresh listing (the next round clears this node
                // if its delete failed).
                pending.delete().await;
                if deadline_passed(deadline) {
                    return Ok(None);
                }
                continue;
            };
            loop {
                inner.attempts.fetch_add(1, Ordering::Relaxed);
                if !mine.children.contains(&read) || !mine.children.contains(&mine.node) {
                    // The read went (lost with its session, or deleted by hand: the
                    // next round queues as a plain writer), or our node did (deleted
                    // by hand: the next round places it again).
                    pending.delete().await;
                    break;
                }
                let Some(reader) = readers.iter().find(|r| mine.children.contains(r)) else {
                    return Ok(Some((mine, pending)));
                };
                let reader = format!("{lock}/{reader}");
                if !self
                    .wait_behind(session, lock, &reader, deadline, &mut mine, &mut pending)
                    .await?
                {
                    return Ok(None);
                }
            }
        }
    }

    /// The lock's children, once none is a node of the grant `own` any more: one
    /// left by an earlier placement (its delete failed, or its create's answer was
    /// lost) would stand in every later reader's way, the upgrade's own next
    /// placement's included. Deleted here and awaited; an error if that fails. A
    /// blip is ridden out until `deadline`.
    async fn queue_without(
        &self,
        session: &Arc<Session>,
        lock: &str,
        own: &str,
        deadline: Option<Instant>,
    ) -> Result<Vec<String>> {
        let sessions = &self.inner.sessions;
        let list = || async {
            let listed = sessions
                .across_blips(session, live_deadline(deadline), || {
                    session.client.list_children(lock)
                })
                .await;
            match listed {
                Ok(children) => Ok(children),
                Err(ZkError::NoNode) => Ok(Vec::new()),
                Err(err) => Err(map_zk(err, "list")),
            }
        };
        let children = list().await?;
        if !children.iter().any(|c| c.starts_with(own)) {
            return Ok(children);
        }
        let leftovers = children.iter().filter(|c| c.starts_with(own));
        delete_children(session, lock, leftovers.map(String::as_str)).await?;
        list().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(names: &[&str]) -> Vec<Contender> {
        layout::contenders(&names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn the_write_node_goes_behind_the_readers_before_the_first_writer() {
        let behind = |anchor| Plan::After {
            anchor,
            read: "u-__READ__0000000002",
        };
        let q = queue(&[
            "o-__READ__0000000001",
            "u-__READ__0000000002",
            "p-__READ__0000000003",
            "w-__WRIT__0000000004",
            "s-__READ__0000000005",
        ]);
        assert_eq!(plan(&q, "u-"), behind("0000000003"));
        // No writer: behind the last reader.
        let q = queue(&["u-__READ__0000000002", "p-__READ__0000000003"]);
        assert_eq!(plan(&q, "u-"), behind("0000000003"));
        // A writer ahead of the read: wait for it.
        let q = queue(&["w-__WRIT__0000000001", "u-__READ__0000000002"]);
        assert!(matches!(plan(&q, "u-"), Plan::WaitFor(w) if w.node == "w-__WRIT__0000000001"));
        // The read gone.
        assert_eq!(plan(&q, "x-"), Plan::ReadGone);
        // A node the upgrade's grant left from an earlier placement counts as any
        // writer here (the listing `plan` sees is cleared of them first:
        // `queue_without`).
        let q = queue(&[
            "u-__READ__0000000002",
            "me-__WRIT__00000000020000000004",
            "p-__READ__0000000005",
        ]);
        assert_eq!(plan(&q, "u-"), behind("0000000002"));
    }

    #[test]
    fn an_upgrade_sorts_right_behind_its_anchor_as_curator_sorts() {
        let q = queue(&[
            "w-__WRIT__0000000043",
            "me-__WRIT__00000000420000000050",
            "u-__READ__0000000042",
            "r-__READ__0000000041",
        ]);
        let order: Vec<&str> = q.iter().map(|c| c.node.as_str()).collect();
        assert_eq!(
            order,
            [
                "r-__READ__0000000041",
                "u-__READ__0000000042",
                "me-__WRIT__00000000420000000050",
                "w-__WRIT__0000000043"
            ]
        );
        assert_eq!(q[2].created(), 50);
        assert!(q[2].is_anchored());
    }

    /// The readers an upgrade (`me`, beside `u`'s read) waits for, judged on `q`.
    fn judge(q: &[Contender], me: &str) -> Option<Vec<String>> {
        readers_to_wait_for(q, me, "u-__READ__0000000002")
    }

    #[test]
    fn readers_behind_a_writer_or_made_later_are_not_waited_for() {
        // o holds beside u; w queued behind them, s behind w; x came after the
        // upgrade's node (made at 50).
        let q = queue(&[
            "o-__READ__0000000001",
            "u-__READ__0000000002",
            "me-__WRIT__00000000020000000050",
            "w-__WRIT__0000000004",
            "s-__READ__0000000005",
            "x-__READ__0000000051",
        ]);
        assert_eq!(
            judge(&q, "me-__WRIT__00000000020000000050"),
            Some(vec!["o-__READ__0000000001".to_owned()])
        );
        // The writer left before the node was made: s may hold, and stands behind
        // the node — place again.
        let q = queue(&[
            "u-__READ__0000000002",
            "me-__WRIT__00000000020000000050",
            "s-__READ__0000000005",
        ]);
        assert_eq!(judge(&q, "me-__WRIT__00000000020000000050"), None);
        // A writer ahead of the node: place again.
        let q = queue(&[
            "u-__READ__0000000002",
            "w-__WRIT__0000000003",
            "me-__WRIT__00000000030000000050",
        ]);
        assert_eq!(judge(&q, "me-__WRIT__00000000030000000050"), None);
        // Our node not in the listing: place again.
        assert_eq!(judge(&q, "me-__WRIT__0000000099"), None);
    }

    #[test]
    fn an_upgrade_holding_shows_with_its_read_as_the_holders() {
        let q = queue(&[
            "u-__READ__0000000002",
            "me-__WRIT__00000000020000000050",
            "w-__WRIT__0000000004",
            "s-__READ__0000000005",
        ]);
        let holders: Vec<&str> = layout::holders(&q)
            .iter()
            .map(|c| c.node.as_str())
            .collect();
        assert_eq!(
            holders,
            ["u-__READ__0000000002", "me-__WRIT__00000000020000000050"]
        );
        // Waiting for another reader: the readers hold.
        let q = queue(&[
            "o-__READ__0000000001",
            "u-__READ__0000000002",
            "me-__WRIT__00000000020000000050",
        ]);
        assert_eq!(layout::holders(&q).len(), 2);
        assert_eq!(layout::holders(&q)[1].node, "u-__READ__0000000002");
    }
}
