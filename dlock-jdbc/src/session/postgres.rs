//! Session mode on PostgreSQL (`dlock_mode=session`, [`crate::JdbcMode::Session`]):
//! a hold is a session-level advisory lock on a connection dlock keeps for it.
//!
//! Why a mode of its own: the row mode commits a row per grant (durable, lease-based,
//! fit for poolers), and a commit is most of an uncontended cycle's time; the
//! advisory lock is granted in memory, in one round trip, and ends with its session.
//!
//! * **A hold is a connection.** A grant takes a connection from this backend's idle
//!   ones (or opens one) and keeps it until the release, which gives it back. The
//!   grant statement takes the advisory lock (`pg_try_advisory_lock[_shared]` on a
//!   64-bit key hashed from the table prefix and the name), draws the fencing token
//!   from a sequence and records the holder (owner, grant, token, context) in the
//!   session's own row of an unlogged table (keyed by backend pid, rewritten in
//!   place) — one statement, one round trip. The release lets the lock go, one
//!   statement again, and leaves the row: it names a holder only while its session
//!   holds the advisory lock. A statement that fails, or
//!   is dropped before it answers, closes its connection: the session ends, and with
//!   it any lock it took, so no advisory lock is left behind by a cancelled call.
//! * **Waits block in the server**: a waiting acquire that is refused once sets the
//!   session's `lock_timeout` to what is left of its wait and blocks in
//!   `pg_advisory_lock`, which the holder's release (or its session's end) wakes —
//!   no polling. Dropped mid-wait, its connection closes; the server sees that at
//!   its next check of the client (`client_connection_check_interval`, 1 s) or when
//!   the wait ends (its `lock_timeout`), and lets go of a lock granted meanwhile.
//! * **Loss is the session's end.** Each hold session has `idle_session_timeout` =
//!   the session timeout `K` (PostgreSQL 14+): a client that vanishes (crashed,
//!   paused, cut off) has its session, and its locks, ended by the server within `K`
//!   of the last statement it sent. The hold's feed asks the session for its pid
//!   every `K/5` (which also keeps it from idling out): late, the hold is suspended;
//!   unanswered until half of `K` after the last answered ask was sent, it is lost —
//!   before the server can have ended the session on its own (`K` after it received
//!   that ask). An operator's `pg_terminate_backend` or a server restart ends the
//!   session at once, with no margin: the next ask finds it gone, and until then
//!   fencing tokens are the defence (SAFETY.md).
//! * **Fencing tokens** come from one sequence: strictly increasing across clients
//!   and names; across a restart a sequence resumes past every value it handed out
//!   whose transaction committed (the grant's commit flushes it with the default
//!   `synchronous_commit`); it may skip values, never repeat one.
//! * **Behind a transaction pooler** a session is not the client's: each hold
//!   session sets a random marker and reads it back in a second statement, and
//!   when the backend opens, a second connection and the first take turns, six
//!   rounds, asking which server session answers: the second must never see the
//!   first's marker or pid, the first never lose them (a transaction pooler hands
//!   a new client the server session the last one left — PgBouncer's default,
//!   where the first check alone passed and a lock was granted — or, with other
//!   clients busy, the first's next statement reaches another session; one round
//!   missed that often). Either refuses the backend with an [`ErrorKind::Config`]
//!   error naming the pooler (tested behind a busy PgBouncer in transaction mode),
//!   and the feed's pid check ends a hold whose statements reach another session.
//!   A heuristic, not a proof: connect to the server or a session-pooling port.
//!
//! Not in this mode: leases (a hold lasts until released or its session ends),
//! fair queues, semaphores, a writer reading or upgrading (`Unsupported`).
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use dlock_spi::{
    AcquireRequest, AcquireResult, Capabilities, Error, ErrorKind, FencingToken, HolderInfo,
    LockMode, LockName, LockState, ReleaseRequest, ReleaseResult, RenewRequest, RenewResult,
    Result,
};
use sha2::{Digest, Sha256};
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection, Row};

