//! Hand-overs: a release giving the lock to the queued writer, its provisional lease, a waiter dropped after it, stale notices, a dead head.

use std::time::{Duration, Instant};

use dlock_api::spi::{AcquireRequest, LockName, LockRemoteResource, OwnerId};
use dlock_api::DistributeLockManager;
use dlock_redis::RedisOptions;
use testsuite::conformance::{eventually, take};

use super::fixtures::*;

/// A release hands the lock to the queued writer in the same script: right after
/// the release the waiter is the holder (with a provisional lease no longer than its
/// liveness), it holds from the notice on without an attempt of its own, its token
/// is the next one, and the manager's first renewal extends the lease to the full one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_hands_the_lock_to_the_queued_writer() {
    let Some(url) = redis_url() else { return };
    for fair in [false, true] {
        let lock = name("hand-over");
        let (_, m1) = dlock_client(&url, RedisOptions::default()).await;
        // Re-checks 1 s apart: within the test only the notice wakes the waiter.
        let (waiter_side, m2) = dlock_client(&url, RedisOptions::default()).await;
        let pick = |m: &DistributeLockManager| {
            if fair {
                m.fair_lock(&lock)
            } else {
                m.lock(&lock)
            }
        };
        let a = take(&pick(&m1), Duration::ZERO).await;
        let waiter = pick(&m2);
        let mut b = Box::pin(waiter.try_lock(Duration::from_secs(20)));
        park(&mut b, || waiter_side.acquire_attempts() == 1).await;
        let a_token = a.fencing_token();
        a.unlock().await.unwrap();
        let (owner, left) = holder_of(&m1, &lock)
            .await
            .expect("held right after the release");
        assert_eq!(
            owner,
            waiter.owner().as_str(),
            "the release did not hand the lock over (fair: {fair})"
        );
        assert!(
            left <= RedisOptions::default().waiter_liveness,
            "provisional lease {left:?}"
        );
        let g = b.await.unwrap().expect("handed over");
        assert_eq!(
            waiter_side.acquire_attempts(),
            1,
            "the waiter asked again after it was told (fair: {fair})"
        );
        assert!(g.fencing_token() > a_token);
        assert!(
            eventually(Duration::from_secs(5), || async {
                holder_of(&m1, &lock)
                    .await
                    .is_some_and(|(_, left)| left > Duration::from_secs(10))
            })
            .await,
            "the provisional lease was never extended to the full lease"
        );
        assert!(!g.is_lost());
        g.unlock().await.unwrap();
        assert!(
            m1.inspect(&lock).await.unwrap().is_none(),
            "state left behind"
        );
        m1.close().await;
        m2.close().await;
    }
}

/// A handed-over hold on its provisional lease (the waiter's remaining liveness, at
/// least two thirds of 3 s here) is renewed a third into that lease, as any lease —
/// not at once: a hold released within a few hundred ms (the common hand-over)
/// costs no renewal. Held on, it is renewed before its provisional lease ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_over_hold_is_renewed_a_third_into_its_provisional_lease() {
    let Some(url) = redis_url() else { return };
    let lock = name("hand-over-renewal");
    let (_, m1) = dlock_client(&url, RedisOptions::default()).await;
    let (waiter_side, m2) = dlock_client(&url, RedisOptions::default()).await;
    let a = take(&m1.lock(&lock), Duration::ZERO).await;
    let waiter = m2.lock(&lock);
    let mut b = Box::pin(waiter.try_lock(Duration::from_secs(20)));
    park(&mut b, || waiter_side.acquire_attempts() == 1).await;
    a.unlock().await.unwrap();
    let g = b.await.unwrap().expect("handed over");
    let valid = g.valid_until().expect("a lease");
    let left = valid.saturating_duration_since(Instant::now());
    assert!(
        left < RedisOptions::default().waiter_liveness,
        "not on a provisional lease: valid for {left:?}"
    );
    // A third of what is left is at least 500 ms away: nothing is sent before.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        waiter_side.renewal_calls(),
        0,
        "the handed-over hold was renewed at once"
    );
    // Renewed before the provisional lease ends: the guard's validity moves on.
    let deadline = valid;
    while g.valid_until().is_some_and(|v| v <= valid) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        waiter_side.renewal_calls() >= 1 && g.valid_until().is_some_and(|v| v > valid),
        "not renewed within its provisional lease"
    );
    assert!(!g.is_lost());
    g.unlock().await.unwrap();
    m1.close().await;
    m2.close().await;
}

