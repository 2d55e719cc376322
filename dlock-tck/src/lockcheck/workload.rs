//! One worker's workload: a few managers, a few tasks each, looping over a seeded
//! random mix of lock operations on a small set of names until the deadline, logging
//! every step and writing to the fenced register inside every critical section.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use dlock_api::{
    Capabilities, DistributeLock, DistributeLockManager, Election, Leadership, LockGuard,
    LostReason, ReadWriteLock, Semaphore, SemaphorePermit,
};
use dlock_spi::{
    AcquireChain, AcquireContext, AcquireResult, LockHandler, LockName, LostEvent, ReleaseChain,
    ReleaseContext, ReleaseResult, RenewEvent, RenewResult,
};
use tokio::task::JoinSet;

use crate::TestBackend;

use super::history::{instant_ns, now_ns, EventLog, How, Kind, Mode, Op, Outcome, RegOp, Why};
use super::register::RegisterClient;

/// The lease of locks taken without an explicit one (renewed by the watchdog every
/// lease/3). Short, so expiry paths are exercised within short runs.
pub const LEASE: Duration = Duration::from_secs(2);
/// [`LEASE`] in milliseconds, as the log records leases.
const LEASE_MS: u64 = LEASE.as_millis() as u64;
/// Explicit leases are drawn from this range (ms).
pub const EXPLICIT_LEASE_MS: std::ops::RangeInclusive<u64> = 1000..=3000;
/// The longest lease any hold of a run has (ms).
pub const MAX_LEASE_MS: u64 = {
    let explicit = *EXPLICIT_LEASE_MS.end();
    let watchdog = LEASE_MS;
    if explicit > watchdog {
        explicit
    } else {
        watchdog
    }
};
/// Exclusive, non-fair lock names.
pub const EXCLUSIVE_NAMES: [&str; 3] = ["x0", "x1", "x2"];
/// The exclusive name whose handle the tasks of a manager share (clones re-enter).
pub const SHARED_HANDLE_NAME: &str = "x2";
/// The fair lock's name (when the backend has fair locks).
pub const FAIR_NAME: &str = "f0";
/// The read-write lock's name (when the backend has shared locks).
pub const RW_NAME: &str = "rw0";
/// How often (%) a task takes two exclusive names with one multi-lock.
const MULTI_PERCENT: u32 = 8;
/// The lock of the read-write lock's upgradeable side (`RW_NAME` and
/// `dlock_api::UPGRADEABLE_SUFFIX`).
pub const RW_UPGRADEABLE_NAME: &str = "rw0::upgradeable";
/// How often (%) a task takes the read-write lock's upgradeable side (on backends
/// with cross-mode holds).
const UPGRADEABLE_PERCENT: u32 = 6;
/// How often (%) an upgradeable read tries to upgrade.
const UPGRADE_PERCENT: u32 = 60;
/// How often (%) a write of the read-write lock ends by a downgrade to a read (on
/// backends with cross-mode holds).
const DOWNGRADE_PERCENT: u32 = 30;
/// How long after its deadline a worker's tasks may take to finish.
const TASK_GRACE: Duration = Duration::from_secs(20);
/// Bound on one backend call the workload means to complete beyond its own wait
/// (`unlock()`, `try_lock(wait)` past its wait, closing the managers).
const CALL_BOUND: Duration = Duration::from_secs(10);
/// How long after its deadline a worker may take to finish: its tasks, then closing
/// its managers, plus a process's start and exit. The one bound the coordinator
/// waits for workers with.
pub const EXIT_GRACE: Duration = TASK_GRACE
    .saturating_add(CALL_BOUND)
    .saturating_add(Duration::from_secs(5));
/// Bound on a task's iterations (the deadline normally ends it first).
const MAX_ITERATIONS: u32 = 1_000_000;

/// How often the stall watcher's timer is due.
const STALL_TICK: Duration = Duration::from_millis(5);
/// How late a timer must fire to count as a stall: the lost signal leaves 10 ms for
/// timer delay, so a process whose timers fire later than that may hear of a loss
/// too late — as a paused one.
pub const STALL_LATE_NS: u64 = 10_000_000;

/// Logs every stall of this process (a timer firing more than [`STALL_LATE_NS`]
/// late) until `until`: evidence of whether the process's timers kept time, which
/// the watchdog's lost signal relies on.
async fn watch_stalls(log: EventLog, until: Instant) {
    let tick = u64::try_from(STALL_TICK.as_nanos()).unwrap_or(u64::MAX);
    while Instant::now() < until {
        let due = now_ns() + tick;
        tokio::time::sleep(STALL_TICK).await;
        let woke = now_ns();
        if woke > due + STALL_LATE_NS {
            log.log(Kind::Stall { from: due });
        }
    }
}

/// How long a worker keeps trying to connect: a replacement worker may start while
/// the server is down (the `restart` nemesis), as a service may start during an
/// outage. Longer than any outage a nemesis makes.
const OPEN_BOUND: Duration = Duration::from_secs(30);
/// The pause between two tries to connect.
const OPEN_PAUSE: Duration = Duration::from_millis(200);

/// Runs `open` (each try bounded by `CALL_BOUND`) until it succeeds, a try every
/// `OPEN_PAUSE`, for at most `OPEN_BOUND`; the last error if it never does.
pub async fn keep_trying<T, Fut>(mut open: impl FnMut() -> Fut) -> Result<T, String>
where
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let until = Instant::now() + OPEN_BOUND;
    loop {
        let error = match tokio::time::timeout(CALL_BOUND, open()).await {
            Ok(Ok(opened)) => return Ok(opened),
            Ok(Err(e)) => e,
            Err(_) => format!("no answer within {CALL_BOUND:?}"),
        };
        if Instant::now() + OPEN_PAUSE >= until {
            return Err(format!("{error} (kept trying for {OPEN_BOUND:?})"));
        }
        tokio::time::sleep(OPEN_PAUSE).await;
    }
}

