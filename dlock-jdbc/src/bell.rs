//! MariaDB/MySQL: a named lock (`GET_LOCK`) per contended lock — its *bell* — on
//! which waiting acquires block inside the server, so a release hands the lock on
//! at once instead of when a waiter's next poll comes round.
//!
//! The lock's row stays the lock: its lease, its fencing token and its queue decide
//! every grant. The bell only decides *when* a waiter looks at the row again, so
//! nothing here can grant a lock twice; a bell that is lost, stale or shared by two
//! names (its name is a hash) costs waiting time, never safety.
//!
//! How it goes:
//!
//! * A refused exclusive acquire that will wait blocks on `GET_LOCK(bell, t)` on a
//!   session of its own, instead of sleeping its backoff: at most a third of its
//!   queue liveness (it then refreshes its queue entry), and never past the
//!   holder's lease end or its deadline — a bell held by a session whose process
//!   stopped, or by a hold that was lost, holds nobody longer than that.
//! * Whoever takes the bell looks at the row at once. Granted, the hold keeps the
//!   bell (its session) and rings it — `RELEASE_LOCK` — right after its release
//!   committed: the server wakes the next waiter in the bell's line, which is the
//!   hand-over.
//! * Refused with the bell while first in the lock's queue (the holder took the
//!   row without a bell: uncontended, or barging in non-fair mode), the waiter keeps
//!   the bell and polls with its backoff, the others stay blocked behind it. Refused
//!   while others are queued ahead of it, it lets the bell go (one of them may be
//!   blocked on it) and polls this round.
//! * Sessions are a few dedicated connections per backend
//!   ([`crate::JdbcOptions::wake_sessions`]); a waiter that finds none free polls,
//!   as every waiter did before bells. A session dropped while it holds a bell or
//!   while its statement runs (a cancelled acquire) is closed, not reused: the
//!   server lets its bell go with the session.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};
use sqlx::{ConnectOptions, Connection, Row};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The bells of one backend: its wake-up sessions, and the bells its holds keep.
pub(crate) struct Bells {
    options: MySqlConnectOptions,
    prefix: String,
    /// One permit per session that may exist.
    sessions: Arc<Semaphore>,
    /// Sessions holding nothing, ready for the next waiter.
    idle: Arc<Mutex<Vec<MySqlConnection>>>,
    /// The bells kept by holds of this process, by lock name and holder key.
    held: Mutex<HashMap<(String, String), Kept>>,
    /// Waits that ended with the bell taken.
    taken: AtomicU64,
}

/// A hold's bell: its session, and when the hold's lease ends as last known.
struct Kept {
    session: BellSession,
    lease_end: Instant,
}

/// How a wait on a bell ended.
pub(crate) enum Rung {
    /// The bell is this waiter's now: look at the row at once.
    Taken(BellSession),
    /// Nobody rang it in time (or the session failed): look at the row again.
    TimedOut,
    /// No session was free: wait the way polling waits.
    NoSession,
}

/// A wake-up session, checked out by one waiter or kept by one hold.
pub(crate) struct BellSession {
    conn: Option<MySqlConnection>,
    _permit: OwnedSemaphorePermit,
    idle: Arc<Mutex<Vec<MySqlConnection>>>,
    /// The bell the session holds, if any.
    bell: Option<String>,
    /// `false` while a statement runs or a bell is held: such a session is closed
    /// on drop, never reused.
    clean: bool,
}

impl Drop for BellSession {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            if self.clean && self.bell.is_none() {
                self.idle
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(conn);
            }
            // Otherwise `conn` is dropped here: the socket closes, and the server
            // ends the session and lets its bell go.
        }
    }
}

impl BellSession {
    /// Lets the session's bell go (waking the next waiter in its line); the session
    /// goes back to the idle ones, or is closed if the statement failed.
    async fn ring(mut self) {
        let (Some(conn), Some(bell)) = (self.conn.as_mut(), self.bell.as_deref()) else {
            return;
        };
        self.clean = false;
        let rang = sqlx::query("DO RELEASE_LOCK(?)")
            .bind(bell)
            .execute(&mut *conn)
            .await;
        if let Err(e) = rang {
            tracing::debug!(error = %e, "dlock-jdbc: ringing a bell failed; the session is closed, which rings it");
            return;
        }
        self.bell = None;
        self.clean = true;
    }
}

