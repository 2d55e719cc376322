//! A job that must run on one replica at a time, on PostgreSQL: each replica tries
//! the lock without waiting; the one that gets it runs the job, stamps its writes
//! with the fencing token (a store that keeps the greatest token it saw refuses a
//! late write from a holder that lost the lock), stops at once if the lock is lost,
//! and releases it.
//!
//! Run (with PostgreSQL on 127.0.0.1:5432, e.g. started by `scripts/test`), in two
//! terminals at once:
//! `cargo run -p dlock-api --features postgres --example postgres_job -- postgres://postgres@127.0.0.1:5432/test`

use std::time::Duration;

use dlock_api::{DistributeLockManager, Result};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let manager = DistributeLockManager::connect(&url).await?;
    let pid = std::process::id();
    // Zero wait: a replica that finds the job running skips it this round.
    match manager
        .lock("nightly-report")
        .try_lock(Duration::ZERO)
        .await?
    {
        None => println!("[{pid}] another replica runs the job; skipping"),
        Some(guard) => {
            let token = guard.fencing_token();
            println!("[{pid}] running the job, fencing token {token}");
            for step in 1..=5 {
                tokio::select! {
                    reason = guard.lost() => {
                        println!("[{pid}] lock lost ({reason:?}); stopping before step {step}");
                        break;
                    }
                    () = tokio::time::sleep(Duration::from_millis(500)) => {
                        // Write with the token: `UPDATE … WHERE last_token <= $token`.
                        println!("[{pid}] step {step} written with token {token}");
                    }
                }
            }
            guard.unlock().await?;
        }
    }
    manager.close().await;
    Ok(())
}
