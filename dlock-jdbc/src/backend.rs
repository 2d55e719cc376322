//! The SQL `LockRemoteResource`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_spi::{
    AcquireRequest, AcquireResult, Capabilities, Error, LockAdmin, LockName, LockRemoteResource,
    LockState, ReleaseRequest, ReleaseResult, RenewRequest, RenewResult, Result,
};
use sqlx::Row;

use crate::bell::Bells;
use crate::config::JdbcOptions;
use crate::departures::Departures;
use crate::dialect::Dialect;
use crate::error::{map_sqlx, retry_conflicts};
use crate::local_bus::LocalBus;
use crate::param::Param;
use crate::pool::{on_pool, query, Pool};
use crate::run_to_end::{detached, statement_place, Where};
use crate::statements::{Statements, Stmt};
use crate::wakeups::Wakeups;

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

/// A lock backend on a SQL database (SQLite, MariaDB/MySQL, PostgreSQL).
///
/// Leases are judged on the database's clock. Waiters poll with the configured
/// [`Backoff`](dlock_spi::Backoff) (equal jitter by default), never past their deadline; on PostgreSQL
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

pub(crate) fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX).max(1)
}

/// The lease a statement stores, in the database clock's whole milliseconds: rounded
/// up, plus one tick. The clock truncates to the millisecond, so `NOW + lease` alone
/// could lapse up to a tick before the lease had passed since the request was sent;
/// one tick more and the store never lets a hold go early.
pub(crate) fn lease_ms(lease: Duration) -> i64 {
    let ms = lease.as_nanos().div_ceil(1_000_000);
    i64::try_from(ms).unwrap_or(i64::MAX - 1).max(1) + 1
}

/// The tick [`lease_ms`] adds: a store-side margin, not part of the holder's lease —
/// `inspect` reports a holder's remaining lease without it (else a hold inspected in
/// its first millisecond shows more than the lease it asked for).
pub(crate) const STORE_TICK: Duration = Duration::from_millis(1);

pub(crate) fn remaining(ms_left: i64) -> Option<Duration> {
    u64::try_from(ms_left)
        .ok()
        .filter(|m| *m > 0)
        .map(Duration::from_millis)
}

impl JdbcBackend {
    pub(crate) fn backend(&self) -> &'static str {
        self.inner.pool.dialect().name()
    }

    pub(crate) fn err(&self, op: &'static str) -> impl Fn(sqlx::Error) -> Error + '_ {
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

    /// Runs a PostgreSQL `pg_notify` statement for `name` (best effort; `None`
    /// on MySQL): `notify` wakes waiters and observers, `notify_change` observers.
    /// On SQLite `notify` answers the payload of the notice, which goes out on the
    /// local bus ([`crate::local_bus`]).
    pub(crate) async fn notify(&self, stmt: Option<&Stmt>, name: &LockName) {
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
        self.acquire_rows(req).await
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
        // Session modes hold no lease to renew in a batch.
        match self.inner.session {
            Some(_) => None,
            None => Some(self),
        }
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
