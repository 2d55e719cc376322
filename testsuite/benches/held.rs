//! Many locks held by one manager while its watchdog renews them, on every backend
//! selected: renewals in batches — the backend's default, when
//! `LockRemoteResource::batch_renew()` is `Some` — against, as a control in the same
//! run, one call per renewal (the same backend wrapped so that `batch_renew()` answers
//! `None`, `testsuite::bench::OneByOne`).
//!
//! For each backend and run (a number of locks, a lease renewed every third of it, a
//! fixed window) one table: renewals counted, the time taking the locks took,
//! renewals/s over the window, locks lost (must be 0), this process's CPU and the
//! server's (the processes named `postgres`; `mariadbd` or `mysqld`; `etcd`;
//! `redis-server` — every one on the machine, idle ones of other servers included;
//! none for SQLite, which runs in this process), both in % of a core over the window.
//! A backend without batched renewal (`batch_renew()` already `None`: the SQL
//! session modes) says so under its table: there both rows renew one hold per call.
//!
//! Runs: Redis 10 000 locks (lease 30 s over 21 s, lease 3 s over 6 s), taken 500 at
//! a time, as the `redis` bench's `held` scenario; SQL and etcd, slower, 2 000 locks
//! (lease 3 s over 6 s, lease 30 s over 21 s), taken 100 at a time.
//!
//! Run: `DLOCK_TEST_BACKENDS=postgres,mysql,etcd cargo bench -p testsuite --bench held`
//! (labels among sqlite, postgres, mysql, etcd, redis-cluster, redis; default sqlite;
//! servers and URLs as the conformance suite's, `testsuite::backends`). Under
//! `cargo test` it makes a short smoke pass: 100 locks, lease 4.5 s, over 2 s.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_api::{DistributeLockManager, LockRemoteResource};
use testsuite::bench::{
    cpu_seconds, is_bench, runtime, server_cpu_seconds, OneByOne, RenewCounter, Renewals,
};
use testsuite::TestBackend;

/// The labels this bench measures, in the order it runs them.
const LABELS: &[&str] = &[
    "sqlite",
    "postgres",
    "mysql",
    "etcd",
    "redis-cluster",
    "redis",
];

/// The bound on taking all of a run's locks (each acquire is bounded besides by the
/// manager's operation timeout).
const ACQUIRE_BOUND: Duration = Duration::from_secs(300);

/// The bound on closing a manager (releasing its locks) after a row.
const CLOSE_BOUND: Duration = Duration::from_secs(120);

/// One run: how many locks, their lease, the window measured.
struct Run {
    locks: usize,
    lease: Duration,
    window: Duration,
}

fn is_redis(label: &str) -> bool {
    label.starts_with("redis")
}

/// The runs for `label`.
fn runs(label: &str, bench: bool) -> Vec<Run> {
    let run = |locks, lease, window| Run {
        locks,
        lease: Duration::from_millis(lease),
        window: Duration::from_millis(window),
    };
    if !bench {
        // Beside the CPU-heavy tests on a 2-core machine a renewal may take a second
        // (a 1.5 s lease, its loss margin raised to that round trip, was once lost
        // there): the smoke pass checks the bench runs, so its lease leaves room.
        vec![run(100, 4_500, 2_000)]
    } else if is_redis(label) {
        vec![run(10_000, 30_000, 21_000), run(10_000, 3_000, 6_000)]
    } else {
        vec![run(2_000, 3_000, 6_000), run(2_000, 30_000, 21_000)]
    }
}

/// How many locks are taken concurrently: Redis answers fast, SQL and etcd slower.
fn concurrency(label: &str) -> usize {
    if is_redis(label) {
        500
    } else {
        100
    }
}

/// The command names of `label`'s server processes (none for SQLite, in-process).
fn server_processes(label: &str) -> &'static [&'static str] {
    match label {
        "postgres" => &["postgres"],
        "mysql" => &["mariadbd", "mysqld"],
        "etcd" => &["etcd"],
        "redis" | "redis-cluster" => &["redis-server"],
        _ => &[],
    }
}

fn rate(n: u64, t: Duration) -> f64 {
    n as f64 / t.as_secs_f64()
}

/// % of a core that `secs` CPU seconds over `window` are.
fn pct(secs: f64, window: Duration) -> f64 {
    100.0 * secs / window.as_secs_f64()
}

