//! Release notices: one pub/sub connection per backend carries them to local waiters.
//!
//! A waiter registers on its lock's channel *before* its first attempt and the
//! channel's SUBSCRIBE is confirmed by then, so a release that follows a failed
//! attempt always reaches it (no lost wake-up). A release names the waiter it wakes
//! (`o:<owner>`, the head of the lock's server-side queue), so exactly that waiter
//! attempts; `r` (from older clients) wakes one local waiter, the oldest. A woken
//! waiter that leaves without the lock passes the wake-up on to another local one.
//! If the connection drops, it is re-established, channels are re-subscribed and
//! every waiter re-checks once (notices may have been missed).
//!
//! A channel stays subscribed for a while (`RedisOptions::subscription_linger`) after
//! its last waiter leaves, so a lock taken again and again (a hot lock, a holder that
//! loops) does not pay a SUBSCRIBE and an UNSUBSCRIBE round trip per acquisition; one
//! sweeper task drops idle channels while any linger.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use redis::aio::PubSubSink;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

struct Waiter {
    id: u64,
    owner: String,
    notify: Arc<Notify>,
    woken: bool,
}

#[derive(Default)]
struct Channel {
    waiters: Vec<Waiter>,
    subscribed: bool,
    /// Since when the channel has had no waiter (it lingers, subscribed); `None`
    /// while it has waiters.
    idle_since: Option<Instant>,
}

#[derive(Default)]
struct State {
    channels: HashMap<String, Channel>,
    /// Whether the sweeper task is running.
    sweeping: bool,
}

impl State {
    fn wake_one(&mut self, channel: &str) {
        if let Some(ch) = self.channels.get_mut(channel) {
            if let Some(w) = ch.waiters.iter_mut().find(|w| !w.woken) {
                w.woken = true;
                w.notify.notify_one();
            }
        }
    }

    fn wake_owner(&mut self, channel: &str, owner: &str) {
        if let Some(ch) = self.channels.get_mut(channel) {
            if let Some(w) = ch.waiters.iter_mut().find(|w| w.owner == owner) {
                w.woken = true;
                w.notify.notify_one();
            }
        }
    }

    fn wake_all(&mut self) {
        for ch in self.channels.values_mut() {
            for w in &mut ch.waiters {
                w.woken = true;
                w.notify.notify_one();
            }
        }
    }
}

pub(crate) struct Notices {
    state: Mutex<State>,
    /// The live connection's sink; `None` while disconnected. The async mutex also
    /// orders SUBSCRIBE/UNSUBSCRIBE.
    sink: tokio::sync::Mutex<Option<PubSubSink>>,
    next_id: AtomicU64,
    /// How long a channel stays subscribed after its last waiter left.
    linger: Duration,
    task: Mutex<Option<JoinHandle<()>>>,
    connected: std::sync::atomic::AtomicBool,
}

impl Notices {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Connects the notice connection to `client` (a node of the deployment) and
    /// starts dispatching. The first connection is made here, so waiters registered
    /// right after are subscribed.
    pub(crate) async fn start(
        client: redis::Client,
        linger: Duration,
    ) -> redis::RedisResult<Arc<Self>> {
        let first = client.get_async_pubsub().await?;
        let notices = Arc::new(Notices {
            state: Mutex::new(State::default()),
            sink: tokio::sync::Mutex::new(None),
            next_id: AtomicU64::new(1),
            linger,
            task: Mutex::new(None),
            connected: std::sync::atomic::AtomicBool::new(true),
        });
        let (sink, stream) = first.split();
        *notices.sink.lock().await = Some(sink);
        let task = tokio::spawn(run(Arc::downgrade(&notices), client, Some(stream)));
        *notices.task.lock().unwrap_or_else(PoisonError::into_inner) = Some(task);
        Ok(notices)
    }

    /// Whether the notice connection is up (channels subscribed).
    pub(crate) fn connected(&self) -> bool {
        self.connected.load(Ordering::Acquire)
    }

    /// Registers a waiter for `owner` on `channel`; the subscription is confirmed when
    /// this returns (unless the connection is down: then `subscribed()` is false and
    /// the waiter must poll).
    pub(crate) async fn register(self: &Arc<Self>, channel: &str, owner: &str) -> Registration {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let notify = Arc::new(Notify::new());
        {
            let mut state = self.state();
            let ch = state.channels.entry(channel.to_owned()).or_default();
            ch.idle_since = None;
            ch.waiters.push(Waiter {
                id,
                owner: owner.to_owned(),
                notify: Arc::clone(&notify),
                woken: false,
            });
        }
        let mut sink = self.sink.lock().await;
        let needs = !self
            .state()
            .channels
            .get(channel)
            .is_some_and(|c| c.subscribed);
        let mut subscribed = !needs;
        if needs {
            if let Some(s) = sink.as_mut() {
                if s.subscribe(channel).await.is_ok() {
                    if let Some(c) = self.state().channels.get_mut(channel) {
                        c.subscribed = true;
                    }
                    subscribed = true;
                }
            }
        }
        drop(sink);
        Registration {
            notices: Arc::clone(self),
            channel: channel.to_owned(),
            id,
            notify,
            subscribed,
            acquired: false,
        }
    }

