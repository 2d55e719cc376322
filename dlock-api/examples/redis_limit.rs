//! At most 3 calls to a fragile upstream at once, across every process, on Redis: a
//! semaphore of 3 permits. Each of 8 tasks waits up to 5 s for a permit, calls, and
//! gives the permit back; a task that waits longer reports the upstream busy.
//!
//! Run (with Redis on 127.0.0.1:6379), in one or more terminals:
//! `cargo run -p dlock-api --features redis --example redis_limit -- redis://127.0.0.1:6379`

use std::time::Duration;

use dlock_api::{DistributeLockManager, Result};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned());
    let manager = DistributeLockManager::connect(&url).await?;
    let mut tasks = Vec::new();
    for task in 0..8 {
        let upstream = manager.semaphore("upstream-calls", 3);
        tasks.push(tokio::spawn(async move {
            match upstream.try_acquire(1, Duration::from_secs(5)).await? {
                None => println!("task {task}: upstream busy, try later"),
                Some(permit) => {
                    println!("task {task}: calling (token {})", permit.fencing_token());
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    permit.release().await?;
                }
            }
            Ok::<_, dlock_api::Error>(())
        }));
    }
    for task in tasks {
        task.await
            .map_err(|e| dlock_api::Error::backend(e.to_string()))??;
    }
    manager.close().await;
    Ok(())
}
