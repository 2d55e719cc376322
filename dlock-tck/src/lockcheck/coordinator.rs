//! The coordinator: opens the store, starts the register and the workers
//! (processes re-executing the current binary, or tasks for an in-process store),
//! runs the nemesis, waits for the workers, checks for leaks, gathers the
//! histories and runs the checker.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use dlock_api::{DistributeLockManager, LockState};
use tokio::task::JoinSet;

use crate::conformance::eventually;
use crate::proxy::proxy_every_host;
use crate::TestBackend;

use super::check::{check, Report, Rules};
use super::deployment::{Deployment, SERVER_FAULT_BOUND};
use super::history::{read_file, Event, EventLog, Kind, COORDINATOR};
use super::inject;
use super::nemesis::{Choice, Nemesis};
use super::procs::{self, Procs};
use super::register::Register;
use super::workload::{keep_trying, run_worker, state_names, Plan, WorkerSpec, EXIT_GRACE, LEASE};

/// Bound on opening the backend (one round trip included).
const CONNECT_BOUND: Duration = Duration::from_secs(20);
/// Bound on one leak-check call (a pass of `live_state`, one `inspect`).
const INSPECT_BOUND: Duration = Duration::from_secs(5);
/// Added to the store's quiescence for its own timers and clock.
const LEAK_SLACK: Duration = Duration::from_secs(2);

/// What to run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// How long the workload runs.
    pub duration: Duration,
    /// Seed of every random choice (workers get `seed + i`).
    pub seed: u64,
    /// Worker processes (or in-process virtual processes).
    pub processes: u32,
    /// Faults to inject.
    pub nemesis: Choice,
    /// Keep the history files.
    pub keep: bool,
    /// The binary re-executed for worker processes; `None`: this one
    /// (`std::env::current_exe`), whose `main` must call
    /// [`as_worker`](super::as_worker) first.
    pub worker_exe: Option<PathBuf>,
}

impl RunOptions {
    /// A run of `duration` with seed `seed`: 3 processes, the nemesis `nemesis`,
    /// histories not kept, workers re-executing this binary.
    pub fn new(duration: Duration, seed: u64, nemesis: Choice) -> Self {
        RunOptions {
            duration,
            seed,
            processes: 3,
            nemesis,
            keep: false,
            worker_exe: None,
        }
    }
}

/// A finished run.
#[derive(Debug)]
#[non_exhaustive]
pub struct RunOutcome {
    /// The checker's report.
    pub report: Report,
    /// Things worth telling (nemeses not applicable, workers killed, kept files).
    pub notes: Vec<String>,
    /// The run directory, when kept.
    pub kept: Option<PathBuf>,
    /// How many faults of each kind that applied were injected.
    pub injected: Vec<(Nemesis, u32)>,
    /// Whether the workload took the semaphore's permits (the store offers
    /// semaphores): a run that did should show permit grants.
    pub semaphores: bool,
}

/// The hidden `--worker` arguments of a worker process (the URL comes from
/// `DLOCK_LOCKCHECK_URL`).
#[derive(Debug, Clone)]
pub(crate) struct WorkerArgs {
    /// Backend label.
    pub label: String,
    /// Backend URL (the same for every worker of a run).
    pub url: String,
    /// Put a fault proxy in front of the URL's hosts and follow stdin commands.
    pub proxy: bool,
    /// Where to write events.
    pub events: PathBuf,
    /// The workload.
    pub spec: WorkerSpec,
}

/// A worker process's main: runs the workload against `args.url` (through its own
/// fault proxies if asked) opened by `deployment`, logging to `args.events`.
pub(crate) async fn worker_process(
    deployment: &dyn Deployment,
    args: WorkerArgs,
) -> Result<(), String> {
    let log = EventLog::create(&args.events, args.spec.proc_)?;
    let shown = dlock_api::redact_url(&args.url);
    let mut url = args.url.clone();
    let mut _proxies = None;
    if args.proxy {
        let (proxied, started) = proxy_every_host(&args.url)
            .await
            .map_err(|e| format!("cannot put a proxy in front of {shown}: {e}"))?;
        url = proxied;
        let proxies = Arc::new(started);
        procs::follow_commands(Arc::clone(&proxies), log.clone());
        _proxies = Some(proxies);
    }
    // Unlike the coordinator's probe, a worker may start during an outage.
    let backend = keep_trying(|| deployment.open(&url))
        .await
        .map_err(|e| format!("backend {} at {shown} cannot be reached: {e}", args.label))?;
    run_worker(args.spec, backend, log).await
}

