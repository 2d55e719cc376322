//! Leader election over any backend: etcd's `Election` shape ([`Election`]) and
//! Simba's contention service ([`Election::contend`]).
//!
//! A term of leadership is a fair, exclusive hold on the election's name whose context
//! bytes are the leader's value. So a term has everything a lock guard has — a
//! fencing token that grows from term to term, a lease renewed by the watchdog (or a
//! session), and the same lost signal with the same margin — and an election named
//! `x` is seen by `dlock status x` like the lock `x`: dlock's locks and terms of one
//! name exclude each other. (On ZooKeeper, Java clients must use the matching
//! Curator recipe: `LeaderLatch` for elections, `InterProcessMutex` for locks —
//! Curator's recipes order only their own nodes.) Observers follow terms: a plain
//! lock taken on an election's name is seen at the next re-read.

use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use dlock_spi::{
    async_trait, Backoff, ChangeFeed, Error, ErrorKind, Fairness, FencingToken, HoldPurpose,
    HolderInfo, LockMode, LockName, LostReason, OwnerId, Pacer, RenewRequest, RenewResult, Result,
};
use futures_util::FutureExt as _;
use tokio::sync::watch;

use crate::guard::{hold_accessors, LockGuard, LostSignal};
use crate::handle::HoldSpec;
use crate::lock::DistributeLock;
use crate::manager::DistributeLockManager;

/// How often [`LeaderObserver`] asks the backend who leads when the backend cannot
/// push changes, by default.
pub const DEFAULT_OBSERVE_INTERVAL: Duration = Duration::from_millis(100);

/// With a change feed, an observer still re-reads this often (a missed ping costs
/// at most this long), and retries a feed it could not open.
const FEED_SAFETY_NET: Duration = Duration::from_secs(5);

/// How long a stopped contender's work may take to end on its own, by default.
pub const DEFAULT_STOP_GRACE: Duration = Duration::from_secs(10);

/// One election: a name that at most one candidate leads at a time.
///
/// Cheap to clone. Each [`campaign`](Self::campaign) is a new candidate (its own
/// owner), queued in arrival order behind the candidates already waiting.
///
/// ```
/// # async fn demo() -> dlock_api::Result<()> {
/// use dlock_api::DistributeLockManager;
///
/// let manager = DistributeLockManager::connect("memory://").await?;
/// let election = manager.election("scheduler");
/// let leadership = election.campaign("node-a:8080").await?;
/// assert_eq!(election.leader().await?.map(|l| l.value), Some("node-a:8080".into()));
/// leadership.proclaim("node-a:9090").await?;
/// leadership.resign().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Election {
    manager: DistributeLockManager,
    /// The full name, checked once.
    full_name: Arc<Result<LockName>>,
    observe_interval: Duration,
    stop_grace: Duration,
    transition: Duration,
}

impl Election {
    pub(crate) fn new(manager: DistributeLockManager, name: impl fmt::Display) -> Self {
        Election {
            full_name: Arc::new(manager.inner.full_name(name)),
            manager,
            observe_interval: DEFAULT_OBSERVE_INTERVAL,
            stop_grace: DEFAULT_STOP_GRACE,
            transition: Duration::ZERO,
        }
    }

    /// A transition window after each term's own lease (Simba's `transition_at`;
    /// default none): a leader whose renewals stop is *suspended* once its own lease
    /// has passed ([`Leadership::is_suspended`] — stop acting as leader) and may
    /// still renew and carry on with the same term during the window; nobody else
    /// can lead before the window ends, when the term is lost. On SQL the row
    /// records both instants (`ttl_at`, `expires_at`) by the database clock, and
    /// [`Leader::in_transition`] shows a leader in its window. No effect on
    /// session-bound backends (ZooKeeper).
    pub fn transition(mut self, window: Duration) -> Self {
        self.transition = window;
        self
    }

    /// How often observers ask the backend who leads when it cannot push changes
    /// (default 100 ms). Backends with change feeds (memory, PostgreSQL, Redis with
    /// pub/sub, ZooKeeper, etcd) tell observers instead.
    pub fn observe_interval(mut self, interval: Duration) -> Self {
        self.observe_interval = interval.max(Duration::from_millis(1));
        self
    }

    /// How long a contender's work may take to end after
    /// [`Contention::stop`] asks it to (default 10 s); then it is dropped.
    pub fn stop_grace(mut self, grace: Duration) -> Self {
        self.stop_grace = grace;
        self
    }

