//! ZooKeeper, one run, one server: dlock-zk against the floor (create an ephemeral
//! sequential node + delete it, on one session: the least a ZooKeeper lock can do)
//! and against Java Curator's `InterProcessMutex` (testsuite/java, Debian's jars).
//! A control adds to the floor what every ZooKeeper lock must also learn — the
//! children, listed (and watched) in the create's round trip — to show what that
//! costs on this machine.
//!
//! Scenarios: 1 task uncontended; 16 tasks on 16 locks over one session (Curator: 16
//! threads on one client). The server fsyncs every write, and
//! this VM's disk speed drifts, so the implementations run in interleaved rounds
//! (floor, dlock, …, dlock, …, floor, rotating) and each figure is the median of its
//! rounds: drift hits all of them alike.
//!
//! Run: `cargo bench -p testsuite --bench zk` (DLOCK_ZK_URL, default
//! zk://127.0.0.1:2181/dlock-test; DLOCK_BENCH_SECS per implementation, default 6,
//! split into 6 rounds; DLOCK_BENCH_ONLY=one,many picks scenarios and
//! DLOCK_BENCH_IMPL=floor,SPI implementations). Under `cargo test` it runs a short
//! smoke pass.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_api::{DistributeLockManager, LockRemoteResource};
use dlock_zk::ZkBackend;
use testsuite::bench::{
    api_contestant, backend_selected, cycles, interleaved, is_bench, spi_contestant, Contestant,
};
use zookeeper_client::{Acls, Client, CreateMode};

async fn scenario(
    url: &str,
    hosts: &str,
    tasks: usize,
    rounds: u32,
    per_round: Duration,
    with_curator: bool,
) -> Vec<(&'static str, f64)> {
    let tag = format!("bench{:x}", fastrand::u32(..));

    // Connecting dlock first also creates the root the floor's parents go under.
    let backend = ZkBackend::connect(url).await.unwrap();

    // Floor: create ephemeral-sequential + delete on one session, parents made once.
    let client = Arc::new(Client::connect(hosts).await.unwrap());
    let parents: Arc<Vec<String>> = Arc::new(
        (0..tasks)
            .map(|i| format!("/dlock-test/{tag}-floor-{i}"))
            .collect(),
    );
    for p in parents.iter() {
        client
            .create(
                p,
                &[],
                &CreateMode::Persistent.with_acls(Acls::anyone_all()),
            )
            .await
            .unwrap();
    }
    let floor = {
        let client = Arc::clone(&client);
        let parents = Arc::clone(&parents);
        move |i: usize, end: Instant| {
            let client = Arc::clone(&client);
            let prefix = format!("{}/lock-", parents[i]);
            cycles((client, prefix), end, |(client, prefix)| async move {
                let opts = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
                let (_, seq) = client.create(&prefix, b"", &opts).await.unwrap();
                client
                    .delete(&format!("{prefix}{seq}"), None)
                    .await
                    .unwrap();
                (client, prefix)
            })
        }
    };

    // Control: the floor plus what any ZooKeeper lock must also learn, whether its
    // node is the lowest — the children listed (with a watch, as a holder keeps)
    // in the same round trip as the create. dlock's cycle does this, and no less.
    let listed = {
        let client = Arc::clone(&client);
        let parents = Arc::clone(&parents);
        move |i: usize, end: Instant| {
            let client = Arc::clone(&client);
            let parent = parents[i].clone();
            cycles((client, parent), end, |(client, parent)| async move {
                let opts = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
                let prefix = format!("{parent}/lock-");
                let (created, listed) = tokio::join!(
                    client.create(&prefix, b"", &opts),
                    client.get_and_watch_children(&parent)
                );
                let (_, seq) = created.unwrap();
                let (children, _, watch) = listed.unwrap();
                assert!(children.len() == 1);
                client
                    .delete(&format!("{prefix}{seq}"), None)
                    .await
                    .unwrap();
                watch.changed().await;
                (client, parent)
            })
        }
    };

    let m = DistributeLockManager::builder(backend.clone())
        .build()
        .unwrap();
    let spi: Arc<dyn LockRemoteResource> = Arc::new(backend);

    let mut curator = with_curator.then(|| {
        testsuite::curator::BenchServer::start(
            hosts,
            &format!("/dlock-test/{tag}-curator"),
            tasks,
            "mutex",
        )
        .unwrap_or_else(|e| panic!("{e}"))
    });
    let mut contestants = vec![
        Contestant::tasks("floor (create ephemeral-sequential + delete)", tasks, floor),
        Contestant::tasks(
            "control: floor + listing (create and list+watch in one round trip, delete)",
            tasks,
            listed,
        ),
        api_contestant(tasks, m.clone(), {
            let tag = tag.clone();
            move |i| format!("{tag}-dlock-{i}")
        }),
        spi_contestant(tasks, spi, {
            let tag = tag.clone();
            move |i| format!("{tag}-spi-{i}")
        }),
    ];
    if let Some(curator) = curator.as_mut() {
        contestants.push(Contestant::new(
            "Java Curator InterProcessMutex (a thread per lock)",
            Box::new(move |d| {
                let result = curator.round(d).unwrap_or_else(|e| panic!("{e}"));
                Box::pin(async move { result })
            }),
        ));
    }
    let rows = interleaved(contestants, rounds, per_round).await;
    m.close().await;
    for p in parents.iter() {
        client.delete(p, None).await.unwrap();
    }
    rows
}

fn main() {
    let bench = is_bench();
    if !backend_selected("zk", "ZooKeeper") {
        return;
    }
    let url =
        std::env::var("DLOCK_ZK_URL").unwrap_or_else(|_| "zk://127.0.0.1:2181/dlock-test".into());
    let hosts = url
        .trim_start_matches("zk://")
        .split(['/', '?'])
        .next()
        .unwrap()
        .to_owned();
    let (rounds, total) = if bench {
        let secs = std::env::var("DLOCK_BENCH_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(6.0);
        (6, Duration::from_secs_f64(secs))
    } else {
        (1, Duration::from_millis(200))
    };
    let per_round = total / rounds;
    let rt = testsuite::bench::runtime();
    rt.block_on(async {
        let only = std::env::var("DLOCK_BENCH_ONLY").unwrap_or_default();
        for (tasks, title, curator, key) in [(1usize, "1 task, uncontended", true, "one"), (16, "16 tasks on 16 locks, one session", true, "many")] {
            if !only.is_empty() && !only.split(',').any(|o| o == key) {
                continue;
            }
            let rows = scenario(&url, &hosts, tasks, rounds, per_round, curator).await;
            let floor = rows.first().map_or(1.0, |r| r.1);
            println!("\n**{title}** (acquire+release cycles/s, {rounds} interleaved rounds)\n\n| implementation | cycles/s | × floor |\n|---|---|---|");
            for (name, r) in rows {
                println!("| {name} | {r:.0} | {:.2} |", r / floor);
            }
        }
    });
}