/// Opens the store at `url` (`shown`: the URL without secrets), bounded: an
/// unreachable store fails the run, it is never skipped.
async fn open_backend(
    deployment: &dyn Deployment,
    url: &str,
    shown: &str,
) -> Result<Arc<dyn TestBackend>, String> {
    let label = deployment.label();
    let unreachable = |e: String| format!("backend {label} at {shown} cannot be reached: {e}");
    tokio::time::timeout(CONNECT_BOUND, deployment.open(url))
        .await
        .map_err(|_| unreachable(format!("no answer within {CONNECT_BOUND:?}")))?
        .map_err(unreachable)
}

/// The run's history directory (made by `tempfile`): removed when dropped, unless
/// kept.
struct RunDir {
    path: PathBuf,
    _temp: Option<tempfile::TempDir>,
}

impl RunDir {
    fn new(label: &str, seed: u64, keep: bool) -> Result<Self, String> {
        let temp = tempfile::Builder::new()
            .prefix(&format!("lockcheck-{label}-{seed}-"))
            .tempdir()
            .map_err(|e| format!("cannot create a history directory: {e}"))?;
        let path = temp.path().to_owned();
        Ok(RunDir {
            path,
            _temp: if keep {
                drop(temp.keep());
                None
            } else {
                Some(temp)
            },
        })
    }
}

/// The longest a run of `duration` on a store with `rules` lasts by its own
/// bounds: the deadline; a server fault still in progress then
/// ([`SERVER_FAULT_BOUND`], when `server_faults`); the workers' exit grace
/// ([`EXIT_GRACE`]); the leak check's quiescence. A harness that waits for a run
/// longer than this (plus a process's start and the checker's own work) has found
/// a hang, not a slow run.
pub fn run_bound(rules: &Rules, duration: Duration, server_faults: bool) -> Duration {
    let fault = if server_faults {
        SERVER_FAULT_BOUND
    } else {
        Duration::ZERO
    };
    duration + fault + EXIT_GRACE + rules.quiescence() + LEAK_SLACK
}

/// Runs the checker end to end on `deployment`. `Err` means the run itself failed
/// (store unreachable, a worker that could not work, no grant at all); violations
/// are in the report.
///
/// # Cancel safety
///
/// Not cancel safe: dropped mid-run, the workers are killed (their processes are
/// `kill_on_drop`) but a server-side fault in progress is cut short and the
/// hook's [`restore`](super::ServerFaults::restore) does not run — a promoted
/// replica stays promoted. Bound it by its own bounds ([`run_bound`]) instead.
pub async fn run(deployment: &dyn Deployment, opts: &RunOptions) -> Result<RunOutcome, String> {
    let label = deployment.label();
    if opts.processes == 0 {
        return Err("a run needs at least one worker process".to_owned());
    }
    let url = deployment.url();
    // Opened once: it probes the store before any worker starts and serves the
    // leak check.
    let shown = url
        .as_deref()
        .map_or_else(String::new, dlock_api::redact_url);
    let backend = open_backend(deployment, url.as_deref().unwrap_or(""), &shown).await?;
    let rules = deployment.rules();

    let dir = RunDir::new(&label, opts.seed, opts.keep)?;
    let log = EventLog::create(&dir.path.join("coordinator.events"), COORDINATOR)?;
    let mut run = Run {
        label: &label,
        dir: &dir.path,
        log: &log,
        until: Instant::now(),
        notes: Vec::new(),
    };
    if opts.keep {
        run.notes
            .push(format!("histories kept in {}", dir.path.display()));
    }
    let register = Register::start()
        .await
        .map_err(|e| format!("cannot start the fenced register: {e}"))?;
    let kinds = applicable(deployment, &label, opts.nemesis, &mut run.notes);
    let namespace = format!("lc{}-{:08x}:", opts.seed, fastrand::u32(..));
    let plan = Plan {
        seed: opts.seed,
        namespace: namespace.clone(),
        register: register.addr(),
    };
    let semaphores = offers_semaphores(backend.as_ref(), &label).await?;
    run.until = Instant::now() + opts.duration;
    let injected = match url {
        None => {
            let logs = (1..=opts.processes)
                .map(|i| EventLog::create(&dir.path.join(format!("p{i}.events")), i))
                .collect::<Result<Vec<_>, String>>()?;
            run_tasks(&backend, &plan, opts.duration, logs, run.until + EXIT_GRACE).await?;
            Vec::new()
        }
        Some(url) => run_processes(&mut run, deployment, opts, &kinds, url, plan).await?,
    };
    run.notes.push(format!(
        "workers done {:.1} s after the deadline",
        Instant::now()
            .saturating_duration_since(run.until)
            .as_secs_f64()
    ));
    let report = judge(&mut run, backend.as_ref(), &namespace, &rules, &register).await?;
    Ok(RunOutcome {
        report,
        notes: run.notes,
        kept: opts.keep.then(|| dir.path.clone()),
        injected,
        semaphores,
    })
}

