//! What a guard says about its hold, where only a stalled scheduler shows it: `check`
//! judges the guaranteed instant itself, not only the lost signal.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use dlock_api::spi::ErrorKind;
use dlock_api::DistributeLockManager;

/// A process stalled past its hold's guaranteed instant (here: the only runtime
/// thread blocked, so the watchdog cannot fire the lost signal) must not be told by
/// `check` that it can act: `check` compares the clock with `valid_until` itself.
#[tokio::test(flavor = "current_thread")]
async fn check_fails_past_valid_until_before_the_lost_signal_fires() {
    let m = DistributeLockManager::connect("memory://").await.unwrap();
    let lease = Duration::from_millis(200);
    let guard = m
        .lock("stalled")
        .try_lock_with(Duration::ZERO, &dlock_api::LockOptions::new().lease(lease))
        .await
        .unwrap()
        .unwrap();
    guard.check().unwrap();
    let until = guard.valid_until().unwrap();
    // The stall is the subject: block the runtime's only thread past the instant.
    std::thread::sleep(
        until.saturating_duration_since(std::time::Instant::now()) + Duration::from_millis(20),
    );
    assert!(
        !guard.is_lost(),
        "the watchdog ran during the stall; the test shows nothing"
    );
    let err = guard.check().expect_err("check past valid_until");
    assert_eq!(err.kind(), ErrorKind::LockLost, "{err}");
    drop(guard);
    m.close().await;
}

/// A keyed group under a million keys keeps its cache bounded (capacity plus the
/// handles in use), and never evicts a handle in use: the held keys still re-enter.
#[tokio::test]
async fn a_group_stays_bounded_under_a_million_keys() {
    let m = DistributeLockManager::connect("memory://").await.unwrap();
    let capacity = 1_000;
    let group = m.group("k").capacity(capacity);
    let mut held = Vec::new();
    for key in 0..10u32 {
        held.push(
            group
                .lock(format!("held-{key}"))
                .try_lock(Duration::ZERO)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    let mut most = 0;
    for key in 0..1_000_000u32 {
        let _ = group.lock(key);
        most = most.max(group.cached());
    }
    assert!(most <= capacity + held.len(), "{most} handles cached");
    for (key, guard) in held.iter().enumerate() {
        let again = group
            .lock(format!("held-{key}"))
            .try_lock(Duration::ZERO)
            .await
            .unwrap()
            .expect("the held key's handle re-enters");
        assert_eq!(again.acquisition(), dlock_api::Acquisition::Reentered);
        assert_eq!(again.fencing_token(), guard.fencing_token());
    }
    m.close().await;
}

mod common;
use common::Wrapped;
use dlock_api::spi::{async_trait, AcquireChain, AcquireContext, AcquireResult, LockHandler};
use dlock_api::spi::{
    LockRemoteResource, ReleaseChain, ReleaseContext, ReleaseResult, RenewEvent, Result,
};
use dlock_api::{LockOptions, LostReason};
use std::sync::atomic::Ordering;

/// A handler whose notification hooks panic (a bug in a user's plugin).
struct PanickyHooks;

#[async_trait]
impl LockHandler for PanickyHooks {
    async fn acquire(&self, ctx: &AcquireContext, next: AcquireChain<'_>) -> Result<AcquireResult> {
        next.invoke(ctx).await
    }
    async fn release(&self, ctx: &ReleaseContext, next: ReleaseChain<'_>) -> Result<ReleaseResult> {
        next.invoke(ctx).await
    }
    fn on_renew(&self, _event: &RenewEvent<'_>) {
        panic!("a plugin's renewal hook failed (test)");
    }
    fn on_lost(&self, _event: &dlock_api::spi::LostEvent<'_>) {
        panic!("a plugin's loss hook failed (test)");
    }
}

/// Keeps the default panic hook from printing the panics of [`PanickyHooks`] (every
/// other panic it still prints). The hooks panic on the watchdog's task at every
/// renewal; with `RUST_BACKTRACE` set, the default hook resolves and prints a
/// backtrace each time — on a loaded machine longer than the 300 ms lease's renewal
/// interval (the test once failed so: the kept hold lost, its renewals stuck behind
/// the printing), which measures the panic hook, not the watchdog.
fn quiet_panics_of_panicky_hooks() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| info.payload().downcast_ref::<String>().map(String::as_str));
        if message.is_some_and(|m| m.starts_with("a plugin's") && m.ends_with("(test)")) {
            return;
        }
        default(info);
    }));
}

