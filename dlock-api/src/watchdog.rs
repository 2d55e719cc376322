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
//!
//! A hold has at most one renewal in flight, and every renewal of a hold is sent by
//! the scheduler — an explicit [`Watchdog::extend`] included — so the store sees a
//! hold's renewals in the order they were sent and the local loss instant can be
//! computed from the last one answered. A shortening extend lowers the local loss
//! instant *before* it is sent (the store may apply it even if its answer is lost).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use dlock_spi::{Error, HandlerChain, LostReason, RenewRequest, RenewResult, Result};
use tokio::sync::{oneshot, Notify};
use tokio::task::{JoinHandle, JoinSet};

use crate::hold::Hold;
use crate::ids::IdMap;

/// Told how an explicit extend's renewal went.
type ExtendWaiter = oneshot::Sender<Result<()>>;

/// Work for a hold that starts later ([`Watchdog::defer`]): spawned when due, dropped
/// unstarted if the hold is released first.
pub(crate) type Deferred = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

struct Entry {
    hold: Arc<Hold>,
    /// The lease every renewal asks for (transition included); an extend changes it.
    lease: Duration,
    /// The transition window at the end of the lease (zero for none): renewals are
    /// due every third of the rest, and the hold is suspended in the window.
    transition: Duration,
    renew: bool,
    due: Instant,
    /// When the lost signal fires unless a renewal succeeds first: the send time of
    /// the last successful acquire or renewal + lease − margin.
    lost_at: Instant,
    /// The `max_hold` bound: no renewal is sent from here, and the hold is lost
    /// (and given back) at this instant.
    cap: Option<Instant>,
    in_flight: bool,
    /// Extends asked for but not yet sent: the next renewal carries them, at once.
    pending: Vec<ExtendWaiter>,
    /// How many extends the hold has had; a renewal records the count it was taken
    /// off the queue with (both under the scheduler's lock), so it is known exactly
    /// which extends it carries.
    extends: u64,
    /// A shortening extend's bound on `lost_at` (`.1`), set by extend number `.0`: a
    /// renewal taken before it carried the longer lease, but the shorter one may
    /// reach the store after it, so its success cannot lift `lost_at` above the bound.
    floor: Option<(u64, Instant)>,
    /// The shortest lease of a renewal whose outcome stayed unknown (an error or a
    /// timeout): it may still reach the store after any later renewal and cut the
    /// store's expiry to its own lease from then, so every later success counts
    /// at most this lease from its send time.
    lingering: Option<Duration>,
}

impl Entry {
    /// The lease a successful renewal may count: the one asked for, or a shorter
    /// one whose renewal's outcome stayed unknown (it may still reach the store).
    fn counted(&self, lease: Duration) -> Duration {
        self.lingering.map_or(lease, |l| l.min(lease))
    }

    /// When the scheduler looks at this hold next, after a grant or a renewal sent at
    /// `sent`: a third into its own lease if renewed, else at the loss; never after
    /// the cap; at once when an extend waits.
    fn next_due(&self, sent: Instant, now: Instant) -> Instant {
        let due = if !self.pending.is_empty() {
            now
        } else if self.renew {
            let own = self.counted(self.lease).saturating_sub(self.transition);
            (sent + own / 3).min(self.lost_at)
        } else {
            self.lost_at
        };
        self.cap.map_or(due, |cap| due.min(cap))
    }

    /// Tells the hold how long it is guaranteed (lease-based holds only).
    fn publish(&self) {
        let until = self.cap.map_or(self.lost_at, |cap| cap.min(self.lost_at));
        self.hold.set_valid_until(Some(until));
    }
}