use super::hold::{no_session_within, Holds, Idle, Session, SessionConn};
use crate::error::map_sqlx;

const BACKEND: &str = "postgres";

/// How often the server checks, during a statement, that the client is still there
/// (a dropped blocking wait ends within it).
const CLIENT_CHECK: &str = "1s";

/// The statements of one table prefix.
struct Statements {
    grant_exclusive: String,
    grant_shared: String,
    record: String,
    release_exclusive: String,
    release_shared: String,
    context: String,
    inspect: String,
    force: String,
    live: String,
    schema: String,
    /// The holders' table.
    holders: String,
}

impl Statements {
    fn new(prefix: &str) -> Self {
        // One row per hold session (its pid), rewritten in place by each grant
        // and left by the release: a row is a holder only while its session holds
        // the advisory lock (`pg_locks`). A row inserted and deleted per grant left
        // a dead tuple per cycle, and the grant's scan of the lock's dead index
        // entries grew until a vacuum: ~2 ms a grant after 9 000 cycles, against
        // 0.25 ms.
        let holders = format!("{prefix}session_holds");
        let fence = format!("{prefix}session_fence");
        let grant = |lock: &str, mode: &str| {
            format!(
                "WITH t AS MATERIALIZED (SELECT CASE WHEN {lock}($1) THEN nextval('{fence}') END AS token), \
                 idle AS MATERIALIZED (SELECT set_config('idle_session_timeout', \
                   CASE WHEN (SELECT token FROM t) IS NULL THEN '0' ELSE $5 END, false)), \
                 ins AS (INSERT INTO {holders} (pid, key, holder, name, mode, token, context) \
                   SELECT pg_backend_pid(), $1, $3, $2, '{mode}', token, $4 FROM t WHERE token IS NOT NULL \
                   ON CONFLICT (pid) DO UPDATE SET key = EXCLUDED.key, holder = EXCLUDED.holder, \
                   name = EXCLUDED.name, mode = EXCLUDED.mode, token = EXCLUDED.token, \
                   context = EXCLUDED.context) \
                 SELECT token FROM t, idle"
            )
        };
        let release = |unlock: &str| {
            format!("SELECT {unlock}($1), set_config('idle_session_timeout', '0', false)")
        };
        Statements {
            grant_exclusive: grant("pg_try_advisory_lock", "x"),
            grant_shared: grant("pg_try_advisory_lock_shared", "s"),
            // After a blocking wait granted the lock: the token, the holder row, and
            // the wait's `lock_timeout` reset — one statement.
            record: format!(
                "WITH t AS MATERIALIZED (SELECT nextval('{fence}') AS token), \
                 idle AS MATERIALIZED (SELECT set_config('idle_session_timeout', $6, false), \
                   set_config('lock_timeout', '0', false)), \
                 ins AS (INSERT INTO {holders} (pid, key, holder, name, mode, token, context) \
                   SELECT pg_backend_pid(), $1, $3, $2, $5, token, $4 FROM t \
                   ON CONFLICT (pid) DO UPDATE SET key = EXCLUDED.key, holder = EXCLUDED.holder, \
                   name = EXCLUDED.name, mode = EXCLUDED.mode, token = EXCLUDED.token, \
                   context = EXCLUDED.context) \
                 SELECT token FROM t, idle"
            ),
            release_exclusive: release("pg_advisory_unlock"),
            release_shared: release("pg_advisory_unlock_shared"),
            context: format!(
                "UPDATE {holders} SET context = $3 WHERE pid = pg_backend_pid() AND key = $1 AND holder = $2"
            ),
            // A row is a holder while its session holds the advisory lock; waiters
            // are the sessions waiting for it.
            inspect: format!(
                "SELECT h.holder, h.mode, h.token, h.context, \
                   (SELECT count(*) FROM pg_locks w WHERE w.locktype = 'advisory' AND NOT w.granted \
                     AND w.classid = $2 AND w.objid = $3 AND w.objsubid = 1) AS waiters \
                 FROM (SELECT 1) one LEFT JOIN {holders} h ON h.key = $1 AND h.name = $4 AND EXISTS ( \
                   SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted \
                     AND l.classid = $2 AND l.objid = $3 AND l.objsubid = 1 AND l.pid = h.pid) \
                 ORDER BY h.token"
            ),
            force: "SELECT count(pg_terminate_backend(l.pid)) FROM pg_locks l WHERE l.locktype = 'advisory' \
                   AND l.granted AND l.classid = $1 AND l.objid = $2 AND l.objsubid = 1"
                .to_owned(),
            live: format!(
                "SELECT count(DISTINCT h.key) FROM {holders} h WHERE substr(h.name, 1, length($1)) = $1 AND EXISTS ( \
                   SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.pid = h.pid \
                     AND l.objsubid = 1 AND l.classid = ((h.key >> 32) & 4294967295)::oid \
                     AND l.objid = (h.key & 4294967295)::oid)"
            ),
            holders: holders.clone(),
            schema: format!(
                "BEGIN; SELECT pg_advisory_xact_lock(7306086536305356147); \
                 CREATE UNLOGGED TABLE IF NOT EXISTS {holders} (pid INT PRIMARY KEY, key BIGINT NOT NULL, \
                   holder TEXT NOT NULL, name TEXT NOT NULL, mode CHAR(1) NOT NULL, token BIGINT NOT NULL, \
                   context BYTEA NOT NULL) WITH (fillfactor = 50); \
                 CREATE SEQUENCE IF NOT EXISTS {fence}; COMMIT"
            ),
        }
    }
}

