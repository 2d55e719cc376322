//! Change feeds for observers (leader election followers): a child watch on the
//! lock's node (contenders come and go, sessions expire) and a data watch on its
//! holder's node (a leader proclaiming a new value), re-armed after each event.

use std::sync::Arc;
use std::time::Duration;

use dlock_spi::{Backoff, ChangeFeed, Jitter, Pacer, Result};
use tokio::sync::watch;
use zookeeper_client::{Client, Error as ZkError, OneshotWatcher};

use crate::error::map_zk;
use crate::layout;
use crate::session::Sessions;

/// The pause between tries to set a feed's watches again.
const REARM_PAUSE: Backoff =
    Backoff::constant(Duration::from_millis(250)).with_jitter(Jitter::None);

/// The watches of one round: the lock's children (or its creation), and the
/// holder's data when there is a holder.
struct Armed {
    lock: OneshotWatcher,
    holder: Option<OneshotWatcher>,
}

/// Sets the round's watches.
async fn arm(client: &Client, lock: &str) -> std::result::Result<Armed, ZkError> {
    loop {
        match client.list_and_watch_children(lock).await {
            Ok((children, watch)) => {
                let queue = layout::contenders(&children);
                let holder = match layout::holders(&queue).first() {
                    Some(first) => {
                        let path = format!("{lock}/{}", first.node);
                        match client.get_and_watch_data(&path).await {
                            Ok((_, _, w)) => Some(w),
                            // Gone already: the child watch fires for it.
                            Err(ZkError::NoNode) => None,
                            Err(e) => return Err(e),
                        }
                    }
                    None => None,
                };
                return Ok(Armed {
                    lock: watch,
                    holder,
                });
            }
            Err(ZkError::NoNode) => match client.check_and_watch_stat(lock).await? {
                // Still absent: the watch fires when it is created.
                (None, watch) => {
                    return Ok(Armed {
                        lock: watch,
                        holder: None,
                    })
                }
                // Created meanwhile: list it.
                (Some(_), _) => continue,
            },
            Err(e) => return Err(e),
        }
    }
}

/// Starts following the lock node `lock`; live (first watches set) on return.
pub(crate) async fn follow(sessions: Arc<Sessions>, lock: String) -> Result<ChangeFeed> {
    let session = sessions.usable(None, None).await?;
    let armed = arm(&session.client, &lock)
        .await
        .map_err(|e| map_zk(e, "watch"))?;
    let (tx, rx) = watch::channel(0u64);
    let task = tokio::spawn(run(sessions, lock, tx, armed));
    Ok(ChangeFeed::new(rx, dlock_spi::TaskGuard::new(task)))
}

async fn run(sessions: Arc<Sessions>, lock: String, tx: watch::Sender<u64>, mut armed: Armed) {
    let mut status = sessions.subscribe();
    loop {
        let Armed {
            lock: lock_watch,
            holder,
        } = armed;
        let holder_event = async move {
            match holder {
                Some(w) => {
                    w.changed().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = lock_watch.changed() => {}
            () = holder_event => {}
            changed = status.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            () = tx.closed() => return,
        }
        // Re-arm, on whatever session is usable, then ping: the observer's read
        // after the ping sees the change that fired the watch and any made while
        // no watch was set; later ones fire the new watches.
        let mut pacer = Pacer::new(REARM_PAUSE);
        armed = loop {
            let attempt = async {
                let session = sessions.usable(None, None).await.ok()?;
                arm(&session.client, &lock).await.ok()
            };
            tokio::select! {
                a = attempt => {
                    if let Some(a) = a {
                        break a;
                    }
                }
                () = tx.closed() => return,
            }
            pacer.pause().await;
        };
        tx.send_modify(|n| *n = n.wrapping_add(1));
    }
}
