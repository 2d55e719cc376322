//! What the session modes of every database share: the idle sessions kept for the
//! next grants, the registry of holds (a hold *is* its connection), and the hold's
//! feed that asks its session whether it is still there.
//!
//! One home for the loss rule: a hold's session is ended by the server `K` (the
//! session timeout) after the last statement it received; the feed asks every
//! `K/5` (which keeps the session from idling out), is suspended when an answer is
//! late, and declares the hold lost when no answer came within `K/2` of the last
//! answered ask's send — before the server can have ended the session on its own.
//! A hold lost so keeps its session open until `K` after that send, when the
//! server would end it anyway: the lost signal leads the lock's release by `K/2`.
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use dlock_spi::{
    Capabilities, Error, ErrorKind, HoldFeed, HoldStatus, HoldWatch, LockMode, LostReason,
    RenewRequest, RenewResult,
};

/// A connection a hold lives on: it can tell which server session it reaches.
#[async_trait]
pub(super) trait SessionConn: Send + 'static {
    /// The server's id of the session the connection reaches now (PostgreSQL's
    /// backend pid, MariaDB's connection id). One round trip.
    async fn server_id(&mut self) -> Result<u64, sqlx::Error>;
}

/// What a session mode offers: holds tied to their session (no lease, no
/// renewal), fencing tokens, the API's reentrancy; shared locks where the
/// database has them.
pub(super) fn capabilities(shared: bool) -> Capabilities {
    let mut caps = Capabilities::default();
    caps.lease = false;
    caps.renew = false;
    caps.reentrant = true;
    caps.shared = shared;
    caps.fencing = true;
    caps.max_name_len = Some(crate::MAX_NAME_LEN);
    caps
}

/// The error of a new hold session that did not open `within` the connect bound
/// (`database`: "PostgreSQL", "MariaDB"; `backend`: the context's name).
pub(super) fn no_session_within(database: &str, backend: &'static str, within: Duration) -> Error {
    Error::new(
        ErrorKind::Timeout,
        format!(
            "no new {database} session within {within:?}; check that the server runs and is not overloaded, or wait longer (dlock_acquire_timeout=)"
        ),
    )
    .set_retryable(true)
    .with_context("backend", backend)
    .with_context("op", "connect")
}

/// A session set up for holds: its connection and its server id (read once, with
/// the pooler check, when it was set up).
pub(super) struct Session<C> {
    pub(super) conn: C,
    pub(super) id: u64,
}

/// The most idle hold sessions kept for the next grants.
const MAX_IDLE: usize = 16;

/// An idle session unused this long is pinged before it is used again (as the row
/// mode's pool does); one used more recently is used as it is.
const CHECK_AFTER_IDLE: Duration = Duration::from_millis(500);

/// Sessions that hold nothing, most recently used last.
pub(super) struct Idle<C> {
    sessions: Mutex<Vec<(Session<C>, Instant)>>,
}

impl<C> Idle<C> {
    pub(super) fn new() -> Self {
        Idle {
            sessions: Mutex::new(Vec::new()),
        }
    }

    /// An idle session fit for use, or `None` (open a new one). One idle for
    /// [`CHECK_AFTER_IDLE`] or more is pinged first (bounded by `ping_within`) and
    /// dropped if the server ended it; one used more recently is used as it is.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a session dropped mid-ping is closed (it held nothing).
    pub(super) async fn take(&self, ping_within: Duration) -> Option<Session<C>>
    where
        C: sqlx::Connection,
    {
        loop {
            let popped = self
                .sessions
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop();
            let (mut session, since) = popped?;
            if since.elapsed() < CHECK_AFTER_IDLE {
                return Some(session);
            }
            if let Ok(Ok(())) = tokio::time::timeout(ping_within, session.conn.ping()).await {
                return Some(session);
            }
        }
    }

    /// Keeps a session that holds nothing (beyond [`MAX_IDLE`], it is dropped:
    /// closed).
    pub(super) fn put_back(&self, session: Session<C>) {
        let mut idle = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < MAX_IDLE {
            idle.push((session, Instant::now()));
        }
    }

    /// Takes every idle session (to close them).
    pub(super) fn drain(&self) -> Vec<Session<C>> {
        std::mem::take(&mut *self.sessions.lock().unwrap_or_else(PoisonError::into_inner))
            .into_iter()
            .map(|(session, _)| session)
            .collect()
    }
}

