//! ZooKeeper over TLS, when `zk-tls` is in `DLOCK_TEST_BACKENDS` (one server whose
//! only client port, 127.0.0.1:2281, is TLS and requires client certificates;
//! scripts/lib/services.sh): the server is verified against the given CA, a client
//! without a certificate is refused, and the nodes are Curator's, as over a plain
//! port. (The conformance suite and the lock-history checker run on the label too.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use dlock_api::DistributeLockManager;
use dlock_spi::{Error, ErrorKind, LockName};
use dlock_zk::ZkBackend;
use testsuite::backends::{assert_held_by_a_curator_node, server_url, zk_tls_dir, zk_tls_params};
use testsuite::conformance::take;
use testsuite::runner::selected;

fn selected_here() -> bool {
    let on = selected().iter().any(|l| l == "zk-tls");
    if !on {
        eprintln!("zk-tls is not selected in DLOCK_TEST_BACKENDS; nothing to check here");
    } else {
        // The suite's provider for TLS labels (what an application does in main).
        let _ = server_url("zk-tls");
    }
    on
}

/// The zk-tls URL with CA file `ca`, and the client certificate if `client`.
fn url(ca: &str, client: bool) -> String {
    let params = zk_tls_params(ca);
    let params = if client {
        params
    } else {
        params.split('&').next().unwrap().to_owned()
    };
    format!("zks://127.0.0.1:2281/dlock-test?{params}")
}

/// A lock taken over TLS is held by the node Curator's `InterProcessMutex` makes,
/// under the lock's path, as over a plain port (read back over a TLS session of
/// the test's own, with the same certificates).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_taken_over_tls_is_held_in_curators_layout() {
    if !selected_here() {
        return;
    }
    let backend = ZkBackend::connect(&url("ca.crt", true)).await.unwrap();
    let m = DistributeLockManager::builder(backend.clone())
        .build()
        .unwrap();
    let lock = format!("tls-layout-{:x}", fastrand::u64(..));
    let path = backend.lock_path(&LockName::new(lock.as_str()).unwrap());
    assert!(path.starts_with("/dlock-test/"), "{path}");
    let g = take(&m.lock(&lock), Duration::ZERO).await;
    let dir = zk_tls_dir();
    let read = |f: &str| std::fs::read_to_string(format!("{dir}/{f}")).unwrap();
    let tls = zookeeper_client::TlsOptions::new()
        .with_pem_ca(&read("ca.crt"))
        .unwrap()
        .with_pem_identity(&read("client.crt"), &read("client.key"))
        .unwrap();
    let raw = zookeeper_client::Client::connector()
        .with_tls(tls)
        .secure_connect("127.0.0.1:2281")
        .await
        .unwrap();
    assert_held_by_a_curator_node(&raw, &path, g.fencing_token().get()).await;
    g.unlock().await.unwrap();
    m.close().await;
}

/// Connecting to `url` is refused: the error, which names the server.
async fn refused(url: &str, what: &str) -> Error {
    let err = ZkBackend::connect(url).await.map(drop).expect_err(what);
    assert!(err.to_string().contains("127.0.0.1:2281"), "{err}");
    err
}

/// Verification is on: a server whose certificate the given CA did not sign is
/// refused — no session, an error that names the URL and no lock taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_the_ca_did_not_sign_is_refused() {
    if !selected_here() {
        return;
    }
    let err = refused(
        &url("other-ca.crt", true),
        "connected to a server the CA did not sign",
    )
    .await;
    assert!(
        err.to_string().contains("tls_ca"),
        "the error does not say what to check: {err}"
    );
    assert_ne!(err.kind(), ErrorKind::Config, "{err}");
}

/// The server requires client certificates: without one the connection is
/// refused; with the right CA and certificate (the other tests) it works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_a_certificate_is_refused() {
    if !selected_here() {
        return;
    }
    let err = refused(
        &url("ca.crt", false),
        "connected without a client certificate",
    )
    .await;
    assert!(err.to_string().contains("tls_cert"), "{err}");
}

/// A `zk://` (plain) URL to the TLS-only port does not get a session either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_connection_to_the_tls_port_is_refused() {
    if !selected_here() {
        return;
    }
    refused(
        "zk://127.0.0.1:2281/dlock-test",
        "a plain session on the TLS port",
    )
    .await;
}
