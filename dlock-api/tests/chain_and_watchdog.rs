//! The chain's order and hooks, and the watchdog, on the in-memory backend.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock_api::spi::async_trait;
use dlock_api::spi::{
    AcquireChain, AcquireContext, AcquireResult, Error, ErrorKind, HoldStatus, InMemoryBackend,
    LockHandler, LockName, LockRemoteResource, LostReason, ReleaseChain, ReleaseContext,
    ReleaseResult, Result,
};
use dlock_api::DistributeLockManager;

mod common;
use common::{Observer, ObserverHandler, Wrapped};

type Log = Arc<Mutex<Vec<String>>>;

/// Records when it is entered and left, and may refuse or fail.
struct Recorder {
    name: &'static str,
    log: Log,
    reject: bool,
}

#[async_trait]
impl LockHandler for Recorder {
    async fn acquire(&self, ctx: &AcquireContext, next: AcquireChain<'_>) -> Result<AcquireResult> {
        self.log
            .lock()
            .unwrap()
            .push(format!("{}>acquire", self.name));
        if self.reject {
            return Err(Error::new(ErrorKind::Rejected, "refused by test"));
        }
        ctx.extensions.insert(self.name);
        let r = next.invoke(ctx).await;
        self.log
            .lock()
            .unwrap()
            .push(format!("{}<acquire", self.name));
        r
    }
    async fn release(&self, ctx: &ReleaseContext, next: ReleaseChain<'_>) -> Result<ReleaseResult> {
        self.log
            .lock()
            .unwrap()
            .push(format!("{}>release", self.name));
        let r = next.invoke(ctx).await;
        self.log
            .lock()
            .unwrap()
            .push(format!("{}<release", self.name));
        r
    }
    fn on_acquire_error(&self, _ctx: &AcquireContext, err: &Error) {
        self.log
            .lock()
            .unwrap()
            .push(format!("{}!{}", self.name, err.kind()));
    }
}

fn recorder(name: &'static str, log: &Log, reject: bool) -> Recorder {
    Recorder {
        name,
        log: Arc::clone(log),
        reject,
    }
}

#[tokio::test]
async fn handlers_run_in_registration_order_and_unwind_in_reverse() {
    let log: Log = Arc::default();
    let m = DistributeLockManager::builder(InMemoryBackend::new())
        .with_handler(recorder("first", &log, false))
        .with_handler(recorder("second", &log, false))
        .with_handler(recorder("third", &log, false))
        .build()
        .unwrap();
    let g = m
        .lock("order")
        .try_lock(Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    g.unlock().await.unwrap();
    assert_eq!(
        *log.lock().unwrap(),
        [
            "first>acquire",
            "second>acquire",
            "third>acquire",
            "third<acquire",
            "second<acquire",
            "first<acquire",
            "first>release",
            "second>release",
            "third>release",
            "third<release",
            "second<release",
            "first<release",
        ]
    );
}

#[tokio::test]
async fn a_handler_short_circuits_and_error_hooks_run_for_the_handlers_passed() {
    let log: Log = Arc::default();
    let backend = InMemoryBackend::new();
    let m = DistributeLockManager::builder(backend.clone())
        .with_handler(recorder("outer", &log, false))
        .with_handler(recorder("gate", &log, true))
        .with_handler(recorder("inner", &log, false))
        .build()
        .unwrap();
    let err = m.lock("sc").try_lock(Duration::ZERO).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Rejected);
    // "inner" was never reached; hooks run innermost first for those passed through.
    assert_eq!(
        *log.lock().unwrap(),
        [
            "outer>acquire",
            "gate>acquire",
            "gate!rejected",
            "outer<acquire",
            "outer!rejected"
        ]
    );
    assert_eq!(
        backend.acquire_attempts(),
        0,
        "a short-circuited call reached the backend"
    );
    assert_eq!(m.held_count(), 0);
}