    /// The election's full (namespaced) name, or why it is invalid.
    pub fn name(&self) -> Result<&LockName> {
        self.full_name.as_ref().as_ref().map_err(Error::duplicate)
    }

    fn candidate(&self, value: Bytes) -> DistributeLock {
        let inner = &self.manager.inner;
        // Arrival order where the backend offers it: no candidate waits forever.
        let fairness = if inner.capabilities.fair {
            Fairness::Fair
        } else {
            Fairness::NonFair
        };
        DistributeLock::with_spec(
            Arc::clone(inner),
            self.name().cloned(),
            LockMode::Exclusive,
            fairness,
            HoldSpec {
                context: value,
                purpose: HoldPurpose::Leadership,
                transition: self.transition,
                capacity: 0,
                max_hold: None,
            },
        )
    }

    fn term(&self, guard: LockGuard, value: Bytes) -> Leadership {
        Leadership::new(guard, value, self.transition)
    }

    /// Waits until this new candidate leads, with `value` as the leader's value
    /// (shown by [`leader`](Self::leader) and to observers). Fails with
    /// [`ErrorKind::Closed`] when the manager closes.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped while waiting, the candidate leaves the queue; dropped
    /// after the backend may have granted the term, the term is given back in the
    /// background. Nothing is left queued or held.
    pub async fn campaign(&self, value: impl Into<Bytes>) -> Result<Leadership> {
        let value = value.into();
        let guard = self.candidate(value.clone()).lock().await?;
        Ok(self.term(guard, value))
    }

    /// Like [`campaign`](Self::campaign), giving up after `wait` (`Ok(None)`).
    ///
    /// # Cancel safety
    ///
    /// As [`campaign`](Self::campaign).
    pub async fn try_campaign(
        &self,
        value: impl Into<Bytes>,
        wait: Duration,
    ) -> Result<Option<Leadership>> {
        let value = value.into();
        let guard = self.candidate(value.clone()).try_lock(wait).await?;
        Ok(guard.map(|g| self.term(g, value)))
    }

    /// Who leads now, straight from the backend; `None` when nobody does.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        let state = self.manager.inner.chain.inspect(self.name()?).await?;
        Ok(state.and_then(|s| {
            s.holders
                .into_iter()
                .find(|h| h.mode == LockMode::Exclusive)
                .map(Leader::from_holder)
        }))
    }

    /// Follows the leadership: [`LeaderObserver::changed`] answers the current leader
    /// at once, then each change (a new term, a proclaimed value, no leader) in order.
    pub fn observe(&self) -> LeaderObserver {
        LeaderObserver {
            election: self.clone(),
            reported: None,
            highest: None,
            feed: Feed::Untried,
        }
    }

    /// Keeps `contender` in the running for this leadership, with `value` as its
    /// leader value: whenever it wins a term, [`Contender::on_acquired`] runs the
    /// leader's work; when the term ends, [`Contender::on_released`] follows, then
    /// the leadership is given back, and the contender queues again — until
    /// [`Contention::stop`].
    ///
    /// Errors: the name is invalid, or there is no tokio runtime to run it in.
    pub fn contend<C: Contender>(
        &self,
        value: impl Into<Bytes>,
        contender: C,
    ) -> Result<Contention> {
        self.name()?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            Error::new(
                ErrorKind::Config,
                "contend needs a tokio runtime to run the contender in; call it from async code",
            )
        })?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let (leading_tx, leading_rx) = watch::channel(None);
        let task = runtime.spawn(contend_loop(
            self.clone(),
            value.into(),
            Arc::new(contender),
            stop_rx,
            leading_tx,
        ));
        Ok(Contention {
            stop: stop_tx,
            leading: leading_rx,
            task: Some(task),
        })
    }
}

impl fmt::Debug for Election {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Election")
            .field("name", &self.name().ok())
            .field("observe_interval", &self.observe_interval)
            .finish()
    }
}

/// The leader of an election as the backend describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The leading candidate.
    pub owner: OwnerId,
    /// The term's fencing token: it grows with every new term.
    pub token: FencingToken,
    /// The leader's value (given to `campaign`, changed by `proclaim`).
    pub value: Bytes,
    /// Lease left by the backend's clock (to the end of a transition window, if
    /// any); `None` for session-bound terms.
    pub remaining_lease: Option<Duration>,
    /// The leader's own lease left before its transition window, where the backend
    /// records it (SQL); `None` otherwise.
    pub remaining_ttl: Option<Duration>,
}

