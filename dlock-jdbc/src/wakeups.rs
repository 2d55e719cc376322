//! How a backend's waiters in this process are woken: release notices (PostgreSQL's
//! `NOTIFY`, SQLite's local bus) wake the waiter they name, or one waiter of the
//! lock; observers hear of every change; and what a waiter does after its bell
//! (MariaDB) wait.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;

/// Local waiters per lock name, woken by PostgreSQL's release notifications, and
/// observers per lock name (election followers), told of every change.
#[derive(Default)]
pub(crate) struct Wakeups {
    waiters: Mutex<HashMap<String, NameWaiters>>,
    observers: Mutex<HashMap<String, tokio::sync::watch::Sender<u64>>>,
}

/// The waiters of one lock name in this process.
#[derive(Default)]
struct NameWaiters {
    /// Wakes any one of them.
    any: Arc<Notify>,
    /// Each one's own wake-up, by its queue key (with how many share the key); the
    /// name's entry goes when this is empty.
    by_key: HashMap<String, (Arc<Notify>, usize)>,
}

/// What a release notice on PostgreSQL says: the lock, and the writer first in its
/// queue if one waits (the payload [`crate::statements::RELEASE_PAYLOAD`] builds).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ReleaseNotice<'a> {
    /// The released lock's name.
    pub(crate) name: &'a str,
    /// The queue key of the live writer first in the queue; `None` when nobody
    /// waits, a reader or permit request is first, or the notice is an older
    /// client's (its payload the bare name).
    pub(crate) head_writer: Option<&'a str>,
}

impl<'a> ReleaseNotice<'a> {
    /// Reads a release notice's payload; anything that does not parse is an older
    /// client's bare name.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn parse(payload: &'a str) -> Self {
        let parsed = payload.split_once(':').and_then(|(len, rest)| {
            let len: usize = len.parse().ok()?;
            let (name, head) = (rest.get(..len)?, rest.get(len..)?);
            Some(ReleaseNotice {
                name,
                head_writer: head.strip_prefix('x').filter(|k| !k.is_empty()),
            })
        });
        parsed.unwrap_or(ReleaseNotice {
            name: payload,
            head_writer: None,
        })
    }
}

impl Wakeups {
    /// A change feed of `name`.
    pub(crate) fn observe(&self, name: &str) -> tokio::sync::watch::Receiver<u64> {
        let mut map = self
            .observers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        map.retain(|_, tx| tx.receiver_count() > 0);
        map.entry(name.to_owned())
            .or_insert_with(|| tokio::sync::watch::channel(0).0)
            .subscribe()
    }

    /// Tells the observers of `name` that its holders changed.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn changed(&self, name: &str) {
        let map = self
            .observers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(tx) = map.get(name) {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Notices may have been missed (sent while the `LISTEN` connection was down):
    /// every local waiter looks at its lock again, every observer re-reads.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn notices_missed(&self) {
        self.wake_all();
        self.changed_all();
    }

    /// Tells every observer (notifications may have been missed).
    fn changed_all(&self) {
        let map = self
            .observers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for tx in map.values() {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Wakes every local waiter once, to look at its lock again.
    fn wake_all(&self) {
        let map = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        for (own, _) in map.values().flat_map(|slot| slot.by_key.values()) {
            own.notify_one();
        }
    }

    /// Subscribes the waiter `key` of `name` to release notices.
    pub(crate) fn subscribe(self: &Arc<Self>, name: &str, key: &str) -> Subscription {
        let mut map = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = map.entry(name.to_owned()).or_default();
        let own = slot.by_key.entry(key.to_owned()).or_default();
        own.1 += 1;
        Subscription {
            wakeups: Arc::clone(self),
            name: name.to_owned(),
            key: key.to_owned(),
            any: Arc::clone(&slot.any),
            own: Arc::clone(&own.0),
        }
    }

    /// Wakes the waiters a release notice calls for: the writer first in the queue
    /// alone when it names one (in this process or, if not here, nobody here: it is
    /// another process's turn), else one local waiter of the lock (the rest keep
    /// polling or wait for the next notice).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn wake(&self, notice: &ReleaseNotice<'_>) {
        let map = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(slot) = map.get(notice.name) else {
            return;
        };
        match notice.head_writer {
            Some(key) => {
                if let Some((own, _)) = slot.by_key.get(key) {
                    own.notify_one();
                }
            }
            None => slot.any.notify_one(),
        }
    }
}

/// A waiter's subscription to its lock's release notices; ends when dropped.
pub(crate) struct Subscription {
    wakeups: Arc<Wakeups>,
    name: String,
    key: String,
    /// Woken for any one waiter of the name.
    pub(crate) any: Arc<Notify>,
    /// Woken for this waiter alone.
    pub(crate) own: Arc<Notify>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut map = self
            .wakeups
            .waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(slot) = map.get_mut(&self.name) {
            if let Some(own) = slot.by_key.get_mut(&self.key) {
                own.1 -= 1;
                if own.1 == 0 {
                    slot.by_key.remove(&self.key);
                }
            }
            if slot.by_key.is_empty() {
                map.remove(&self.name);
            }
        }
    }
}

/// What a waiter does after its bell wait (`bell::Waiter::wait_turn`), with or
/// without the `mysql` feature.
#[derive(Debug, PartialEq, Eq)]
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
pub(crate) enum Next {
    /// Look at the lock at once.
    Look,
    /// Pause as polling would, then look.
    Pause,
}

#[cfg(test)]
mod tests {
    use super::ReleaseNotice;

    fn notice<'a>(name: &'a str, head_writer: Option<&'a str>) -> ReleaseNotice<'a> {
        ReleaseNotice { name, head_writer }
    }

    #[test]
    fn release_notices_name_the_lock_and_the_writer_first_in_line() {
        assert_eq!(
            ReleaseNotice::parse("3:a:bxo#1"),
            notice("a:b", Some("o#1"))
        );
        assert_eq!(
            ReleaseNotice::parse("3:é\nxo:x#2"),
            notice("é\n", Some("o:x#2"))
        );
        // A reader or a permit request first, or nobody: no writer to single out.
        assert_eq!(ReleaseNotice::parse("3:a:bso#1"), notice("a:b", None));
        assert_eq!(ReleaseNotice::parse("3:a:bpo#1"), notice("a:b", None));
        assert_eq!(ReleaseNotice::parse("3:a:b"), notice("a:b", None));
        // An older client's bare name.
        assert_eq!(ReleaseNotice::parse("orders"), notice("orders", None));
        assert_eq!(ReleaseNotice::parse("9:short"), notice("9:short", None));
        assert_eq!(ReleaseNotice::parse("1:é"), notice("1:é", None));
    }
}