/// A renewal whose task panics (a backend bug) settles its hold as lost — it is
/// not left "in flight" for ever (never renewed, never lost), and an extend does
/// not hang.
#[tokio::test]
async fn a_renewal_task_that_panics_loses_its_hold() {
    let (backend, m) = common::wrapped_manager(Duration::from_millis(300));
    backend.renew_panics.store(true, Ordering::SeqCst);
    let guard = m.lock("p").try_lock(Duration::ZERO).await.unwrap().unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("the hold whose renewal panicked was never lost");
    assert_eq!(reason, LostReason::LeaseExpired);
    let err = tokio::time::timeout(Duration::from_secs(2), guard.extend(Duration::from_secs(1)))
        .await
        .expect("extend hung")
        .expect_err("extend of a lost hold");
    assert_eq!(err.kind(), ErrorKind::LockLost);
    drop(guard);
    m.close().await;
}

/// Hooks that panic stop nothing: renewals go on (the hold stays held in the
/// store for many leases) and a loss reported to a panicking `on_lost` does not
/// stop the watchdog that renews the other holds.
#[tokio::test]
async fn panicking_hooks_stop_no_renewal() {
    quiet_panics_of_panicky_hooks();
    let backend = Wrapped::default();
    let lease = Duration::from_millis(300);
    let m = DistributeLockManager::builder(backend.clone())
        .lease(lease)
        .with_handler(PanickyHooks)
        .build()
        .unwrap();
    let doomed = m.lock("a").try_lock(Duration::ZERO).await.unwrap().unwrap();
    let kept = m.lock("b").try_lock(Duration::ZERO).await.unwrap().unwrap();
    backend
        .inner
        .admin()
        .unwrap()
        .force_release(doomed.name())
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(2), doomed.lost())
        .await
        .expect("the stolen hold was lost");
    // Several leases passing is the subject.
    tokio::time::sleep(lease * 4).await;
    assert!(!kept.is_lost(), "{:?}", kept.lost_reason());
    let state = m.inspect("b").await.unwrap();
    assert!(
        state.is_some_and(|s| !s.holders.is_empty()),
        "the store let the other hold go: the watchdog stopped renewing"
    );
    drop(doomed);
    kept.unlock().await.unwrap();
    m.close().await;
}

/// After a renewal whose outcome stayed unknown, later renewals are scheduled
/// for the lease they may count, not the one asked: an extend to three times that
/// lease does not lose the hold at the next loss instant.
#[tokio::test]
async fn renewals_after_an_unknown_outcome_come_in_time() {
    let lease = Duration::from_millis(600);
    let (backend, m) = common::wrapped_manager(lease);
    let guard = m.lock("u").try_lock(Duration::ZERO).await.unwrap().unwrap();
    backend.renew_fails.store(true, Ordering::SeqCst);
    guard.extend(lease).await.expect_err("the store refused");
    backend.renew_fails.store(false, Ordering::SeqCst);
    guard.extend(lease * 3).await.unwrap();
    // Two of the counted leases passing is the subject.
    tokio::time::sleep(lease * 2).await;
    assert!(!guard.is_lost(), "{:?}", guard.lost_reason());
    guard.check().unwrap();
    guard.unlock().await.unwrap();
    m.close().await;
}

