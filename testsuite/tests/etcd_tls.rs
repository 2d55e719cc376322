//! etcd over TLS with authentication, when `etcd-tls` is in `DLOCK_TEST_BACKENDS`
//! (one member on 127.0.0.1:2479 that requires client certificates, authentication
//! on; scripts/lib/services.sh): the member is verified against the given CA, the
//! client's certificate and password are checked, and the user's role keeps it to
//! its prefix. Every refusal is an error that says what to check, and none shows the
//! password.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use dlock_api::DistributeLockManager;
use dlock_etcd::EtcdBackend;
use dlock_spi::{Error, ErrorKind, LockEvents, LockName};
use testsuite::backends::{etcd_tls_params, server_url, ETCD_TLS_DLOCK_PASSWORD};
use testsuite::conformance::take;
use testsuite::runner::selected;

fn selected_here() -> bool {
    let on = selected().iter().any(|l| l == "etcd-tls");
    if !on {
        eprintln!("etcd-tls is not selected in DLOCK_TEST_BACKENDS; nothing to check here");
    } else {
        // The suite's provider for TLS labels (what an application does in main).
        let _ = server_url("etcd-tls");
    }
    on
}

/// An etcd-tls URL: `scheme`, `user:password`, the prefix and the CA file (`None`:
/// no TLS parameters at all; `Some((ca, with_client_certificate))`).
fn url(scheme: &str, userinfo: &str, prefix: &str, tls: Option<(&str, bool)>) -> String {
    let query = match tls {
        None => String::new(),
        Some((ca, client)) => {
            let params = etcd_tls_params(ca);
            if client {
                format!("?{params}")
            } else {
                format!("?{}", params.split('&').next().unwrap())
            }
        }
    };
    format!("{scheme}://{userinfo}@127.0.0.1:2479/{prefix}{query}")
}

/// The etcd-tls URL with the right CA, client certificate and password.
fn good_url() -> String {
    let user = format!("dlock:{ETCD_TLS_DLOCK_PASSWORD}");
    url("etcds", &user, "dlock-test", Some(("ca.crt", true)))
}

/// A manager on the etcd-tls member with the right CA, client certificate and
/// password, and a lock name of its own taken and given back once there.
async fn signed_in(tag: &str) -> (DistributeLockManager, String) {
    let m = DistributeLockManager::builder(EtcdBackend::connect(&good_url()).await.unwrap())
        .build()
        .unwrap();
    let name = format!("{tag}-{:x}", fastrand::u64(..));
    take(&m.lock(&name), Duration::ZERO)
        .await
        .unlock()
        .await
        .unwrap();
    (m, name)
}

/// The error and its whole source chain, as a user would print it.
fn shown(e: &Error) -> String {
    let mut all = format!("{e}\n{e:?}");
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        all.push_str(&format!("\n{s}\n{s:?}"));
        source = s.source();
    }
    all
}

/// Connecting with the right CA, client certificate and password works, and a
/// lock is taken and given back; each wrong part alone is refused — a CA that did
/// not sign the member's certificate, no client certificate, a wrong password, a
/// plain connection to the TLS port — within the request timeout, with an error
/// that names what to check and shows no password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_wrong_part_is_refused_with_an_error_that_says_which() {
    if !selected_here() {
        return;
    }
    let (m, _) = signed_in("tls").await;
    m.close().await;

    let user = format!("dlock:{ETCD_TLS_DLOCK_PASSWORD}");
    let wrong_password = "Wr0ng-etcd-password";
    let cases = [
        (
            "a CA that did not sign the member's certificate",
            url("etcds", &user, "dlock-test", Some(("other-ca.crt", true))),
            "certificate",
        ),
        (
            "no client certificate",
            url("etcds", &user, "dlock-test", Some(("ca.crt", false))),
            "certificate",
        ),
        (
            "a wrong password",
            url(
                "etcds",
                &format!("dlock:{wrong_password}"),
                "dlock-test",
                Some(("ca.crt", true)),
            ),
            "check the user and password",
        ),
        (
            "a plain connection to the TLS port",
            url("etcd", &user, "dlock-test", None),
            "etcd",
        ),
    ];
    for (what, url, says) in cases {
        let started = std::time::Instant::now();
        let err = match EtcdBackend::connect(&url).await {
            Ok(_) => panic!("{what}: connected"),
            Err(e) => e,
        };
        let all = shown(&err);
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "{what}: refused only after {:?}",
            started.elapsed()
        );
        assert!(
            all.contains(says),
            "{what}: the error does not say {says:?}:\n{all}"
        );
        for secret in [ETCD_TLS_DLOCK_PASSWORD, wrong_password] {
            assert!(!all.contains(secret), "{what}: the password shows:\n{all}");
        }
        if what == "a wrong password" {
            assert_eq!(err.kind(), ErrorKind::Config, "{what}: {all}");
            assert!(
                all.contains("\"dlock\""),
                "{what}: the user is not named:\n{all}"
            );
        }
    }
}

