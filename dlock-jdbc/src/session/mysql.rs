//! Session mode on MariaDB (`dlock_mode=session`, [`crate::JdbcMode::Session`]): a
//! hold is a named lock (`GET_LOCK`) on a connection dlock keeps for it.
//!
//! * **A hold is a connection.** A grant takes a connection from this backend's idle
//!   ones (or opens one) and keeps it until the release, which gives it back. The
//!   grant is one round trip: one prepared statement (`REPLACE … SELECT … WHERE
//!   GET_LOCK(…, 0) = 1 RETURNING token`; a wait: the `GET_LOCK` in a statement of
//!   its own before it, in one multi-statement query) that takes the named lock
//!   (`GET_LOCK`, the name a hash of the database, the table prefix and the lock's
//!   name: named locks are server-wide) and, only if it got it, draws the fencing
//!   token from a sequence (`NEXTVAL`), records the holder (owner, grant, token,
//!   context) in the session's own row of a `MEMORY` table (keyed by connection id,
//!   replaced in place) — no commit, no disk — and returns the token. The release
//!   lets the lock go (`RELEASE_LOCK`), one statement; it leaves the row, which names a holder only while its session holds the lock
//!   (rows that name none are deleted when a backend opens). A statement that
//!   fails, or is dropped before it answers, closes its connection: the session
//!   ends, and with it any lock it took. Values are bound, or (in the
//!   multi-statement queries) written in as hexadecimal literals (`X'…'`) and
//!   numbers this module formats: nothing a caller passes is SQL.
//! * **Waits block in the server**: `GET_LOCK(name, t)` waits up to `t` (MariaDB
//!   takes fractions of a second), in slices of at most [`SLICE`]. The server does
//!   not notice a client gone while a statement runs, so a dropped wait sends
//!   `KILL QUERY` to its session from a new connection (a task of its own); should
//!   that not reach the server, the session waits at most to the end of its slice.
//!   A lock such a session gets meanwhile it lets go at once (its answer finds no
//!   client, the session ends). Not fair: who of the waiters the server wakes is
//!   its choice.
//! * **Loss is the session's end.** A hold session's `wait_timeout` is the session
//!   timeout `K` (rounded up to whole seconds), set once when it is opened — a
//!   session idle in this backend's pool past `K` is found closed when next taken
//!   (pinged after half a second idle) and replaced: a client that vanishes (crashed,
//!   paused, cut off) has its session, and its locks, ended by the server within
//!   `K` of its last statement. The hold's feed asks the session for its connection
//!   id every `K/5` and declares the hold lost at `K/2` without an answer
//!   ([`super::hold`]). An operator's `KILL` or a server restart ends the session at
//!   once, with no margin: fencing tokens are the defence (SAFETY.md).
//! * **Fencing tokens** come from one `SEQUENCE` (MariaDB 10.3+; the mode needs 10.5+ for `REPLACE … RETURNING`): strictly
//!   increasing across clients and names; after a restart it resumes past its
//!   cached block (`next_not_cached_value`, stored when a block is taken), so it
//!   may skip values, never repeat one. MySQL has no sequences: the mode refuses
//!   it ([`ErrorKind::Config`]).
//! * **Behind a multiplexing proxy** a session is not the client's: each hold
//!   session sets a marker in a user variable and reads it back in a second
//!   statement; a different answer refuses the backend, and the feed's connection
//!   id check ends a hold whose statements reach another session.
//!
//! **Replication**: the grant runs `GET_LOCK` inside a `REPLACE` of a `MEMORY`
//! table; with `binlog_format = STATEMENT` a replica would replay it and keep the
//! named lock (no `RELEASE_LOCK` is replicated). `MIXED` (the default) and `ROW`
//! log the row instead.
//!
//! Not in this mode: leases, shared (read) locks — MariaDB's named locks are
//! exclusive only —, fair queues, semaphores (`Unsupported`). `inspect` counts as
//! waiters the sessions the server shows blocked in the lock's `GET_LOCK` (its
//! process list: this user's sessions, or every one with the `PROCESS` privilege).
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use dlock_spi::{
    AcquireRequest, AcquireResult, Capabilities, Error, ErrorKind, FencingToken, HolderInfo,
    LockMode, LockName, LockState, ReleaseRequest, ReleaseResult, RenewRequest, RenewResult,
    Result,
};
use sha2::{Digest, Sha256};
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlRow};
use sqlx::{ConnectOptions, Connection, Row};

