//! Cases on what a guard tells its holder: until when the hold is guaranteed
//! (`valid_until`), whether it can be acted on now (`check`), an explicit renewal
//! (`extend`), how it was granted (`acquisition`), and who holds a lock a
//! `try_lock` was refused (`inspect`, with each acquisition's context).

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_api::{Acquisition, LockOptions};
use dlock_spi::{ErrorKind, MAX_CONTEXT_LEN};

use super::{store_lease, take, Env};
use crate::TestBackend;

/// How far a store's remaining lease may round up (whole milliseconds, read
/// against its own clock).
const ROUNDING: Duration = Duration::from_millis(5);

/// The lease the store reports for `name` right now (its own clock).
async fn remaining_lease(m: &dlock_api::DistributeLockManager, name: &str) -> Duration {
    m.inspect(name)
        .await
        .expect("inspect")
        .and_then(|s| s.holders.first().and_then(|h| h.remaining_lease))
        .unwrap_or_else(|| panic!("{name}: no holder with a lease in the store"))
}

/// `valid_until` is the conservative end of the hold and moves with renewals;
/// `check` fails once the hold is lost or past that instant; `extend` lengthens a
/// fixed lease in the store (another client is still refused past the original
/// lease), shortens one in the store (another client gets in within the new lease,
/// and the guaranteed instant drops before the answer — even when the extend is
/// dropped after its first poll), makes a watchdog-renewed hold renew for the new
/// lease from then on (the store's remaining lease stays within it, also when two
/// extends race), and refuses a lost hold and a bad lease. On session-bound
/// backends there is no guaranteed instant and `extend` is `Unsupported`.
pub async fn guards_say_until_when_and_extend(backend: Arc<dyn TestBackend>) {
    let env = Env::new(backend);
    let lease = Duration::from_millis(600);
    let a = env.manager_with(|m| m.lease(lease)).await;
    let b = env.manager().await;
    let lock = a.lock("extend");
    let guard = take(&lock, Duration::from_secs(5)).await;
    guard.check().expect("a fresh hold can be acted on");
    if !a.capabilities().lease {
        assert_eq!(
            guard.valid_until(),
            None,
            "a session-bound hold has no lease end"
        );
        let err = guard
            .extend(Duration::from_secs(1))
            .await
            .expect_err("extend without a lease");
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
        a.close().await;
        let err = guard.check().expect_err("check after the manager closed");
        assert_eq!(err.kind(), ErrorKind::LockLost, "{err}");
        drop(guard);
        env.finish(&[&a, &b]).await;
        return;
    }
    let until = guard
        .valid_until()
        .expect("a lease-based hold has a guaranteed instant");
    assert!(
        until > Instant::now() && until <= guard.acquired_at() + lease,
        "valid_until {until:?} is not within the lease from {:?}",
        guard.acquired_at()
    );
    let err = guard
        .extend(Duration::ZERO)
        .await
        .expect_err("a zero lease");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");

    // A watchdog-renewed hold extended shorter renews for the shorter lease from
    // then on: the store's own remaining lease stays within it. (Short, yet long
    // enough that a renewal late by a busy machine does not lose it: with 300 ms —
    // a renewal every 100 ms, lost when one took 200 ms — CI lost it on postgres-tls.
    // Against the 3 s it was extended to, 900 ms still tells whether it took.)
    let short = Duration::from_millis(900);
    guard
        .extend(Duration::from_secs(3))
        .await
        .expect("extend longer");
    assert!(
        remaining_lease(&a, "extend").await > lease,
        "extend did not lengthen the stored lease"
    );
    guard.extend(short).await.expect("extend shorter");
    // Two racing extends go out one after the other; the last asked wins.
    let (first, second) = tokio::join!(guard.extend(Duration::from_secs(3)), guard.extend(short));
    first.expect("racing extend");
    second.expect("racing extend");
    for _ in 0..4 {
        // Time passing (several renewals) is the subject here.
        tokio::time::sleep(short / 2).await;
        let left = remaining_lease(&a, "extend").await;
        // Stores count in whole milliseconds of their own clock (or their steps).
        assert!(
            left <= store_lease(&a.capabilities(), short) + ROUNDING,
            "the store holds for {left:?} after the lease was shortened to {short:?}"
        );
        guard.check().expect("a renewed hold can be acted on");
        assert!(guard
            .valid_until()
            .is_some_and(|u| u <= Instant::now() + short));
    }
    guard.unlock().await.expect("unlock");

    // A fixed lease lengthened holds past its original end.
    let fixed = lock
        .try_lock_with(
            Duration::ZERO,
            &dlock_api::LockOptions::new().lease(Duration::from_millis(400)),
        )
        .await
        .expect("no error")
        .expect("free");
    fixed
        .extend(Duration::from_secs(4))
        .await
        .expect("extend a fixed lease");
    assert!(fixed
        .valid_until()
        .is_some_and(|u| u >= Instant::now() + Duration::from_secs(3)));
    tokio::time::sleep(Duration::from_millis(700)).await;
    fixed.check().expect("held past its original lease");
    assert!(
        b.lock("extend")
            .try_lock(Duration::ZERO)
            .await
            .expect("no error")
            .is_none(),
        "another client got the lock at the original lease's end: extend did not reach the store"
    );

    // Shortened by an extend dropped after its first poll: the guaranteed instant
    // drops at once, and the store lets the hold go within the new lease.
    let _ = tokio::time::timeout(Duration::ZERO, fixed.extend(short)).await;
    assert!(
        fixed
            .valid_until()
            .is_none_or(|u| u <= Instant::now() + short),
        "a shortening extend left the guaranteed instant beyond the new lease"
    );
    let asked = Instant::now();
    let rival = b
        .lock("extend")
        .try_lock(Duration::from_secs(2))
        .await
        .expect("no error")
        .expect("the shortened hold ends within its new lease, not its old one");
    assert!(asked.elapsed() < Duration::from_secs(2));
    let err = fixed
        .check()
        .expect_err("check after another client took the lock");
    assert_eq!(err.kind(), ErrorKind::LockLost, "{err}");
    let err = fixed
        .extend(Duration::from_secs(1))
        .await
        .expect_err("extend of an expired hold");
    assert_eq!(err.kind(), ErrorKind::LockLost, "{err}");
    rival.unlock().await.expect("unlock");
    drop(fixed);

    // Closing the manager: no guard says it can act after.
    let last = take(&lock, Duration::from_secs(5)).await;
    a.close().await;
    let err = last.check().expect_err("check after close");
    assert_eq!(err.kind(), ErrorKind::LockLost, "{err}");
    assert_eq!(last.valid_until(), None);
    drop(last);
    env.finish(&[&a, &b]).await;
}

