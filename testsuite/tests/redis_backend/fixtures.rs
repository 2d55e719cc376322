//! What the Redis backend's tests share: the selected deployments, managers and backends on them, raw connections, and the fault proxy.

use std::time::{Duration, Instant};

use dlock_api::spi::{
    AcquireRequest, Fairness, LockName, LockRemoteResource, OwnerId, ReleaseResult,
};
use dlock_api::{DistributeLock, DistributeLockManager, ErrorKind, LockGuard, LockMode};
use dlock_redis::{RedisBackend, RedisOptions};
use testsuite::backends::server_url;
use testsuite::conformance::{eventually, take};
use testsuite::proxy::FaultProxy;
use testsuite::runner::selected;

pub(crate) fn redis_url() -> Option<String> {
    let url = selected()
        .iter()
        .any(|l| l == "redis")
        .then(|| server_url("redis").unwrap().to_string());
    if url.is_none() {
        eprintln!("redis is not selected in DLOCK_TEST_BACKENDS; nothing to check here");
    }
    url
}

/// A client: a backend on `url` with `options`, and a manager over it.
pub(crate) async fn dlock_client(
    url: &str,
    options: RedisOptions,
) -> (RedisBackend, DistributeLockManager) {
    let backend = RedisBackend::connect_with(url, options).await.unwrap();
    let m = DistributeLockManager::builder(backend.clone())
        .build()
        .unwrap();
    (backend, m)
}

/// A plain connection to the server, for looking at keys and channels directly.
pub(crate) async fn raw_connection(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// The fault proxy in front of the Redis on 6379, and a backend connected through it.
pub(crate) async fn proxied_backend() -> (FaultProxy, RedisBackend) {
    let proxy = FaultProxy::start("127.0.0.1:6379".parse().unwrap())
        .await
        .unwrap();
    let backend = RedisBackend::connect(&format!("redis://{}", proxy.addr()))
        .await
        .unwrap();
    (proxy, backend)
}

pub(crate) fn name(tag: &str) -> String {
    format!("{tag}-{:x}", fastrand::u64(..))
}

/// Sets the fencing counter `fence` a day of µs ahead of the server's clock; the value.
pub(crate) async fn counter_a_day_ahead(
    c: &mut redis::aio::MultiplexedConnection,
    fence: &str,
) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(c).await.unwrap();
    let ahead = secs * 1_000_000 + micros + 86_400_000_000;
    let _: () = redis::cmd("SET")
        .arg(fence)
        .arg(ahead)
        .query_async(c)
        .await
        .unwrap();
    ahead
}

/// The fencing counter `fence`'s value.
pub(crate) async fn counter_at(c: &mut redis::aio::MultiplexedConnection, fence: &str) -> u64 {
    redis::cmd("GET").arg(fence).query_async(c).await.unwrap()
}

/// Takes `lock` (waiting up to 20 s) in a task of its own, releases it at once, and
/// returns when it got it.
pub(crate) fn take_in_background(lock: DistributeLock) -> tokio::task::JoinHandle<Instant> {
    tokio::spawn(async move {
        let g = take(&lock, Duration::from_secs(20)).await;
        let at = Instant::now();
        g.unlock().await.unwrap();
        at
    })
}

/// Parks a waiter on `waiter` (whose backend is `waiter_side`) behind `holder`, keeps
/// the holder `park` longer, releases, and returns how long the waiter took to get
/// the lock after the release. Fails if the waiter tried again while parked (polled):
/// only a release notice may wake it before its re-check.
pub(crate) async fn wake_after_release(
    holder: LockGuard,
    waiter: DistributeLock,
    waiter_side: &RedisBackend,
    park: Duration,
) -> Duration {
    let before = waiter_side.acquire_attempts();
    let task = take_in_background(waiter);
    // The waiter has tried once and parked.
    assert!(
        eventually(Duration::from_secs(5), || async {
            waiter_side.acquire_attempts() > before
        })
        .await
    );
    tokio::time::sleep(park).await;
    assert_eq!(
        waiter_side.acquire_attempts(),
        before + 1,
        "the waiter polled instead of parking"
    );
    handed_over(holder, task).await
}

/// Releases `holder` and returns how long `task` (from [`take_in_background`]) then
/// took to get the lock.
pub(crate) async fn handed_over(
    holder: LockGuard,
    task: tokio::task::JoinHandle<Instant>,
) -> Duration {
    let released = Instant::now();
    holder.unlock().await.unwrap();
    task.await.unwrap().duration_since(released)
}

