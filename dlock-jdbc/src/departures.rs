//! Granted writers' queue rows still being removed: a writer's removal runs beside
//! its hold, off the hand-over's path, and the hold's release waits for it, so the
//! entry is gone before the release frees the lock (see [`crate::queue`]).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use dlock_spi::{HolderKey, LockName};
use tokio::sync::watch;

/// Each running removal's end, by lock name and holder key.
type Running = HashMap<(String, String), watch::Receiver<()>>;

/// Queue rows of granted writers still being removed, by lock name and holder key:
/// each hold's release waits for its own.
#[derive(Default)]
pub(crate) struct Departures {
    /// Each removal's end: its sender is dropped when the statement has ended.
    running: Arc<Mutex<Running>>,
}

impl Departures {
    /// Runs `removal` (of `waiter`'s row of `name`'s queue) in a task of its own;
    /// the hold's release waits for its end ([`Departures::ended`]).
    pub(crate) fn start(
        &self,
        name: &LockName,
        waiter: &HolderKey,
        removal: impl Future<Output = ()> + Send + 'static,
    ) {
        let key = (name.as_str().to_owned(), waiter.as_str().to_owned());
        let (ended, end) = watch::channel(());
        let mine = end.clone();
        self.running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key.clone(), end);
        let running = Arc::clone(&self.running);
        tokio::spawn(async move {
            removal.await;
            let mut running = running.lock().unwrap_or_else(PoisonError::into_inner);
            // Only its own: a grant id reused after a lost hold may have queued,
            // been granted and started another removal meanwhile.
            if running.get(&key).is_some_and(|r| r.same_channel(&mine)) {
                running.remove(&key);
            }
            drop(ended);
        });
    }

    /// Waits until the removal of hold `holder`'s queue row of `name`, if one runs,
    /// has ended (bounded by the statement's own timeouts).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only waits; the removal runs on in its task.
    pub(crate) async fn ended(&self, name: &str, holder: &str) {
        let end = {
            let running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
            // (Most releases are of holds that never queued: no key is built.)
            if running.is_empty() {
                return;
            }
            running.get(&(name.to_owned(), holder.to_owned())).cloned()
        };
        if let Some(mut end) = end {
            // Err once the sender is dropped: the removal has ended.
            while end.changed().await.is_ok() {}
        }
    }
}
