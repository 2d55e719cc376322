//! Cases on waiters: a waiter that goes away leaves at once (not when some entry of
//! its lapses), and a writer leaving the queue lets the readers behind it in.

use std::sync::Arc;
use std::time::Duration;

use dlock_api::{DistributeLock, DistributeLockManager};

use super::{eventually, take, waiters, Env};
use crate::TestBackend;

/// How soon a cancelled waiter's state must be gone. Well inside every entry's own
/// expiry (queue liveness 3 s), so state that lapses instead of leaving fails the
/// case; a third of it, as a dropped waiter's leave is a task of its own, which a
/// loaded machine ran later than 300 ms (PostgreSQL, once in a full run).
const LEAVES_WITHIN: Duration = Duration::from_secs(1);

/// When a `lock()` is dropped: 1, 20 or 200 ms after it started (it may or may not
/// have registered yet), or once the backend shows it as a waiter (`None`).
const CANCEL_AFTER: [Option<Duration>; 4] = [
    Some(Duration::from_millis(1)),
    Some(Duration::from_millis(20)),
    Some(Duration::from_millis(200)),
    None,
];

/// Every kind of waiting acquire the backend supports, on `name`.
fn waiting_kinds(m: &DistributeLockManager, name: &str) -> Vec<DistributeLock> {
    let caps = m.capabilities();
    let mut kinds = vec![m.lock(name)];
    if caps.fair {
        kinds.push(m.fair_lock(name));
    }
    if caps.shared {
        kinds.push(m.read_write_lock(name).read().clone());
    }
    kinds
}

/// A `lock()` dropped while it waits leaves no waiter behind, at once: for each kind
/// of waiting acquire, dropped 1, 20 or 200 ms in or once it shows as a waiter, the
/// backend shows no waiter within 300 ms; a waiting `lock()` must show as
/// one. Once the holder releases, no state at all is left, within the same bound.
pub async fn cancelled_lock_leaves_nothing(backend: Arc<dyn TestBackend>) {
    let env = Env::new(backend);
    let (a, b) = env.two_managers().await;
    let g = take(&a.lock("cancel"), Duration::ZERO).await;
    for lock in waiting_kinds(&b, "cancel") {
        let kind = format!("{:?} {:?}", lock.mode(), lock.fairness());
        for after in CANCEL_AFTER {
            let waiting = lock.clone();
            let attempt = tokio::spawn(async move { waiting.lock().await.map(drop) });
            match after {
                Some(after) => tokio::time::sleep(after).await,
                None => assert!(
                    eventually(Duration::from_secs(5), || async {
                        waiters(&b, "cancel").await >= 1
                    })
                    .await,
                    "{kind}: a waiting lock() never showed as a waiter"
                ),
            }
            attempt.abort();
            assert!(
                attempt.await.is_err_and(|e| e.is_cancelled()),
                "{kind}: the waiting lock() ended on its own"
            );
            let gone =
                eventually(LEAVES_WITHIN, || async { waiters(&b, "cancel").await == 0 }).await;
            assert!(
                gone,
                "{kind}, cancelled after {after:?}: the waiter is still registered {LEAVES_WITHIN:?} later"
            );
        }
    }
    let live = env
        .backend()
        .live_state(env.namespace())
        .await
        .expect("count");
    assert_eq!(live, 1, "only the holder's lock has state");
    g.unlock().await.expect("unlock");
    let clean = eventually(LEAVES_WITHIN, || async {
        env.backend()
            .live_state(env.namespace())
            .await
            .expect("count")
            == 0
    })
    .await;
    assert!(
        clean,
        "state is left {LEAVES_WITHIN:?} after the holder released"
    );
    env.finish(&[&a, &b]).await;
}

/// Fair read-write lock: a reader holds, a writer queues, a reader queues behind the
/// writer (it must not pass it). When the writer gives up, the reader behind it
/// joins the holding reader promptly — told, or polling at its usual pace — not when
/// some re-check or liveness comes round.
pub async fn a_leaving_writer_lets_readers_in(backend: Arc<dyn TestBackend>) {
    /// A polling reader re-checks within its backoff (≤ 250 ms by default); a reader
    /// that is never told waits for its liveness re-check (1 s by default).
    const JOINS_WITHIN: Duration = Duration::from_millis(700);
    let env = Env::new(backend);
    let (a, b, c) = (
        env.manager().await,
        env.manager().await,
        env.manager().await,
    );
    let caps = a.capabilities();
    if !(caps.fair && caps.shared) {
        env.finish(&[&a, &b, &c]).await;
        return;
    }
    let first = take(a.fair_read_write_lock("rw").read(), Duration::ZERO).await;
    let writer = b.fair_read_write_lock("rw").write().clone();
    let waiting_writer = tokio::spawn(async move { writer.lock().await.map(drop) });
    assert!(
        eventually(Duration::from_secs(5), || async {
            waiters(&a, "rw").await == 1
        })
        .await,
        "the writer never showed as a waiter"
    );
    let reader = c.fair_read_write_lock("rw").read().clone();
    let waiting_reader = tokio::spawn(async move { reader.lock().await });
    assert!(
        eventually(Duration::from_secs(5), || async {
            waiters(&a, "rw").await == 2
        })
        .await,
        "the second reader never showed as a waiter behind the writer"
    );
    assert!(
        !waiting_reader.is_finished(),
        "a reader passed a queued writer"
    );
    waiting_writer.abort();
    let _ = waiting_writer.await;
    let joined = tokio::time::timeout(JOINS_WITHIN, waiting_reader)
        .await
        .unwrap_or_else(|_| {
            panic!("the reader behind a writer that left was not let in within {JOINS_WITHIN:?}")
        })
        .expect("reader task")
        .expect("reader granted");
    joined.unlock().await.expect("unlock");
    first.unlock().await.expect("unlock");
    env.finish(&[&a, &b, &c]).await;
}
