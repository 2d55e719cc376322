//! Leader election on etcd: every process runs this; one leads at a time and the
//! others wait their turn. The leader works until its term is lost (its lease
//! could not be kept) or it is asked to step down; Ctrl-C stops the contention
//! (the work ends first, then the term is given back and the next process leads).
//!
//! Run (with etcd on 127.0.0.1:2379, e.g. started by `scripts/test`), in two or
//! three terminals:
//! `cargo run -p dlock-api --features etcd --example etcd_leader -- etcd://127.0.0.1:2379/dlock-demo`

use std::time::Duration;

use dlock_api::spi::async_trait;
use dlock_api::{Contender, DistributeLockManager, Result, Term, TermEnd};

struct Scheduler;

#[async_trait]
impl Contender for Scheduler {
    async fn on_acquired(&self, term: Term) {
        let pid = std::process::id();
        println!("[{pid}] leading, fencing token {}", term.fencing_token());
        for tick in 0.. {
            tokio::select! {
                () = term.stepping_down() => {
                    println!("[{pid}] stepping down");
                    return;
                }
                () = tokio::time::sleep(Duration::from_secs(1)) => {
                    println!("[{pid}] scheduling round {tick}");
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
        .unwrap_or_else(|| "etcd://127.0.0.1:2379/dlock-demo".to_owned());
    let manager = DistributeLockManager::connect(&url).await?;
    println!("[{}] contending…", std::process::id());
    let contention = manager.contend("scheduler", Scheduler)?;
    let _ = tokio::signal::ctrl_c().await;
    contention.stop().await;
    manager.close().await;
    Ok(())
}
