//! Cases on locks taken by key and together: a keyed group hands out one lock per
//! key from a bounded cache, and a multi-lock takes all its members or none, in an
//! order that cannot deadlock, with one lost signal for any member.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_api::Acquisition;
use dlock_spi::{ErrorKind, LostReason};

use super::{eventually, take, Env, WAIT_SLACK};
use crate::TestBackend;

/// The same key gives the same owner: a second `group.lock(key)` re-enters (same
/// token) while another client is refused; a stream of keys through a small cache
/// keeps it bounded and never evicts a handle in use (the held key still
/// re-enters afterwards); an idle handle is evicted by the next new key.
pub async fn groups_keep_one_lock_per_key(backend: Arc<dyn TestBackend>) {
    let env = Env::new(backend);
    let (a, b) = env.two_managers().await;
    let capacity = 4;
    let users = a
        .group("user")
        .capacity(capacity)
        .idle(Duration::from_secs(3600));
    let rivals = b.group("user");
    let outer = take(&users.lock(7), Duration::ZERO).await;
    let inner = take(&users.lock(7), Duration::ZERO).await;
    assert_eq!(inner.acquisition(), Acquisition::Reentered);
    assert_eq!(inner.fencing_token(), outer.fencing_token());
    assert!(rivals
        .lock(7)
        .try_lock(Duration::ZERO)
        .await
        .expect("no error")
        .is_none());

    for key in 100..120 {
        let guard = take(&users.lock(key), Duration::ZERO).await;
        guard.unlock().await.expect("unlock");
        assert!(
            users.cached() <= capacity + 1,
            "{} handles cached, capacity {capacity} and one in use",
            users.cached()
        );
    }
    let again = take(&users.lock(7), Duration::ZERO).await;
    assert_eq!(
        again.acquisition(),
        Acquisition::Reentered,
        "the handle in use was evicted: the same key became a second owner"
    );
    drop(again);
    drop(inner);
    outer.unlock().await.expect("unlock");
    for key in 200..210 {
        let _ = users.lock(key);
    }
    assert!(users.cached() <= capacity, "{} cached", users.cached());

    let brief = a.group("brief").capacity(2).idle(Duration::ZERO);
    let _ = brief.lock(1);
    let _ = brief.lock(2);
    let kept = brief.lock(3);
    assert_eq!(brief.cached(), 1, "idle handles stayed cached");
    let guard = take(&kept, Duration::ZERO).await;
    guard.unlock().await.expect("unlock");
    env.finish(&[&a, &b]).await;
}

/// A multi-lock holds all its members (others are refused each), or — when one
/// stays taken — none, within its wait; two multi-locks over the same names given
/// in opposite orders both finish their rounds (no deadlock); losing one member
/// fires the one lost signal, and unlock then reports the loss and frees the rest;
/// no names and bad names are refused.
pub async fn multi_locks_take_all_or_none(backend: Arc<dyn TestBackend>) {
    let env = Env::new(backend);
    let b = env.manager().await;
    // A short lease, so that the lost member below is found at a renewal soon — but
    // none shorter than the store holds (etcd: its minimum TTL, 1 s here). Asked for
    // 300 ms, etcd holds it 1 s anyway, while the watchdog counting 300 ms needs
    // every renewal answered within about 190 ms: the waiting rounds below lost a
    // member so on a loaded etcd cluster (in 3 of 3 runs of the parallel suite),
    // and on NATS JetStream. 1 s: a renewal may be 600 ms late, and a stolen member
    // is still found within a second.
    let short = Duration::from_secs(1);
    let lease = b
        .capabilities()
        .min_lease
        .map_or(short, |min| min.max(short));
    let a = env.manager_with(|m| m.lease(lease)).await;
    let names = ["z", "x", "y"];
    let multi = a.multi_lock(names);
    let guard = multi
        .try_lock(Duration::ZERO)
        .await
        .expect("no error")
        .expect("all free");
    let taken: Vec<String> = guard.names().map(|n| n.to_string()).collect();
    let expected: Vec<String> = ["x", "y", "z"]
        .iter()
        .map(|n| env.full(n).to_string())
        .collect();
    assert_eq!(taken, expected, "members taken in name order");
    for name in names {
        assert!(
            b.lock(name)
                .try_lock(Duration::ZERO)
                .await
                .expect("no error")
                .is_none(),
            "another client took member {name}"
        );
    }
    guard.unlock().await.expect("unlock");

    // None: one member stays taken; the others are given back within the wait.
    let by = take(&b.lock("y"), Duration::ZERO).await;
    let wait = Duration::from_millis(300);
    let asked = Instant::now();
    assert!(multi.try_lock(wait).await.expect("no error").is_none());
    assert!(asked.elapsed() < wait + WAIT_SLACK, "{:?}", asked.elapsed());
    assert_eq!(
        a.held_count(),
        0,
        "a member was kept after the multi-lock failed"
    );
    let bx = take(&b.lock("x"), Duration::ZERO).await;
    bx.unlock().await.expect("unlock");
    by.unlock().await.expect("unlock");

    // Opposite orders, waiting: both finish.
    let ab = a.multi_lock(["p", "q"]);
    let ba = b.multi_lock(["q", "p"]);
    let rounds = |m: dlock_api::MultiLock| async move {
        for _ in 0..10 {
            let g = m.lock().await.expect("lock");
            tokio::task::yield_now().await;
            g.unlock().await.expect("unlock");
        }
    };
    tokio::time::timeout(Duration::from_secs(20), async {
        tokio::join!(rounds(ab), rounds(ba))
    })
    .await
    .expect("two multi-locks over the same names deadlocked");

    // One member lost: the one signal fires; unlock reports it and frees the rest.
    let guard = multi
        .try_lock(Duration::ZERO)
        .await
        .expect("no error")
        .expect("all free");
    let signal = guard.lost_signal();
    env.backend().steal(&env.full("y")).await.expect("steal");
    let reason = tokio::time::timeout(Duration::from_secs(5), signal.lost())
        .await
        .expect("the multi-lock's lost signal fired");
    assert!(
        matches!(reason, LostReason::NotOwner | LostReason::SessionExpired),
        "{reason}"
    );
    assert!(guard.is_lost());
    assert!(guard.check().is_err());
    let err = guard.unlock().await.expect_err("unlock with a lost member");
    assert_eq!(err.kind(), ErrorKind::LockLost, "{err}");
    let freed = eventually(Duration::from_secs(5), || async { a.held_count() == 0 }).await;
    assert!(freed, "members left held after unlock");
    for name in ["x", "z"] {
        let g = take(&b.lock(name), Duration::ZERO).await;
        g.unlock().await.expect("unlock");
    }

    let none: [&str; 0] = [];
    let err = a
        .multi_lock(none)
        .try_lock(Duration::ZERO)
        .await
        .expect_err("no names");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let err = a
        .multi_lock(["ok", ""])
        .try_lock(Duration::ZERO)
        .await
        .expect_err("a bad name");
    assert_eq!(err.kind(), ErrorKind::InvalidName, "{err}");
    assert_eq!(a.held_count(), 0, "a bad name left a member held");
    env.finish(&[&a, &b]).await;
}
