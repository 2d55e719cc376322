//! A run's worker processes ([`Procs`]): started (this binary re-executed with
//! hidden `--worker` arguments), stopped, resumed, killed and replaced, told
//! commands for their fault proxies on stdin (`follow_commands` is the worker's
//! side), and waited for.

use std::io::BufRead;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::AsyncWriteExt as _;
use tokio::process::{Child, ChildStdin, Command};

use crate::proxy::{split_url, Fault, FaultProxy};

use super::history::{now_ns, Event, EventLog, Kind};
use super::nemesis::WorkerCommand;
use super::workload::Plan;

/// The environment variable that gives a worker process the backend URL (not argv:
/// a password in it would show in `ps`).
pub const WORKER_URL_VAR: &str = "DLOCK_LOCKCHECK_URL";

/// Bound on telling a worker process a command (a line on its stdin).
const COMMAND_BOUND: Duration = Duration::from_secs(5);

/// Worker side: applies the coordinator's commands from stdin to this worker's
/// proxies, logging each fault as applied. Runs on its own thread until stdin closes.
pub(crate) fn follow_commands(proxies: Arc<Vec<FaultProxy>>, log: EventLog) {
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        for line in stdin.lock().lines().take(1_000_000) {
            let Ok(line) = line else { return };
            match line.parse::<WorkerCommand>() {
                Ok(WorkerCommand::Fault(fault)) => {
                    // A fault is logged from just before it applies (a reset's
                    // server may end the session at once), healing once done.
                    let before = now_ns();
                    for proxy in proxies.iter() {
                        proxy.set(fault);
                    }
                    let t = if fault == Fault::Pass {
                        now_ns()
                    } else {
                        before
                    };
                    log.log_at(t, Kind::Fault { fault });
                }
                Ok(WorkerCommand::Upstream(addr)) => {
                    for proxy in proxies.iter() {
                        let _ = proxy.retarget(addr);
                    }
                }
                Err(_) => {}
            }
        }
    });
}

/// A worker process of a run.
struct Worker {
    id: u32,
    child: Child,
    stdin: Option<ChildStdin>,
    stderr: PathBuf,
    killed: bool,
    status: Option<ExitStatus>,
}

/// The worker processes of a run; the nemesis acts on them.
pub struct Procs {
    exe: PathBuf,
    label: String,
    url: String,
    proxy: bool,
    dir: PathBuf,
    log: EventLog,
    until: Instant,
    workers: Vec<Worker>,
    next: u32,
    plan: Plan,
}

