//! One scheduler per manager that renews every held lock at lease/3 and notices
//! holds whose lease passed without a successful renewal.
//!
//! A single task owns a deadline-ordered queue; it sleeps until the earliest due
//! entry, sends the due renewals concurrently (a multiplexed backend pipelines them),
//! and folds their answers back in. No task or timer exists per lock.
//!
//! Loss is judged on this process's monotonic clock, conservatively: a hold's lease
//! is counted from when the acquire (or the last successful renewal) was *sent*, so
//! the local deadline never falls after the store's.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use dlock_spi::{Error, HandlerChain, LostReason, RenewRequest, RenewResult, Result};
use tokio::sync::Notify;
use tokio::task::{JoinHandle, JoinSet};

use crate::hold::Hold;

struct Entry {
    hold: Arc<Hold>,
    lease: Duration,
    renew: bool,
    due: Instant,
    deadline: Instant,
    in_flight: bool,
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
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
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
    pub(crate) fn new(chain: HandlerChain) -> Self {
        Watchdog {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                wake: Notify::new(),
                chain,
            }),
        }
    }

    /// Watches `hold`: renews it every lease/3 when `renew` is set, otherwise only
    /// fires its lost signal when `lease` (counted from `sent_at`) passes.
    pub(crate) fn register(&self, hold: Arc<Hold>, lease: Duration, renew: bool, sent_at: Instant) {
        let due = if renew {
            sent_at + lease / 3
        } else {
            sent_at + lease
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
                renew,
                due,
                deadline: sent_at + lease,
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
    deadline: Instant,
    renew: bool,
}

type RenewOutcome = (u64, Instant, Option<Result<RenewResult>>);

async fn run(shared: Arc<Shared>) {
    let mut in_flight: JoinSet<RenewOutcome> = JoinSet::new();
    loop {
        let now = Instant::now();
        let (due, next) = take_due(&shared, now);
        for d in due {
            if !d.renew || now >= d.deadline {
                lose(&shared, d.id, LostReason::LeaseExpired);
                continue;
            }
            let chain = shared.chain.clone();
            let req = RenewRequest::new(
                d.hold.name.clone(),
                d.hold.owner.clone(),
                d.hold.mode,
                d.lease,
                d.hold.token,
            );
            let deadline = d.deadline;
            let id = d.id;
            in_flight.spawn(async move {
                let sent = Instant::now();
                // A renewal that cannot finish before the lease ends is a loss.
                let result = tokio::time::timeout_at(deadline.into(), chain.renew(&req))
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
                    deadline: entry.deadline,
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
                entry.deadline = sent + entry.lease;
                Ok(sent + entry.lease / 3)
            }
            Some(Ok(RenewResult::NotOwner)) => Err(LostReason::NotOwner),
            Some(Err(err)) if now < entry.deadline && !is_final(&err) => {
                Ok((now + retry_delay(entry.lease)).min(entry.deadline))
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
    entry.hold.report_lost(&shared.chain, reason);
}