/// One hold's connection, shared by its release, its renewals and its feed. `K`:
/// the database's key of the lock.
pub(super) struct Held<C, K> {
    /// `None` once released, once the feed ended the session, or while (and
    /// after) a statement of the hold's own runs on it ([`Held::take_out`]).
    pub(super) conn: tokio::sync::Mutex<Option<C>>,
    pub(super) key: K,
    /// The mode it holds in (MariaDB's locks are all exclusive).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(super) mode: LockMode,
    pub(super) id: u64,
    /// Taken out for a statement that has not given it back: the statement failed
    /// or was dropped, its connection closed, and the lock went with it — the
    /// feed reports the loss (an empty slot otherwise means released).
    broken: AtomicBool,
}

impl<C, K> Held<C, K> {
    /// Takes the connection out of `slot` for a statement of the hold's own (a
    /// new context): until [`Held::give_back`], the hold counts as broken, so a
    /// statement that fails or is dropped (closing the connection, and the
    /// session's lock with it) is reported lost by the feed, not taken for a
    /// release.
    pub(super) fn take_out(&self, slot: &mut Option<C>) -> Option<C> {
        let conn = slot.take()?;
        self.broken.store(true, Ordering::SeqCst);
        Some(conn)
    }

    /// Gives back a connection [`Held::take_out`] took, its statement answered.
    pub(super) fn give_back(&self, slot: &mut Option<C>, conn: C) {
        *slot = Some(conn);
        self.broken.store(false, Ordering::SeqCst);
    }
}

/// The holds of one backend, by holder key.
pub(super) struct Holds<C, K> {
    holds: Mutex<HashMap<String, Arc<Held<C, K>>>>,
}

impl<C: SessionConn, K: Send + Sync + 'static> Holds<C, K> {
    pub(super) fn new() -> Self {
        Holds {
            holds: Mutex::new(HashMap::new()),
        }
    }

    /// Registers the hold granted on `session` and returns the watch of its feed:
    /// asks every `timeout / 5`, lost at `timeout / 2` (module docs).
    pub(super) fn insert(
        &self,
        holder: &str,
        session: Session<C>,
        key: K,
        mode: LockMode,
        timeout: Duration,
    ) -> HoldWatch {
        let held = Arc::new(Held {
            conn: tokio::sync::Mutex::new(Some(session.conn)),
            key,
            mode,
            id: session.id,
            broken: AtomicBool::new(false),
        });
        self.holds
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(holder.to_owned(), Arc::clone(&held));
        let now = Instant::now();
        HoldWatch::new(Probe {
            held,
            every: timeout / 5,
            keep: timeout / 2,
            last_ok: now,
            next_at: now + timeout / 5,
            suspended: false,
        })
    }

    pub(super) fn get(&self, holder: &str) -> Option<Arc<Held<C, K>>> {
        self.holds
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(holder)
            .cloned()
    }

    /// A renewal of a hold: a session-bound hold needs none (renewed while its
    /// session is there); a new context (a leader proclaiming) is written by
    /// `write` — given the hold's connection, its key and the context, it answers
    /// the connection and whether the hold's row took the context — on the hold's
    /// own session, taken out meanwhile: dropped or failed mid-statement, the
    /// session closes with it and the feed reports the loss.
    pub(super) async fn renew<F, Fut>(
        &self,
        req: &RenewRequest,
        write: F,
    ) -> dlock_spi::Result<RenewResult>
    where
        K: Clone,
        F: FnOnce(C, K, Bytes) -> Fut,
        Fut: std::future::Future<Output = dlock_spi::Result<(C, bool)>>,
    {
        let Some(held) = self.get(req.holder().as_str()) else {
            return Ok(RenewResult::NotOwner);
        };
        let mut slot = held.conn.lock().await;
        let Some(context) = &req.context else {
            return Ok(if slot.is_some() {
                RenewResult::renewed(None)
            } else {
                RenewResult::NotOwner
            });
        };
        let Some(conn) = held.take_out(&mut slot) else {
            return Ok(RenewResult::NotOwner);
        };
        let (conn, took) = write(conn, held.key.clone(), context.clone()).await?;
        held.give_back(&mut slot, conn);
        Ok(if took {
            RenewResult::renewed(None)
        } else {
            RenewResult::NotOwner
        })
    }

    pub(super) fn remove(&self, holder: &str) {
        self.holds
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(holder);
    }
}

