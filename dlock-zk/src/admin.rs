//! Operators' view: force-release and counting live locks.

use dlock_spi::{async_trait, LockAdmin, LockName, Result};
use zookeeper_client::Error as ZkError;

use crate::backend::ZkBackend;
use crate::error::map_zk;
use crate::layout::{self};
use crate::nodes::delete_children;

#[async_trait]
impl LockAdmin for ZkBackend {
    async fn force_release(&self, name: &LockName) -> Result<usize> {
        let lock = layout::lock_path(&self.inner.root, name);
        let session = self.inner.sessions.usable(None, None).await?;
        let children = match session.client.list_children(&lock).await {
            Ok(children) => children,
            Err(ZkError::NoNode) => return Ok(0),
            Err(err) => return Err(map_zk(err, "list")),
        };
        if crate::layout::is_semaphore(&children) {
            return self.force_release_semaphore(&session, &lock).await;
        }
        let queue = layout::contenders(&children);
        let holders = layout::holders(&queue).len();
        delete_children(&session, &lock, queue.iter().map(|c| c.node.as_str())).await?;
        Ok(holders)
    }

    async fn live_locks(&self, prefix: &str) -> Result<usize> {
        let session = self.inner.sessions.usable(None, None).await?;
        let root = &self.inner.root;
        let locks = match session.client.list_children(root).await {
            Ok(locks) => locks,
            Err(ZkError::NoNode) => return Ok(0),
            Err(err) => return Err(map_zk(err, "list")),
        };
        let paths: Vec<String> = locks
            .iter()
            .filter(|segment| {
                layout::decode_segment(segment).is_some_and(|name| name.starts_with(prefix))
            })
            .map(|segment| format!("{root}/{segment}"))
            .collect();
        let lists: Vec<_> = paths
            .iter()
            .map(|path| session.client.list_children(path))
            .collect();
        let mut live = 0;
        for (path, list) in paths.iter().zip(lists) {
            match list.await {
                Ok(children) if crate::layout::is_semaphore(&children) => {
                    if self.semaphore_live(&session, path).await? {
                        live += 1;
                    }
                }
                Ok(children) if !layout::contenders(&children).is_empty() => live += 1,
                Ok(_) | Err(ZkError::NoNode) => {}
                Err(err) => return Err(map_zk(err, "list")),
            }
        }
        Ok(live)
    }
}