/// A guard says how it was granted (new, reentered, took over an expired holder
/// where the backend can tell); after a refused `try_lock`, `inspect` names the holder
/// with the context its acquisition stored, its token and remaining lease; every
/// acquisition stores its own context (readers side by side each theirs, and
/// semaphore permits); an oversized context is refused.
pub async fn acquisitions_say_how_and_refusals_say_who(backend: Arc<dyn TestBackend>) {
    let env = Env::new(backend);
    let lease = Duration::from_millis(800);
    let a = env.manager_with(|m| m.lease(lease)).await;
    let b = env.manager().await;
    let caps = a.capabilities();
    let lock = a.lock("who");
    let first = lock
        .try_lock_with(Duration::ZERO, &LockOptions::new().context("job=A"))
        .await
        .expect("no error")
        .expect("free");
    assert_eq!(first.acquisition(), Acquisition::New);
    let again = take(&lock, Duration::ZERO).await;
    assert_eq!(again.acquisition(), Acquisition::Reentered);
    assert_eq!(again.fencing_token(), first.fencing_token());

    let refused = b
        .lock("who")
        .try_lock(Duration::ZERO)
        .await
        .expect("no error");
    assert!(refused.is_none(), "granted a lock someone holds");
    let holders = b
        .inspect("who")
        .await
        .expect("inspect")
        .map(|state| state.holders)
        .unwrap_or_default();
    assert_eq!(holders.len(), 1, "{holders:?}");
    let h = &holders[0];
    assert_eq!(&h.owner, lock.owner());
    assert_eq!(h.context, "job=A", "the acquisition's own context");
    if caps.fencing {
        assert_eq!(h.token, first.fencing_token());
    }
    if caps.lease {
        let left = h
            .remaining_lease
            .expect("a lease-based holder's remaining lease");
        assert!(left <= store_lease(&caps, lease), "{left:?}");
    } else {
        assert_eq!(h.remaining_lease, None);
    }
    drop(again);
    first.unlock().await.expect("unlock");

    b.lock("who")
        .try_lock(Duration::ZERO)
        .await
        .expect("no error")
        .expect("a free lock granted")
        .unlock()
        .await
        .expect("unlock");

    if caps.lease {
        // A holder whose fixed lease ran out, replaced.
        let short = Duration::from_millis(200);
        let fixed = lock
            .try_lock_with(Duration::ZERO, &dlock_api::LockOptions::new().lease(short))
            .await
            .expect("no error")
            .expect("free");
        tokio::time::timeout(Duration::from_secs(2), fixed.lost())
            .await
            .expect("the fixed lease ends");
        // The local signal fires at the lease asked for; the store may hold it to
        // its own minimum (etcd: whole seconds) and finds it expired on its own
        // round (etcd: every 500 ms), so the rival waits the store's lease and a
        // margin for that round.
        let next = take(
            &b.lock("who"),
            store_lease(&caps, short) + Duration::from_secs(2),
        )
        .await;
        let expected = if caps.takeover {
            Acquisition::TookOver
        } else {
            Acquisition::New
        };
        assert_eq!(next.acquisition(), expected);
        next.unlock().await.expect("unlock");
        drop(fixed);
    }

    if caps.shared {
        let rw1 = a.read_write_lock("readers");
        let rw2 = b.read_write_lock("readers");
        let r1 = rw1
            .read()
            .try_lock_with(Duration::ZERO, &LockOptions::new().context("reader=1"))
            .await
            .expect("no error")
            .expect("free");
        let r2 = rw2
            .read()
            .try_lock_with(Duration::ZERO, &LockOptions::new().context("reader=2"))
            .await
            .expect("no error")
            .expect("shared");
        let mut seen: Vec<(String, String)> = a
            .inspect("readers")
            .await
            .expect("inspect")
            .expect("held")
            .holders
            .into_iter()
            .map(|h| {
                (
                    h.owner.to_string(),
                    String::from_utf8_lossy(&h.context).into_owned(),
                )
            })
            .collect();
        seen.sort();
        let mut expected = vec![
            (rw1.read().owner().to_string(), "reader=1".to_owned()),
            (rw2.read().owner().to_string(), "reader=2".to_owned()),
        ];
        expected.sort();
        assert_eq!(seen, expected);
        r1.unlock().await.expect("unlock");
        r2.unlock().await.expect("unlock");
    }

    if caps.semaphore {
        let pool = a.semaphore("pool", 3);
        let permit = pool
            .try_acquire_with(2, Duration::ZERO, &LockOptions::new().context("worker=7"))
            .await
            .expect("no error")
            .expect("free permits");
        let holders = a
            .inspect("pool")
            .await
            .expect("inspect")
            .expect("held")
            .holders;
        assert_eq!(holders.len(), 1, "{holders:?}");
        assert_eq!(holders[0].context, "worker=7", "the permits' own context");
        permit.release().await.expect("release");
    }

    let err = lock
        .try_lock_with(
            Duration::ZERO,
            &LockOptions::new().context(vec![b'x'; MAX_CONTEXT_LEN + 1]),
        )
        .await
        .expect_err("an oversized context");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    env.finish(&[&a, &b]).await;
}
