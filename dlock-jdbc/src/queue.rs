//! A waiting acquire's place in its lock's queue (the `waiters` table): written at
//! its first refusal, refreshed while it waits, and removed when the acquire ends.
//!
//! A granted writer's removal is off the hand-over's path: the grant returns at
//! once, the removal runs beside the hold, and the hold's release waits for it
//! ([`Departures`]), so the entry is gone before the release frees the lock. While
//! it runs, the entry stands for a hold that is live: a waiter behind is refused by
//! the hold itself, whatever the queue says. (A removal that fails, or a hold whose
//! lease ends first, leaves the entry to lapse with its liveness, as a waiter that
//! gave up and could not remove it does.)

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use dlock_spi::{AcquireRequest, Error, HolderKey, LockMode, LockName, Result};
use sqlx::Row;
use tokio::sync::watch;

use crate::backend::JdbcBackend;
use crate::error::{map_sqlx, retry_conflicts};
use crate::param::Param;
use crate::pool::{on_pool, query};

/// A waiting acquire's row in the lock's queue: written at its first refusal,
/// refreshed at least every third of its liveness, and removed when the acquire ends
/// — granted (a writer: beside its hold, see [`Departures`]), given up (awaited), or
/// dropped mid-wait (in a task of its own, so a cancelled waiter leaves at once
/// rather than when its liveness lapses).
pub(crate) struct QueueSlot {
    backend: JdbcBackend,
    name: LockName,
    waiter: HolderKey,
    mode: LockMode,
    /// When the row was last written; `None` while not queued.
    refreshed: Option<Instant>,
}

impl QueueSlot {
    pub(crate) fn new(backend: &JdbcBackend, req: &AcquireRequest) -> Self {
        QueueSlot {
            backend: backend.clone(),
            name: req.name.clone(),
            waiter: req.holder(),
            mode: req.mode,
            refreshed: None,
        }
    }

    /// Queues the waiter (keeping its arrival) or refreshes its liveness, unless it
    /// did so less than a third of the liveness ago. Queued just now, for the first
    /// time, it answers whether a live writer (not the holder) was queued ahead of
    /// it (PostgreSQL reads it; elsewhere `false`), else `None`. The statement runs
    /// in a task of
    /// its own, which removes the row again if the caller is gone by its end: a
    /// removal racing it on another pooled connection could land first.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped, the statement still runs to its end and the row is
    /// removed after it (the slot's drop removes it too).
    pub(crate) async fn keep(&mut self) -> Result<Option<bool>> {
        let liveness = self.backend.inner.options.waiter_liveness;
        if self.refreshed.is_some_and(|at| at.elapsed() < liveness / 3) {
            return Ok(None);
        }
        let first = self.refreshed.is_none();
        let sent = Instant::now();
        // From here on the row may exist: a drop removes it.
        self.refreshed.get_or_insert(sent);
        let (backend, name, waiter, mode) = (
            self.backend.clone(),
            self.name.clone(),
            self.waiter.clone(),
            self.mode,
        );
        let (answer, answered) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let queued = backend.enqueue(&name, &waiter, mode, first).await;
            if answer.send(queued).is_err() {
                dequeue(&backend, &name, &waiter).await;
            }
        });
        let writer_ahead = answered.await.map_err(|_| {
            Error::new(
                dlock_spi::ErrorKind::Backend,
                "the queue statement's task ended without an answer (the runtime is shutting down?)",
            )
        })??;
        self.refreshed = Some(sent);
        Ok(first.then_some(writer_ahead))
    }

    /// Whether the waiter's entry may be in the queue (written, not yet removed).
    pub(crate) fn is_queued(&self) -> bool {
        self.refreshed.is_some()
    }

    /// The grant took the waiter out of the queue: nothing is left to remove.
    pub(crate) fn left(mut self) {
        self.refreshed = None;
    }

    /// The waiter was granted the lock exclusively: its row is removed beside the
    /// hold, and the hold's release waits for the removal ([`Departures`]).
    ///
    /// Writers only: a reader's or a permit holder's row would hold back the
    /// readers and permit requests queued behind it, which the hold does not.
    pub(crate) fn depart(mut self) {
        if self.refreshed.take().is_some() {
            let departures = &self.backend.inner.departures;
            departures.start(&self.backend, self.name.clone(), self.waiter.clone());
        }
    }

    /// Leaves the queue, in a task of its own: a caller dropped while it waits does
    /// not cut the removal short (a row left behind would hold newcomers back until
    /// its liveness lapsed). A failure is only logged: the row lapses with its
    /// liveness.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped, the removal still runs to its end.
    pub(crate) async fn leave(mut self) {
        if self.refreshed.take().is_some() {
            let _ = tokio::spawn(self.removal()).await;
        }
    }

    /// The row's removal, to run in a task of its own.
    fn removal(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let (backend, name, waiter) =
            (self.backend.clone(), self.name.clone(), self.waiter.clone());
        async move { dequeue(&backend, &name, &waiter).await }
    }
}

impl Drop for QueueSlot {
    fn drop(&mut self) {
        if self.refreshed.is_some() {
            let what = format_args!("lock {}'s queue entry of a cancelled waiter", self.name);
            dlock_spi::spawn_cleanup(&what, None, self.removal());
        }
    }
}

/// Queue rows of granted writers still being removed, by lock name and holder key:
/// each hold's release waits for its own.
#[derive(Default)]
pub(crate) struct Departures {
    /// Each removal's end: its sender is dropped when the statement has ended.
    running: Mutex<HashMap<(String, String), watch::Receiver<()>>>,
}

impl Departures {
    /// Removes `waiter`'s row of `name`'s queue, in a task of its own.
    fn start(&self, backend: &JdbcBackend, name: LockName, waiter: HolderKey) {
        let key = (name.as_str().to_owned(), waiter.as_str().to_owned());
        let (ended, end) = watch::channel(());
        let mine = end.clone();
        self.running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key.clone(), end);
        let backend = backend.clone();
        tokio::spawn(async move {
            dequeue(&backend, &name, &waiter).await;
            let mut running = backend
                .inner
                .departures
                .running
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
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

/// Removes `waiter`'s row of `name`'s queue; a failure is only logged (the row
/// lapses with its liveness).
async fn dequeue(backend: &JdbcBackend, name: &LockName, waiter: &HolderKey) {
    let inner = &backend.inner;
    let params = [Param::Text(name.as_str()), Param::Text(waiter.as_str())];
    let left = retry_conflicts(|| async {
        let notice = match &inner.bus {
            // SQLite: the statement answers the notice to pass on, if any.
            Some(_) => on_pool!(&inner.pool, p => {
                // All rows are read: the statement commits as it ends.
                match query!(&inner.statements.queue.dequeue, &params).fetch_all(p).await {
                    Ok(rows) => rows.first().map_or(Ok(None), |row| row.try_get::<Option<String>, _>(0)),
                    Err(e) => Err(e),
                }
            }),
            None => on_pool!(&inner.pool, p => query!(&inner.statements.queue.dequeue, &params).execute(p).await.map(|_| None)),
        };
        notice.map_err(|e| map_sqlx(e, backend.backend(), "leave"))
    })
    .await;
    if let (Ok(Some(notice)), Some(bus)) = (&left, &inner.bus) {
        bus.send(notice);
    }
    if let Err(err) = left {
        tracing::debug!(lock = %name, error = %err, "dlock-jdbc: leaving the queue failed; the entry lapses with its liveness");
    }
}