/// The error of a pooler that shares server sessions among clients.
/// How many rounds [`Sessions::check_not_shared`] asks before it trusts the sessions
/// are the client's own.
const POOLER_ROUNDS: usize = 6;

/// Which server session answers `conn`'s next statement: the `dlock.session` marker it
/// has (if any) and its backend pid, in one simple-protocol statement (a prepared
/// statement's parse and run are two, which a transaction pooler may send to two
/// sessions).
async fn who_answers(
    conn: &mut PgConnection,
) -> std::result::Result<(Option<String>, i32), sqlx::Error> {
    let row = sqlx::raw_sql(
        "SELECT current_setting('dlock.session', true) AS seen, pg_backend_pid() AS pid",
    )
    .fetch_one(conn)
    .await?;
    Ok((row.try_get("seen")?, row.try_get("pid")?))
}

fn pooler() -> Error {
    Error::new(
        ErrorKind::Config,
        "the session mode needs a server session of its own, and its connections reached sessions other connections use: a transaction pooler (PgBouncer in transaction mode) is in between; connect to PostgreSQL directly or to a session-pooling port, or use the row mode (drop dlock_mode=session)",
    )
    .with_context("backend", BACKEND)
    .with_context("op", "connect")
}

/// The advisory-lock key of `name`: the first 8 bytes of SHA-256 over the table
/// prefix, a zero byte and the name (locks of other prefixes, and of applications
/// using small keys of their own, do not meet).
fn key_of(prefix: &str, name: &LockName) -> i64 {
    let mut hash = Sha256::new();
    hash.update(prefix.as_bytes());
    hash.update([0u8]);
    hash.update(name.as_str().as_bytes());
    let digest = hash.finalize();
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(bytes)
}

/// `pg_locks`' two 32-bit halves of a 64-bit advisory key (`classid`, `objid`).
fn halves(key: i64) -> (i64, i64) {
    let bits = key as u64;
    ((bits >> 32) as i64, (bits & 0xffff_ffff) as i64)
}

#[async_trait]
impl SessionConn for PgConnection {
    async fn server_id(&mut self) -> std::result::Result<u64, sqlx::Error> {
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(self)
            .await?;
        Ok(u64::try_from(pid).unwrap_or(0))
    }
}