/// A hold the watchdog would not extend at once — a fixed lease (never renewed) with
/// a `max_hold` cap — that a release hands over on its provisional lease gets its
/// whole lease and cap all the same: the manager extends the lease before the guard
/// exists, and the cap and `acquired_at` count from the call, not from a lease before
/// the provisional lease's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_over_fixed_lease_keeps_its_lease_and_cap() {
    let Some(url) = redis_url() else { return };
    let lock = name("hand-over-fixed");
    let (_, m1) = dlock_client(&url, RedisOptions::default()).await;
    let (waiter_side, m2) = dlock_client(&url, RedisOptions::default()).await;
    let a = take(&m1.lock(&lock), Duration::ZERO).await;
    let waiter = m2.lock(&lock);
    let options = dlock_api::LockOptions::new()
        .lease(Duration::from_secs(10))
        .max_hold(Duration::from_secs(8));
    let called = Instant::now();
    let mut b = Box::pin(waiter.try_lock_with(Duration::from_secs(20), &options));
    park(&mut b, || waiter_side.acquire_attempts() == 1).await;
    a.unlock().await.unwrap();
    let g = b.await.unwrap().expect("handed over");
    let now = Instant::now();
    assert!(
        g.acquired_at() >= called,
        "acquired before it was asked for"
    );
    let until = g.valid_until().expect("a lease");
    assert!(
        until > now + Duration::from_secs(6),
        "valid for {:?} only (lease 10 s, cap 8 s)",
        until.saturating_duration_since(now)
    );
    let (_, left) = holder_of(&m1, &lock).await.expect("held");
    assert!(
        left > Duration::from_secs(6),
        "the store holds it {left:?} more"
    );
    assert!(!g.is_lost());
    g.unlock().await.unwrap();
    m1.close().await;
    m2.close().await;
}

/// A waiter dropped after a release handed it the lock, before it heard of it, gives
/// the lock back as it leaves the queue, and the next waiter gets it at once — not
/// when the provisional lease (its 30 s liveness) runs out. The waiter is the backend's
/// own acquire (the SPI), so the backend's leaving does it, not the manager's giving
/// back of a grant whose acquire was dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_dropped_after_a_hand_over_gives_the_lock_back() {
    let Some(url) = redis_url() else { return };
    let lock = name("hand-over-drop");
    let (_, m1) = dlock_client(&url, RedisOptions::default()).await;
    let long = RedisOptions::default().waiter_liveness(Duration::from_secs(30));
    let (b_side, m2) = dlock_client(&url, long.clone()).await;
    let (c_side, m3) = dlock_client(&url, long).await;
    let a = take(&m1.lock(&lock), Duration::ZERO).await;
    let b_req = AcquireRequest::new(
        LockName::new(lock.as_str()).unwrap(),
        OwnerId::new("dropped-waiter"),
        dlock_api::spi::GrantId::new(1),
    )
    .with_deadline(Some(Instant::now() + Duration::from_secs(20)));
    let mut b = Box::pin(b_side.try_acquire(&b_req));
    park(&mut b, || b_side.acquire_attempts() == 1).await;
    let c = take_in_background(m3.lock(&lock));
    assert!(
        eventually(Duration::from_secs(5), || async {
            c_side.acquire_attempts() == 1
        })
        .await
    );
    a.unlock().await.unwrap();
    assert_eq!(
        holder_of(&m1, &lock).await.map(|h| h.0),
        Some("dropped-waiter".to_owned()),
        "handed over to the first waiter"
    );
    let dropped = Instant::now();
    drop(b);
    let got = tokio::time::timeout(Duration::from_secs(5), c)
        .await
        .expect("the lock handed to the dropped waiter was not given back")
        .unwrap();
    assert!(got.duration_since(dropped) < Duration::from_secs(2));
    assert!(
        eventually(Duration::from_secs(2), || async {
            m1.inspect(&lock).await.unwrap().is_none()
        })
        .await,
        "state left behind"
    );
    for m in [m1, m2, m3] {
        m.close().await;
    }
}

