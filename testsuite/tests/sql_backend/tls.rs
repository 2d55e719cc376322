//! TLS to the database: the server's certificate verified, a URL that would not verify it refused.

use std::time::Duration;

use dlock_api::{DistributeLockManager, ErrorKind};
use dlock_jdbc::JdbcBackend;
use testsuite::backends::sql_tls_url;
use testsuite::conformance::lock_once;
use testsuite::runner::selected;

/// MySQL and PostgreSQL over TLS (the project's script runs a second server of each —
/// MariaDB on 127.0.0.1:3307, PostgreSQL on 127.0.0.1:5433 — that takes TLS
/// connections only, its certificate signed by a throwaway CA): with the certificate
/// verified against that CA the backend works; against another CA it is refused
/// (a `Config` error naming the CA parameter), and so is a connection without TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_over_tls_verifies_the_server_certificate() {
    let chosen = selected();
    let mut checked = 0;
    for label in ["mysql", "postgres"] {
        if !chosen.iter().any(|l| l == label) {
            continue;
        }
        checked += 1;
        let url = |verify: bool, ca: &str| match (label, verify) {
            (_, true) => sql_tls_url(label, ca).unwrap(),
            ("mysql", false) => "mysql://root@127.0.0.1:3307/test?ssl-mode=DISABLED".to_owned(),
            (_, false) => "postgres://postgres@127.0.0.1:5433/postgres?sslmode=disable".to_owned(),
        };
        let backend = JdbcBackend::connect(&url(true, "ca.crt"))
            .await
            .unwrap_or_else(|e| panic!("{label} over TLS (started by scripts/test): {e:#}"));
        let m = DistributeLockManager::builder(backend).build().unwrap();
        let name = format!("tls-{:x}", fastrand::u64(..));
        let g = m.lock(&name).try_lock(Duration::ZERO).await.unwrap();
        g.unwrap_or_else(|| panic!("{label}: not granted over TLS"))
            .unlock()
            .await
            .unwrap();
        m.close().await;
        for (verify, ca, what) in [
            (true, "other-ca.crt", "a certificate another CA signed"),
            (false, "ca.crt", "a connection without TLS"),
        ] {
            let err = JdbcBackend::connect(&url(verify, ca))
                .await
                .map(drop)
                .expect_err(what);
            let text = format!("{err:#}");
            eprintln!("{label}: {what}: refused: {text}");
            if verify {
                assert!(
                    text.to_lowercase().contains("certificate"),
                    "{label}: {what}: {text}"
                );
                // Not a blip: retrying will not help, the configuration must change.
                assert_eq!(err.kind(), ErrorKind::Config, "{label}: {what}: {text}");
                assert!(!err.is_retryable(), "{label}: {what}: {text}");
                assert!(
                    err.message().contains("sslrootcert"),
                    "{label}: {what}: {text}"
                );
            }
        }
    }
    if checked == 0 {
        eprintln!("neither mysql nor postgres is selected; nothing to check here");
    }
}

/// `dlock_tls=verified` on the TLS-only servers (certificate signed by the script's
/// throwaway CA): a URL that encrypts without verifying (`sslmode=require`,
/// `ssl-mode=REQUIRED`) connects without the option — the server is not checked —
/// and is refused with it (a `Config` error naming the mode); a URL naming no
/// mode gets the strictest, which checks the server against the Mozilla roots and
/// so refuses this one; the verifying URL with the script's CA works with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verified_tls_refuses_a_url_that_does_not_verify_the_server() {
    for label in ["mysql", "postgres"] {
        if !selected().iter().any(|l| l == label) {
            continue;
        }
        let verifying = sql_tls_url(label, "ca.crt").unwrap();
        let (unverified, unnamed) = match label {
            "mysql" => (
                "mysql://root@127.0.0.1:3307/test?ssl-mode=REQUIRED",
                "mysql://root@127.0.0.1:3307/test",
            ),
            _ => (
                "postgres://postgres@127.0.0.1:5433/postgres?sslmode=require",
                "postgres://postgres@127.0.0.1:5433/postgres",
            ),
        };
        // The gap the option closes: the server's certificate is not checked.
        JdbcBackend::connect(unverified)
            .await
            .unwrap_or_else(|e| panic!("{label}: {unverified} without the option: {e:#}"))
            .close()
            .await;
        let err = JdbcBackend::connect(&format!("{unverified}&dlock_tls=verified"))
            .await
            .map(drop)
            .expect_err("an unverified mode with dlock_tls=verified");
        assert_eq!(err.kind(), ErrorKind::Config, "{label}: {err:#}");
        assert!(
            err.message().contains("does not verify"),
            "{label}: {err:#}"
        );
        let err = JdbcBackend::connect(&format!("{unnamed}?dlock_tls=verified"))
            .await
            .map(drop)
            .expect_err("the strictest mode against a CA the Mozilla roots do not hold");
        assert!(
            format!("{err:#}").to_lowercase().contains("certificate"),
            "{label}: {err:#}"
        );
        let backend = JdbcBackend::connect(&format!("{verifying}&dlock_tls=verified"))
            .await
            .unwrap_or_else(|e| panic!("{label}: the verifying URL with the option: {e:#}"));
        lock_once(backend).await;
    }
}
