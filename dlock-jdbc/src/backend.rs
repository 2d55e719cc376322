//! The SQL `LockRemoteResource`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use dlock_spi::{
    AcquireRequest, AcquireResult, Backoff, Capabilities, Error, Fairness, FencingToken,
    HoldPurpose, HolderInfo, HolderKey, LockAdmin, LockMode, LockName, LockRemoteResource,
    LockState, OwnerId, ReleaseRequest, ReleaseResult, RenewRequest, RenewResult, Result,
};
use sqlx::Row;

use crate::bell::Bells;
use crate::dialect::Dialect;
use crate::error::{conflict_pause, is_conflict, map_sqlx, retry_conflicts};
use crate::local_bus::LocalBus;
use crate::param::Param;
use crate::permits;
use crate::pool::{on_pool, query, Pool};
use crate::queue::{Departures, QueueSlot};
use crate::run_to_end::{run_to_end, Where};
use crate::statements::{Statements, Stmt};
use crate::wakeups::{Next, Subscription, Wakeups};
use crate::JdbcOptions;

/// Rows of `inspect` and `contention`: owner, token, context, remaining ms.
type HolderRow = (Option<String>, i64, Option<Vec<u8>>, i64);
/// What `inspect` reads: the lock row (holder, live waiters, ms left of the holder's own lease) and the
/// readers and permit holders (with their permits).
type InspectRows = (Option<(HolderRow, i64, Option<i64>)>, Vec<(HolderRow, i64)>);

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

pub(crate) struct Inner {
    pub(crate) pool: Pool,
    pub(crate) statements: Statements,
    pub(crate) options: JdbcOptions,
    pub(crate) attempts: AtomicU64,
    pub(crate) wakeups: Option<Arc<Wakeups>>,
    pub(crate) listener: Option<dlock_spi::TaskGuard>,
    /// MariaDB/MySQL: the bells waiters block on (`None`: turned off, or another
    /// database).
    pub(crate) bells: Option<Bells>,
    /// SQLite: where release notices go to the processes sharing the file
    /// (`None`: another database, or the socket directory cannot be used).
    pub(crate) bus: Option<LocalBus>,
    /// Granted writers' queue rows still being removed (see [`crate::queue`]).
    pub(crate) departures: Departures,
    /// The session mode's sessions: every lock call goes to them (`None`: the row
    /// mode).
    pub(crate) session: Option<crate::session::Sessions>,
}

/// The longest first pause of a waiter that has just queued (see
/// [`Attempt::Busy::just_queued`]).
const JUST_QUEUED_PAUSE: Duration = Duration::from_millis(10);

/// A backoff round past every growth: its delay is the longest the backoff takes
/// (`Backoff::delay` stops growing at round 32).
const LONGEST_ROUND: u32 = u32::MAX;

/// A lock backend on a SQL database (SQLite, MariaDB/MySQL, PostgreSQL).
///
/// Leases are judged on the database's clock. Waiters poll with the configured
/// [`Backoff`] (equal jitter by default), never past their deadline; on PostgreSQL
/// they are also woken by `LISTEN/NOTIFY` when a lock is released, with polling as the
/// safety net; on MariaDB/MySQL a waiter for an exclusive lock blocks instead on the
/// bell of the waiter just ahead of it (or the holder's), a named lock let go when
/// that one gives up or releases ([`crate::JdbcOptions::wake_sessions`]). Waiters
/// queue in a table (see the crate docs): fair mode grants in arrival order,
/// non-fair mode lets newcomers pass a waiter only until it starves, and new readers
/// stand back for a queued writer.
///
/// Cheap to clone.
#[derive(Clone)]
pub struct JdbcBackend {
    pub(crate) inner: Arc<Inner>,
}

/// The longest holder identity a MySQL semaphore takes: its entries are read back
/// as `VARCHAR(255)`, as the `owner` columns are.
const MAX_MYSQL_HOLDER_LEN: usize = 255;

/// How many times one permit attempt runs again after a concurrent grant changed
/// the semaphore while it ran (PostgreSQL), before it counts as refused.
const PERMIT_RACES: u32 = 8;

/// How many attempts of one acquire may lose a transaction conflict in their queue
/// or contention statements before the conflict is the caller's error.
const MAX_CONFLICTED_ATTEMPTS: u32 = 5;