/// The bell of `name`: a hash of the table prefix and the name, so any name and
/// prefix fit MySQL's 64 characters. FNV-1a, which every dlock build computes
/// alike (a hash that differed between builds would only cost wake-ups).
fn bell_name(prefix: &str, name: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in prefix.bytes().chain([0]).chain(name.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("dlock-bell:{hash:016x}")
}

impl Bells {
    /// Bells for a backend whose pool connects with `options`; `sessions` wake-up
    /// sessions at most (connected when first needed).
    pub(crate) fn new(options: MySqlConnectOptions, prefix: &str, sessions: u32) -> Self {
        Bells {
            // The bells' statements log nothing: they are not the application's.
            options: options.disable_statement_logging(),
            prefix: prefix.to_owned(),
            sessions: Arc::new(Semaphore::new(sessions as usize)),
            idle: Arc::new(Mutex::new(Vec::new())),
            held: Mutex::new(HashMap::new()),
            taken: AtomicU64::new(0),
        }
    }

    /// A free session, connected if need be; `None` when all are in use or
    /// connecting fails (the waiter polls instead).
    async fn session(&self) -> Option<BellSession> {
        let permit = Arc::clone(&self.sessions).try_acquire_owned().ok()?;
        let pooled = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let conn = match pooled {
            Some(conn) => conn,
            None => match MySqlConnection::connect_with(&self.options).await {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::debug!(error = %e, "dlock-jdbc: a wake-up session did not connect; waiters poll");
                    return None;
                }
            },
        };
        Some(BellSession {
            conn: Some(conn),
            _permit: permit,
            idle: Arc::clone(&self.idle),
            bell: None,
            clean: true,
        })
    }

    /// Blocks on the bell of `name` for at most `wait`.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped mid-wait, the session is closed, and a bell the server
    /// granted it meanwhile goes with the session.
    pub(crate) async fn wait(&self, name: &str, wait: Duration) -> Rung {
        let Some(mut session) = self.session().await else {
            return Rung::NoSession;
        };
        let bell = bell_name(&self.prefix, name);
        let Some(conn) = session.conn.as_mut() else {
            return Rung::NoSession;
        };
        session.clean = false;
        // MariaDB and MySQL take a fractional timeout in seconds.
        let answer = sqlx::query("SELECT GET_LOCK(?, ?)")
            .bind(&bell)
            .bind(wait.as_secs_f64().max(0.001))
            .fetch_one(&mut *conn)
            .await
            .and_then(|row| row.try_get::<Option<i64>, _>(0));
        match answer {
            Ok(Some(1)) => {
                self.taken.fetch_add(1, Ordering::Relaxed);
                session.bell = Some(bell);
                Rung::Taken(session)
            }
            Ok(_) => {
                session.clean = true;
                Rung::TimedOut
            }
            Err(e) => {
                tracing::debug!(error = %e, "dlock-jdbc: waiting on a bell failed; the session is closed");
                Rung::TimedOut
            }
        }
    }

    /// Lets a waiter's bell go: it was refused while others wait ahead of it, or
    /// it stopped waiting.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped, the session is closed, which lets the bell go.
    pub(crate) async fn pass(&self, session: BellSession) {
        session.ring().await;
    }

    /// A granted waiter's hold keeps its bell until [`Bells::ring`]. A bell kept
    /// past its hold's lease end (a hold never released: its guard leaked) is rung
    /// here, at the next keep.
    pub(crate) fn keep(&self, name: &str, holder: &str, session: BellSession, lease_end: Instant) {
        let stale: Vec<BellSession> = {
            let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
            let now = Instant::now();
            let stale_keys: Vec<(String, String)> = held
                .iter()
                .filter(|(_, kept)| kept.lease_end < now)
                .map(|(key, _)| key.clone())
                .collect();
            let stale = stale_keys
                .iter()
                .filter_map(|key| held.remove(key))
                .map(|kept| kept.session)
                .collect();
            held.insert(
                (name.to_owned(), holder.to_owned()),
                Kept { session, lease_end },
            );
            stale
        };
        if !stale.is_empty() {
            tokio::spawn(async move {
                for session in stale {
                    session.ring().await;
                }
            });
        }
    }

    /// The hold `holder` of `name` was renewed until `lease_end`.
    pub(crate) fn renewed(&self, name: &str, holder: &str, lease_end: Instant) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(kept) = held.get_mut(&(name.to_owned(), holder.to_owned())) {
            kept.lease_end = lease_end;
        }
    }

    /// Rings the bell the hold `holder` of `name` kept, if it kept one: called
    /// after its release committed, so the waiter it wakes finds the row free.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped, the session is closed, which rings the bell.
    pub(crate) async fn ring(&self, name: &str, holder: &str) {
        let kept = self
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(name.to_owned(), holder.to_owned()));
        if let Some(kept) = kept {
            kept.session.ring().await;
        }
    }

    /// Closes every session: idle ones, and those holds keep (the server lets
    /// their bells go).
    pub(crate) fn close(&self) {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// How many waits on a bell ended with the bell taken.
    pub(crate) fn taken(&self) -> u64 {
        self.taken.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::bell_name;

    #[test]
    fn a_bell_name_fits_mysql_and_depends_on_prefix_and_name() {
        let a = bell_name("dlock_", "orders");
        assert!(a.len() <= 64, "{a}");
        assert_eq!(a, bell_name("dlock_", "orders"));
        assert_ne!(a, bell_name("dlock_", "orders2"));
        assert_ne!(a, bell_name("other_", "orders"));
        assert_ne!(bell_name("a", "bc"), bell_name("ab", "c"));
        assert!(bell_name("p", &"n".repeat(10_000)).len() <= 64);
    }
}