impl Leader {
    fn from_holder(h: HolderInfo) -> Self {
        Leader {
            owner: h.owner,
            token: h.token,
            value: h.context,
            remaining_lease: h.remaining_lease,
            remaining_ttl: h.remaining_ttl,
        }
    }

    /// Whether the leader is in its transition window by the backend's clock (its own
    /// lease passed, the term not yet over): it should not be acting, and nobody else
    /// leads yet. Always false where the backend does not record it.
    pub fn in_transition(&self) -> bool {
        self.remaining_ttl.is_some_and(|ttl| ttl.is_zero())
    }
}

/// Follows an election's leadership; from [`Election::observe`].
pub struct LeaderObserver {
    election: Election,
    /// What was last answered: `None` before the first answer.
    reported: Option<Option<(FencingToken, Bytes)>>,
    /// The highest term seen: an older one read later (a lagging replica) is ignored.
    highest: Option<FencingToken>,
    /// How the observer learns of changes.
    feed: Feed,
}

/// An observer's way of learning of changes.
enum Feed {
    /// Not tried yet.
    Untried,
    /// The backend's change feed for the election.
    Open(ChangeFeed),
    /// The backend has none: poll.
    Polling,
    /// Opening it failed (or it ended): poll, and try again then.
    RetryAt(Instant),
}

impl LeaderObserver {
    /// The first call answers who leads now; each later call waits for the next
    /// change and answers it: a new leader (a higher term), a value the leader
    /// proclaimed, or `None` when nobody leads. Terms never go backwards. Changes
    /// closer together than the observe interval may be seen as one (the latest) —
    /// as with etcd's `Election.Observe`, which posts the most recent leader, not
    /// necessarily every one in between.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a dropped call reports nothing and loses nothing; the next call
    /// compares with the last state it answered.
    pub async fn changed(&mut self) -> Result<Option<Leader>> {
        loop {
            // Followed before reading: a change after the read wakes the wait below.
            self.follow().await;
            let now = self.election.leader().await?;
            if self.is_news(now.as_ref()) {
                if let Some(l) = &now {
                    self.highest = Some(self.highest.map_or(l.token, |h| h.max(l.token)));
                }
                self.reported = Some(now.as_ref().map(|l| (l.token, l.value.clone())));
                return Ok(now);
            }
            self.wait(now.as_ref()).await;
        }
    }

    /// Opens the backend's change feed if it has one and none is open.
    async fn follow(&mut self) {
        match self.feed {
            Feed::Untried => {}
            Feed::RetryAt(at) if Instant::now() >= at => {}
            Feed::Open(_) | Feed::Polling | Feed::RetryAt(_) => return,
        }
        let resource = self.election.manager.inner.chain.resource();
        let (Some(events), Ok(name)) = (resource.events(), self.election.name()) else {
            self.feed = Feed::Polling;
            return;
        };
        let limit = self.election.manager.inner.chain.operation_timeout();
        self.feed = match tokio::time::timeout(limit, events.follow(name)).await {
            Ok(Ok(feed)) => Feed::Open(feed),
            Ok(Err(err)) => {
                tracing::debug!(election = %name, error = &err as &dyn std::error::Error, "dlock: cannot follow the election; polling");
                Feed::RetryAt(Instant::now() + FEED_SAFETY_NET)
            }
            Err(_) => Feed::RetryAt(Instant::now() + FEED_SAFETY_NET),
        };
    }

    /// Waits until a re-read is due: a ping of the feed, the current leader's lease
    /// running out (a lapse no store reports), or — without a feed — the interval.
    async fn wait(&mut self, current: Option<&Leader>) {
        let Feed::Open(feed) = &mut self.feed else {
            tokio::time::sleep(self.election.observe_interval).await;
            return;
        };
        let lease_end = current
            .and_then(|l| l.remaining_lease)
            .map(|left| left + Duration::from_millis(5));
        let limit = lease_end.map_or(FEED_SAFETY_NET, |d| d.min(FEED_SAFETY_NET));
        tokio::select! {
            live = feed.changed() => {
                if !live {
                    self.feed = Feed::RetryAt(Instant::now() + FEED_SAFETY_NET);
                }
            }
            () = tokio::time::sleep(limit) => {}
        }
    }

