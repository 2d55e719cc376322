//! Whose rustls crypto provider a TLS connection uses. Choosing the process' default
//! provider is the application's call (rustls: "applications should call
//! `install_default` early in main"), so dlock installs none: SQL over TLS (sqlx)
//! leaves the process default alone; Redis over TLS (the redis crate uses the
//! process default and takes no other) refuses to connect while none is installed —
//! a `Config` error saying what to do, not a panic on a connection task — and uses
//! the application's once it is installed; etcd over TLS (tonic) works with none,
//! installs none, and uses the application's once it is installed. Its own binary, with one test: the
//! process default can be installed only once, and the first steps need none.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicUsize, Ordering};

use dlock_etcd::EtcdBackend;
use dlock_jdbc::JdbcBackend;
use dlock_redis::RedisBackend;
use dlock_spi::ErrorKind;
use dlock_zk::ZkBackend;
use rustls::crypto::{CryptoProvider, GetRandomFailed, SecureRandom};
use testsuite::backends::{sql_tls_url, url_of};
use testsuite::conformance::lock_once;
use testsuite::runner::selected;

/// Ring's randomness, counting its calls: a TLS handshake made with the provider
/// that holds it draws its client random from it.
#[derive(Debug)]
struct CountingRandom;

static DRAWS: AtomicUsize = AtomicUsize::new(0);
static COUNTING_RANDOM: CountingRandom = CountingRandom;

impl SecureRandom for CountingRandom {
    fn fill(&self, buf: &mut [u8]) -> Result<(), GetRandomFailed> {
        DRAWS.fetch_add(1, Ordering::SeqCst);
        rustls::crypto::ring::default_provider()
            .secure_random
            .fill(buf)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_uses_the_applications_crypto_provider_and_installs_none() {
    let chosen = selected();
    let is = |label: &str| chosen.iter().any(|l| l == label);
    let sql: Vec<&str> = ["mysql", "postgres"]
        .into_iter()
        .filter(|l| is(l))
        .collect();
    // The suite's URLs, without the provider server_url installs for TLS labels.
    let redis: Vec<(&str, String)> = ["redis-tls", "redis-cluster-tls"]
        .into_iter()
        .filter(|l| is(l))
        .map(|l| (l, url_of(l).unwrap().to_string()))
        .collect();
    let etcd = is("etcd-tls").then(|| url_of("etcd-tls").unwrap().to_string());
    let zk = is("zk-tls").then(|| url_of("zk-tls").unwrap().to_string());
    if sql.is_empty() && redis.is_empty() && etcd.is_none() && zk.is_none() {
        eprintln!("no backend with TLS is selected in DLOCK_TEST_BACKENDS; nothing to check here");
        return;
    }
    assert!(
        CryptoProvider::get_default().is_none(),
        "something installed a provider before the test began"
    );

    // SQL over TLS works with no process default, and installs none.
    for label in sql {
        let backend = JdbcBackend::connect(&sql_tls_url(label, "ca.crt").unwrap())
            .await
            .unwrap_or_else(|e| panic!("{label} over TLS (started by scripts/test): {e:#}"));
        lock_once(backend).await;
        assert!(
            CryptoProvider::get_default().is_none(),
            "{label}: connecting over TLS installed a process-wide crypto provider"
        );
    }

    // etcd over TLS works with no process default (ring's), and installs none.
    if let Some(url) = &etcd {
        let backend = EtcdBackend::connect(url)
            .await
            .unwrap_or_else(|e| panic!("etcd-tls (started by scripts/test): {e:#}"));
        lock_once(backend).await;
        assert!(
            CryptoProvider::get_default().is_none(),
            "etcd-tls: connecting over TLS installed a process-wide crypto provider"
        );
    }

    // Redis over TLS without a process default: a Config error that says what to
    // do, and still none installed.
    for (label, url) in &redis {
        let err = RedisBackend::connect(url).await.map(drop).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{label}: {err:#}");
        assert!(
            err.message().contains("install_default()"),
            "{label}: the error says how to install one: {err:#}"
        );
        assert!(
            CryptoProvider::get_default().is_none(),
            "{label}: connecting installed a process-wide crypto provider"
        );
    }

    // ZooKeeper over TLS likewise (zookeeper-client uses the process default and
    // takes no other).
    if let Some(url) = &zk {
        let err = ZkBackend::connect(url).await.map(drop).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "zk-tls: {err:#}");
        assert!(
            err.message().contains("install_default()"),
            "zk-tls: the error says how to install one: {err:#}"
        );
        assert!(
            CryptoProvider::get_default().is_none(),
            "zk-tls: connecting installed a process-wide crypto provider"
        );
    }

    // The application's provider, once installed, is the one the handshakes use.
    let provider = CryptoProvider {
        secure_random: &COUNTING_RANDOM,
        ..rustls::crypto::ring::default_provider()
    };
    provider.install_default().unwrap();
    if let Some(url) = &etcd {
        let before = DRAWS.load(Ordering::SeqCst);
        let backend = EtcdBackend::connect(url)
            .await
            .unwrap_or_else(|e| panic!("etcd-tls: {e:#}"));
        lock_once(backend).await;
        assert!(
            DRAWS.load(Ordering::SeqCst) > before,
            "etcd-tls: the TLS handshakes did not use the application's provider"
        );
    }
    if let Some(url) = &zk {
        let before = DRAWS.load(Ordering::SeqCst);
        let backend = ZkBackend::connect(url)
            .await
            .unwrap_or_else(|e| panic!("zk-tls: {e:#}"));
        lock_once(backend).await;
        assert!(
            DRAWS.load(Ordering::SeqCst) > before,
            "zk-tls: the TLS handshakes did not use the application's provider"
        );
    }
    for (label, url) in &redis {
        let before = DRAWS.load(Ordering::SeqCst);
        let backend = RedisBackend::connect(url)
            .await
            .unwrap_or_else(|e| panic!("{label}: {e:#}"));
        lock_once(backend).await;
        assert!(
            DRAWS.load(Ordering::SeqCst) > before,
            "{label}: the TLS handshakes did not use the application's provider"
        );
    }
}