use super::hold::{no_session_within, Holds, Idle, Session, SessionConn};
use crate::error::map_sqlx;

const BACKEND: &str = "mysql";

/// The longest single `GET_LOCK` wait: how long a dropped wait's session may still
/// wait in the server (it cannot tell its client is gone) — and take a lock that
/// comes free meanwhile, which it lets go when its answer finds no client.
const SLICE: Duration = Duration::from_secs(1);

/// How large the holders' `MEMORY` table may grow (MariaDB's default, 16 MiB, is
/// about 3 000 holds of rows sized for the longest names and contexts).
const HOLDERS_TABLE_BYTES: u64 = 256 << 20;

#[async_trait]
impl SessionConn for MySqlConnection {
    async fn server_id(&mut self) -> std::result::Result<u64, sqlx::Error> {
        sqlx::query_scalar("SELECT CONNECTION_ID()")
            .fetch_one(self)
            .await
    }
}

/// `bytes` as a MariaDB hexadecimal literal (`X'…'`), which any bytes may be.
fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(3 + 2 * bytes.len());
    out.push_str("X'");
    for b in bytes {
        // Writing to a String cannot fail.
        let _ = write!(out, "{b:02x}");
    }
    out.push('\'');
    out
}

/// A duration as seconds with milliseconds, for `GET_LOCK`.
fn seconds(d: Duration) -> String {
    format!("{}.{:03}", d.as_secs(), d.subsec_millis())
}

/// The try's grant statement (no wait) on the tables `holders` and `fence`: one
/// prepared statement with the lock key (twice), the holder, the name and the
/// context bound. It takes the named lock and, only if it got it, draws the token
/// and records the holder in the session's row, returning the token (no row: not
/// granted).
fn try_grant(holders: &str, fence: &str) -> String {
    format!(
        "REPLACE INTO {holders} (conn, lk, holder, name, token, context) \
           SELECT CONNECTION_ID(), ?, ?, ?, NEXTVAL({fence}), ? FROM DUAL \
           WHERE GET_LOCK(?, 0) = 1 RETURNING token"
    )
}

/// The session mode's state of one backend.
pub(crate) struct Sessions {
    connect: MySqlConnectOptions,
    /// What the named locks' names are hashed with: the database and the prefix.
    namespace: String,
    holders: String,
    fence: String,
    /// [`try_grant`]'s statement, built once (the statement cache keys on its text).
    try_grant: String,
    timeout: Duration,
    connect_timeout: Duration,
    idle: Idle<MySqlConnection>,
    holds: Holds<MySqlConnection, String>,
    /// Set once the holders' table is known to exist (new sessions sweep it).
    schema_ready: std::sync::atomic::AtomicBool,
}

