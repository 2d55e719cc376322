//! What the Redlock backend promises beyond the conformance suite, when `redlock` is
//! in `DLOCK_TEST_BACKENDS` (three independent Redis masters on 127.0.0.1:6410–6412).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use dlock_api::DistributeLockManager;
use dlock_redis::RedlockBackend;
use dlock_spi::{
    async_trait, AcquireRequest, AcquireResult, Capabilities, LockAdmin, LockEvents, LockName,
    LockRemoteResource, LockState, ReleaseRequest, ReleaseResult, RenewRequest, RenewResult,
    Result,
};
use testsuite::backends::server_url;
use testsuite::conformance::take;
use testsuite::runner::selected;
use tokio::sync::Notify;

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

/// A waiter cut short at any point stops being shown on the nodes (it is shown so
/// that later callers stand back for it): 40 waits on a held lock, each dropped at a
/// point swept across the end of its wait, where it stops showing itself; then no
/// waiter may be left within a second — a third of the 3 s liveness after
/// which a forgotten entry would lapse on its own, and until which a later writer
/// stands back for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_cut_short_anywhere_is_no_longer_shown() {
    let Some(url) = redlock_url() else { return };
    let lock = format!("redlock-cut-{:x}", fastrand::u64(..));
    let m = DistributeLockManager::builder(RedlockBackend::connect(&url).await.unwrap())
        .build()
        .unwrap();
    let held = take(&m.lock(&lock), Duration::ZERO).await;
    let waiter = m.lock(&lock);
    let wait = Duration::from_millis(20);
    for i in 0..40u64 {
        // From 18 ms to 30 ms in 0.3 ms steps: the last round, its attempt and the
        // call that stops showing the waiter all fall in this span.
        let cut = Duration::from_micros(18_000 + i * 300);
        let _ = tokio::time::timeout(cut, waiter.try_lock(wait)).await;
    }
    let quiet = tokio::time::timeout(Duration::from_secs(1), async {
        loop {
            let state = m.inspect(&lock).await.unwrap();
            if state.is_some_and(|s| s.waiters == Some(0)) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let left = m.inspect(&lock).await.unwrap();
    assert!(
        quiet.is_ok(),
        "cut waits left waiters shown a second later: {left:?}"
    );
    held.unlock().await.unwrap();
    m.close().await;
}

/// Redlock with every renewal held up until the caller gives up: it says when one
/// began. Everything else goes to the real nodes.
struct RenewalsStall {
    redlock: RedlockBackend,
    renewing: Arc<Notify>,
}

#[async_trait]
impl LockRemoteResource for RenewalsStall {
    fn backend_name(&self) -> &'static str {
        self.redlock.backend_name()
    }
    fn capabilities(&self) -> Capabilities {
        self.redlock.capabilities()
    }
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<AcquireResult> {
        self.redlock.try_acquire(req).await
    }
    async fn release(&self, req: &ReleaseRequest) -> Result<ReleaseResult> {
        self.redlock.release(req).await
    }
    async fn renew(&self, _: &RenewRequest) -> Result<RenewResult> {
        self.renewing.notify_one();
        std::future::pending().await
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<LockState>> {
        self.redlock.inspect(name).await
    }
    fn admin(&self) -> Option<&dyn LockAdmin> {
        self.redlock.admin()
    }
    fn events(&self) -> Option<&dyn LockEvents> {
        None
    }

    fn batch_renew(&self) -> Option<&dyn dlock_spi::BatchRenew> {
        None
    }
}

/// An acquire cut short while it confirms its grant gives the grant back. Redlock's
/// validity ends a drift before the lease, so a grant of a fixed lease is confirmed
/// by a renewal before the guard exists; the acquire is dropped during that
/// renewal, and another client gets the lock within 2 s — not after the 30 s lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_cut_while_confirming_its_grant_gives_it_back() {
    let Some(url) = redlock_url() else { return };
    let lock = format!("redlock-confirm-{:x}", fastrand::u64(..));
    let renewing = Arc::new(Notify::new());
    let stalled = DistributeLockManager::builder(RenewalsStall {
        redlock: RedlockBackend::connect(&url).await.unwrap(),
        renewing: Arc::clone(&renewing),
    })
    .build()
    .unwrap();
    let other = DistributeLockManager::builder(RedlockBackend::connect(&url).await.unwrap())
        .build()
        .unwrap();
    let handle = stalled.lock(&lock);
    let fixed = dlock_api::LockOptions::new().lease(Duration::from_secs(30));
    tokio::select! {
        got = handle.try_lock_with(Duration::ZERO, &fixed) => {
            panic!("the acquire ended without confirming its grant: {:?}", got.map(|g| g.is_some()))
        }
        () = renewing.notified() => {}
    }
    let g = other
        .lock(&lock)
        .try_lock(Duration::from_secs(2))
        .await
        .unwrap()
        .expect("the grant of the acquire cut short was given back");
    g.unlock().await.unwrap();
    stalled.close().await;
    other.close().await;
}

/// A waiter's pace is the backoff its options give (`RedisOptions::polling`), as on
/// every other Redis deployment: one polling every 400 ms makes 3 attempts in
/// 1.2 s — Redlock used the default backoff (5 ms doubling to 250 ms) whatever was
/// asked, about ten attempts in the same wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_polls_at_the_backoff_it_was_given() {
    use dlock_redis::RedisOptions;
    use dlock_spi::{Backoff, GrantId, Jitter, OwnerId};
    use std::time::Instant;

    let Some(url) = redlock_url() else { return };
    let holder = RedlockBackend::connect(&url).await.unwrap();
    let pace = Backoff::constant(Duration::from_millis(400)).with_jitter(Jitter::None);
    let waiter = RedlockBackend::connect_with(&url, RedisOptions::default().polling(pace))
        .await
        .unwrap();
    let name = LockName::new(format!("redlock-pace-{:x}", fastrand::u64(..))).unwrap();
    let held = AcquireRequest::new(name.clone(), OwnerId::new("holder"), GrantId::new(1))
        .with_lease(Duration::from_secs(10));
    assert!(matches!(
        holder.try_acquire(&held).await.unwrap(),
        AcquireResult::Acquired { .. }
    ));
    let before = waiter.acquire_attempts();
    let req = AcquireRequest::new(name.clone(), OwnerId::new("waiter"), GrantId::new(1))
        .with_lease(Duration::from_secs(10))
        .with_deadline(Some(Instant::now() + Duration::from_millis(1200)));
    assert!(matches!(
        waiter.try_acquire(&req).await.unwrap(),
        AcquireResult::NotAcquired { .. }
    ));
    let attempts = waiter.acquire_attempts() - before;
    assert!(
        (2..=4).contains(&attempts),
        "{attempts} attempts in a 1.2 s wait at a 400 ms pace"
    );
    assert_eq!(
        holder.release(&held.release_of_grant()).await.unwrap(),
        ReleaseResult::Released
    );
}