/// How a hold is watched.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Watch {
    /// The lease asked for (transition included); `None` for a session-bound hold,
    /// watched only for its cap.
    pub(crate) lease: Option<Duration>,
    /// The transition window at the end of the lease (zero for none).
    pub(crate) transition: Duration,
    /// Whether the watchdog renews the lease.
    pub(crate) renew: bool,
    /// When the granted request was sent.
    pub(crate) sent_at: Instant,
    /// The `max_hold` bound, if any.
    pub(crate) cap: Option<Instant>,
    /// The grant came on a provisional lease, shorter than `lease` from `sent_at`
    /// on (a release handed it over): renewed a third into that lease, not at once.
    pub(crate) provisional: bool,
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
    entries: IdMap<Entry>,
    queue: BTreeSet<(Instant, u64)>,
    task: Option<JoinHandle<()>>,
    closed: bool,
    /// Deferred work by hold, with its start ([`Watchdog::defer`]), and its queue.
    deferred: IdMap<(Instant, Deferred)>,
    deferred_queue: BTreeSet<(Instant, u64)>,
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
    /// passes without a renewal (with a transition window), fires its lost signal
    /// the loss margin before `lease` (counted from `sent_at`) passes, and — with a
    /// cap — loses it with [`LostReason::MaxHold`] at the cap and gives it back.
    pub(crate) fn register(&self, hold: Arc<Hold>, watch: Watch) {
        let Watch {
            lease,
            transition,
            renew,
            sent_at,
            cap,
            provisional,
        } = watch;
        let (lease, lost_at, renew) = match lease {
            Some(lease) => {
                self.shared.suspend(&hold, sent_at, lease, transition);
                (lease, self.lost_at(sent_at, lease), renew)
            }
            // Session-bound: only the cap ends it here.
            None => match cap {
                Some(cap) => (Duration::ZERO, cap, false),
                None => return,
            },
        };
        let id = hold.id;
        let entry = Entry {
            hold,
            lease,
            transition,
            renew,
            due: lost_at,
            lost_at,
            cap,
            in_flight: false,
            pending: Vec::new(),
            extends: 0,
            floor: None,
            lingering: None,
        };
        let mut due = entry.next_due(sent_at, sent_at);
        // A grant a release handed over on a provisional lease (counted as granted a
        // whole lease before that lease's end, so due at once by the rule above) is
        // renewed a third into what is left of it, as any lease: a hold released
        // before then (a hand-over's common case) sends no renewal at all. With a
        // transition window it is renewed at once (it is suspended at the end of its
        // own lease, which a third of the whole lease's rest may pass), and so is a
        // grant whose answer took over a third of its lease.
        // (The clock is read only then: not on the uncontended hot path.)
        if renew && provisional && transition.is_zero() {
            let now = Instant::now();
            if due < now {
                due =
                    (now + lost_at.saturating_duration_since(now) / 3).min(cap.unwrap_or(lost_at));
            }
        }
        if watch.lease.is_some() {
            entry.publish();
        }
        let mut state = self.shared.lock();
        if state.closed {
            return;
        }
        state.entries.insert(id, Entry { due, ..entry });
        state.queue.insert((due, id));
        self.look_at(&mut state, due);
    }

    /// Has the scheduler look at the queues by `at`: starts it, or wakes it if it
    /// sleeps past `at` (one due later costs no wake-up: it looks by itself).
    fn look_at(&self, state: &mut State, at: Instant) {
        if state.task.is_none() {
            let shared = Arc::clone(&self.shared);
            state.task = Some(tokio::spawn(run(shared)));
        } else if state.sleeping_until.is_none_or(|until| at < until) {
            self.shared.wake.notify_one();
        }
    }

    /// Renews the hold `id` now for `lease` (its own lease; the transition window is
    /// added), and asks for `lease` in its later renewals too. The renewal is sent by
    /// the scheduler, after any renewal of the hold already in flight; the receiver
    /// hears how it went. `None` when the hold is no longer watched or is past its
    /// loss instant or cap (it is lost, or about to be).
    pub(crate) fn extend(&self, id: u64, lease: Duration) -> Option<oneshot::Receiver<Result<()>>> {
        let now = Instant::now();
        let mut state = self.shared.lock();
        let entry = state.entries.get_mut(&id)?;
        if now >= entry.lost_at || entry.cap.is_some_and(|cap| now >= cap) {
            return None;
        }
        let lease = lease.saturating_add(entry.transition);
        entry.extends += 1;
        if lease < entry.lease {
            // The store may apply the shorter lease whatever happens to its answer:
            // from now on the hold is guaranteed only that long.
            let bound = now + lease - self.shared.margin(lease);
            let bound = entry.floor.map_or(bound, |(_, old)| old.min(bound));
            entry.floor = Some((entry.extends, bound));
            entry.lost_at = entry.lost_at.min(bound);
            entry.publish();
        }
        entry.lease = lease;
        let (tx, rx) = oneshot::channel();
        entry.pending.push(tx);
        if !entry.in_flight {
            let old = entry.due;
            entry.due = now;
            state.queue.remove(&(old, id));
            state.queue.insert((now, id));
            self.shared.wake.notify_one();
        }
        Some(rx)
    }

    /// A renewal sent at `sent` outside the scheduler succeeded (a leader
    /// proclaiming): counts as the hold's latest renewal.
    pub(crate) fn renewed(&self, id: u64, sent: Instant) {
        let mut state = self.shared.lock();
        let Some(entry) = state.entries.get_mut(&id) else {
            return;
        };
        if entry.in_flight
            || entry.floor.is_some()
            || entry.lingering.is_some()
            || !entry.pending.is_empty()
            || Instant::now() >= entry.lost_at
        {
            // The scheduler's own renewal settles it; a hold past its loss instant
            // is not revived.
            return;
        }
        let lost_at = sent + entry.lease - self.shared.margin(entry.lease);
        if lost_at <= entry.lost_at {
            return;
        }
        entry.lost_at = lost_at;
        entry.publish();
        self.shared
            .suspend(&entry.hold, sent, entry.lease, entry.transition);
        let old = entry.due;
        let due = entry.next_due(sent, Instant::now());
        entry.due = due;
        state.queue.remove(&(old, id));
        state.queue.insert((due, id));
    }

    /// Starts `work` for the hold `id` at `at` (in a task of its own, on the
    /// scheduler's runtime), unless the hold is unregistered first — then it is
    /// dropped unstarted. The scheduler wakes by itself at least every
    /// [`IDLE_HORIZON`]: work due no sooner than its next wake costs no wake-up now,
    /// so a hold released before its work is due costs no task, and — when `at` is
    /// at least [`IDLE_HORIZON`] away (a SQL session mode's probe with the default
    /// 10 s session timeout: 2 s) — no cross-thread wake either (a session-bound
    /// hold's status feed that is quiet for a while,
    /// [`dlock_spi::HoldFeed::quiet_for`]).
    pub(crate) fn defer(&self, id: u64, at: Instant, work: Deferred) {
        let mut state = self.shared.lock();
        if state.closed {
            return;
        }
        // (Work replaced or dropped goes after the lock: dropping it may drop a
        // hold, whose own drop must not find the scheduler's lock taken.)
        let replaced = state.deferred.insert(id, (at, work));
        if let Some((old, _)) = &replaced {
            state.deferred_queue.remove(&(*old, id));
        }
        state.deferred_queue.insert((at, id));
        self.look_at(&mut state, at);
        drop(state);
        drop(replaced);
    }

    /// Stops watching a hold (it is being released), and drops its deferred work.
    pub(crate) fn unregister(&self, id: u64) {
        let mut state = self.shared.lock();
        if let Some(entry) = state.entries.remove(&id) {
            state.queue.remove(&(entry.due, id));
        }
        let dropped = state.deferred.remove(&id);
        if let Some((at, _)) = &dropped {
            state.deferred_queue.remove(&(*at, id));
        }
        drop(state);
        drop(dropped);
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
        let deferred = std::mem::take(&mut state.deferred);
        state.deferred_queue.clear();
        if let Some(task) = state.task.take() {
            task.abort();
        }
        drop(state);
        drop(deferred);
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A hold taken off the queue: renewed, or lost.
struct Due {
    renewal: Renewal,
    hold: Arc<Hold>,
    transition: Duration,
    /// When the renewal must have answered (the loss instant, or the cap if sooner).
    lost_at: Instant,
    cap: Option<Instant>,
    renew: bool,
}

/// One renewal as it was asked for — what its answer is judged by.
struct Renewal {
    id: u64,
    /// When it was taken off the queue: no later than it is sent, so the lease
    /// counted from it is conservative.
    sent: Instant,
    /// The lease it asks for.
    lease: Duration,
    /// The hold's extend count when it was taken: the extends it carries.
    extends: u64,
    /// Those extends' callers.
    waiters: Vec<ExtendWaiter>,
}

/// A renewal's answer: `None` when it could not finish before the loss instant.
struct RenewOutcome {
    renewal: Renewal,
    result: Option<Result<RenewResult>>,
}

async fn run(shared: Arc<Shared>) {
    let batches = shared.chain.batches_renewals();
    let mut in_flight: JoinSet<Vec<RenewOutcome>> = JoinSet::new();
    // Which holds each renewal task renews, so a task that panics (a handler's
    // hook) still settles its holds: as lost, never stuck in flight.
    let mut tasks: HashMap<tokio::task::Id, Vec<u64>> = HashMap::new();
    loop {
        let now = Instant::now();
        let (due, next, started) = take_due(&shared, now, batches);
        for work in started {
            tokio::spawn(work);
        }
        let mut renewals = Vec::new();
        for d in due {
            let id = d.renewal.id;
            // Lost from outside the watchdog (an upgrade whose read was lost): not
            // renewed, given back.
            if d.hold.lost_reason().is_some() {
                give_back(&shared, id);
                continue;
            }
            if d.cap.is_some_and(|cap| now >= cap) {
                lose(&shared, id, LostReason::MaxHold);
                continue;
            }
            // An extend renews a hold the watchdog does not otherwise renew.
            if now >= d.lost_at || (!d.renew && d.renewal.waiters.is_empty()) {
                lose(&shared, id, LostReason::LeaseExpired);
                continue;
            }
            renewals.push(d);
        }
        // Renewals on schedule go together; one whose hold is short of time (a retry,
        // the last before a cap) goes alone, so it cannot cut a batch short.
        let (together, alone): (Vec<Due>, Vec<Due>) = if batches {
            renewals
                .into_iter()
                .partition(|d| on_schedule(d.lost_at, d.renewal.lease, now))
        } else {
            (Vec::new(), renewals)
        };
        let alone = if together.len() > 1 {
            let ids = together.iter().map(|d| d.renewal.id).collect();
            let task = in_flight.spawn(renew_together(shared.chain.clone(), together));
            tasks.insert(task.id(), ids);
            alone
        } else {
            together.into_iter().chain(alone).collect()
        };
        for d in alone {
            let id = d.renewal.id;
            let chain = shared.chain.clone();
            let req = d.request();
            let (renewal, lost_at) = (d.renewal, d.lost_at);
            let task = in_flight.spawn(async move {
                // A renewal that cannot finish before the loss instant is a loss.
                let result = tokio::time::timeout_at(lost_at.into(), chain.renew(&req))
                    .await
                    .ok();
                vec![RenewOutcome { renewal, result }]
            });
            tasks.insert(task.id(), vec![id]);
        }
        let sleep_until = next;
        tokio::select! {
            _ = tokio::time::sleep_until(sleep_until.into()) => {}
            _ = shared.wake.notified() => {}
            Some(joined) = in_flight.join_next_with_id(), if !in_flight.is_empty() => {
                match joined {
                    Ok((task, outcomes)) => {
                        tasks.remove(&task);
                        for outcome in outcomes {
                            settle(&shared, outcome);
                        }
                    }
                    Err(err) => {
                        let ids = tasks.remove(&err.id()).unwrap_or_default();
                        tracing::error!(error = %err, holds = ids.len(), "dlock: a renewal task failed; its holds count as lost");
                        for id in ids {
                            lose(&shared, id, LostReason::LeaseExpired);
                        }
                    }
                }
            }
        }
    }
}

/// Sends `renewals` as one batch (the backend's [`dlock_spi::BatchRenew`]). The batch
/// is cut off at its earliest loss instant: a hold past its own then is lost; the
/// others' renewals count as failed with their outcome unknown, and are retried.
async fn renew_together(chain: HandlerChain, renewals: Vec<Due>) -> Vec<RenewOutcome> {
    let reqs: Vec<RenewRequest> = renewals.iter().map(Due::request).collect();
    let earliest = renewals.iter().map(|d| d.lost_at).min();
    let answers = match earliest {
        Some(at) => tokio::time::timeout_at(at.into(), chain.renew_batch(&reqs))
            .await
            .ok(),
        None => None,
    };
    let now = Instant::now();
    let mut answers = answers.map(Vec::into_iter);
    let backend = chain.resource().backend_name();
    renewals
        .into_iter()
        .zip(reqs)
        .map(|(d, req)| {
            let result = match answers.as_mut() {
                Some(answers) => answers.next(),
                None if now >= d.lost_at => None,
                None => Some(Err(Error::new(
                    dlock_spi::ErrorKind::Timeout,
                    "a batch of renewals was not answered before the loss instant of one of its holds; renewing again",
                )
                .locate(backend, "renew", &req.name))),
            };
            RenewOutcome {
                renewal: d.renewal,
                result,
            }
        })
        .collect()
}

/// Whether a hold renewed now for `lease` has at least half of it left before its
/// loss instant (or cap), `lost_at`: a renewal on schedule, fit to go in a batch
/// (which its earliest member's loss instant cuts short).
fn on_schedule(lost_at: Instant, lease: Duration, now: Instant) -> bool {
    lost_at >= now + lease / 2
}

/// How much earlier than due a renewal may be sent to join a batch: a tenth of the
/// hold's renewal interval. Holds renewed in one batch are due together again, so
/// batches, once formed, last.
fn batch_ahead(entry: &Entry) -> Duration {
    entry.counted(entry.lease).saturating_sub(entry.transition) / 30
}

/// The furthest [`batch_ahead`] looks.
const MAX_BATCH_AHEAD: Duration = Duration::from_secs(2);

/// Pops every due entry that is not already being renewed — with `batches`, when
/// any is due, also the renewed ones due within their [`batch_ahead`] — and decides
/// (under the same lock `register` takes) when the scheduler wakes next.
/// Takes off the queues what is due at `now` — renewals (with the renewals a batch
/// may take early) and deferred work — and says when the scheduler looks next.
fn take_due(shared: &Shared, now: Instant, batches: bool) -> (Vec<Due>, Instant, Vec<Deferred>) {
    let mut state = shared.lock();
    let mut started = Vec::new();
    while let Some(&(at, id)) = state.deferred_queue.first() {
        if at > now {
            break;
        }
        state.deferred_queue.pop_first();
        if let Some((_, work)) = state.deferred.remove(&id) {
            started.push(work);
        }
    }
    let mut due = Vec::new();
    while let Some(&(at, id)) = state.queue.first() {
        if at > now {
            break;
        }
        state.queue.pop_first();
        if let Some(entry) = state.entries.get_mut(&id) {
            if entry.due == at && !entry.in_flight {
                due.push(Due::take(id, entry, now));
            }
        }
    }
    if batches && !due.is_empty() {
        let early: Vec<(Instant, u64)> = state
            .queue
            .range(..(now + MAX_BATCH_AHEAD, u64::MAX))
            .filter(|(at, id)| {
                state.entries.get(id).is_some_and(|e| {
                    e.renew
                        && e.due == *at
                        && !e.in_flight
                        && *at <= now + batch_ahead(e)
                        && on_schedule(
                            e.cap.map_or(e.lost_at, |cap| cap.min(e.lost_at)),
                            e.lease,
                            now,
                        )
                })
            })
            .copied()
            .collect();
        for (at, id) in early {
            state.queue.remove(&(at, id));
            if let Some(entry) = state.entries.get_mut(&id) {
                due.push(Due::take(id, entry, now));
            }
        }
    }
    let next = [state.queue.first(), state.deferred_queue.first()]
        .into_iter()
        .flatten()
        .map(|(at, _)| *at)
        .fold(now + IDLE_HORIZON, Instant::min);
    state.sleeping_until = Some(next);
    (due, next, started)
}

impl Due {
    /// Takes `entry` off for a renewal sent now (marks it in flight).
    fn take(id: u64, entry: &mut Entry, now: Instant) -> Due {
        entry.in_flight = true;
        Due {
            renewal: Renewal {
                id,
                sent: now,
                lease: entry.lease,
                extends: entry.extends,
                waiters: std::mem::take(&mut entry.pending),
            },
            hold: Arc::clone(&entry.hold),
            transition: entry.transition,
            // A renewal in flight at the cap ends there.
            lost_at: entry
                .cap
                .map_or(entry.lost_at, |cap| cap.min(entry.lost_at)),
            cap: entry.cap,
            renew: entry.renew,
        }
    }

    /// The renewal request it sends.
    fn request(&self) -> RenewRequest {
        RenewRequest::new(
            self.hold.name.clone(),
            self.hold.owner.clone(),
            self.hold.grant,
            self.hold.mode,
            self.renewal.lease,
            self.hold.token,
        )
        .with_transition(self.transition)
    }
}

/// Applies a renewal's answer: reschedule, retry, or declare the hold lost; tells
/// the extends it carried how it went (dropped unanswered when the hold is lost).
fn settle(shared: &Shared, outcome: RenewOutcome) {
    let RenewOutcome {
        renewal:
            Renewal {
                id,
                sent,
                lease,
                extends,
                waiters,
            },
        result,
    } = outcome;
    let now = Instant::now();
    let reason = {
        let mut state = shared.lock();
        let Some(entry) = state.entries.get_mut(&id) else {
            return; // released meanwhile
        };
        entry.in_flight = false;
        let next = match result {
            _ if entry.cap.is_some_and(|cap| now >= cap) => Err(LostReason::MaxHold),
            // An answer after the loss instant (lowered by an extend meanwhile) does
            // not revive the hold: its guards may have been told it is over.
            _ if now >= entry.lost_at => Err(LostReason::LeaseExpired),
            Some(Ok(RenewResult::Renewed { .. })) => {
                shared.observe_round_trip(now.saturating_duration_since(sent));
                let counted = entry.counted(lease);
                let mut lost_at = sent + counted - shared.margin(counted);
                match entry.floor {
                    // Taken before the shortening extend: it did not carry it.
                    Some((set_by, bound)) if extends < set_by => lost_at = lost_at.min(bound),
                    _ => entry.floor = None,
                }
                if now >= lost_at {
                    // Renewed, but the answer came too late to count.
                    Err(LostReason::LeaseExpired)
                } else {
                    entry.lost_at = lost_at;
                    entry.publish();
                    shared.suspend(&entry.hold, sent, counted, entry.transition);
                    for waiter in waiters {
                        let _ = waiter.send(Ok(()));
                    }
                    Ok(entry.next_due(sent, now))
                }
            }
            Some(Ok(RenewResult::NotOwner)) => Err(LostReason::NotOwner),
            Some(Err(err)) if !is_final(&err) => {
                // The store may yet apply it, after any later renewal.
                entry.lingering = Some(entry.lingering.map_or(lease, |l| l.min(lease)));
                for waiter in waiters {
                    let _ = waiter.send(Err(err.duplicate()));
                }
                // A renewed hold retries, as does one with extends waiting; one with
                // a fixed lease otherwise keeps its end.
                let retry = if entry.renew || !entry.pending.is_empty() {
                    let own = entry.counted(entry.lease).saturating_sub(entry.transition);
                    (now + retry_delay(own)).min(entry.lost_at)
                } else {
                    entry.lost_at
                };
                Ok(entry.cap.map_or(retry, |cap| retry.min(cap)))
            }
            Some(Err(_)) | None => Err(LostReason::LeaseExpired),
        };
        match next {
            Ok(due) => {
                entry.due = due;
                // Due at once (an extend waits): the scheduler's next turn sends it.
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
    let Some(entry) = take_entry(shared, id) else {
        return;
    };
    if entry.hold.lose(&shared.chain, reason) && reason == LostReason::MaxHold {
        // Bounded: give it back rather than let the store keep it for the rest of
        // its lease (or, session-bound, for as long as the session lives). The
        // guard's own release later answers `NotOwner`, harmlessly.
        release_in_background(shared, entry.hold);
    }
}

/// Stops watching a hold lost from outside the watchdog and gives it back (the
/// store would keep it, renewed, until its guard goes).
fn give_back(shared: &Shared, id: u64) {
    if let Some(entry) = take_entry(shared, id) {
        release_in_background(shared, entry.hold);
    }
}

fn take_entry(shared: &Shared, id: u64) -> Option<Entry> {
    let mut state = shared.lock();
    let entry = state.entries.remove(&id);
    if let Some(e) = &entry {
        state.queue.remove(&(e.due, id));
    }
    entry
}

fn release_in_background(shared: &Shared, hold: Arc<Hold>) {
    let chain = shared.chain.clone();
    tokio::spawn(async move {
        let ctx = hold.release_context(&chain);
        if let Err(err) = chain.release(&ctx).await {
            tracing::warn!(lock = %hold.name, error = &err as &dyn std::error::Error, "dlock: giving back a lost hold failed; it ends with its lease or session");
        }
    });
}
