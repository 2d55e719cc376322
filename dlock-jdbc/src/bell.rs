//! MariaDB/MySQL: a line of named locks (`GET_LOCK`) — *bells* — in the order of a
//! lock's queue, on which waiting acquires block inside the server, so a release
//! hands the lock on at once instead of when a waiter's next poll comes round (a
//! CLH queue of named locks).
//!
//! The lock's row stays the lock: its lease, its fencing token and its queue decide
//! every grant. A bell only decides *when* a waiter looks at the row again, so
//! nothing here can grant a lock twice; a bell that is lost, stale or shared by two
//! keys (its name is a hash) costs waiting time, never safety.
//!
//! How it goes:
//!
//! * Every waiter has a bell of its own, named after the lock and its key — the key
//!   the lock's row stores as owner once it is granted, and its queue entry's.
//! * A refused exclusive acquire that will wait takes its own bell on a session of
//!   its own, and blocks on the bell of the live waiter queued just ahead of it
//!   (the contention read names it), or, first in the queue, on the live holder's:
//!   `GET_LOCK(bell, t)` instead of sleeping its backoff. `t` is at most the longest
//!   delay of its backoff, a third of its queue liveness, the holder's lease end
//!   and its deadline: a bell held by a session whose process stopped, or by a hold
//!   that was lost, holds no waiter longer than polling would.
//! * Once it has the bell ahead it lets it go at once (in the statement that took
//!   it) and looks at the row. Granted, the hold keeps its own bell (its session)
//!   and lets it go — `RELEASE_LOCK` — right after its release committed, which
//!   wakes the waiter behind it: the hand-over. A waiter that gives up lets its
//!   bell go too, which wakes the one behind it to block on the bell of its new
//!   predecessor. So each bell has at most one waiter, and the line follows the
//!   queue.
//! * A bell taken with the same one still ahead was free with nobody letting it go
//!   (a holder granted without waiting keeps none: the lock was free, or a newcomer
//!   barged in non-fair mode; or the waiter ahead has not taken its own yet): the
//!   next turn polls instead of waiting on it, the one after waits again.
//! * Sessions are a few dedicated connections per backend
//!   ([`crate::JdbcOptions::wake_sessions`]); a waiter that finds none free polls,
//!   as every waiter did before bells, and so does one whose bell wait fails, is
//!   answered long before its timeout, or has less than a whole second to wait on
//!   MySQL (which rounds `GET_LOCK`'s timeout to whole seconds; MariaDB does not).
//!   A session dropped while it holds a bell or while its statement runs
//!   (a cancelled acquire) is closed, not reused: the server lets its bells go with
//!   the session.
//! * A bell kept past its hold's lease end (a hold lost and not yet released, a
//!   guard leaked) is let go by the next wait or keep of this backend.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};
use sqlx::{ConnectOptions, Connection, Row};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::wakeups::Next;

/// The bells of one backend: its wake-up sessions, and the bells its holds keep.
pub(crate) struct Bells {
    options: MySqlConnectOptions,
    /// What bell names are hashed in besides the lock's name: the database and the
    /// table prefix (named locks are server-wide).
    namespace: String,
    /// The bound on connecting, and on a statement beyond its own wait.
    timeout: Duration,
    /// One permit per session that may exist.
    sessions: Arc<Semaphore>,
    /// Sessions holding nothing, ready for the next waiter.
    idle: Arc<Mutex<Vec<MySqlConnection>>>,
    /// The bells kept by holds of this process, by lock name and holder key.
    kept: Mutex<HashMap<(String, String), Kept>>,
    /// Waits that ended with the bell taken.
    taken: AtomicU64,
    /// How the server reads `GET_LOCK`'s timeout: [`UNKNOWN`], [`FRACTIONAL`]
    /// (MariaDB) or [`WHOLE_SECONDS`] (MySQL rounds it to whole seconds).
    timeouts: AtomicU8,
    /// When connecting a session last failed: none is tried again for a while.
    connect_failed: Mutex<Option<Instant>>,
}

/// `GET_LOCK`'s timeout reading, not known until a session has connected.
const UNKNOWN: u8 = 0;
/// The server takes fractional seconds (MariaDB).
const FRACTIONAL: u8 = 1;
/// The server rounds the timeout to whole seconds (MySQL).
const WHOLE_SECONDS: u8 = 2;

/// A hold's bell: its session, and when the hold's lease ends as last known.
struct Kept {
    session: Session,
    lease_end: Instant,
}

