//! Through outages and slow or silent servers, over TLS, and replica acknowledgement.

use std::time::{Duration, Instant};

use dlock_api::{DistributeLockManager, ErrorKind};
use dlock_redis::{RedisBackend, RedisOptions};
use testsuite::backends::server_url;
use testsuite::conformance::{eventually, take};
use testsuite::proxy::{Fault, FaultProxy};
use testsuite::runner::selected;

use super::fixtures::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_acknowledgement_is_required_when_asked_for() {
    let Some(url) = redis_url() else { return };
    // scripts/test runs one replica of the test server.
    let one = RedisBackend::connect_with(
        &url,
        RedisOptions::default().replica_ack(1, Duration::from_secs(2)),
    )
    .await
    .unwrap();
    let m = DistributeLockManager::builder(one).build().unwrap();
    let lock = name("wait-ok");
    let g = m
        .lock(&lock)
        .try_lock(Duration::ZERO)
        .await
        .unwrap()
        .expect("one replica acknowledged");
    g.unlock().await.unwrap();

    let two = RedisBackend::connect_with(
        &url,
        RedisOptions::default().replica_ack(2, Duration::from_millis(200)),
    )
    .await
    .unwrap();
    let m2 = DistributeLockManager::builder(two).build().unwrap();
    let lock = name("wait-short");
    let err = m2.lock(&lock).try_lock(Duration::ZERO).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    assert!(err.to_string().contains("of 2 replicas"), "{err}");
    assert!(
        m2.inspect(&lock).await.unwrap().is_none(),
        "the under-replicated lock was not released"
    );
    m.close().await;
    m2.close().await;
}

/// Redis goes away and comes back: calls fail with typed retryable errors, the
/// watchdog declares the lock lost when its lease ends, and afterwards both commands
/// and release notices work again (the notice connection reconnects and re-subscribes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_is_typed_loses_on_time_and_notices_resume() {
    let Some(_url) = redis_url() else { return };
    let (proxy, backend) = proxied_backend().await;
    let lease = Duration::from_millis(900);
    let m = DistributeLockManager::builder(backend.clone())
        .lease(lease)
        .operation_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    testsuite::faults::outage_is_typed_loses_on_time_and_recovers("redis", &m, &proxy, lease).await;
    let lock = name("outage");
    assert!(
        eventually(Duration::from_secs(10), || async {
            backend.notices_connected()
        })
        .await,
        "the release-notice connection did not come back"
    );

    // A waiter on this (reconnected) backend is subscribed, so it does not poll: only
    // a release notice can wake it this soon (its re-check is 1 s away — a third of
    // the default 3 s liveness — and the holder's lease 30 s).
    let (_, direct) = dlock_client("redis://127.0.0.1:6379", RedisOptions::default()).await;
    let holder = take(&direct.lock(&lock), Duration::ZERO).await;
    let woke = wake_after_release(holder, m.lock(&lock), &backend, Duration::ZERO).await;
    assert!(
        woke < Duration::from_millis(500),
        "the waiter was not woken by the notice ({woke:?})"
    );
    m.close().await;
    direct.close().await;
}

/// TLS (`rediss://`, the suite's TLS-only server on 127.0.0.1:6390, and
/// `rediss+cluster://`, its TLS-only Cluster on 127.0.0.1:7100-7102; both require a
/// client certificate, and the conformance suite runs over them as `redis-tls` and
/// `redis-cluster-tls`): a server certificate from an unknown CA, or a missing client
/// certificate, is refused with a typed error that says so, not a hang or a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_refuses_unknown_servers_and_missing_client_certificates() {
    let mut checked = 0;
    for (label, plain) in [
        ("redis-tls", "redis://127.0.0.1:6390"),
        (
            "redis-cluster-tls",
            "redis+cluster://127.0.0.1:7100,127.0.0.1:7101",
        ),
    ] {
        if selected().iter().any(|l| l == label) {
            tls_refusals(&server_url(label).unwrap(), plain).await;
            checked += 1;
        }
    }
    if checked == 0 {
        eprintln!("no TLS label is selected in DLOCK_TEST_BACKENDS; nothing to check here");
    }
}

/// Connecting to a server that refuses, or to one that never answers (the fault
/// proxy's black hole), fails within the connect timeout with a typed, retryable
/// error naming the address — not after the redis crate's minutes of back-off.
/// The loss margin on a real server: the holder's connection is black-holed, and its
/// lost signal leads another client's grant by at least the margin — the default
/// (1 % of the lease, or the renewal round trip) and a configured 150 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_holder_hears_of_its_loss_a_margin_before_the_next_grant() {
    let Some(url) = redis_url() else { return };
    let lease = Duration::from_secs(2);
    let (_, rival) = dlock_client(&url, RedisOptions::default()).await;
    for margin in [None, Some(Duration::from_millis(150))] {
        let (proxy, backend) = proxied_backend().await;
        let mut builder = DistributeLockManager::builder(backend).lease(lease);
        if let Some(margin) = margin {
            builder = builder.loss_margin(margin);
        }
        let holder = builder.build().unwrap();
        let lead = testsuite::faults::black_holed_loss_leads_the_next_grant(
            "redis", &holder, &rival, &proxy, lease, margin,
        )
        .await;
        println!("redis: margin {margin:?}: lost signal led the next grant by {lead:?}");
    }
    rival.close().await;
}

/// A slow reply is awaited, not timed out by the client: the redis crate gives up
/// on a reply after 500 ms by default, when the script may have run (a grant the
/// caller never hears of, a release reported as failed). Every reply here comes
/// 700 ms late; the lock and its release both succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reply_is_awaited_not_timed_out() {
    let Some(_url) = redis_url() else { return };
    let (proxy, backend) = proxied_backend().await;
    let m = DistributeLockManager::builder(backend).build().unwrap();
    let lock = m.lock(name("slow-reply"));
    proxy.set(Fault::Delay(Duration::from_millis(700)));
    let started = Instant::now();
    let g = take(&lock, Duration::ZERO).await;
    assert!(
        started.elapsed() >= Duration::from_millis(700),
        "the reply was not delayed ({:?}): the test checks nothing",
        started.elapsed()
    );
    g.unlock().await.unwrap();
    proxy.set(Fault::Pass);
    m.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_to_a_dead_or_silent_server_fails_fast() {
    let Some(_url) = redis_url() else { return };
    let proxy = FaultProxy::start("127.0.0.1:6379".parse().unwrap())
        .await
        .unwrap();
    let limit = Duration::from_millis(800);
    for (fault, url) in [
        (Fault::Reset, format!("redis://u:secret@{}", proxy.addr())),
        (
            Fault::Blackhole,
            format!("redis://u:secret@{}", proxy.addr()),
        ),
    ] {
        proxy.set(fault);
        let started = Instant::now();
        let err = RedisBackend::connect_with(&url, RedisOptions::default().connect_timeout(limit))
            .await
            .map(drop)
            .unwrap_err();
        let took = started.elapsed();
        assert!(
            took < limit + Duration::from_secs(1),
            "{fault:?}: took {took:?}"
        );
        assert_eq!(err.kind(), ErrorKind::Backend, "{fault:?}: {err}");
        assert!(err.is_retryable(), "{fault:?}: {err}");
        assert!(
            err.message().contains(&proxy.addr().to_string()) && !err.message().contains("secret"),
            "{fault:?}: {err}"
        );
    }
}
