//! Nodes and what they hold: a node created and deleted again if its caller is gone, the data a holder's node carries, tokens from creation ids, deadlines.

use std::sync::Arc;
use std::time::Instant;

use dlock_spi::{Bytes, FencingToken, HolderKey, Result};
use zookeeper_client::Error as ZkError;

use crate::error::map_zk;
use crate::session::{Session, Sessions};

/// Marks node data written by dlock: `dlock1\n<owner>\n<context>`.
pub(crate) const DATA_MAGIC: &[u8] = b"dlock1\n";

/// A contender node that must not outlive a failed, timed-out or cancelled acquire.
pub(crate) struct PendingNode {
    sessions: Arc<Sessions>,
    session: Arc<Session>,
    path: Option<String>,
}

impl PendingNode {
    pub(crate) fn new(sessions: &Arc<Sessions>, session: &Arc<Session>, path: String) -> Self {
        PendingNode {
            sessions: Arc::clone(sessions),
            session: Arc::clone(session),
            path: Some(path),
        }
    }

    /// The node is ours to keep (granted) or already gone.
    pub(crate) fn disarm(&mut self) {
        self.path = None;
    }

    /// Deletes the node and waits for the answer, so the queue is clean on return
    /// (when the connection is down, the delete is retried in the background).
    pub(crate) async fn delete(&mut self) {
        Self::delete_all(std::slice::from_mut(self)).await;
    }

    /// [`Self::delete`] for several nodes, every request sent before the first
    /// answer is awaited.
    pub(crate) async fn delete_all(nodes: &mut [PendingNode]) {
        let deletes: Vec<_> = nodes
            .iter_mut()
            .filter_map(|node| {
                let path = node.path.take()?;
                let delete = node.session.client.delete(&path, None);
                Some((node, path, delete))
            })
            .collect();
        for (node, path, delete) in deletes {
            match delete.await {
                Ok(()) | Err(ZkError::NoNode) => {}
                Err(_) => node.sessions.delete_later(&node.session, path),
            }
        }
    }
}

impl Drop for PendingNode {
    fn drop(&mut self) {
        if let Some(path) = self.path.take() {
            // Cancelled while waiting: the delete is sent now, on this session.
            self.sessions.delete_later(&self.session, path);
        }
    }
}

/// Deletes `children` of `parent`, all requests out before the first answer is
/// awaited; children already gone are fine.
pub(crate) async fn delete_children<'a>(
    session: &Session,
    parent: &str,
    children: impl Iterator<Item = &'a str>,
) -> Result<()> {
    let deletes: Vec<_> = children
        .map(|c| session.client.delete(&format!("{parent}/{c}"), None))
        .collect();
    for delete in deletes {
        match delete.await {
            Ok(()) | Err(ZkError::NoNode) => {}
            Err(err) => return Err(map_zk(err, "delete")),
        }
    }
    Ok(())
}

pub(crate) fn deadline_passed(deadline: Option<Instant>) -> bool {
    live_deadline(deadline).is_none()
}

/// The deadline, if it has not passed (`None`: look once, no waiting).
pub(crate) fn live_deadline(deadline: Option<Instant>) -> Option<Instant> {
    deadline.filter(|d| *d > Instant::now())
}

pub(crate) fn token_of(czxid: i64) -> FencingToken {
    FencingToken::new(u64::try_from(czxid).unwrap_or(0))
}

pub(crate) fn node_data(holder: &HolderKey, context: &Bytes) -> Vec<u8> {
    let mut data = Vec::with_capacity(DATA_MAGIC.len() + holder.as_str().len() + 1 + context.len());
    data.extend_from_slice(DATA_MAGIC);
    data.extend_from_slice(holder.as_str().as_bytes());
    data.push(b'\n');
    data.extend_from_slice(context);
    data
}

/// The holder key and context stored in a node; a foreign node (Curator's) is
/// described by its own name and data.
pub(crate) fn parse_node_data(node: &str, data: Vec<u8>) -> (String, Bytes) {
    if let Some(rest) = data.strip_prefix(DATA_MAGIC) {
        if let Some(at) = rest.iter().position(|b| *b == b'\n') {
            if let Ok(holder) = std::str::from_utf8(&rest[..at]) {
                return (holder.to_owned(), Bytes::copy_from_slice(&rest[at + 1..]));
            }
        }
    }
    (node.to_owned(), Bytes::from(data))
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_spi::OwnerId;

    #[test]
    fn node_data_round_trips_and_foreign_data_is_kept() {
        let holder = HolderKey::new(&OwnerId::new("m:7"), dlock_spi::GrantId::new(3));
        let data = node_data(&holder, &Bytes::from_static(b"pid=1\nhost=a"));
        let (o, c) = parse_node_data("_c_x-lock-0000000001", data);
        assert_eq!(o, holder.as_str());
        assert_eq!(&c[..], b"pid=1\nhost=a");
        let (o, c) = parse_node_data("_c_x-lock-0000000002", b"10.0.0.7".to_vec());
        assert_eq!(o, "_c_x-lock-0000000002");
        assert_eq!(&c[..], b"10.0.0.7");
    }
}
