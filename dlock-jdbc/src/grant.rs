//! One attempt at a grant, in each mode (exclusive, shared, permits): the grant
//! statements, and what a refused one reads about the lock and the queue.

use std::sync::atomic::Ordering;
use std::time::Duration;

use dlock_spi::{
    AcquireRequest, Error, Fairness, HoldPurpose, HolderKey, LockMode, LockRemoteResource, OwnerId,
    Result,
};
use sqlx::Row;

use crate::backend::{lease_ms, remaining, JdbcBackend};
use crate::dialect::Dialect;
use crate::error::retry_conflicts;
use crate::param::Param;
use crate::permits;
use crate::pool::{on_pool, query, Pool};
use crate::queue::QueueSlot;
use crate::run_to_end::{run_to_end, statement_place};

/// Takes a token from a `RETURNING token` row.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
macro_rules! row_token {
    ($q:expr, $exec:expr) => {
        match $q.fetch_optional($exec).await {
            Ok(row) => row.map(|r| r.try_get::<i64, _>(0)).transpose(),
            Err(e) => Err(e),
        }
    };
}

/// Takes a token from MySQL's `LAST_INSERT_ID(expr)` (0 = not granted).
#[cfg(feature = "mysql")]
macro_rules! mysql_token {
    ($q:expr, $exec:expr) => {
        $q.execute($exec)
            .await
            .map(|r| i64::try_from(r.last_insert_id()).ok().filter(|t| *t > 0))
    };
}

/// Runs `$body!(pool, token_macro)` with the dialect's way of reading back tokens.
macro_rules! with_token_reader {
    ($pool:expr, $body:ident) => {
        match $pool {
            #[cfg(feature = "sqlite")]
            Pool::Sqlite(p) => $body!(p, row_token),
            #[cfg(feature = "mysql")]
            Pool::MySql(p) => $body!(p, mysql_token),
            #[cfg(feature = "postgres")]
            Pool::Postgres(p) => $body!(p, row_token),
        }
    };
}

/// The longest holder identity a MySQL semaphore takes: its entries are read back
/// as `VARCHAR(255)`, as the `owner` columns are.
const MAX_MYSQL_HOLDER_LEN: usize = 255;

/// How many times one permit attempt runs again after a concurrent grant changed
/// the semaphore while it ran (PostgreSQL), before it counts as refused.
const PERMIT_RACES: u32 = 8;

/// What the contention statement reads: the holder's stored key, its lease left
/// (ms), the readers' horizon left (ms), live waiters ahead, the waiter just ahead.
type ContentionRow = (Option<String>, i64, i64, i64, Option<String>);

/// A grant: its fencing token, and whether the granting statement also took the
/// waiter out of the queue (else the waiter leaves it with a statement of its own).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Granted {
    pub(crate) token: i64,
    pub(crate) left_queue: bool,
}

/// What a grant statement answered.
enum Answer {
    Granted(Granted),
    /// Refused; with the lock's row as the statement saw it, when it reads it
    /// (PostgreSQL's exclusive grant, see [`Exclusive::acquire`](crate::statements::Exclusive::acquire)).
    Refused(Option<Seen>),
}

impl Answer {
    /// The answer of a statement that answers a token (or none) and leaves the
    /// queue alone.
    pub(crate) fn of_token(token: Option<i64>) -> Self {
        match token {
            Some(token) => Answer::Granted(Granted::queue_untouched(token)),
            None => Answer::Refused(None),
        }
    }
}

/// The lock's row as a refused grant saw it: the holder's stored key, its lease
/// left (ms), the readers' horizon left (ms) — the contention statement's first
/// columns.
type Seen = (Option<String>, i64, i64);

impl Granted {
    /// A grant by a statement that leaves the queue alone.
    pub(crate) fn queue_untouched(token: i64) -> Self {
        Granted {
            token,
            left_queue: false,
        }
    }
}

pub(crate) enum Attempt {
    Granted(Granted),
    Busy {
        holder: Option<OwnerId>,
        /// The live holder's stored key (its owner and grant): a new one is a new
        /// hold.
        holder_key: Option<String>,
        retry_after: Option<Duration>,
        /// Live waiters queued ahead of this one (0 when not queued, or not read:
        /// see [`JdbcBackend::attempt`]).
        ahead: i64,
        /// The live waiter queued just ahead of this one, if any.
        predecessor: Option<String>,
        /// This attempt queued the waiter, for the first time: a release that began
        /// before its queue entry was visible did not see it, and notified nobody.
        /// (Not set for a writer told by release notices queued behind a live
        /// writer, as PostgreSQL's enqueue reads it: that writer is named first,
        /// and its release names the next one — unless it released or left while
        /// this entry was being written: see `told` in `try_acquire`.)
        just_queued: bool,
    },
}

