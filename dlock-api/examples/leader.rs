//! Leader election on ZooKeeper or etcd (any backend the build has): every process
//! runs this; one leads at a time, the others queue in arrival order (on ZooKeeper a
//! Curator `LeaderLatch` on the same path joins the same race). The leader works
//! while its term is neither lost nor suspended; Ctrl-C stops the contention
//! gracefully (the work ends first, then the term is given back and the next process
//! takes over at once).
//!
//! Run (with the servers `scripts/test` starts), in two or three terminals:
//! `cargo run -p dlock-api --features zk --example leader -- zk://127.0.0.1:2181/dlock-demo`
//! or `cargo run -p dlock-api --features etcd --example leader -- etcd://127.0.0.1:2379/dlock-demo`

use std::time::Duration;

use dlock_api::spi::async_trait;
use dlock_api::{Contender, DistributeLockManager, Result, Term, TermEnd};

struct Worker;

#[async_trait]
impl Contender for Worker {
    async fn on_acquired(&self, term: Term) {
        let pid = std::process::id();
        println!("[{pid}] leading, fencing token {}", term.fencing_token());
        for beat in 0.. {
            tokio::select! {
                () = term.stepping_down() => {
                    println!("[{pid}] asked to step down; finishing up");
                    return;
                }
                () = tokio::time::sleep(Duration::from_secs(1)) => {
                    if term.is_suspended() {
                        // Connection down: the hold may still be alive. Do not act
                        // as leader until it is back (or the loss is declared).
                        println!("[{pid}] connection to the store down; pausing");
                    } else {
                        println!("[{pid}] leader heartbeat {beat}");
                    }
                }
            }
        }
    }

    async fn on_released(&self, term: Term, end: TermEnd) {
        println!(
            "[{}] term {} over: {end:?}",
            std::process::id(),
            term.fencing_token()
        );
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "zk://127.0.0.1:2181/dlock-demo".to_owned());
    let manager = DistributeLockManager::connect(&url).await?;
    println!("[{}] contending…", std::process::id());
    let contention = manager
        .election("leader")
        .contend(format!("pid {}", std::process::id()), Worker)?;
    let _ = tokio::signal::ctrl_c().await;
    contention.stop().await;
    manager.close().await;
    Ok(())
}
