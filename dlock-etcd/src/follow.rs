//! Change feeds for observers (leader election followers): one etcd watch on the
//! lock's range. Every grant, release, new context (a proclaim) and expired lease is
//! an event there; a broken watch is started again, and the feed pinged, since
//! changes may have been missed meanwhile.

use std::time::Duration;

use dlock_spi::{Backoff, ChangeFeed, Error, ErrorKind, Jitter, Pacer, Result};
use etcd_client::{Client, WatchOptions, WatchStream};
use tokio::sync::watch;

use crate::error::{map_etcd, timed_out};

/// How often in a row a broken watch is started again before the feed ends (the
/// observer polls then); the pause between tries doubles from 100 ms up to 2 s. A
/// watch that broke within [`STEADY`] of its start counts as a failed try too.
const RESTARTS: u32 = 20;

/// How long a restarted watch must last for its restart to count as a success.
const STEADY: Duration = Duration::from_secs(10);

/// The pauses between restarts: 100 ms doubling to 2 s (from the first again after
/// a watch that lasted [`STEADY`]).
const RESTART_PAUSE: Backoff =
    Backoff::exponential(Duration::from_millis(100), Duration::from_secs(2))
        .with_jitter(Jitter::None);

/// The range `[start, end)` a feed watches.
pub(crate) struct Range {
    pub(crate) start: Vec<u8>,
    pub(crate) end: Vec<u8>,
}

/// Starts following `range`; live (the watch created) on return.
pub(crate) async fn follow(client: Client, range: Range, timeout: Duration) -> Result<ChangeFeed> {
    let stream = start(&client, &range, timeout).await?;
    let (tx, rx) = watch::channel(0u64);
    let task = tokio::spawn(run(client, range, timeout, stream, tx));
    Ok(ChangeFeed::new(rx, dlock_spi::TaskGuard::new(task)))
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

/// Pings the feed on every event; starts the watch again when it breaks, and ends
/// (dropping the sender) after [`RESTARTS`] failed tries in a row (a watch that
/// broke soon after its start counts as one) or once nobody follows.
async fn run(
    client: Client,
    range: Range,
    timeout: Duration,
    mut stream: WatchStream,
    tx: watch::Sender<u64>,
) {
    let ping = |tx: &watch::Sender<u64>| tx.send_modify(|n| *n = n.wrapping_add(1));
    let mut started = tokio::time::Instant::now();
    let mut failures = 0u32;
    let mut pacer = Pacer::new(RESTART_PAUSE);
    loop {
        match stream.message().await {
            Ok(Some(m)) if !m.canceled() => {
                if !m.events().is_empty() {
                    ping(&tx);
                }
                continue;
            }
            // Cancelled (a compaction, the member going away), ended or failed.
            Ok(_) | Err(_) => {}
        }
        if started.elapsed() >= STEADY {
            // It had been up a while: a fresh break.
            failures = 0;
            pacer.reset();
        } else {
            failures += 1;
        }
        loop {
            if failures >= RESTARTS || tx.is_closed() {
                return;
            }
            pacer.pause().await;
            if let Ok(again) = start(&client, &range, timeout).await {
                stream = again;
                started = tokio::time::Instant::now();
                break;
            }
            failures += 1;
        }
        // Changes made while it was down were not seen: the observer reads again.
        ping(&tx);
    }
}
