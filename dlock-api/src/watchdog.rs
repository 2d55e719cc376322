//! One scheduler per manager that renews every held lock at lease/3 and notices
//! holds whose lease passed without a successful renewal.
//!
//! A single task owns a deadline-ordered queue; it sleeps until the earliest due
//! entry, sends the due renewals concurrently (a multiplexed backend pipelines them),
//! and folds their answers back in. No task or timer exists per lock.
//!
//! Loss is judged on this process's monotonic clock, conservatively: a hold's lease
//! is counted from when the acquire (or the last successful renewal) was *sent*, so
//! the local deadline never falls after the store's, and the lost signal fires a
//! **loss margin** before that deadline ([`loss_margin`]): the store expires the hold
//! no earlier than `sent + lease` on its clock, and the guard hears of the loss at
//! `sent + lease − margin` on ours, so clock-rate drift and timer delay up to the
//! margin cannot make the loss signal late.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use dlock_spi::{Error, HandlerChain, LostReason, RenewRequest, RenewResult, Result};
use tokio::sync::Notify;
use tokio::task::{JoinHandle, JoinSet};

use crate::hold::Hold;

struct Entry {
    hold: Arc<Hold>,
    lease: Duration,
    /// The transition window at the end of the lease (zero for none): renewals are
    /// due every third of the rest, and the hold is suspended in the window.
    transition: Duration,
    renew: bool,
    due: Instant,
    /// When the lost signal fires unless a renewal succeeds first: the send time of
    /// the last successful acquire or renewal + lease − margin.
    lost_at: Instant,
    in_flight: bool,
}

/// Added to every loss margin when scheduling the lost signal, so a timer that fires a
/// little late (timer granularity, scheduling) still keeps the margin.
const TIMER_SLACK: Duration = Duration::from_millis(10);

/// How long before its lease ends a hold is declared lost: the promised margin —
/// `fixed`, or 1 % of the lease (clock-rate drift between this host and the store, as
/// Redlock's drift factor), raised to the observed round trip (a renewal sent but not
/// yet answered) — plus [`TIMER_SLACK`], and at most a third of the lease.
fn loss_margin(fixed: Option<Duration>, lease: Duration, round_trip: Duration) -> Duration {
    let promised = fixed.unwrap_or(lease / 100).max(round_trip);
    (promised + TIMER_SLACK).min(lease / 3)
}

#[derive(Default)]
struct State {
    entries: HashMap<u64, Entry>,
    queue: BTreeSet<(Instant, u64)>,
    task: Option<JoinHandle<()>>,
    closed: bool,
    /// When the scheduler will next wake by itself; a new entry due later needs no
    /// wake-up (so taking a lock does not cost a cross-thread wake).
    sleeping_until: Option<Instant>,
}

/// How long the scheduler sleeps when it has nothing due sooner.
const IDLE_HORIZON: Duration = Duration::from_secs(1);

struct Shared {
    state: Mutex<State>,
    wake: Notify,
    chain: HandlerChain,
    /// A fixed loss margin (the builder's `loss_margin`), or `None` for 1 % of the lease.
    fixed_margin: Option<Duration>,
    /// The slowest recent successful renewal, in µs, decaying by 1/8 per renewal.
    round_trip_us: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn margin(&self, lease: Duration) -> Duration {
        let rtt = Duration::from_micros(self.round_trip_us.load(Ordering::Relaxed));
        loss_margin(self.fixed_margin, lease, rtt)
    }

    /// Marks when a hold renewed (or granted) by a request sent at `sent` counts as
    /// suspended: its own lease (`lease − transition`) less the margin; never for a
    /// hold without a transition window.
    fn suspend(&self, hold: &Hold, sent: Instant, lease: Duration, transition: Duration) {
        if transition.is_zero() {
            return;
        }
        let own = lease - transition;
        hold.set_suspend_after(Some(sent + own - self.margin(own)));
    }

    fn observe_round_trip(&self, took: Duration) {
        let took = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        let _ = self
            .round_trip_us
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                Some(took.max(old - old / 8))
            });
    }
}

pub(crate) struct Watchdog {
    shared: Arc<Shared>,
}