impl JdbcBackend {
    /// One attempt: the grant statement, then — refused — the waiter's place in the
    /// queue (when it is `waiting`) and what the lock is busy with. `slot`: the
    /// caller's place in the queue, if it may wait at all. `placed`: the caller
    /// paces its looks by its place in the queue (`ahead`, `predecessor`), so the
    /// contention statement reads it; otherwise a grant statement that read the
    /// lock's row itself (PostgreSQL) answers for it when it saw a live holder, and
    /// nothing more is read. (A refusal it saw no holder for — the queue's, the
    /// readers', or a grant after its snapshot — is read again, to name who has the
    /// lock now.)
    pub(crate) async fn attempt(
        &self,
        req: &AcquireRequest,
        slot: Option<&mut QueueSlot>,
        waiting: bool,
        placed: bool,
    ) -> Result<Attempt> {
        self.inner.attempts.fetch_add(1, Ordering::Relaxed);
        let queued = slot.as_deref().is_some_and(QueueSlot::is_queued);
        let seen = match self.try_grant(req, queued).await? {
            Answer::Granted(granted) => return Ok(Attempt::Granted(granted)),
            Answer::Refused(seen) => {
                seen.filter(|(owner, left, _)| !placed && owner.is_some() && *left > 0)
            }
        };
        // A writer told by release notices (not `placed`) that queued behind a
        // live writer is named in its turn: it needs no look right after queueing.
        let just_queued = match slot.filter(|_| waiting) {
            Some(slot) => slot
                .keep()
                .await?
                .is_some_and(|writer_ahead| placed || !writer_ahead),
            None => false,
        };
        let s = &self.inner.statements;
        let holder = req.holder();
        let params = [Param::Text(req.name.as_str()), Param::Text(holder.as_str())];
        let row: Option<ContentionRow> = match seen {
            Some((owner, left, shared_left)) => Some((owner, left, shared_left, 0, None)),
            None => on_pool!(&self.inner.pool, p => {
            async {
                match query!(&s.queue.contention, &params).fetch_optional(p).await? {
                    Some(r) => Ok::<_, sqlx::Error>(Some((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, r.try_get(3)?, r.try_get(4)?))),
                    None => Ok(None),
                }
            }
            .await
            })
            .map_err(self.err("acquire"))?,
        };
        Ok(match row {
            Some((owner, left, shared_left, ahead, predecessor)) => {
                let holder_live = owner.is_some() && left > 0;
                let holder_key = owner.filter(|_| holder_live);
                Attempt::Busy {
                    holder: holder_key
                        .as_deref()
                        .map(|stored| HolderKey::parse(stored).0),
                    holder_key,
                    retry_after: remaining(if holder_live { left } else { shared_left }),
                    ahead,
                    predecessor,
                    just_queued,
                }
            }
            None => Attempt::Busy {
                holder: None,
                holder_key: None,
                retry_after: None,
                ahead: 0,
                predecessor: None,
                just_queued,
            },
        })
    }

    /// Runs one grant statement to its end ([`run_to_end`]): a caller whose future is
    /// dropped mid-statement cannot abort it half-way, and a grant the statement made
    /// for a caller that is gone is released by the task that finishes it, after the
    /// statement — a release racing it on another pooled connection could land first
    /// and leave the grant held until its lease ends.
    async fn try_grant(&self, req: &AcquireRequest, queued: bool) -> Result<Answer> {
        // The statement carries the backend and the request it runs with, for what
        // follows its answer: nothing is cloned twice.
        let (backend, request) = (self.clone(), req.clone());
        let grant = async move {
            let answer = retry_conflicts(|| async {
                let token = match request.mode {
                    LockMode::Exclusive => return backend.try_exclusive(&request, queued).await,
                    LockMode::Shared => backend.try_shared(&request).await,
                    LockMode::Permits(n) => backend.try_permits(&request, n).await,
                };
                token.map(Answer::of_token)
            })
            .await;
            (answer, backend, request)
        };
        let unheard = |(answer, backend, request): (
            Result<Answer>,
            JdbcBackend,
            AcquireRequest,
        )| async move {
            if let Ok(Answer::Granted(_)) = answer {
                if request.purpose == HoldPurpose::Leadership {
                    backend.announce_term(&request).await;
                }
                if let Err(err) = backend.release(&request.release_of_grant()).await {
                    tracing::warn!(lock = %request.name, error = %err, "dlock-jdbc: releasing the grant of a cancelled acquire failed; its lease will expire");
                }
            }
        };
        let (answer, backend, request) =
            run_to_end(statement_place(req.mode), grant, unheard).await?;
        if let (Ok(Answer::Granted(_)), HoldPurpose::Leadership) = (&answer, request.purpose) {
            // Observers of the election learn of the new term (after the answer: the
            // grant does not wait for it).
            tokio::spawn(async move { backend.announce_term(&request).await });
        }
        answer
    }

