//! The coordinator: starts the register and the workers (processes, or tasks for the
//! in-process backends), runs the nemesis, waits for the workers, checks for leaks,
//! gathers the histories and runs the checker.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_api::{DistributeLockManagerBuilder, LockState};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::backends;
use crate::proxy::FaultProxy;

use super::check::{check, Report, Rules};
use super::clients::{in_process, known, split_url, ClientSource, ServerStore, SharedStore};
use super::history::{now_ns, read_file, Event, EventLog, Kind, COORDINATOR};
use super::nemesis::{self, Choice, Cluster, Nemesis};
use super::register::Register;
use super::workload::{lock_names, run_worker, WorkerSpec, LEASE, MAX_LEASE_MS, TASK_GRACE};

/// How long workers may run past the deadline before they are killed (their own
/// bound is [`TASK_GRACE`] plus closing their managers).
const EXIT_GRACE: Duration = Duration::from_secs(40);
/// Bound on opening the first client and on one inspect call.
const CONNECT_BOUND: Duration = Duration::from_secs(20);
/// Waiters' liveness on the stores that have it (Redis queue entries).
const WAITER_LIVENESS: Duration = Duration::from_secs(3);

/// What to run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Backend label (`backends::KNOWN` or `broken-memory`).
    pub label: String,
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
    /// The `lockcheck` binary, re-executed for worker processes (server labels).
    pub worker_exe: Option<PathBuf>,
}

/// A finished run.
#[derive(Debug)]
pub struct RunOutcome {
    /// The checker's report.
    pub report: Report,
    /// Things worth telling (nemeses not applicable, workers killed, kept files).
    pub notes: Vec<String>,
}

/// The hidden `--worker` arguments of a worker process.
#[derive(Debug, Clone)]
pub struct WorkerArgs {
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
/// fault proxies if asked), logging to `args.events`.
pub async fn worker_process(args: WorkerArgs) -> Result<(), String> {
    let log = EventLog::create(&args.events, args.spec.proc_)?;
    let mut url = args.url.clone();
    let mut _proxies = None;
    if args.proxy {
        let split = split_url(&args.url).map_err(|e| {
            format!(
                "cannot put a proxy in front of {}: {e}",
                dlock_api::redact_url(&args.url)
            )
        })?;
        let mut started = Vec::new();
        for host in &split.hosts {
            started.push(
                FaultProxy::start(*host)
                    .await
                    .map_err(|e| format!("cannot start a fault proxy for {host}: {e}"))?,
            );
        }
        let addrs: Vec<SocketAddr> = started.iter().map(FaultProxy::addr).collect();
        url = split.with_hosts(&addrs);
        let proxies = Arc::new(started);
        nemesis::follow_commands(Arc::clone(&proxies), log.clone());
        _proxies = Some(proxies);
    }
    let source: Arc<dyn ClientSource> = Arc::new(ServerStore {
        label: args.label.clone(),
        url,
    });
    run_worker(args.spec, source, log).await
}

/// Removes a per-run SQLite file (made by `backends::server_url`) when dropped.
struct SqliteFile(Option<String>);

impl Drop for SqliteFile {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{path}{suffix}"));
            }
        }
    }
}