/// An extend of a fixed-lease hold queued behind one that fails is still sent
/// (and succeeds), not left until the fixed end.
#[tokio::test]
async fn an_extend_queued_behind_a_failed_one_is_sent() {
    let backend = Wrapped::default();
    let m = DistributeLockManager::builder(backend.clone())
        .build()
        .unwrap();
    let guard = std::sync::Arc::new(
        m.lock("q")
            .try_lock_with(
                Duration::ZERO,
                &dlock_api::LockOptions::new().lease(Duration::from_secs(3)),
            )
            .await
            .unwrap()
            .unwrap(),
    );
    backend.renew_fails.store(true, Ordering::SeqCst);
    backend.renew_delay_ms.store(200, Ordering::SeqCst);
    let first = tokio::spawn({
        let guard = std::sync::Arc::clone(&guard);
        async move { guard.extend(Duration::from_secs(4)).await }
    });
    // The first extend's renewal is in flight (failing, late) before the second.
    tokio::time::sleep(Duration::from_millis(50)).await;
    backend.renew_fails.store(false, Ordering::SeqCst);
    let asked = std::time::Instant::now();
    let second = tokio::time::timeout(Duration::from_secs(2), guard.extend(Duration::from_secs(5)))
        .await
        .expect("the queued extend waited for the fixed end");
    second.unwrap();
    assert!(
        asked.elapsed() < Duration::from_secs(1),
        "{:?}",
        asked.elapsed()
    );
    first.await.unwrap().expect_err("the first extend failed");
    backend.renew_delay_ms.store(0, Ordering::SeqCst);
    drop(guard);
    m.close().await;
}

/// An extend of a fixed-lease hold that fails leaves the hold its own end: it is
/// not lost at the next retry instant.
#[tokio::test]
async fn a_failed_extend_of_a_fixed_lease_keeps_its_end() {
    let backend = Wrapped::default();
    let m = DistributeLockManager::builder(backend.clone())
        .build()
        .unwrap();
    let guard = m
        .lock("f")
        .try_lock_with(
            Duration::ZERO,
            &dlock_api::LockOptions::new().lease(Duration::from_millis(1500)),
        )
        .await
        .unwrap()
        .unwrap();
    backend.renew_fails.store(true, Ordering::SeqCst);
    let err = guard
        .extend(Duration::from_secs(3))
        .await
        .expect_err("the store refused");
    assert_eq!(err.kind(), ErrorKind::Backend);
    // The retry delay of a 1.5 s lease is 150 ms: waiting past it is the subject.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!guard.is_lost(), "lost early: {:?}", guard.lost_reason());
    guard.check().unwrap();
    backend.renew_fails.store(false, Ordering::SeqCst);
    guard.unlock().await.unwrap();
    m.close().await;
}

/// A shortening extend whose outcome is unknown (an error) may still reach the
/// store after a later, longer renewal: no later success may count for longer
/// than the short lease.
#[tokio::test]
async fn an_unknown_shortening_bounds_every_later_renewal() {
    let (backend, m) = common::wrapped_manager(Duration::from_secs(3));
    let guard = m.lock("s").try_lock(Duration::ZERO).await.unwrap().unwrap();
    let short = Duration::from_millis(600);
    backend.renew_fails.store(true, Ordering::SeqCst);
    guard.extend(short).await.expect_err("the store refused");
    backend.renew_fails.store(false, Ordering::SeqCst);
    guard.extend(Duration::from_secs(5)).await.unwrap();
    let until = guard.valid_until().expect("held");
    assert!(
        until <= std::time::Instant::now() + short,
        "a renewal after an unknown shortening counts {:?} ahead",
        until - std::time::Instant::now()
    );
    guard.unlock().await.unwrap();
    m.close().await;
}