impl Sessions {
    /// Opens the mode: checks that the server is MariaDB 10.5+ (sequences, `REPLACE … RETURNING`) and that
    /// a session is the client's own, creates its table and sequence (if `migrate`),
    /// and keeps that session for the first grant.
    pub(crate) async fn open(
        connect: MySqlConnectOptions,
        prefix: &str,
        timeout: Duration,
        connect_timeout: Duration,
        migrate: bool,
    ) -> Result<Self> {
        let namespace = format!("{}\0{prefix}", connect.get_database().unwrap_or(""));
        let (holders, fence) = (
            format!("{prefix}session_holds"),
            format!("{prefix}session_fence"),
        );
        let sessions = Sessions {
            connect,
            namespace,
            try_grant: try_grant(&holders, &fence),
            holders,
            fence,
            timeout,
            connect_timeout,
            idle: Idle::new(),
            holds: Holds::new(),
            schema_ready: std::sync::atomic::AtomicBool::new(false),
        };
        let mut first = sessions.session().await?;
        let version: String = sqlx::query_scalar("SELECT VERSION()")
            .fetch_one(&mut first.conn)
            .await
            .map_err(|e| map_sqlx(e, BACKEND, "connect"))?;
        if !supported(&version) {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "the session mode needs MariaDB 10.5 or later (its fencing tokens come from a SEQUENCE, drawn in a REPLACE … RETURNING), and the server is {version}; use the row mode (drop dlock_mode=session)"
                ),
            )
            .with_context("backend", BACKEND)
            .with_context("op", "connect"));
        }
        if migrate && !sessions.schema_exists(&mut first.conn).await? {
            let schema = format!(
                "SET SESSION max_heap_table_size = {HOLDERS_TABLE_BYTES}; \
                 CREATE TABLE IF NOT EXISTS {} (conn BIGINT UNSIGNED NOT NULL PRIMARY KEY, \
                   lk CHAR(44) CHARACTER SET ascii NOT NULL, holder VARBINARY(255) NOT NULL, \
                   name VARBINARY({}) NOT NULL, token BIGINT NOT NULL, context VARBINARY({}) NOT NULL) \
                   ENGINE=MEMORY; \
                 CREATE SEQUENCE IF NOT EXISTS {}; \
                 SET SESSION max_heap_table_size = @@GLOBAL.max_heap_table_size",
                sessions.holders,
                crate::MAX_NAME_LEN,
                dlock_spi::MAX_CONTEXT_LEN,
                sessions.fence
            );
            sqlx::raw_sql(sqlx::AssertSqlSafe(schema))
                .execute(&mut first.conn)
                .await
                .map_err(|e| map_sqlx(e, BACKEND, "migrate"))?;
        }
        // Housekeeping, best effort: a reader (`dlock status`: no migration, perhaps
        // no tables, perhaps `SELECT` only) opens all the same, and new sessions
        // then sweep nothing.
        match sessions.sweep(&mut first.conn).await {
            Ok(()) => sessions
                .schema_ready
                .store(true, std::sync::atomic::Ordering::SeqCst),
            Err(e) => tracing::debug!(error = %e, "dlock-jdbc: the holders' table was not swept"),
        }
        sessions.idle.put_back(first);
        Ok(sessions)
    }

    /// Deletes the rows of sessions that hold nothing now (ended, or released
    /// since): connection ids are not reused, so each closed hold session leaves
    /// its row, and the `MEMORY` table would fill (about 54 000 rows). Run when
    /// the backend opens and with each new hold session after that.
    async fn sweep(&self, conn: &mut MySqlConnection) -> Result<()> {
        let sweep = format!(
            "DELETE FROM {} WHERE IS_USED_LOCK(lk) IS NULL OR IS_USED_LOCK(lk) <> conn",
            self.holders
        );
        sqlx::raw_sql(sqlx::AssertSqlSafe(sweep))
            .execute(conn)
            .await
            .map_err(|e| map_sqlx(e, BACKEND, "connect"))?;
        Ok(())
    }

    /// Whether the holders' table and the sequence exist. Read from the catalog
    /// first, not left to `CREATE … IF NOT EXISTS`: that waits for an exclusive
    /// metadata lock even when the object exists, behind every running statement
    /// that uses it, and every later grant waits behind it.
    async fn schema_exists(&self, conn: &mut MySqlConnection) -> Result<bool> {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM information_schema.TABLES \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN (?, ?)",
        )
        .bind(&self.holders)
        .bind(&self.fence)
        .fetch_one(conn)
        .await
        .map_err(|e| map_sqlx(e, BACKEND, "migrate"))?;
        Ok(n == 2)
    }

    /// A new hold session, set up: a marker read back to refuse a multiplexing
    /// proxy, and the session's id.
    async fn session(&self) -> Result<Session<MySqlConnection>> {
        let opened = tokio::time::timeout(self.connect_timeout, async {
            let mut conn = self.connect.connect().await?;
            let marker = format!("{:016x}", fastrand::u64(..));
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "SET @dlock_session = '{marker}', SESSION wait_timeout = {}",
                self.wait_timeout()
            )))
            .execute(&mut conn)
            .await?;
            let (seen, id): (Option<String>, u64) =
                sqlx::query_as("SELECT CAST(@dlock_session AS CHAR), CONNECTION_ID()")
                    .fetch_one(&mut conn)
                    .await?;
            Ok::<_, sqlx::Error>((Session { conn, id }, seen.as_deref() == Some(&marker)))
        })
        .await;
        match opened {
            Ok(Ok((session, true))) => Ok(session),
            Ok(Ok((_, false))) => Err(Error::new(
                ErrorKind::Config,
                "the session mode needs a session of its own, and two statements on one connection reached different server sessions: a multiplexing proxy is in between; connect to MariaDB directly, or use the row mode (drop dlock_mode=session)",
            )
            .with_context("backend", BACKEND)
            .with_context("op", "connect")),
            Ok(Err(e)) => Err(map_sqlx(e, BACKEND, "connect")),
            Err(_) => Err(no_session_within("MariaDB", BACKEND, self.connect_timeout)),
        }
    }

    /// An idle hold session, or a new one (which sweeps the holders' table).
    async fn take_session(&self) -> Result<Session<MySqlConnection>> {
        if let Some(session) = self.idle.take(self.connect_timeout).await {
            return Ok(session);
        }
        let mut session = self.session().await?;
        if self.schema_ready.load(std::sync::atomic::Ordering::SeqCst) {
            self.sweep(&mut session.conn).await?;
        }
        Ok(session)
    }

    /// The named lock of `name`: `dlk:` and 40 hex digits of SHA-256 over the
    /// namespace, a zero byte and the name (at most 64 characters, as MySQL allows).
    fn lock_of(&self, name: &LockName) -> String {
        let mut hash = Sha256::new();
        hash.update(self.namespace.as_bytes());
        hash.update([0u8]);
        hash.update(name.as_str().as_bytes());
        let digest = hash.finalize();
        let mut lk = String::with_capacity(44);
        lk.push_str("dlk:");
        for b in &digest[..20] {
            let _ = write!(lk, "{b:02x}");
        }
        lk
    }

    /// The `wait_timeout` of a hold session: the session timeout in
    /// whole seconds, rounded up (the server may keep the session a little longer
    /// than the client's reckoning assumes, never shorter).
    fn wait_timeout(&self) -> u64 {
        let t = self.timeout;
        t.as_secs() + u64::from(t.subsec_nanos() > 0)
    }

    pub(crate) fn capabilities(&self) -> Capabilities {
        super::hold::capabilities(false)
    }

    /// The waiting grant: waits up to `wait` for the named lock, then (granted)
    /// draws the token and records the holder as [`try_grant`] does; the
    /// token is the last result's (none: not granted). The wait is a statement of
    /// its own: one that names the sequence keeps a metadata lock on it while it
    /// runs, and a DDL statement waiting for that lock (another client's
    /// `CREATE … IF NOT EXISTS`) holds up every later statement that names it —
    /// every grant — until the wait ends (seen: a grant 680 ms late while another
    /// client started).
    fn waiting_grant(&self, lk: &str, req: &AcquireRequest, wait: Duration) -> String {
        format!(
            "SET @dlock_t = GET_LOCK('{lk}', {wait}); \
             REPLACE INTO {h} (conn, lk, holder, name, token, context) \
               SELECT CONNECTION_ID(), '{lk}', {holder}, {name}, NEXTVAL({f}), {context} \
               FROM DUAL WHERE @dlock_t = 1 RETURNING token",
            wait = seconds(wait),
            h = self.holders,
            f = self.fence,
            holder = hex(req.holder().as_str().as_bytes()),
            name = hex(req.name.as_str().as_bytes()),
            context = hex(&req.context),
        )
    }

    /// # Cancel safety
    ///
    /// Cancel-safe: the session a dropped call used is closed with it; a grant it
    /// got ends with the session, and a wait in the server ends within [`SLICE`]
    /// (module docs).
    pub(crate) async fn try_acquire(&self, req: &AcquireRequest) -> Result<AcquireResult> {
        match req.mode {
            LockMode::Exclusive => {}
            LockMode::Shared => {
                return Err(Error::unsupported(
                    "MariaDB's named locks have no shared mode; use the row mode (drop dlock_mode=session) for read-write locks",
                ))
            }
            LockMode::Permits(_) => {
                return Err(Error::no_semaphores(BACKEND).with_context("mode", "session"));
            }
        }
        if req.alongside.is_some() {
            return Err(Error::unsupported(
                "the MariaDB session mode has no shared locks to hold beside a write; use the row mode",
            ));
        }
        let lk = self.lock_of(&req.name);
        let mut session = self.take_session().await?;
        let token = loop {
            let left = req
                .deadline
                .map(|d| d.saturating_duration_since(Instant::now()))
                .unwrap_or(Duration::ZERO);
            let wait = if left < Duration::from_millis(1) {
                Duration::ZERO
            } else {
                left.min(SLICE)
            };
            let mut stop = StopWait {
                connect: (!wait.is_zero()).then(|| (self.connect.clone(), self.connect_timeout)),
                id: session.id,
            };
            let rows: Vec<MySqlRow> = if wait.is_zero() {
                let holder = req.holder();
                sqlx::query(sqlx::AssertSqlSafe(self.try_grant.as_str()))
                    .bind(lk.as_str())
                    .bind(holder.as_str().as_bytes())
                    .bind(req.name.as_str().as_bytes())
                    .bind(&req.context[..])
                    .bind(lk.as_str())
                    .fetch_all(&mut session.conn)
                    .await
            } else {
                let statement = self.waiting_grant(&lk, req, wait);
                sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
                    .fetch_all(&mut session.conn)
                    .await
            }
            .map_err(|e| map_sqlx(e, BACKEND, "acquire"))?;
            stop.connect = None;
            let token = match rows.last() {
                Some(row) => Some(
                    row.try_get::<i64, _>("token")
                        .map_err(|e| map_sqlx(e, BACKEND, "acquire"))?,
                ),
                None => None,
            };
            if let Some(token) = token {
                break token;
            }
            if wait == left || wait.is_zero() {
                self.idle.put_back(session);
                return Ok(AcquireResult::not_acquired(None, None));
            }
        };
        let watch = self.holds.insert(
            req.holder().as_str(),
            session,
            lk,
            LockMode::Exclusive,
            self.timeout,
        );
        Ok(
            AcquireResult::acquired(FencingToken::new(u64::try_from(token).unwrap_or(0)), None)
                .with_watch(watch),
        )
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
        // The session's holder row stays: it names a holder only while its
        // session holds the named lock.
        let released: Option<i64> = sqlx::query_scalar("SELECT RELEASE_LOCK(?)")
            .bind(&held.key)
            .fetch_one(&mut conn)
            .await
            .map_err(|e| map_sqlx(e, BACKEND, "release"))?;
        if released == Some(1) {
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
            .renew(req, |mut conn, lk, context| async move {
                // The count read back, not the update's: a context written again
                // unchanged changes no row.
                let update = format!(
                    "UPDATE {h} SET context = {context} WHERE lk = '{lk}' AND holder = {holder}; \
                     SELECT count(*) AS n FROM {h} WHERE lk = '{lk}' AND holder = {holder} \
                       AND conn = CONNECTION_ID() AND IS_USED_LOCK('{lk}') = CONNECTION_ID()",
                    h = self.holders,
                    holder = hex(holder.as_str().as_bytes()),
                    context = hex(&context),
                );
                let rows: Vec<MySqlRow> = sqlx::raw_sql(sqlx::AssertSqlSafe(update))
                    .fetch_all(&mut conn)
                    .await
                    .map_err(|e| map_sqlx(e, BACKEND, "renew"))?;
                let n = match rows.last() {
                    Some(row) => row
                        .try_get::<i64, _>("n")
                        .map_err(|e| map_sqlx(e, BACKEND, "renew"))?,
                    None => 0,
                };
                Ok((conn, n == 1))
            })
            .await
    }

    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads, on a session it closes if dropped.
    pub(crate) async fn inspect(&self, name: &LockName) -> Result<Option<LockState>> {
        let lk = self.lock_of(name);
        let mut session = self.take_session().await?;
        // A row is a holder while its session holds the named lock.
        let query = format!(
            "SELECT holder, token, context FROM {} WHERE lk = ? AND name = ? \
               AND conn = IS_USED_LOCK(lk) ORDER BY token",
            self.holders
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(query))
            .bind(&lk)
            .bind(name.as_str().as_bytes())
            .fetch_all(&mut session.conn)
            .await
            .map_err(|e| map_sqlx(e, BACKEND, "inspect"))?;
        // Waiters are the sessions blocked in this lock's GET_LOCK (the statement's
        // text names it; this user's sessions, or every one with PROCESS).
        let waiters: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM information_schema.PROCESSLIST \
             WHERE STATE = 'User lock' AND LOCATE(?, INFO) > 0",
        )
        .bind(format!("GET_LOCK('{lk}'"))
        .fetch_one(&mut session.conn)
        .await
        .map_err(|e| map_sqlx(e, BACKEND, "inspect"))?;
        self.idle.put_back(session);
        let waiters = usize::try_from(waiters).unwrap_or(0);
        let mut holders = Vec::new();
        for row in &rows {
            let err = |e| map_sqlx(e, BACKEND, "inspect");
            let holder: Vec<u8> = row.try_get("holder").map_err(err)?;
            let token: i64 = row.try_get("token").map_err(err)?;
            let context: Vec<u8> = row.try_get("context").map_err(err)?;
            holders.push(HolderInfo::from_stored(
                &String::from_utf8_lossy(&holder),
                LockMode::Exclusive,
                FencingToken::new(u64::try_from(token).unwrap_or(0)),
                Bytes::from(context),
                None,
            ));
        }
        Ok((!holders.is_empty() || waiters > 0).then(|| LockState::new(holders, Some(waiters))))
    }

    /// Ends the session holding `name` (`KILL CONNECTION`): its hold is lost, with
    /// no notice to its client before its feed's next ask.
    pub(crate) async fn force_release(&self, name: &LockName) -> Result<usize> {
        let lk = self.lock_of(name);
        let mut session = self.take_session().await?;
        let holder: Option<u64> = sqlx::query_scalar("SELECT CAST(IS_USED_LOCK(?) AS UNSIGNED)")
            .bind(&lk)
            .fetch_one(&mut session.conn)
            .await
            .map_err(|e| map_sqlx(e, BACKEND, "force_release"))?;
        let ended = match holder {
            Some(id) => {
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!("KILL CONNECTION {id}")))
                    .execute(&mut session.conn)
                    .await
                    .map_err(|e| map_sqlx(e, BACKEND, "force_release"))?;
                1
            }
            None => 0,
        };
        self.idle.put_back(session);
        Ok(ended)
    }

    /// How many names under `prefix` a live session holds.
    pub(crate) async fn live_locks(&self, prefix: &str) -> Result<usize> {
        let query = format!(
            "SELECT count(DISTINCT lk) FROM {} WHERE LEFT(name, LENGTH(?)) = ? \
               AND conn = IS_USED_LOCK(lk)",
            self.holders
        );
        let mut session = self.take_session().await?;
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(query))
            .bind(prefix.as_bytes())
            .bind(prefix.as_bytes())
            .fetch_one(&mut session.conn)
            .await
            .map_err(|e| map_sqlx(e, BACKEND, "live_locks"))?;
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

