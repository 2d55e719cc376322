//! The row mode's acquire: attempts, and between them the wait for a turn — on a
//! release notice, a MariaDB/MySQL bell, or the backoff's pause, never past the
//! caller's deadline.

use std::time::{Duration, Instant};

use dlock_spi::{
    AcquireRequest, AcquireResult, Backoff, FencingToken, HolderKey, LockMode, LockName, Result,
};

use crate::backend::JdbcBackend;
use crate::error::{conflict_pause, is_conflict};
use crate::grant::{Attempt, Granted};
use crate::queue::QueueSlot;
use crate::wakeups::{Next, Subscription};

/// The longest first pause of a waiter that has just queued (see
/// [`Attempt::Busy::just_queued`]).
const JUST_QUEUED_PAUSE: Duration = Duration::from_millis(10);

/// A backoff round past every growth: its delay is the longest the backoff takes
/// (`Backoff::delay` stops growing at round 32).
const LONGEST_ROUND: u32 = u32::MAX;

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
    pub(crate) fn look_by(
        retry_after: Option<Duration>,
        wait: Duration,
        liveness: Duration,
    ) -> Duration {
        let wait = wait.min(liveness / 3);
        retry_after.map_or(wait, |r| wait.min(r + Duration::from_millis(1)))
    }
}

/// How often a refused waiter looks again: the backoff's rounds, from the
/// shortest again when it moves up the queue.
struct Pace {
    backoff: Backoff,
    /// A queued writer named in the release notice when its turn comes.
    told: bool,
    round: u32,
    last_ahead: i64,
    last_holder: Option<String>,
}

impl Pace {
    /// The pause before the next look, `ahead` waiters queued ahead and the lock
    /// held by `holder_key` (`bell_held`: this waiter holds a bell); `None` when no
    /// pause fits before `deadline`.
    fn delay(
        &mut self,
        ahead: i64,
        holder_key: Option<String>,
        bell_held: bool,
        deadline: Option<Instant>,
    ) -> Option<Duration> {
        // A waiter that moves up to the head of the queue, or next but one, polls
        // from the shortest delay again (a told writer pauses the longest from its
        // second pause on, below): the lock is handed on soon after it frees, not
        // when a long backoff comes round. So does the head on a bell line when the
        // lock changes hands: a hold that took the lock past it (a newcomer, in
        // non-fair mode) keeps no bell, so the head polls it, and it may end soon.
        if (ahead < 2 && ahead < self.last_ahead)
            || (ahead == 0 && bell_held && holder_key != self.last_holder)
        {
            self.round = 0;
        }
        self.last_ahead = ahead;
        self.last_holder = holder_key;
        // A queued writer on PostgreSQL is named in the release notice when its turn
        // comes: it looks on its own (a notice lost, a waiter ahead lapsed) only as
        // often as the backoff's longest delay; the rounds above are for the others.
        let round = if self.told { LONGEST_ROUND } else { self.round };
        deadline.and_then(|d| self.backoff.delay_within(round, d))
    }
}

impl JdbcBackend {
    /// Acquires in the row mode: attempts until granted, refused without a wait
    /// left, or failed (see [`LockRemoteResource::try_acquire`](dlock_spi::LockRemoteResource::try_acquire)).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped, its queue entry is removed in a task of its own, and a
    /// grant the backend may have made is the caller's to give back.
    pub(crate) async fn acquire_rows(&self, req: &AcquireRequest) -> Result<AcquireResult> {
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
        let mut pace = Pace {
            backoff: self.inner.options.backoff,
            told,
            round: 0,
            last_ahead: i64::MAX,
            last_holder: None,
        };
        let mut conflicts = 0u32;
        let mut bell = crate::bell::Waiter::default();
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
                Attempt::Granted(granted) => {
                    return Ok(self
                        .granted(req, slot.take(), &mut bell, granted, sent)
                        .await);
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
                    let Some(delay) = pace.delay(ahead, holder_key, bell.holds(), req.deadline)
                    else {
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
                    pace.round = pace.round.saturating_add(1);
                }
            }
        }
    }

    /// A grant: the waiter leaves the queue (a writer beside its hold), the hold
    /// keeps its bell, and the lease counts from the granting statement's send time
    /// `sent` (the database started it no earlier).
    async fn granted(
        &self,
        req: &AcquireRequest,
        slot: Option<QueueSlot>,
        bell: &mut crate::bell::Waiter,
        Granted { token, left_queue }: Granted,
        sent: Instant,
    ) -> AcquireResult {
        if let Some(slot) = slot {
            match (left_queue, req.mode) {
                (true, _) => slot.left(),
                // Off the hand-over's path: the release waits for it.
                (false, LockMode::Exclusive) => slot.depart(),
                (false, _) => slot.leave().await,
            }
        }
        // The hold keeps its own bell, if it took one while it waited, and lets it go
        // at its release: that wakes the waiter behind.
        if let Some(bells) = &self.inner.bells {
            bell.keep(
                bells,
                req.name.as_str(),
                req.holder().as_str(),
                sent + req.lease,
            );
        }
        let token = u64::try_from(token).unwrap_or(0);
        AcquireResult::acquired(FencingToken::new(token), Some(sent + req.lease))
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
    pub(crate) fn ring_bell(&self, name: &LockName, holder: HolderKey) {
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
}
