//! Release notices: one pub/sub connection per backend, subscribed to one channel of
//! the backend's own, carries them to local waiters.
//!
//! A queued waiter stores its backend's channel with its queue entry; a release that
//! finds waiters publishes one message, naming the queue's live head, on that head's
//! channel only. So a release is one message to one connection whatever the number
//! of waiting clients (a per-lock channel would carry it to every client that waits
//! for, or recently waited for, the lock), and no connection subscribes per lock.
//!
//! The message is the lock's exclusive key and the waiter's owner, separated by a
//! newline (a key ends in `:x` and holds exactly one `{`, so the pair is unambiguous);
//! it is the key under which the waiter registered here, looked up as it comes. When
//! the release handed the lock over to the waiter, a third line follows: the grant's
//! fencing token and its provisional lease in ms, `<token> <ms>` — the waiter holds
//! from then on ([`Registration::take_handover`]).
//!
//! The channel is subscribed before `start` returns, so a waiter registered after it
//! misses no notice; a notice that arrives before the waiter waits is kept by its
//! `Notify`. If the connection drops, it is re-established and re-subscribed, and
//! every waiter re-checks (notices may have been missed); while it is down, waiters
//! poll. Behind Sentinel it follows the master: when the backend's connection moves
//! to a new master (a new epoch), the notice connection subscribes there instead.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use dlock_spi::{Backoff, Drained, Jitter, Resubscribe, Subscription};
use futures_util::StreamExt;
use tokio::sync::Notify;

use crate::sentinel::SentinelMaster;

/// Where the notice connection subscribes.
#[derive(Clone)]
pub(crate) enum Endpoint {
    /// One node (a single server, or any node of a Cluster: it broadcasts `PUBLISH`).
    Node(Box<redis::Client>),
    /// Whichever server Sentinel names master now.
    Sentinel(Arc<SentinelMaster>),
}

impl Endpoint {
    /// A client for the node to subscribe on, and the Sentinel epoch it belongs to.
    async fn client(&self) -> redis::RedisResult<(u64, redis::Client)> {
        match self {
            Endpoint::Node(c) => Ok((0, redis::Client::clone(c))),
            Endpoint::Sentinel(m) => m.client().await,
        }
    }

    /// Resolves once the master has moved away from `epoch` (never for one node).
    async fn moved_from(&self, epoch: u64) {
        match self {
            Endpoint::Node(_) => std::future::pending().await,
            Endpoint::Sentinel(m) => {
                let mut epochs = m.epochs();
                // An error: the follower is gone; the backend is being dropped.
                let _ = epochs.wait_for(|e| *e != epoch && *e != 0).await;
            }
        }
    }
}

/// A lock a release handed over to a waiter (see [`crate::scripts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Handover {
    /// The grant's fencing token.
    pub(crate) token: u64,
    /// The provisional lease the server gave the grant, from the hand-over on.
    pub(crate) lease: Duration,
    /// The Sentinel epoch of the master the notice came from (0 for one node): a
    /// hand-over counts only from the master the waiter's attempts went to.
    pub(crate) epoch: u64,
}

impl Handover {
    /// The third line of a hand-over notice, `<token> <lease ms>`.
    fn parse(line: &[u8], epoch: u64) -> Option<Self> {
        let line = std::str::from_utf8(line).ok()?;
        let (token, ms) = line.split_once(' ')?;
        Some(Handover {
            token: token.parse().ok()?,
            lease: Duration::from_millis(ms.parse().ok()?),
            epoch,
        })
    }
}

/// What a notice leaves for its waiter.
#[derive(Default)]
struct Mailbox {
    notify: Notify,
    handover: Mutex<Option<Handover>>,
}

struct Waiter {
    id: u64,
    mailbox: Arc<Mailbox>,
}

pub(crate) struct Notices {
    channel: String,
    /// Local waiters by the message that names them.
    waiters: Mutex<HashMap<Vec<u8>, Vec<Waiter>>>,
    next_id: AtomicU64,
    connected: AtomicBool,
    /// The listener, stopped with the notices.
    task: Mutex<Option<dlock_spi::TaskGuard>>,
}

/// The message that names `owner` waiting for the lock whose exclusive key is `key`.
pub(crate) fn address(key: String, owner: &str) -> Vec<u8> {
    let mut a = key.into_bytes();
    a.reserve_exact(1 + owner.len());
    a.push(b'\n');
    a.extend_from_slice(owner.as_bytes());
    a
}

impl Notices {
    fn waiters(&self) -> MutexGuard<'_, HashMap<Vec<u8>, Vec<Waiter>>> {
        self.waiters.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Connects the notice connection to `client` (a node of the deployment),
    /// subscribes to a new channel of this backend's own, `<prefix>notices:<random>`,
    /// and starts dispatching.
    pub(crate) async fn start(endpoint: Endpoint, prefix: &str) -> redis::RedisResult<Arc<Self>> {
        let channel = format!(
            "{prefix}notices:{:016x}{:016x}",
            fastrand::u64(..),
            fastrand::u64(..)
        );
        let (epoch, client) = endpoint.client().await?;
        let mut first = client.get_async_pubsub().await?;
        first.subscribe(&channel).await?;
        let notices = Arc::new(Notices {
            channel,
            waiters: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            connected: AtomicBool::new(true),
            task: Mutex::new(None),
        });
        let subscriber = Subscriber {
            notices: Arc::downgrade(&notices),
            endpoint,
        };
        let task = tokio::spawn(async move {
            RECONNECT.run(subscriber, Some((epoch, first))).await;
        });
        *notices.task.lock().unwrap_or_else(PoisonError::into_inner) =
            Some(dlock_spi::TaskGuard::new(task));
        Ok(notices)
    }