/// What a refused attempt says about when to look again.
struct Turn {
    /// Whose bell to wait on: the live waiter just ahead, else the live holder.
    target: Option<String>,
    /// Until the holder's lease ends, when it is known.
    retry_after: Option<Duration>,
    /// The pause polling would take (already [`Turn::look_by`]).
    delay: Duration,
}

impl Turn {
    /// `wait`, cut so the waiter looks again no later than the holder's lease end (a
    /// crashed holder's lock is taken as soon as the database says its lease
    /// ended) and a third of its queue `liveness` (it stays queued). Bounds the
    /// polling pause and the bell wait alike.
    fn look_by(retry_after: Option<Duration>, wait: Duration, liveness: Duration) -> Duration {
        let wait = wait.min(liveness / 3);
        retry_after.map_or(wait, |r| wait.min(r + Duration::from_millis(1)))
    }
}

/// What the contention statement reads: the holder's stored key, its lease left
/// (ms), the readers' horizon left (ms), live waiters ahead, the waiter just ahead.
type ContentionRow = (Option<String>, i64, i64, i64, Option<String>);

/// A grant: its fencing token, and whether the granting statement also took the
/// waiter out of the queue (else the waiter leaves it with a statement of its own).
#[derive(Debug, Clone, Copy)]
struct Granted {
    token: i64,
    left_queue: bool,
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
    fn of_token(token: Option<i64>) -> Self {
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
    fn queue_untouched(token: i64) -> Self {
        Granted {
            token,
            left_queue: false,
        }
    }
}

enum Attempt {
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

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX).max(1)
}

/// The lease a statement stores, in the database clock's whole milliseconds: rounded
/// up, plus one tick. The clock truncates to the millisecond, so `NOW + lease` alone
/// could lapse up to a tick before the lease had passed since the request was sent;
/// one tick more and the store never lets a hold go early.
fn lease_ms(lease: Duration) -> i64 {
    let ms = lease.as_nanos().div_ceil(1_000_000);
    i64::try_from(ms).unwrap_or(i64::MAX - 1).max(1) + 1
}

/// The tick [`lease_ms`] adds: a store-side margin, not part of the holder's lease —
/// `inspect` reports a holder's remaining lease without it (else a hold inspected in
/// its first millisecond shows more than the lease it asked for).
const STORE_TICK: Duration = Duration::from_millis(1);

fn remaining(ms_left: i64) -> Option<Duration> {
    u64::try_from(ms_left)
        .ok()
        .filter(|m| *m > 0)
        .map(Duration::from_millis)
}

