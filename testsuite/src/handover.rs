//! The starvation bound: several client processes hand one non-fair lock over to
//! each other for a while (each: wait for the lock, hold it briefly, unlock, again at
//! once), and no process may be starved — every wait ends in a grant, and the
//! busiest process gets at most [`RATIO_BOUND`] times the grants of the least busy.
//!
//! Server labels run each client as an OS process of its own (binary `handover`,
//! re-executed with `--worker`); `memory` runs them as tasks of one process.

use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dlock_api::DistributeLockManager;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

use crate::backends;
use crate::lockcheck::broken::in_process;

/// The most grants the busiest process may have per grant of the least busy.
pub const RATIO_BOUND: f64 = 3.0;
/// The environment variable that gives a worker process the backend URL.
pub const WORKER_URL_VAR: &str = "DLOCK_HANDOVER_URL";
/// How long the worker processes may take to start and open their managers; each
/// says `ready` on stdout when it has, and all of them start together once every
/// one has (a fixed start delay instead either wasted seconds on a quiet machine or
/// started a slow process late on a busy one).
const READY_BOUND: Duration = Duration::from_secs(30);
/// From the last `ready` to the common start: time for every worker to read its
/// start instant from stdin before it comes.
const START_MARGIN: Duration = Duration::from_millis(100);
/// What a worker process prints once its manager is open.
pub const READY_LINE: &str = "ready";
/// How long after its run a worker may take to report before it is killed.
const REPORT_GRACE: Duration = Duration::from_secs(20);

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Backend label.
    pub label: String,
    /// Client processes.
    pub processes: u32,
    /// How long they hand the lock over.
    pub duration: Duration,
    /// How long each grant is held.
    pub hold: Duration,
    /// The longest a process waits for one grant before it counts a timeout.
    pub wait: Duration,
}

impl Options {
    /// The setting: 8 processes, 8 s, hold 1 ms, waits of at most 5 s.
    pub fn standard(label: &str) -> Self {
        Options {
            label: label.to_owned(),
            processes: 8,
            duration: Duration::from_secs(8),
            hold: Duration::from_millis(1),
            wait: Duration::from_secs(5),
        }
    }
}

/// One process's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerFigures {
    /// Grants received.
    pub grants: u64,
    /// Waits that ended without a grant.
    pub timeouts: u64,
    /// Errors returned by `try_lock` or `unlock`.
    pub errors: u64,
    /// The longest wait for one grant, in ms.
    pub longest_wait_ms: u64,
}

impl WorkerFigures {
    /// The line a worker prints.
    pub fn line(&self) -> String {
        format!(
            "grants={} timeouts={} errors={} longest_wait_ms={}",
            self.grants, self.timeouts, self.errors, self.longest_wait_ms
        )
    }

    /// Parses [`line`](Self::line).
    pub fn parse(line: &str) -> Option<Self> {
        let mut f = WorkerFigures::default();
        let mut seen = 0;
        for pair in line.split_whitespace() {
            let (key, value) = pair.split_once('=')?;
            let value: u64 = value.parse().ok()?;
            match key {
                "grants" => f.grants = value,
                "timeouts" => f.timeouts = value,
                "errors" => f.errors = value,
                "longest_wait_ms" => f.longest_wait_ms = value,
                _ => return None,
            }
            seen += 1;
        }
        (seen == 4).then_some(f)
    }
}

/// A run's figures.
#[derive(Debug, Clone)]
pub struct Summary {
    /// Per process.
    pub workers: Vec<WorkerFigures>,
    /// The first errors of each worker process, as it wrote them on its stderr
    /// ([`ERROR_LINE`] lines; an in-process worker writes them to this process's).
    pub first_errors: Vec<String>,
}

/// How a worker starts the line of each of its first few (three) errors on stderr.
pub const ERROR_LINE: &str = "handover error:";

/// How many errors a worker describes (it counts them all).
const ERRORS_SAID: u64 = 3;

impl Summary {
    /// Grants of the busiest process per grant of the least busy (∞ if one got none).
    pub fn ratio(&self) -> f64 {
        let max = self.workers.iter().map(|w| w.grants).max().unwrap_or(0);
        let min = self.workers.iter().map(|w| w.grants).min().unwrap_or(0);
        if min == 0 {
            f64::INFINITY
        } else {
            max as f64 / min as f64
        }
    }

    /// Waits that ended without a grant, over all processes.
    pub fn timeouts(&self) -> u64 {
        self.workers.iter().map(|w| w.timeouts).sum()
    }

    /// Errors, over all processes.
    pub fn errors(&self) -> u64 {
        self.workers.iter().map(|w| w.errors).sum()
    }

    /// All grants.
    pub fn grants(&self) -> u64 {
        self.workers.iter().map(|w| w.grants).sum()
    }

    /// The longest wait of any process, in ms.
    pub fn longest_wait_ms(&self) -> u64 {
        self.workers
            .iter()
            .map(|w| w.longest_wait_ms)
            .max()
            .unwrap_or(0)
    }

