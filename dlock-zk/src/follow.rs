//! Change feeds for observers (leader election followers): a child watch on the
//! lock's node (contenders come and go, sessions expire) and a data watch on its
//! holder's node (a leader proclaiming a new value), re-armed after each event.

use std::sync::Arc;
use std::time::Duration;

use dlock_spi::{Backoff, ChangeFeed, Drained, Jitter, Resubscribe, Result, Subscription};
use tokio::sync::watch;
use zookeeper_client::{Client, Error as ZkError, OneshotWatcher};

use crate::error::map_zk;
use crate::layout;
use crate::session::{SessionStatus, Sessions};

/// How a feed's watches are set again: at once after each event, 250 ms between
/// failed tries.
const REARM: Resubscribe =
    Resubscribe::new(Backoff::constant(Duration::from_millis(250)).with_jitter(Jitter::None));

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
    let status = sessions.subscribe();
    Ok(ChangeFeed::kept_up(REARM, armed, |tx| Feed {
        sessions,
        lock,
        tx,
        status,
    }))
}

/// A feed's watches, set again after each event (on whatever session is usable)
/// and then the feed pinged: the observer's read after the ping sees the change
/// that fired the watch and any made while no watch was set; later ones fire the
/// new watches. A change of session sets them again too.
struct Feed {
    sessions: Arc<Sessions>,
    lock: String,
    tx: watch::Sender<u64>,
    status: watch::Receiver<SessionStatus>,
}

impl Subscription for Feed {
    type Live = Armed;

    async fn subscribe(&mut self) -> Option<Armed> {
        let session = self.sessions.usable(None, None).await.ok()?;
        arm(&session.client, &self.lock).await.ok()
    }

    async fn drain(&mut self, armed: Armed) -> Drained {
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
            _ = lock_watch.changed() => Drained::Rearm,
            () = holder_event => Drained::Rearm,
            changed = self.status.changed() => match changed {
                Ok(()) => Drained::Rearm,
                Err(_) => Drained::Done,
            },
            () = self.tx.closed() => Drained::Done,
        }
    }

    fn resubscribed(&mut self) {
        self.tx.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn wanted(&self) -> bool {
        !self.tx.is_closed()
    }
}
