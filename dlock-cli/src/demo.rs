//! `dlock demo`: the seed's counter demo as real processes.
//!
//! Worker processes (this binary, `dlock worker`) each increment a counter kept in a
//! file — read, pause, write: not atomic — only while holding one lock. A marker file
//! created with O_EXCL on entry and removed on exit detects any overlap between
//! processes. The final counter must equal the sum of successful acquisitions.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::sync::mpsc;

use crate::exit::{Failure, SOFTWARE, USAGE};
use crate::parse_duration;

#[derive(Args, Debug)]
pub(crate) struct DemoArgs {
    /// Worker processes to start.
    #[arg(long, default_value_t = 3)]
    workers: u32,
    /// Increments each worker attempts.
    #[arg(long, default_value_t = 200)]
    iterations: u32,
    /// How long each attempt may wait for the lock.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    wait: Duration,
    /// The lock's name.
    #[arg(long, default_value = "dlock-demo")]
    lock: String,
    /// How each worker lets go of the lock: `unlock` (await the release) or `drop`
    /// (drop the guard, which releases in the background, and lock again at once
    /// with the same handle — the ordinary loop).
    #[arg(long, default_value = "unlock", value_parser = ["unlock", "drop"])]
    release: String,
}

#[derive(Args, Debug)]
pub(crate) struct WorkerArgs {
    #[arg(long)]
    id: u32,
    #[arg(long)]
    counter: PathBuf,
    #[arg(long)]
    iterations: u32,
    #[arg(long, value_parser = parse_duration)]
    wait: Duration,
    #[arg(long)]
    lock: String,
    #[arg(long, value_parser = ["unlock", "drop"])]
    release: String,
}

/// One worker's tally.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    acquired: u64,
    timed_out: u64,
    errors: u64,
    overlaps: u64,
}

impl Tally {
    fn line(&self, tag: &str, id: u32) -> String {
        format!(
            "{tag} {id} {} {} {} {}",
            self.acquired, self.timed_out, self.errors, self.overlaps
        )
    }

    fn parse(line: &str) -> Option<(bool, u32, Tally)> {
        let mut parts = line.split_whitespace();
        let done = match parts.next()? {
            "progress" => false,
            "done" => true,
            _ => return None,
        };
        let mut n = || parts.next()?.parse::<u64>().ok();
        let id = u32::try_from(n()?).ok()?;
        Some((
            done,
            id,
            Tally {
                acquired: n()?,
                timed_out: n()?,
                errors: n()?,
                overlaps: n()?,
            },
        ))
    }
}

fn marker_of(counter: &Path) -> PathBuf {
    counter.with_extension("inside")
}

pub(crate) async fn worker(
    backend: &str,
    namespace: &str,
    args: WorkerArgs,
) -> Result<ExitCode, Failure> {
    let manager = crate::connect(backend, namespace, None).await?;
    let lock = manager.lock(&args.lock);
    let marker = marker_of(&args.counter);
    let mut tally = Tally::default();
    for i in 0..args.iterations {
        match lock.try_lock(args.wait).await {
            Ok(Some(guard)) => {
                let entered = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&marker)
                    .is_ok();
                if !entered {
                    tally.overlaps += 1;
                }
                let value = std::fs::read_to_string(&args.counter)
                    .ok()
                    .and_then(|s| s.trim().parse::<u64>().ok());
                match value {
                    Some(v) => {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        if std::fs::write(&args.counter, (v + 1).to_string()).is_err() {
                            tally.errors += 1;
                        }
                    }
                    None => tally.errors += 1,
                }
                if entered {
                    let _ = std::fs::remove_file(&marker);
                }
                tally.acquired += 1;
                if args.release == "drop" {
                    drop(guard);
                } else if let Err(e) = guard.unlock().await {
                    eprintln!("worker {}: unlock: {e:#}", args.id);
                    tally.errors += 1;
                }
            }
            Ok(None) => tally.timed_out += 1,
            Err(e) => {
                eprintln!("worker {}: {e:#}", args.id);
                tally.errors += 1;
            }
        }
        if i % 10 == 9 {
            println!("{}", tally.line("progress", args.id));
        }
    }
    println!("{}", tally.line("done", args.id));
    manager.close().await;
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn run(
    backend: &str,
    namespace: &str,
    args: DemoArgs,
) -> Result<ExitCode, Failure> {
    if !(1..=64).contains(&args.workers) || !(1..=1_000_000).contains(&args.iterations) {
        return Err(Failure::new(
            USAGE,
            "use 1–64 workers and 1–1000000 iterations",
        ));
    }
    // Connect once up front: a bad URL or a down backend fails here, clearly, and the
    // schema is created before the workers race to it.
    let manager = crate::connect(backend, namespace, None).await?;
    manager.close().await;

    // The shared counter's directory: an unpredictable name, removed on every way out.
    let dir = tempfile::Builder::new()
        .prefix("dlock-demo-")
        .tempdir()
        .map_err(|e| {
            Failure::new(
                SOFTWARE,
                format!("cannot create a temporary directory: {e}"),
            )
        })?;
    let counter = dir.path().join("counter");
    std::fs::write(&counter, "0")
        .map_err(|e| Failure::new(SOFTWARE, format!("cannot write {}: {e}", counter.display())))?;
    let _ = std::fs::remove_file(marker_of(&counter));
    let exe = std::env::current_exe()
        .map_err(|e| Failure::new(SOFTWARE, format!("cannot find my own binary: {e}")))?;

    println!(
        "dlock demo: {} workers × {} increments of {} under lock {:?} (release by {}) on {}",
        args.workers,
        args.iterations,
        counter.display(),
        args.lock,
        args.release,
        dlock_api::redact_url(backend)
    );
    let started = Instant::now();
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    let mut children = Vec::new();
    for id in 0..args.workers {
        children.push(spawn_worker(
            &exe, backend, namespace, &args, id, &counter, &tx,
        )?);
    }
    drop(tx);

    let tallies = collect(&mut rx, &args, started).await;
    let mut failed_workers = 0;
    for mut child in children {
        match child.wait().await {
            Ok(status) if status.success() => {}
            _ => failed_workers += 1,
        }
    }

    let counter_value = std::fs::read_to_string(&counter)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    drop(dir);

    let consistent = report(&tallies, counter_value, started);
    let all_done = tallies.values().all(|(_, done)| *done) && failed_workers == 0;
    if consistent && all_done {
        Ok(ExitCode::SUCCESS)
    } else {
        Ok(ExitCode::FAILURE)
    }
}

