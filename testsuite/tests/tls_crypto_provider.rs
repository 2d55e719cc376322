//! Whose rustls crypto provider a TLS connection uses. Choosing the process' default
//! provider is the application's call (rustls: "applications should call
//! `install_default` early in main"), so dlock installs none: SQL over TLS (sqlx)
//! leaves the process default alone; Redis over TLS (the redis crate uses the
//! process default and takes no other) refuses to connect while none is installed —
//! a `Config` error saying what to do, not a panic on a connection task — and uses
//! the application's once it is installed. Its own binary, with one test: the
//! process default can be installed only once, and the first steps need none.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dlock_api::DistributeLockManager;
use dlock_jdbc::JdbcBackend;
use dlock_redis::RedisBackend;
use dlock_spi::{ErrorKind, LockRemoteResource};
use rustls::crypto::{CryptoProvider, GetRandomFailed, SecureRandom};
use testsuite::backends::redis_tls_params;
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

/// One lock taken and released on `backend`.
async fn lock_once(backend: impl LockRemoteResource, what: &str) {
    let m = DistributeLockManager::builder(backend).build().unwrap();
    let name = format!("provider-{:x}", fastrand::u64(..));
    let g = m.lock(&name).try_lock(Duration::ZERO).await.unwrap();
    g.unwrap_or_else(|| panic!("{what}: not granted"))
        .unlock()
        .await
        .unwrap();
    m.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_uses_the_applications_crypto_provider_and_installs_none() {
    let chosen = selected();
    let is = |label: &str| chosen.iter().any(|l| l == label);
    let tmp = std::env::var("TMPDIR").unwrap_or_else(|_| "/tmp".to_owned());
    let sql = [
        (
            "mysql",
            "DLOCK_MYSQL_TLS_DIR",
            "dlock-mysql-tls",
            "mysql://root@127.0.0.1:3307/test?ssl-mode=VERIFY_IDENTITY&ssl-ca=",
        ),
        (
            "postgres",
            "DLOCK_POSTGRES_TLS_DIR",
            "dlock-pg-tls",
            "postgres://postgres@127.0.0.1:5433/postgres?sslmode=verify-full&sslrootcert=",
        ),
    ];
    let redis = [
        (
            "redis-tls",
            format!("rediss://127.0.0.1:6390/?{}", redis_tls_params()),
        ),
        (
            "redis-cluster-tls",
            format!(
                "rediss+cluster://127.0.0.1:7100,127.0.0.1:7101,127.0.0.1:7102/?{}",
                redis_tls_params()
            ),
        ),
    ];
    if !sql.iter().any(|s| is(s.0)) && !redis.iter().any(|r| is(r.0)) {
        eprintln!("no backend with TLS is selected in DLOCK_TEST_BACKENDS; nothing to check here");
        return;
    }
    assert!(
        CryptoProvider::get_default().is_none(),
        "something installed a provider before the test began"
    );

    // SQL over TLS works with no process default, and installs none.
    for (label, var, default_dir, url) in sql {
        if !is(label) {
            continue;
        }
        let dir = std::env::var(var).unwrap_or_else(|_| format!("{tmp}/{default_dir}"));
        let backend = JdbcBackend::connect(&format!("{url}{dir}/ca.crt"))
            .await
            .unwrap_or_else(|e| panic!("{label} over TLS (started by scripts/test): {e:#}"));
        lock_once(backend, label).await;
        assert!(
            CryptoProvider::get_default().is_none(),
            "{label}: connecting over TLS installed a process-wide crypto provider"
        );
    }

    // Redis over TLS without a process default: a Config error that says what to
    // do, and still none installed.
    for (label, url) in &redis {
        if !is(label) {
            continue;
        }
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

    // The application's provider, once installed, is the one the handshakes use.
    let provider = CryptoProvider {
        secure_random: &COUNTING_RANDOM,
        ..rustls::crypto::ring::default_provider()
    };
    provider.install_default().unwrap();
    for (label, url) in &redis {
        if !is(label) {
            continue;
        }
        let before = DRAWS.load(Ordering::SeqCst);
        let backend = RedisBackend::connect(url)
            .await
            .unwrap_or_else(|e| panic!("{label}: {e:#}"));
        lock_once(backend, label).await;
        assert!(
            DRAWS.load(Ordering::SeqCst) > before,
            "{label}: the TLS handshakes did not use the application's provider"
        );
    }
}