/// The session mode's state of one backend.
pub(crate) struct Sessions {
    connect: PgConnectOptions,
    prefix: String,
    statements: Statements,
    timeout: Duration,
    connect_timeout: Duration,
    idle: Idle<PgConnection>,
    holds: Holds<PgConnection, i64>,
}

/// PostgreSQL's longest `lock_timeout` (an `int` of milliseconds); a longer wait
/// blocks without one (`0`).
const MAX_LOCK_TIMEOUT_MS: u128 = i32::MAX as u128;

impl Sessions {
    /// Opens the mode: checks that a session is the client's own (no transaction
    /// pooler between), creates its table and sequence (if `migrate`), and keeps
    /// that session for the first grant.
    pub(crate) async fn open(
        connect: PgConnectOptions,
        prefix: &str,
        timeout: Duration,
        connect_timeout: Duration,
        migrate: bool,
    ) -> Result<Self> {
        let sessions = Sessions {
            connect,
            prefix: prefix.to_owned(),
            statements: Statements::new(prefix),
            timeout,
            connect_timeout,
            idle: Idle::new(),
            holds: Holds::new(),
        };
        let (mut first, marker) = sessions.marked_session().await?;
        sessions.check_not_shared(&mut first, &marker).await?;
        if migrate {
            sqlx::raw_sql(sqlx::AssertSqlSafe(sessions.statements.schema.clone()))
                .execute(&mut first.conn)
                .await
                .map_err(|e| map_sqlx(e, BACKEND, "migrate"))?;
        }
        // The rows of sessions that are gone (pids are reused, so the table stays
        // as small as the server's sessions; this keeps it so between reuses).
        let sweep = format!(
            "DELETE FROM {} h WHERE NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = h.pid)",
            sessions.statements.holders
        );
        // Housekeeping, best effort: a reader (`dlock status`: no migration, perhaps
        // no tables, perhaps `SELECT` only) opens all the same.
        if let Err(e) = sqlx::raw_sql(sqlx::AssertSqlSafe(sweep))
            .execute(&mut first.conn)
            .await
        {
            tracing::debug!(error = %e, "dlock-jdbc: the holders' table was not swept");
        }
        sessions.idle.put_back(first);
        Ok(sessions)
    }

    /// Refuses a pooler that shares server sessions among its clients: for
    /// [`POOLER_ROUNDS`] rounds a second connection of ours and then the first ask
    /// which server session answers them (`pg_backend_pid()` and the first's
    /// `marker`, one simple-protocol statement each). Direct, or through a proxy or
    /// a session pooler, the answers never change: the first always in its own
    /// session (its pid, its marker), the second always in another. A transaction
    /// pooler hands each statement an idle server session: the second connection
    /// gets the one the first just left (PgBouncer's default reuses the last one
    /// freed), or, when other clients took it meanwhile, the first's next statement
    /// reaches another. One round missed it often with other clients busy on the
    /// pooler (a second connection reading the marker once let the backend open
    /// behind PgBouncer in CI), so it asks several, stopping at the first sign.
    /// Probabilistic still: a pooler that steers every statement just so can pass.
    async fn check_not_shared(
        &self,
        first: &mut Session<PgConnection>,
        marker: &str,
    ) -> Result<()> {
        let checked = tokio::time::timeout(self.connect_timeout, async {
            let mut other = self.connect.connect().await?;
            let mut shared = false;
            for _ in 0..POOLER_ROUNDS {
                let (seen, pid) = who_answers(&mut other).await?;
                let (own, own_pid) = who_answers(&mut first.conn).await?;
                shared = seen.as_deref() == Some(marker)
                    || pid == own_pid
                    || own.as_deref() != Some(marker)
                    || u64::try_from(own_pid).ok() != Some(first.id);
                if shared {
                    break;
                }
            }
            other.close().await?;
            Ok::<_, sqlx::Error>(shared)
        })
        .await;
        match checked {
            Ok(Ok(true)) => Err(pooler()),
            Ok(Ok(false)) => Ok(()),
            Ok(Err(e)) => Err(map_sqlx(e, BACKEND, "connect")),
            Err(_) => Err(no_session_within(
                "PostgreSQL",
                BACKEND,
                self.connect_timeout,
            )),
        }
    }

