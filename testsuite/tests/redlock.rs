//! What the Redlock backend promises beyond the conformance suite, when `redlock` is
//! in `DLOCK_TEST_BACKENDS` (three independent Redis masters on 127.0.0.1:6410–6412).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use dlock_api::DistributeLockManager;
use dlock_redis::RedlockBackend;
use testsuite::backends::server_url;
use testsuite::conformance::take;
use testsuite::runner::selected;

const NODES: [u16; 3] = [6410, 6411, 6412];

fn redlock_url() -> Option<String> {
    let url = selected()
        .iter()
        .any(|l| l == "redlock")
        .then(|| server_url("redlock").unwrap().to_string());
    if url.is_none() {
        eprintln!("redlock is not selected in DLOCK_TEST_BACKENDS; nothing to check here");
    }
    url
}

async fn node(port: u16) -> redis::aio::MultiplexedConnection {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn fence(port: u16, lock: &str) -> u64 {
    let v: Option<u64> = redis::cmd("GET")
        .arg(format!("dlock:{{{lock}}}:f"))
        .query_async(&mut node(port).await)
        .await
        .unwrap();
    v.unwrap_or(0)
}

/// A grant's token is written back as the counter floor only on the nodes where
/// the grant holds: a node another client holds keeps its counter (there, that
/// client's grant may be later than this one's, and a floor written after it would
/// let a third grant's token fall below this one's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_is_written_back_only_where_the_grant_holds() {
    let Some(url) = redlock_url() else { return };
    let lock = format!("redlock-floor-{:x}", fastrand::u64(..));
    // Another client holds the lock on the third node (its hold and counter planted).
    let mut third = node(NODES[2]).await;
    redis::pipe()
        .cmd("SET")
        .arg(format!("dlock:{{{lock}}}:x"))
        .arg("5|other")
        .arg("PX")
        .arg(10_000)
        .cmd("SET")
        .arg(format!("dlock:{{{lock}}}:f"))
        .arg(7)
        .query_async::<()>(&mut third)
        .await
        .unwrap();
    let m = DistributeLockManager::builder(RedlockBackend::connect(&url).await.unwrap())
        .build()
        .unwrap();
    let g = take(&m.lock(&lock), Duration::ZERO).await;
    let token = g.fencing_token().get();
    for port in &NODES[..2] {
        assert!(
            fence(*port, &lock).await >= token,
            "node {port} holds the grant and did not get the token as its floor"
        );
    }
    assert_eq!(
        fence(NODES[2], &lock).await,
        7,
        "the token was written back on a node another client holds"
    );
    g.unlock().await.unwrap();
    redis::cmd("DEL")
        .arg(format!("dlock:{{{lock}}}:x"))
        .query_async::<()>(&mut third)
        .await
        .unwrap();
    m.close().await;
}
