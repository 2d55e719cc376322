//! Operators' view: force-release and counting live locks.

use async_trait::async_trait;
use dlock_spi::{LockAdmin, LockName, Result};
use etcd_client::{Client, DeleteOptions, GetOptions, KeyValue};

use crate::backend::keys_of;
use crate::backend::EtcdBackend;
use crate::resend::Repeat;

#[async_trait]
impl LockAdmin for EtcdBackend {
    async fn force_release(&self, name: &LockName) -> Result<usize> {
        let (lock, all) = (
            &self.inner.keys.lock(name),
            &DeleteOptions::new().with_prefix().with_prev_key(),
        );
        let answer = self
            .call(
                "force_release",
                Repeat::IfUnsent,
                Client::kv_client,
                |mut kv| async move { kv.delete(lock.clone(), Some(all.clone())).await },
            )
            .await?;
        let mut removed = answer.prev_kvs().to_vec();
        removed.sort_by_key(KeyValue::create_revision);
        for was in &removed {
            drop(self.guard(was.lease()));
        }
        Ok(self.held_prefix(keys_of(&removed), self.total_among(&removed)))
    }

    async fn live_locks(&self, prefix: &str) -> Result<usize> {
        let (names, keys) = (
            &self.inner.keys.names_starting(prefix),
            &GetOptions::new().with_prefix().with_keys_only(),
        );
        let answer = self
            .call(
                "live_locks",
                Repeat::Safe,
                Client::kv_client,
                |mut kv| async move { kv.get(names.clone(), Some(keys.clone())).await },
            )
            .await?;
        let mut names: Vec<&str> = answer
            .kvs()
            .iter()
            .filter_map(|kv| self.inner.keys.parse(kv.key()).map(|c| c.name))
            .collect();
        names.sort_unstable();
        names.dedup();
        Ok(names.len())
    }
}
