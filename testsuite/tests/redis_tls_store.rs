//! A TLS connection to Redis does not read the system's certificate store for each
//! connection: the redis crate did (synchronously, on the runtime's thread — the
//! reconnect stalls in SAFETY.md). Its own binary, because it points the store at a
//! file that does not exist (`SSL_CERT_FILE`) for the whole process: a connection
//! that reads the store fails; one given the CA, as dlock hands it, does not.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use dlock_api::DistributeLockManager;
use dlock_redis::RedisBackend;
use testsuite::backends::server_url;
use testsuite::runner::selected;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_connection_does_not_read_the_system_store() {
    if !selected().iter().any(|l| l == "redis-tls") {
        eprintln!("redis-tls is not selected in DLOCK_TEST_BACKENDS; nothing to check here");
        return;
    }
    // Before any TLS connection of this process (its one test).
    std::env::set_var("SSL_CERT_FILE", "/nonexistent/dlock-no-such-store.pem");
    std::env::set_var("SSL_CERT_DIR", "/nonexistent/dlock-no-such-dir");
    let url = server_url("redis-tls").unwrap();
    let backend = RedisBackend::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let m = DistributeLockManager::builder(backend).build().unwrap();
    let g = m.lock("tls-store").try_lock(Duration::ZERO).await.unwrap();
    g.expect("not granted").unlock().await.unwrap();
    m.close().await;
}