    fn is_news(&self, now: Option<&Leader>) -> bool {
        let Some(reported) = &self.reported else {
            return true;
        };
        match (reported, now) {
            (_, Some(l)) if self.highest.is_some_and(|h| l.token < h) => false,
            (Some((token, value)), Some(l)) => l.token != *token || l.value != *value,
            (None, Some(_)) | (Some(_), None) => true,
            (None, None) => false,
        }
    }

    /// The changes as a `Stream` (each item as [`changed`](Self::changed) answers it;
    /// an error is an item too, and the stream goes on after it).
    pub fn into_stream(
        self,
    ) -> impl futures_core::Stream<Item = Result<Option<Leader>>> + Send + 'static {
        futures_util::stream::unfold(self, |mut observer| async move {
            let item = observer.changed().await;
            if item.is_err() {
                tokio::time::sleep(observer.election.observe_interval).await;
            }
            Some((item, observer))
        })
    }
}

impl fmt::Debug for LeaderObserver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaderObserver")
            .field("election", &self.election.name().ok())
            .field("highest", &self.highest)
            .finish()
    }
}

/// Leading an election: one term. Resign with [`resign`](Self::resign); dropping it
/// resigns in the background.
///
/// The term is lost exactly as a lock guard is ([`lost`](Self::lost), same margin):
/// stop acting as leader when it fires, and pass [`fencing_token`](Self::fencing_token)
/// to what the leader writes to.
#[must_use = "dropping the leadership resigns at once"]
pub struct Leadership {
    guard: LockGuard,
    value: Mutex<Bytes>,
    /// The election's transition window (the store's lease is the manager's plus it).
    transition: Duration,
}

impl Leadership {
    fn new(guard: LockGuard, value: Bytes, transition: Duration) -> Self {
        Leadership {
            guard,
            value: Mutex::new(value),
            transition,
        }
    }

    hold_accessors!("the term");

    /// The election's full name.
    pub fn name(&self) -> &LockName {
        self.guard.name()
    }

    /// This candidate's owner id (as [`Leader::owner`] shows it).
    pub fn owner(&self) -> &OwnerId {
        &self.guard.hold().owner
    }

    /// The value last proclaimed (or given to `campaign`).
    pub fn value(&self) -> Bytes {
        self.value
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Replaces the leader's value without giving up the term (etcd's `Proclaim`);
    /// observers see the new value.
    ///
    /// # Cancel safety
    ///
    /// Dropped before it completes, the store has either the old or the new value;
    /// the term itself is unaffected.
    ///
    /// Errors: [`ErrorKind::LockLost`] when the term is lost (found lost, or the
    /// backend says it is no longer the holder — the loss signal then fires);
    /// backend errors as they come (the value is then unknown).
    pub async fn proclaim(&self, value: impl Into<Bytes>) -> Result<()> {
        let value = value.into();
        let hold = self.guard.hold();
        let manager = self.guard.manager();
        if value.len() > dlock_spi::MAX_CONTEXT_LEN {
            return Err(Error::invalid_argument(format!(
                "the leader value is {} bytes; store at most {} (who leads and where to reach them, not a payload)",
                value.len(),
                dlock_spi::MAX_CONTEXT_LEN
            ))
            .with_context("lock", &hold.name));
        }
        if let Some(reason) = hold.lost_reason() {
            return Err(term_lost(&hold.name, reason));
        }
        let request = RenewRequest::new(
            hold.name.clone(),
            hold.owner.clone(),
            hold.grant,
            hold.mode,
            manager.config.lease.saturating_add(self.transition),
            hold.token,
        )
        .with_context(value.clone())
        .with_transition(self.transition);
        let sent = Instant::now();
        match manager.chain.renew(&request).await? {
            RenewResult::Renewed { .. } => {
                *self.value.lock().unwrap_or_else(PoisonError::into_inner) = value;
                // A renewal like the watchdog's: the term's lease runs from it.
                manager.watchdog.renewed(hold.id, sent);
                // Lost while the proclaim was in flight: the store's word came too
                // late to count (the lost signal never takes a loss back).
                if let Some(reason) = hold.lost_reason() {
                    return Err(term_lost(&hold.name, reason));
                }
                Ok(())
            }
            RenewResult::NotOwner => {
                hold.lose(&manager.chain, LostReason::NotOwner);
                Err(term_lost(&hold.name, LostReason::NotOwner))
            }
        }
    }