/// Removes the run's history directory when dropped, unless kept.
struct RunDir {
    path: PathBuf,
    keep: bool,
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Runs the checker end to end. `Err` means the run itself failed (backend
/// unreachable, a worker that could not work, no grant at all); violations are in
/// the report.
pub async fn run(opts: &RunOptions) -> Result<RunOutcome, String> {
    let label = opts.label.as_str();
    if !known(label) {
        return Err(format!(
            "unknown backend {label:?}; known: {}, broken-memory",
            backends::KNOWN.join(", ")
        ));
    }
    if opts.processes == 0 {
        return Err("--processes must be at least 1".to_owned());
    }
    let nonce = fastrand::u32(..);
    let namespace = format!("lc{}-{nonce:08x}:", opts.seed);
    let dir = RunDir {
        path: std::env::temp_dir().join(format!(
            "lockcheck-{label}-{}-{}-{nonce:08x}",
            opts.seed,
            std::process::id()
        )),
        keep: opts.keep,
    };
    std::fs::create_dir_all(&dir.path)
        .map_err(|e| format!("cannot create {}: {e}", dir.path.display()))?;
    let mut notes = Vec::new();
    if opts.keep {
        notes.push(format!("histories kept in {}", dir.path.display()));
    }
    let coordinator_log = EventLog::create(&dir.path.join("coordinator.events"), COORDINATOR)?;
    let register = Register::start()
        .await
        .map_err(|e| format!("cannot start the fenced register: {e}"))?;

    let mut kinds = Vec::new();
    for kind in opts.nemesis.kinds() {
        match kind.not_applicable(label) {
            Some(why) => notes.push(format!(
                "nemesis {}: not applicable to {label} ({why})",
                kind.name()
            )),
            None => kinds.push(kind),
        }
    }

    let start = Instant::now();
    let until = start + opts.duration;
    let spec = |proc_: u32, duration: Duration| WorkerSpec {
        proc_,
        seed: opts.seed.wrapping_add(u64::from(proc_)),
        duration,
        namespace: namespace.clone(),
        register: register.addr(),
    };

    let (source, _sqlite): (Arc<dyn ClientSource>, SqliteFile) = if in_process(label) {
        let store = SharedStore::for_label(label).map_err(|e| e.to_string())?;
        let source: Arc<dyn ClientSource> = Arc::new(store);
        let mut workers = Vec::new();
        for i in 1..=opts.processes {
            let log = EventLog::create(&dir.path.join(format!("p{i}.events")), i)?;
            workers.push((
                i,
                tokio::spawn(run_worker(spec(i, opts.duration), Arc::clone(&source), log)),
            ));
        }
        tokio::time::sleep_until(until.into()).await;
        let bound = until + TASK_GRACE + Duration::from_secs(15);
        let mut failures = Vec::new();
        for (i, worker) in workers {
            match tokio::time::timeout_at(bound.into(), worker).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => failures.push(e),
                Ok(Err(e)) => failures.push(format!("virtual process {i} failed: {e}")),
                Err(_) => failures.push(format!("virtual process {i} did not finish in time")),
            }
        }
        if !failures.is_empty() {
            return Err(failures.join("; "));
        }
        (source, SqliteFile(None))
    } else {
        let url =
            backends::server_url(label).ok_or_else(|| format!("no URL for backend {label}"))?;
        let sqlite = SqliteFile(
            url.strip_prefix("sqlite://")
                .filter(|p| p.contains("dlock-test-"))
                .map(str::to_owned),
        );
        let source: Arc<dyn ClientSource> = Arc::new(ServerStore {
            label: label.to_owned(),
            url: url.clone(),
        });
        probe(label, &url, source.as_ref()).await?;
        let exe = opts.worker_exe.clone().ok_or_else(|| {
            format!("backend {label} needs worker processes but no lockcheck binary was given")
        })?;
        let mut procs = Procs {
            exe,
            label: label.to_owned(),
            url,
            proxy: kinds.contains(&Nemesis::Proxy),
            dir: dir.path.clone(),
            log: coordinator_log.clone(),
            until,
            workers: Vec::new(),
            next: 1,
            spec: Box::new(spec),
        };
        for _ in 0..opts.processes {
            procs.spawn_next(opts.duration)?;
        }
        let injected = nemesis::run(
            &kinds,
            &mut procs,
            &coordinator_log,
            opts.seed,
            until,
            LEASE,
        )
        .await;
        let problems = procs.wait_all(until + EXIT_GRACE).await;
        let injected = injected?;
        if injected.kill > 0 {
            notes.push(format!(
                "{} worker(s) SIGKILLed and replaced by the nemesis",
                injected.kill
            ));
        }
        if !problems.is_empty() {
            return Err(problems.join("; "));
        }
        (source, sqlite)
    };

    notes.push(format!(
        "workers done {:.1} s after the deadline",
        Instant::now()
            .saturating_duration_since(until)
            .as_secs_f64()
    ));
    // Leak check: every worker is gone and every manager closed.
    let leak_start = Instant::now();
    let mut bound = Duration::from_millis(MAX_LEASE_MS) + WAITER_LIVENESS + Duration::from_secs(2);
    if label.starts_with("zk") {
        bound += Duration::from_secs(10);
    }
    leak_check(source.as_ref(), &namespace, bound, &coordinator_log).await?;
    notes.push(format!(
        "leak check took {:.1} s",
        leak_start.elapsed().as_secs_f64()
    ));
    if let Some(e) = coordinator_log.error() {
        return Err(e);
    }

    let mut events: Vec<Event> = register.log();
    let entries = std::fs::read_dir(&dir.path)
        .map_err(|e| format!("cannot list {}: {e}", dir.path.display()))?;
    for entry in entries {
        let path = entry
            .map_err(|e| format!("cannot list {}: {e}", dir.path.display()))?
            .path();
        if path.extension().is_some_and(|x| x == "events") {
            events.extend(read_file(&path)?);
        }
    }
    let report = check(label, &events, &Rules::for_label(label));
    if report.totals.grants == 0 {
        return Err(format!(
            "no lock was granted in the whole run: backend {label} did not work"
        ));
    }
    Ok(RunOutcome { report, notes })
}

/// Opens a client and makes one round trip, so an unreachable backend fails the run
/// before any worker starts.
async fn probe(label: &str, url: &str, source: &dyn ClientSource) -> Result<(), String> {
    let shown = dlock_api::redact_url(url);
    let unreachable = |e: String| format!("backend {label} at {shown} cannot be reached: {e}");
    let client = tokio::time::timeout(CONNECT_BOUND, source.open())
        .await
        .map_err(|_| unreachable(format!("no connection within {CONNECT_BOUND:?}")))?
        .map_err(|e| unreachable(e.to_string()))?;
    let manager = DistributeLockManagerBuilder::new(client)
        .build()
        .map_err(|e| unreachable(e.to_string()))?;
    let answer = tokio::time::timeout(CONNECT_BOUND, manager.inspect("lockcheck-probe")).await;
    manager.close().await;
    answer
        .map_err(|_| unreachable(format!("no answer within {CONNECT_BOUND:?}")))?
        .map_err(|e| unreachable(e.to_string()))?;
    Ok(())
}

fn is_clean(state: &Option<LockState>) -> bool {
    state
        .as_ref()
        .is_none_or(|s| s.holders.is_empty() && s.waiters.unwrap_or(0) == 0)
}

/// Waits (at most `bound`) until no name of the run has holder or waiter state, then
/// logs a `leak` event for every name that still has some.
async fn leak_check(
    source: &dyn ClientSource,
    namespace: &str,
    bound: Duration,
    log: &EventLog,
) -> Result<(), String> {
    let client = tokio::time::timeout(CONNECT_BOUND, source.open())
        .await
        .map_err(|_| "leak check: no connection to the backend".to_owned())?
        .map_err(|e| format!("leak check: cannot open a client: {e}"))?;
    let manager = DistributeLockManagerBuilder::new(client)
        .namespace(namespace)
        .build()
        .map_err(|e| format!("leak check: {e}"))?;
    let mut left: Vec<(&str, String)> = lock_names(manager.capabilities())
        .into_iter()
        .map(|n| (n, String::new()))
        .collect();
    let end = Instant::now() + bound;
    let mut failure = None;
    for _ in 0..10_000 {
        let mut still = Vec::new();
        for (name, _) in left {
            match tokio::time::timeout(CONNECT_BOUND, manager.inspect(name)).await {
                Ok(Ok(state)) if is_clean(&state) => {}
                Ok(Ok(state)) => still.push((name, format!("{state:?}"))),
                Ok(Err(e)) => {
                    failure = Some(format!("leak check: inspect {name}: {e}"));
                    still.push((name, String::new()));
                }
                Err(_) => {
                    failure = Some(format!("leak check: inspect {name} did not answer"));
                    still.push((name, String::new()));
                }
            }
        }
        left = still;
        if left.is_empty() || Instant::now() >= end || failure.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    manager.close().await;
    if let Some(e) = failure {
        return Err(e);
    }
    for (name, state) in left {
        log.log(Kind::Leak {
            lock: name.to_owned(),
            state: format!("still there {bound:?} after quiescence: {state}"),
        });
    }
    Ok(())
}

struct Worker {
    id: u32,
    child: Child,
    stdin: Option<ChildStdin>,
    stderr: PathBuf,
    killed: bool,
    status: Option<ExitStatus>,
}

type SpecFn<'a> = Box<dyn Fn(u32, Duration) -> WorkerSpec + Send + 'a>;

/// The worker processes of a run.
struct Procs<'a> {
    exe: PathBuf,
    label: String,
    url: String,
    proxy: bool,
    dir: PathBuf,
    log: EventLog,
    until: Instant,
    workers: Vec<Worker>,
    next: u32,
    spec: SpecFn<'a>,
}

impl Procs<'_> {
    fn spawn_next(&mut self, duration: Duration) -> Result<u32, String> {
        let id = self.next;
        self.next += 1;
        let spec = (self.spec)(id, duration);
        let events = self.dir.join(format!("p{id}.events"));
        let stderr_path = self.dir.join(format!("p{id}.stderr"));
        let stderr = std::fs::File::create(&stderr_path)
            .map_err(|e| format!("cannot create {}: {e}", stderr_path.display()))?;
        let mut command = Command::new(&self.exe);
        command
            .arg("--worker")
            .arg(id.to_string())
            .arg("--backend")
            .arg(&self.label)
            .arg("--url")
            .arg(&self.url)
            .arg("--register")
            .arg(spec.register.to_string())
            .arg("--seed")
            .arg(spec.seed.to_string())
            .arg("--seconds")
            .arg(format!("{:.3}", spec.duration.as_secs_f64()))
            .arg("--events")
            .arg(&events)
            .arg("--namespace")
            .arg(&spec.namespace)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(stderr);
        if self.proxy {
            command.arg("--proxy");
        }
        let mut child = command
            .spawn()
            .map_err(|e| format!("cannot start worker {id} ({}): {e}", self.exe.display()))?;
        let stdin = child.stdin.take();
        self.workers.push(Worker {
            id,
            child,
            stdin,
            stderr: stderr_path,
            killed: false,
            status: None,
        });
        Ok(id)
    }