/// The election every run holds (a term is an exclusive hold of this name).
pub const ELECTION_NAME: &str = "e0";

/// The semaphore runs on backends with semaphores hold (1 or 2 permits at a time).
pub const SEMAPHORE_NAME: &str = "s0";

/// The semaphore's total permits.
pub const SEMAPHORE_PERMITS: u32 = 3;

/// Every lock name a run on a backend with `caps` uses.
pub fn lock_names(caps: Capabilities) -> Vec<&'static str> {
    let mut names = EXCLUSIVE_NAMES.to_vec();
    names.push(ELECTION_NAME);
    if caps.fair {
        names.push(FAIR_NAME);
    }
    if caps.shared {
        names.push(RW_NAME);
    }
    if caps.semaphore {
        names.push(SEMAPHORE_NAME);
    }
    names
}

/// The names a task draws its next lock from: [`lock_names`], with the election
/// drawn three times as often and the semaphore twice. Every run must show a term
/// and a permit (the live runs fail without), and under the kill nemesis on a
/// loaded machine a run may grant only some 30 holds in all (processes replaced
/// every second, the dead's terms held for their lease, their queued campaigns
/// for their liveness): with an even draw over 7 names the election got none in
/// about one kill run of fifty (seen on MariaDB over TLS and a ZooKeeper
/// ensemble).
fn drawn_names(caps: Capabilities) -> Vec<&'static str> {
    let mut names = lock_names(caps);
    names.extend([ELECTION_NAME, ELECTION_NAME]);
    if caps.semaphore {
        names.push(SEMAPHORE_NAME);
    }
    names
}

/// Every lock name whose state a run on a backend with `caps` may leave: those it
/// locks, and the upgradeable side's own lock.
pub fn state_names(caps: Capabilities) -> Vec<&'static str> {
    let mut names = lock_names(caps);
    if caps.shared && caps.upgrade {
        names.push(RW_UPGRADEABLE_NAME);
    }
    names
}

/// What one worker (process or in-process virtual process) does.
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    /// Process number (1-based; 0 is the coordinator).
    pub proc_: u32,
    /// Seed of this worker's random choices.
    pub seed: u64,
    /// How long it keeps taking locks.
    pub duration: Duration,
    /// The run's namespace, shared by all its workers.
    pub namespace: String,
    /// The fenced register.
    pub register: SocketAddr,
}

