//! Leader failover: the leader's process is SIGKILLed; how long until the next
//! candidate — another process, already queued — acts as leader.
//!
//! dlock on each selected backend with a term lease of 3 s (renewed every second;
//! ZooKeeper: a 3 s session), against Java Curator's `LeaderLatch` on the same
//! ZooKeeper with the same 3 s session, in the same run. The kill lands at a random
//! point of the renewal cycle, so a lease backend's failover is the killed term's
//! remaining lease (2–3 s) plus the wake-up; a session backend's is the session
//! timeout plus the server's expiry tick.
//!
//! Run: `cargo bench -p testsuite --bench failover` (DLOCK_TEST_BACKENDS selects the
//! backends, servers as `scripts/test` starts them; DLOCK_BENCH_ROUNDS rounds each,
//! default 5).
//!
//! Under `cargo test` it is the killed- and frozen-leader test of every selected
//! backend (DLOCK_TEST_BACKENDS, default SQLite; not `memory`, whose store lives in
//! one process), one round of each:
//! * **killed**: the leader's process is SIGKILLed; the queued candidate must lead
//!   within the term's lease (ZooKeeper: session timeout) plus [`WAKE_SLACK`], with a
//!   greater fencing token;
//! * **frozen**: the leader's process is SIGSTOPped; the queued candidate must lead
//!   the same way while it is stopped, and once SIGCONTed the old leader must report
//!   its term lost within [`WAKE_SLACK`] (its lost signal, before it does anything
//!   else as leader).
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use dlock_api::DistributeLockManager;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use testsuite::bench::{is_bench, runtime};

/// The term lease (and ZooKeeper session timeout) of the benchmark.
const LEASE: Duration = Duration::from_secs(3);

/// How long any one step may take before the round fails.
const STEP_BOUND: Duration = Duration::from_secs(60);

/// Under `cargo test`: how long after the dead or frozen term's lease (session) may
/// end the next candidate may take to lead, and a resumed leader to report its loss
/// (the queued candidate's wake-up, a ZooKeeper server's expiry tick, scheduling).
const WAKE_SLACK: Duration = Duration::from_secs(3);

/// A candidate process and its stdout lines.
struct Candidate {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Candidate {
    fn spawn(mut cmd: Command) -> Candidate {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start a candidate");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Candidate { child, lines }
    }

    /// Waits for a line starting with `what`; the instant it arrived.
    fn expect(&self, what: &str) -> Instant {
        self.expect_within(what, STEP_BOUND).0
    }