/// What the parts of one run share: its label, directory and log, the deadline,
/// and the notes the outcome carries.
struct Run<'a> {
    label: &'a str,
    dir: &'a Path,
    log: &'a EventLog,
    until: Instant,
    notes: Vec<String>,
}

/// The nemeses of `choice` that apply to `deployment` (`label`); a note for each
/// that does not.
fn applicable(
    deployment: &dyn Deployment,
    label: &str,
    choice: Choice,
    notes: &mut Vec<String>,
) -> Vec<Nemesis> {
    let mut kinds = Vec::new();
    for kind in choice.kinds() {
        match deployment.not_applicable(kind) {
            Some(why) => notes.push(format!(
                "nemesis {}: not applicable to {label} ({why})",
                kind.name()
            )),
            None => kinds.push(kind),
        }
    }
    kinds
}

/// Whether the store offers semaphores (the workers take permits only then), asked
/// of a client of its own.
async fn offers_semaphores(backend: &dyn TestBackend, label: &str) -> Result<bool, String> {
    match tokio::time::timeout(CONNECT_BOUND, backend.client()).await {
        Ok(Ok(client)) => Ok(client.capabilities().semaphore),
        Ok(Err(e)) => Err(format!("backend {label} gives no client: {e}")),
        Err(_) => Err(format!(
            "backend {label} gave no client within {CONNECT_BOUND:?}"
        )),
    }
}

/// The workers as processes of their own on `url`, under the nemeses `kinds`
/// (server-side ones through the deployment's hook, whose servers are restored
/// after the workers are done); answers the faults injected.
async fn run_processes(
    run: &mut Run<'_>,
    deployment: &dyn Deployment,
    opts: &RunOptions,
    kinds: &[Nemesis],
    url: String,
    plan: Plan,
) -> Result<Vec<(Nemesis, u32)>, String> {
    let exe = match &opts.worker_exe {
        Some(exe) => exe.clone(),
        None => std::env::current_exe()
            .map_err(|e| format!("cannot find this binary to start workers: {e}"))?,
    };
    let mut procs = Procs::new(
        exe,
        run.label.to_owned(),
        url,
        kinds.iter().any(|k| k.needs_proxy()),
        run.dir.to_path_buf(),
        run.log.clone(),
        run.until,
        plan,
    );
    let mut servers = if kinds.iter().any(|k| k.server_side()) {
        deployment.servers()?
    } else {
        None
    };
    for _ in 0..opts.processes {
        procs.spawn_next(opts.duration)?;
    }
    let injected = inject::run(
        kinds,
        deployment,
        &mut procs,
        servers.as_deref_mut(),
        run.log,
        opts.seed,
        run.until,
        LEASE,
    )
    .await;
    let problems = procs.wait_all(run.until + EXIT_GRACE).await;
    // Before the leak check reads the store: the servers as they were.
    if let Some(servers) = servers.as_mut() {
        tokio::time::timeout(SERVER_FAULT_BOUND, servers.restore())
            .await
            .map_err(|_| {
                format!("the servers were not restored within {SERVER_FAULT_BOUND:?}")
            })??;
    }
    let injected = injected?;
    if !injected.is_empty() {
        let counts: Vec<String> = injected
            .iter()
            .map(|(kind, n)| format!("{} {n}", kind.name()))
            .collect();
        run.notes
            .push(format!("faults injected: {}", counts.join(", ")));
    }
    if !problems.is_empty() {
        return Err(problems.join("; "));
    }
    Ok(injected)
}