    /// The channel this backend's waiters are told on.
    pub(crate) fn channel(&self) -> &str {
        &self.channel
    }

    /// Whether the notice connection is up (the channel subscribed).
    pub(crate) fn connected(&self) -> bool {
        self.connected.load(Ordering::Acquire)
    }

    /// Registers a waiter under `address`; notices for it are kept from now on.
    pub(crate) fn register(self: &Arc<Self>, address: Vec<u8>) -> Registration {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mailbox = Arc::new(Mailbox::default());
        self.waiters()
            .entry(address.clone())
            .or_default()
            .push(Waiter {
                id,
                mailbox: Arc::clone(&mailbox),
            });
        Registration {
            notices: Arc::clone(self),
            address,
            id,
            mailbox,
        }
    }

    /// Delivers one message: a plain notice is a waiter's address; a hand-over
    /// notice is the address, a newline and the grant's `<token> <ms>`; `epoch` is
    /// the Sentinel epoch of the master it came from.
    fn wake(&self, message: &[u8], epoch: u64) {
        let waiters = self.waiters();
        if let Some(ws) = waiters.get(message) {
            for w in ws {
                w.mailbox.notify.notify_one();
            }
            return;
        }
        let Some(nl) = message.iter().rposition(|b| *b == b'\n') else {
            return;
        };
        let (Some(ws), Some(handover)) = (
            waiters.get(&message[..nl]),
            Handover::parse(&message[nl + 1..], epoch),
        ) else {
            return;
        };
        for w in ws {
            *w.mailbox
                .handover
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(handover);
            w.mailbox.notify.notify_one();
        }
    }

    fn wake_all(&self) {
        for w in self.waiters().values().flatten() {
            w.mailbox.notify.notify_one();
        }
    }
}

/// A waiter's registration; removed on drop.
pub(crate) struct Registration {
    notices: Arc<Notices>,
    address: Vec<u8>,
    id: u64,
    mailbox: Arc<Mailbox>,
}

impl Registration {
    /// Whether release notices reach this waiter now (else it must poll).
    pub(crate) fn subscribed(&self) -> bool {
        self.notices.connected()
    }

    /// Waits for a notice naming this waiter. A notice that arrived since the last
    /// wait completes it at once.
    pub(crate) async fn notified(&self) {
        self.mailbox.notify.notified().await;
    }

    /// The lock a release handed over to this waiter, if a notice said so (taken:
    /// a second call answers `None`).
    pub(crate) fn take_handover(&self) -> Option<Handover> {
        self.mailbox
            .handover
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut waiters = self.notices.waiters();
        if let Some(ws) = waiters.get_mut(&self.address) {
            ws.retain(|w| w.id != self.id);
            if ws.is_empty() {
                waiters.remove(&self.address);
            }
        }
    }
}

/// How long one attempt to connect the notice connection again may take.
const RECONNECT_BOUND: Duration = Duration::from_secs(5);
/// How the notice connection is connected again: 250 ms after it broke and between
/// failed tries (waiters poll meanwhile).
const RECONNECT: Resubscribe =
    Resubscribe::new(Backoff::constant(Duration::from_millis(250)).with_jitter(Jitter::None));

/// The notice connection, kept up by [`RECONNECT`].
struct Subscriber {
    notices: Weak<Notices>,
    endpoint: Endpoint,
}

impl Subscription for Subscriber {
    type Live = (u64, redis::aio::PubSub);

    async fn subscribe(&mut self) -> Option<(u64, redis::aio::PubSub)> {
        let channel = self.notices.upgrade()?.channel.clone();
        // Bounded: a server that does not answer is tried again (behind Sentinel,
        // wherever the master is by then).
        let connect = async {
            let (epoch, client) = self.endpoint.client().await?;
            let mut p = client.get_async_pubsub().await?;
            p.subscribe(&channel).await.map(|()| (epoch, p))
        };
        match crate::connection::bounded(RECONNECT_BOUND, connect).await {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::debug!(error = %e, "dlock-redis: release-notice connection failed; retrying");
                None
            }
        }
    }

    async fn drain(&mut self, (epoch, pubsub): (u64, redis::aio::PubSub)) -> Drained {
        tokio::select! {
            () = dispatch(&self.notices, pubsub, epoch) => {}
            () = self.endpoint.moved_from(epoch) => {
                tracing::debug!("dlock-redis: the master moved; subscribing to release notices there");
            }
        }
        if self.notices.strong_count() == 0 {
            return Drained::Done;
        }
        tracing::debug!("dlock-redis: release-notice connection lost; reconnecting");
        Drained::Broke
    }

    /// Notices may have been missed while disconnected: every waiter re-checks.
    fn resubscribed(&mut self) {
        if let Some(n) = self.notices.upgrade() {
            n.connected.store(true, Ordering::Release);
            n.wake_all();
        }
    }

    /// Waiters switch to polling until the connection is back.
    fn lost(&mut self) {
        if let Some(n) = self.notices.upgrade() {
            n.connected.store(false, Ordering::Release);
            n.wake_all();
        }
    }

    fn wanted(&self) -> bool {
        self.notices.strong_count() > 0
    }
}

/// Delivers notices until the connection ends.
async fn dispatch(notices: &Weak<Notices>, mut pubsub: redis::aio::PubSub, epoch: u64) {
    let mut stream = pubsub.on_message();
    while let Some(msg) = stream.next().await {
        let Some(n) = notices.upgrade() else { return };
        n.wake(msg.get_payload_bytes(), epoch);
    }
}