/// Starts worker `id` of the demo, its output lines sent to `tx`.
fn spawn_worker(
    exe: &std::path::Path,
    backend: &str,
    namespace: &str,
    args: &DemoArgs,
    id: u32,
    counter: &std::path::Path,
    tx: &mpsc::UnboundedSender<String>,
) -> Result<tokio::process::Child, Failure> {
    // The URL goes in the worker's environment, not on its command line: a
    // command line is for every user of the machine to read (`ps`), an
    // environment only for the process's own user.
    let mut child = Command::new(exe)
        .env(crate::BACKEND_ENV, backend)
        .arg("--namespace")
        .arg(namespace)
        .args(crate::worker_flags())
        .arg("worker")
        .arg("--id")
        .arg(id.to_string())
        .arg("--counter")
        .arg(counter)
        .arg("--iterations")
        .arg(args.iterations.to_string())
        .arg("--wait")
        .arg(humantime::format_duration(args.wait).to_string())
        .arg("--lock")
        .arg(&args.lock)
        .arg("--release")
        .arg(&args.release)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| Failure::new(SOFTWARE, format!("cannot start worker {id}: {e}")))?;
    if let Some(out) = child.stdout.take() {
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(out).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
    }
    Ok(child)
}

/// Reads the workers' lines until they end: each worker's last tally, and whether
/// it said it was done (progress shown on a terminal).
async fn collect(
    rx: &mut mpsc::UnboundedReceiver<String>,
    args: &DemoArgs,
    started: Instant,
) -> BTreeMap<u32, (Tally, bool)> {
    let live = std::io::stderr().is_terminal();
    let total = u64::from(args.workers) * u64::from(args.iterations);
    let mut tallies: BTreeMap<u32, (Tally, bool)> = (0..args.workers)
        .map(|i| (i, (Tally::default(), false)))
        .collect();
    while let Some(line) = rx.recv().await {
        if let Some((done, id, tally)) = Tally::parse(&line) {
            tallies.insert(id, (tally, done));
            if live {
                let sum: u64 = tallies
                    .values()
                    .map(|(t, _)| t.acquired + t.timed_out + t.errors)
                    .sum();
                eprint!(
                    "\r  progress: {sum}/{total} attempts, {:.1}s",
                    started.elapsed().as_secs_f64()
                );
            }
        }
    }
    if live {
        eprintln!();
    }
    tallies
}

/// Prints each worker's tally and the total against the counter; whether they agree
/// and no hold overlapped.
fn report(
    tallies: &BTreeMap<u32, (Tally, bool)>,
    counter_value: Option<u64>,
    started: Instant,
) -> bool {
    println!(
        "{:<8}{:>10}{:>11}{:>8}{:>10}",
        "worker", "acquired", "timed_out", "errors", "overlaps"
    );
    let mut sum = Tally::default();
    for (id, (t, done)) in tallies {
        let mark = if *done { "" } else { "  (did not finish)" };
        println!(
            "{id:<8}{:>10}{:>11}{:>8}{:>10}{mark}",
            t.acquired, t.timed_out, t.errors, t.overlaps
        );
        sum.acquired += t.acquired;
        sum.timed_out += t.timed_out;
        sum.errors += t.errors;
        sum.overlaps += t.overlaps;
    }
    println!(
        "{:<8}{:>10}{:>11}{:>8}{:>10}",
        "total", sum.acquired, sum.timed_out, sum.errors, sum.overlaps
    );
    let consistent = counter_value == Some(sum.acquired) && sum.overlaps == 0;
    println!(
        "counter {} vs {} successful acquisitions in {:.2}s: {}",
        counter_value.map_or_else(|| "unreadable".to_owned(), |v| v.to_string()),
        sum.acquired,
        started.elapsed().as_secs_f64(),
        if consistent { "consistent" } else { "MISMATCH" }
    );
    consistent
}
