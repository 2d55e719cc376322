//! Pieces the benchmark binaries share (`benches/*.rs`, run with `cargo bench`; under
//! `cargo test` they make a short smoke pass).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use dlock_spi::{
    AcquireChain, AcquireContext, AcquireRequest, AcquireResult, BatchRenew, Capabilities,
    LockAdmin, LockEvents, LockHandler, LockName, LockRemoteResource, LockState, ReleaseChain,
    ReleaseContext, ReleaseRequest, ReleaseResult, RenewEvent, RenewRequest, RenewResult,
};

/// Whether the binary runs as a real benchmark (`cargo bench` passes `--bench`)
/// rather than as a smoke test.
pub fn is_bench() -> bool {
    std::env::args().any(|a| a == "--bench")
}

/// Whether `label` is among the backends in `DLOCK_TEST_BACKENDS` (default: `label`
/// itself, so a bare `cargo bench --bench <name>` runs); says so when it is not.
pub fn backend_selected(label: &str, bench: &str) -> bool {
    let selected = std::env::var("DLOCK_TEST_BACKENDS").unwrap_or_else(|_| label.to_owned());
    let on = selected.split(',').any(|l| l.trim() == label);
    if !on {
        println!("{label} not selected in DLOCK_TEST_BACKENDS; not running the {bench} bench");
    }
    on
}

/// Runs `tasks` copies of `body(task_index, end)` until `end` (each returns how many
/// cycles it made); returns the total and the time taken.
pub async fn run_tasks<F, Fut>(tasks: usize, secs: Duration, body: F) -> (u64, Duration)
where
    F: Fn(usize, Instant) -> Fut,
    Fut: Future<Output = u64> + Send + 'static,
{
    let start = Instant::now();
    let end = start + secs;
    let handles: Vec<_> = (0..tasks).map(|i| tokio::spawn(body(i, end))).collect();
    let mut total = 0;
    for h in handles {
        total += h.await.expect("bench task");
    }
    (total, start.elapsed())
}

/// One round of an implementation under test: runs it for the given time and returns
/// (cycles, time taken).
pub type Round<'a> =
    Box<dyn FnMut(Duration) -> Pin<Box<dyn Future<Output = (u64, Duration)> + 'a>> + 'a>;

/// One implementation under test: its label, one round of it, and its rates so far.
pub struct Contestant<'a> {
    label: &'static str,
    round: Round<'a>,
    rates: Vec<f64>,
}

impl<'a> Contestant<'a> {
    /// The same implementation under another label.
    pub fn labelled(mut self, label: &'static str) -> Self {
        self.label = label;
        self
    }

    /// An implementation whose every round is `round`.
    pub fn new(label: &'static str, round: Round<'a>) -> Self {
        Contestant {
            label,
            round,
            rates: Vec::new(),
        }
    }

    /// An implementation whose round runs `tasks` copies of `body` (see [`run_tasks`]).
    pub fn tasks<F, Fut>(label: &'static str, tasks: usize, body: F) -> Self
    where
        F: Fn(usize, Instant) -> Fut + 'a,
        Fut: Future<Output = u64> + Send + 'static,
    {
        let body = std::sync::Arc::new(body);
        Self::new(
            label,
            Box::new(move |d| {
                let body = std::sync::Arc::clone(&body);
                Box::pin(async move { run_tasks(tasks, d, &*body).await })
            }),
        )
    }
}

/// A task body: runs `cycle` until `end` and returns how many it ran. The cycle takes
/// its state (connection, key, …) and hands it back, so no borrow crosses an await.
pub async fn cycles<S, F, Fut>(mut state: S, end: Instant, mut cycle: F) -> u64
where
    F: FnMut(S) -> Fut,
    Fut: Future<Output = S>,
{
    let mut n = 0;
    while Instant::now() < end {
        state = cycle(state).await;
        n += 1;
    }
    n
}

/// "dlock (user API)": task `i` cycles `manager`'s lock `name(i)` ([`api_cycle`]).
pub fn api_contestant<'a>(
    tasks: usize,
    manager: dlock_api::DistributeLockManager,
    name: impl Fn(usize) -> String + 'a,
) -> Contestant<'a> {
    Contestant::tasks("dlock (user API)", tasks, move |i, end| {
        cycles(manager.lock(name(i)), end, |lock| async move {
            api_cycle(&lock).await;
            lock
        })
    })
}

/// "dlock (SPI, backend only)": task `i` cycles `name(i)` on `backend` directly
/// ([`spi_cycle`]), as owner `bench:<i>`.
pub fn spi_contestant<'a>(
    tasks: usize,
    backend: std::sync::Arc<dyn dlock_spi::LockRemoteResource>,
    name: impl Fn(usize) -> String + 'a,
) -> Contestant<'a> {
    spi_contestant_as(
        "dlock (SPI, backend only)",
        tasks,
        backend,
        dlock_spi::LockMode::Exclusive,
        name,
    )
}

