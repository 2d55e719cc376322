//! The waiters' queue: dead waiters skipped, who is woken and in what order, liveness rewritten only when due, writers holding back readers.

use std::time::{Duration, Instant};

use dlock_api::spi::{LockName, LockRemoteResource};
use dlock_redis::RedisOptions;
use testsuite::conformance::{eventually, take};

use super::fixtures::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_fair_waiter_is_skipped_once_its_liveness_lapses() {
    let Some(url) = redis_url() else { return };
    let lock = name("ghost");
    // A waiter that queued and then died: queued first, liveness ends in 400 ms.
    let mut c = raw_connection(&url).await;
    let base = format!("dlock:{{{lock}}}");
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut c).await.unwrap();
    let now_ms = secs * 1000 + micros / 1000;
    redis::pipe()
        .cmd("ZADD")
        .arg(format!("{base}:q"))
        .arg(secs * 1_000_000 + micros)
        .arg("ghost")
        .cmd("ZADD")
        .arg(format!("{base}:ql"))
        .arg(now_ms + 400)
        .arg("ghost")
        .cmd("HSET")
        .arg(format!("{base}:qm"))
        .arg("ghost")
        .arg("x")
        .query_async::<()>(&mut c)
        .await
        .unwrap();
    let (_, m) = dlock_client(&url, RedisOptions::default()).await;
    let start = Instant::now();
    let g = m
        .fair_lock(&lock)
        .try_lock(Duration::from_secs(5))
        .await
        .unwrap()
        .expect("granted after the ghost lapsed");
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(300),
        "jumped the queue after {waited:?}"
    );
    assert!(
        waited < Duration::from_millis(2500),
        "the dead waiter blocked the queue for {waited:?}"
    );
    g.unlock().await.unwrap();
    assert!(
        m.inspect(&lock).await.unwrap().is_none(),
        "queue state left behind"
    );
    m.close().await;
}

/// Non-fair waiters in separate processes queue on the server: each release hands
/// the lock to one waiter, the longest waiting, with one message on that waiter's own
/// channel (not one per waiting client), so they get the lock in arrival order, no
/// waiter makes an attempt it was not woken for (no herd), and none makes one after
/// it was told (the message carries the grant: one attempt each, the one that
/// queued).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_fair_waiters_are_woken_one_at_a_time_in_arrival_order() {
    let Some(url) = redis_url() else { return };
    let lock = name("herd");
    let mut publisher = raw_connection(&url).await;
    let mut heard = notice_listener(&url, &lock).await;
    // Re-checks 10 s away: within this test only notices wake anyone.
    let options = RedisOptions::default().waiter_liveness(Duration::from_secs(30));
    let mut sides = Vec::new();
    let mut managers = Vec::new();
    for _ in 0..4 {
        let (backend, m) = dlock_client(&url, options.clone()).await;
        sides.push(backend);
        managers.push(m);
    }
    let holder = take(&managers[0].lock(&lock), Duration::ZERO).await;
    let (order_tx, mut order) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    let mut expected = Vec::new();
    for i in 1..4 {
        let waiter = managers[i].lock(&lock);
        expected.push(handover_for(&sides[i], &lock, waiter.owner().as_str()));
        let tx = order_tx.clone();
        tasks.push(tokio::spawn(async move {
            let g = take(&waiter, Duration::from_secs(20)).await;
            tx.send(i).unwrap();
            g.unlock().await.unwrap();
        }));
        // Parked (queued) before the next one arrives.
        assert!(
            eventually(Duration::from_secs(5), || async {
                sides[i].acquire_attempts() == 1
            })
            .await
        );
    }
    holder.unlock().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    let mut got = Vec::new();
    while let Ok(i) = order.try_recv() {
        got.push(i);
    }
    assert_eq!(got, vec![1, 2, 3], "not served in arrival order");
    let attempts: Vec<u64> = sides[1..].iter().map(|b| b.acquire_attempts()).collect();
    assert_eq!(
        attempts,
        vec![1, 1, 1],
        "a waiter attempted again (one attempt each, which queued; the release handed the lock over)"
    );
    assert_eq!(
        until_probe(&mut publisher, &mut heard, "probe").await,
        expected,
        "each release should send one message, to the next waiter's client only"
    );
    for m in managers {
        m.close().await;
    }
}