/// A backend on the application's clients (one per master) takes the lock on every
/// node, as one from the URL does, so the two exclude each other and the grant's
/// token is on each node's counter; no clients is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_on_the_applications_clients_shares_locks_with_one_from_the_url() {
    let Some(url) = redlock_url() else { return };
    let refused = RedlockBackend::from_clients(Vec::new(), Default::default())
        .await
        .expect_err("no clients refused");
    assert_eq!(refused.kind(), dlock_spi::ErrorKind::Config, "{refused}");
    let clients = NODES
        .iter()
        .map(|p| redis::Client::open(format!("redis://127.0.0.1:{p}")).unwrap())
        .collect();
    let mine = DistributeLockManager::builder(
        RedlockBackend::from_clients(clients, Default::default())
            .await
            .unwrap(),
    )
    .build()
    .unwrap();
    let theirs = DistributeLockManager::builder(RedlockBackend::connect(&url).await.unwrap())
        .build()
        .unwrap();
    let lock = format!("redlock-clients-{:x}", fastrand::u64(..));
    let held = take(&mine.lock(&lock), Duration::ZERO).await;
    let token = held.fencing_token().get();
    for port in NODES {
        assert_eq!(fence(port, &lock).await, token, "node {port}");
    }
    assert!(theirs
        .lock(&lock)
        .try_lock(Duration::ZERO)
        .await
        .unwrap()
        .is_none());
    held.unlock().await.unwrap();
    let again = take(&theirs.lock(&lock), Duration::ZERO).await;
    assert!(again.fencing_token().get() > token);
    again.unlock().await.unwrap();
    mine.close().await;
    theirs.close().await;
}
