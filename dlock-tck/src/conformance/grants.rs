//! Cases on grant identity and cancellation: the ordinary loop (drop the guard, lock
//! again at once with the same handle) stays exclusive, and a call dropped at any
//! await leaves neither a hold nor a waiter behind.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_spi::{
    AcquireChain, AcquireContext, AcquireResult, LockHandler, LockState, ReleaseChain,
    ReleaseContext, ReleaseResult, Result,
};

use dlock_api::DistributeLockManager;

use super::{eventually, take, Env};
use crate::TestBackend;

/// Yields once before passing a release on, so a release is pending after its first
/// poll on every backend (the in-memory one would otherwise finish in one poll).
struct YieldBeforeRelease;

#[async_trait]
impl LockHandler for YieldBeforeRelease {
    async fn acquire(&self, ctx: &AcquireContext, next: AcquireChain<'_>) -> Result<AcquireResult> {
        next.invoke(ctx).await
    }

    async fn release(&self, ctx: &ReleaseContext, next: ReleaseChain<'_>) -> Result<ReleaseResult> {
        tokio::task::yield_now().await;
        next.invoke(ctx).await
    }
}

/// How many rounds the loops below run: enough for a late background release to
/// land on a later grant many times over on a backend that matches releases by
/// owner only.
const ROUNDS: usize = 20;

/// Drop the guard, lock again at once with the same handle: the dropped guard's
/// background release must not touch the new grant. After each re-lock the test waits
/// until the background release has been answered (the manager forgets the old hold),
/// then checks that the new grant is still held — another client cannot take the lock
/// and `inspect` shows one holder — and that its token is above the dropped one's.
pub async fn drop_then_relock(backend: Arc<dyn TestBackend>) {
    let env = Env::new(backend);
    let (a, b) = env.two_managers().await;
    let lock = a.lock("relock");
    let rival = b.lock("relock");
    let mut guard = take(&lock, Duration::from_secs(5)).await;
    for round in 0..ROUNDS {
        let dropped = guard.fencing_token();
        drop(guard);
        guard = lock
            .try_lock(Duration::from_secs(5))
            .await
            .unwrap_or_else(|e| panic!("round {round}: re-lock failed: {e}"))
            .unwrap_or_else(|| panic!("round {round}: re-lock not granted within 5 s"));
        assert!(
            guard.fencing_token() > dropped,
            "round {round}: the new grant reuses or lowers the dropped grant's token ({} after {dropped})",
            guard.fencing_token()
        );
        let settled = eventually(Duration::from_secs(5), || async { a.held_count() == 1 }).await;
        assert!(
            settled,
            "round {round}: the dropped guard's release never settled"
        );
        assert!(
            !guard.is_lost(),
            "round {round}: the new grant was reported lost"
        );
        let stolen = rival
            .try_lock(Duration::ZERO)
            .await
            .unwrap_or_else(|e| panic!("round {round}: rival try_lock failed: {e}"));
        assert!(
            stolen.is_none(),
            "round {round}: another client took the lock the same handle had just re-locked — the dropped guard's release freed the new grant"
        );
        let holders = a
            .inspect("relock")
            .await
            .expect("inspect")
            .map(|s| s.holders.len())
            .unwrap_or(0);
        assert_eq!(
            holders, 1,
            "round {round}: the new grant is not in the store"
        );
    }
    guard.unlock().await.expect("unlock the last grant");
    env.finish(&[&a, &b]).await;
}

/// `unlock()` dropped after its first poll (cancelled mid-release): the release still
/// completes in the background — the manager forgets the hold, the watchdog stops, and
/// another client gets the lock long before the lease could end it.
pub async fn cancel_during_unlock(backend: Arc<dyn TestBackend>) {
    let env = Env::new(backend);
    let lease = Duration::from_secs(20);
    let a = env
        .manager_with(|m| m.lease(lease).with_handler(YieldBeforeRelease))
        .await;
    let b = env.manager().await;
    for round in 0..5 {
        let guard = take(&a.lock("unlock-cancel"), Duration::from_secs(5)).await;
        // Poll `unlock` once (it stops at the handler's yield), then drop it.
        let finished = poll_once(guard.unlock()).await;
        assert!(!finished, "round {round}: unlock was not pending");
        let start = std::time::Instant::now();
        let next = take(&b.lock("unlock-cancel"), Duration::from_secs(5)).await;
        assert!(
            start.elapsed() < lease / 4,
            "round {round}: the lock stayed taken after a cancelled unlock"
        );
        assert_forgotten(&[&a], &format!("round {round}: the cancelled unlock")).await;
        next.unlock().await.expect("unlock");
    }
    env.finish(&[&a, &b]).await;
}

