//! ZooKeeper, one run, one server: dlock-zk against the floor (create an ephemeral
//! sequential node + delete it, on one session: the least a ZooKeeper lock can do)
//! and against Java Curator's `InterProcessMutex` (testsuite/java, Debian's jars).
//!
//! Scenarios: 1 task uncontended (floor, dlock user API, dlock SPI, Curator);
//! 16 tasks on 16 locks over one session (floor, dlock).
//!
//! Run: `cargo bench -p testsuite --bench zk` (DLOCK_ZK_URL, default
//! zk://127.0.0.1:2181/dlock-test; DLOCK_BENCH_SECS per measurement, default 3).
//! Under `cargo test` it runs a short smoke pass.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_api::spi::{AcquireRequest, ReleaseRequest};
use dlock_api::{DistributeLockManager, LockMode, LockName, LockRemoteResource, OwnerId};
use dlock_zk::ZkBackend;
use zookeeper_client::{Acls, Client, CreateMode};

struct Cfg {
    url: String,
    hosts: String,
    secs: Duration,
}

fn rate(n: u64, t: Duration) -> f64 {
    n as f64 / t.as_secs_f64()
}

/// Runs `tasks` copies of `body(task_index, end)` after a short warm-up window;
/// returns total cycles and the measured time.
async fn run_tasks<F, Fut>(tasks: usize, secs: Duration, body: F) -> (u64, Duration)
where
    F: Fn(usize, Instant) -> Fut,
    Fut: Future<Output = u64> + Send + 'static,
{
    let warm = Instant::now() + secs / 4;
    let warmups: Vec<_> = (0..tasks).map(|i| tokio::spawn(body(i, warm))).collect();
    for h in warmups {
        h.await.unwrap();
    }
    let start = Instant::now();
    let end = start + secs;
    let handles: Vec<_> = (0..tasks).map(|i| tokio::spawn(body(i, end))).collect();
    let mut total = 0;
    for h in handles {
        total += h.await.unwrap();
    }
    (total, start.elapsed())
}

