//! A hold renewed for longer than the bucket keeps its keys: the bucket's `max_age`
//! drops a contender's key (written once) that old however often its lease was
//! renewed, and a lock whose holder's key is gone looks free. The backend must stop
//! renewing such a hold before then, so that it is lost — and said so — before
//! another client can be granted the lock. Runs on the NATS server at
//! `DLOCK_NATS_URL` (default `nats://127.0.0.1:4222`), in a bucket of its own
//! whose `max_age` is 4 s.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use dlock_nats::NatsBackend;
use dlock_spi::{
    AcquireRequest, GrantId, LockMode, LockName, LockRemoteResource, OwnerId, RenewRequest,
    RenewResult,
};

/// The bucket's `max_age`.
const MAX_AGE: Duration = Duration::from_secs(4);

fn selected() -> bool {
    dlock_tck::runner::selected("nats")
}

fn url() -> String {
    common::bucket_url(&format!("dlock_max_age?max_age={}s", MAX_AGE.as_secs()))
}

/// The lease every hold here has.
const LEASE: Duration = Duration::from_secs(1);

/// An exclusive request of `owner` (grant 1) for `name`.
fn request(name: &LockName, owner: &str) -> AcquireRequest {
    AcquireRequest::new(name.clone(), OwnerId::new(owner), GrantId::new(1))
        .with_mode(LockMode::Exclusive)
        .with_lease(LEASE)
}

/// Two backends and a fresh lock, granted to owner `a` through the first: the
/// backends, the lock, the renewal of that hold, and when it was asked for;
/// `None` when the run selects backends and not this one.
async fn placed() -> Option<(NatsBackend, NatsBackend, LockName, RenewRequest, Instant)> {
    if !selected() {
        return None;
    }
    let a = NatsBackend::connect(&url()).await.unwrap();
    let other = NatsBackend::connect(&url()).await.unwrap();
    let name = LockName::new(format!("aged-{:x}", fastrand_u64())).unwrap();
    let placed = Instant::now();
    let got = a.try_acquire(&request(&name, "a")).await.unwrap();
    let renewal = RenewRequest::new(
        name.clone(),
        OwnerId::new("a"),
        GrantId::new(1),
        LockMode::Exclusive,
        LEASE,
        got.token().expect("a free lock is granted"),
    );
    Some((a, other, name, renewal, placed))
}

/// Holder A renews a 1 s lease every 250 ms, past the bucket's `max_age`, while B
/// keeps trying: B is never granted while A's last renewal still guarantees A the
/// lock, and A's renewals stop (not owner) within `max_age` / 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_is_lost_before_the_bucket_drops_its_key() {
    let Some((a, b, name, renewal, placed)) = placed().await else {
        return;
    };
    // What A is guaranteed: until its last renewal's send time plus the lease.
    let mut a_until = placed + LEASE;
    let mut a_lost_at = None;
    let bound = placed + MAX_AGE * 2;
    while Instant::now() < bound {
        if a_lost_at.is_none() {
            let sent = Instant::now();
            match a.renew(&renewal).await.unwrap() {
                RenewResult::Renewed { .. } => a_until = sent + LEASE,
                RenewResult::NotOwner => a_lost_at = Some(Instant::now()),
            }
        }
        let b_got = b.try_acquire(&request(&name, "b")).await.unwrap();
        if b_got.is_acquired() {
            let at = Instant::now();
            assert!(
                at >= a_until,
                "B was granted {:?} after A was placed, while A's renewal guaranteed it {:?} more",
                at - placed,
                a_until - at
            );
            let lost = a_lost_at.expect("A's renewals went on after B was granted");
            assert!(
                lost - placed <= MAX_AGE / 2 + Duration::from_millis(500),
                "A was told it lost the lock {:?} after it was placed",
                lost - placed
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!(
        "B was not granted within {:?} (A lost at {:?})",
        MAX_AGE * 2,
        a_lost_at.map(|l| l - placed)
    );
}

/// The same limit when the renewal comes through a backend that did not place the
/// grant (judged on the server's clock from the key's write): renewed early on,
/// not owner once the renewal would carry the hold past half of `max_age` — through
/// a backend asked for the first time then (D), and through one that judged the
/// key's age on an early renewal and keeps it (C).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_backend_renewing_keeps_the_limit() {
    let Some((_a, c, _name, renewal, placed)) = placed().await else {
        return;
    };
    let d = NatsBackend::connect(&url()).await.unwrap();
    // C's first renewal late enough that the key's age it keeps matters (taken
    // as zero there, C would renew again at the end).
    tokio::time::sleep_until((placed + Duration::from_millis(600)).into()).await;
    assert!(
        matches!(
            c.renew(&renewal).await.unwrap(),
            RenewResult::Renewed { .. }
        ),
        "renewed {:?} after it was placed",
        placed.elapsed()
    );
    // Past max_age / 2 − lease from the write (1 s), with room for the clocks.
    tokio::time::sleep_until((placed + MAX_AGE / 2 - LEASE + Duration::from_millis(300)).into())
        .await;
    for (backend, which) in [(&d, "D"), (&c, "C")] {
        assert!(
            matches!(
                backend.renew(&renewal).await.unwrap(),
                RenewResult::NotOwner
            ),
            "a renewal through {which} {:?} after the write would carry the hold past {:?}",
            placed.elapsed(),
            MAX_AGE / 2
        );
    }
}

/// A random value without a dependency of its own.
fn fastrand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(1);
    h.finish()
}