    fn leave(self: &Arc<Self>, channel: &str, id: u64, acquired: bool) {
        let start_sweeper = {
            let mut state = self.state();
            let Some(ch) = state.channels.get_mut(channel) else {
                return;
            };
            let woken = ch
                .waiters
                .iter()
                .position(|w| w.id == id)
                .map(|pos| ch.waiters.remove(pos).woken)
                .unwrap_or(false);
            let idle = ch.waiters.is_empty();
            if idle {
                ch.idle_since = Some(Instant::now());
            } else if woken && !acquired {
                state.wake_one(channel);
            }
            let start = idle && !state.sweeping;
            state.sweeping |= start;
            start
        };
        if start_sweeper {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => drop(rt.spawn(sweep(Arc::downgrade(self), self.linger))),
                Err(_) => self.state().sweeping = false,
            }
        }
    }
}

/// Unsubscribes channels idle for `linger`; runs while any channel lingers.
async fn sweep(notices: Weak<Notices>, linger: Duration) {
    loop {
        tokio::time::sleep((linger / 2).max(Duration::from_millis(10))).await;
        let Some(n) = notices.upgrade() else { return };
        // The sink lock orders this UNSUBSCRIBE before a new waiter's SUBSCRIBE.
        let mut sink = n.sink.lock().await;
        let (expired, lingering) = {
            let mut state = n.state();
            let now = Instant::now();
            let expired: Vec<String> = state
                .channels
                .iter()
                .filter(|(_, c)| {
                    c.idle_since
                        .is_some_and(|t| now.duration_since(t) >= linger)
                })
                .map(|(name, _)| name.clone())
                .collect();
            for name in &expired {
                state.channels.remove(name);
            }
            let lingering = state.channels.values().any(|c| c.idle_since.is_some());
            state.sweeping = lingering;
            (expired, lingering)
        };
        if let Some(s) = sink.as_mut() {
            for name in &expired {
                let _ = s.unsubscribe(name).await;
            }
        }
        drop(sink);
        if !lingering {
            return;
        }
    }
}

impl Drop for Notices {
    fn drop(&mut self) {
        if let Some(task) = self
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            task.abort();
        }
    }
}

/// A waiter's place on a channel; leaves it on drop.
pub(crate) struct Registration {
    notices: Arc<Notices>,
    channel: String,
    id: u64,
    notify: Arc<Notify>,
    subscribed: bool,
    acquired: bool,
}

impl Registration {
    /// Whether release notices reach this waiter (else it must poll).
    pub(crate) fn subscribed(&self) -> bool {
        self.subscribed
    }

    /// Waits for a notice addressed to this waiter. A notice that arrived since the
    /// last wait completes it at once.
    pub(crate) async fn notified(&self) {
        self.notify.notified().await;
        let mut state = self.notices.state();
        if let Some(w) = state
            .channels
            .get_mut(&self.channel)
            .and_then(|c| c.waiters.iter_mut().find(|w| w.id == self.id))
        {
            w.woken = false;
        }
    }

    /// The lock was granted: a pending wake-up is used, not passed on.
    pub(crate) fn mark_acquired(&mut self) {
        self.acquired = true;
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.notices.leave(&self.channel, self.id, self.acquired);
    }
}

async fn run(
    notices: Weak<Notices>,
    client: redis::Client,
    mut first: Option<redis::aio::PubSubStream>,
) {
    loop {
        if let Some(stream) = first.take() {
            dispatch(&notices, stream).await;
        } else {
            let connected = client.get_async_pubsub().await;
            let Some(n) = notices.upgrade() else { return };
            match connected {
                Ok(pubsub) => {
                    let (mut sink, stream) = pubsub.split();
                    let mut guard = n.sink.lock().await;
                    let channels: Vec<String> = n.state().channels.keys().cloned().collect();
                    for c in &channels {
                        if sink.subscribe(c).await.is_ok() {
                            if let Some(ch) = n.state().channels.get_mut(c) {
                                ch.subscribed = true;
                            }
                        }
                    }
                    *guard = Some(sink);
                    n.connected.store(true, Ordering::Release);
                    drop(guard);
                    // Notices may have been missed while disconnected.
                    n.state().wake_all();
                    drop(n);
                    dispatch(&notices, stream).await;
                }
                Err(e) => {
                    drop(n);
                    tracing::debug!(error = %e, "dlock-redis: release-notice connection failed; retrying");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    continue;
                }
            }
        }
        let Some(n) = notices.upgrade() else { return };
        n.connected.store(false, Ordering::Release);
        *n.sink.lock().await = None;
        for ch in n.state().channels.values_mut() {
            ch.subscribed = false;
        }
        n.state().wake_all();
        drop(n);
        tracing::debug!("dlock-redis: release-notice connection lost; reconnecting");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Delivers notices until the connection ends.
async fn dispatch(notices: &Weak<Notices>, mut stream: redis::aio::PubSubStream) {
    while let Some(msg) = stream.next().await {
        let Some(n) = notices.upgrade() else { return };
        let payload: String = msg.get_payload().unwrap_or_default();
        let channel = msg.get_channel_name();
        let mut state = n.state();
        match payload.strip_prefix("o:") {
            Some(owner) => state.wake_owner(channel, owner),
            None => state.wake_one(channel),
        }
    }
}
