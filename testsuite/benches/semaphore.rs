//! A semaphore's acquire + release against the lock's own cycle on the same backend:
//! `sem.try_acquire(1, 0)` + `release()` (3 permits, uncontended) against
//! `lock.try_lock(0)` + `unlock()`, through the user API on one manager, one task,
//! in interleaved rounds (median cycles/s of each).
//!
//! Run: `cargo bench -p testsuite --bench semaphore` (DLOCK_TEST_BACKENDS selects the
//! backends, servers as `scripts/test` starts them; DLOCK_BENCH_ROUNDS rounds,
//! default 5, of DLOCK_BENCH_SECS seconds, default 2). Under `cargo test` it runs one
//! short round on memory and SQLite.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use dlock_api::DistributeLockManagerBuilder;
use testsuite::bench::{api_contestant, cycles, interleaved, is_bench, runtime, Contestant};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let bench = is_bench();
    let (rounds, secs, selected) = if bench {
        (
            env_or("DLOCK_BENCH_ROUNDS", 5u32),
            env_or("DLOCK_BENCH_SECS", 2.0f64),
            std::env::var("DLOCK_TEST_BACKENDS").unwrap_or_else(|_| "memory,sqlite".to_owned()),
        )
    } else {
        (1, 0.2, "memory,sqlite".to_owned())
    };
    let per_round = Duration::from_secs_f64(secs);
    println!(
        "semaphore vs lock: acquire + release cycles/s, 1 task, {rounds} round(s) of {secs} s"
    );
    println!("| backend | lock | semaphore | semaphore ÷ lock |");
    println!("|---|---|---|---|");
    runtime().block_on(async {
        for label in testsuite::backends::KNOWN {
            if !selected.split(',').any(|l| l.trim() == *label) {
                continue;
            }
            let backend = testsuite::backends::open(label)
                .await
                .unwrap_or_else(|e| panic!("{label}: {e}"));
            let manager = DistributeLockManagerBuilder::new(backend.client().await.unwrap())
                .namespace(format!("bench-sem-{:x}", fastrand::u64(..)))
                .build()
                .unwrap();
            let semaphore = manager.semaphore("sem", 3);
            let contestants = vec![
                api_contestant(1, manager.clone(), |_| "lock".to_owned()),
                Contestant::tasks("semaphore", 1, move |_, end| {
                    cycles(semaphore.clone(), end, |sem| async move {
                        let permit = sem
                            .try_acquire(1, Duration::ZERO)
                            .await
                            .expect("acquire")
                            .expect("uncontended");
                        permit.release().await.expect("release");
                        sem
                    })
                }),
            ];
            let rates = interleaved(contestants, rounds, per_round).await;
            let (lock, sem) = (rates[0].1, rates[1].1);
            println!(
                "| {label} | {lock:.0}/s | {sem:.0}/s | **{:.2}×** |",
                sem / lock
            );
            manager.close().await;
        }
    });
}
