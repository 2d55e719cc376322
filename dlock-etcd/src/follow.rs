//! Change feeds for observers (leader election followers): one etcd watch on the
//! lock's range. Every grant, release, new context (a proclaim) and expired lease is
//! an event there; a broken watch is started again, and the feed pinged, since
//! changes may have been missed meanwhile.

use std::time::Duration;

use dlock_spi::{
    async_trait, Backoff, ChangeFeed, Drained, Error, ErrorKind, Jitter, LockEvents, LockName,
    Resubscribe, Result, Subscription,
};
use etcd_client::{Client, WatchOptions, WatchStream};
use tokio::sync::watch;

use crate::backend::EtcdBackend;
use crate::error::{map_etcd, timed_out};
use crate::keys::prefix_end;

/// How a broken watch is started again: after a pause of 100 ms doubling to 2 s
/// (from the first again after a watch that lasted 10 s), and not after 20 failures
/// in a row — a failed start, or a watch that broke within 10 s of its start — when
/// the feed ends (the observer polls then).
const RESTART: Resubscribe = Resubscribe::new(
    Backoff::exponential(Duration::from_millis(100), Duration::from_secs(2))
        .with_jitter(Jitter::None),
)
.give_up_after(20, Duration::from_secs(10));

/// The range `[start, end)` a feed watches.
pub(crate) struct Range {
    pub(crate) start: Vec<u8>,
    pub(crate) end: Vec<u8>,
}

#[async_trait]
impl LockEvents for EtcdBackend {
    /// One watch on the lock's range: grants, releases, new contexts and expired
    /// leases are all events there. Live when this returns (etcd created the watch).
    async fn follow(&self, name: &LockName) -> Result<dlock_spi::ChangeFeed> {
        let start = self.inner.keys.lock(name);
        let end = prefix_end(&start);
        follow(
            self.inner.client.clone(),
            Range { start, end },
            self.inner.timeout,
        )
        .await
    }
}

/// Starts following `range`; live (the watch created) on return.
pub(crate) async fn follow(client: Client, range: Range, timeout: Duration) -> Result<ChangeFeed> {
    let stream = start(&client, &range, timeout).await?;
    Ok(ChangeFeed::kept_up(RESTART, stream, |tx| Feed {
        client,
        range,
        timeout,
        tx,
    }))
}

/// A feed's watch, kept up by [`RESTART`]: every event pings the feed; a broken
/// watch is started again, and the feed pinged (changes may have been missed); the
/// feed ends (its sender dropped) once the loop gives up or nobody follows.
struct Feed {
    client: Client,
    range: Range,
    timeout: Duration,
    tx: watch::Sender<u64>,
}

impl Feed {
    /// Pings the feed: the observer reads again.
    fn ping(&self) {
        self.tx.send_modify(|n| *n = n.wrapping_add(1));
    }
}

impl Subscription for Feed {
    type Live = WatchStream;

    async fn subscribe(&mut self) -> Option<WatchStream> {
        start(&self.client, &self.range, self.timeout).await.ok()
    }

    async fn drain(&mut self, mut stream: WatchStream) -> Drained {
        loop {
            match stream.message().await {
                Ok(Some(m)) if !m.canceled() => {
                    if !m.events().is_empty() {
                        self.ping();
                    }
                }
                // Cancelled (a compaction, the member going away), ended or failed.
                Ok(_) | Err(_) => return Drained::Broke,
            }
        }
    }

    fn resubscribed(&mut self) {
        self.ping();
    }

    fn wanted(&self) -> bool {
        !self.tx.is_closed()
    }
}

/// Creates the watch and waits until etcd says it is created: every change after
/// that is reported. etcd answers a watch asked for with a lapsed sign-in token by
/// cancelling it (not with the error on which the client signs in again): then the
/// client signs in again (nothing without credentials) and asks once more.
async fn start(client: &Client, range: &Range, timeout: Duration) -> Result<WatchStream> {
    let created = async {
        let mut refused = String::new();
        for signed_in_again in [false, true] {
            let options = WatchOptions::new().with_range(range.end.clone());
            let mut stream = client
                .watch_client()
                .watch(range.start.clone(), Some(options))
                .await
                .map_err(|e| map_etcd(e, "watch"))?;
            match stream.message().await {
                Ok(Some(m)) if m.created() && !m.canceled() => return Ok(stream),
                Ok(Some(m)) if m.canceled() && !signed_in_again => {
                    refused = m.cancel_reason().to_owned();
                    client
                        .refresh_token()
                        .await
                        .map_err(|e| map_etcd(e, "watch"))?;
                }
                Ok(m) => {
                    if let Some(m) = m {
                        refused = m.cancel_reason().to_owned();
                    }
                    break;
                }
                Err(e) => return Err(map_etcd(e, "watch")),
            }
        }
        Err(Error::new(
            ErrorKind::Backend,
            format!("etcd did not create the watch that follows the lock ({refused:?}); retry"),
        ))
    };
    tokio::time::timeout(timeout, created)
        .await
        .unwrap_or_else(|_| Err(timed_out("watch")))
}