    /// Waits up to `bound` for a line starting with `what`; the instant it arrived and
    /// the rest of the line.
    fn expect_within(&self, what: &str, bound: Duration) -> (Instant, String) {
        let end = Instant::now() + bound;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix(what) {
                        return (Instant::now(), rest.trim().to_owned());
                    }
                }
                Err(e) => panic!("no {what:?} from a candidate within {bound:?}: {e}"),
            }
        }
    }

    /// Waits for the `leading <token>` line; the instant it arrived and the token.
    fn leading(&self) -> (Instant, u64) {
        let (at, token) = self.expect_within("leading", STEP_BOUND);
        let token = token
            .parse()
            .unwrap_or_else(|e| panic!("a candidate's token {token:?}: {e}"));
        (at, token)
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`).
    fn pause(&self, stop: bool) {
        let signal = if stop {
            Signal::SIGSTOP
        } else {
            Signal::SIGCONT
        };
        let pid = i32::try_from(self.child.id()).expect("a pid");
        kill(Pid::from_raw(pid), signal).unwrap_or_else(|e| panic!("{signal} to a candidate: {e}"));
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Candidate {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One failover: A leads, B is queued, A is SIGKILLed at a random point of its
/// renewal cycle, B leads. Returns kill → B leading.
fn round(spawn: &dyn Fn() -> Command) -> Duration {
    let mut a = Candidate::spawn(spawn());
    a.expect("leading");
    let b = Candidate::spawn(spawn());
    b.expect("campaigning");
    std::thread::sleep(Duration::from_millis(fastrand::u64(0..=1000)));
    let killed = Instant::now();
    a.kill();
    b.expect("leading").duration_since(killed)
}

/// The killed-leader test of `label` (one round of [`round`], judged): the next
/// candidate leads within the lease and [`WAKE_SLACK`], with a greater token.
fn killed_leader_is_replaced(label: &str, spawn: &dyn Fn() -> Command) -> Duration {
    let mut a = Candidate::spawn(spawn());
    let (_, first) = a.leading();
    let b = Candidate::spawn(spawn());
    b.expect("campaigning");
    std::thread::sleep(Duration::from_millis(fastrand::u64(0..=1000)));
    let killed = Instant::now();
    a.kill();
    let (led, next) = b.leading();
    let took = led.duration_since(killed);
    assert!(
        took <= LEASE + WAKE_SLACK,
        "{label}: the next candidate led {took:?} after the leader was killed (lease {LEASE:?})"
    );
    assert!(
        next > first,
        "{label}: the next leader's token {next} is not above the killed one's {first}"
    );
    took
}

/// The frozen-leader test of `label`: A leads, B is queued, A is SIGSTOPped; B leads
/// within the lease and [`WAKE_SLACK`] with a greater token while A is stopped; once
/// SIGCONTed, A reports its term lost within [`WAKE_SLACK`]. Returns stop → B leading.
fn frozen_leader_is_replaced_and_told(label: &str, spawn: &dyn Fn() -> Command) -> Duration {
    let a = Candidate::spawn(spawn());
    let (_, first) = a.leading();
    let b = Candidate::spawn(spawn());
    b.expect("campaigning");
    std::thread::sleep(Duration::from_millis(fastrand::u64(0..=1000)));
    let stopped = Instant::now();
    a.pause(true);
    let (led, next) = b.leading();
    let took = led.duration_since(stopped);
    a.pause(false);
    let resumed = Instant::now();
    assert!(
        took <= LEASE + WAKE_SLACK,
        "{label}: the next candidate led {took:?} after the leader was frozen (lease {LEASE:?})"
    );
    assert!(
        next > first,
        "{label}: the next leader's token {next} is not above the frozen one's {first}"
    );
    let (told, reason) = a.expect_within("lost", WAKE_SLACK);
    println!(
        "  {label}: frozen leader told {reason} {} ms after SIGCONT",
        told.duration_since(resumed).as_millis()
    );
    took
}

fn dlock_candidate(label: &str, url: &str, name: &str) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["candidate", label, url, name]);
    cmd
}

/// The candidate role (this binary re-executed): campaigns, says so, leads until
/// killed, says when its term is lost.
fn run_candidate(label: &str, url: &str, name: &str) {
    // What an application using TLS does early in `main` (the parent's `server_url`
    // did it for the parent only).
    testsuite::backends::install_crypto_provider();
    runtime().block_on(async {
        let backend = testsuite::backends::open_at(label, testsuite::backends::TestUrl::fixed(url))
            .await
            .expect("open the backend");
        let client = backend.client().await.expect("a client");
        let manager = DistributeLockManager::builder(client)
            .lease(LEASE)
            .build()
            .expect("manager");
        let election = manager.election(name);
        let campaign = election.campaign("bench");
        tokio::pin!(campaign);
        // Queued once the first attempt is in: a campaign that has not led within
        // 200 ms is waiting in the queue.
        let term = tokio::select! {
            term = &mut campaign => Some(term.expect("campaign")),
            () = tokio::time::sleep(Duration::from_millis(200)) => None,
        };
        println!("campaigning");
        let term = match term {
            Some(term) => term,
            None => campaign.await.expect("campaign"),
        };
        println!("leading {}", term.fencing_token());
        let reason = term.lost().await;
        println!("lost {reason}");
        // A lost leader stays in the race, as the killed-leader test's queued
        // candidate does, until the test ends it.
        std::future::pending::<()>().await;
    });
}

/// Under `cargo test`: a killed and a frozen leader on every selected label whose
/// clients can live in other processes, one round each (see the module docs).
fn killed_and_frozen_leaders(selected: &str) {
    println!("failover test: a killed and a frozen leader; lease / session {LEASE:?}");
    let labels: Vec<&str> = testsuite::backends::KNOWN
        .iter()
        .copied()
        .filter(|l| *l != "memory")
        .filter(|l| selected.split(',').any(|s| s.trim() == *l))
        .collect();
    // The backends one after another took over two minutes of waiting on leases;
    // each round has its own names (and so its own candidates and terms), so a few
    // backends run at once, each on a thread of its own.
    let next = std::sync::Mutex::new(labels.into_iter());
    std::thread::scope(|scope| {
        for _ in 0..PARALLEL_BACKENDS {
            scope.spawn(|| loop {
                let Some(label) = next.lock().unwrap().next() else {
                    break;
                };
                let url = url_for(label);
                // Each round on a name of its own, shared by both of its candidates.
                let name = format!("failover-{:016x}", fastrand::u64(..));
                let killed =
                    killed_leader_is_replaced(label, &|| dlock_candidate(label, &url, &name));
                let name = format!("failover-{:016x}", fastrand::u64(..));
                let frozen = frozen_leader_is_replaced_and_told(label, &|| {
                    dlock_candidate(label, &url, &name)
                });
                println!(
                    "  {label}: killed → next leader {} ms, frozen → next leader {} ms",
                    killed.as_millis(),
                    frozen.as_millis()
                );
            });
        }
    });
}

/// How many backends the test under `cargo test` runs at once.
const PARALLEL_BACKENDS: usize = 3;

/// The label's URL, the same for every candidate of the run (SQLite: one file);
/// ZooKeeper sessions time out like the lease.
fn url_for(label: &str) -> testsuite::backends::TestUrl {
    let url = testsuite::backends::server_url(label).expect("a URL for the label");
    match label {
        "zk" | "zk-ensemble" => {
            url.with_suffix(&format!("?session_timeout={}ms", LEASE.as_millis()))
        }
        _ => url,
    }
}

fn summary(rounds: &mut [Duration]) -> (Duration, Duration, Duration) {
    rounds.sort();
    (
        rounds[0],
        rounds[rounds.len() / 2],
        rounds[rounds.len() - 1],
    )
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("candidate") {
        run_candidate(&args[2], &args[3], &args[4]);
        return;
    }
    let bench = is_bench();
    let rounds: usize = if bench {
        std::env::var("DLOCK_BENCH_ROUNDS")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(5)
    } else {
        1
    };
    let selected = std::env::var("DLOCK_TEST_BACKENDS").unwrap_or_else(|_| "sqlite".to_owned());
    if !bench {
        killed_and_frozen_leaders(&selected);
        return;
    }
    println!(
        "failover: leader SIGKILLed → next candidate leading; lease / session {LEASE:?}, {rounds} round(s)"
    );
    let mut zk_median = None;
    // Every label whose clients can live in other processes (not memory).
    for label in testsuite::backends::KNOWN
        .iter()
        .filter(|l| **l != "memory")
    {
        if !selected.split(',').any(|l| l.trim() == *label) {
            continue;
        }
        let url = url_for(label);
        let mut times = Vec::new();
        for _ in 0..rounds {
            let name = format!("failover-{:016x}", fastrand::u64(..));
            times.push(round(&|| dlock_candidate(label, &url, &name)));
        }
        let (min, median, max) = summary(&mut times);
        if *label == "zk" {
            zk_median = Some(median);
        }
        println!(
            "  dlock {label:<18} median {:>5} ms  (min {} ms, max {} ms)",
            median.as_millis(),
            min.as_millis(),
            max.as_millis()
        );
    }
    if let (true, Some(dlock)) = (bench, zk_median) {
        let hosts = testsuite::backends::server_url("zk")
            .and_then(|u| {
                u.strip_prefix("zk://")
                    .map(|r| r.split('/').next().unwrap_or(r).to_owned())
            })
            .expect("ZooKeeper hosts");
        let mut times = Vec::new();
        for _ in 0..rounds {
            let path = format!("/dlock-test/failover-java-{:016x}", fastrand::u64(..));
            times.push(round(&|| {
                let mut java = testsuite::curator::worker().unwrap_or_else(|e| panic!("{e}"));
                java.args([
                    "latch-candidate",
                    &hosts,
                    &path,
                    &LEASE.as_millis().to_string(),
                ]);
                java
            }));
        }
        let (min, median, max) = summary(&mut times);
        println!(
            "  Curator LeaderLatch (zk)  median {:>5} ms  (min {} ms, max {} ms)",
            median.as_millis(),
            min.as_millis(),
            max.as_millis()
        );
        println!(
            "  dlock zk / Curator: {:.2}× the failover time",
            dlock.as_secs_f64() / median.as_secs_f64()
        );
    }
}
