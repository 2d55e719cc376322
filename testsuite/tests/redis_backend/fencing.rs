//! Fencing tokens: across a deleted or lagging counter, one ahead of the clock, the holder asking again.

use std::time::{Duration, Instant};

use dlock_api::spi::{
    AcquireRequest, LockName, LockRemoteResource, OwnerId, ReleaseRequest, ReleaseResult,
};
use dlock_api::LockMode;
use dlock_redis::{RedisBackend, RedisOptions};
use testsuite::conformance::take;

use super::fixtures::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_survive_the_counter_being_deleted() {
    let Some(url) = redis_url() else { return };
    let (_, m) = dlock_client(&url, RedisOptions::default()).await;
    let mut c = raw_connection(&url).await;
    let lock = name("fence-del");
    let mut last = 0;
    for round in 0..4 {
        let g = take(&m.lock(&lock), Duration::ZERO).await;
        let token = g.fencing_token().get();
        assert!(token > last, "token {token} after {last} in round {round}");
        last = token;
        g.unlock().await.unwrap();
        // Someone deletes every key of the lock, the counter included.
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("dlock:{{{lock}}}*"))
            .query_async(&mut c)
            .await
            .unwrap();
        assert!(
            !keys.is_empty(),
            "the last token should be kept after a release"
        );
        let _: i64 = redis::cmd("DEL")
            .arg(&keys)
            .query_async(&mut c)
            .await
            .unwrap();
    }
    m.close().await;
}

/// Item 9: after a failover, the promoted replica's fencing counter may lag (it
/// missed the last grants). Every way a grant is made — the lean exclusive script,
/// the fair one, a reader — still issues a token above every earlier one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_survive_a_lagging_counter() {
    let Some(url) = redis_url() else { return };
    let (_, m) = dlock_client(&url, RedisOptions::default()).await;
    let mut c = raw_connection(&url).await;
    let lock = name("fence-lag");
    let fence = format!("dlock:{{{lock}}}:f");
    let mut last = 0;
    let ways = [
        m.lock(&lock),
        m.fair_lock(&lock),
        m.read_write_lock(&lock).read().clone(),
    ];
    for round in 0..6 {
        let g = take(&ways[round % ways.len()], Duration::ZERO).await;
        let token = g.fencing_token().get();
        assert!(
            token > last,
            "round {round} ({:?} {:?}): token {token} after {last}",
            g.mode(),
            ways[round % ways.len()].fairness()
        );
        last = token;
        g.unlock().await.unwrap();
        // The counter as a replica that missed the last 1000 grants would have it.
        let _: () = redis::cmd("SET")
            .arg(&fence)
            .arg(token - 1000)
            .query_async(&mut c)
            .await
            .unwrap();
    }
    m.close().await;
}

/// The counter ahead of the server's clock (a promoted replica whose clock is behind
/// the old master's, or many grants in one µs): every way a grant is made issues
/// exactly one past the counter, never the clock (the lean script sets the counter
/// to the clock first, then puts it right).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_stay_above_a_counter_ahead_of_the_clock() {
    let Some(url) = redis_url() else { return };
    let (_, m) = dlock_client(&url, RedisOptions::default()).await;
    let mut c = raw_connection(&url).await;
    let lock = name("fence-ahead");
    let fence = format!("dlock:{{{lock}}}:f");
    let ways = [
        m.lock(&lock),
        m.fair_lock(&lock),
        m.read_write_lock(&lock).read().clone(),
    ];
    for round in 0..6 {
        // A day of µs ahead of the clock.
        let ahead = counter_a_day_ahead(&mut c, &fence).await;
        let g = take(&ways[round % ways.len()], Duration::ZERO).await;
        assert_eq!(
            g.fencing_token().get(),
            ahead + 1,
            "round {round} ({:?} {:?}): not one past the counter",
            g.mode(),
            ways[round % ways.len()].fairness()
        );
        let counter = counter_at(&mut c, &fence).await;
        assert_eq!(
            counter,
            ahead + 1,
            "round {round}: the counter was not put right"
        );
        g.unlock().await.unwrap();
    }
    // A semaphore's permits, on the idle semaphore and beside a holder (both of the
    // permits' fast paths).
    let sem_name = name("fence-ahead-sem");
    let sem_fence = format!("dlock:{{{sem_name}}}:f");
    let sem = m.semaphore(&sem_name, 2);
    let mut kept = Vec::new();
    for round in 0..2 {
        let ahead = counter_a_day_ahead(&mut c, &sem_fence).await;
        let p = sem
            .try_acquire(1, Duration::ZERO)
            .await
            .unwrap()
            .expect("a permit");
        assert_eq!(
            p.fencing_token().get(),
            ahead + 1,
            "permit {round}: not one past the counter"
        );
        let counter = counter_at(&mut c, &sem_fence).await;
        assert_eq!(
            counter,
            ahead + 1,
            "permit {round}: the counter was not put right"
        );
        kept.push(p);
    }
    for p in kept {
        p.release().await.unwrap();
    }
    m.close().await;
}

/// An owner that asks again (a retry whose first reply was lost) gets the lock it
/// holds with the same token, whether or not it would wait, and the lease renewed;
/// another owner — even one whose name the first owner's starts with — is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holder_asking_again_gets_the_same_token() {
    let Some(url) = redis_url() else { return };
    let backend = RedisBackend::connect(&url).await.unwrap();
    let lock = LockName::new(name("again")).unwrap();
    let ask = |owner: &str, wait: bool| {
        AcquireRequest::new(
            lock.clone(),
            OwnerId::new(owner),
            dlock_api::spi::GrantId::new(1),
        )
        .with_lease(Duration::from_secs(5))
        .with_context(dlock_api::spi::Bytes::from_static(b"ctx|1"))
        .with_deadline(wait.then(|| Instant::now() + Duration::from_millis(200)))
    };
    let first = backend.try_acquire(&ask("owner-12", false)).await.unwrap();
    let token = first.token().expect("granted");
    for wait in [false, true] {
        let again = backend.try_acquire(&ask("owner-12", wait)).await.unwrap();
        assert_eq!(again.token(), Some(token), "wait {wait}: {again:?}");
    }
    for other in ["owner-1", "owner-13", "owner-123", "owner-12x"] {
        let refused = backend.try_acquire(&ask(other, false)).await.unwrap();
        assert!(!refused.is_acquired(), "{other} got the lock: {refused:?}");
    }
    let release = ReleaseRequest::new(
        lock.clone(),
        OwnerId::new("owner-12"),
        dlock_api::spi::GrantId::new(1),
        LockMode::Exclusive,
        token,
    );
    assert_eq!(
        backend.release(&release).await.unwrap(),
        ReleaseResult::Released
    );
    let next = backend.try_acquire(&ask("owner-1", false)).await.unwrap();
    assert!(next.token().is_some_and(|t| t > token), "{next:?}");
}