    fn reap(&mut self) {
        for w in self.workers.iter_mut().filter(|w| w.status.is_none()) {
            if let Ok(Some(status)) = w.child.try_wait() {
                w.status = Some(status);
                w.stdin = None;
            }
        }
    }

    fn worker(&mut self, id: u32) -> Result<&mut Worker, String> {
        self.workers
            .iter_mut()
            .find(|w| w.id == id)
            .ok_or_else(|| format!("no worker {id}"))
    }

    /// Waits for every worker until `bound`, kills those still running, and returns
    /// what went wrong (workers that failed or had to be killed).
    async fn wait_all(&mut self, bound: Instant) -> Vec<String> {
        for _ in 0..100_000 {
            self.reap();
            if self.workers.iter().all(|w| w.status.is_some()) || Instant::now() >= bound {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut problems = Vec::new();
        for w in &mut self.workers {
            if w.status.is_none() {
                let _ = w.child.kill();
                w.status = w.child.wait().ok();
                w.stdin = None;
                problems.push(format!(
                    "worker p{} did not exit in time and was killed",
                    w.id
                ));
                continue;
            }
            if w.killed {
                continue;
            }
            if let Some(status) = w.status.filter(|s| !s.success()) {
                problems.push(format!(
                    "worker p{} failed ({status}): {}",
                    w.id,
                    tail(&w.stderr)
                ));
            }
        }
        problems
    }
}

/// The last lines of a worker's stderr.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(5);
    let shown = lines[from..].join(" | ");
    if shown.is_empty() {
        "(no output)".to_owned()
    } else {
        shown
    }
}

impl Drop for Procs<'_> {
    fn drop(&mut self) {
        for w in &mut self.workers {
            if w.status.is_none() {
                let _ = w.child.kill();
                let _ = w.child.wait();
            }
        }
    }
}