    /// A new hold session, set up: its idle timeout, the client check, and a
    /// marker read back to refuse a transaction pooler.
    async fn session(&self) -> Result<Session<PgConnection>> {
        self.marked_session().await.map(|(session, _)| session)
    }

    /// [`Self::session`] and the marker it set.
    async fn marked_session(&self) -> Result<(Session<PgConnection>, String)> {
        let opened = tokio::time::timeout(self.connect_timeout, async {
            let mut conn = self.connect.connect().await?;
            let marker = format!("{:016x}", fastrand::u64(..));
            let setup = format!(
                "SET client_connection_check_interval = '{CLIENT_CHECK}'; \
                 SELECT set_config('dlock.session', '{marker}', false)"
            );
            sqlx::raw_sql(sqlx::AssertSqlSafe(setup))
                .execute(&mut conn)
                .await?;
            let (seen, pid) = who_answers(&mut conn).await?;
            let id = u64::try_from(pid).unwrap_or(0);
            let ours = seen.as_deref() == Some(marker.as_str());
            Ok::<_, sqlx::Error>((Session { conn, id }, marker, ours))
        })
        .await;
        match opened {
            Ok(Ok((session, marker, true))) => Ok((session, marker)),
            Ok(Ok((_, _, false))) => Err(pooler()),
            Ok(Err(e)) => Err(map_sqlx(e, BACKEND, "connect")),
            Err(_) => Err(no_session_within(
                "PostgreSQL",
                BACKEND,
                self.connect_timeout,
            )),
        }
    }

    /// An idle hold session, or a new one.
    async fn take_session(&self) -> Result<Session<PgConnection>> {
        match self.idle.take(self.connect_timeout).await {
            Some(session) => Ok(session),
            None => self.session().await,
        }
    }

    /// The `idle_session_timeout` of a session that holds a lock.
    fn idle_timeout(&self) -> String {
        format!("{}ms", self.timeout.as_millis())
    }

    fn key(&self, name: &LockName) -> i64 {
        key_of(&self.prefix, name)
    }

    pub(crate) fn capabilities(&self) -> Capabilities {
        super::hold::capabilities(true)
    }