    /// Tells the election's observers of the term `req` was granted.
    async fn announce_term(&self, req: &AcquireRequest) {
        self.notify(self.inner.statements.notices.change.as_ref(), &req.name)
            .await;
    }

    /// `queued`: the caller has an entry in the queue (its grant reads the queue).
    #[cfg_attr(not(feature = "mysql"), allow(unused_variables))]
    async fn try_exclusive(&self, req: &AcquireRequest, queued: bool) -> Result<Answer> {
        let s = &self.inner.statements;
        // The owner column holds the grant's identity.
        let holder = req.holder();
        // Queued waiters who go first: all in fair mode (< 0), the starving ones else.
        let starving_after = match req.fairness {
            Fairness::Fair => -1,
            Fairness::NonFair => {
                i64::try_from(self.inner.options.starvation_after.as_millis()).unwrap_or(i64::MAX)
            }
        };
        // Beside the owner's read hold (an upgrade), its own statement (`$7`: that
        // hold; the plain statement binds up to `$6`).
        let beside = req.alongside_holder();
        let params = [
            Param::Text(req.name.as_str()),
            Param::Text(holder.as_str()),
            Param::Int(lease_ms(req.lease)),
            Param::Bytes(&req.context),
            Param::Int(starving_after),
            Param::Int(lease_ms(req.lease.saturating_sub(req.transition))),
            Param::Text(beside.as_ref().map_or("", |b| b.as_str())),
        ];
        #[cfg(feature = "mysql")]
        if let (None, false, Some(unqueued), Pool::MySql(p)) = (
            &beside,
            queued,
            &s.exclusive.acquire_unqueued,
            &self.inner.pool,
        ) {
            match mysql_token!(query!(unqueued, &params), p).map_err(self.err("acquire"))? {
                // A free lock whose queue may hold live waiters: the queue decides.
                Some(crate::statements::ASK_THE_QUEUE) => {}
                token => return Ok(Answer::of_token(token)),
            }
        }
        // PostgreSQL's grant answers one row, with the lock's row as it saw it, and
        // takes the waiter out of the queue itself.
        #[cfg(feature = "postgres")]
        if let (None, Pool::Postgres(p)) = (&beside, &self.inner.pool) {
            let answer = query!(&s.exclusive.acquire, &params)
                .fetch_one(p)
                .await
                .and_then(|row| {
                    Ok(match row.try_get::<Option<i64>, _>(0)? {
                        Some(token) => Answer::Granted(Granted {
                            token,
                            left_queue: true,
                        }),
                        None => Answer::Refused(Some((
                            row.try_get(1)?,
                            row.try_get(2)?,
                            row.try_get(3)?,
                        ))),
                    })
                });
            return answer.map_err(self.err("acquire"));
        }
        // SQLite, MariaDB/MySQL (PostgreSQL answered above).
        if beside.is_none() {
            macro_rules! body {
                ($p:ident, $token:ident) => {
                    $token!(query!(&s.exclusive.acquire, &params), $p)
                };
            }
            let token: std::result::Result<Option<i64>, sqlx::Error> =
                with_token_reader!(&self.inner.pool, body);
            return token.map(Answer::of_token).map_err(self.err("acquire"));
        }
        // An upgrade judges the readers table: it takes the lock's row first, in a
        // transaction, so its statement reads the readers as they are once the row
        // is free (a reader's grant holds the row until it commits; a statement
        // that waited for the row would read the readers as they were before).
        let name = [Param::Text(req.name.as_str())];
        macro_rules! body {
            ($p:ident, $token:ident) => {
                async {
                    let mut tx = $p.begin().await?;
                    query!(&s.shared.lock_row, &name).execute(&mut *tx).await?;
                    let token = $token!(query!(&s.exclusive.acquire_beside, &params), &mut *tx)?;
                    tx.commit().await?;
                    Ok::<_, sqlx::Error>(token)
                }
                .await
            };
        }
        let result: std::result::Result<Option<i64>, sqlx::Error> =
            with_token_reader!(&self.inner.pool, body);
        result.map(Answer::of_token).map_err(self.err("acquire"))
    }