/// The retry delay after a failed renewal: often enough to land one before the lease
/// ends, rarely enough not to hammer a struggling backend.
fn retry_delay(lease: Duration) -> Duration {
    (lease / 10).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

impl Watchdog {
    pub(crate) fn new(chain: HandlerChain, fixed_margin: Option<Duration>) -> Self {
        Watchdog {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                wake: Notify::new(),
                chain,
                fixed_margin,
                round_trip_us: AtomicU64::new(0),
            }),
        }
    }

    /// When a hold granted (or last renewed) by a request sent at `sent_at` for
    /// `lease` counts as lost: the loss margin before the store may let it go.
    pub(crate) fn lost_at(&self, sent_at: Instant, lease: Duration) -> Instant {
        sent_at + lease - self.shared.margin(lease)
    }

    /// Watches `hold`: renews it every third of its own lease (`lease − transition`)
    /// when `renew` is set, marks it suspended the loss margin before its own lease
    /// passes without a renewal (with a transition window), and fires its lost signal
    /// the loss margin before `lease` (counted from `sent_at`) passes.
    pub(crate) fn register(
        &self,
        hold: Arc<Hold>,
        lease: Duration,
        transition: Duration,
        renew: bool,
        sent_at: Instant,
    ) {
        let lost_at = self.lost_at(sent_at, lease);
        self.shared.suspend(&hold, sent_at, lease, transition);
        let due = if renew {
            (sent_at + (lease - transition) / 3).min(lost_at)
        } else {
            lost_at
        };
        let id = hold.id;
        let mut state = self.shared.lock();
        if state.closed {
            return;
        }
        state.entries.insert(
            id,
            Entry {
                hold,
                lease,
                transition,
                renew,
                due,
                lost_at,
                in_flight: false,
            },
        );
        state.queue.insert((due, id));
        if state.task.is_none() {
            let shared = Arc::clone(&self.shared);
            state.task = Some(tokio::spawn(run(shared)));
        } else if state.sleeping_until.is_none_or(|until| due < until) {
            self.shared.wake.notify_one();
        }
    }

    /// A renewal sent at `sent` outside the scheduler succeeded (a leader
    /// proclaiming): counts as the hold's latest renewal.
    pub(crate) fn renewed(&self, id: u64, sent: Instant) {
        let mut state = self.shared.lock();
        let Some(entry) = state.entries.get_mut(&id) else {
            return;
        };
        if entry.in_flight {
            // The scheduler's own renewal settles it.
            return;
        }
        let lost_at = sent + entry.lease - self.shared.margin(entry.lease);
        if lost_at <= entry.lost_at {
            return;
        }
        entry.lost_at = lost_at;
        self.shared
            .suspend(&entry.hold, sent, entry.lease, entry.transition);
        let old = entry.due;
        let due = if entry.renew {
            (sent + (entry.lease - entry.transition) / 3).min(lost_at)
        } else {
            lost_at
        };
        entry.due = due;
        state.queue.remove(&(old, id));
        state.queue.insert((due, id));
    }

    /// Stops watching a hold (it is being released).
    pub(crate) fn unregister(&self, id: u64) {
        let mut state = self.shared.lock();
        if let Some(entry) = state.entries.remove(&id) {
            state.queue.remove(&(entry.due, id));
        }
    }

    /// How many holds are watched (for tests and status).
    pub(crate) fn watched(&self) -> usize {
        self.shared.lock().entries.len()
    }

    /// Stops the scheduler; held locks are no longer renewed.
    pub(crate) fn shutdown(&self) {
        let mut state = self.shared.lock();
        state.closed = true;
        state.entries.clear();
        state.queue.clear();
        if let Some(task) = state.task.take() {
            task.abort();
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.shutdown();
    }
}

struct Due {
    id: u64,
    hold: Arc<Hold>,
    lease: Duration,
    transition: Duration,
    lost_at: Instant,
    renew: bool,
}

type RenewOutcome = (u64, Instant, Option<Result<RenewResult>>);