/// A wake-up session, checked out by one waiter or kept by one hold.
struct Session {
    conn: Option<MySqlConnection>,
    /// Its place among the backend's sessions; closed with the backend.
    permit: OwnedSemaphorePermit,
    idle: Arc<Mutex<Vec<MySqlConnection>>>,
    /// The bell the session holds, if any.
    bell: Option<String>,
    /// `false` while a statement runs or after one failed: such a session is
    /// closed on drop, never reused.
    clean: bool,
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            if self.clean && self.bell.is_none() && !self.permit.semaphore().is_closed() {
                self.idle
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(conn);
            }
            // Otherwise (or once the backend is closed) `conn` is dropped here: the
            // socket closes, and the server ends the session and lets its bell go.
        }
    }
}

impl Session {
    /// Lets the session's bell go, waking the next waiter in its line; the session
    /// goes back to the idle ones, or is closed if the statement fails or takes
    /// longer than `timeout` (which lets the bell go too).
    async fn let_go(mut self, timeout: Duration) {
        let (Some(conn), Some(bell)) = (self.conn.as_mut(), self.bell.as_deref()) else {
            return;
        };
        self.clean = false;
        let statement = sqlx::query("DO RELEASE_LOCK(?)").bind(bell).execute(conn);
        match tokio::time::timeout(timeout, statement).await {
            Ok(Ok(_)) => {
                self.bell = None;
                self.clean = true;
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "dlock-jdbc: letting a bell go failed; its session is closed, which lets it go");
            }
            Err(_) => {
                tracing::debug!("dlock-jdbc: letting a bell go took too long; its session is closed, which lets it go");
            }
        }
    }
}

/// How a wait on the bell ahead ended.
enum BellWait {
    /// It was let go (and this session let it go in turn): look at the lock.
    Taken,
    /// Nobody let it go in time.
    TimedOut,
    /// No wait: less than a whole second was left (MySQL), or the server answered
    /// "not taken" well before the wait was up. The waiter polls, and keeps its
    /// session and its own bell.
    Skipped,
    /// No own bell, or a statement failed or took too long: the session is given
    /// up (closed if it may hold a bell).
    Unavailable,
}

