//! Operators' view: force-release and counting live locks.

use std::collections::HashSet;

use async_trait::async_trait;
use dlock_spi::{LockAdmin, LockName, Result};

use crate::backend::{Conn, RedisBackend};
use crate::connection::connection_config;
use crate::error::map_redis;
use crate::keys::{scan_pattern, ALL};

#[async_trait]
impl LockAdmin for RedisBackend {
    async fn force_release(&self, name: &LockName) -> Result<usize> {
        let keys = self.keys(name);
        let inv = keys.invocation(&self.inner.scripts.force_release, &ALL);
        let n: i64 = self
            .inner
            .conn
            .invoke(&inv)
            .await
            .map_err(|e| map_redis(e, "force_release"))?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    async fn live_locks(&self, prefix: &str) -> Result<usize> {
        let pattern = scan_pattern(&self.inner.options.key_prefix, prefix);
        let mut names = HashSet::new();
        let mut nodes = self.inner.nodes.clone();
        if let Conn::Sentinel(m) = &self.inner.conn {
            let (_, master) = m.client().await.map_err(|e| map_redis(e, "live_locks"))?;
            nodes.push(master);
        }
        for node in &nodes {
            let mut conn = node
                .get_multiplexed_async_connection_with_config(&connection_config(
                    self.inner.options.connect_timeout,
                ))
                .await
                .map_err(|e| map_redis(e, "live_locks"))?;
            let mut cursor = 0u64;
            loop {
                let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(1000)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| map_redis(e, "live_locks"))?;
                for key in keys {
                    let Some((base, kind)) = key.rsplit_once(':') else {
                        continue;
                    };
                    let live = match kind {
                        // Queued waiters, readers, and observers of an election
                        // (removed when the last one stops following).
                        "r" | "q" | "o" => true,
                        // A free marker (the last token) is not holder state.
                        "x" => {
                            let v: Option<String> = redis::cmd("GET")
                                .arg(&key)
                                .query_async(&mut conn)
                                .await
                                .map_err(|e| map_redis(e, "live_locks"))?;
                            // The exclusive key exists only while held (by a writer or
                            // readers, or a waiter it was handed over to).
                            v.is_some()
                        }
                        _ => false,
                    };
                    if live {
                        names.insert(base.to_owned());
                    }
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(names.len())
    }
}