/// The user's role may use the `dlock-test` prefix only: under another prefix the
/// first lock is refused with a `Config` error that says to check the prefix's
/// role — not retried as if etcd were down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_outside_the_users_role_is_refused() {
    if !selected_here() {
        return;
    }
    let user = format!("dlock:{ETCD_TLS_DLOCK_PASSWORD}");
    let elsewhere = url("etcds", &user, "elsewhere", Some(("ca.crt", true)));
    let m = DistributeLockManager::builder(EtcdBackend::connect(&elsewhere).await.unwrap())
        .build()
        .unwrap();
    let err = m
        .lock("outside")
        .try_lock(Duration::from_secs(1))
        .await
        .expect_err("a lock outside the user's prefix");
    assert_eq!(err.kind(), ErrorKind::Config, "{err:#}");
    assert!(err.to_string().contains("role"), "{err:#}");
    m.close().await;
}

/// A sign-in token that lapsed is renewed: the member forgets a token unused for 3 s
/// (its `--auth-token-ttl`); a client idle for 4.5 s takes a lock again at once (the
/// client signs in again when etcd says the token is invalid, and retries).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_sign_in_token_is_renewed() {
    if !selected_here() {
        return;
    }
    let (m, name) = signed_in("token").await;
    // The token's own lifetime (3 s unused, counted by a 1 s ticker) and a margin.
    tokio::time::sleep(Duration::from_millis(4_500)).await;
    let g = m
        .lock(&name)
        .try_lock(Duration::ZERO)
        .await
        .unwrap_or_else(|e| panic!("after the token lapsed: {e:#}"))
        .expect("the lock is free");
    g.unlock().await.unwrap();
    m.close().await;
}

/// An observer's change feed starts after the sign-in token lapsed: etcd answers a
/// watch asked for with a lapsed token by cancelling it, not with the error on which
/// the client signs in again — the feed signs in again and asks once more. Idle for
/// 4.5 s (the token's 3 s and a margin), `follow` is live and reports a grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_feed_starts_after_the_sign_in_token_lapsed() {
    if !selected_here() {
        return;
    }
    let follower = EtcdBackend::connect(&good_url()).await.unwrap();
    let (m, name) = signed_in("feed").await;
    // The follower's token, made when it connected, lapses unused.
    tokio::time::sleep(Duration::from_millis(4_500)).await;
    let mut feed = follower
        .follow(&LockName::new(name.as_str()).unwrap())
        .await
        .unwrap_or_else(|e| panic!("follow after the token lapsed: {e:#}"));
    let g = take(&m.lock(&name), Duration::ZERO).await;
    let pinged = tokio::time::timeout(Duration::from_secs(3), feed.changed()).await;
    assert_eq!(pinged.ok(), Some(true), "the grant was not reported");
    g.unlock().await.unwrap();
    m.close().await;
}

/// A client goes on working while the cluster's users change: etcd refuses a
/// request proposed before a user or role change and applied after it ("revision
/// of auth store is old", applying nothing), and the client sends it again. (Seen:
/// a release refused so, mid-suite, when the secrets test made its user — reported
/// as a malformed request.) Takes and gives back a lock in a loop (at most 400
/// cycles, 8 s) while the user is made again three times; every call succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_of_users_does_not_break_a_signed_in_client() {
    if !selected_here() {
        return;
    }
    let (m, name) = signed_in("users").await;
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let cycles = tokio::spawn({
        let lock = m.lock(&name);
        async move {
            let until = std::time::Instant::now() + Duration::from_secs(8);
            let mut done = 0u32;
            while done < 400 && std::time::Instant::now() < until && !*stop.borrow() {
                let g = lock
                    .try_lock(Duration::from_secs(1))
                    .await
                    .unwrap_or_else(|e| panic!("acquire while the users changed: {e:#}"))
                    .expect("the lock is free");
                g.unlock()
                    .await
                    .unwrap_or_else(|e| panic!("release while the users changed: {e:#}"));
                done += 1;
            }
            done
        }
    });
    for _ in 0..3 {
        testsuite::backends::url_with_password("etcd-tls", "changed-users")
            .await
            .unwrap();
    }
    let _ = stop_tx.send(true);
    let done = cycles.await.unwrap_or_else(|e| panic!("the cycles: {e}"));
    assert!(done > 0, "no cycle ran beside the changes");
    m.close().await;
}
