//! Renewal batches: each hold renewed as a single renewal would, many holds in few calls.

use std::time::Duration;

use dlock_api::spi::{AcquireRequest, LockName, LockRemoteResource, OwnerId};
use dlock_api::{DistributeLockManager, LockMode};
use dlock_redis::RedisBackend;
use testsuite::conformance::eventually;

use super::fixtures::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_renews_each_hold_as_a_single_renewal_would() {
    use dlock_api::spi::{GrantId, RenewRequest, RenewResult};
    let Some(url) = redis_url() else { return };
    let backend = RedisBackend::connect(&url).await.unwrap();
    let mut raw = raw_connection(&url).await;
    let batch = backend
        .batch_renew()
        .expect("a single node renews in batches");
    let short = Duration::from_secs(2);
    let take_as = |lock: &LockName, owner: &str, mode: LockMode| {
        let req = AcquireRequest::new(lock.clone(), OwnerId::new(owner), GrantId::new(1))
            .with_lease(short)
            .with_mode(mode);
        let backend = backend.clone();
        async move {
            backend
                .try_acquire(&req)
                .await
                .unwrap()
                .token()
                .expect("granted")
        }
    };
    let locks: Vec<LockName> = (0..4)
        .map(|i| LockName::new(name(&format!("batch{i}"))).unwrap())
        .collect();
    // 0 and 1: held by "a"; 2: held by "b"; 3: read by "a" (renewed on its own).
    let mut tokens = Vec::new();
    for (lock, owner, mode) in [
        (&locks[0], "a", LockMode::Exclusive),
        (&locks[1], "a", LockMode::Exclusive),
        (&locks[2], "b", LockMode::Exclusive),
        (&locks[3], "a", LockMode::Shared),
    ] {
        tokens.push(take_as(lock, owner, mode).await);
    }
    let long = Duration::from_secs(60);
    let renew = |i: usize, owner: &str, mode: LockMode| {
        RenewRequest::new(
            locks[i].clone(),
            OwnerId::new(owner),
            GrantId::new(1),
            mode,
            long,
            tokens[i],
        )
    };
    let reqs = [
        renew(0, "a", LockMode::Exclusive),
        renew(2, "a", LockMode::Exclusive), // not a's: untouched
        renew(3, "a", LockMode::Shared),
        renew(1, "a", LockMode::Exclusive),
        renew(1, "b", LockMode::Exclusive), // not b's
    ];
    let calls = backend.renewal_calls();
    let answers: Vec<RenewResult> = batch
        .renew_batch(&reqs)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let renewed = |r: &RenewResult| matches!(r, RenewResult::Renewed { .. });
    let shape: Vec<bool> = answers.iter().map(renewed).collect();
    assert_eq!(shape, [true, false, true, true, false], "{answers:?}");
    // The exclusive ones went as one call; the reader's on its own.
    assert_eq!(backend.renewal_calls() - calls, 2);
    let key = |lock: &LockName, suffix: &str| format!("dlock:{{{}}}{suffix}", lock.as_str());
    for i in [0, 1] {
        let left = pttl(&mut raw, &key(&locks[i], ":x")).await;
        assert!(
            left > 50_000,
            "lock {i} has {left} ms left, not the renewed lease"
        );
    }
    let other = pttl(&mut raw, &key(&locks[2], ":x")).await;
    assert!(
        (1..=2_000).contains(&other),
        "b's lock was changed by a's renewal: {other} ms left"
    );
    let reader: f64 = redis::cmd("ZSCORE")
        .arg(key(&locks[3], ":r"))
        .arg(reqs[2].holder().as_str())
        .query_async(&mut raw)
        .await
        .unwrap();
    let now_ms: (u64, u64) = redis::cmd("TIME").query_async(&mut raw).await.unwrap();
    let now_ms = now_ms.0 * 1000 + now_ms.1 / 1000;
    assert!(
        reader > (now_ms + 50_000) as f64,
        "the reader's lease was not renewed: ends {reader}, now {now_ms}"
    );
    assert!(batch.renew_batch(&[]).await.is_empty());

    // A writer beside its owner's own reader: the write key lasts at least as long
    // as the reader, whatever lease the writer's renewal asks for.
    let both = LockName::new(name("batch-both")).unwrap();
    let write = take_as(&both, "a", LockMode::Exclusive).await;
    let read = AcquireRequest::new(both.clone(), OwnerId::new("a"), GrantId::new(2))
        .with_lease(long)
        .with_mode(LockMode::Shared)
        .with_alongside(Some(GrantId::new(1)));
    assert!(backend.try_acquire(&read).await.unwrap().is_acquired());
    let writer = |lease: Duration| {
        RenewRequest::new(
            both.clone(),
            OwnerId::new("a"),
            GrantId::new(1),
            LockMode::Exclusive,
            lease,
            write,
        )
    };
    // A shorter lease than the reader's: the key still lasts as long as the reader.
    // A longer one: the key lasts as long as the writer's renewed lease.
    for (lease, at_least) in [(short, 50_000), (Duration::from_secs(120), 100_000)] {
        let answers: Vec<RenewResult> = batch
            .renew_batch(&[writer(lease), reqs[0].clone()])
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert!(answers.iter().all(renewed), "{answers:?}");
        let left = pttl(&mut raw, &key(&both, ":x")).await;
        assert!(
            left > at_least,
            "renewed for {lease:?} beside a 60 s reader, the writer's key ends in {left} ms"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_renews_many_holds_in_few_calls() {
    let Some(url) = redis_url() else { return };
    let backend = RedisBackend::connect(&url).await.unwrap();
    let count = std::sync::Arc::new(RenewalCount::default());
    let lease = Duration::from_millis(600);
    let m = DistributeLockManager::builder(backend.clone())
        .lease(lease)
        .with_shared_handler(count.clone())
        .build()
        .unwrap();
    const HOLDS: usize = 40;
    let tag = name("many");
    let mut guards = Vec::new();
    for i in 0..HOLDS {
        guards.push(m.lock(format!("{tag}-{i}")).lock().await.unwrap());
        // Taken over ~80 ms: their renewals are not due at the same instant.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let calls = backend.renewal_calls();
    // Every hold renews every 200 ms: by the time each has renewed 5 times over,
    // one call per hold and renewal would be 200 calls.
    let renewals = || count.0.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        eventually(Duration::from_secs(3), || async { renewals() >= 5 * HOLDS }).await,
        "{HOLDS} holds renewing every 200 ms made {} renewals in 3 s",
        renewals()
    );
    let sent = backend.renewal_calls() - calls;
    let renewed = renewals() as u64;
    assert!(
        sent * 4 <= renewed,
        "{renewed} renewals took {sent} calls; in batches they take a few per round"
    );
    eprintln!("{renewed} renewals of {HOLDS} holds in {sent} calls");
    for g in &guards {
        g.check().unwrap();
        assert!(
            holder_of(&m, g.name().as_str()).await.is_some(),
            "{} is no longer held",
            g.name()
        );
    }
    for g in guards {
        g.unlock().await.unwrap();
    }
    m.close().await;
}

/// On Redis Cluster a batch renews every hold wherever its slot lives — each lease
/// extended, each answered renewed — in one script call per master once the batches
/// have learnt which slots share a master: the first batch probes two masters and
/// renews the third master's holds one by one; from the second on, one call per
/// master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_batch_goes_one_call_per_node() {
    use dlock_api::spi::{GrantId, RenewRequest, RenewResult};
    if !testsuite::runner::selected()
        .iter()
        .any(|l| l == "redis-cluster")
    {
        eprintln!("redis-cluster is not selected in DLOCK_TEST_BACKENDS; nothing to check here");
        return;
    }
    let url = testsuite::backends::server_url("redis-cluster").unwrap();
    let backend = RedisBackend::connect(&url).await.unwrap();
    let batch = backend.batch_renew().expect("a Cluster renews in batches");
    let cluster = redis::cluster::ClusterClient::new(
        url.trim_start_matches("redis+cluster://")
            .split(',')
            .map(|h| format!("redis://{h}"))
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let mut raw = cluster.get_async_connection().await.unwrap();
    // Names spread over the Cluster's slots: every one of its three masters holds some.
    let locks: Vec<LockName> = (0..30)
        .map(|i| LockName::new(name(&format!("cluster-batch-{i}"))).unwrap())
        .collect();
    let mut tokens = Vec::new();
    for lock in &locks {
        let req = AcquireRequest::new(lock.clone(), OwnerId::new("a"), GrantId::new(1))
            .with_lease(Duration::from_secs(2));
        let granted = backend.try_acquire(&req).await.unwrap();
        tokens.push(granted.token().expect("granted"));
    }
    let mut calls = Vec::new();
    for round in 1..=3u64 {
        // Each batch asks for a longer lease than the last: only a renewal gives it.
        let lease = Duration::from_secs(60 * round);
        let reqs: Vec<RenewRequest> = locks
            .iter()
            .zip(&tokens)
            .map(|(lock, token)| {
                let owner = OwnerId::new("a");
                let mode = LockMode::Exclusive;
                RenewRequest::new(lock.clone(), owner, GrantId::new(1), mode, lease, *token)
            })
            .collect();
        let before = backend.renewal_calls();
        let answers = batch.renew_batch(&reqs).await;
        calls.push(backend.renewal_calls() - before);
        for (lock, answer) in locks.iter().zip(answers) {
            assert!(
                matches!(answer, Ok(RenewResult::Renewed { .. })),
                "batch {round}, {lock}: {answer:?}"
            );
            let key = format!("dlock:{{{}}}:x", lock.as_str());
            let left: i64 = redis::cmd("PTTL")
                .arg(&key)
                .query_async(&mut raw)
                .await
                .unwrap();
            let least = i64::try_from(lease.as_millis()).unwrap() - 10_000;
            assert!(left > least, "batch {round}: {key} has {left} ms left");
        }
    }
    assert!(
        calls[0] > 3,
        "the first batch renewed no hold alone: {calls:?}"
    );
    // Two probes, then the third master's holds alone; then one call per master.
    assert_eq!(
        calls[1..],
        [3, 3],
        "one call per master once learnt: {calls:?}"
    );
    for (lock, token) in locks.iter().zip(tokens) {
        let release = dlock_api::spi::ReleaseRequest::new(
            lock.clone(),
            OwnerId::new("a"),
            GrantId::new(1),
            LockMode::Exclusive,
            token,
        );
        backend.release(&release).await.unwrap();
    }
}