/// Armed while a grant statement may block in `GET_LOCK`: dropped armed (the wait
/// was cancelled, or failed), it ends the session's statement with `KILL QUERY`
/// from a new connection, in a task of its own — the server does not notice a
/// client gone while a statement runs.
struct StopWait {
    /// The server's connect options and how long connecting may take; `None`:
    /// disarmed.
    connect: Option<(MySqlConnectOptions, Duration)>,
    /// The blocked session's connection id.
    id: u64,
}

impl Drop for StopWait {
    fn drop(&mut self) {
        let Some((connect, within)) = self.connect.take() else {
            return;
        };
        let id = self.id;
        let what = format_args!("session {id}'s cancelled GET_LOCK wait (its KILL QUERY)");
        dlock_spi::spawn_cleanup(&what, None, async move {
            // Best effort: the wait's slice bounds it anyway.
            let _ = tokio::time::timeout(within, async move {
                let mut conn = connect.connect().await?;
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!("KILL QUERY {id}")))
                    .execute(&mut conn)
                    .await?;
                conn.close().await
            })
            .await;
        });
    }
}

/// Whether a server of `version` (`SELECT VERSION()`) has what the mode's statements
/// use: sequences (MariaDB 10.3+) and `REPLACE … RETURNING` (10.5+).
fn supported(version: &str) -> bool {
    if !version.contains("MariaDB") {
        return false;
    }
    let mut parts = version.split(|c: char| !c.is_ascii_digit());
    let major: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let minor: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (major, minor) >= (10, 5)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_are_hex_and_seconds_keep_milliseconds() {
        assert_eq!(hex(b""), "X''");
        assert_eq!(hex(b"a'\\"), "X'61275c'");
        assert_eq!(seconds(Duration::from_millis(1_250)), "1.250");
        assert_eq!(seconds(Duration::ZERO), "0.000");
    }

    #[test]
    fn the_mode_needs_mariadb_10_5_on() {
        assert!(supported("10.11.19-MariaDB-0+deb12u1"));
        assert!(supported("10.5.27-MariaDB"));
        assert!(supported("11.4.2-MariaDB"));
        // Sequences, but no REPLACE … RETURNING (a syntax error at every grant).
        assert!(!supported("10.4.34-MariaDB"));
        assert!(!supported("10.3.39-MariaDB"));
        assert!(!supported("10.2.44-MariaDB"));
        assert!(!supported("8.0.36"));
    }
}