impl JdbcBackend {
    pub(crate) fn backend(&self) -> &'static str {
        self.inner.pool.dialect().name()
    }

    fn err(&self, op: &'static str) -> impl Fn(sqlx::Error) -> Error + '_ {
        move |e| map_sqlx(e, self.backend(), op)
    }

    /// Which dialect this backend speaks.
    pub fn dialect(&self) -> Dialect {
        self.inner.pool.dialect()
    }

    /// The connection pool this backend uses.
    pub fn sqlx_pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// Whether dlock's tables of this backend's prefix are in the database (its
    /// schema-version table; the session mode's holder table in that mode): a
    /// reader opened without migrations ([`crate::JdbcOptions::migrate`] off) learns
    /// that nothing was ever locked here, rather than a "no such table" error. One
    /// read of the catalog; writes nothing.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a read.
    pub async fn has_tables(&self) -> Result<bool> {
        let prefix = &self.inner.options.table_prefix;
        let table = if self.inner.session.is_some() {
            format!("{prefix}session_holds")
        } else {
            format!("{prefix}schema_version")
        };
        // The prefix is validated (identifier characters), the rest is ours.
        let sql = match self.dialect() {
            Dialect::Postgres => format!("SELECT to_regclass('{table}') IS NOT NULL"),
            Dialect::MySql => format!(
                "SELECT COUNT(*) > 0 FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = '{table}'"
            ),
            Dialect::Sqlite => format!(
                "SELECT COUNT(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = '{table}'"
            ),
        };
        let found: std::result::Result<bool, sqlx::Error> = on_pool!(&self.inner.pool, p => {
            match sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).fetch_one(p).await {
                Ok(row) => row.try_get::<bool, _>(0),
                Err(e) => Err(e),
            }
        });
        found.map_err(self.err("has_tables"))
    }

    /// Test hook: acquire statements sent so far by this backend.
    pub fn acquire_attempts(&self) -> u64 {
        self.inner.attempts.load(Ordering::Relaxed)
    }

    /// Test and diagnostics hook: how many waits on a MariaDB/MySQL bell ahead (a
    /// predecessor's or the holder's) ended with the bell taken — let go, or found
    /// free (see
    /// [`crate::JdbcOptions::wake_sessions`]); always 0 elsewhere.
    pub fn bells_taken(&self) -> u64 {
        self.inner.bells.as_ref().map_or(0, Bells::taken)
    }

    /// Closes the connection pool and the MariaDB/MySQL wake-up sessions, and stops
    /// PostgreSQL's release-notice listener (its session ends as its task is
    /// dropped); later calls fail with `Closed`.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before it returns, the pool is closed all the same (it
    /// refuses new calls at once) and its connections close as they come back.
    pub async fn close(&self) {
        if let Some(sessions) = &self.inner.session {
            sessions.close().await;
        }
        // The release-notice listener's session closes with its task.
        if let Some(task) = &self.inner.listener {
            task.abort();
        }
        if let Some(bells) = &self.inner.bells {
            bells.close();
        }
        self.inner.pool.close().await;
    }

    /// One attempt: the grant statement, then — refused — the waiter's place in the
    /// queue (when it is `waiting`) and what the lock is busy with. `slot`: the
    /// caller's place in the queue, if it may wait at all. `placed`: the caller
    /// paces its looks by its place in the queue (`ahead`, `predecessor`), so the
    /// contention statement reads it; otherwise a grant statement that read the
    /// lock's row itself (PostgreSQL) answers for it when it saw a live holder, and
    /// nothing more is read. (A refusal it saw no holder for — the queue's, the
    /// readers', or a grant after its snapshot — is read again, to name who has the
    /// lock now.)
    async fn attempt(
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

    /// Waits until a refused acquire looks at the lock again: on MariaDB/MySQL an
    /// exclusive waiter waits its turn on the bell ahead of it ([`crate::bell`]); every
    /// other waiter, and one the bell sends back to polling, pauses `turn.delay`.
    async fn wait_turn(
        &self,
        req: &AcquireRequest,
        bell: &mut crate::bell::Waiter,
        turn: Turn,
        wake: Option<&Subscription>,
    ) {
        if let Some(bells) = self
            .inner
            .bells
            .as_ref()
            .filter(|_| req.mode == LockMode::Exclusive)
        {
            // No longer than polling would ever wait, and as polling bounds it (the
            // holder's lease, the queue liveness), nor past the deadline.
            let options = &self.inner.options;
            let mut wait = Turn::look_by(
                turn.retry_after,
                options.backoff.longest(),
                options.waiter_liveness,
            );
            if let Some(deadline) = req.deadline {
                wait = wait.min(deadline.saturating_duration_since(Instant::now()));
            }
            let until = Instant::now() + wait;
            if bell
                .wait_turn(
                    bells,
                    req.name.as_str(),
                    req.holder().as_str(),
                    turn.target.as_deref(),
                    until,
                )
                .await
                == Next::Look
            {
                return;
            }
        }
        self.pause(turn.delay, wake).await;
    }

    /// Lets go the bell a lost hold kept, if any, in a task of its own.
    fn ring_bell(&self, name: &LockName, holder: HolderKey) {
        if self.inner.bells.is_some() {
            let (this, name) = (self.clone(), name.clone());
            tokio::spawn(async move {
                if let Some(bells) = &this.inner.bells {
                    bells.ring(name.as_str(), holder.as_str()).await;
                }
            });
        }
    }

    /// Waits for a PostgreSQL release notice or `delay`, whichever comes first.
    async fn pause(&self, delay: Duration, wake: Option<&Subscription>) {
        match wake {
            Some(sub) => {
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = sub.any.notified() => {}
                    _ = sub.own.notified() => {}
                }
            }
            None => tokio::time::sleep(delay).await,
        }
    }

    /// Runs a PostgreSQL `pg_notify` statement for `name` (best effort; `None`
    /// on MySQL): `notify` wakes waiters and observers, `notify_change` observers.
    /// On SQLite `notify` answers the payload of the notice, which goes out on the
    /// local bus ([`crate::local_bus`]).
    async fn notify(&self, stmt: Option<&Stmt>, name: &LockName) {
        let Some(stmt) = stmt else {
            return;
        };
        let name = [Param::Text(name.as_str())];
        if let Some(bus) = &self.inner.bus {
            let payload: std::result::Result<Option<String>, sqlx::Error> = on_pool!(&self.inner.pool, p => {
                match query!(stmt, &name).fetch_one(p).await {
                    Ok(row) => row.try_get(0),
                    Err(e) => Err(e),
                }
            });
            if let Ok(Some(payload)) = payload {
                bus.send(&payload);
            }
        } else if self.dialect() == Dialect::Postgres {
            let _ = on_pool!(&self.inner.pool, p => query!(stmt, &name).execute(p).await.map(drop));
        }
    }
}