    /// Gives the leadership up; the next candidate in line is woken at once.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before it completes, the resignation goes on in the
    /// background.
    ///
    /// Errors as [`LockGuard::unlock`]: [`ErrorKind::LockLost`] if the term had been
    /// lost before.
    pub async fn resign(self) -> Result<()> {
        self.guard.unlock().await
    }
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("name", self.name())
            .field("token", &self.fencing_token())
            .field("lost", &self.lost_reason())
            .finish()
    }
}

fn term_lost(name: &LockName, reason: LostReason) -> Error {
    Error::new(
        ErrorKind::LockLost,
        format!("the leadership was lost ({reason}); campaign again to lead"),
    )
    .with_context("lock", name)
}

/// A term as a [`Contender`] sees it: who, which term, and the signals to stop on.
#[derive(Clone)]
pub struct Term {
    name: LockName,
    owner: OwnerId,
    token: FencingToken,
    value: Bytes,
    lost: LostSignal,
    step_down: watch::Receiver<bool>,
}

impl Term {
    /// The election's full name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// The contender's owner id.
    pub fn owner(&self) -> &OwnerId {
        &self.owner
    }

    /// The term's fencing token.
    pub fn fencing_token(&self) -> FencingToken {
        self.token
    }

    /// The leader value the contender campaigned with.
    pub fn value(&self) -> Bytes {
        self.value.clone()
    }

    /// Whether the term is lost.
    pub fn is_lost(&self) -> bool {
        self.lost.is_lost()
    }

    /// Whether the leader must pause its work: the connection is down
    /// (session-bound backends) or its own lease passed into the transition window.
    pub fn is_suspended(&self) -> bool {
        self.lost.is_suspended()
    }

    /// An owned signal of the term's loss, for another task.
    pub fn lost_signal(&self) -> LostSignal {
        self.lost.clone()
    }

    /// Completes when the contender should end its work: the contention is being
    /// stopped (the work has [`Election::stop_grace`] to return) or the term is over.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only waits.
    pub async fn stepping_down(&self) {
        let mut step_down = self.step_down.clone();
        let _ = step_down.wait_for(|s| *s).await;
    }
}

impl fmt::Debug for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Term")
            .field("name", &self.name)
            .field("owner", &self.owner)
            .field("token", &self.token)
            .finish()
    }
}

/// Why a contender's term ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TermEnd {
    /// `on_acquired` returned: the contender resigned and queued again.
    WorkDone,
    /// The contention was stopped: the work ended (or its grace ran out), then the
    /// contender resigned.
    Stopped,
    /// The term was lost; the work was dropped at once.
    Lost(LostReason),
}

/// The leader's side of a contention (Simba's `ContenderCallback`).
///
/// Called from a task of the contention's own, one term at a time: `on_released`
/// of a term always completes before the leadership is given back, and before the
/// next `on_acquired`.
#[async_trait]
pub trait Contender: Send + Sync + 'static {
    /// This contender leads: the leader's work, for as long as it runs.
    ///
    /// * Returning ends the term: the contender resigns and queues again.
    /// * If the term is lost, the future is dropped at once (at its next await).
    /// * If the contention is stopped, [`Term::stepping_down`] completes and the
    ///   future has the election's stop grace to return before it is dropped.
    ///
    /// The leadership is given back only after this future has ended, so the next
    /// leader's work never overlaps this one's in this process.
    async fn on_acquired(&self, term: Term);

    /// The term ended (after its work ended), before the leadership is given back.
    /// Bounded by the election's stop grace (the leadership is given back then
    /// regardless). A panic in either callback is logged and ends the term.
    async fn on_released(&self, term: Term, end: TermEnd) {
        let _ = (term, end);
    }
}