    /// Whether the bound holds: no timeouts, no errors, ratio ≤ [`RATIO_BOUND`].
    pub fn within_bound(&self) -> bool {
        self.timeouts() == 0 && self.errors() == 0 && self.ratio() <= RATIO_BOUND
    }

    /// One line for logs and notes.
    pub fn line(&self, label: &str) -> String {
        let per: Vec<String> = self.workers.iter().map(|w| w.grants.to_string()).collect();
        format!(
            "handover {label}: processes={} grants={} per-process=[{}] max/min={:.2} timeouts={} errors={} longest_wait_ms={}",
            self.workers.len(),
            self.grants(),
            per.join(","),
            self.ratio(),
            self.timeouts(),
            self.errors(),
            self.longest_wait_ms()
        ) + &if self.first_errors.is_empty() {
            String::new()
        } else {
            format!(" first_errors=[{}]", self.first_errors.join("; "))
        }
    }
}

/// Runs the handover on `opts.label` and returns its figures (the bound is the
/// caller's to judge). An unreachable backend or a worker that fails is an error.
pub async fn run(opts: &Options, worker_exe: &std::path::Path) -> Result<Summary, String> {
    let url = if in_process(&opts.label) {
        backends::TestUrl::fixed("")
    } else {
        backends::server_url(&opts.label)
            .ok_or_else(|| format!("unknown backend label {:?}", opts.label))?
    };
    // Opened once: it probes the backend and owns a per-run SQLite file.
    let backend = backends::open_at(&opts.label, url.clone())
        .await
        .map_err(|e| format!("backend {} cannot be opened: {e}", opts.label))?;
    let namespace = format!("handover-{:08x}:", fastrand::u32(..));
    let mut workers = Vec::new();
    if in_process(&opts.label) {
        let mut managers = Vec::new();
        for _ in 0..opts.processes {
            let client = backend.client().await.map_err(|e| e.to_string())?;
            let manager = DistributeLockManager::builder(client)
                .namespace(namespace.clone())
                .build()
                .map_err(|e| e.to_string())?;
            managers.push(manager);
        }
        let start_at = SystemTime::now();
        let tasks: Vec<_> = managers
            .into_iter()
            .map(|manager| {
                let opts = opts.clone();
                tokio::spawn(async move { worker(&manager, &opts, start_at).await })
            })
            .collect();
        for t in tasks {
            workers.push(t.await.map_err(|e| format!("worker task: {e}"))?);
        }
        return Ok(Summary {
            workers,
            first_errors: Vec::new(),
        });
    }
    let mut children = Vec::new();
    for i in 0..opts.processes {
        let mut child = Command::new(worker_exe)
            .arg("--worker")
            .arg("--backend")
            .arg(&opts.label)
            .arg("--namespace")
            .arg(&namespace)
            .arg("--seconds")
            .arg(format!("{:.3}", opts.duration.as_secs_f64()))
            .arg("--hold-ms")
            .arg(opts.hold.as_millis().to_string())
            .arg("--wait-ms")
            .arg(opts.wait.as_millis().to_string())
            .env(WORKER_URL_VAR, url.as_str())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start worker {i} ({}): {e}", worker_exe.display()))?;
        let stdout = child
            .stdout
            .take()
            .map(BufReader::new)
            .ok_or_else(|| format!("worker {i}: no stdout"))?;
        children.push((child, stdout));
    }
    // Every worker says it is ready before any starts.
    let ready_by = tokio::time::Instant::now() + READY_BOUND;
    for (i, (child, stdout)) in children.iter_mut().enumerate() {
        let mut said = String::new();
        tokio::time::timeout_at(ready_by, stdout.read_line(&mut said))
            .await
            .map_err(|_| format!("worker {i} was not ready within {READY_BOUND:?}"))?
            .map_err(|e| format!("worker {i}: {e}"))?;
        if said.trim() != READY_LINE {
            let _ = child.kill().await;
            let mut err = String::new();
            if let Some(mut s) = child.stderr.take() {
                let _ = s.read_to_string(&mut err).await;
            }
            return Err(format!(
                "worker {i} did not start ({:?} instead of {READY_LINE:?}): {}",
                said.trim(),
                err.trim()
            ));
        }
    }
    let start_at = SystemTime::now() + START_MARGIN;
    let start_ms = start_at
        .duration_since(UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_millis();
    for (i, (child, _)) in children.iter_mut().enumerate() {
        // Closed once sent: the worker reads nothing else.
        let mut stdin = child
            .stdin
            .take()
            .ok_or_else(|| format!("worker {i}: no stdin"))?;
        let sent = async {
            stdin
                .write_all(format!("start {start_ms}\n").as_bytes())
                .await?;
            stdin.flush().await
        };
        sent.await
            .map_err(|e| format!("worker {i}: cannot send the start: {e}"))?;
    }
    let bound = START_MARGIN + opts.duration + opts.wait + REPORT_GRACE;
    let mut first_errors = Vec::new();
    for (i, (mut child, mut stdout)) in children.into_iter().enumerate() {
        let status = tokio::time::timeout(bound, child.wait())
            .await
            .map_err(|_| format!("worker {i} did not finish within {bound:?}"))?
            .map_err(|e| format!("worker {i}: {e}"))?;
        let mut out = String::new();
        let mut err = String::new();
        let _ = stdout.read_to_string(&mut out).await;
        if let Some(mut s) = child.stderr.take() {
            let _ = s.read_to_string(&mut err).await;
        }
        let figures = out.lines().rev().find_map(WorkerFigures::parse);
        first_errors.extend(
            err.lines()
                .filter(|l| l.starts_with(ERROR_LINE))
                .map(|l| format!("worker {i}: {l}")),
        );
        match (status.success(), figures) {
            (true, Some(f)) => workers.push(f),
            _ => return Err(format!("worker {i} failed ({status}): {}", err.trim())),
        }
    }
    drop(backend);
    Ok(Summary {
        workers,
        first_errors,
    })
}

/// A worker process's main: opens the backend at `url`, says [`READY_LINE`] on
/// stdout, reads the common start (`start <unix ms>`) from stdin and hands the lock
/// over from then on.
pub async fn worker_process(
    opts: &Options,
    url: String,
    namespace: String,
) -> Result<WorkerFigures, String> {
    let backend = backends::open_at(&opts.label, backends::TestUrl::fixed(url))
        .await
        .map_err(|e| format!("backend {} cannot be opened: {e}", opts.label))?;
    let client = backend.client().await.map_err(|e| e.to_string())?;
    let manager = DistributeLockManager::builder(client)
        .namespace(namespace)
        .build()
        .map_err(|e| e.to_string())?;
    let said = format!("{READY_LINE}\n");
    let mut stdout = tokio::io::stdout();
    let cannot_say = |e: std::io::Error| format!("cannot say ready: {e}");
    stdout
        .write_all(said.as_bytes())
        .await
        .map_err(cannot_say)?;
    stdout.flush().await.map_err(cannot_say)?;
    let mut line = String::new();
    BufReader::new(tokio::io::stdin())
        .read_line(&mut line)
        .await
        .map_err(|e| format!("no start instant on stdin: {e}"))?;
    let start_ms: u64 = line
        .trim()
        .strip_prefix("start ")
        .and_then(|ms| ms.parse().ok())
        .ok_or_else(|| format!("no start instant on stdin (read {:?})", line.trim()))?;
    let start_at = UNIX_EPOCH + Duration::from_millis(start_ms);
    let figures = worker(&manager, opts, start_at).await;
    manager.close().await;
    Ok(figures)
}

/// Waits for the common start, then hands the lock over until the run ends.
async fn worker(
    manager: &dlock_api::DistributeLockManager,
    opts: &Options,
    start_at: SystemTime,
) -> WorkerFigures {
    let lock = manager.lock("handover");
    if let Ok(d) = start_at.duration_since(SystemTime::now()) {
        tokio::time::sleep(d).await;
    }
    let end = Instant::now() + opts.duration;
    let mut f = WorkerFigures::default();
    while Instant::now() < end {
        let asked = Instant::now();
        match lock.try_lock(opts.wait).await {
            Ok(Some(guard)) => {
                let waited = u64::try_from(asked.elapsed().as_millis()).unwrap_or(u64::MAX);
                f.longest_wait_ms = f.longest_wait_ms.max(waited);
                f.grants += 1;
                tokio::time::sleep(opts.hold).await;
                if let Err(e) = guard.unlock().await {
                    said_error(&mut f, "unlock", &e);
                }
            }
            Ok(None) => {
                f.timeouts += 1;
                f.longest_wait_ms = f
                    .longest_wait_ms
                    .max(u64::try_from(asked.elapsed().as_millis()).unwrap_or(u64::MAX));
            }
            Err(e) => said_error(&mut f, "try_lock", &e),
        }
    }
    f
}

/// Counts an error, and describes it on stderr if it is among the first few.
fn said_error(f: &mut WorkerFigures, op: &str, e: &dlock_api::Error) {
    f.errors += 1;
    if f.errors <= ERRORS_SAID {
        eprintln!("{ERROR_LINE} {op}: {e}");
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// A worker process that ends without saying it is ready fails the run at once
    /// with what it was, rather than the others starting without it.
    #[tokio::test]
    async fn a_worker_that_never_says_ready_fails_the_run() {
        let opts = Options {
            processes: 2,
            ..Options::standard("sqlite")
        };
        let started = Instant::now();
        let err = run(&opts, std::path::Path::new("/bin/true"))
            .await
            .expect_err("a run without ready workers");
        assert!(err.contains("worker 0 did not start"), "{err}");
        assert!(started.elapsed() < READY_BOUND, "{err}");
    }
}