/// Reads what earlier handlers stored in the context.
struct ExtensionReader(Arc<Mutex<Option<&'static str>>>);

#[async_trait]
impl LockHandler for ExtensionReader {
    async fn acquire(&self, ctx: &AcquireContext, next: AcquireChain<'_>) -> Result<AcquireResult> {
        *self.0.lock().unwrap() = ctx.extensions.get::<&'static str>();
        next.invoke(ctx).await
    }
    async fn release(&self, ctx: &ReleaseContext, next: ReleaseChain<'_>) -> Result<ReleaseResult> {
        next.invoke(ctx).await
    }
}

#[tokio::test]
async fn handlers_pass_data_through_extensions() {
    let log: Log = Arc::default();
    let seen = Arc::new(Mutex::new(None));
    let m = DistributeLockManager::builder(InMemoryBackend::new())
        .with_handler(recorder("writer", &log, false))
        .with_handler(ExtensionReader(Arc::clone(&seen)))
        .build()
        .unwrap();
    let g = m.lock("ext").lock().await.unwrap();
    assert_eq!(*seen.lock().unwrap(), Some("writer"));
    g.unlock().await.unwrap();
}

#[tokio::test]
async fn watchdog_renews_at_a_third_of_the_lease() {
    let observer = Arc::new(Observer::default());
    let lease = Duration::from_millis(300);
    let m = DistributeLockManager::builder(InMemoryBackend::new())
        .lease(lease)
        .with_handler(ObserverHandler(Arc::clone(&observer)))
        .build()
        .unwrap();
    let guards = [
        m.lock("a").lock().await.unwrap(),
        m.lock("b").lock().await.unwrap(),
    ];
    assert_eq!(m.watched_count(), 2);
    tokio::time::sleep(lease * 3).await; // time passing is the subject
                                         // Every 100 ms (a third of the lease): 8–9 renewals of each lock in 900 ms, and
                                         // the median gap between one lock's renewals near 100 ms. A cadence of half the
                                         // lease (150 ms: at most 6 renewals) or a quarter (75 ms gaps) fails; the median
                                         // is the measure because one late wake-up on a busy machine moves a gap, not it.
    let renewed_at = observer.renewed_at.lock().unwrap().clone();
    for name in ["a", "b"] {
        let times: Vec<_> = renewed_at
            .iter()
            .filter(|(n, _)| n.ends_with(name))
            .map(|(_, at)| *at)
            .collect();
        assert!(
            (7..=10).contains(&times.len()),
            "lock {name}: {} renewals over 3 leases of {lease:?}",
            times.len()
        );
        let mut gaps: Vec<_> = times.windows(2).map(|w| w[1] - w[0]).collect();
        gaps.sort();
        let median = gaps[gaps.len() / 2];
        assert!(
            (Duration::from_millis(85)..=Duration::from_millis(125)).contains(&median),
            "lock {name}: renewals every {median:?} (median), not a third of the {lease:?} lease; gaps {gaps:?}"
        );
    }
    assert_eq!(observer.renew_failed.load(Ordering::SeqCst), 0);
    for g in guards {
        assert!(!g.is_lost());
        g.unlock().await.unwrap();
    }
    assert_eq!(m.watched_count(), 0);
}

#[tokio::test]
async fn failing_renewals_fire_lost_a_margin_before_the_lease_passes() {
    let observer = Arc::new(Observer::default());
    let backend = Wrapped::default();
    let lease = Duration::from_millis(300);
    let m = DistributeLockManager::builder(backend.clone())
        .lease(lease)
        .with_handler(ObserverHandler(Arc::clone(&observer)))
        .build()
        .unwrap();
    let g = m.lock("flaky").lock().await.unwrap();
    let acquired = g.acquired_at();
    backend.renew_fails.store(true, Ordering::SeqCst);
    let reason = tokio::time::timeout(Duration::from_secs(3), g.lost())
        .await
        .unwrap();
    assert_eq!(reason, LostReason::LeaseExpired);
    // Lost a margin (here 1 % + 10 ms) before the store can expire the hold.
    let after = acquired.elapsed();
    assert!(
        after < lease,
        "declared lost after {after:?}, not before the {lease:?} lease could end"
    );
    assert!(
        after >= lease * 2 / 3,
        "declared lost after {after:?}, long before the lease ended"
    );
    assert!(
        observer.renew_failed.load(Ordering::SeqCst) >= 2,
        "retries before giving up"
    );
    assert_eq!(*observer.lost.lock().unwrap(), [LostReason::LeaseExpired]);
    assert_eq!(g.unlock().await.unwrap_err().kind(), ErrorKind::LockLost);
}

#[tokio::test]
async fn a_retryable_renew_failure_is_survived() {
    let lease = Duration::from_millis(600);
    let (backend, m) = common::wrapped_manager(lease);
    let g = m.lock("blip").lock().await.unwrap();
    backend.renew_fails.store(true, Ordering::SeqCst);
    tokio::time::sleep(lease / 3 + Duration::from_millis(60)).await; // one failed renewal
    backend.renew_fails.store(false, Ordering::SeqCst);
    tokio::time::sleep(lease * 2).await;
    assert!(!g.is_lost(), "{:?}", g.lost_reason());
    g.unlock().await.unwrap();
}

#[tokio::test]
async fn builder_rejects_bad_settings_with_config_errors() {
    let cases = [
        DistributeLockManager::builder(InMemoryBackend::new())
            .lease(Duration::ZERO)
            .build(),
        DistributeLockManager::builder(InMemoryBackend::new())
            .operation_timeout(Duration::ZERO)
            .build(),
        DistributeLockManager::builder(InMemoryBackend::new())
            .namespace("bad\nns")
            .build(),
    ];
    for case in cases {
        assert_eq!(case.map(drop).map_err(|e| e.kind()), Err(ErrorKind::Config));
    }
}

#[tokio::test]
async fn namespaces_groups_and_connect() {
    let backend = InMemoryBackend::new();
    let m = DistributeLockManager::builder(backend.clone())
        .namespace("app:")
        .build()
        .unwrap();
    let group = m.group("user");
    let lock = group.lock(42);
    assert_eq!(lock.name().unwrap().as_str(), "app:user:42");
    let g = lock.try_lock(Duration::ZERO).await.unwrap().unwrap();
    let state = backend
        .inspect(&LockName::new("app:user:42").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(state.holders[0].owner, *lock.owner());
    assert!(state.holders[0].context.starts_with(b"pid="));
    g.unlock().await.unwrap();
    assert_eq!(
        m.lock("")
            .try_lock(Duration::ZERO)
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidName
    );
    // A semaphore checks its name once and refuses every acquisition on a bad one,
    // clones included.
    let bad = m.semaphore("", 3);
    for sem in [bad.clone(), bad] {
        assert_eq!(sem.name().unwrap_err().kind(), ErrorKind::InvalidName);
        assert_eq!(
            sem.try_acquire(1, Duration::ZERO)
                .await
                .map(drop)
                .unwrap_err()
                .kind(),
            ErrorKind::InvalidName
        );
    }

    let m = DistributeLockManager::connect("memory://").await.unwrap();
    assert_eq!(m.backend_name(), "memory");
    m.close().await;
    m.close().await; // idempotent
    assert!(m.is_closed());
}

#[test]
fn dropping_a_guard_after_its_runtime_is_gone_does_not_panic() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let m = DistributeLockManager::builder(InMemoryBackend::new())
        .build()
        .unwrap();
    let g = rt.block_on(async {
        m.lock("late")
            .try_lock(Duration::ZERO)
            .await
            .unwrap()
            .unwrap()
    });
    drop(rt);
    drop(g);
}

/// A status feed quiet for its first second (as the SQL session modes' probe) is
/// followed from then, not before: holds released sooner never have their feed
/// polled — it is dropped unpolled, and no task ran for it — and a kept hold's
/// feed, told of a loss at once, reports it once its quiet time is over and not
/// sooner. (The follower used to start a task per hold at the grant.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_feed_is_followed_only_once_its_quiet_time_ends() {
    // Long beside a release's time even on a loaded machine: a hold released
    // sooner must never have its feed polled.
    const QUIET: Duration = Duration::from_secs(1);
    let backend = Wrapped {
        quiet: Some(QUIET),
        ..Wrapped::session_bound()
    };
    let m = DistributeLockManager::builder(backend.clone())
        .build()
        .unwrap();
    for _ in 0..20 {
        let g = m.lock("q").try_lock(Duration::ZERO).await.unwrap().unwrap();
        g.unlock().await.unwrap();
    }
    tokio::time::sleep(QUIET + Duration::from_millis(300)).await;
    assert_eq!(
        backend.polls.load(Ordering::SeqCst),
        0,
        "a released hold's feed was polled"
    );
    let feeds: Vec<_> = std::mem::take(&mut *backend.feeds.lock().unwrap());
    assert_eq!(feeds.len(), 20);
    assert!(
        feeds.iter().all(|tx| tx.is_closed()),
        "a released hold's feed was kept"
    );

    let taken = Instant::now();
    let g = m.lock("q").try_lock(Duration::ZERO).await.unwrap().unwrap();
    let feed = backend.feeds.lock().unwrap().pop().unwrap();
    feed.send_replace(HoldStatus::Lost(LostReason::SessionExpired));
    let reason = tokio::time::timeout(QUIET * 5, g.lost())
        .await
        .expect("the loss was never reported");
    let after = taken.elapsed();
    assert_eq!(reason, LostReason::SessionExpired);
    assert!(
        after >= QUIET - Duration::from_millis(10),
        "the feed was followed {after:?} after the grant, within its quiet time"
    );
    assert_eq!(backend.polls.load(Ordering::SeqCst), 1);
    drop(g);
    m.close().await;
}

