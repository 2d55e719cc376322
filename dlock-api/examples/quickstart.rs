//! A tour of the API on the in-memory backend: contended counter, fencing tokens,
//! reentrancy, read-write lock, and the lost signal.
//!
//! Run: `cargo run -p dlock-api --example quickstart`

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_api::{DistributeLockManager, InMemoryBackend, Result};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    // Two managers over one store stand in for two services.
    let store = InMemoryBackend::new();
    let service_a = DistributeLockManager::builder(store.clone())
        .namespace("shop:")
        .build()?;
    let service_b = DistributeLockManager::builder(store.clone())
        .namespace("shop:")
        .build()?;

    // 1. Mutual exclusion: 6 workers increment a counter non-atomically under one lock.
    let counter = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut workers = Vec::new();
    for w in 0..6 {
        let manager = if w % 2 == 0 {
            service_a.clone()
        } else {
            service_b.clone()
        };
        let counter = Arc::clone(&counter);
        workers.push(tokio::spawn(async move {
            let lock = manager.lock("counter");
            let mut done = 0u64;
            for _ in 0..100 {
                if let Some(guard) = lock.try_lock(Duration::from_secs(5)).await? {
                    let read = counter.load(Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    counter.store(read + 1, Ordering::SeqCst);
                    done += 1;
                    guard.unlock().await?;
                }
            }
            Ok::<_, dlock_api::Error>(done)
        }));
    }
    let mut successes = 0;
    for w in workers {
        successes += w
            .await
            .map_err(|e| dlock_api::Error::backend(e.to_string()))??;
    }
    println!(
        "counter = {} after {successes} locked increments by 6 workers in {:?} ({})",
        counter.load(Ordering::SeqCst),
        started.elapsed(),
        if counter.load(Ordering::SeqCst) == successes {
            "consistent"
        } else {
            "LOST UPDATES"
        }
    );

    // 2. Fencing tokens and reentrancy.
    let lock = service_a.lock("orders:42");
    let outer = lock.lock().await?;
    let inner = lock
        .try_lock(Duration::ZERO)
        .await?
        .ok_or_else(|| dlock_api::Error::backend("reentry failed"))?;
    println!(
        "orders:42 held twice by one owner, token {} == {}, count {}",
        outer.fencing_token(),
        inner.fencing_token(),
        outer.hold_count()
    );
    inner.unlock().await?;
    outer.unlock().await?;
    let next = service_b.lock("orders:42").lock().await?;
    println!(
        "next holder's token {} (strictly greater)",
        next.fencing_token()
    );
    next.unlock().await?;

    // 3. Read-write lock: readers share, the writer waits for them.
    let rw_a = service_a.read_write_lock("catalog");
    let rw_b = service_b.read_write_lock("catalog");
    let r1 = rw_a.read().lock().await?;
    let r2 = rw_b.read().lock().await?;
    let writer_blocked = rw_b
        .write()
        .try_lock(Duration::from_millis(50))
        .await?
        .is_none();
    println!("two readers hold catalog; writer blocked: {writer_blocked}");
    r1.unlock().await?;
    r2.unlock().await?;
    rw_b.write().lock().await?.unlock().await?;

    // 4. The lost signal: an explicit lease that is not renewed runs out.
    let short = service_a
        .lock("report")
        .try_lock_with(
            Duration::ZERO,
            &dlock_api::LockOptions::new().lease(Duration::from_millis(200)),
        )
        .await?;
    if let Some(guard) = short {
        tokio::select! {
            reason = guard.lost() => println!("report lock lost ({reason}); work abandoned in time"),
            _ = tokio::time::sleep(Duration::from_secs(2)) => println!("report work finished"),
        }
    }

    service_a.close().await;
    service_b.close().await;
    println!(
        "closed; live locks left in the store: {}",
        store.active_locks()
    );
    Ok(())
}