impl Procs {
    /// No worker yet: `exe` runs each (`--worker`) on `label` at `url` (through a
    /// fault proxy of its own when `proxy`), writing its files into `dir` until
    /// `until`; `log` records what the nemesis does to them.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        exe: PathBuf,
        label: String,
        url: String,
        proxy: bool,
        dir: PathBuf,
        log: EventLog,
        until: Instant,
        plan: Plan,
    ) -> Self {
        Procs {
            exe,
            label,
            url,
            proxy,
            dir,
            log,
            until,
            workers: Vec::new(),
            next: 1,
            plan,
        }
    }

    pub(crate) fn spawn_next(&mut self, duration: Duration) -> Result<u32, String> {
        let id = self.next;
        self.next += 1;
        let spec = self.plan.spec(id, duration);
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
            .env(WORKER_URL_VAR, &self.url)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true);
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

    /// The URL the workers started from now on open.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn worker(&mut self, id: u32) -> Result<&mut Worker, String> {
        self.workers
            .iter_mut()
            .find(|w| w.id == id)
            .ok_or_else(|| format!("no worker {id}"))
    }

    /// Process numbers of the workers alive now.
    pub fn live(&mut self) -> Vec<u32> {
        for w in self.workers.iter_mut().filter(|w| w.status.is_none()) {
            if let Ok(Some(status)) = w.child.try_wait() {
                w.status = Some(status);
                w.stdin = None;
            }
        }
        self.workers
            .iter()
            .filter(|w| w.status.is_none())
            .map(|w| w.id)
            .collect()
    }

    /// Sends a worker a command for its proxies.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: dropped mid-write, a part of the line may reach the
    /// worker, which then reads it joined to the next command (and ignores both).
    pub async fn command(
        &mut self,
        proc_: u32,
        command: impl Into<WorkerCommand>,
    ) -> Result<(), String> {
        let w = self.worker(proc_)?;
        let stdin = w
            .stdin
            .as_mut()
            .ok_or_else(|| format!("worker p{proc_} has exited"))?;
        let line = format!("{}\n", command.into());
        let sent = async {
            stdin.write_all(line.as_bytes()).await?;
            stdin.flush().await
        };
        tokio::time::timeout(COMMAND_BOUND, sent)
            .await
            .map_err(|_| format!("worker p{proc_} does not read its commands"))?
            .map_err(|e| format!("cannot tell worker p{proc_} {line:?}: {e}"))
    }

    /// Workers started from now on reach the backend at `host` (the URL has one
    /// host: a client following a failover).
    pub fn follow(&mut self, host: SocketAddr) -> Result<(), String> {
        let split = split_url(&self.url)?;
        if split.hosts.len() != 1 {
            return Err(format!(
                "cannot follow a failover on a URL with {} hosts",
                split.hosts.len()
            ));
        }
        self.url = split.with_hosts(&[host]);
        Ok(())
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`).
    pub(crate) fn pause(&mut self, proc_: u32, stop: bool) -> Result<(), String> {
        let w = self.worker(proc_)?;
        let signal = if stop {
            Signal::SIGSTOP
        } else {
            Signal::SIGCONT
        };
        let pid = w
            .child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .ok_or_else(|| format!("worker p{proc_} has exited"))?;
        kill(Pid::from_raw(pid), signal).map_err(|e| format!("{signal} to worker p{proc_}: {e}"))
    }

    /// SIGKILLs a worker, waits for it, and starts a replacement; returns the new
    /// worker's number, if one was started.
    pub(crate) async fn kill_and_replace(&mut self, proc_: u32) -> Result<Option<u32>, String> {
        let log = self.log.clone();
        let w = self.worker(proc_)?;
        w.killed = true;
        // Logged at the time taken just before the signal, not once the worker is
        // reaped: its holds end when it dies, and a store that ends a dead client's
        // session at once (PostgreSQL's session mode: the socket closes with the
        // process) grants the lock on before the reaping is done (seen: another
        // process granted 6.7 ms before a SIGKILL logged after the wait).
        let signalled = now_ns();
        w.child
            .kill()
            .await
            .map_err(|e| format!("cannot SIGKILL worker p{proc_}: {e}"))?;
        w.status = w.child.try_wait().ok().flatten();
        w.stdin = None;
        log.log_event(&Event {
            t: signalled,
            proc_,
            kind: Kind::Kill,
        });
        let left = self.until.saturating_duration_since(Instant::now());
        if left < Duration::from_secs(1) {
            return Ok(None);
        }
        self.spawn_next(left).map(Some)
    }

    /// Waits for every worker until `bound`, kills those still running, and returns
    /// what went wrong (workers that failed or had to be killed).
    pub(crate) async fn wait_all(&mut self, bound: Instant) -> Vec<String> {
        let mut problems = Vec::new();
        for w in &mut self.workers {
            w.stdin = None;
            if w.status.is_none() {
                match tokio::time::timeout_at(bound.into(), w.child.wait()).await {
                    Ok(status) => w.status = status.ok(),
                    Err(_) => {
                        let _ = w.child.kill().await;
                        problems.push(format!(
                            "worker p{} did not exit in time and was killed",
                            w.id
                        ));
                        continue;
                    }
                }
            }
            if w.killed {
                continue;
            }
            match w.status {
                Some(status) if status.success() => {}
                status => problems.push(format!(
                    "worker p{} failed ({}): {}",
                    w.id,
                    status.map_or_else(|| "no status".to_owned(), |s| s.to_string()),
                    tail(&w.stderr)
                )),
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