async fn run(shared: Arc<Shared>) {
    let mut in_flight: JoinSet<RenewOutcome> = JoinSet::new();
    loop {
        let now = Instant::now();
        let (due, next) = take_due(&shared, now);
        for d in due {
            if !d.renew || now >= d.lost_at {
                lose(&shared, d.id, LostReason::LeaseExpired);
                continue;
            }
            let chain = shared.chain.clone();
            let req = RenewRequest::new(
                d.hold.name.clone(),
                d.hold.owner.clone(),
                d.hold.grant,
                d.hold.mode,
                d.lease,
                d.hold.token,
            )
            .with_transition(d.transition);
            let lost_at = d.lost_at;
            let id = d.id;
            in_flight.spawn(async move {
                let sent = Instant::now();
                // A renewal that cannot finish before the loss instant is a loss.
                let result = tokio::time::timeout_at(lost_at.into(), chain.renew(&req))
                    .await
                    .ok();
                (id, sent, result)
            });
        }
        let sleep_until = next;
        tokio::select! {
            _ = tokio::time::sleep_until(sleep_until.into()) => {}
            _ = shared.wake.notified() => {}
            Some(joined) = in_flight.join_next(), if !in_flight.is_empty() => {
                if let Ok(outcome) = joined {
                    settle(&shared, outcome);
                }
            }
        }
    }
}

/// Pops every due entry that is not already being renewed, and decides (under the
/// same lock `register` takes) when the scheduler wakes next.
fn take_due(shared: &Shared, now: Instant) -> (Vec<Due>, Instant) {
    let mut state = shared.lock();
    let mut due = Vec::new();
    while let Some(&(at, id)) = state.queue.first() {
        if at > now {
            break;
        }
        state.queue.pop_first();
        if let Some(entry) = state.entries.get_mut(&id) {
            if entry.due == at && !entry.in_flight {
                entry.in_flight = true;
                due.push(Due {
                    id,
                    hold: Arc::clone(&entry.hold),
                    lease: entry.lease,
                    transition: entry.transition,
                    lost_at: entry.lost_at,
                    renew: entry.renew,
                });
            }
        }
    }
    let next = state
        .queue
        .first()
        .map_or(now + IDLE_HORIZON, |(at, _)| (*at).min(now + IDLE_HORIZON));
    state.sleeping_until = Some(next);
    (due, next)
}

/// Applies a renewal's answer: reschedule, retry, or declare the hold lost.
fn settle(shared: &Shared, (id, sent, result): RenewOutcome) {
    let now = Instant::now();
    let reason = {
        let mut state = shared.lock();
        let Some(entry) = state.entries.get_mut(&id) else {
            return; // released meanwhile
        };
        entry.in_flight = false;
        let next = match result {
            Some(Ok(RenewResult::Renewed { .. })) => {
                shared.observe_round_trip(now.saturating_duration_since(sent));
                entry.lost_at = sent + entry.lease - shared.margin(entry.lease);
                shared.suspend(&entry.hold, sent, entry.lease, entry.transition);
                Ok((sent + (entry.lease - entry.transition) / 3).min(entry.lost_at))
            }
            Some(Ok(RenewResult::NotOwner)) => Err(LostReason::NotOwner),
            Some(Err(err)) if now < entry.lost_at && !is_final(&err) => {
                Ok((now + retry_delay(entry.lease - entry.transition)).min(entry.lost_at))
            }
            Some(Err(_)) => Err(LostReason::LeaseExpired),
            None => Err(LostReason::LeaseExpired),
        };
        match next {
            Ok(due) => {
                entry.due = due;
                state.queue.insert((due, id));
                None
            }
            Err(reason) => Some(reason),
        }
    };
    if let Some(reason) = reason {
        lose(shared, id, reason);
    }
}

/// Errors after which renewing again is pointless.
fn is_final(err: &Error) -> bool {
    matches!(
        err.kind(),
        dlock_spi::ErrorKind::NotOwner | dlock_spi::ErrorKind::LockLost
    )
}

fn lose(shared: &Shared, id: u64, reason: LostReason) {
    let entry = {
        let mut state = shared.lock();
        let entry = state.entries.remove(&id);
        if let Some(e) = &entry {
            state.queue.remove(&(e.due, id));
        }
        entry
    };
    let Some(entry) = entry else { return };
    entry.hold.lose(&shared.chain, reason);
}
