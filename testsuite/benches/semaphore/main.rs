//! A semaphore's acquire + release against the lock's own cycle on the same backend:
//! `sem.try_acquire(1, 0)` + `release()` (3 permits, uncontended) against
//! `lock.try_lock(0)` + `unlock()`, through the user API on one manager, one task,
//! in interleaved rounds (median cycles/s of each, and the median of the semaphore ÷
//! lock ratios taken round by round).
//!
//! Same-run controls, in the same interleaved rounds: the read lock's cycle (its
//! grant writes what a permit's does: the name's row and a holder's row); both
//! cycles on the backend alone (the SPI: no chain, guard or hold), so the API's share
//! of a gap shows; on SQL, raw statements on the same pool — the lock's floor
//! against a semaphore's, with
//! the holders in rows of their own (dlock's design) or in the semaphore's row
//! ([`sql_floor`]); on ZooKeeper, Java Curator's `InterProcessSemaphoreV2` (one
//! lease of 3) against its `InterProcessMutex` — the ratio the recipe's own protocol
//! allows.
//!
//! Run: `cargo bench -p testsuite --bench semaphore` (DLOCK_TEST_BACKENDS selects the
//! backends, servers as `scripts/test` starts them; DLOCK_BENCH_ROUNDS rounds,
//! default 5, of DLOCK_BENCH_SECS seconds, default 2). Under `cargo test` it runs one
//! short round on memory and SQLite.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use dlock_api::{DistributeLockManager, LockMode};
use testsuite::bench::{
    api_contestant, api_cycle, cycles, interleaved_rounds, is_bench, median, per_round_ratio,
    runtime, spi_contestant_as, Contestant,
};
use testsuite::curator::BenchServer;
use testsuite::proxy::{join_hosts, split_url};

mod sql_floor;

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
    println!("| backend | lock | read lock | semaphore | semaphore ÷ lock | per-round median | semaphore ÷ read lock | SPI: lock, semaphore: per-round ÷ | control: semaphore ÷ lock |");
    println!("|---|---|---|---|---|---|---|---|---|");
    runtime().block_on(async {
        for label in testsuite::backends::KNOWN {
            if !selected.split(',').any(|l| l.trim() == *label) {
                continue;
            }
            let backend = testsuite::backends::open(label)
                .await
                .unwrap_or_else(|e| panic!("{label}: {e}"));
            let namespace = format!("bench-sem-{:x}", fastrand::u64(..));
            let client = backend.client().await.unwrap();
            let manager = DistributeLockManager::builder(std::sync::Arc::clone(&client))
                .namespace(namespace.clone())
                .build()
                .unwrap();
            let semaphore = manager.semaphore("sem", 3);
            let read = manager.read_write_lock("rw").read().clone();
            // ZooKeeper's control: Curator's own recipes on the same servers.
            let hosts = label
                .starts_with("zk")
                .then(|| testsuite::backends::server_url(label))
                .flatten()
                .map(|url| join_hosts(&split_url(&url).unwrap_or_else(|e| panic!("{e}")).hosts));
            let mut curator: Vec<BenchServer> = hosts
                .iter()
                .flat_map(|hosts| {
                    ["mutex", "semaphore-3"].map(|kind| {
                        BenchServer::start(hosts, &format!("/dlock-test/{namespace}-curator-{kind}"), 1, kind)
                            .unwrap_or_else(|e| panic!("{label}: {e}"))
                    })
                })
                .collect();
            // SQL's control: raw floors on the pool of a backend of its own.
            // (Its URL lives as long as the floors: a SQLite file goes with it.)
            let floor_url = matches!(*label, "sqlite" | "mysql" | "postgres")
                .then(|| testsuite::backends::server_url(label).unwrap());
            let floors = match &floor_url {
                Some(url) => {
                    let jdbc = dlock_jdbc::JdbcBackend::connect(url).await.unwrap();
                    Some(sql_floor::Floor::all(jdbc.sqlx_pool(), &namespace).await)
                }
                None => None,
            };
            let mut contestants = vec![
                api_contestant(1, manager.clone(), |_| "lock".to_owned()),
                Contestant::tasks("read lock", 1, move |_, end| {
                    cycles(read.clone(), end, |read| async move {
                        api_cycle(&read).await;
                        read
                    })
                }),
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
            // The SPI control: the same two cycles on the manager's backend alone (no
            // chain, guard or hold), so the API's share of a gap shows.
            for (name, mode, tag) in [
                ("lock (SPI)", LockMode::Exclusive, "spi-lock"),
                ("semaphore (SPI)", LockMode::Permits(1), "spi-sem"),
            ] {
                let lock = format!("{namespace}:{tag}");
                let backend = std::sync::Arc::clone(&client);
                contestants.push(spi_contestant_as(name, 1, backend, mode, move |_| lock.clone()));
            }
            // Spawned, as dlock's contestants are (not run on the bench's own thread).
            for (floor, name) in floors.into_iter().flatten().zip([
                "floor: lock row",
                "floor: holder rows",
                "floor: holders in the row",
            ]) {
                let floor = std::sync::Arc::new(floor);
                contestants.push(Contestant::tasks(name, 1, move |_, end| {
                    cycles(std::sync::Arc::clone(&floor), end, |floor| async move {
                        floor.cycle().await;
                        floor
                    })
                }));
            }
            for (server, name) in curator.iter_mut().zip(["Curator mutex", "Curator semaphore"]) {
                contestants.push(Contestant::new(
                    name,
                    Box::new(move |d| {
                        let result = server.round(d).unwrap_or_else(|e| panic!("{e}"));
                        Box::pin(async move { result })
                    }),
                ));
            }
            let rounds = interleaved_rounds(contestants, rounds, per_round).await;
            let rates: Vec<(&str, f64)> = rounds
                .iter()
                .map(|(label, rates)| (*label, median(rates.clone())))
                .collect();
            let (lock, read, sem) = (rates[0].1, rates[1].1, rates[2].1);
            // Semaphore ÷ lock judged round by round (both ran in the same seconds).
            let paired = per_round_ratio(&rounds[2].1, &rounds[0].1);
            let spi_paired = per_round_ratio(&rounds[4].1, &rounds[3].1);
            let control = match rates.get(5..) {
                Some([mutex, semaphore]) => format!(
                    "Curator semaphore ÷ mutex: {:.0}/s ÷ {:.0}/s = **{:.2}×**",
                    semaphore.1,
                    mutex.1,
                    semaphore.1 / mutex.1
                ),
                Some([lock, rows, json]) => format!(
                    "floor {:.0}/s; holder rows **{:.2}×**, holders in the row **{:.2}×**",
                    lock.1,
                    rows.1 / lock.1,
                    json.1 / lock.1
                ),
                _ => "—".to_owned(),
            };
            println!(
                "| {label} | {lock:.0}/s | {read:.0}/s | {sem:.0}/s | **{:.2}×** | **{paired:.2}** | {:.2}× | {:.0}/s, {:.0}/s: {spi_paired:.2} | {control} |",
                sem / lock,
                sem / read,
                rates[3].1,
                rates[4].1,
            );
            manager.close().await;
        }
    });
}