/// A hold's feed: asks its session for its id every `every`; suspended when an
/// answer is late, lost when none came within `keep` of the last answered ask's
/// send (the server ends an idle session `K = 2 × keep` after its last statement),
/// or when the session is gone or not this hold's.
struct Probe<C, K> {
    held: Arc<Held<C, K>>,
    every: Duration,
    keep: Duration,
    last_ok: Instant,
    /// When the next ask is due (every `every` from the last one's send): the
    /// feed is quiet until then ([`HoldFeed::quiet_for`]), and one polled late
    /// asks at once.
    next_at: Instant,
    suspended: bool,
}

#[async_trait]
impl<C: SessionConn, K: Send + Sync + 'static> HoldFeed for Probe<C, K> {
    fn quiet_for(&self) -> Duration {
        self.next_at.saturating_duration_since(Instant::now())
    }

    async fn next(&mut self) -> Option<HoldStatus> {
        loop {
            if !self.suspended {
                tokio::time::sleep_until(self.next_at.into()).await;
            }
            let sent = Instant::now();
            self.next_at = sent + self.every;
            let lost_at = self.last_ok + self.keep;
            // A statement of the hold's own that holds the connection past the
            // loss (hung: the server may end the silent session at K) does not
            // hold up the loss.
            let Ok(mut slot) = tokio::time::timeout_at(lost_at.into(), self.held.conn.lock()).await
            else {
                return Some(HoldStatus::Lost(LostReason::SessionExpired));
            };
            // Released: the feed ends; broken by a statement of its own: lost.
            let Some(conn) = slot.as_mut() else {
                return self
                    .held
                    .broken
                    .load(Ordering::SeqCst)
                    .then_some(HoldStatus::Lost(LostReason::SessionExpired));
            };
            // Woken past the loss (this process stood still: a stop, a pause, a
            // starved runtime): lost by the rule, whatever an ask sent now would
            // bring back — an answer cannot come in no time, and which of it and
            // the late timer the runtime sees first is chance.
            if Instant::now() >= lost_at {
                return Some(self.lost(&mut slot));
            }
            // An answer is due within `every`; once late, by the loss.
            let due = if self.suspended {
                lost_at
            } else {
                (sent + self.every).min(lost_at)
            };
            match tokio::time::timeout_at(due.into(), conn.server_id()).await {
                Ok(Ok(id)) if id == self.held.id => {
                    self.last_ok = sent;
                    if self.suspended {
                        self.suspended = false;
                        return Some(HoldStatus::Held);
                    }
                }
                Err(_) if Instant::now() < lost_at => {
                    self.suspended = true;
                    return Some(HoldStatus::Suspended);
                }
                // Silent past the margin: lost. The server may still have the
                // session, and the lock, until `K` after the last statement it
                // received: the session is closed then, not now. Closed at once,
                // its lock would pass to a waiter while the holder is only being
                // told — seen: a process continued from a 3 s stop (the feed's
                // asks due while it stood still) wrote 5 ms after its lost signal,
                // 2 ms after the next grant.
                Err(_) => return Some(self.lost(&mut slot)),
                // Gone, or another session's (a pooler): closed at once, so that
                // whatever it still holds ends too.
                Ok(_) => {
                    slot.take();
                    return Some(HoldStatus::Lost(LostReason::SessionExpired));
                }
            }
        }
    }
}

impl<C: Send + 'static, K> Probe<C, K> {
    /// The hold is lost: its session is closed when the server would have ended
    /// it on its own, `K` after the last answered ask's send ([`close_at`]).
    fn lost(&self, slot: &mut Option<C>) -> HoldStatus {
        if let Some(conn) = slot.take() {
            close_at(conn, self.last_ok + self.keep * 2);
        }
        HoldStatus::Lost(LostReason::SessionExpired)
    }
}

/// Closes a lost hold's connection (ending its session, and the lock with it) at
/// `at`: when the server would have ended the silent session on its own, so that
/// the lost signal leads the lock's next grant by the margin the feed keeps
/// (`K/2`; less only the part of a stall of this process past `K/2`). A task
/// owns the connection until then; past `at`, or with no runtime to run the task
/// (the feed polled outside tokio), it closes at once.
fn close_at<C: Send + 'static>(conn: C, at: Instant) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return drop(conn);
    };
    if at <= Instant::now() {
        return drop(conn);
    }
    drop(runtime.spawn(async move {
        tokio::time::sleep_until(at.into()).await;
        drop(conn);
    }));
}
