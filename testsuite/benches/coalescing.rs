//! Hot-lock coalescing: 32 tasks in one process take turns on one Redis lock. Counts
//! backend acquire calls per successful acquisition, with and without the
//! `CoalescingHandler`, in the same run on the same server.
//!
//! Run: `cargo bench -p testsuite --bench coalescing` (DLOCK_REDIS_URL, default
//! redis://127.0.0.1:6379). Under `cargo test` it runs a short smoke pass.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use dlock_api::flow_control::CoalescingHandler;
use dlock_api::DistributeLockManager;
use dlock_redis::{RedisBackend, RedisOptions};

const TASKS: usize = 32;

async fn run(url: &str, coalesce: bool, polling: bool, per_task: usize) -> (u64, u64, Duration) {
    let options = if polling {
        RedisOptions::default().polling(dlock_api::Backoff::default())
    } else {
        RedisOptions::default()
    };
    let backend = RedisBackend::connect_with(url, options).await.unwrap();
    let mut builder = DistributeLockManager::builder(backend.clone());
    if coalesce {
        builder = builder.with_handler(CoalescingHandler::default());
    }
    let manager = builder.build().unwrap();
    let name = format!("coalesce:{:x}", fastrand::u64(..));
    let start = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let lock = manager.lock(&name);
            tokio::spawn(async move {
                let mut ok = 0u64;
                for _ in 0..per_task {
                    if let Some(g) = lock.try_lock(Duration::from_secs(30)).await.unwrap() {
                        tokio::time::sleep(Duration::from_micros(200)).await;
                        g.unlock().await.unwrap();
                        ok += 1;
                    }
                }
                ok
            })
        })
        .collect();
    let mut successes = 0;
    for t in tasks {
        successes += t.await.unwrap();
    }
    let elapsed = start.elapsed();
    manager.close().await;
    (backend.acquire_attempts(), successes, elapsed)
}

fn main() {
    let bench = testsuite::bench::is_bench();
    if !testsuite::bench::backend_selected("redis", "coalescing") {
        return;
    }
    let url = std::env::var("DLOCK_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let per_task = if bench { 20 } else { 2 };
    let rt = testsuite::bench::runtime();
    rt.block_on(async {
        println!("| waiting | coalescing | acquisitions | backend acquire calls | calls per acquisition | acquisitions/s |");
        println!("|---|---|---|---|---|---|");
        for polling in [false, true] {
            for coalesce in [false, true] {
                let (calls, ok, t) = run(&url, coalesce, polling, per_task).await;
                assert_eq!(ok as usize, TASKS * per_task, "every acquisition succeeds");
                println!(
                    "| {} | {} | {ok} | {calls} | **{:.2}** | {:.0} |",
                    if polling { "polling" } else { "pub/sub" },
                    if coalesce { "on" } else { "off" },
                    calls as f64 / ok as f64,
                    ok as f64 / t.as_secs_f64()
                );
            }
        }
    });
}
