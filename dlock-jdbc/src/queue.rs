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

use std::time::Instant;

use dlock_spi::{AcquireRequest, Error, HolderKey, LockMode, LockName, Result};
use sqlx::Row;

use crate::backend::{ms, JdbcBackend};
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
            departures.start(&self.name, &self.waiter, self.removal());
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

impl JdbcBackend {
    /// Queues `waiter` (or refreshes its liveness); the `first` time, forgets the
    /// waiters that crashed while queued. Answers whether a live writer other than
    /// `waiter` and the lock's live holder was queued ahead of it as it queued
    /// (PostgreSQL's first entry; `false` where not read).
    pub(crate) async fn enqueue(
        &self,
        name: &LockName,
        waiter: &HolderKey,
        mode: LockMode,
        first: bool,
    ) -> Result<bool> {
        let s = &self.inner.statements;
        let name = Param::Text(name.as_str());
        if let Some(mark) = &s.queue.mark {
            // Before the entry, whose liveness the enqueue caps at the mark: twice
            // the liveness, renewed when less than one and a half is left (an entry
            // written more than half a liveness later lapses early, and is refreshed
            // at its next look).
            let liveness = ms(self.inner.options.waiter_liveness);
            let params = [
                name,
                Param::Int(liveness.saturating_mul(2)),
                Param::Int(liveness.saturating_add(liveness / 2)),
            ];
            on_pool!(&self.inner.pool, p => query!(mark, &params).execute(p).await.map(drop))
                .map_err(self.err("acquire"))?;
        }
        let mode = match mode {
            LockMode::Shared => "s",
            LockMode::Exclusive => "x",
            LockMode::Permits(_) => "p",
        };
        let params = [
            name,
            Param::Text(waiter.as_str()),
            Param::Text(mode),
            Param::Int(ms(self.inner.options.waiter_liveness)),
        ];
        if let (true, Some(both)) = (first, &s.queue.purge_and_enqueue) {
            // One statement purges, queues, and reads the writers ahead.
            return on_pool!(&self.inner.pool, p => async {
                query!(both, &params).fetch_one(p).await?.try_get::<bool, _>(0)
            }.await)
            .map_err(self.err("acquire"));
        }
        if first {
            on_pool!(&self.inner.pool, p => query!(&s.queue.purge, &[name]).execute(p).await.map(drop))
                .map_err(self.err("acquire"))?;
        }
        on_pool!(&self.inner.pool, p => query!(&s.queue.enqueue, &params).execute(p).await.map(drop))
            .map_err(self.err("acquire"))?;
        Ok(false)
    }
}