/// The manager follows a grant's status feed: suspended and back, then lost — the
/// guard's lost signal fires and the handlers' `on_lost` hook hears it; no watchdog
/// entry is made for a lease-less hold.
#[tokio::test]
async fn a_session_bound_hold_follows_its_status_feed() {
    let observer = Arc::new(Observer::default());
    let backend = Wrapped::session_bound();
    let m = DistributeLockManager::builder(backend.clone())
        .with_handler(ObserverHandler(Arc::clone(&observer)))
        .build()
        .unwrap();
    let g = m.lock("s").try_lock(Duration::ZERO).await.unwrap().unwrap();
    assert_eq!(m.watched_count(), 0, "no lease, nothing for the watchdog");
    let feed = backend.feeds.lock().unwrap().pop().unwrap();
    let until = |want: bool| {
        let g = &g;
        async move {
            tokio::time::timeout(Duration::from_secs(5), async {
                while g.is_suspended() != want {
                    tokio::task::yield_now().await;
                }
            })
            .await
            .is_ok()
        }
    };
    feed.send_replace(HoldStatus::Suspended);
    assert!(until(true).await, "suspended");
    assert!(!g.is_lost());
    feed.send_replace(HoldStatus::Held);
    assert!(until(false).await, "back");
    feed.send_replace(HoldStatus::Lost(LostReason::SessionExpired));
    let reason = tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .unwrap();
    assert_eq!(reason, LostReason::SessionExpired);
    assert!(!g.is_suspended());
    assert_eq!(
        *observer.lost.lock().unwrap(),
        vec![LostReason::SessionExpired]
    );
    assert!(
        g.unlock().await.is_err(),
        "a lost guard's unlock reports the loss"
    );

    // A released hold's feed is no longer followed: a late Lost is ignored.
    let g = m.lock("s").try_lock(Duration::ZERO).await.unwrap().unwrap();
    let feed = backend.feeds.lock().unwrap().pop().unwrap();
    g.unlock().await.unwrap();
    feed.send_replace(HoldStatus::Lost(LostReason::NotOwner));
    drop(feed);
    assert_eq!(observer.lost.lock().unwrap().len(), 1);
    m.close().await;
}