/// After the workers: the leak check (every worker gone, every manager closed),
/// the register's log beside the histories (so a kept run can be checked again),
/// then the checker over them. `Err` if nothing was granted in the whole run.
async fn judge(
    run: &mut Run<'_>,
    backend: &dyn TestBackend,
    namespace: &str,
    rules: &Rules,
    register: &Register,
) -> Result<Report, String> {
    let leak_start = Instant::now();
    leak_check(backend, namespace, rules.quiescence() + LEAK_SLACK, run.log).await?;
    run.notes.push(format!(
        "leak check took {:.1} s",
        leak_start.elapsed().as_secs_f64()
    ));
    let register_log = EventLog::create(&run.dir.join("register.events"), COORDINATOR)?;
    for event in register.log() {
        register_log.log_event(&event);
    }
    for log in [run.log, &register_log] {
        if let Some(e) = log.error() {
            return Err(e);
        }
    }
    let report = check_dir(run.label, run.dir, rules)?;
    if report.totals.grants == 0 {
        return Err(format!(
            "no lock was granted in the whole run: backend {} did not work",
            run.label
        ));
    }
    Ok(report)
}

/// The workers of an in-process store: tasks sharing `backend`, one per log,
/// waited for until `bound`.
async fn run_tasks(
    backend: &Arc<dyn TestBackend>,
    plan: &Plan,
    duration: Duration,
    logs: Vec<EventLog>,
    bound: Instant,
) -> Result<(), String> {
    let mut workers = JoinSet::new();
    for (i, log) in (1..).zip(logs) {
        workers.spawn(run_worker(plan.spec(i, duration), Arc::clone(backend), log));
    }
    let mut failures = Vec::new();
    loop {
        match tokio::time::timeout_at(bound.into(), workers.join_next()).await {
            Ok(Some(Ok(Ok(())))) => {}
            Ok(Some(Ok(Err(e)))) => failures.push(e),
            Ok(Some(Err(e))) => failures.push(format!("a virtual process failed: {e}")),
            Ok(None) => break,
            Err(_) => {
                failures.push(format!(
                    "{} virtual process(es) still running {EXIT_GRACE:?} after the deadline",
                    workers.len()
                ));
                workers.abort_all();
                break;
            }
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("; "))
    }
}

/// Checks the histories (`*.events`) of a run directory.
pub fn check_dir(label: &str, dir: &Path, rules: &Rules) -> Result<Report, String> {
    let mut events: Vec<Event> = Vec::new();
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    for entry in entries {
        let path = entry
            .map_err(|e| format!("cannot list {}: {e}", dir.display()))?
            .path();
        if path.extension().is_some_and(|x| x == "events") {
            events.extend(read_file(&path)?);
        }
    }
    Ok(check(label, &events, rules))
}

fn is_clean(state: Option<&LockState>) -> bool {
    state.is_none_or(|s| s.holders.is_empty() && s.waiters.unwrap_or(0) == 0)
}