    /// # Cancel safety
    ///
    /// Cancel-safe: the session a dropped call used is closed with it (a grant it
    /// got ends with the session; a blocking wait ends at the server's next client
    /// check or its `lock_timeout`).
    pub(crate) async fn try_acquire(&self, req: &AcquireRequest) -> Result<AcquireResult> {
        let grant = match req.mode {
            LockMode::Exclusive => &self.statements.grant_exclusive,
            LockMode::Shared => &self.statements.grant_shared,
            LockMode::Permits(_) => {
                return Err(Error::no_semaphores(BACKEND).with_context("mode", "session"));
            }
        };
        if req.alongside.is_some() {
            return Err(Error::unsupported(
                "the PostgreSQL session mode cannot let one owner hold a lock in both modes; use separate read and write acquisitions, or the row mode",
            ));
        }
        let key = self.key(&req.name);
        let holder = req.holder();
        let mut session = self.take_session().await?;
        let token: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(grant.as_str()))
            .bind(key)
            .bind(req.name.as_str())
            .bind(holder.as_str())
            .bind(req.context.as_ref())
            .bind(self.idle_timeout())
            .fetch_one(&mut session.conn)
            .await
            .map_err(|e| map_sqlx(e, BACKEND, "acquire"))?;
        let token = match token {
            Some(token) => token,
            None => {
                let left = req
                    .deadline
                    .map(|d| d.saturating_duration_since(Instant::now()))
                    .filter(|left| *left >= Duration::from_millis(1));
                let Some(left) = left else {
                    self.idle.put_back(session);
                    return Ok(AcquireResult::not_acquired(None, None));
                };
                match self.wait(&mut session.conn, req, key, left).await? {
                    Some(token) => token,
                    None => {
                        self.idle.put_back(session);
                        return Ok(AcquireResult::not_acquired(None, None));
                    }
                }
            }
        };
        let watch = self
            .holds
            .insert(holder.as_str(), session, key, req.mode, self.timeout);
        Ok(
            AcquireResult::acquired(FencingToken::new(u64::try_from(token).unwrap_or(0)), None)
                .with_watch(watch),
        )
    }

    /// Blocks in the server for the lock, at most `left`: the token once granted,
    /// `None` when the wait ran out (the session stays usable).
    async fn wait(
        &self,
        conn: &mut PgConnection,
        req: &AcquireRequest,
        key: i64,
        left: Duration,
    ) -> Result<Option<i64>> {
        // The wait's `lock_timeout`, set in the waiting statement itself (the
        // materialized CTE runs first; the timer starts when the wait does).
        let lock = match req.mode {
            LockMode::Shared => {
                "WITH s AS MATERIALIZED (SELECT set_config('lock_timeout', $2, false)) \
                 SELECT pg_advisory_lock_shared($1) FROM s"
            }
            _ => {
                "WITH s AS MATERIALIZED (SELECT set_config('lock_timeout', $2, false)) \
                 SELECT pg_advisory_lock($1) FROM s"
            }
        };
        let ms = left.as_millis().max(1);
        let ms = if ms > MAX_LOCK_TIMEOUT_MS { 0 } else { ms };
        let waited = sqlx::query(lock)
            .bind(key)
            .bind(format!("{ms}ms"))
            .execute(&mut *conn)
            .await;
        match waited {
            Ok(_) => {}
            // 55P03 lock_not_available: the wait ran out (the session stays usable,
            // its `lock_timeout` put back). A lock granted just as the timeout
            // fired is kept by the session despite the error (PostgreSQL grants an
            // awaited lock in its error cleanup), so whatever it holds is let go:
            // it was taken idle, holding nothing of its own.
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("55P03") => {
                sqlx::raw_sql(
                    "SELECT pg_advisory_unlock_all(), set_config('lock_timeout', '0', false)",
                )
                .execute(&mut *conn)
                .await
                .map_err(|e| map_sqlx(e, BACKEND, "acquire"))?;
                return Ok(None);
            }
            Err(e) => return Err(map_sqlx(e, BACKEND, "acquire")),
        }
        let mode = if req.mode == LockMode::Shared {
            "s"
        } else {
            "x"
        };
        let token: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(self.statements.record.as_str()))
            .bind(key)
            .bind(req.name.as_str())
            .bind(req.holder().as_str())
            .bind(req.context.as_ref())
            .bind(mode)
            .bind(self.idle_timeout())
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| map_sqlx(e, BACKEND, "acquire"))?;
        Ok(Some(token))
    }

    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before the answer, the hold's session is closed, which
    /// ends the hold.
    pub(crate) async fn release(&self, req: &ReleaseRequest) -> Result<ReleaseResult> {
        let holder = req.holder();
        let Some(held) = self.holds.get(holder.as_str()) else {
            return Ok(ReleaseResult::NotOwner);
        };
        let mut slot = held.conn.lock().await;
        self.holds.remove(holder.as_str());
        // Taken out first: dropped mid-statement, the session closes with it.
        let Some(mut conn) = slot.take() else {
            return Ok(ReleaseResult::NotOwner);
        };
        let release = match held.mode {
            LockMode::Shared => &self.statements.release_shared,
            _ => &self.statements.release_exclusive,
        };
        let released: bool = sqlx::query_scalar(sqlx::AssertSqlSafe(release.as_str()))
            .bind(held.key)
            .fetch_one(&mut conn)
            .await
            .map_err(|e| map_sqlx(e, BACKEND, "release"))?;
        if released {
            self.idle.put_back(Session { conn, id: held.id });
            Ok(ReleaseResult::Released)
        } else {
            Ok(ReleaseResult::NotOwner)
        }
    }

    /// A session-bound hold needs no renewal; a new context (a leader proclaiming)
    /// is written on the hold's own session.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped mid-statement, the hold's session is closed, which ends
    /// the hold (its feed reports the loss).
    pub(crate) async fn renew(&self, req: &RenewRequest) -> Result<RenewResult> {
        let holder = req.holder();
        self.holds
            .renew(req, |mut conn, key, context| async move {
                let updated = sqlx::query(sqlx::AssertSqlSafe(self.statements.context.as_str()))
                    .bind(key)
                    .bind(holder.as_str())
                    .bind(context.as_ref())
                    .execute(&mut conn)
                    .await
                    .map_err(|e| map_sqlx(e, BACKEND, "renew"))?;
                Ok((conn, updated.rows_affected() == 1))
            })
            .await
    }

    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads, on a session it closes if dropped.
    pub(crate) async fn inspect(&self, name: &LockName) -> Result<Option<LockState>> {
        let key = self.key(name);
        let (classid, objid) = halves(key);
        let mut session = self.take_session().await?;
        let rows = sqlx::query(sqlx::AssertSqlSafe(self.statements.inspect.as_str()))
            .bind(key)
            .bind(classid)
            .bind(objid)
            .bind(name.as_str())
            .fetch_all(&mut session.conn)
            .await
            .map_err(|e| map_sqlx(e, BACKEND, "inspect"))?;
        self.idle.put_back(session);
        let mut holders = Vec::new();
        let mut waiters = 0usize;
        for row in &rows {
            let err = |e| map_sqlx(e, BACKEND, "inspect");
            waiters = usize::try_from(row.try_get::<i64, _>("waiters").map_err(err)?).unwrap_or(0);
            let Some(holder) = row.try_get::<Option<String>, _>("holder").map_err(err)? else {
                continue;
            };
            let mode: String = row.try_get("mode").map_err(err)?;
            let token: i64 = row.try_get("token").map_err(err)?;
            let context: Vec<u8> = row.try_get("context").map_err(err)?;
            holders.push(HolderInfo::from_stored(
                &holder,
                if mode == "s" {
                    LockMode::Shared
                } else {
                    LockMode::Exclusive
                },
                FencingToken::new(u64::try_from(token).unwrap_or(0)),
                Bytes::from(context),
                None,
            ));
        }
        Ok((!holders.is_empty() || waiters > 0).then(|| LockState::new(holders, Some(waiters))))
    }

    /// Ends the sessions holding `name` (`pg_terminate_backend`): their holds are
    /// lost, with no notice to their clients before their feeds' next ask.
    pub(crate) async fn force_release(&self, name: &LockName) -> Result<usize> {
        let (classid, objid) = halves(self.key(name));
        let query = sqlx::query_scalar(sqlx::AssertSqlSafe(self.statements.force.as_str()))
            .bind(classid)
            .bind(objid);
        self.count(query, "force_release").await
    }

    /// How many names under `prefix` a live session holds.
    pub(crate) async fn live_locks(&self, prefix: &str) -> Result<usize> {
        let query =
            sqlx::query_scalar(sqlx::AssertSqlSafe(self.statements.live.as_str())).bind(prefix);
        self.count(query, "live_locks").await
    }

    /// Runs a counting `query` on an idle session.
    async fn count(
        &self,
        query: sqlx::query::QueryScalar<'_, sqlx::Postgres, i64, sqlx::postgres::PgArguments>,
        op: &'static str,
    ) -> Result<usize> {
        let mut session = self.take_session().await?;
        let n = query
            .fetch_one(&mut session.conn)
            .await
            .map_err(|e| map_sqlx(e, BACKEND, op))?;
        self.idle.put_back(session);
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// Closes the idle sessions (holds keep theirs until released).
    pub(crate) async fn close(&self) {
        for session in self.idle.drain() {
            let _ = session.conn.close().await;
        }
    }
}