/// Every error a backend returns reaches the caller stamped once, first, with the
/// backend, the operation and the lock (the chain's tail stamps them: a backend only
/// classifies its errors), whatever path it took — an acquire, or an extension the
/// watchdog sent as a renewal.
#[tokio::test]
async fn backend_errors_name_the_backend_the_operation_and_the_lock_once() {
    let backend = Wrapped::default();
    let m = DistributeLockManager::builder(backend.clone())
        .build()
        .unwrap();
    let located = |err: &dlock_api::spi::Error| {
        err.context()
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect::<Vec<_>>()
    };

    backend.error_after_grant.store(true, Ordering::SeqCst);
    let lock = m.lock("stamped");
    let err = lock
        .try_lock(Duration::ZERO)
        .await
        .expect_err("the acquire fails");
    backend.error_after_grant.store(false, Ordering::SeqCst);
    let name = lock.name().unwrap().to_string();
    assert_eq!(
        located(&err),
        [
            ("backend", "memory".to_owned()),
            ("op", "acquire".to_owned()),
            ("lock", name)
        ],
        "{err}"
    );

    let other = m.lock("stamped-too");
    let guard = other.try_lock(Duration::ZERO).await.unwrap().unwrap();
    backend.renew_fails.store(true, Ordering::SeqCst);
    let err = guard
        .extend(Duration::from_secs(20))
        .await
        .expect_err("the extension fails");
    backend.renew_fails.store(false, Ordering::SeqCst);
    assert_eq!(
        located(&err),
        [
            ("backend", "memory".to_owned()),
            ("op", "renew".to_owned()),
            ("lock", guard.name().to_string())
        ],
        "{err}"
    );
    guard.unlock().await.unwrap();
    m.close().await;
}