/// Waits (at most `bound`) until the store shows no holder or waiter state under the
/// run's namespace, then inspects each name once to log a `leak` event for what is
/// left.
async fn leak_check(
    backend: &dyn TestBackend,
    namespace: &str,
    bound: Duration,
    log: &EventLog,
) -> Result<(), String> {
    // The last answer: live locks, or why there was none.
    let last: Mutex<Result<usize, String>> = Mutex::new(Ok(0));
    let quiet = eventually(bound, || async {
        let (answer, done) =
            match tokio::time::timeout(INSPECT_BOUND, backend.live_state(namespace)).await {
                // Done when nothing is left ...
                Ok(Ok(n)) => (Ok(n), n == 0),
                // ... or when the store cannot say. A store that says "try again"
                // (a ZooKeeper client between sessions right after a server
                // restart, a connection being replaced) is asked again within the
                // bound: only the last answer counts.
                Ok(Err(e)) => (
                    Err(format!("leak check: live state: {e}")),
                    !e.is_retryable(),
                ),
                Err(_) => (
                    Err(format!(
                        "leak check: live state did not answer within {INSPECT_BOUND:?}"
                    )),
                    false,
                ),
            };
        *last.lock().unwrap_or_else(PoisonError::into_inner) = answer;
        done
    })
    .await;
    let live = last.into_inner().unwrap_or_else(PoisonError::into_inner)?;
    if quiet {
        return Ok(());
    }
    let client = tokio::time::timeout(INSPECT_BOUND, backend.client())
        .await
        .map_err(|_| "leak check: no client within the bound".to_owned())?
        .map_err(|e| format!("leak check: cannot open a client: {e}"))?;
    let manager = DistributeLockManager::builder(client)
        .namespace(namespace)
        .build()
        .map_err(|e| format!("leak check: {e}"))?;
    let mut described = 0;
    for name in state_names(manager.capabilities()) {
        let state = match tokio::time::timeout(INSPECT_BOUND, manager.inspect(name)).await {
            Ok(Ok(state)) if is_clean(state.as_ref()) => continue,
            Ok(Ok(state)) => format!("{state:?}"),
            Ok(Err(e)) => format!("inspect failed: {e}"),
            Err(_) => format!("inspect did not answer within {INSPECT_BOUND:?}"),
        };
        described += 1;
        log.log(Kind::Leak {
            lock: name.to_owned(),
            state: format!("still there {bound:?} after quiescence: {state}"),
        });
    }
    manager.close().await;
    if described == 0 {
        log.log(Kind::Leak {
            lock: "*".to_owned(),
            state: format!(
                "{live} lock(s) of the namespace still had holder or waiter state {bound:?} after quiescence"
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use async_trait::async_trait;
    use dlock_spi::{Error, ErrorKind, LockName, LockRemoteResource, Result};

    use super::*;

    /// The memory store, whose first `failures` answers of `live_state` are `error`
    /// (a retryable one: a store between sessions, as ZooKeeper right after a
    /// restart).
    struct FailsFirst {
        inner: Arc<dyn TestBackend>,
        failures: u32,
        error: fn() -> Error,
        asked: AtomicU32,
    }

    #[async_trait]
    impl TestBackend for FailsFirst {
        fn label(&self) -> &'static str {
            self.inner.label()
        }
        async fn client(&self) -> Result<Arc<dyn LockRemoteResource>> {
            self.inner.client().await
        }
        async fn steal(&self, name: &LockName) -> Result<()> {
            self.inner.steal(name).await
        }
        async fn live_state(&self, prefix: &str) -> Result<usize> {
            if self.asked.fetch_add(1, Ordering::SeqCst) < self.failures {
                return Err((self.error)());
            }
            self.inner.live_state(prefix).await
        }
        fn acquire_attempts(&self) -> Option<u64> {
            None
        }
    }

    /// The leak check of an empty namespace over a store whose first `failures`
    /// answers are `error`: its result, and how often it asked.
    async fn leak_check_over(failures: u32, error: fn() -> Error) -> (Result<(), String>, u32) {
        let store = dlock_spi::InMemoryBackend::new();
        let inner: Arc<dyn TestBackend> = Arc::new(
            crate::AdminTestBackend::open("memory", move || {
                let store = store.clone();
                async move { Ok(store) }
            })
            .await
            .expect("the memory store"),
        );
        let backend = FailsFirst {
            inner,
            failures,
            error,
            asked: AtomicU32::new(0),
        };
        let dir = tempfile::tempdir().expect("a directory");
        let log = EventLog::create(&dir.path().join("c.events"), COORDINATOR).expect("a log");
        let result = leak_check(&backend, "lc-retry:", Duration::from_secs(2), &log).await;
        (result, backend.asked.load(Ordering::SeqCst))
    }

    /// Seen in a ZooKeeper restart run (seed 4521202): the store's first answer after
    /// the restart was "no ZooKeeper session … retry", and the run failed on it
    /// although the store answered within the bound.
    #[tokio::test]
    async fn the_leak_check_asks_again_when_the_store_says_retry() {
        let (result, asked) =
            leak_check_over(3, || Error::backend("no ZooKeeper session yet; retry")).await;
        assert_eq!(result, Ok(()));
        assert_eq!(asked, 4, "three retryable answers, then the clean one");
    }

    /// A store that cannot say, and says it will not be able to, fails the run at
    /// once: nothing is judged clean unseen.
    #[tokio::test]
    async fn the_leak_check_fails_on_an_answer_that_is_not_retryable() {
        let (result, asked) = leak_check_over(u32::MAX, || {
            Error::new(ErrorKind::Unexpected, "the namespace cannot be listed")
        })
        .await;
        let err = result.expect_err("no answer is not a clean store");
        assert!(err.contains("cannot be listed"), "{err}");
        assert_eq!(asked, 1);
    }

    /// A store that keeps saying "retry" past the bound fails the run with its last
    /// answer.
    #[tokio::test]
    async fn the_leak_check_fails_when_retry_lasts_past_the_bound() {
        let (result, asked) = leak_check_over(u32::MAX, || {
            Error::backend("no ZooKeeper session yet; retry")
        })
        .await;
        let err = result.expect_err("no answer within the bound is not a clean store");
        assert!(err.contains("no ZooKeeper session"), "{err}");
        assert!(asked > 1, "asked again within the bound");
    }
}
