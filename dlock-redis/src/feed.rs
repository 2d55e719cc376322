//! Change feeds for observers (election followers): a lock's observers are told
//! on the release-notice connection when its holders change.

use std::time::Duration;

use async_trait::async_trait;
use dlock_spi::{Error, LockName, Result};

use crate::backend::RedisBackend;
use crate::keys::ms;
use crate::keys::{LockKeys, OBSERVERS};
use crate::notices::address;

/// How long an observer's registration lives unless refreshed (every third of it).
const OBSERVER_LIVENESS: Duration = Duration::from_secs(10);

#[async_trait]
impl dlock_spi::LockEvents for RedisBackend {
    /// Registers the observer in the election's observer set with this backend's
    /// notice channel; grants, releases and proclaims of the election publish one
    /// message to each live observer. The registration is refreshed every few
    /// seconds and removed when the feed is dropped; a crashed observer's lapses.
    async fn follow(&self, name: &LockName) -> Result<dlock_spi::ChangeFeed> {
        let Some(notices) = self.inner.notices.clone() else {
            return Err(Error::unsupported(
                "this Redis backend polls (RedisOptions::polling): it has no change feed",
            ));
        };
        let keys = self.keys(name);
        let id = format!("{:016x}", fastrand::u64(..));
        let registration = notices.register(address(keys.key(OBSERVERS).to_string_lossy(), &id));
        let member = format!("{id} {}", notices.channel());
        self.observe(&keys, &member).await?;
        let (tx, rx) = tokio::sync::watch::channel(0u64);
        let this = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = registration.notified() => tx.send_modify(|n| *n = n.wrapping_add(1)),
                    () = tokio::time::sleep(OBSERVER_LIVENESS / 3) => {
                        if let Err(err) = this.observe(&keys, &member).await {
                            tracing::debug!(error = %err, "dlock-redis: refreshing an observer failed");
                            // Changes may be missed while unregistered: re-read.
                            tx.send_modify(|n| *n = n.wrapping_add(1));
                        }
                    }
                    () = tx.closed() => {
                        let mut cmd = redis::cmd("ZREM");
                        cmd.arg(keys.key(OBSERVERS)).arg(&member);
                        if let Err(err) = this.inner.conn.query::<i64>(&cmd).await {
                            tracing::debug!(error = %err, "dlock-redis: removing an observer failed; it lapses");
                        }
                        return;
                    }
                }
            }
        });
        Ok(dlock_spi::ChangeFeed::new(rx, ()))
    }
}

impl RedisBackend {
    /// Registers or refreshes observer `member` of the lock `keys`.
    async fn observe(&self, keys: &LockKeys, member: &str) -> Result<()> {
        let mut inv = keys.invocation(&self.inner.scripts.observe, &[OBSERVERS]);
        inv.arg(member).arg(ms(OBSERVER_LIVENESS));
        self.run_flag(&inv, "observe").await.map(drop)
    }
}