#[async_trait]
impl LockRemoteResource for JdbcBackend {
    fn backend_name(&self) -> &'static str {
        self.backend()
    }

    fn capabilities(&self) -> Capabilities {
        if let Some(sessions) = &self.inner.session {
            return sessions.capabilities();
        }
        let mut caps = Capabilities::default();
        caps.fair = true;
        caps.lease = true;
        caps.renew = true;
        caps.reentrant = true;
        caps.shared = true;
        caps.cross_mode = true;
        caps.upgrade = true;
        caps.fencing = true;
        caps.semaphore = true;
        caps.max_name_len = Some(crate::MAX_NAME_LEN);
        caps
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<AcquireResult> {
        if let Some(sessions) = &self.inner.session {
            return sessions.try_acquire(req).await;
        }
        let backoff: Backoff = self.inner.options.backoff;
        // Subscribe before the first attempt, so a release between the attempt and
        // the wait is not missed.
        let subscription = match (&self.inner.wakeups, req.deadline) {
            (Some(w), Some(_)) => Some(w.subscribe(req.name.as_str(), req.holder().as_str())),
            _ => None,
        };
        // A waiter queues after its first refusal and leaves the queue when its
        // acquire ends, however it ends (a dropped one in a task of its own).
        let mut slot = req
            .deadline
            .is_some_and(|d| d > Instant::now())
            .then(|| QueueSlot::new(self, req));
        let liveness = self.inner.options.waiter_liveness;
        // Whether a release notice names this waiter when its turn comes: a plain
        // writer (an upgrade passes the queue, and nobody names it), subscribed.
        // A waiter first in line that leaves a free lock passes the notice on, and
        // a LISTEN connection back after an outage wakes every waiter; what is
        // still missed — a waiter ahead that crashed and lapsed, one that left
        // while the release naming it committed, a writer ahead whose release or
        // leave ran while this waiter's entry was being written (it skipped its
        // just-queued look for that writer) — costs it at most the backoff's
        // longest delay.
        let told = subscription.is_some()
            && req.mode == LockMode::Exclusive
            && req.alongside_holder().is_none();
        let mut round = 0u32;
        let mut last_ahead = i64::MAX;
        let mut conflicts = 0u32;
        let mut bell = crate::bell::Waiter::default();
        let mut last_holder = None;
        loop {
            let sent = Instant::now();
            let waiting = req.deadline.is_some_and(|d| d > sent);
            let attempt = match self
                .attempt(req, slot.as_mut(), waiting, waiting && !told)
                .await
            {
                // The grant statement runs itself again on a conflict; the queue and
                // contention statements are run again with the whole attempt.
                Err(e) if conflicts < MAX_CONFLICTED_ATTEMPTS && is_conflict(&e) => {
                    conflicts += 1;
                    tokio::time::sleep(conflict_pause(conflicts)).await;
                    continue;
                }
                other => other?,
            };
            match attempt {
                Attempt::Granted(Granted { token, left_queue }) => {
                    if let Some(slot) = slot.take() {
                        match (left_queue, req.mode) {
                            (true, _) => slot.left(),
                            // Off the hand-over's path: the release waits for it.
                            (false, LockMode::Exclusive) => slot.depart(),
                            (false, _) => slot.leave().await,
                        }
                    }
                    // The hold keeps its own bell, if it took one while it waited,
                    // and lets it go at its release: that wakes the waiter behind.
                    if let Some(bells) = &self.inner.bells {
                        bell.keep(
                            bells,
                            req.name.as_str(),
                            req.holder().as_str(),
                            sent + req.lease,
                        );
                    }
                    let token = u64::try_from(token).unwrap_or(0);
                    // Counted from the granting statement's send time: the database
                    // started the lease no earlier.
                    return Ok(AcquireResult::acquired(
                        FencingToken::new(token),
                        Some(sent + req.lease),
                    ));
                }
                Attempt::Busy {
                    holder,
                    holder_key,
                    retry_after,
                    ahead,
                    predecessor,
                    just_queued,
                } => {
                    let target = predecessor.or_else(|| holder_key.clone());
                    // A waiter that moves up to the head of the queue, or next but
                    // one, polls from the shortest delay again (a told writer pauses
                    // the longest from its second pause on, below): the lock is handed on
                    // soon after it frees, not when a long backoff comes round. So
                    // does the head on a bell line when the lock changes hands: a
                    // hold that took the lock past it (a newcomer, in non-fair mode)
                    // keeps no bell, so the head polls it, and it may end soon.
                    if (ahead < 2 && ahead < last_ahead)
                        || (ahead == 0 && bell.holds() && holder_key != last_holder)
                    {
                        round = 0;
                    }
                    last_ahead = ahead;
                    last_holder = holder_key;
                    // A queued writer on PostgreSQL is named in the release notice
                    // when its turn comes: it looks on its own (a notice lost, a
                    // waiter ahead lapsed) only as often as the backoff's longest
                    // delay; the rounds above are for the others.
                    let round_now = if told { LONGEST_ROUND } else { round };
                    let delay = req
                        .deadline
                        .and_then(|d| backoff.delay_within(round_now, d));
                    let Some(delay) = delay else {
                        if let Some(bells) = &self.inner.bells {
                            bell.leave(bells).await;
                        }
                        if let Some(slot) = slot.take() {
                            slot.leave().await;
                        }
                        return Ok(AcquireResult::not_acquired(holder, retry_after));
                    };
                    let delay = Turn::look_by(retry_after, delay, liveness);
                    // Just queued (a told writer: with no writer ahead): a release
                    // that ran meanwhile may not have seen the queue entry (PostgreSQL
                    // notifies queued waiters only), so the first pause is short
                    // whatever the backoff.
                    let delay = if just_queued {
                        delay.min(JUST_QUEUED_PAUSE)
                    } else {
                        delay
                    };
                    let turn = Turn {
                        target,
                        retry_after,
                        delay,
                    };
                    self.wait_turn(req, &mut bell, turn, subscription.as_ref())
                        .await;
                    round = round.saturating_add(1);
                }
            }
        }
    }

    async fn release(&self, req: &ReleaseRequest) -> Result<ReleaseResult> {
        if let Some(sessions) = &self.inner.session {
            return sessions.release(req).await;
        }
        let (this, req) = (self.clone(), req.clone());
        detached(statement_place(req.mode), async move {
            // The hold's queue row goes first: once the lock is free, the waiters
            // behind must not find it ahead of them.
            let holder = req.holder();
            let departures = &this.inner.departures;
            departures.ended(req.name.as_str(), holder.as_str()).await;
            let released = retry_conflicts(|| this.release_now(&req)).await;
            // After the commit, so the waiter it wakes finds the row free; before
            // the answer, so the caller's next acquire does not race the waiter
            // it woke (the ring's statement is bounded by the acquire timeout).
            if let Some(bells) = &this.inner.bells {
                bells.ring(req.name.as_str(), holder.as_str()).await;
            }
            released
        })
        .await
    }

    async fn renew(&self, req: &RenewRequest) -> Result<RenewResult> {
        if let Some(sessions) = &self.inner.session {
            return sessions.renew(req).await;
        }
        let (this, req) = (self.clone(), req.clone());
        detached(statement_place(req.mode), async move {
            retry_conflicts(|| this.renew_now(&req)).await
        })
        .await
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockState>> {
        if let Some(sessions) = &self.inner.session {
            return sessions.inspect(name).await;
        }
        self.inspect_now(name).await
    }

    fn admin(&self) -> Option<&dyn LockAdmin> {
        Some(self)
    }

    fn events(&self) -> Option<&dyn dlock_spi::LockEvents> {
        // PostgreSQL's LISTEN connection carries changes; elsewhere observers poll
        // (SQLite's local bus carries release notices only).
        self.change_feed()
            .map(|_| self as &dyn dlock_spi::LockEvents)
    }

    fn batch_renew(&self) -> Option<&dyn dlock_spi::BatchRenew> {
        None
    }
}

#[async_trait]
impl dlock_spi::LockEvents for JdbcBackend {
    /// Follows `name` through the backend's `LISTEN` connection: releases (and
    /// force-releases) notify the release channel, leadership grants and proclaims
    /// the change channel.
    async fn follow(&self, name: &LockName) -> Result<dlock_spi::ChangeFeed> {
        let wakeups = self.change_feed().ok_or_else(|| {
            Error::unsupported("only PostgreSQL pushes changes (LISTEN/NOTIFY); observers poll")
        })?;
        Ok(dlock_spi::ChangeFeed::new(
            wakeups.observe(name.as_str()),
            (),
        ))
    }
}

impl JdbcBackend {
    /// The wake-ups that carry changes to observers: PostgreSQL's `LISTEN`
    /// connection only (SQLite's local bus carries release notices alone).
    fn change_feed(&self) -> Option<&Arc<Wakeups>> {
        self.inner
            .wakeups
            .as_ref()
            .filter(|_| self.dialect() == Dialect::Postgres)
    }

    async fn release_now(&self, req: &ReleaseRequest) -> Result<ReleaseResult> {
        let s = &self.inner.statements;
        let name = Param::Text(req.name.as_str());
        let holder = req.holder();
        let owner = Param::Text(holder.as_str());
        // MySQL's permit release finds the holder's entry by a search pattern.
        let pattern = match (self.dialect(), req.mode) {
            (Dialect::MySql, LockMode::Permits(_)) => permits::search_pattern(holder.as_str()),
            _ => String::new(),
        };
        // SQLite: the release notice to send once the release committed.
        let mut notice: Option<String> = None;
        let released: std::result::Result<bool, sqlx::Error> = match req.mode {
            LockMode::Exclusive | LockMode::Permits(_) => on_pool!(&self.inner.pool, p => {
                let stmt = match (req.mode, req.purpose) {
                    (LockMode::Exclusive, HoldPurpose::Leadership) => &s.exclusive.release_announced,
                    (LockMode::Exclusive, HoldPurpose::Lock) => &s.exclusive.release,
                    _ => &s.permits.release,
                };
                // A statement binds the parameters it uses.
                let params = [name, owner, Param::Text(&pattern)];
                match self.dialect() {
                    // The statement notifies waiters and returns a row when it released.
                    Dialect::Postgres => query!(stmt, &params).fetch_optional(p).await.map(|r| r.is_some()),
                    // A row when it released, with the notice to send (NULL: none).
                    // All rows are read: the statement commits as it ends, and an
                    // error there is the release's.
                    Dialect::Sqlite => query!(stmt, &params).fetch_all(p).await.map(|rows| match rows.first() {
                        Some(row) => {
                            notice = row.try_get::<Option<String>, _>(0).ok().flatten();
                            true
                        }
                        None => false,
                    }),
                    Dialect::MySql => query!(stmt, &params).execute(p).await.map(|r| r.rows_affected() == 1),
                }
            }),
            LockMode::Shared => on_pool!(&self.inner.pool, p => {
                async {
                    let mut tx = p.begin().await?;
                    query!(&s.shared.lock_row, &[name]).execute(&mut *tx).await?;
                    let removed = query!(&s.shared.release_reader, &[name, owner]).execute(&mut *tx).await?.rows_affected();
                    query!(&s.shared.purge_readers, &[name]).execute(&mut *tx).await?;
                    query!(&s.shared.recompute, &[name]).execute(&mut *tx).await?;
                    if let (true, Some(stmt)) = (removed == 1, &s.notices.release) {
                        if self.dialect() == Dialect::Sqlite {
                            // No bus (notices off, or none beside this file): nobody to tell.
                            if self.inner.bus.is_some() {
                                notice = query!(stmt, &[name]).fetch_one(&mut *tx).await?.try_get(0)?;
                            }
                        } else {
                            query!(stmt, &[name]).execute(&mut *tx).await?;
                        }
                    }
                    tx.commit().await?;
                    Ok(removed == 1)
                }
                .await
            }),
        };
        let released = released.map_err(self.err("release"))?;
        if let (Some(bus), Some(notice)) = (&self.inner.bus, notice) {
            bus.send(&notice);
        }
        Ok(if released {
            ReleaseResult::Released
        } else {
            ReleaseResult::NotOwner
        })
    }

    async fn renew_now(&self, req: &RenewRequest) -> Result<RenewResult> {
        let s = &self.inner.statements;
        let holder = req.holder();
        let context = Param::Bytes(req.context.as_deref().unwrap_or_default());
        let context_hex = permits::context_hex(req.context.as_deref().unwrap_or_default());
        let exclusive = [
            Param::Text(req.name.as_str()),
            Param::Text(holder.as_str()),
            Param::Int(lease_ms(req.lease)),
            Param::Int(lease_ms(req.lease.saturating_sub(req.transition))),
            context,
        ];
        let shared = [exclusive[0], exclusive[1], exclusive[2], context];
        let permit = [
            exclusive[0],
            exclusive[1],
            exclusive[2],
            Param::Text(&context_hex),
        ];
        // The context is bound only by the statements that store it.
        let (renew_exclusive, renew_reader, renew_permits) = match req.context {
            Some(_) => (
                &s.exclusive.renew_context,
                &s.shared.renew_reader_context,
                &s.permits.renew_context,
            ),
            None => (&s.exclusive.renew, &s.shared.renew_reader, &s.permits.renew),
        };
        let sent = Instant::now();
        let renewed: std::result::Result<bool, sqlx::Error> = match req.mode {
            LockMode::Exclusive => on_pool!(&self.inner.pool, p => {
                query!(renew_exclusive, &exclusive).execute(p).await.map(|r| r.rows_affected() == 1)
            }),
            LockMode::Permits(_) => on_pool!(&self.inner.pool, p => {
                query!(renew_permits, &permit).execute(p).await.map(|r| r.rows_affected() == 1)
            }),
            // A reader's row and the horizon, which rises with its lease.
            LockMode::Shared => on_pool!(&self.inner.pool, p => {
                async {
                    let mut tx = p.begin().await?;
                    query!(&s.shared.renew_row, &shared).execute(&mut *tx).await?;
                    let n = query!(renew_reader, &shared).execute(&mut *tx).await?.rows_affected();
                    if n == 1 {
                        tx.commit().await?;
                    } else {
                        tx.rollback().await?;
                    }
                    Ok(n == 1)
                }
                .await
            }),
        };
        let renewed = renewed.map_err(self.err("renew"))?;
        if let Some(bells) = &self.inner.bells {
            if renewed {
                bells.renewed(req.name.as_str(), holder.as_str(), sent + req.lease);
            } else if req.mode == LockMode::Exclusive {
                // The hold is lost: its bell wakes whoever waits.
                self.ring_bell(&req.name, holder.clone());
            }
        }
        if renewed && req.context.is_some() {
            // A proclaimed value: observers re-read.
            self.notify(s.notices.change.as_ref(), &req.name).await;
        }
        Ok(if renewed {
            RenewResult::renewed(Some(sent + req.lease))
        } else {
            RenewResult::NotOwner
        })
    }

    async fn inspect_now(&self, name: &LockName) -> Result<Option<LockState>> {
        let s = &self.inner.statements;
        let p_name = [Param::Text(name.as_str())];
        let rows: std::result::Result<InspectRows, sqlx::Error> = on_pool!(&self.inner.pool, p => {
            async {
                let lock = match query!(&s.admin.inspect_lock, &p_name).fetch_optional(p).await? {
                    Some(r) => Some(((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, r.try_get(3)?), r.try_get(4)?, r.try_get(5)?)),
                    None => None,
                };
                let mut readers = Vec::new();
                for r in query!(&s.admin.inspect_readers, &p_name).fetch_all(p).await? {
                    readers.push(((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, r.try_get(3)?), r.try_get(4)?));
                }
                for r in query!(&s.permits.inspect, &p_name).fetch_all(p).await? {
                    let context: Option<String> = r.try_get(2)?;
                    let context = context.as_deref().and_then(permits::context_bytes);
                    readers.push(((r.try_get(0)?, r.try_get(1)?, context, r.try_get(3)?), r.try_get(4)?));
                }
                Ok((lock, readers))
            }
            .await
        });
        let (lock, readers) = rows.map_err(self.err("inspect"))?;
        let mut holders = Vec::new();
        let mut waiters = 0;
        if let Some(((owner, token, context, left), queued, ttl_left)) = lock {
            waiters = usize::try_from(queued).unwrap_or(0);
            if let (Some(owner), Some(left)) = (owner, remaining(left)) {
                // The holder's own lease: zero once in its transition window; unknown
                // on a row granted before the column existed.
                let ttl = ttl_left.map(|ms| remaining(ms).unwrap_or(Duration::ZERO));
                holders.push(
                    holder(
                        owner,
                        LockMode::Exclusive,
                        token,
                        context,
                        left.saturating_sub(STORE_TICK),
                    )
                    .with_remaining_ttl(ttl),
                );
            }
        }
        for ((owner, token, context, left), permits) in readers {
            if let (Some(owner), Some(left)) = (owner, remaining(left)) {
                let mode = match u32::try_from(permits) {
                    Ok(0) | Err(_) => LockMode::Shared,
                    Ok(n) => LockMode::Permits(n),
                };
                holders.push(holder(
                    owner,
                    mode,
                    token,
                    context,
                    left.saturating_sub(STORE_TICK),
                ));
            }
        }
        if holders.is_empty() && waiters == 0 {
            return Ok(None);
        }
        Ok(Some(LockState::new(holders, Some(waiters))))
    }

    async fn force_release_now(&self, name: &LockName) -> Result<usize> {
        let s = &self.inner.statements;
        let p_name = [Param::Text(name.as_str())];
        let removed: std::result::Result<u64, sqlx::Error> = on_pool!(&self.inner.pool, p => {
            async {
                let mut tx = p.begin().await?;
                let x = query!(&s.admin.force_exclusive, &p_name).execute(&mut *tx).await?.rows_affected();
                let permit_holders: i64 = query!(&s.permits.count_holders, &p_name).fetch_one(&mut *tx).await?.try_get(0)?;
                query!(&s.admin.force_clear, &p_name).execute(&mut *tx).await?;
                let r = query!(&s.admin.force_readers, &p_name).execute(&mut *tx).await?.rows_affected();
                tx.commit().await?;
                Ok(x + r + u64::try_from(permit_holders).unwrap_or(0))
            }
            .await
        });
        let removed = removed.map_err(self.err("force_release"))?;
        self.notify(s.notices.release.as_ref(), name).await;
        Ok(usize::try_from(removed).unwrap_or(usize::MAX))
    }
}

/// Runs `op` to its end, whatever happens to the caller's future ([`run_to_end`]),
/// where `place` says. Releases and renewals run transactions (shared mode): cut off
/// between `BEGIN` and `COMMIT`/`ROLLBACK` — a `BEGIN` whose future is dropped in
/// flight leaves sqlx nothing to roll back — the pooled connection would stay inside
/// the transaction, and a grant later run on that connection would be seen by its
/// own client only and undone when the connection dies, while another client takes
/// the same lock.
async fn detached<T: Send + 'static>(
    place: Where,
    op: impl std::future::Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    run_to_end(place, op, |_| async {}).await?
}