/// A queued waiter woken while the lock is still taken re-checks without rewriting
/// its queue entry when it refreshed it less than a third of its liveness ago (a hot
/// lock's head is woken on every release), and still refreshes it in time to stay
/// live; it gets the lock once the holder leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_woken_waiter_rewrites_its_queue_entry_only_when_due() {
    let Some(url) = redis_url() else { return };
    let lock = name("refresh");
    let alive_key = format!("dlock:{{{lock}}}:ql");
    let mut raw = raw_connection(&url).await;
    let (_, holder_side) = dlock_client(&url, RedisOptions::default()).await;
    let liveness = Duration::from_millis(1500);
    let options = RedisOptions::default().waiter_liveness(liveness);
    let (waiter_side, m) = dlock_client(&url, options).await;
    let holder = take(&holder_side.lock(&lock), Duration::ZERO).await;
    let task = take_in_background(m.lock(&lock));

    // The waiter's owner and liveness deadline (server ms), once it is queued.
    let probe = raw.clone();
    let queued = || queue_head(probe.clone(), &alive_key);
    assert!(
        eventually(Duration::from_secs(5), || async {
            queued().await.is_some()
        })
        .await
    );
    let (owner, deadline) = queued().await.unwrap();
    assert_eq!(waiter_side.acquire_attempts(), 1);
    // A notice naming the waiter, as a release would send: it re-checks at once.
    let (channel, notice) = notice_for(&waiter_side, &lock, &owner);
    let _: i64 = redis::cmd("PUBLISH")
        .arg(channel)
        .arg(notice)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(
        eventually(Duration::from_secs(2), || async {
            waiter_side.acquire_attempts() == 2
        })
        .await,
        "the named waiter did not re-check"
    );
    // The re-check was sent on the waiter's connection; a call sent after it on the
    // same connection returns after the re-check's script has run.
    waiter_side
        .inspect(&LockName::new(lock.as_str()).unwrap())
        .await
        .unwrap();
    assert_eq!(waiter_side.acquire_attempts(), 2);
    let (_, after) = queued().await.unwrap();
    assert_eq!(
        after, deadline,
        "a fresh entry was rewritten by the re-check"
    );
    // Its own re-checks (every third of the liveness) keep it live.
    assert!(
        eventually(Duration::from_secs(3), || async {
            queued().await.is_some_and(|(_, d)| d > deadline)
        })
        .await,
        "the waiter's liveness was never refreshed"
    );
    holder.unlock().await.unwrap();
    task.await.unwrap();
    holder_side.close().await;
    m.close().await;
}

/// A queued fair waiter that polls (no pub/sub) with a backoff longer than its
/// liveness still re-checks often enough to stay live in the queue (it would otherwise
/// be purged as dead and lose its place), and gets the lock soon after the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_polling_fair_waiter_stays_live_whatever_its_backoff() {
    let Some(url) = redis_url() else { return };
    let lock = name("slowpoll");
    let alive_key = format!("dlock:{{{lock}}}:ql");
    let raw = raw_connection(&url).await;
    let (_, holder_side) = dlock_client(&url, RedisOptions::default()).await;
    let options = RedisOptions::default()
        .polling(dlock_api::spi::Backoff::constant(Duration::from_secs(10)))
        .waiter_liveness(Duration::from_millis(1500));
    let (_, m) = dlock_client(&url, options).await;
    let holder = take(&holder_side.fair_lock(&lock), Duration::ZERO).await;
    let task = take_in_background(m.fair_lock(&lock));
    // The waiter's liveness deadline and the server's clock, both in ms.
    let margin = || {
        let mut raw = raw.clone();
        let alive_key = alive_key.clone();
        async move {
            let entry = queue_head(raw.clone(), &alive_key).await;
            let (secs, micros): (u64, u64) =
                redis::cmd("TIME").query_async(&mut raw).await.unwrap();
            let now = (secs * 1000 + micros / 1000) as f64;
            entry.map(|(_, deadline)| deadline - now)
        }
    };
    assert!(
        eventually(Duration::from_secs(5), || async {
            margin().await.is_some()
        })
        .await
    );
    // Over almost three liveness periods the entry stays live (refreshed by re-checks).
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let left = margin().await.expect("the waiter left the queue");
        assert!(
            left > 0.0,
            "the waiter's liveness lapsed ({left} ms) while it waited"
        );
    }
    let got = handed_over(holder, task).await;
    assert!(
        got < Duration::from_secs(1),
        "the waiter took {got:?} after the release"
    );
    holder_side.close().await;
    m.close().await;
}

/// A writer queued behind a reader holds new readers back for as long as it waits,
/// also when its re-checks are far apart (a long liveness): readers stood back only
/// for a writer mark that expired after 1 s, while the writer re-checked every third
/// of its liveness.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_writer_holds_back_new_readers_however_rarely_it_rechecks() {
    let Some(url) = redis_url() else { return };
    let lock = name("rarely");
    let (_, readers) = dlock_client(&url, RedisOptions::default()).await;
    let options = RedisOptions::default().waiter_liveness(Duration::from_secs(30));
    let (_, writer_side) = dlock_client(&url, options).await;
    let first = take(readers.read_write_lock(&lock).read(), Duration::ZERO).await;
    let writer = take_in_background(writer_side.read_write_lock(&lock).write().clone());
    assert!(
        eventually(Duration::from_secs(5), || async {
            let state = readers.inspect(&lock).await.unwrap();
            state.and_then(|s| s.waiters).unwrap_or(0) == 1
        })
        .await,
        "the writer never queued"
    );
    let late_reader = readers.read_write_lock(&lock).read().clone();
    // Well past the old mark's 1 s, well inside the writer's first re-check (10 s).
    let until = Instant::now() + Duration::from_millis(2500);
    let mut tries = 0;
    while Instant::now() < until {
        tries += 1;
        let passed = late_reader.try_lock(Duration::ZERO).await.unwrap();
        assert!(
            passed.is_none(),
            "a new reader passed the queued writer (try {tries})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    first.unlock().await.unwrap();
    writer.await.unwrap();
    readers.close().await;
    writer_side.close().await;
}