/// Runs a worker to completion: opens its managers, runs its tasks until the
/// deadline, closes the managers. Errors: a client that cannot be opened, a register
/// that cannot be reached, a task that did not finish, an event log that failed.
pub async fn run_worker(
    spec: WorkerSpec,
    backend: Arc<dyn TestBackend>,
    log: EventLog,
) -> Result<(), String> {
    let p = spec.proc_;
    log.log(Kind::Start);
    let base = Instant::now();
    let deadline = base + spec.duration;
    let mut rng = fastrand::Rng::with_seed(spec.seed);
    let attempts = Arc::new(AtomicU64::new(0));
    let mut managers = Vec::new();
    for m in 0..rng.usize(2..=3) {
        let client = keep_trying(|| async { backend.client().await.map_err(|e| e.to_string()) })
            .await
            .map_err(|e| format!("process {p}: cannot open backend client {m}: {e}"))?;
        let manager = DistributeLockManager::builder(client)
            .lease(LEASE)
            .namespace(spec.namespace.clone())
            .with_handler(HoldLog {
                log: log.clone(),
                namespace: spec.namespace.clone(),
            })
            .build()
            .map_err(|e| format!("process {p}: cannot build manager {m}: {e}"))?;
        managers.push(manager);
    }
    let mut tasks = JoinSet::new();
    for (m, manager) in managers.iter().enumerate() {
        let shared = manager.lock(SHARED_HANDLE_NAME);
        let caps = manager.capabilities();
        let names = drawn_names(caps);
        for t in 0..rng.usize(3..=4) {
            let register = RegisterClient::connect(spec.register)
                .await
                .map_err(|e| format!("process {p}: cannot reach the register: {e}"))?;
            let task = Task {
                client: format!("p{p}.m{m}.t{t}"),
                shared_id: format!("p{p}.m{m}.shared.{SHARED_HANDLE_NAME}"),
                shared: shared.clone(),
                names: names.clone(),
                leases: caps.lease,
                cross_mode: caps.cross_mode,
                upgrades: caps.upgrade,
                fair: caps.fair,
                manager: manager.clone(),
                own: HashMap::new(),
                rw: None,
                register,
                log: log.clone(),
                rng: fastrand::Rng::with_seed(rng.u64(..)),
                deadline,
                base,
                attempts: Arc::clone(&attempts),
            };
            tasks.spawn(task.run());
        }
    }
    let mut errors = Vec::new();
    let bound = deadline + TASK_GRACE;
    let stalls = tokio::spawn(watch_stalls(log.clone(), bound));
    loop {
        match tokio::time::timeout_at(bound.into(), tasks.join_next()).await {
            Ok(Some(Ok(Ok(())))) => {}
            Ok(Some(Ok(Err(e)))) => errors.push(e),
            Ok(Some(Err(e))) => errors.push(format!("process {p}: a task failed: {e}")),
            Ok(None) => break,
            Err(_) => {
                errors.push(format!(
                    "process {p}: {} task(s) still running {TASK_GRACE:?} after the deadline",
                    tasks.len()
                ));
                tasks.abort_all();
                break;
            }
        }
    }
    stalls.abort();
    let mut closing = JoinSet::new();
    for manager in managers {
        closing.spawn(async move { manager.close().await });
    }
    let all_closed = async { while closing.join_next().await.is_some() {} };
    if tokio::time::timeout(CALL_BOUND, all_closed).await.is_err() {
        errors.push(format!(
            "process {p}: closing the managers took over {CALL_BOUND:?}"
        ));
    }
    log.log(Kind::Exit);
    if let Some(e) = log.error() {
        errors.push(format!("process {p}: {e}"));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// A register call failed: the run cannot go on (its history would be incomplete).
fn reg_err(client: &str, e: std::io::Error) -> String {
    format!("{client}: register: {e}")
}

/// Logs what the manager tells its handlers about holds: every successful watchdog
/// renewal, with its send time (the store's word that the hold is alive: the checker
/// counts the hold's lease from then), and every lost signal, at the instant the
/// manager sets it.
struct HoldLog {
    log: EventLog,
    namespace: String,
}

#[async_trait]
impl LockHandler for HoldLog {
    async fn acquire(
        &self,
        ctx: &AcquireContext,
        next: AcquireChain<'_>,
    ) -> dlock_spi::Result<AcquireResult> {
        next.invoke(ctx).await
    }

    async fn release(
        &self,
        ctx: &ReleaseContext,
        next: ReleaseChain<'_>,
    ) -> dlock_spi::Result<ReleaseResult> {
        next.invoke(ctx).await
    }

    fn on_renew(&self, event: &RenewEvent<'_>) {
        if let Ok(RenewResult::Renewed { .. }) = event.outcome {
            let took = u64::try_from(event.elapsed.as_nanos()).unwrap_or(u64::MAX);
            self.log.log_at(
                now_ns().saturating_sub(took),
                Kind::Renewed {
                    lock: self.lock(&event.request.name),
                    token: event.request.token.get(),
                },
            );
        }
    }

    fn on_lost(&self, event: &LostEvent<'_>) {
        self.log.log(Kind::Lost {
            lock: self.lock(event.name),
            token: event.token.get(),
            reason: event.reason.into(),
        });
    }
}

impl HoldLog {
    /// A full lock name without the run's namespace.
    fn lock(&self, name: &LockName) -> String {
        let name = name.as_str();
        name.strip_prefix(&self.namespace)
            .unwrap_or(name)
            .to_owned()
    }
}

/// A `try_*` call's answer: its hold, or why there is none (`Hung` when it did not
/// answer within `hung`).
async fn tried<T>(
    hung: Duration,
    call: impl std::future::Future<Output = dlock_api::Result<Option<T>>>,
) -> Result<T, Why> {
    answer(
        tokio::time::timeout(hung, call)
            .await
            .map_err(|_| Why::Hung)?,
    )
}

/// A waiting call's answer: its hold, or why there is none (`Timeout` when it did
/// not get one within `wait`).
async fn waited<T>(
    wait: Duration,
    call: impl std::future::Future<Output = dlock_api::Result<T>>,
) -> Result<T, Why> {
    answer(
        tokio::time::timeout(wait, call)
            .await
            .map_err(|_| Why::Timeout)?
            .map(Some),
    )
}

/// How a release call within `bound` ended (`Cancelled`: dropped at the bound).
async fn outcome(
    bound: Duration,
    call: impl std::future::Future<Output = dlock_api::Result<()>>,
) -> Outcome {
    match tokio::time::timeout(bound, call).await {
        Ok(Ok(())) => Outcome::Ok,
        Ok(Err(e)) => Outcome::Error(e.kind().as_str().to_owned()),
        Err(_) => Outcome::Cancelled,
    }
}

fn answer<T>(result: dlock_api::Result<Option<T>>) -> Result<T, Why> {
    match result {
        Ok(Some(held)) => Ok(held),
        Ok(None) => Err(Why::None),
        Err(e) => Err(failed_with(&e)),
    }
}

/// How many failed calls a worker describes on its stderr (kept with the history).
const DESCRIBED_ERRORS: u64 = 20;

/// A failed call's `Why`; the first [`DESCRIBED_ERRORS`] are also described on
/// stderr, for the one reading a kept history (the history keeps only the kind).
fn failed_with(e: &dlock_api::Error) -> Why {
    static DESCRIBED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    if DESCRIBED.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < DESCRIBED_ERRORS {
        eprintln!("lockcheck worker: a call failed: {e:#}");
    }
    Why::Error(e.kind().as_str().to_owned())
}

/// What a task locks next.
#[derive(Clone)]
struct Target {
    lock: &'static str,
    mode: Mode,
    fair: bool,
    handle: DistributeLock,
    /// Set for the election: terms are campaigned for through it (`handle` unused).
    election: Option<Election>,
    /// Set for the semaphore: permits are taken through it (`handle` unused).
    semaphore: Option<Semaphore>,
    handle_id: String,
    /// Whose holds its grants are (a read-write lock's sides share one).
    owner: String,
    /// A read-write lock's write side that may end by a downgrade.
    downgrades: bool,
}

/// A granted hold: a lock guard, a term of leadership or semaphore permits.
enum Held {
    Guard(LockGuard),
    Term(Leadership),
    Permit(SemaphorePermit),
}

/// `$held.$call`, whichever hold it is.
macro_rules! each_hold {
    ($held:expr, $h:ident => $call:expr) => {
        match $held {
            Held::Guard($h) => $call,
            Held::Term($h) => $call,
            Held::Permit($h) => $call,
        }
    };
}

/// What the log records of a granted hold, whichever kind.
trait Granted {
    fn token(&self) -> u64;
    fn granted_at(&self) -> Instant;
    fn was_lost(&self) -> bool;
}

impl Granted for Held {
    fn token(&self) -> u64 {
        self.fencing_token()
    }

    fn granted_at(&self) -> Instant {
        self.acquired_at()
    }

    fn was_lost(&self) -> bool {
        self.is_lost()
    }
}

impl Granted for LockGuard {
    fn token(&self) -> u64 {
        self.fencing_token().get()
    }

    fn granted_at(&self) -> Instant {
        self.acquired_at()
    }

    fn was_lost(&self) -> bool {
        self.is_lost()
    }
}

impl Held {
    fn fencing_token(&self) -> u64 {
        each_hold!(self, h => h.fencing_token().get())
    }

    fn acquired_at(&self) -> Instant {
        each_hold!(self, h => h.acquired_at())
    }

    fn is_lost(&self) -> bool {
        each_hold!(self, h => h.is_lost())
    }

    async fn lost(&self) -> LostReason {
        each_hold!(self, h => h.lost().await)
    }

    /// `unlock` / `resign` / `release`.
    async fn release(self) -> dlock_api::Result<()> {
        match self {
            Held::Guard(g) => g.unlock().await,
            Held::Term(t) => t.resign().await,
            Held::Permit(p) => p.release().await,
        }
    }
}

struct Task {
    client: String,
    shared_id: String,
    shared: DistributeLock,
    /// The names this task draws its locks from (`drawn_names` of its manager's
    /// capabilities).
    names: Vec<&'static str>,
    /// Whether the backend takes explicit leases (ZooKeeper ties holds to the
    /// session and refuses them: no such op is sent there).
    leases: bool,
    /// Whether the backend lets one owner hold both modes (downgrades).
    cross_mode: bool,
    /// Whether it upgrades a read in place (upgradeable reads).
    upgrades: bool,
    /// Whether it has fair locks: elections campaign in arrival order only then
    /// (the session modes' waits are the server's, in no promised order).
    fair: bool,
    manager: DistributeLockManager,
    own: HashMap<&'static str, DistributeLock>,
    rw: Option<ReadWriteLock>,
    register: RegisterClient,
    log: EventLog,
    rng: fastrand::Rng,
    deadline: Instant,
    base: Instant,
    attempts: Arc<AtomicU64>,
}

impl Task {
    async fn run(mut self) -> Result<(), String> {
        let mut sticky: Option<Target> = None;
        for _ in 0..MAX_ITERATIONS {
            if Instant::now() >= self.deadline {
                break;
            }
            let upgradeable = sticky.is_none()
                && self.upgrades
                && self.names.contains(&RW_NAME)
                && self.rng.u32(0..100) < UPGRADEABLE_PERCENT;
            let multi = sticky.is_none() && self.rng.u32(0..100) < MULTI_PERCENT;
            let target = match sticky.take() {
                Some(t) => t,
                None => self.choose(),
            };
            let released_by_drop = if upgradeable {
                self.upgradeable_attempt().await?;
                None
            } else if multi {
                self.multi_attempt().await?;
                None
            } else {
                self.attempt(&target).await?
            };
            // The ordinary loop: release, then lock again at once with the same handle.
            let again = match released_by_drop {
                Some(true) => self.rng.u32(0..100) < 70,
                Some(false) => self.rng.bool(),
                None => false,
            };
            if again {
                sticky = Some(target);
                continue;
            }
            if self.rng.u32(0..100) >= 30 {
                tokio::time::sleep(Duration::from_millis(self.rng.u64(1..=10))).await;
            }
        }
        Ok(())
    }

    fn choose(&mut self) -> Target {
        let lock = self.names[self.rng.usize(..self.names.len())];
        if lock == RW_NAME {
            let manager = &self.manager;
            let rw = self
                .rw
                .get_or_insert_with(|| manager.read_write_lock(RW_NAME))
                .clone();
            let read = self.rng.u32(0..100) < 60;
            return if read {
                self.rw_side(&rw, Mode::Shared)
            } else {
                self.rw_side(&rw, Mode::Exclusive)
            };
        }
        if lock == SHARED_HANDLE_NAME && self.rng.bool() {
            return Target {
                lock,
                mode: Mode::Exclusive,
                fair: false,
                handle: self.shared.clone(),
                election: None,
                semaphore: None,
                handle_id: self.shared_id.clone(),
                owner: self.shared_id.clone(),
                downgrades: false,
            };
        }
        if lock == SEMAPHORE_NAME {
            let semaphore = self.manager.semaphore(SEMAPHORE_NAME, SEMAPHORE_PERMITS);
            let mode = if self.rng.u32(0..100) < 70 {
                Mode::Permit1
            } else {
                Mode::Permit2
            };
            // Every acquisition is a new holder.
            let handle_id = format!("{}.{lock}.p{:x}", self.client, self.rng.u64(..));
            return Target {
                lock,
                mode,
                fair: true,
                handle: self.shared.clone(),
                election: None,
                semaphore: Some(semaphore),
                owner: handle_id.clone(),
                handle_id,
                downgrades: false,
            };
        }
        if lock == ELECTION_NAME {
            let election = self.manager.election(ELECTION_NAME);
            // Every campaign is a new candidate (owner).
            let handle_id = format!("{}.{lock}.c{:x}", self.client, self.rng.u64(..));
            return Target {
                lock,
                mode: Mode::Exclusive,
                fair: self.fair,
                handle: self.shared.clone(),
                election: Some(election),
                semaphore: None,
                owner: handle_id.clone(),
                handle_id,
                downgrades: false,
            };
        }
        let fair = lock == FAIR_NAME;
        let manager = &self.manager;
        let handle = self
            .own
            .entry(lock)
            .or_insert_with(|| {
                if fair {
                    manager.fair_lock(lock)
                } else {
                    manager.lock(lock)
                }
            })
            .clone();
        let handle_id = format!("{}.{lock}", self.client);
        Target {
            lock,
            mode: Mode::Exclusive,
            fair,
            handle,
            election: None,
            semaphore: None,
            owner: handle_id.clone(),
            handle_id,
            downgrades: false,
        }
    }

    /// A side of the task's read-write lock: its read side (`Shared`) or its write
    /// side (which downgrades to the read side where the backend can), one owner.
    fn rw_side(&self, rw: &ReadWriteLock, mode: Mode) -> Target {
        let (handle, side) = match mode {
            Mode::Exclusive => (rw.write().clone(), "w"),
            _ => (rw.read().clone(), "r"),
        };
        Target {
            lock: RW_NAME,
            mode,
            fair: false,
            handle,
            election: None,
            semaphore: None,
            handle_id: format!("{}.{RW_NAME}.{side}", self.client),
            owner: format!("{}.{RW_NAME}", self.client),
            downgrades: mode == Mode::Exclusive && self.cross_mode,
        }
    }

    fn next_attempt(&self) -> u64 {
        self.attempts.fetch_add(1, Ordering::Relaxed)
    }

    fn hold_key_at(&self, target: &Target, acquired_at: Instant) -> String {
        let at = acquired_at.saturating_duration_since(self.base);
        format!("{}@{}", target.handle_id, at.as_nanos())
    }

    /// One acquire, and the critical section if it granted. Returns how the hold was
    /// released (`Some(true)`: dropped), `None` when nothing was granted.
    async fn attempt(&mut self, target: &Target) -> Result<Option<bool>, String> {
        let remaining = self.deadline.saturating_duration_since(Instant::now());
        let lease_ms = self.rng.u64(EXPLICIT_LEASE_MS);
        let explicit = self.leases
            && self.rng.bool()
            && target.election.is_none()
            && target.semaphore.is_none();
        let (op, wait) = match (self.rng.u32(0..100) < 60, explicit) {
            (true, false) => (Op::Try, Duration::from_millis(self.rng.u64(0..=300))),
            (true, true) => (Op::Lease, Duration::from_millis(self.rng.u64(0..=300))),
            (false, explicit) => {
                let wait = Duration::from_millis(self.rng.u64(200..=8000))
                    .min(remaining + Duration::from_millis(500));
                (if explicit { Op::LockLease } else { Op::Lock }, wait)
            }
        };
        let lease = Duration::from_millis(lease_ms);
        let cancel_after =
            (self.rng.u32(0..100) < 12).then(|| Duration::from_millis(self.rng.u64(0..=50)));
        let att = self.invoke(target, op, wait, cancel_after.is_some());
        let handle = &target.handle;
        let value = format!("{}#{att}", target.handle_id);
        let acquire = async {
            // A `try_*` call answers by its wait; one that does not is hung. A
            // waiting call is bounded by the wait the workload gives it.
            let hung = wait + CALL_BOUND;
            if let (Some(semaphore), Some(n)) = (&target.semaphore, target.mode.permits()) {
                return match op {
                    Op::Try => tried(hung, semaphore.try_acquire(n, wait)).await,
                    _ => waited(wait, semaphore.acquire(n)).await,
                }
                .map(Held::Permit);
            }
            if let Some(election) = &target.election {
                return match op {
                    Op::Try => tried(hung, election.try_campaign(value, wait)).await,
                    _ => waited(wait, election.campaign(value)).await,
                }
                .map(Held::Term);
            }
            match op {
                // `attempt` asks `try` of a single lock; a multi-lock is
                // `multi_attempt`, the read-write lock's other ways their own.
                Op::Try | Op::Multi | Op::Downgrade | Op::Upgradeable | Op::Upgrade => {
                    tried(hung, handle.try_lock(wait)).await
                }
                Op::Lease => {
                    tried(
                        hung,
                        handle.try_lock_with(wait, &dlock_api::LockOptions::new().lease(lease)),
                    )
                    .await
                }
                Op::Lock => waited(wait, handle.lock()).await,
                Op::LockLease | Op::Reenter => {
                    waited(
                        wait,
                        handle.lock_with(&dlock_api::LockOptions::new().lease(lease)),
                    )
                    .await
                }
            }
            .map(Held::Guard)
        };
        let got = match cancel_after {
            Some(after) => tokio::time::timeout(after, acquire)
                .await
                .unwrap_or(Err(Why::Cancel)),
            None => acquire.await,
        };
        match got {
            Ok(guard) => {
                let t_ok = now_ns();
                let lease_ms = if explicit { lease_ms } else { LEASE_MS };
                self.critical_section(target, guard, att, t_ok, lease_ms, explicit)
                    .await
                    .map(Some)
            }
            Err(why) => {
                self.log.log(Kind::Fail {
                    att,
                    lock: target.lock.to_owned(),
                    why,
                });
                Ok(None)
            }
        }
    }

    /// Logs the grant of `held` (any hold, or one hold of a composite guard);
    /// returns its hold key.
    fn log_ok(
        &self,
        target: &Target,
        held: &impl Granted,
        att: u64,
        t_ok: u64,
        lease_ms: u64,
    ) -> String {
        let hold = self.hold_key_at(target, held.granted_at());
        self.log.log_at(
            t_ok,
            Kind::Ok {
                att,
                lock: target.lock.to_owned(),
                mode: target.mode,
                token: held.token(),
                hold: hold.clone(),
                owner: target.owner.clone(),
                lease_ms,
                sent: instant_ns(held.granted_at()),
                lost: held.was_lost(),
            },
        );
        hold
    }

    /// Holds `guard`: register ENTER, fenced writes (reads for shared holds), a random
    /// hold time watching the lost signal, sometimes a reentrant acquire, EXIT, then a
    /// release by `unlock`, a cancelled `unlock` or `drop`. Returns true if dropped.
    async fn critical_section(
        &mut self,
        target: &Target,
        guard: Held,
        att: u64,
        t_ok: u64,
        lease_ms: u64,
        explicit: bool,
    ) -> Result<bool, String> {
        let hold = self.log_ok(target, &guard, att, t_ok, lease_ms);
        let token = guard.fencing_token();
        let lock = target.lock;

        self.register
            .enter(lock, token, &hold)
            .await
            .map_err(|e| reg_err(&self.client, e))?;
        self.fenced(target, &guard, &hold, token).await?;

        let remaining = self.deadline.saturating_duration_since(Instant::now());
        let hold_ms = match self.rng.u32(0..100) {
            0..=79 => self.rng.u64(0..=20),
            80..=91 => self.rng.u64(50..=600),
            _ if explicit => self.rng.u64(lease_ms / 2..=lease_ms * 3 / 2),
            _ => self.rng.u64(20..=200),
        };
        let hold_for = Duration::from_millis(hold_ms).min(remaining + Duration::from_millis(1000));
        let start = tokio::time::Instant::now();
        let end = start + hold_for;
        // Hold until the end, stopping at once if the lost signal fires; 15 % of
        // holds re-enter halfway.
        let mut lost = false;
        if self.rng.u32(0..100) < 15 {
            tokio::select! {
                _ = guard.lost() => lost = true,
                () = tokio::time::sleep_until(start + hold_for / 2) => {
                    match &guard {
                        Held::Guard(_) => self.reenter(target, lease_ms).await,
                        // A leader proclaims instead: a renewal that stores a value.
                        Held::Term(term) => {
                            let value = format!("{hold}+");
                            let _ = tokio::time::timeout(CALL_BOUND, term.proclaim(value)).await;
                        }
                        // Every acquisition of permits is its own holder: no reentry.
                        Held::Permit(_) => {}
                    }
                }
            }
        }
        if !lost {
            tokio::select! {
                _ = guard.lost() => {}
                () = tokio::time::sleep_until(end) => {}
            }
        }
        if !guard.is_lost() && self.rng.bool() {
            self.fenced(target, &guard, &hold, token).await?;
        }
        self.register
            .exit(lock, token, &hold)
            .await
            .map_err(|e| reg_err(&self.client, e))?;
        let downgrade = self.rw.clone().filter(|_| {
            target.downgrades && !guard.is_lost() && self.rng.u32(0..100) < DOWNGRADE_PERCENT
        });
        match (downgrade, guard) {
            (Some(rw), Held::Guard(write)) => {
                Box::pin(self.downgrade(target, &rw, write, &hold)).await
            }
            (_, guard) => Ok(self.release(target, guard, &hold).await),
        }
    }

    /// Ends a write hold of `rw` by `downgrade()`: its read side is
    /// taken beside it and the write guard let go (logged as dropped once the call
    /// returns); the read then has a critical section of its own. Returns true if
    /// the read was released by a drop.
    async fn downgrade(
        &mut self,
        target: &Target,
        rw: &ReadWriteLock,
        write: LockGuard,
        hold: &str,
    ) -> Result<bool, String> {
        let read = self.rw_side(rw, Mode::Shared);
        let att = self.invoke(&read, Op::Downgrade, Duration::ZERO, false);
        let result = tried(CALL_BOUND, async { write.downgrade().await.map(Some) }).await;
        // The write guard is gone, whatever the answer (dropped by the call or with it).
        self.log.log(Kind::Release {
            hold: hold.to_owned(),
            lock: target.lock.to_owned(),
            how: How::Drop,
        });
        match result {
            Ok(guard) => {
                let t_ok = now_ns();
                self.critical_section(&read, Held::Guard(guard), att, t_ok, LEASE_MS, false)
                    .await
            }
            Err(why) => {
                self.log.log(Kind::Fail {
                    att,
                    lock: target.lock.to_owned(),
                    why,
                });
                Ok(false)
            }
        }
    }

    /// A fenced write (exclusive holds) or read (shared holds), unless already lost.
    async fn fenced(
        &mut self,
        target: &Target,
        guard: &Held,
        hold: &str,
        token: u64,
    ) -> Result<(), String> {
        if guard.is_lost() {
            return Ok(());
        }
        let client = &self.client;
        match target.mode {
            Mode::Exclusive => self
                .register
                .write(target.lock, token, hold)
                .await
                .map(drop),
            Mode::Shared | Mode::Permit1 | Mode::Permit2 => {
                self.register.read(target.lock, token, hold).await.map(drop)
            }
        }
        .map_err(|e| reg_err(client, e))
    }

    /// Acquires again on the same handle while holding (a reentry: same hold, same
    /// token) and releases that acquisition.
    async fn reenter(&mut self, target: &Target, lease_ms: u64) {
        let att = self.invoke(target, Op::Reenter, Duration::ZERO, false);
        let reentry = tokio::time::timeout(CALL_BOUND, target.handle.try_lock(Duration::ZERO));
        let why = match reentry.await {
            Ok(Ok(Some(inner))) => {
                let inner = Held::Guard(inner);
                let hold = self.log_ok(target, &inner, att, now_ns(), lease_ms);
                self.release(target, inner, &hold).await;
                return;
            }
            Ok(Ok(None)) => Why::None,
            Ok(Err(e)) => failed_with(&e),
            Err(_) => Why::Hung,
        };
        self.log.log(Kind::Fail {
            att,
            lock: target.lock.to_owned(),
            why,
        });
    }

    /// Takes two of the exclusive names, given in random order, with one
    /// multi-lock (`try_lock(wait)`); logs an attempt per member, and for a grant
    /// runs each member's critical section side by side — register ENTER and
    /// fenced write per member, a hold watching any member's loss, EXIT — then
    /// releases the members one by one.
    async fn multi_attempt(&mut self) -> Result<(), String> {
        let mut names = EXCLUSIVE_NAMES;
        self.rng.shuffle(&mut names);
        let given = [names[0], names[1]];
        let multi = self.manager.multi_lock(given);
        // Members are taken in name order (one namespace: the short names' order).
        let mut sorted = given;
        sorted.sort_unstable();
        let id = format!("{}.m{:x}", self.client, self.rng.u64(..));
        let targets: Vec<Target> = sorted
            .iter()
            .zip(multi.members())
            .map(|(&lock, handle)| Target {
                lock,
                mode: Mode::Exclusive,
                fair: false,
                handle: handle.clone(),
                election: None,
                semaphore: None,
                handle_id: format!("{id}.{lock}"),
                owner: format!("{id}.{lock}"),
                downgrades: false,
            })
            .collect();
        // Waits long enough to be granted on the busy exclusive names now and then.
        let wait = Duration::from_millis(self.rng.u64(0..=1500));
        let atts = self.invoke_members(&targets, Op::Multi, wait);
        let guard = match tried(wait + CALL_BOUND, multi.try_lock(wait)).await {
            Ok(guard) => guard,
            Err(why) => {
                self.fail_members(&targets, &atts, &why);
                return Ok(());
            }
        };
        let t_ok = now_ns();
        let held: Vec<Held> = guard.into_guards().into_iter().map(Held::Guard).collect();
        let mut holds = Vec::with_capacity(held.len());
        for ((target, h), &att) in targets.iter().zip(&held).zip(&atts) {
            let hold = self.log_ok(target, h, att, t_ok, LEASE_MS);
            let token = h.fencing_token();
            self.register
                .enter(target.lock, token, &hold)
                .await
                .map_err(|e| reg_err(&self.client, e))?;
            self.fenced(target, h, &hold, token).await?;
            holds.push((hold, token));
        }
        let hold_for = Duration::from_millis(match self.rng.u32(0..100) {
            0..=79 => self.rng.u64(0..=20),
            _ => self.rng.u64(50..=400),
        });
        if let [first, second] = held.as_slice() {
            tokio::select! {
                _ = first.lost() => {}
                _ = second.lost() => {}
                () = tokio::time::sleep(hold_for) => {}
            }
        }
        for ((target, h), (hold, token)) in targets.iter().zip(&held).zip(&holds) {
            if !h.is_lost() && self.rng.bool() {
                self.fenced(target, h, hold, *token).await?;
            }
            self.register
                .exit(target.lock, *token, hold)
                .await
                .map_err(|e| reg_err(&self.client, e))?;
        }
        for ((target, h), (hold, _)) in targets.iter().zip(held).zip(&holds) {
            self.release(target, h, hold).await;
        }
        Ok(())
    }

    /// Takes the read-write lock's upgradeable side (`try_lock(wait)`), logged as its
    /// two holds (its own lock's, exclusive, and a read of the lock); for a grant,
    /// a critical section of both (register ENTER, a read and a write of the own
    /// lock), then — 60 % — `try_upgrade(wait)`, and for an upgrade the write's
    /// own critical section (ENTER, fenced writes, EXIT) ended by a `downgrade()`
    /// back to the upgradeable read; then EXIT and the release of both holds (by
    /// `unlock` or a drop).
    async fn upgradeable_attempt(&mut self) -> Result<(), String> {
        let manager = &self.manager;
        let rw = self
            .rw
            .get_or_insert_with(|| manager.read_write_lock(RW_NAME))
            .clone();
        let mut own = self.rw_side(&rw, Mode::Exclusive);
        own.lock = RW_UPGRADEABLE_NAME;
        own.handle_id = format!("{}.{RW_NAME}.u", self.client);
        let read = self.rw_side(&rw, Mode::Shared);
        let write = self.rw_side(&rw, Mode::Exclusive);
        let wait = Duration::from_millis(self.rng.u64(0..=1000));
        let members = [own, read];
        let atts = self.invoke_members(&members, Op::Upgradeable, wait);
        let mut guard = match tried(wait + CALL_BOUND, rw.upgradeable_read().try_lock(wait)).await {
            Ok(guard) => guard,
            Err(why) => {
                self.fail_members(&members, &atts, &why);
                return Ok(());
            }
        };
        let t_ok = now_ns();
        let [own, read] = &members;
        let own_hold = self.log_ok(own, guard.upgradeable(), atts[0], t_ok, LEASE_MS);
        let read_hold = self.log_ok(read, guard.read(), atts[1], t_ok, LEASE_MS);
        let own_token = guard.upgradeable().fencing_token().get();
        let read_token = guard.read().fencing_token().get();
        self.reg(RegOp::Enter, own.lock, own_token, &own_hold)
            .await?;
        self.reg(RegOp::Enter, read.lock, read_token, &read_hold)
            .await?;
        if !guard.is_lost() {
            self.reg(RegOp::Read, read.lock, read_token, &read_hold)
                .await?;
            self.reg(RegOp::Write, own.lock, own_token, &own_hold)
                .await?;
        }
        let hold_for = Duration::from_millis(self.rng.u64(0..=20));
        tokio::select! {
            _ = guard.lost() => {}
            () = tokio::time::sleep(hold_for) => {}
        }

        if !guard.is_lost() && self.rng.u32(0..100) < UPGRADE_PERCENT {
            let wait = Duration::from_millis(self.rng.u64(0..=800));
            let att = self.invoke(&write, Op::Upgrade, wait, false);
            let upgraded = tried(wait + CALL_BOUND, async {
                guard.try_upgrade(wait).await.map(|up| up.then_some(()))
            })
            .await;
            let t_ok = now_ns();
            match (upgraded, guard.write()) {
                (Ok(()), Some(w)) => {
                    let hold = self.log_ok(&write, w, att, t_ok, LEASE_MS);
                    let token = w.fencing_token().get();
                    self.reg(RegOp::Enter, write.lock, token, &hold).await?;
                    if !w.is_lost() {
                        self.reg(RegOp::Write, write.lock, token, &hold).await?;
                    }
                    let hold_for = Duration::from_millis(self.rng.u64(0..=20));
                    tokio::select! {
                        _ = guard.lost() => {}
                        () = tokio::time::sleep(hold_for) => {}
                    }
                    if guard.write().is_some_and(|w| !w.is_lost()) {
                        self.reg(RegOp::Write, write.lock, token, &hold).await?;
                    }
                    self.reg(RegOp::Exit, write.lock, token, &hold).await?;
                    self.log.log(Kind::Release {
                        hold: hold.clone(),
                        lock: write.lock.to_owned(),
                        how: How::Unlock,
                    });
                    let outcome = outcome(CALL_BOUND, guard.downgrade()).await;
                    self.log.log(Kind::Released {
                        hold,
                        lock: write.lock.to_owned(),
                        outcome,
                    });
                }
                (result, _) => {
                    let why = match result {
                        Err(why) => why,
                        // Answered "upgraded" without a write hold: not possible.
                        Ok(()) => Why::Error("unexpected".to_owned()),
                    };
                    self.log.log(Kind::Fail {
                        att,
                        lock: write.lock.to_owned(),
                        why,
                    });
                }
            }
        }
        self.reg(RegOp::Exit, read.lock, read_token, &read_hold)
            .await?;
        self.reg(RegOp::Exit, own.lock, own_token, &own_hold)
            .await?;
        let drop_it = self.rng.u32(0..100) < 40;
        let how = if drop_it { How::Drop } else { How::Unlock };
        for (target, hold) in [(read, &read_hold), (own, &own_hold)] {
            self.log.log(Kind::Release {
                hold: hold.clone(),
                lock: target.lock.to_owned(),
                how,
            });
        }
        if drop_it {
            drop(guard);
            return Ok(());
        }
        let outcome = outcome(CALL_BOUND, guard.unlock()).await;
        for (target, hold) in [(read, read_hold), (own, own_hold)] {
            self.log.log(Kind::Released {
                hold,
                lock: target.lock.to_owned(),
                outcome: outcome.clone(),
            });
        }
        Ok(())
    }

    /// Logs an invoke of `op` for each member of a composite acquire (a multi-lock,
    /// an upgradeable read), waiting `wait`; returns their attempt numbers.
    fn invoke_members(&self, members: &[Target], op: Op, wait: Duration) -> Vec<u64> {
        members
            .iter()
            .map(|target| self.invoke(target, op, wait, false))
            .collect()
    }

    /// Logs an invoke of `op` on `target`, waiting `wait` (`cancel`: wrapped in a
    /// short timeout); returns its attempt number.
    fn invoke(&self, target: &Target, op: Op, wait: Duration, cancel: bool) -> u64 {
        let att = self.next_attempt();
        self.log.log(Kind::Invoke {
            att,
            lock: target.lock.to_owned(),
            mode: target.mode,
            fair: target.fair,
            op,
            wait_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
            cancel,
        });
        att
    }

    /// Logs the refusal of a composite acquire for each member.
    fn fail_members(&self, members: &[Target], atts: &[u64], why: &Why) {
        for (target, &att) in members.iter().zip(atts) {
            self.log.log(Kind::Fail {
                att,
                lock: target.lock.to_owned(),
                why: why.clone(),
            });
        }
    }

    /// One register request of a critical section (a read's answer is not needed).
    async fn reg(&mut self, op: RegOp, lock: &str, token: u64, hold: &str) -> Result<(), String> {
        let register = &mut self.register;
        match op {
            RegOp::Enter => register.enter(lock, token, hold).await,
            RegOp::Exit => register.exit(lock, token, hold).await,
            RegOp::Write => register.write(lock, token, hold).await.map(drop),
            RegOp::Read => register.read(lock, token, hold).await.map(drop),
        }
        .map_err(|e| reg_err(&self.client, e))
    }

    /// Releases one acquisition: `unlock`, `unlock` cancelled after 0–2 ms, or `drop`.
    /// Returns true if dropped.
    async fn release(&mut self, target: &Target, guard: Held, hold: &str) -> bool {
        let how = match self.rng.u32(0..100) {
            0..=49 => How::Unlock,
            50..=64 => How::UnlockCancel,
            _ => How::Drop,
        };
        self.log.log(Kind::Release {
            hold: hold.to_owned(),
            lock: target.lock.to_owned(),
            how,
        });
        let bound = match how {
            How::Drop => {
                drop(guard);
                return true;
            }
            How::Unlock => CALL_BOUND,
            How::UnlockCancel => Duration::from_millis(self.rng.u64(0..=2)),
        };
        let outcome = outcome(bound, guard.release()).await;
        self.log.log(Kind::Released {
            hold: hold.to_owned(),
            lock: target.lock.to_owned(),
            outcome,
        });
        false
    }
}

/// What every worker of a run shares: the seed, the namespace, the register.
pub struct Plan {
    /// The run's seed (each worker's is this plus its number).
    pub seed: u64,
    /// The namespace every lock of the run carries.
    pub namespace: String,
    /// The fenced register's address.
    pub register: std::net::SocketAddr,
}

impl Plan {
    /// Worker `proc_`'s part of the run, for `duration`.
    pub fn spec(&self, proc_: u32, duration: Duration) -> WorkerSpec {
        WorkerSpec {
            proc_,
            seed: self.seed.wrapping_add(u64::from(proc_)),
            duration,
            namespace: self.namespace.clone(),
            register: self.register,
        }
    }
}
