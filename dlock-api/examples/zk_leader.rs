//! Leader election on ZooKeeper: every process runs this; one leads at a time, the
//! others queue in arrival order (ZooKeeper's sequence order). The leader works only
//! while its guard is neither lost nor suspended, and steps down when it is lost.
//!
//! Run (with ZooKeeper on 127.0.0.1:2181, e.g. started by `scripts/test`), in two or
//! three terminals:
//! `cargo run -p dlock-api --features zk --example zk_leader -- zk://127.0.0.1:2181/dlock-demo`

use std::time::Duration;

use dlock_api::{DistributeLockManager, Result};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "zk://127.0.0.1:2181/dlock-demo".to_owned());
    let manager = DistributeLockManager::connect(&url).await?;
    let election = manager.fair_lock("leader");
    for term in 1..=3 {
        println!("[{}] waiting to lead…", std::process::id());
        let guard = election.lock().await?;
        println!(
            "[{}] leading, term {term}, fencing token {}",
            std::process::id(),
            guard.fencing_token()
        );
        for beat in 0..5 {
            tokio::select! {
                reason = guard.lost() => {
                    println!("lost the leadership ({reason}); stepping down");
                    break;
                }
                () = tokio::time::sleep(Duration::from_secs(1)) => {
                    if guard.is_suspended() {
                        // Connection down: the session may still be alive. Do not act as
                        // leader until it is back (or the loss is declared).
                        println!("connection to ZooKeeper down; pausing");
                    } else {
                        println!("leader heartbeat {beat}");
                    }
                }
            }
        }
        // Hand over to the next in line.
        let _ = guard.unlock().await;
    }
    manager.close().await;
    Ok(())
}