/// A renewal in flight at the `max_hold` bound (here: one the store never
/// answers) does not delay the bound: the hold is lost there, with its own reason.
#[tokio::test]
async fn a_renewal_in_flight_does_not_delay_the_bound() {
    let (backend, m) = common::wrapped_manager(Duration::from_secs(1));
    backend.swallow_renewals.store(true, Ordering::SeqCst);
    let max_hold = Duration::from_millis(500);
    let guard = m
        .lock("b")
        .try_lock_with(Duration::ZERO, &LockOptions::new().max_hold(max_hold))
        .await
        .unwrap()
        .unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("lost");
    let held = guard.acquired_at().elapsed();
    assert_eq!(reason, LostReason::MaxHold, "after {held:?}");
    assert!(held < max_hold + Duration::from_millis(200), "{held:?}");
    drop(guard);
    m.close().await;
}

/// A group of capacity 1 keeps one unused handle, not two.
#[tokio::test]
async fn a_small_group_keeps_its_bound() {
    let m = DistributeLockManager::connect("memory://").await.unwrap();
    for capacity in 1..=4 {
        let group = m.group("small").capacity(capacity);
        for key in 0..10 {
            let _ = group.lock(key);
            assert!(
                group.cached() <= capacity,
                "capacity {capacity}: {} cached",
                group.cached()
            );
        }
    }
    m.close().await;
}

/// An upgraded write stands on its owner's read (on ZooKeeper the read's node is
/// what keeps the writers queued behind it out): it is guaranteed no longer than
/// that read, and lost with it — here at the read's `max_hold` bound, which comes
/// first, as the read was taken first — never left standing while the read is
/// given back.
#[tokio::test]
async fn an_upgrade_is_lost_with_the_read_it_stands_beside() {
    use dlock_api::spi::{InMemoryBackend, LostReason};
    let m = DistributeLockManager::builder(InMemoryBackend::new())
        .max_hold(Duration::from_millis(400))
        .build()
        .unwrap();
    let rw = m.read_write_lock("doc");
    let mut up = rw.upgradeable_read().lock().await.unwrap();
    // The subject is time passing: the upgrade's own bound ends later.
    tokio::time::sleep(Duration::from_millis(100)).await;
    up.upgrade().await.unwrap();
    let read_until = up.read().valid_until().unwrap();
    let write_until = up.write().unwrap().valid_until().unwrap();
    assert!(
        write_until <= read_until,
        "the write is guaranteed past the read it stands beside"
    );
    assert_eq!(up.read().lost().await, LostReason::MaxHold);
    assert!(
        up.write().unwrap().is_lost(),
        "the write outlived the read it stands beside"
    );
    drop(up);
    m.close().await;
}