fn pid_of(child: &Child) -> Result<Pid, String> {
    i32::try_from(child.id())
        .map(Pid::from_raw)
        .map_err(|_| format!("pid {} out of range", child.id()))
}

impl Cluster for Procs<'_> {
    fn live(&mut self) -> Vec<u32> {
        self.reap();
        self.workers
            .iter()
            .filter(|w| w.status.is_none())
            .map(|w| w.id)
            .collect()
    }

    fn command(&mut self, proc_: u32, line: &str) -> Result<(), String> {
        let w = self.worker(proc_)?;
        let stdin = w
            .stdin
            .as_mut()
            .ok_or_else(|| format!("worker p{proc_} has exited"))?;
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("cannot tell worker p{proc_} {line:?}: {e}"))
    }

    fn pause(&mut self, proc_: u32, stop: bool) -> Result<(), String> {
        let w = self.worker(proc_)?;
        let signal = if stop {
            Signal::SIGSTOP
        } else {
            Signal::SIGCONT
        };
        kill(pid_of(&w.child)?, signal).map_err(|e| format!("{signal} to worker p{proc_}: {e}"))
    }

    fn kill_and_replace(&mut self, proc_: u32) -> Result<Option<u32>, String> {
        let log = self.log.clone();
        let w = self.worker(proc_)?;
        w.killed = true;
        w.child
            .kill()
            .map_err(|e| format!("cannot SIGKILL worker p{proc_}: {e}"))?;
        w.status = w.child.wait().ok();
        w.stdin = None;
        // Logged once reaped: every event the worker wrote is before this time.
        log.log_event(&Event {
            t: now_ns(),
            proc_,
            kind: Kind::Kill,
        });
        let left = self.until.saturating_duration_since(Instant::now());
        if left < Duration::from_secs(1) {
            return Ok(None);
        }
        self.spawn_next(left).map(Some)
    }
}