/// The release notices about `lock` that any backend is sent, as (channel, message),
/// heard by a raw pattern subscriber on every backend's notice channel (on a thread
/// of its own), plus the probes [`until_probe`] publishes.
pub(crate) async fn notice_listener(
    url: &str,
    lock: &str,
) -> tokio::sync::mpsc::UnboundedReceiver<(String, String)> {
    let about = notice_for_lock(lock);
    let (tx, mut heard) = tokio::sync::mpsc::unbounded_channel();
    let mut sub = redis::Client::open(url).unwrap().get_connection().unwrap();
    sub.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    std::thread::spawn(move || {
        let mut ps = sub.as_pubsub();
        ps.psubscribe("dlock:notices:*").unwrap();
        let _ = tx.send((String::new(), "subscribed".to_owned()));
        while let Ok(msg) = ps.get_message() {
            let payload: String = msg.get_payload().unwrap();
            let ours = payload.starts_with(&about) || payload.starts_with("probe");
            if ours
                && tx
                    .send((msg.get_channel_name().to_owned(), payload))
                    .is_err()
            {
                break;
            }
        }
    });
    assert_eq!(heard.recv().await.unwrap().1, "subscribed");
    heard
}

/// Publishes `probe` where the listener hears it and returns what the listener heard
/// before it (everything published earlier arrives earlier; other tests' probes are
/// passed over). A notice names the waiting *grant* (`<owner>#<grant>`); the grant
/// part is cut off, since a test sees only the waiter's owner, and a hand-over's
/// third line (`<token> <lease ms>`) shows as [`HANDED_OVER`].
pub(crate) async fn until_probe(
    publisher: &mut redis::aio::MultiplexedConnection,
    heard: &mut tokio::sync::mpsc::UnboundedReceiver<(String, String)>,
    probe: &str,
) -> Vec<(String, String)> {
    let _: i64 = redis::cmd("PUBLISH")
        .arg("dlock:notices:probe")
        .arg(probe)
        .query_async(publisher)
        .await
        .unwrap();
    let mut before = Vec::new();
    loop {
        let msg = heard.recv().await.unwrap();
        if msg.1 == probe {
            return before;
        }
        if msg.1.starts_with("probe") {
            continue;
        }
        let message = match msg.1.split_once('\n') {
            Some((key, rest)) => {
                let (waiter, handed) = match rest.split_once('\n') {
                    Some((waiter, grant)) => {
                        let (token, ms) = grant.split_once(' ').expect("<token> <ms>");
                        assert!(token.parse::<u64>().is_ok() && ms.parse::<u64>().is_ok());
                        (waiter, HANDED_OVER)
                    }
                    None => (rest, ""),
                };
                let (owner, _grant) = dlock_api::spi::HolderKey::parse(waiter);
                format!("{key}\n{owner}{handed}")
            }
            None => msg.1,
        };
        before.push((msg.0, message));
    }
}

/// How every release notice about `lock` starts: its exclusive key and a newline.
pub(crate) fn notice_for_lock(lock: &str) -> String {
    format!("dlock:{{{lock}}}:x\n")
}

/// The notice that tells `owner` (waiting for `lock`) on its backend's channel.
pub(crate) fn notice_for(backend: &RedisBackend, lock: &str, owner: &str) -> (String, String) {
    (
        backend.notice_channel().to_owned(),
        notice_for_lock(lock) + owner,
    )
}

/// How [`until_probe`] shows a hand-over notice: after the waiter's owner.
pub(crate) const HANDED_OVER: &str = " (handed over)";

/// The notice that hands `lock` over to `owner`, as [`until_probe`] shows it.
pub(crate) fn handover_for(backend: &RedisBackend, lock: &str, owner: &str) -> (String, String) {
    let (channel, notice) = notice_for(backend, lock, owner);
    (channel, notice + HANDED_OVER)
}

/// The holder of `lock` as `inspect` shows it: (owner, remaining lease).
pub(crate) async fn holder_of(m: &DistributeLockManager, lock: &str) -> Option<(String, Duration)> {
    let state = m.inspect(lock).await.unwrap()?;
    let h = state.holders.first()?;
    Some((h.owner.as_str().to_owned(), h.remaining_lease?))
}

/// Polls `fut` until `parked` holds (it is queued and waiting), then returns it,
/// not yet done.
pub(crate) async fn park<F: std::future::Future + Unpin>(fut: &mut F, parked: impl Fn() -> bool) {
    let until = Instant::now() + Duration::from_secs(5);
    while !parked() {
        assert!(Instant::now() < until, "the waiter did not park");
        assert!(
            tokio::time::timeout(Duration::from_millis(20), &mut *fut)
                .await
                .is_err(),
            "the waiter got the lock while it was held"
        );
    }
}

/// The first member of the queue-liveness key `alive_key` and its liveness deadline
/// (server ms), if anyone is queued.
pub(crate) async fn queue_head(
    mut raw: redis::aio::MultiplexedConnection,
    alive_key: &str,
) -> Option<(String, f64)> {
    let entry: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg(alive_key)
        .arg(0)
        .arg(0)
        .arg("WITHSCORES")
        .query_async(&mut raw)
        .await
        .unwrap();
    entry.into_iter().next()
}