    async fn try_shared(&self, req: &AcquireRequest) -> Result<Option<i64>> {
        let s = &self.inner.statements;
        let name = Param::Text(req.name.as_str());
        let lease = Param::Int(lease_ms(req.lease));
        let holder = req.holder();
        // Beside the owner's write hold (a writer reading), its own statement (`$4`:
        // that hold; the plain statement binds up to `$3`).
        let beside = req.alongside_holder();
        let statement = match beside {
            Some(_) => &s.shared.acquire_row_beside,
            None => &s.shared.acquire_row,
        };
        let row = [
            name,
            lease,
            Param::Text(holder.as_str()),
            Param::Text(beside.as_ref().map_or("", |b| b.as_str())),
        ];
        macro_rules! body {
            ($p:ident, $token:ident) => {
                async {
                    let mut tx = $p.begin().await?;
                    let granted = $token!(query!(statement, &row), &mut *tx)?;
                    match granted {
                        None => {
                            tx.rollback().await?;
                            Ok::<_, sqlx::Error>(None)
                        }
                        Some(token) => {
                            let reader = [
                                name,
                                Param::Text(holder.as_str()),
                                Param::Int(token),
                                lease,
                                Param::Bytes(&req.context),
                            ];
                            let token =
                                $token!(query!(&s.shared.acquire_reader, &reader), &mut *tx)?;
                            tx.commit().await?;
                            Ok(token)
                        }
                    }
                }
                .await
            };
        }
        let result: std::result::Result<Option<i64>, sqlx::Error> =
            with_token_reader!(&self.inner.pool, body);
        result.map_err(self.err("acquire"))
    }

    /// Takes `n` permits of a semaphore (see [`Permits::grant`](crate::statements::Permits::grant)): one
    /// `UPDATE` of the semaphore's row. A refusal is checked against the semaphore's
    /// state: a different total while it is in use is the caller's error, and room
    /// that a concurrent grant raced away from the statement is tried again.
    async fn try_permits(&self, req: &AcquireRequest, n: u32) -> Result<Option<i64>> {
        let s = &self.inner.statements;
        let holder = req.holder();
        // MySQL finds a holder's entry by a search pattern (bound as `$7`).
        let pattern = if self.dialect() == Dialect::MySql {
            if holder.as_str().len() > MAX_MYSQL_HOLDER_LEN {
                return Err(Error::new(
                    dlock_spi::ErrorKind::InvalidArgument,
                    format!(
                        "the holder's identity (owner and grant) is {} bytes; MySQL semaphores take at most {MAX_MYSQL_HOLDER_LEN} — use a shorter owner id",
                        holder.as_str().len()
                    ),
                ));
            }
            permits::search_pattern(holder.as_str())
        } else {
            String::new()
        };
        let context = permits::context_hex(&req.context);
        let params = [
            Param::Text(req.name.as_str()),
            Param::Text(holder.as_str()),
            Param::Int(lease_ms(req.lease)),
            Param::Int(i64::from(n)),
            Param::Int(i64::from(req.capacity)),
            Param::Text(&context),
            Param::Text(&pattern),
        ];
        macro_rules! body {
            ($p:ident, $token:ident) => {
                $token!(query!(&s.permits.grant, &params), $p)
            };
        }
        for _ in 0..PERMIT_RACES {
            let granted: std::result::Result<Option<i64>, sqlx::Error> =
                with_token_reader!(&self.inner.pool, body);
            if let Some(token) = granted.map_err(self.err("acquire"))? {
                return Ok(Some(token));
            }
            let state: std::result::Result<Option<[i64; 5]>, sqlx::Error> = on_pool!(&self.inner.pool, p => {
                async {
                    match query!(&s.permits.state, &params[..2]).fetch_optional(p).await? {
                        Some(r) => Ok(Some([r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, r.try_get(3)?, r.try_get(4)?])),
                        None => Ok(None),
                    }
                }
                .await
            });
            let Some([capacity, used, others_waiting, blocked, first]) =
                state.map_err(self.err("acquire"))?
            else {
                // A semaphore's first use: its row, which the grant updates.
                on_pool!(&self.inner.pool, p => query!(&s.permits.ensure_row, &params[..1]).execute(p).await.map(drop))
                    .map_err(self.err("acquire"))?;
                continue;
            };
            let total = i64::from(req.capacity);
            if capacity != total && (used > 0 || others_waiting > 0) {
                return Err(Error::semaphore_total_differs(capacity, req.capacity));
            }
            let room = blocked == 0 && first == 1 && used + i64::from(n) <= total;
            if !room {
                return Ok(None);
            }
            // The room was there: a concurrent grant changed the row after this
            // statement's snapshot. Try again.
        }
        Ok(None)
    }
}
