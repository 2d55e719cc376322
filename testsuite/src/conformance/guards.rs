//! Guards that say what users need to know: [`LockGuard::valid_until`], [`LockGuard::check`]
//! and [`LockGuard::extend`].
//!
//! [`LockGuard::valid_until`]: dlock_api::LockGuard::valid_until
//! [`LockGuard::check`]: dlock_api::LockGuard::check
//! [`LockGuard::extend`]: dlock_api::LockGuard::extend

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_spi::{ErrorKind, LostReason, MAX_LEASE};

use super::{take, Env};
use crate::TestBackend;

/// `valid_until` is the hold's conservative end (after it began, within its lease);
/// `extend(lease)` renews the store's lease at once — the hold outlives its first
/// lease and another client is refused past it — and refuses a bad lease (changing
/// nothing), a hold stolen behind its back (which is then lost) and a hold whose
/// lease ran out; `check` is `Ok` while held and `LockLost` once lost. Session-bound
/// backends (ZooKeeper): `valid_until` is `None`, `extend` is `Unsupported`, `check`
/// is `Ok` while held.
pub async fn guards_say_until_when_and_extend(backend: Arc<dyn TestBackend>) {
    let env = Env::new(backend);
    let (a, b) = env.two_managers().await;
    if !a.capabilities().lease {
        let g = take(&a.lock("g"), Duration::ZERO).await;
        assert_eq!(
            g.valid_until(),
            None,
            "a session-bound hold has no lease end"
        );
        g.check().expect("a held session-bound lock checks");
        let err = g
            .extend(Duration::from_secs(5))
            .await
            .expect_err("a session-bound hold has no lease to extend");
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
        g.check().expect("still held after the refused extend");
        g.unlock().await.expect("unlock");
        env.finish(&[&a, &b]).await;
        return;
    }
    let lease = Duration::from_millis(600);
    let g = a
        .lock("g")
        .try_lock_with_lease(Duration::ZERO, lease)
        .await
        .expect("acquire")
        .expect("a free lock is granted");
    let until = g.valid_until().expect("a leased hold has an end");
    assert!(
        until > g.acquired_at() && until <= g.acquired_at() + lease,
        "valid_until {:?} after the start, not within the {lease:?} lease",
        until - g.acquired_at()
    );
    g.check().expect("a held lock checks");
    for bad in [Duration::ZERO, MAX_LEASE + Duration::from_secs(1)] {
        let err = g.extend(bad).await.expect_err("a bad lease is refused");
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{bad:?}: {err}");
    }
    assert_eq!(
        g.valid_until(),
        Some(until),
        "a refused extend moved the end"
    );

    let extended_lease = Duration::from_secs(3);
    let sent = Instant::now();
    g.extend(extended_lease).await.expect("extend a live hold");
    let extended = g.valid_until().expect("still leased");
    assert!(
        extended > until && extended >= sent + extended_lease - extended_lease / 3,
        "extend moved the end by {:?} only",
        extended.saturating_duration_since(until)
    );
    assert!(extended <= Instant::now() + extended_lease);
    // Past the first lease's end (the extended lease still runs for seconds): held,
    // and the store refuses another client.
    tokio::time::sleep_until((until + Duration::from_millis(300)).into()).await;
    g.check().expect("held past the first lease");
    let other = b.lock("g").try_lock(Duration::ZERO).await.expect("try");
    assert!(other.is_none(), "the store did not extend the lease");

    env.backend().steal(&env.full("g")).await.expect("steal");
    let err = g
        .extend(extended_lease)
        .await
        .expect_err("a stolen hold cannot be extended");
    assert_eq!(err.kind(), ErrorKind::LockLost, "{err}");
    assert_eq!(g.lost_reason(), Some(LostReason::NotOwner));
    let err = g.check().expect_err("a lost hold does not check");
    assert_eq!(err.kind(), ErrorKind::LockLost, "{err}");
    assert_eq!(g.valid_until(), None, "a lost hold has no end to count on");
    drop(g);

    let short = a
        .lock("h")
        .try_lock_with_lease(Duration::ZERO, Duration::from_millis(300))
        .await
        .expect("acquire")
        .expect("a free lock is granted");
    let reason = tokio::time::timeout(Duration::from_secs(2), short.lost())
        .await
        .expect("the lost signal fires within the lease");
    assert_eq!(reason, LostReason::LeaseExpired);
    let err = short
        .extend(extended_lease)
        .await
        .expect_err("an expired hold cannot be extended");
    assert_eq!(err.kind(), ErrorKind::LockLost, "{err}");
    let next = take(&b.lock("h"), Duration::from_secs(2)).await;
    next.unlock().await.expect("unlock");
    drop(short);
    env.finish(&[&a, &b]).await;
}