/// The bell of `name`: a hash of `namespace` and the name, so any name fits
/// MySQL's 64 characters. FNV-1a, which every dlock build computes alike (a hash
/// that differed between builds would only cost wake-ups).
fn bell_name(namespace: &str, name: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in namespace.bytes().chain([0]).chain(name.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("dlock-bell:{hash:016x}")
}

impl Bells {
    /// Bells for a backend whose pool connects with `options` to tables named with
    /// `prefix`; at most `sessions` wake-up sessions (connected when first needed),
    /// connecting and each statement bounded by `timeout` (beyond its own wait).
    pub(crate) fn new(
        options: MySqlConnectOptions,
        prefix: &str,
        sessions: u32,
        timeout: Duration,
    ) -> Self {
        let namespace = format!("{}\0{prefix}", options.get_database().unwrap_or_default());
        Bells {
            // The bells' statements are not the application's: they log nothing.
            options: options.disable_statement_logging(),
            namespace,
            timeout,
            sessions: Arc::new(Semaphore::new(
                usize::try_from(sessions)
                    .unwrap_or(usize::MAX)
                    .min(Semaphore::MAX_PERMITS),
            )),
            idle: Arc::new(Mutex::new(Vec::new())),
            kept: Mutex::new(HashMap::new()),
            taken: AtomicU64::new(0),
            timeouts: AtomicU8::new(UNKNOWN),
            connect_failed: Mutex::new(None),
        }
    }

    /// A free session, connected if need be; `None` when all are in use, or
    /// connecting fails or takes longer than the bound (the waiter polls; no
    /// session is connected again for that bound, so a server short of
    /// connections is not asked for one every round).
    async fn session(&self) -> Option<Session> {
        let permit = Arc::clone(&self.sessions).try_acquire_owned().ok()?;
        let pooled = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let conn = match pooled {
            Some(conn) => conn,
            None => self.connect().await?,
        };
        Some(Session {
            conn: Some(conn),
            permit,
            idle: Arc::clone(&self.idle),
            bell: None,
            clean: true,
        })
    }

    /// A new session (see [`Bells::session`]); the first one also learns how the
    /// server reads `GET_LOCK`'s timeout.
    async fn connect(&self) -> Option<MySqlConnection> {
        let failed = *self
            .connect_failed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if failed.is_some_and(|at| at.elapsed() < self.timeout) {
            return None;
        }
        let connected = tokio::time::timeout(self.timeout, async {
            let mut conn = MySqlConnection::connect_with(&self.options).await?;
            if self.timeouts.load(Ordering::Relaxed) == UNKNOWN {
                let (version,): (String,) = sqlx::query_as("SELECT VERSION()")
                    .fetch_one(&mut conn)
                    .await?;
                let reading = if version.to_ascii_lowercase().contains("mariadb") {
                    FRACTIONAL
                } else {
                    WHOLE_SECONDS
                };
                self.timeouts.store(reading, Ordering::Relaxed);
            }
            Ok::<_, sqlx::Error>(conn)
        })
        .await;
        let error = match connected {
            Ok(Ok(conn)) => return Some(conn),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {:?}", self.timeout),
        };
        tracing::debug!(error = %error, "dlock-jdbc: a wake-up session did not connect; waiters poll");
        *self
            .connect_failed
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        None
    }

    /// On `session`, takes this waiter's own bell `own` if it does not hold it yet
    /// (free: nobody else waits under this waiter's key), then blocks on the bell
    /// `target` until `until` at the latest and lets it go at once — the waiter
    /// behind this one blocks on `own`, never on `target`.
    async fn wait_on(
        &self,
        session: &mut Session,
        own: String,
        target: String,
        until: Instant,
    ) -> BellWait {
        let wait = self.wait_left(until);
        if wait.is_zero() {
            return BellWait::Skipped;
        }
        let Some(conn) = session.conn.as_mut() else {
            return BellWait::Unavailable;
        };
        session.clean = false;
        if session.bell.is_none() {
            let statement = sqlx::query("SELECT GET_LOCK(?, 0)")
                .bind(&own)
                .fetch_one(&mut *conn);
            match tokio::time::timeout(self.timeout, statement).await {
                Ok(Ok(row)) => match row.try_get::<Option<i64>, _>(0) {
                    Ok(Some(1)) => session.bell = Some(own),
                    // Someone else has it (a hash shared with another key): the
                    // session is clean, and goes back to the idle ones.
                    _ => {
                        session.clean = true;
                        return BellWait::Unavailable;
                    }
                },
                _ => return BellWait::Unavailable,
            }
        }
        // Taken, the bell is let go in the same statement (`IF` evaluates only the
        // branch it picks): 1 then, 0 when the wait timed out.
        let statement = sqlx::query("SELECT IF(GET_LOCK(?, ?) = 1, RELEASE_LOCK(?), 0)")
            .bind(&target)
            .bind(wait.as_secs_f64())
            .bind(&target)
            .fetch_one(&mut *conn);
        let started = Instant::now();
        let answer = match tokio::time::timeout(wait + self.timeout, statement).await {
            Ok(answer) => answer.and_then(|row| row.try_get::<Option<i64>, _>(0)),
            Err(_) => return BellWait::Unavailable,
        };
        match answer {
            Ok(Some(1)) => {
                self.taken.fetch_add(1, Ordering::Relaxed);
                session.clean = true;
                BellWait::Taken
            }
            Ok(_) => {
                session.clean = true;
                // "Not taken" long before the timeout (a server that read it
                // otherwise, a killed statement): not a wait — the waiter pauses
                // rather than looking again at once, round after round.
                if started.elapsed() < wait / 2 {
                    BellWait::Skipped
                } else {
                    BellWait::TimedOut
                }
            }
            Err(_) => BellWait::Unavailable,
        }
    }

    /// How long a wait on a bell may last to stay within `until`: what is left;
    /// MySQL rounds `GET_LOCK`'s timeout to whole seconds, so there the whole
    /// seconds left, and zero (no wait: the waiter polls) under one.
    fn wait_left(&self, until: Instant) -> Duration {
        let wait = until.saturating_duration_since(Instant::now());
        if self.timeouts.load(Ordering::Relaxed) == FRACTIONAL {
            wait
        } else {
            Duration::from_secs(wait.as_secs())
        }
    }

    /// Lets go the kept bells whose holds' leases have ended.
    fn let_go_stale(&self) {
        let now = Instant::now();
        let stale: Vec<Session> = {
            let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
            if kept.values().all(|k| k.lease_end >= now) {
                return;
            }
            let keys: Vec<(String, String)> = kept
                .iter()
                .filter(|(_, k)| k.lease_end < now)
                .map(|(key, _)| key.clone())
                .collect();
            keys.iter()
                .filter_map(|key| kept.remove(key))
                .map(|k| k.session)
                .collect()
        };
        let timeout = self.timeout;
        tokio::spawn(async move {
            for session in stale {
                session.let_go(timeout).await;
            }
        });
    }

    /// The hold `holder` of `name` was renewed until `lease_end`.
    pub(crate) fn renewed(&self, name: &str, holder: &str, lease_end: Instant) {
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        // (Most renewals are of holds that kept no bell: no key is built for them.)
        if kept.is_empty() {
            return;
        }
        if let Some(k) = kept.get_mut(&(name.to_owned(), holder.to_owned())) {
            k.lease_end = lease_end;
        }
    }

    /// Lets go the bell the hold `holder` of `name` kept, if it kept one: called
    /// after its release committed (so the waiter it wakes finds the row free), or
    /// once the hold is known lost.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped, the session is closed, which lets the bell go.
    pub(crate) async fn ring(&self, name: &str, holder: &str) {
        let kept = {
            let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
            if kept.is_empty() {
                None
            } else {
                kept.remove(&(name.to_owned(), holder.to_owned()))
            }
        };
        if let Some(k) = kept {
            k.session.let_go(self.timeout).await;
        }
    }

    /// Closes every session: idle ones, and those holds keep (the server lets
    /// their bells go); sessions in use now are closed when they end, and no new
    /// one is opened.
    pub(crate) fn close(&self) {
        self.sessions.close();
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        self.kept
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// How many waits on a bell ended with the bell taken.
    pub(crate) fn taken(&self) -> u64 {
        self.taken.load(Ordering::Relaxed)
    }
}

/// One waiting acquire's part in its lock's line of bells.
#[derive(Default)]
pub(crate) struct Waiter {
    /// The session holding this waiter's own bell.
    session: Option<Session>,
    /// The bell last taken at once (a holder without a bell): poll then.
    last_target: Option<String>,
}

impl Waiter {
    /// Whether the waiter holds its own bell.
    pub(crate) fn holds(&self) -> bool {
        self.session.is_some()
    }

    /// Blocks on the bell of `target` (the waiter ahead, or the holder) until
    /// `until` at the latest: [`Next::Look`] once it was let go or the wait is up,
    /// [`Next::Pause`] when the waiter is to poll instead.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped while a statement runs, the session is closed, which
    /// lets its bells go; the waiter then has none and polls, or takes a new one.
    pub(crate) async fn wait_turn(
        &mut self,
        bells: &Bells,
        name: &str,
        me: &str,
        target: Option<&str>,
        until: Instant,
    ) -> Next {
        bells.let_go_stale();
        let Some(target) = target else {
            return Next::Pause;
        };
        let target = bell_name(&bells.namespace, &format!("{name}\0{target}"));
        // The bell taken last turn, found again ahead: it was free with nobody
        // let go (a holder that keeps no bell, a waiter ahead that has not taken
        // its own yet). This turn polls; the next one waits on it again.
        if self.last_target.take().as_deref() == Some(target.as_str()) {
            return Next::Pause;
        }
        if self.session.is_none() {
            // MySQL with less than a whole second to wait: no session is taken
            // for a wait that cannot happen.
            if bells.timeouts.load(Ordering::Relaxed) == WHOLE_SECONDS
                && bells.wait_left(until).is_zero()
            {
                return Next::Pause;
            }
            self.session = bells.session().await;
        }
        let Some(session) = self.session.as_mut() else {
            return Next::Pause;
        };
        let own = bell_name(&bells.namespace, &format!("{name}\0{me}"));
        match bells.wait_on(session, own, target.clone(), until).await {
            BellWait::Taken => {
                self.last_target = Some(target);
                Next::Look
            }
            BellWait::TimedOut => Next::Look,
            BellWait::Skipped => Next::Pause,
            BellWait::Unavailable => {
                self.session = None;
                Next::Pause
            }
        }
    }

    /// The waiter was granted: its hold keeps its own bell until [`Bells::ring`].
    pub(crate) fn keep(&mut self, bells: &Bells, name: &str, holder: &str, lease_end: Instant) {
        bells.let_go_stale();
        if let Some(session) = self
            .session
            .take()
            .filter(|s| s.bell.is_some() && !bells.sessions.is_closed())
        {
            bells
                .kept
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(
                    (name.to_owned(), holder.to_owned()),
                    Kept { session, lease_end },
                );
        }
    }

    /// The waiter stops waiting: it lets its bell go.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped, the session is closed, which lets the bell go.
    pub(crate) async fn leave(&mut self, bells: &Bells) {
        if let Some(session) = self.session.take() {
            session.let_go(bells.timeout).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::bell_name;

    #[test]
    fn a_bell_name_fits_mysql_and_depends_on_namespace_and_name() {
        let a = bell_name("db\0dlock_", "orders");
        assert!(a.len() <= 64, "{a}");
        assert_eq!(a, bell_name("db\0dlock_", "orders"));
        assert_ne!(a, bell_name("db\0dlock_", "orders2"));
        assert_ne!(a, bell_name("db\0other_", "orders"));
        assert_ne!(a, bell_name("db2\0dlock_", "orders"));
        assert_ne!(bell_name("a", "bc"), bell_name("ab", "c"));
        assert!(bell_name("p", &"n".repeat(10_000)).len() <= 64);
    }
}