/// A keyed group's read-write locks are evicted as its locks are: a stream of keys
/// keeps the cache at its capacity (plus the handles in use), and a held one is kept.
#[tokio::test]
async fn a_keyed_group_evicts_unused_read_write_locks() {
    let m = DistributeLockManager::connect("memory://").await.unwrap();
    let docs = m.group("doc").capacity(4);
    let held = docs.read_write_lock(0);
    let reading = held.read().lock().await.unwrap();
    drop(held);
    for key in 1..100 {
        let rw = docs.read_write_lock(key);
        let guard = rw.write().lock().await.unwrap();
        guard.unlock().await.unwrap();
        assert!(
            docs.cached() <= 5,
            "{} read-write locks cached",
            docs.cached()
        );
    }
    let again = docs.read_write_lock(0);
    let inner = again
        .read()
        .try_lock(Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(inner.acquisition(), dlock_api::Acquisition::Reentered);
    drop(inner);
    drop(reading);
    m.close().await;
}

/// Fairness is chosen per handle, the same way for locks and read-write locks,
/// from the manager or a keyed group; a key's fair and non-fair handles are two
/// handles (two owners), each cached as itself.
#[tokio::test]
async fn fairness_is_chosen_per_handle() {
    use dlock_api::Fairness;
    let m = DistributeLockManager::connect("memory://").await.unwrap();
    assert_eq!(m.lock("a").fairness(), Fairness::NonFair);
    assert_eq!(m.fair_lock("a").fairness(), Fairness::Fair);
    assert_eq!(m.read_write_lock("d").write().fairness(), Fairness::NonFair);
    let fair = m.fair_read_write_lock("d");
    assert_eq!(fair.write().fairness(), Fairness::Fair);
    assert_eq!(fair.read().fairness(), Fairness::Fair);
    let docs = m.group("doc");
    assert_eq!(docs.read_write_lock(1).read().fairness(), Fairness::NonFair);
    let fair = docs.fair_read_write_lock(1);
    assert_eq!(fair.read().fairness(), Fairness::Fair);
    assert_eq!(
        docs.cached(),
        2,
        "a key's fair and non-fair handles, each cached"
    );
    let again = docs.fair_read_write_lock(1);
    assert_eq!(
        again.read().owner(),
        fair.read().owner(),
        "the cached handle"
    );
    assert_eq!(docs.fair_lock(2).fairness(), Fairness::Fair);
    m.close().await;
}

/// Clones of one read-write lock are one owner: a clone's read that queued behind
/// the owner's own write, before that write was granted, goes beside it once it is
/// (it would wait for its own owner's write otherwise, and the write's downgrade,
/// behind that read, for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clones_queued_read_goes_beside_its_owners_granted_write() {
    let m = DistributeLockManager::connect("memory://").await.unwrap();
    let rw = m.read_write_lock("doc");
    let rival = m.read_write_lock("doc");
    let rival_read = rival.read().lock().await.unwrap();
    let writer = rw.clone();
    let writing = tokio::spawn(async move {
        let write = writer.write().lock().await.unwrap();
        write.downgrade().await.unwrap()
    });
    assert!(queued(&m, "doc", 1).await, "the write never queued");
    let reader = rw.clone();
    let reading = tokio::spawn(async move { reader.read().lock().await.unwrap() });
    assert!(queued(&m, "doc", 2).await, "the clone's read never queued");
    rival_read.unlock().await.unwrap();
    let both = tokio::time::timeout(Duration::from_secs(5), async {
        (writing.await.unwrap(), reading.await.unwrap())
    })
    .await
    .expect("the clone's read waited for its own owner's write (deadlock)");
    drop(both);
    m.close().await;
}

/// Whether `name` gets `n` waiters within 2.5 s (polled: no signal says so).
async fn queued(m: &DistributeLockManager, name: &str, n: usize) -> bool {
    for _ in 0..500 {
        let waiting = m.inspect(name).await.unwrap().and_then(|s| s.waiters);
        if waiting.unwrap_or(0) >= n {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    false
}

/// An upgradeable read takes options as every other acquisition does: its holds
/// — and the write side its upgrade takes — store the acquisition's context (shown
/// to whoever inspects the lock), waiting or not.
#[tokio::test]
async fn an_upgradeable_read_stores_its_acquisitions_context() {
    use dlock_api::LockOptions;
    let m = DistributeLockManager::connect("memory://").await.unwrap();
    let rw = m.read_write_lock("doc");
    let options = LockOptions::new().context("job=U");
    let mut held = rw.upgradeable_read().lock_with(&options).await.unwrap();
    let state = m.inspect("doc").await.unwrap().expect("held");
    assert_eq!(state.holders[0].context, "job=U", "{state:?}");
    // The write side an upgrade takes is the same acquisition's.
    held.upgrade().await.unwrap();
    let state = m.inspect("doc").await.unwrap().expect("held");
    assert_eq!(state.holders.len(), 2, "{state:?}");
    assert!(
        state.holders.iter().all(|h| h.context == "job=U"),
        "{state:?}"
    );
    held.unlock().await.unwrap();
    let tried = rw
        .upgradeable_read()
        .try_lock_with(Duration::ZERO, &LockOptions::new().context("job=T"))
        .await
        .unwrap()
        .expect("free");
    let state = m.inspect("doc").await.unwrap().expect("held");
    assert_eq!(state.holders[0].context, "job=T", "{state:?}");
    tried.unlock().await.unwrap();
    m.close().await;
}
