//! Release notices: sent only while someone waits, one subscription per client.

use std::time::Duration;

use dlock_redis::RedisOptions;
use testsuite::conformance::{eventually, take};

use super::fixtures::*;

/// Releases publish a notice only while someone waits: uncontended cycles send none,
/// and a parked waiter is named by the release, on its own backend's channel, and
/// woken at once (not by its re-check, 3 s away with a 9 s liveness), also after a
/// writer's mark (1 s) lapsed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_notices_go_out_only_while_someone_waits() {
    let Some(url) = redis_url() else { return };
    let lock = name("notices");
    let mut publisher = raw_connection(&url).await;
    let mut heard = notice_listener(&url, &lock).await;
    let (_, m) = dlock_client(&url, RedisOptions::default()).await;
    for wait in [Duration::ZERO, Duration::from_secs(1)] {
        for _ in 0..10 {
            let g = take(&m.lock(&lock), wait).await;
            g.unlock().await.unwrap();
        }
    }
    assert_eq!(
        until_probe(&mut publisher, &mut heard, "probe-1").await,
        Vec::new(),
        "uncontended releases published notices"
    );

    let liveness = RedisOptions::default().waiter_liveness(Duration::from_secs(9));
    let (waiter_side, m2) = dlock_client(&url, liveness).await;
    let holder = take(&m.lock(&lock), Duration::ZERO).await;
    let waiter = m2.lock(&lock);
    let owner = waiter.owner().as_str().to_owned();
    // The scenario: the holder keeps the lock 2 s after the waiter parked.
    let woke = wake_after_release(holder, waiter, &waiter_side, Duration::from_secs(2)).await;
    assert!(
        woke < Duration::from_secs(1),
        "the parked waiter was not woken by a notice ({woke:?})"
    );
    assert_eq!(
        until_probe(&mut publisher, &mut heard, "probe-2").await,
        vec![handover_for(&waiter_side, &lock, &owner)],
        "the release should hand the lock to the parked waiter, once, on its backend's channel"
    );
    m.close().await;
    m2.close().await;
}

/// A client subscribes once, to its own channel, whatever it waits for: waiting on
/// three locks at once adds no subscription, and no lock has a channel of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_subscription_per_client_whatever_it_waits_for() {
    let Some(url) = redis_url() else { return };
    let tag = name("subs");
    let mut raw = raw_connection(&url).await;
    let (_, holder_side) = dlock_client(&url, RedisOptions::default()).await;
    let (waiter_side, m) = dlock_client(&url, RedisOptions::default()).await;
    let mut held = Vec::new();
    let mut waiting = Vec::new();
    for i in 0..3 {
        let lock = format!("{tag}:{i}");
        held.push(take(&holder_side.lock(&lock), Duration::ZERO).await);
        waiting.push(take_in_background(m.lock(&lock)));
    }
    assert!(
        eventually(Duration::from_secs(5), || async {
            waiter_side.acquire_attempts() == 3
        })
        .await,
        "the three waiters did not park"
    );
    let (_, subscribers): (String, i64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(waiter_side.notice_channel())
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(subscribers, 1, "the client's channel");
    let per_lock: Vec<String> = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg(format!("*{tag}*"))
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(per_lock, Vec::<String>::new(), "channels per lock");
    for (guard, task) in held.into_iter().zip(waiting) {
        let got = handed_over(guard, task).await;
        assert!(got < Duration::from_secs(1), "a waiter took {got:?}");
    }
    holder_side.close().await;
    m.close().await;
}