/// Takes `locks` fresh locks of `m`, `concurrency` at a time, and returns their guards.
async fn take(
    m: &DistributeLockManager,
    locks: usize,
    concurrency: usize,
) -> Vec<dlock_api::LockGuard> {
    let tag = format!("bench{:x}", fastrand::u64(..));
    let mut guards = Vec::with_capacity(locks);
    for chunk in (0..locks).collect::<Vec<_>>().chunks(concurrency) {
        let batch: Vec<_> = chunk
            .iter()
            .map(|i| {
                let lock = m.lock(format!("{tag}:held:{i}"));
                tokio::spawn(async move {
                    lock.try_lock(Duration::ZERO)
                        .await
                        .unwrap()
                        .expect("a fresh lock is free")
                })
            })
            .collect();
        for h in batch {
            guards.push(h.await.unwrap());
        }
    }
    guards
}

async fn held_for(label: &str, backend: &dyn TestBackend, run: &Run) {
    let Run {
        locks,
        lease,
        window,
    } = *run;
    let servers = server_processes(label);
    println!(
        "\n**{label}: {locks} locks held by one manager** (lease {lease:?}, renewed every {:?}), over {window:?}:\n",
        lease / 3
    );
    println!("| renewals | acquired in | renewals/s | lost | process CPU (% of a core) | server CPU (% of a core) |");
    println!("|---|---|---|---|---|---|");
    let mut batches = true;
    for batched in [true, false] {
        // A new client per row (a new connection or pool), as the Redis bench.
        let client: Arc<dyn LockRemoteResource> = backend
            .client()
            .await
            .unwrap_or_else(|e| panic!("{label}: a client: {e}"));
        if batched {
            batches = client.batch_renew().is_some();
        }
        let counter = Arc::new(RenewCounter::default());
        let builder = if batched {
            DistributeLockManager::builder(client)
        } else {
            DistributeLockManager::builder(OneByOne(client))
        };
        let m = builder
            .lease(lease)
            .with_handler(Renewals(Arc::clone(&counter)))
            .build()
            .unwrap();
        let started = Instant::now();
        let guards = tokio::time::timeout(ACQUIRE_BOUND, take(&m, locks, concurrency(label)))
            .await
            .unwrap_or_else(|_| {
                panic!("{label}: taking {locks} locks took over {ACQUIRE_BOUND:?}")
            });
        let took = started.elapsed();
        let (cpu0, server0, renew0, t0) = (
            cpu_seconds(),
            server_cpu_seconds(servers),
            counter.get(),
            Instant::now(),
        );
        tokio::time::sleep(window).await;
        let (cpu1, server1, renew1, t1) = (
            cpu_seconds(),
            server_cpu_seconds(servers),
            counter.get(),
            t0.elapsed(),
        );
        let lost_reasons: Vec<_> = guards.iter().filter_map(|g| g.lost_reason()).collect();
        let lost = lost_reasons.len();
        let server = if servers.is_empty() {
            "–".to_owned()
        } else {
            format!("{:.1}", pct(server1 - server0, t1))
        };
        println!(
            "| {} | {:.2} s | {:.0} | {lost} | {:.1} | {server} |",
            if batched {
                "**in batches** (default)"
            } else {
                "one call each (control)"
            },
            took.as_secs_f64(),
            rate(renew1 - renew0, t1),
            pct(cpu1 - cpu0, t1),
        );
        assert_eq!(
            lost,
            0,
            "{label} ({}): locks were lost while held: {lost_reasons:?}",
            if batched {
                "in batches"
            } else {
                "one call each"
            }
        );
        drop(guards);
        if tokio::time::timeout(CLOSE_BOUND, m.close()).await.is_err() {
            eprintln!("{label}: closing the manager took over {CLOSE_BOUND:?}; left to expire");
        }
    }
    if !batches {
        println!(
            "\n({label}: the backend has no batched renewal — `batch_renew()` is `None` — so both rows renew one hold per call.)"
        );
    }
}

fn main() {
    let bench = is_bench();
    let selected = std::env::var("DLOCK_TEST_BACKENDS").unwrap_or_else(|_| "sqlite".to_owned());
    let labels: Vec<&str> = LABELS
        .iter()
        .copied()
        .filter(|l| selected.split(',').any(|s| s.trim() == *l))
        .collect();
    if labels.is_empty() {
        println!(
            "none of {} selected in DLOCK_TEST_BACKENDS; not running the held bench",
            LABELS.join(", ")
        );
        return;
    }
    runtime().block_on(async {
        for label in labels {
            // Kept for the label's runs: a SQLite file lives as long as its test backend.
            let backend = testsuite::backends::open(label)
                .await
                .unwrap_or_else(|e| panic!("{label}: {e}"));
            for run in runs(label, bench) {
                held_for(label, &*backend, &run).await;
            }
        }
    });
}