/// Where a statement of `mode` runs ([`run_to_end`]): a shared hold's grant, release
/// and renewal are transactions.
fn statement_place(mode: LockMode) -> Where {
    match mode {
        LockMode::Shared => Where::Apart,
        LockMode::Exclusive | LockMode::Permits(_) => Where::Here,
    }
}

fn holder(
    owner: String,
    mode: LockMode,
    token: i64,
    context: Option<Vec<u8>>,
    left: Duration,
) -> HolderInfo {
    HolderInfo::from_stored(
        &owner,
        mode,
        FencingToken::new(u64::try_from(token).unwrap_or(0)),
        context.unwrap_or_default().into(),
        Some(left),
    )
}

#[async_trait]
impl LockAdmin for JdbcBackend {
    async fn force_release(&self, name: &LockName) -> Result<usize> {
        if let Some(sessions) = &self.inner.session {
            return sessions.force_release(name).await;
        }
        // A transaction: run to completion whatever happens to the caller.
        let (this, name) = (self.clone(), name.clone());
        detached(
            Where::Apart,
            async move { this.force_release_now(&name).await },
        )
        .await
    }

    async fn live_locks(&self, prefix: &str) -> Result<usize> {
        if let Some(sessions) = &self.inner.session {
            return sessions.live_locks(prefix).await;
        }
        let s = &self.inner.statements;
        let count: std::result::Result<i64, sqlx::Error> = on_pool!(&self.inner.pool, p => {
            match query!(&s.admin.live_locks, &[Param::Text(prefix)]).fetch_one(p).await {
                Ok(r) => r.try_get(0),
                Err(e) => Err(e),
            }
        });
        Ok(usize::try_from(count.map_err(self.err("live_locks"))?).unwrap_or(0))
    }
}

impl std::fmt::Debug for JdbcBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JdbcBackend")
            .field("dialect", &self.dialect())
            .field("table_prefix", &self.inner.options.table_prefix)
            .finish()
    }
}