/// On a new name: a holder in `mode` (of 3 permits, for permits) with a 100 ms
/// lease, then an exclusive request with `fairness` asked in a tight loop (bounded:
/// 2 s) until granted. Returns the holder's stored end (its last ms) and the writer's
/// token (the server's clock in µs at its grant).
pub(crate) async fn holder_end_and_next_writer(
    url: &str,
    mode: LockMode,
    fairness: Fairness,
) -> (u64, u64) {
    let backend = RedisBackend::connect(url).await.unwrap();
    let mut c = raw_connection(url).await;
    let lock = LockName::new(name("holder-end")).unwrap();
    let ask = |owner: &str, mode: LockMode| {
        AcquireRequest::new(
            lock.clone(),
            OwnerId::new(owner),
            dlock_api::spi::GrantId::new(1),
        )
        .with_mode(mode)
        .with_capacity(3)
        .with_fairness(fairness)
        .with_lease(Duration::from_millis(100))
    };
    let holder = backend.try_acquire(&ask("holder", mode)).await.unwrap();
    assert!(holder.is_acquired(), "{holder:?}");
    let holders = format!("dlock:{{{}}}:r", lock.as_str());
    let [(_, end_ms)] = zrange_with_scores(&mut c, &holders).await[..] else {
        panic!("one holder expected in {holders}");
    };
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let writer = backend
            .try_acquire(&ask("writer", LockMode::Exclusive))
            .await
            .unwrap();
        if let Some(token) = writer.token() {
            return (end_ms, token.get());
        }
        assert!(Instant::now() < deadline, "the writer never got the lock");
    }
}

/// Every member of the sorted set `key`, with its score.
pub(crate) async fn zrange_with_scores(
    c: &mut redis::aio::MultiplexedConnection,
    key: &str,
) -> Vec<(String, u64)> {
    redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(c)
        .await
        .unwrap()
}

/// The first member of the sorted set `key` ("" when it is empty).
pub(crate) async fn first_member(c: &mut redis::aio::MultiplexedConnection, key: &str) -> String {
    let first: Vec<String> = redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(0)
        .query_async(c)
        .await
        .unwrap();
    first.into_iter().next().unwrap_or_default()
}

/// The server's clock in whole milliseconds.
pub(crate) async fn server_ms(c: &mut redis::aio::MultiplexedConnection) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query_async(c).await.unwrap();
    s * 1000 + us / 1000
}

/// The checks for one TLS deployment at `url`; `plain` is the same servers without TLS.
pub(crate) async fn tls_refusals(url: &str, plain: &str) {
    let (base, query) = url.split_once('?').unwrap();
    let param = |name: &str| {
        query
            .split('&')
            .find_map(|p| p.strip_prefix(&format!("{name}=")))
            .unwrap()
            .to_owned()
    };

    // The whole set works (and really is TLS: the servers have no plain port).
    let (_, m) = dlock_client(url, RedisOptions::default()).await;
    let g = take(&m.lock(name("tls")), Duration::ZERO).await;
    g.unlock().await.unwrap();
    m.close().await;

    // No CA: the system's roots do not know the test CA.
    let no_ca = format!(
        "{base}?tls_cert={}&tls_key={}",
        param("tls_cert"),
        param("tls_key")
    );
    let err = RedisBackend::connect(&no_ca).await.map(drop).unwrap_err();
    assert!(
        err.message().to_lowercase().contains("certificate"),
        "{url}: an unknown server certificate should be named as the cause: {err}"
    );

    // The CA but no client certificate: the server hangs up during the handshake.
    let no_identity = format!("{base}?tls_ca={}", param("tls_ca"));
    let started = Instant::now();
    let err = RedisBackend::connect(&no_identity)
        .await
        .map(drop)
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Backend, "{url}: {err}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{url}: refusal took {:?}",
        started.elapsed()
    );

    // A plain client on the TLS ports gets nowhere either, and certificates on a
    // plain URL are a configuration error that names the TLS scheme.
    let plain_client = RedisBackend::connect(plain).await;
    assert!(
        plain_client.is_err(),
        "a plain connection to {plain} worked"
    );
    let with_ca = format!("{plain}?tls_ca={}", param("tls_ca"));
    let err = RedisBackend::connect(&with_ca).await.map(drop).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{with_ca}: {err}");
    assert!(err.message().contains("rediss"), "{err}");
}

/// The lease left on a key, as the server counts it.
pub(crate) async fn pttl(c: &mut redis::aio::MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query_async(c).await.unwrap()
}

/// Counts the renewals handlers hear of.
#[derive(Default)]
pub(crate) struct RenewalCount(pub(crate) std::sync::atomic::AtomicUsize);

#[dlock_api::spi::async_trait]
impl dlock_api::spi::LockHandler for RenewalCount {
    async fn acquire(
        &self,
        ctx: &dlock_api::spi::AcquireContext,
        next: dlock_api::spi::AcquireChain<'_>,
    ) -> dlock_api::spi::Result<dlock_api::spi::AcquireResult> {
        next.invoke(ctx).await
    }
    async fn release(
        &self,
        ctx: &dlock_api::spi::ReleaseContext,
        next: dlock_api::spi::ReleaseChain<'_>,
    ) -> dlock_api::spi::Result<ReleaseResult> {
        next.invoke(ctx).await
    }
    fn on_renew(&self, event: &dlock_api::spi::RenewEvent<'_>) {
        if event.outcome.is_ok() {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}
