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
//! default 5). Under `cargo test` it runs one short round on SQLite.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use dlock_api::DistributeLockManagerBuilder;
use testsuite::bench::{is_bench, runtime};

/// The term lease (and ZooKeeper session timeout) of the benchmark.
const LEASE: Duration = Duration::from_secs(3);

/// How long any one step may take before the round fails.
const STEP_BOUND: Duration = Duration::from_secs(60);

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
        let end = Instant::now() + STEP_BOUND;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(what) => return Instant::now(),
                Ok(_) => {}
                Err(e) => panic!("no {what:?} from a candidate within {STEP_BOUND:?}: {e}"),
            }
        }
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

fn dlock_candidate(label: &str, url: &str, name: &str) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["candidate", label, url, name]);
    cmd
}

/// The candidate role (this binary re-executed): campaigns, says so, leads until
/// killed.
fn run_candidate(label: &str, url: &str, name: &str) {
    runtime().block_on(async {
        let backend = testsuite::backends::open_at(label, testsuite::backends::TestUrl::fixed(url))
            .await
            .expect("open the backend");
        let client = backend.client().await.expect("a client");
        let manager = DistributeLockManagerBuilder::new(client)
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
        std::future::pending::<()>().await;
    });
}

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
    let selected = if bench {
        std::env::var("DLOCK_TEST_BACKENDS").unwrap_or_else(|_| "sqlite".to_owned())
    } else {
        "sqlite".to_owned()
    };
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