/// [`spi_contestant`] under `label`, its requests in `mode` (of 3 permits, for
/// permits).
pub fn spi_contestant_as<'a>(
    label: &'static str,
    tasks: usize,
    backend: std::sync::Arc<dyn dlock_spi::LockRemoteResource>,
    mode: dlock_spi::LockMode,
    name: impl Fn(usize) -> String + 'a,
) -> Contestant<'a> {
    Contestant::tasks(label, tasks, move |i, end| {
        let req = dlock_spi::AcquireRequest::new(
            dlock_spi::LockName::new(name(i)).expect("bench lock name"),
            dlock_spi::OwnerId::new(format!("bench:{i}")),
            dlock_spi::GrantId::new(1),
        )
        .with_mode(mode)
        .with_capacity(3);
        cycles(
            (std::sync::Arc::clone(&backend), req),
            end,
            |(backend, req)| async move {
                spi_cycle(&*backend, &req).await;
                (backend, req)
            },
        )
    })
}

/// Whether `label` is wanted: `DLOCK_BENCH_IMPL=floor,SPI` keeps only implementations
/// whose label contains one of the words (default: all).
fn impl_selected(label: &str) -> bool {
    match std::env::var("DLOCK_BENCH_IMPL") {
        Ok(list) if !list.is_empty() => list.split(',').any(|w| label.contains(w)),
        _ => true,
    }
}

/// The middle value (the mean of the two middle ones for an even count; 0 when empty).
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// Runs the selected contestants in interleaved, rotating rounds (a b c, b c a, c a b,
/// …) after a half-round warm-up each, and returns each one's label and the median of its
/// rounds' cycles/s. Interleaving exposes every implementation to the same drift
/// (a shared VM, a disk); the median ignores the odd round in which this VM's
/// scheduler happens to run client and server twice as fast (or half), which a
/// total would let dominate. `DLOCK_BENCH_VERBOSE=1` prints every round.
pub async fn interleaved(
    contestants: Vec<Contestant<'_>>,
    rounds: u32,
    per_round: Duration,
) -> Vec<(&'static str, f64)> {
    interleaved_rounds(contestants, rounds, per_round)
        .await
        .into_iter()
        .map(|(label, rates)| (label, median(rates)))
        .collect()
}

/// [`interleaved`], returning every round's cycles/s of each contestant (in round
/// order) instead of their median — for ratios judged round by round
/// ([`per_round_ratio`]).
pub async fn interleaved_rounds(
    mut contestants: Vec<Contestant<'_>>,
    rounds: u32,
    per_round: Duration,
) -> Vec<(&'static str, Vec<f64>)> {
    let verbose = std::env::var("DLOCK_BENCH_VERBOSE").is_ok();
    contestants.retain(|c| impl_selected(c.label));
    for c in contestants.iter_mut() {
        (c.round)(per_round / 2).await;
    }
    let n = contestants.len();
    for round in 0..rounds as usize {
        // Each round starts one further along, so no implementation always runs
        // right after the same other one (or first).
        for k in 0..n {
            let c = &mut contestants[(round + k) % n];
            let (cycles, took) = (c.round)(per_round).await;
            c.rates.push(cycles as f64 / took.as_secs_f64());
        }
        if verbose {
            let line: Vec<String> = contestants
                .iter()
                .filter_map(|c| c.rates.last().map(|r| format!("{r:>9.0}")))
                .collect();
            eprintln!("round:{}", line.concat());
        }
    }
    contestants
        .into_iter()
        .map(|c| (c.label, c.rates))
        .collect()
}

/// The median of `a ÷ b` taken round by round (rounds of [`interleaved_rounds`]): a
/// paired measure, which a slow spell of the machine moves less than the ratio of
/// the two columns' medians (both contestants of a round ran within seconds).
pub fn per_round_ratio(a: &[f64], b: &[f64]) -> f64 {
    median(a.iter().zip(b).map(|(a, b)| a / b).collect())
}

/// The runtime every bench runs on: 2 worker threads, as many as the machine's cores.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// One uncontended acquire + release through the user API (chain, guard, hold).
pub async fn api_cycle(lock: &dlock_api::DistributeLock) {
    let guard = lock
        .try_lock(Duration::ZERO)
        .await
        .expect("acquire")
        .expect("uncontended");
    guard.unlock().await.expect("release");
}