/// A hand-over notice whose token is no greater than the fencing counter the
/// waiter's last refusal saw is stale (that hand-over lapsed before the refusal) and
/// is not taken: the waiter asks again and, the lock being held, keeps waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_hand_over_notice_is_not_taken() {
    let Some(url) = redis_url() else { return };
    let lock = name("hand-over-stale");
    let mut raw = raw_connection(&url).await;
    let (_, m1) = dlock_client(&url, RedisOptions::default()).await;
    let (b_side, m2) = dlock_client(&url, RedisOptions::default()).await;
    let a = take(&m1.lock(&lock), Duration::ZERO).await;
    let b_lock = m2.lock(&lock);
    let mut b = Box::pin(b_lock.try_lock(Duration::from_secs(20)));
    park(&mut b, || b_side.acquire_attempts() == 1).await;
    let (waiter, _) = queue_head(raw.clone(), &format!("dlock:{{{lock}}}:ql"))
        .await
        .expect("queued");
    // A hand-over of the lock at the token the refusal saw (the holder's).
    let (channel, notice) = notice_for(&b_side, &lock, &waiter);
    let _: i64 = redis::cmd("PUBLISH")
        .arg(channel)
        .arg(format!("{notice}\n{} 30000", a.fencing_token().get()))
        .query_async(&mut raw)
        .await
        .unwrap();
    // (The waiter runs only while the test polls it.)
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut b)
            .await
            .is_err(),
        "the waiter took a stale hand-over while the lock was held"
    );
    assert_eq!(b_side.acquire_attempts(), 2, "the waiter did not ask again");
    a.unlock().await.unwrap();
    let g = tokio::time::timeout(Duration::from_secs(5), b)
        .await
        .expect("granted after the release")
        .unwrap()
        .expect("granted");
    g.unlock().await.unwrap();
    m1.close().await;
    m2.close().await;
}

/// A waiter that died queued (it never re-checks, never leaves) is handed the lock by
/// the release all the same; it holds it for at most its liveness, after which the
/// next waiter gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_head_holds_a_handed_over_lock_at_most_its_liveness() {
    let Some(url) = redis_url() else { return };
    let lock = name("hand-over-dead");
    let (_, m1) = dlock_client(&url, RedisOptions::default()).await;
    let liveness = Duration::from_millis(900);
    let (b_side, m2) = dlock_client(&url, RedisOptions::default().waiter_liveness(liveness)).await;
    let (c_side, m3) = dlock_client(&url, RedisOptions::default()).await;
    let a = take(&m1.lock(&lock), Duration::ZERO).await;
    let b_lock = m2.lock(&lock);
    let mut b = Box::pin(b_lock.try_lock(Duration::from_secs(20)));
    park(&mut b, || b_side.acquire_attempts() == 1).await;
    let c = take_in_background(m3.lock(&lock));
    assert!(
        eventually(Duration::from_secs(5), || async {
            c_side.acquire_attempts() == 1
        })
        .await
    );
    // The waiter dies: its future is never polled or dropped again.
    std::mem::forget(b);
    let released = Instant::now();
    a.unlock().await.unwrap();
    let (owner, left) = holder_of(&m1, &lock).await.expect("handed over");
    assert_eq!(owner, b_lock.owner().as_str());
    assert!(
        left <= liveness,
        "provisional lease {left:?} > liveness {liveness:?}"
    );
    let got = tokio::time::timeout(Duration::from_secs(5), c)
        .await
        .expect("the next waiter never got the lock")
        .unwrap();
    let waited = got.duration_since(released);
    // At most the dead head's liveness, plus the next waiter's re-check interval
    // (a third of its 3 s liveness) and slack.
    assert!(
        waited < liveness + Duration::from_millis(1500),
        "waited {waited:?}"
    );
    for m in [m1, m2, m3] {
        m.close().await;
    }
}