async fn uncontended(cfg: &Cfg, tasks: usize, with_curator: bool) -> Vec<(&'static str, f64)> {
    let tag = format!("bench{:x}", fastrand::u32(..));
    let mut out = Vec::new();

    // Floor: create ephemeral-sequential + delete on one session, parents made once.
    let client = Arc::new(Client::connect(&cfg.hosts).await.unwrap());
    let parents: Vec<String> = (0..tasks).map(|i| format!("/dlock-test/{tag}-floor-{i}")).collect();
    for p in &parents {
        client
            .create(p, &[], &CreateMode::Persistent.with_acls(Acls::anyone_all()))
            .await
            .unwrap();
    }
    let (n, d) = run_tasks(tasks, cfg.secs, |i, end| {
        let client = Arc::clone(&client);
        let prefix = format!("{}/lock-", parents[i]);
        async move {
            let opts = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
            let mut n = 0;
            while Instant::now() < end {
                let (_, seq) = client.create(&prefix, b"", &opts).await.unwrap();
                client.delete(&format!("{prefix}{seq}"), None).await.unwrap();
                n += 1;
            }
            n
        }
    })
    .await;
    out.push(("floor (create ephemeral-sequential + delete)", rate(n, d)));
    if std::env::var("DLOCK_BENCH_EXPLORE").is_ok() {
        for variant in 1..=3u8 {
            let (n, d) = run_tasks(tasks, cfg.secs, |i, end| {
                let client = Arc::clone(&client);
                let parent = parents[i].clone();
                let prefix = format!("{}/lock-", parents[i]);
                async move {
                    let opts = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
                    let mut n = 0;
                    while Instant::now() < end {
                        let create = client.create(&prefix, b"", &opts);
                        let list = client.list_children(&parent);
                        let (c, l) = tokio::join!(create, list);
                        let (_, seq) = c.unwrap();
                        l.unwrap();
                        let node = format!("{prefix}{seq}");
                        if variant >= 2 {
                            let w = client.check_and_watch_stat(&node);
                            if variant == 3 {
                                w.await.unwrap();
                            } else {
                                drop(w);
                            }
                        }
                        client.delete(&node, None).await.unwrap();
                        n += 1;
                    }
                    n
                }
            })
            .await;
            let label = ["", "explore: create‖list + delete", "explore: + exists-watch not awaited", "explore: + exists-watch awaited"][variant as usize];
            out.push((label, rate(n, d)));
        }
    }
    for p in &parents {
        client.delete(p, None).await.unwrap();
    }

    let backend = ZkBackend::connect(&cfg.url).await.unwrap();
    let m = DistributeLockManager::builder(backend.clone()).build().unwrap();
    let (n, d) = run_tasks(tasks, cfg.secs, |i, end| {
        let lock = m.lock(&format!("{tag}-dlock-{i}"));
        async move {
            let mut n = 0;
            while Instant::now() < end {
                let g = lock.try_lock(Duration::ZERO).await.unwrap().expect("uncontended");
                g.unlock().await.unwrap();
                n += 1;
            }
            n
        }
    })
    .await;
    out.push(("dlock (user API)", rate(n, d)));
    m.close().await;

    let spi: Arc<dyn LockRemoteResource> = Arc::new(backend);
    let (n, d) = run_tasks(tasks, cfg.secs, |i, end| {
        let spi = Arc::clone(&spi);
        let name = LockName::new(format!("{tag}-spi-{i}")).unwrap();
        let owner = OwnerId::new(format!("bench:{i}"));
        async move {
            let mut n = 0;
            while Instant::now() < end {
                let got = spi.try_acquire(&AcquireRequest::new(name.clone(), owner.clone())).await.unwrap();
                let token = got.token().expect("uncontended");
                spi.release(&ReleaseRequest::new(name.clone(), owner.clone(), LockMode::Exclusive, token))
                    .await
                    .unwrap();
                n += 1;
            }
            n
        }
    })
    .await;
    out.push(("dlock (SPI, backend only)", rate(n, d)));

    if with_curator {
        let mut java = testsuite::curator::worker().unwrap_or_else(|e| panic!("{e}"));
        let path = format!("/dlock-test/{tag}-curator");
        let secs = format!("{}", cfg.secs.as_secs_f64());
        let output = java.args(["bench", &cfg.hosts, &path, &secs]).output().expect("run java");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "Curator bench failed: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));
        let line = stdout.lines().find(|l| l.starts_with("curator cycles=")).expect("curator result");
        let field = |key: &str| -> f64 {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(key))
                .and_then(|v| v.parse().ok())
                .expect("curator figure")
        };
        out.push(("Java Curator InterProcessMutex", field("cycles=") / field("seconds=")));
    }
    out
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let selected = std::env::var("DLOCK_TEST_BACKENDS").unwrap_or_else(|_| "zk".into());
    if !selected.split(',').any(|l| l.trim() == "zk") {
        println!("zk not selected in DLOCK_TEST_BACKENDS; skipping the ZooKeeper bench");
        return;
    }
    let url = std::env::var("DLOCK_ZK_URL").unwrap_or_else(|_| "zk://127.0.0.1:2181/dlock-test".into());
    let hosts = url.trim_start_matches("zk://").split(['/', '?']).next().unwrap().to_owned();
    let secs = if bench {
        Duration::from_secs_f64(
            std::env::var("DLOCK_BENCH_SECS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(3.0),
        )
    } else {
        Duration::from_millis(200)
    };
    let cfg = Cfg { url, hosts, secs };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        for (tasks, title, curator) in [(1usize, "1 task, uncontended", true), (16, "16 tasks on 16 locks, one session", false)] {
            let rows = uncontended(&cfg, tasks, curator).await;
            let floor = rows.first().map_or(1.0, |r| r.1);
            println!("\n**{title}** (acquire+release cycles/s)\n\n| implementation | cycles/s | × floor |\n|---|---|---|");
            for (name, r) in rows {
                println!("| {name} | {r:.0} | {:.2} |", r / floor);
            }
        }
    });
}