/// One uncontended acquire + release through the backend alone (no chain, no guard).
/// The grant — and the status feed a session-bound backend attaches to it — is kept
/// until the release, as a holder keeps it (dropping a ZooKeeper feed early would
/// cost a watch-removal request the user API never sends).
pub async fn spi_cycle(
    backend: &dyn dlock_spi::LockRemoteResource,
    req: &dlock_spi::AcquireRequest,
) {
    let grant = backend.try_acquire(req).await.expect("acquire");
    let token = grant.token().expect("uncontended");
    let release = dlock_spi::ReleaseRequest::new(
        req.name.clone(),
        req.owner.clone(),
        req.grant,
        req.mode,
        token,
    );
    backend.release(&release).await.expect("release");
    drop(grant);
}

/// Counts a manager's renewals that came back without an error (see [`Renewals`]).
#[derive(Debug, Default)]
pub struct RenewCounter(AtomicU64);

impl RenewCounter {
    /// The renewals counted so far.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A handler that passes every call on and counts, in its [`RenewCounter`], each
/// renewal the backend answered without an error (the watchdog's work, in batches or
/// not).
pub struct Renewals(pub Arc<RenewCounter>);

#[async_trait]
impl LockHandler for Renewals {
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
        if event.outcome.is_ok() {
            self.0 .0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A backend with its batches hidden: forwards every call to the backend it wraps,
/// but [`batch_renew`](LockRemoteResource::batch_renew) answers `None`, so the
/// watchdog sends one renewal per hold — the control for renewals in batches.
///
/// It wraps a shared backend, sized (`OneByOne::new(redis_backend)`) or not (an
/// `Arc<dyn LockRemoteResource>` from a test backend's `client()`).
pub struct OneByOne<B: ?Sized>(pub Arc<B>);

impl<B: LockRemoteResource> OneByOne<B> {
    /// Wraps `backend`.
    pub fn new(backend: B) -> Self {
        OneByOne(Arc::new(backend))
    }
}

impl<B: ?Sized> Clone for OneByOne<B> {
    fn clone(&self) -> Self {
        OneByOne(Arc::clone(&self.0))
    }
}

#[async_trait]
impl<B: LockRemoteResource + ?Sized> LockRemoteResource for OneByOne<B> {
    fn backend_name(&self) -> &'static str {
        self.0.backend_name()
    }
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }
    async fn try_acquire(&self, req: &AcquireRequest) -> dlock_spi::Result<AcquireResult> {
        self.0.try_acquire(req).await
    }
    async fn release(&self, req: &ReleaseRequest) -> dlock_spi::Result<ReleaseResult> {
        self.0.release(req).await
    }
    async fn renew(&self, req: &RenewRequest) -> dlock_spi::Result<RenewResult> {
        self.0.renew(req).await
    }
    async fn inspect(&self, name: &LockName) -> dlock_spi::Result<Option<LockState>> {
        self.0.inspect(name).await
    }
    fn admin(&self) -> Option<&dyn LockAdmin> {
        self.0.admin()
    }
    fn events(&self) -> Option<&dyn LockEvents> {
        self.0.events()
    }
    fn batch_renew(&self) -> Option<&dyn BatchRenew> {
        None
    }
}

/// User + system CPU seconds in `/proc/<pid>/stat` contents `stat` (fields 14 and 15,
/// in clock ticks of 1/100 s, Linux's usual `USER_HZ`), counted after the command
/// name, which may hold spaces and parentheses; 0 for what cannot be read.
fn stat_cpu_seconds(stat: &str) -> f64 {
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields.get(11).and_then(|u| u.parse().ok()).unwrap_or(0.0)
        + fields.get(12).and_then(|s| s.parse().ok()).unwrap_or(0.0);
    ticks / 100.0
}

/// CPU seconds (user + system) this process has used (0 off Linux).
pub fn cpu_seconds() -> f64 {
    stat_cpu_seconds(&std::fs::read_to_string("/proc/self/stat").unwrap_or_default())
}

/// CPU seconds (user + system) used so far by every process on this machine whose
/// command name (`comm`, in parentheses in `/proc/<pid>/stat`; at most 15 bytes) is
/// one of `comm_names` — a server's processes, e.g. `["postgres"]`, `["mariadbd",
/// "mysqld"]`, `["etcd"]`, `["redis-server"]`. Every such process counts, idle ones
/// of other servers too; processes this user cannot read (and exited ones) count 0.
/// Take the difference of two calls around a window.
pub fn server_cpu_seconds(comm_names: &[&str]) -> f64 {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    dir.filter_map(|entry| {
        let entry = entry.ok()?;
        let pid = entry.file_name();
        if !pid.to_str()?.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
        let comm = stat.split_once('(')?.1.rsplit_once(')')?.0;
        comm_names.contains(&comm).then(|| stat_cpu_seconds(&stat))
    })
    .sum()
}