/// A contender kept in the running; from [`Election::contend`].
/// Dropping it stops the contention in the background (as [`stop`](Self::stop)).
pub struct Contention {
    stop: watch::Sender<bool>,
    leading: watch::Receiver<Option<FencingToken>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Contention {
    /// Whether the contender leads now.
    pub fn is_leader(&self) -> bool {
        self.leading.borrow().is_some()
    }

    /// The current term's fencing token while the contender leads.
    pub fn term(&self) -> Option<FencingToken> {
        *self.leading.borrow()
    }

    /// A receiver of the current term (`None` while not leading), to wait on.
    pub fn leading(&self) -> watch::Receiver<Option<FencingToken>> {
        self.leading.clone()
    }

    /// Leaves the race: if leading, asks the work to end
    /// ([`Term::stepping_down`]), waits for it (up to the stop grace), calls
    /// `on_released`, then resigns. Returns once all that is done.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before it completes, the stop goes on in the background.
    pub async fn stop(mut self) {
        self.stop.send_replace(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Contention {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

impl fmt::Debug for Contention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Contention")
            .field("term", &self.term())
            .finish()
    }
}

/// Pauses after failed campaigns in a row (backend unreachable): 100 ms doubling to
/// 2 s, jittered.
const CAMPAIGN_PAUSE: Backoff =
    Backoff::exponential(Duration::from_millis(100), Duration::from_secs(2));

/// Clears the contention's "leading" state when a term ends, however it ends.
struct NotLeading<'a>(&'a watch::Sender<Option<FencingToken>>);

impl Drop for NotLeading<'_> {
    fn drop(&mut self) {
        self.0.send_replace(None);
    }
}

async fn contend_loop(
    election: Election,
    value: Bytes,
    contender: Arc<dyn Contender>,
    mut stop: watch::Receiver<bool>,
    leading: watch::Sender<Option<FencingToken>>,
) {
    // Valid: `contend` checked it.
    let name = election
        .name()
        .map_or_else(|_| String::new(), |n| n.as_str().to_owned());
    let mut pacer = Pacer::new(CAMPAIGN_PAUSE);
    loop {
        let campaign = tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => return,
            c = election.campaign(value.clone()) => c,
        };
        let leadership = match campaign {
            Ok(l) => {
                pacer.reset();
                l
            }
            Err(err) if err.kind() == ErrorKind::Closed => return,
            Err(err) => {
                tracing::warn!(election = %name, error = &err as &dyn std::error::Error, "dlock: campaign failed; trying again");
                tokio::select! {
                    _ = stop.wait_for(|s| *s) => return,
                    () = pacer.pause() => continue,
                }
            }
        };
        let (step_down_tx, step_down_rx) = watch::channel(false);
        let term = Term {
            name: leadership.name().clone(),
            owner: leadership.owner().clone(),
            token: leadership.fencing_token(),
            value: leadership.value(),
            lost: leadership.lost_signal(),
            step_down: step_down_rx,
        };
        leading.send_replace(Some(term.token));
        // Not leading once the term is over, whatever ends it (a panic included).
        let _leading = NotLeading(&leading);
        let end = {
            // A panicking contender ends its term like one whose work returned.
            let work = AssertUnwindSafe(contender.on_acquired(term.clone())).catch_unwind();
            tokio::pin!(work);
            let end = tokio::select! {
                done = &mut work => {
                    if done.is_err() {
                        tracing::error!(election = %name, "dlock: the leader's work panicked; resigning");
                    }
                    TermEnd::WorkDone
                }
                reason = leadership.lost() => TermEnd::Lost(reason),
                _ = stop.wait_for(|s| *s) => TermEnd::Stopped,
            };
            if end == TermEnd::Stopped {
                step_down_tx.send_replace(true);
                tokio::select! {
                    _ = &mut work => {}
                    _ = leadership.lost() => {}
                    () = tokio::time::sleep(election.stop_grace) => {
                        tracing::warn!(election = %name, "dlock: the leader's work did not end within the stop grace; dropping it");
                    }
                }
            }
            end
            // The work future is dropped here: it has ended before anything below.
        };
        step_down_tx.send_replace(true);
        let released = AssertUnwindSafe(contender.on_released(term, end)).catch_unwind();
        match tokio::time::timeout(election.stop_grace, released).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => {
                tracing::error!(election = %name, "dlock: on_released panicked");
            }
            Err(_) => {
                tracing::warn!(election = %name, "dlock: on_released did not return within the stop grace; resigning anyway");
            }
        }
        leading.send_replace(None);
        if let TermEnd::Lost(_) = end {
            drop(leadership);
        } else if let Err(err) = leadership.resign().await {
            tracing::warn!(election = %name, error = &err as &dyn std::error::Error, "dlock: resigning failed");
        }
        if end == TermEnd::Stopped {
            return;
        }
    }
}

/// The manager's constructor of this primitive.
impl crate::DistributeLockManager {
    /// The election `name` (prefixed with the manager's namespace): campaign to lead
    /// it, see who leads, follow the changes. It shares its name with the lock
    /// `name` — `dlock status name` shows the leader.
    pub fn election(&self, name: impl fmt::Display) -> Election {
        Election::new(self.clone(), name)
    }
}