/// Waits (bounded) until no manager of `managers` has a hold registered or watched;
/// fails naming `what` left them behind.
async fn assert_forgotten(managers: &[&DistributeLockManager], what: &str) {
    let forgotten = eventually(Duration::from_secs(5), || async {
        managers
            .iter()
            .all(|m| m.held_count() == 0 && m.watched_count() == 0)
    })
    .await;
    let left: Vec<(usize, usize)> = managers
        .iter()
        .map(|m| (m.held_count(), m.watched_count()))
        .collect();
    assert!(
        forgotten,
        "{what} left holds registered ((held, watched) per manager: {left:?})"
    );
}

/// Polls `fut` once and drops it; true if it finished in that poll.
async fn poll_once<F: std::future::Future>(fut: F) -> bool {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| std::task::Poll::Ready(fut.as_mut().poll(cx).is_ready())).await
}

/// Every call dropped at a random await point — `lock()`, `try_lock(wait)` and
/// `unlock()` cut short by random timeouts, guards dropped or unlocked, handles and
/// clones on two clients — leaves nothing behind: at quiescence another client takes
/// every lock at once and no holder or waiter state remains.
pub async fn cancel_at_random_points(backend: Arc<dyn TestBackend>) {
    const TASKS: u64 = 4;
    const STEPS: usize = 15;
    let env = Env::new(backend);
    let (a, b) = env.two_managers().await;
    let seed = fastrand::u64(..);
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let manager = if t % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(seed ^ t);
            let lock = manager.lock(format!("cut{}", rng.u8(0..2)));
            for _ in 0..STEPS {
                let cut = Duration::from_millis(rng.u64(0..30));
                let acquired = if rng.bool() {
                    tokio::time::timeout(cut, lock.lock())
                        .await
                        .ok()
                        .and_then(Result::ok)
                } else {
                    tokio::time::timeout(cut, lock.try_lock(Duration::from_millis(rng.u64(0..50))))
                        .await
                        .ok()
                        .and_then(|r| r.ok().flatten())
                };
                let Some(guard) = acquired else { continue };
                tokio::time::sleep(Duration::from_millis(rng.u64(0..5))).await;
                match rng.u8(0..3) {
                    0 => drop(guard),
                    1 => {
                        let _ = guard.unlock().await;
                    }
                    _ => {
                        let cut = Duration::from_millis(rng.u64(0..3));
                        let _ = tokio::time::timeout(cut, guard.unlock()).await;
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    assert_forgotten(&[&a, &b], &format!("seed {seed}: the cut calls")).await;
    let c = env.manager().await;
    // The store shows no holder and no waiter either, within 2 s: less than the
    // shortest liveness after which a forgotten waiter entry would lapse by itself
    // (Redis and Redlock show waiters for 3 s), and far less than a lease.
    for name in ["cut0", "cut1"] {
        let idle = |s: &Option<LockState>| {
            s.as_ref()
                .is_none_or(|s| s.holders.is_empty() && s.waiters.unwrap_or(0) == 0)
        };
        let quiet = eventually(Duration::from_secs(2), || async {
            c.inspect(name).await.is_ok_and(|s| idle(&s))
        })
        .await;
        let left = c.inspect(name).await;
        assert!(
            quiet,
            "seed {seed}: {name} still shows holders or waiters at quiescence: {left:?}"
        );
    }
    for name in ["cut0", "cut1"] {
        let g = c
            .lock(name)
            .try_lock(Duration::from_secs(2))
            .await
            .expect("no error")
            .unwrap_or_else(|| panic!("seed {seed}: {name} is still taken at quiescence"));
        g.unlock().await.expect("unlock");
    }
    env.finish(&[&a, &b, &c]).await;
}

/// A grant's lease runs from the attempt that was granted, not from the start of a
/// long wait: `lock()` waiting three leases for a busy lock returns a guard that is
/// live and stays live (renewed by the watchdog) for several leases more.
pub async fn a_long_wait_grants_a_live_hold(backend: Arc<dyn TestBackend>) {
    let lease = Duration::from_millis(600);
    let env = Env::new(backend);
    let a = env.manager().await;
    let b = env.manager_with(|m| m.lease(lease)).await;
    let held = take(&a.lock("long"), Duration::ZERO).await;
    let waiter = b.lock("long");
    let waiting = tokio::spawn(async move { waiter.lock().await });
    // How long the holder keeps the lock is the subject: three of the waiter's leases.
    tokio::time::sleep(lease * 3).await;
    held.unlock().await.expect("unlock");
    let guard = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter got the lock")
        .expect("task")
        .expect("lock() succeeds");
    assert!(
        !guard.is_lost(),
        "lock() returned a guard already lost ({:?}): its lease was counted from the start of the wait",
        guard.lost_reason()
    );
    tokio::time::sleep(lease * 2).await;
    assert!(
        !guard.is_lost(),
        "the hold was lost ({:?}) while its watchdog should renew it",
        guard.lost_reason()
    );
    guard.unlock().await.expect("unlock");
    env.finish(&[&a, &b]).await;
}
