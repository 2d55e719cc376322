//! What only the Redis backend promises, when `redis` is in `DLOCK_TEST_BACKENDS`:
//! replica acknowledgement, skipping dead fair waiters, and behaviour through an
//! outage (via the project's loopback fault proxy).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use dlock_api::spi::{
    AcquireRequest, Fairness, LockName, LockRemoteResource, OwnerId, ReleaseRequest, ReleaseResult,
};
use dlock_api::{DistributeLock, DistributeLockManager, ErrorKind, LockGuard, LockMode};
use dlock_redis::{RedisBackend, RedisOptions};
use testsuite::backends::server_url;
use testsuite::conformance::{eventually, take, take_permits};
use testsuite::proxy::{Fault, FaultProxy};
use testsuite::runner::selected;

fn redis_url() -> Option<String> {
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
async fn dlock_client(url: &str, options: RedisOptions) -> (RedisBackend, DistributeLockManager) {
    let backend = RedisBackend::connect_with(url, options).await.unwrap();
    let m = DistributeLockManager::builder(backend.clone())
        .build()
        .unwrap();
    (backend, m)
}

/// A plain connection to the server, for looking at keys and channels directly.
async fn raw_connection(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// The fault proxy in front of the Redis on 6379, and a backend connected through it.
async fn proxied_backend() -> (FaultProxy, RedisBackend) {
    let proxy = FaultProxy::start("127.0.0.1:6379".parse().unwrap())
        .await
        .unwrap();
    let backend = RedisBackend::connect(&format!("redis://{}", proxy.addr()))
        .await
        .unwrap();
    (proxy, backend)
}

fn name(tag: &str) -> String {
    format!("{tag}-{:x}", fastrand::u64(..))
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_fair_waiter_is_skipped_once_its_liveness_lapses() {
    let Some(url) = redis_url() else { return };
    let lock = name("ghost");
    // A waiter that queued and then died: queued first, liveness ends in 400 ms.
    let mut c = raw_connection(&url).await;
    let base = format!("dlock:{{{lock}}}");
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut c).await.unwrap();
    let now_ms = secs * 1000 + micros / 1000;
    redis::pipe()
        .cmd("ZADD")
        .arg(format!("{base}:q"))
        .arg(secs * 1_000_000 + micros)
        .arg("ghost")
        .cmd("ZADD")
        .arg(format!("{base}:ql"))
        .arg(now_ms + 400)
        .arg("ghost")
        .cmd("HSET")
        .arg(format!("{base}:qm"))
        .arg("ghost")
        .arg("x")
        .query_async::<()>(&mut c)
        .await
        .unwrap();
    let (_, m) = dlock_client(&url, RedisOptions::default()).await;
    let start = Instant::now();
    let g = m
        .fair_lock(&lock)
        .try_lock(Duration::from_secs(5))
        .await
        .unwrap()
        .expect("granted after the ghost lapsed");
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(300),
        "jumped the queue after {waited:?}"
    );
    assert!(
        waited < Duration::from_millis(2500),
        "the dead waiter blocked the queue for {waited:?}"
    );
    g.unlock().await.unwrap();
    assert!(
        m.inspect(&lock).await.unwrap().is_none(),
        "queue state left behind"
    );
    m.close().await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_survive_the_counter_being_deleted() {
    let Some(url) = redis_url() else { return };
    let (_, m) = dlock_client(&url, RedisOptions::default()).await;
    let mut c = raw_connection(&url).await;
    let lock = name("fence-del");
    let mut last = 0;
    for round in 0..4 {
        let g = take(&m.lock(&lock), Duration::ZERO).await;
        let token = g.fencing_token().get();
        assert!(token > last, "token {token} after {last} in round {round}");
        last = token;
        g.unlock().await.unwrap();
        // Someone deletes every key of the lock, the counter included.
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("dlock:{{{lock}}}*"))
            .query_async(&mut c)
            .await
            .unwrap();
        assert!(
            !keys.is_empty(),
            "the last token should be kept after a release"
        );
        let _: i64 = redis::cmd("DEL")
            .arg(&keys)
            .query_async(&mut c)
            .await
            .unwrap();
    }
    m.close().await;
}

/// Item 9: after a failover, the promoted replica's fencing counter may lag (it
/// missed the last grants). Every way a grant is made — the lean exclusive script,
/// the fair one, a reader — still issues a token above every earlier one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_survive_a_lagging_counter() {
    let Some(url) = redis_url() else { return };
    let (_, m) = dlock_client(&url, RedisOptions::default()).await;
    let mut c = raw_connection(&url).await;
    let lock = name("fence-lag");
    let fence = format!("dlock:{{{lock}}}:f");
    let mut last = 0;
    let ways = [
        m.lock(&lock),
        m.fair_lock(&lock),
        m.read_write_lock(&lock).read().clone(),
    ];
    for round in 0..6 {
        let g = take(&ways[round % ways.len()], Duration::ZERO).await;
        let token = g.fencing_token().get();
        assert!(
            token > last,
            "round {round} ({:?} {:?}): token {token} after {last}",
            g.mode(),
            ways[round % ways.len()].fairness()
        );
        last = token;
        g.unlock().await.unwrap();
        // The counter as a replica that missed the last 1000 grants would have it.
        let _: () = redis::cmd("SET")
            .arg(&fence)
            .arg(token - 1000)
            .query_async(&mut c)
            .await
            .unwrap();
    }
    m.close().await;
}

/// The counter ahead of the server's clock (a promoted replica whose clock is behind
/// the old master's, or many grants in one µs): every way a grant is made issues
/// exactly one past the counter, never the clock (the lean script sets the counter
/// to the clock first, then puts it right).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_stay_above_a_counter_ahead_of_the_clock() {
    let Some(url) = redis_url() else { return };
    let (_, m) = dlock_client(&url, RedisOptions::default()).await;
    let mut c = raw_connection(&url).await;
    let lock = name("fence-ahead");
    let fence = format!("dlock:{{{lock}}}:f");
    let ways = [
        m.lock(&lock),
        m.fair_lock(&lock),
        m.read_write_lock(&lock).read().clone(),
    ];
    for round in 0..6 {
        // A day of µs ahead of the clock.
        let ahead = counter_a_day_ahead(&mut c, &fence).await;
        let g = take(&ways[round % ways.len()], Duration::ZERO).await;
        assert_eq!(
            g.fencing_token().get(),
            ahead + 1,
            "round {round} ({:?} {:?}): not one past the counter",
            g.mode(),
            ways[round % ways.len()].fairness()
        );
        let counter = counter_at(&mut c, &fence).await;
        assert_eq!(
            counter,
            ahead + 1,
            "round {round}: the counter was not put right"
        );
        g.unlock().await.unwrap();
    }
    // A semaphore's permits, on the idle semaphore and beside a holder (both of the
    // permits' fast paths).
    let sem_name = name("fence-ahead-sem");
    let sem_fence = format!("dlock:{{{sem_name}}}:f");
    let sem = m.semaphore(&sem_name, 2);
    let mut kept = Vec::new();
    for round in 0..2 {
        let ahead = counter_a_day_ahead(&mut c, &sem_fence).await;
        let p = sem
            .try_acquire(1, Duration::ZERO)
            .await
            .unwrap()
            .expect("a permit");
        assert_eq!(
            p.fencing_token().get(),
            ahead + 1,
            "permit {round}: not one past the counter"
        );
        let counter = counter_at(&mut c, &sem_fence).await;
        assert_eq!(
            counter,
            ahead + 1,
            "permit {round}: the counter was not put right"
        );
        kept.push(p);
    }
    for p in kept {
        p.release().await.unwrap();
    }
    m.close().await;
}

/// Sets the fencing counter `fence` a day of µs ahead of the server's clock; the value.
async fn counter_a_day_ahead(c: &mut redis::aio::MultiplexedConnection, fence: &str) -> u64 {
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
async fn counter_at(c: &mut redis::aio::MultiplexedConnection, fence: &str) -> u64 {
    redis::cmd("GET").arg(fence).query_async(c).await.unwrap()
}

/// Takes `lock` (waiting up to 20 s) in a task of its own, releases it at once, and
/// returns when it got it.
fn take_in_background(lock: DistributeLock) -> tokio::task::JoinHandle<Instant> {
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
async fn wake_after_release(
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
async fn handed_over(holder: LockGuard, task: tokio::task::JoinHandle<Instant>) -> Duration {
    let released = Instant::now();
    holder.unlock().await.unwrap();
    task.await.unwrap().duration_since(released)
}

/// The release notices about `lock` that any backend is sent, as (channel, message),
/// heard by a raw pattern subscriber on every backend's notice channel (on a thread
/// of its own), plus the probes [`until_probe`] publishes.
async fn notice_listener(
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
async fn until_probe(
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
fn notice_for_lock(lock: &str) -> String {
    format!("dlock:{{{lock}}}:x\n")
}

/// The notice that tells `owner` (waiting for `lock`) on its backend's channel.
fn notice_for(backend: &RedisBackend, lock: &str, owner: &str) -> (String, String) {
    (
        backend.notice_channel().to_owned(),
        notice_for_lock(lock) + owner,
    )
}

/// How [`until_probe`] shows a hand-over notice: after the waiter's owner.
const HANDED_OVER: &str = " (handed over)";

/// The notice that hands `lock` over to `owner`, as [`until_probe`] shows it.
fn handover_for(backend: &RedisBackend, lock: &str, owner: &str) -> (String, String) {
    let (channel, notice) = notice_for(backend, lock, owner);
    (channel, notice + HANDED_OVER)
}

/// Releases publish a notice only while someone waits: uncontended cycles send none,
/// and a parked waiter is named by the release, on its own backend's channel, and
/// woken at once (not by its re-check, 3 s away with a 9 s liveness), also after a
/// writer's mark (1 s) lapsed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_notices_go_out_only_while_someone_waits() {
    let Some(url) = redis_url() else { return };
    let lock = name("notices");
    let mut publisher = raw_connection(&url).await;
    let mut heard = notice_listener(&url, &lock).await;
    let (_, m) = dlock_client(&url, RedisOptions::default()).await;
    for wait in [Duration::ZERO, Duration::from_secs(1)] {
        for _ in 0..10 {
            let g = take(&m.lock(&lock), wait).await;
            g.unlock().await.unwrap();
        }
    }
    assert_eq!(
        until_probe(&mut publisher, &mut heard, "probe-1").await,
        Vec::new(),
        "uncontended releases published notices"
    );

    let liveness = RedisOptions::default().waiter_liveness(Duration::from_secs(9));
    let (waiter_side, m2) = dlock_client(&url, liveness).await;
    let holder = take(&m.lock(&lock), Duration::ZERO).await;
    let waiter = m2.lock(&lock);
    let owner = waiter.owner().as_str().to_owned();
    // The scenario: the holder keeps the lock 2 s after the waiter parked.
    let woke = wake_after_release(holder, waiter, &waiter_side, Duration::from_secs(2)).await;
    assert!(
        woke < Duration::from_secs(1),
        "the parked waiter was not woken by a notice ({woke:?})"
    );
    assert_eq!(
        until_probe(&mut publisher, &mut heard, "probe-2").await,
        vec![handover_for(&waiter_side, &lock, &owner)],
        "the release should hand the lock to the parked waiter, once, on its backend's channel"
    );
    m.close().await;
    m2.close().await;
}

/// A client subscribes once, to its own channel, whatever it waits for: waiting on
/// three locks at once adds no subscription, and no lock has a channel of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_subscription_per_client_whatever_it_waits_for() {
    let Some(url) = redis_url() else { return };
    let tag = name("subs");
    let mut raw = raw_connection(&url).await;
    let (_, holder_side) = dlock_client(&url, RedisOptions::default()).await;
    let (waiter_side, m) = dlock_client(&url, RedisOptions::default()).await;
    let mut held = Vec::new();
    let mut waiting = Vec::new();
    for i in 0..3 {
        let lock = format!("{tag}:{i}");
        held.push(take(&holder_side.lock(&lock), Duration::ZERO).await);
        waiting.push(take_in_background(m.lock(&lock)));
    }
    assert!(
        eventually(Duration::from_secs(5), || async {
            waiter_side.acquire_attempts() == 3
        })
        .await,
        "the three waiters did not park"
    );
    let (_, subscribers): (String, i64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(waiter_side.notice_channel())
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(subscribers, 1, "the client's channel");
    let per_lock: Vec<String> = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg(format!("*{tag}*"))
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(per_lock, Vec::<String>::new(), "channels per lock");
    for (guard, task) in held.into_iter().zip(waiting) {
        let got = handed_over(guard, task).await;
        assert!(got < Duration::from_secs(1), "a waiter took {got:?}");
    }
    holder_side.close().await;
    m.close().await;
}

/// Non-fair waiters in separate processes queue on the server: each release hands
/// the lock to one waiter, the longest waiting, with one message on that waiter's own
/// channel (not one per waiting client), so they get the lock in arrival order, no
/// waiter makes an attempt it was not woken for (no herd), and none makes one after
/// it was told (the message carries the grant: one attempt each, the one that
/// queued).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_fair_waiters_are_woken_one_at_a_time_in_arrival_order() {
    let Some(url) = redis_url() else { return };
    let lock = name("herd");
    let mut publisher = raw_connection(&url).await;
    let mut heard = notice_listener(&url, &lock).await;
    // Re-checks 10 s away: within this test only notices wake anyone.
    let options = RedisOptions::default().waiter_liveness(Duration::from_secs(30));
    let mut sides = Vec::new();
    let mut managers = Vec::new();
    for _ in 0..4 {
        let (backend, m) = dlock_client(&url, options.clone()).await;
        sides.push(backend);
        managers.push(m);
    }
    let holder = take(&managers[0].lock(&lock), Duration::ZERO).await;
    let (order_tx, mut order) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    let mut expected = Vec::new();
    for i in 1..4 {
        let waiter = managers[i].lock(&lock);
        expected.push(handover_for(&sides[i], &lock, waiter.owner().as_str()));
        let tx = order_tx.clone();
        tasks.push(tokio::spawn(async move {
            let g = take(&waiter, Duration::from_secs(20)).await;
            tx.send(i).unwrap();
            g.unlock().await.unwrap();
        }));
        // Parked (queued) before the next one arrives.
        assert!(
            eventually(Duration::from_secs(5), || async {
                sides[i].acquire_attempts() == 1
            })
            .await
        );
    }
    holder.unlock().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    let mut got = Vec::new();
    while let Ok(i) = order.try_recv() {
        got.push(i);
    }
    assert_eq!(got, vec![1, 2, 3], "not served in arrival order");
    let attempts: Vec<u64> = sides[1..].iter().map(|b| b.acquire_attempts()).collect();
    assert_eq!(
        attempts,
        vec![1, 1, 1],
        "a waiter attempted again (one attempt each, which queued; the release handed the lock over)"
    );
    assert_eq!(
        until_probe(&mut publisher, &mut heard, "probe").await,
        expected,
        "each release should send one message, to the next waiter's client only"
    );
    for m in managers {
        m.close().await;
    }
}

/// The holder of `lock` as `inspect` shows it: (owner, remaining lease).
async fn holder_of(m: &DistributeLockManager, lock: &str) -> Option<(String, Duration)> {
    let state = m.inspect(lock).await.unwrap()?;
    let h = state.holders.first()?;
    Some((h.owner.as_str().to_owned(), h.remaining_lease?))
}

/// Polls `fut` until `parked` holds (it is queued and waiting), then returns it,
/// not yet done.
async fn park<F: std::future::Future + Unpin>(fut: &mut F, parked: impl Fn() -> bool) {
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

/// A release hands the lock to the queued writer in the same script: right after
/// the release the waiter is the holder (with a provisional lease no longer than its
/// liveness), it holds from the notice on without an attempt of its own, its token
/// is the next one, and the manager's first renewal extends the lease to the full one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_hands_the_lock_to_the_queued_writer() {
    let Some(url) = redis_url() else { return };
    for fair in [false, true] {
        let lock = name("hand-over");
        let (_, m1) = dlock_client(&url, RedisOptions::default()).await;
        // Re-checks 1 s apart: within the test only the notice wakes the waiter.
        let (waiter_side, m2) = dlock_client(&url, RedisOptions::default()).await;
        let pick = |m: &DistributeLockManager| {
            if fair {
                m.fair_lock(&lock)
            } else {
                m.lock(&lock)
            }
        };
        let a = take(&pick(&m1), Duration::ZERO).await;
        let waiter = pick(&m2);
        let mut b = Box::pin(waiter.try_lock(Duration::from_secs(20)));
        park(&mut b, || waiter_side.acquire_attempts() == 1).await;
        let a_token = a.fencing_token();
        a.unlock().await.unwrap();
        let (owner, left) = holder_of(&m1, &lock)
            .await
            .expect("held right after the release");
        assert_eq!(
            owner,
            waiter.owner().as_str(),
            "the release did not hand the lock over (fair: {fair})"
        );
        assert!(
            left <= RedisOptions::default().waiter_liveness,
            "provisional lease {left:?}"
        );
        let g = b.await.unwrap().expect("handed over");
        assert_eq!(
            waiter_side.acquire_attempts(),
            1,
            "the waiter asked again after it was told (fair: {fair})"
        );
        assert!(g.fencing_token() > a_token);
        assert!(
            eventually(Duration::from_secs(5), || async {
                holder_of(&m1, &lock)
                    .await
                    .is_some_and(|(_, left)| left > Duration::from_secs(10))
            })
            .await,
            "the provisional lease was never extended to the full lease"
        );
        assert!(!g.is_lost());
        g.unlock().await.unwrap();
        assert!(
            m1.inspect(&lock).await.unwrap().is_none(),
            "state left behind"
        );
        m1.close().await;
        m2.close().await;
    }
}

/// A handed-over hold on its provisional lease (the waiter's remaining liveness, at
/// least two thirds of 3 s here) is renewed a third into that lease, as any lease —
/// not at once: a hold released within a few hundred ms (the common hand-over)
/// costs no renewal. Held on, it is renewed before its provisional lease ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_over_hold_is_renewed_a_third_into_its_provisional_lease() {
    let Some(url) = redis_url() else { return };
    let lock = name("hand-over-renewal");
    let (_, m1) = dlock_client(&url, RedisOptions::default()).await;
    let (waiter_side, m2) = dlock_client(&url, RedisOptions::default()).await;
    let a = take(&m1.lock(&lock), Duration::ZERO).await;
    let waiter = m2.lock(&lock);
    let mut b = Box::pin(waiter.try_lock(Duration::from_secs(20)));
    park(&mut b, || waiter_side.acquire_attempts() == 1).await;
    a.unlock().await.unwrap();
    let g = b.await.unwrap().expect("handed over");
    let valid = g.valid_until().expect("a lease");
    let left = valid.saturating_duration_since(Instant::now());
    assert!(
        left < RedisOptions::default().waiter_liveness,
        "not on a provisional lease: valid for {left:?}"
    );
    // A third of what is left is at least 500 ms away: nothing is sent before.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        waiter_side.renewal_calls(),
        0,
        "the handed-over hold was renewed at once"
    );
    // Renewed before the provisional lease ends: the guard's validity moves on.
    let deadline = valid;
    while g.valid_until().is_some_and(|v| v <= valid) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        waiter_side.renewal_calls() >= 1 && g.valid_until().is_some_and(|v| v > valid),
        "not renewed within its provisional lease"
    );
    assert!(!g.is_lost());
    g.unlock().await.unwrap();
    m1.close().await;
    m2.close().await;
}

/// A hold the watchdog would not extend at once — a fixed lease (never renewed) with
/// a `max_hold` cap — that a release hands over on its provisional lease gets its
/// whole lease and cap all the same: the manager extends the lease before the guard
/// exists, and the cap and `acquired_at` count from the call, not from a lease before
/// the provisional lease's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_over_fixed_lease_keeps_its_lease_and_cap() {
    let Some(url) = redis_url() else { return };
    let lock = name("hand-over-fixed");
    let (_, m1) = dlock_client(&url, RedisOptions::default()).await;
    let (waiter_side, m2) = dlock_client(&url, RedisOptions::default()).await;
    let a = take(&m1.lock(&lock), Duration::ZERO).await;
    let waiter = m2.lock(&lock);
    let options = dlock_api::LockOptions::new()
        .lease(Duration::from_secs(10))
        .max_hold(Duration::from_secs(8));
    let called = Instant::now();
    let mut b = Box::pin(waiter.try_lock_with(Duration::from_secs(20), &options));
    park(&mut b, || waiter_side.acquire_attempts() == 1).await;
    a.unlock().await.unwrap();
    let g = b.await.unwrap().expect("handed over");
    let now = Instant::now();
    assert!(
        g.acquired_at() >= called,
        "acquired before it was asked for"
    );
    let until = g.valid_until().expect("a lease");
    assert!(
        until > now + Duration::from_secs(6),
        "valid for {:?} only (lease 10 s, cap 8 s)",
        until.saturating_duration_since(now)
    );
    let (_, left) = holder_of(&m1, &lock).await.expect("held");
    assert!(
        left > Duration::from_secs(6),
        "the store holds it {left:?} more"
    );
    assert!(!g.is_lost());
    g.unlock().await.unwrap();
    m1.close().await;
    m2.close().await;
}

/// A waiter dropped after a release handed it the lock, before it heard of it, gives
/// the lock back as it leaves the queue, and the next waiter gets it at once — not
/// when the provisional lease (its 30 s liveness) runs out. The waiter is the backend's
/// own acquire (the SPI), so the backend's leaving does it, not the manager's giving
/// back of a grant whose acquire was dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_dropped_after_a_hand_over_gives_the_lock_back() {
    let Some(url) = redis_url() else { return };
    let lock = name("hand-over-drop");
    let (_, m1) = dlock_client(&url, RedisOptions::default()).await;
    let long = RedisOptions::default().waiter_liveness(Duration::from_secs(30));
    let (b_side, m2) = dlock_client(&url, long.clone()).await;
    let (c_side, m3) = dlock_client(&url, long).await;
    let a = take(&m1.lock(&lock), Duration::ZERO).await;
    let b_req = AcquireRequest::new(
        LockName::new(lock.as_str()).unwrap(),
        OwnerId::new("dropped-waiter"),
        dlock_api::spi::GrantId::new(1),
    )
    .with_deadline(Some(Instant::now() + Duration::from_secs(20)));
    let mut b = Box::pin(b_side.try_acquire(&b_req));
    park(&mut b, || b_side.acquire_attempts() == 1).await;
    let c = take_in_background(m3.lock(&lock));
    assert!(
        eventually(Duration::from_secs(5), || async {
            c_side.acquire_attempts() == 1
        })
        .await
    );
    a.unlock().await.unwrap();
    assert_eq!(
        holder_of(&m1, &lock).await.map(|h| h.0),
        Some("dropped-waiter".to_owned()),
        "handed over to the first waiter"
    );
    let dropped = Instant::now();
    drop(b);
    let got = tokio::time::timeout(Duration::from_secs(5), c)
        .await
        .expect("the lock handed to the dropped waiter was not given back")
        .unwrap();
    assert!(got.duration_since(dropped) < Duration::from_secs(2));
    assert!(
        eventually(Duration::from_secs(2), || async {
            m1.inspect(&lock).await.unwrap().is_none()
        })
        .await,
        "state left behind"
    );
    for m in [m1, m2, m3] {
        m.close().await;
    }
}

/// A hand-over notice whose token is no greater than the fencing counter the
/// waiter's last refusal saw is stale (that hand-over lapsed before the refusal) and
/// is not taken: the waiter asks again and, the lock being held, keeps waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_hand_over_notice_is_not_taken() {
    let Some(url) = redis_url() else { return };
    let lock = name("hand-over-stale");
    let mut raw = raw_connection(&url).await;
    let (_, m1) = dlock_client(&url, RedisOptions::default()).await;
    let (b_side, m2) = dlock_client(&url, RedisOptions::default()).await;
    let a = take(&m1.lock(&lock), Duration::ZERO).await;
    let b_lock = m2.lock(&lock);
    let mut b = Box::pin(b_lock.try_lock(Duration::from_secs(20)));
    park(&mut b, || b_side.acquire_attempts() == 1).await;
    let (waiter, _) = queue_head(raw.clone(), &format!("dlock:{{{lock}}}:ql"))
        .await
        .expect("queued");
    // A hand-over of the lock at the token the refusal saw (the holder's).
    let (channel, notice) = notice_for(&b_side, &lock, &waiter);
    let _: i64 = redis::cmd("PUBLISH")
        .arg(channel)
        .arg(format!("{notice}\n{} 30000", a.fencing_token().get()))
        .query_async(&mut raw)
        .await
        .unwrap();
    // (The waiter runs only while the test polls it.)
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut b)
            .await
            .is_err(),
        "the waiter took a stale hand-over while the lock was held"
    );
    assert_eq!(b_side.acquire_attempts(), 2, "the waiter did not ask again");
    a.unlock().await.unwrap();
    let g = tokio::time::timeout(Duration::from_secs(5), b)
        .await
        .expect("granted after the release")
        .unwrap()
        .expect("granted");
    g.unlock().await.unwrap();
    m1.close().await;
    m2.close().await;
}

/// A waiter that died queued (it never re-checks, never leaves) is handed the lock by
/// the release all the same; it holds it for at most its liveness, after which the
/// next waiter gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_head_holds_a_handed_over_lock_at_most_its_liveness() {
    let Some(url) = redis_url() else { return };
    let lock = name("hand-over-dead");
    let (_, m1) = dlock_client(&url, RedisOptions::default()).await;
    let liveness = Duration::from_millis(900);
    let (b_side, m2) = dlock_client(&url, RedisOptions::default().waiter_liveness(liveness)).await;
    let (c_side, m3) = dlock_client(&url, RedisOptions::default()).await;
    let a = take(&m1.lock(&lock), Duration::ZERO).await;
    let b_lock = m2.lock(&lock);
    let mut b = Box::pin(b_lock.try_lock(Duration::from_secs(20)));
    park(&mut b, || b_side.acquire_attempts() == 1).await;
    let c = take_in_background(m3.lock(&lock));
    assert!(
        eventually(Duration::from_secs(5), || async {
            c_side.acquire_attempts() == 1
        })
        .await
    );
    // The waiter dies: its future is never polled or dropped again.
    std::mem::forget(b);
    let released = Instant::now();
    a.unlock().await.unwrap();
    let (owner, left) = holder_of(&m1, &lock).await.expect("handed over");
    assert_eq!(owner, b_lock.owner().as_str());
    assert!(
        left <= liveness,
        "provisional lease {left:?} > liveness {liveness:?}"
    );
    let got = tokio::time::timeout(Duration::from_secs(5), c)
        .await
        .expect("the next waiter never got the lock")
        .unwrap();
    let waited = got.duration_since(released);
    // At most the dead head's liveness, plus the next waiter's re-check interval
    // (a third of its 3 s liveness) and slack.
    assert!(
        waited < liveness + Duration::from_millis(1500),
        "waited {waited:?}"
    );
    for m in [m1, m2, m3] {
        m.close().await;
    }
}

/// The first member of the queue-liveness key `alive_key` and its liveness deadline
/// (server ms), if anyone is queued.
async fn queue_head(
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

/// A queued waiter woken while the lock is still taken re-checks without rewriting
/// its queue entry when it refreshed it less than a third of its liveness ago (a hot
/// lock's head is woken on every release), and still refreshes it in time to stay
/// live; it gets the lock once the holder leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_woken_waiter_rewrites_its_queue_entry_only_when_due() {
    let Some(url) = redis_url() else { return };
    let lock = name("refresh");
    let alive_key = format!("dlock:{{{lock}}}:ql");
    let mut raw = raw_connection(&url).await;
    let (_, holder_side) = dlock_client(&url, RedisOptions::default()).await;
    let liveness = Duration::from_millis(1500);
    let options = RedisOptions::default().waiter_liveness(liveness);
    let (waiter_side, m) = dlock_client(&url, options).await;
    let holder = take(&holder_side.lock(&lock), Duration::ZERO).await;
    let task = take_in_background(m.lock(&lock));

    // The waiter's owner and liveness deadline (server ms), once it is queued.
    let probe = raw.clone();
    let queued = || queue_head(probe.clone(), &alive_key);
    assert!(
        eventually(Duration::from_secs(5), || async {
            queued().await.is_some()
        })
        .await
    );
    let (owner, deadline) = queued().await.unwrap();
    assert_eq!(waiter_side.acquire_attempts(), 1);
    // A notice naming the waiter, as a release would send: it re-checks at once.
    let (channel, notice) = notice_for(&waiter_side, &lock, &owner);
    let _: i64 = redis::cmd("PUBLISH")
        .arg(channel)
        .arg(notice)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(
        eventually(Duration::from_secs(2), || async {
            waiter_side.acquire_attempts() == 2
        })
        .await,
        "the named waiter did not re-check"
    );
    // The re-check was sent on the waiter's connection; a call sent after it on the
    // same connection returns after the re-check's script has run.
    waiter_side
        .inspect(&LockName::new(lock.as_str()).unwrap())
        .await
        .unwrap();
    assert_eq!(waiter_side.acquire_attempts(), 2);
    let (_, after) = queued().await.unwrap();
    assert_eq!(
        after, deadline,
        "a fresh entry was rewritten by the re-check"
    );
    // Its own re-checks (every third of the liveness) keep it live.
    assert!(
        eventually(Duration::from_secs(3), || async {
            queued().await.is_some_and(|(_, d)| d > deadline)
        })
        .await,
        "the waiter's liveness was never refreshed"
    );
    holder.unlock().await.unwrap();
    task.await.unwrap();
    holder_side.close().await;
    m.close().await;
}

/// A queued fair waiter that polls (no pub/sub) with a backoff longer than its
/// liveness still re-checks often enough to stay live in the queue (it would otherwise
/// be purged as dead and lose its place), and gets the lock soon after the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_polling_fair_waiter_stays_live_whatever_its_backoff() {
    let Some(url) = redis_url() else { return };
    let lock = name("slowpoll");
    let alive_key = format!("dlock:{{{lock}}}:ql");
    let raw = raw_connection(&url).await;
    let (_, holder_side) = dlock_client(&url, RedisOptions::default()).await;
    let options = RedisOptions::default()
        .polling(dlock_api::spi::Backoff::constant(Duration::from_secs(10)))
        .waiter_liveness(Duration::from_millis(1500));
    let (_, m) = dlock_client(&url, options).await;
    let holder = take(&holder_side.fair_lock(&lock), Duration::ZERO).await;
    let task = take_in_background(m.fair_lock(&lock));
    // The waiter's liveness deadline and the server's clock, both in ms.
    let margin = || {
        let mut raw = raw.clone();
        let alive_key = alive_key.clone();
        async move {
            let entry = queue_head(raw.clone(), &alive_key).await;
            let (secs, micros): (u64, u64) =
                redis::cmd("TIME").query_async(&mut raw).await.unwrap();
            let now = (secs * 1000 + micros / 1000) as f64;
            entry.map(|(_, deadline)| deadline - now)
        }
    };
    assert!(
        eventually(Duration::from_secs(5), || async {
            margin().await.is_some()
        })
        .await
    );
    // Over almost three liveness periods the entry stays live (refreshed by re-checks).
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let left = margin().await.expect("the waiter left the queue");
        assert!(
            left > 0.0,
            "the waiter's liveness lapsed ({left} ms) while it waited"
        );
    }
    let got = handed_over(holder, task).await;
    assert!(
        got < Duration::from_secs(1),
        "the waiter took {got:?} after the release"
    );
    holder_side.close().await;
    m.close().await;
}

/// An owner that asks again (a retry whose first reply was lost) gets the lock it
/// holds with the same token, whether or not it would wait, and the lease renewed;
/// another owner — even one whose name the first owner's starts with — is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holder_asking_again_gets_the_same_token() {
    let Some(url) = redis_url() else { return };
    let backend = RedisBackend::connect(&url).await.unwrap();
    let lock = LockName::new(name("again")).unwrap();
    let ask = |owner: &str, wait: bool| {
        AcquireRequest::new(
            lock.clone(),
            OwnerId::new(owner),
            dlock_api::spi::GrantId::new(1),
        )
        .with_lease(Duration::from_secs(5))
        .with_context(dlock_api::spi::Bytes::from_static(b"ctx|1"))
        .with_deadline(wait.then(|| Instant::now() + Duration::from_millis(200)))
    };
    let first = backend.try_acquire(&ask("owner-12", false)).await.unwrap();
    let token = first.token().expect("granted");
    for wait in [false, true] {
        let again = backend.try_acquire(&ask("owner-12", wait)).await.unwrap();
        assert_eq!(again.token(), Some(token), "wait {wait}: {again:?}");
    }
    for other in ["owner-1", "owner-13", "owner-123", "owner-12x"] {
        let refused = backend.try_acquire(&ask(other, false)).await.unwrap();
        assert!(!refused.is_acquired(), "{other} got the lock: {refused:?}");
    }
    let release = ReleaseRequest::new(
        lock.clone(),
        OwnerId::new("owner-12"),
        dlock_api::spi::GrantId::new(1),
        LockMode::Exclusive,
        token,
    );
    assert_eq!(
        backend.release(&release).await.unwrap(),
        ReleaseResult::Released
    );
    let next = backend.try_acquire(&ask("owner-1", false)).await.unwrap();
    assert!(next.token().is_some_and(|t| t > token), "{next:?}");
}

/// A reader's hold is kept for its whole lease, counted from when it was asked for:
/// its stored end is the server's whole millisecond at the grant plus the lease, and
/// the request may have been sent up to a millisecond after that millisecond began,
/// so the reader may be purged only once that last millisecond has passed (a purge
/// on reaching it — an inclusive bound on a truncated clock — let a writer in up to
/// 1 ms early). A fair writer (whose script purges readers) asks in a tight loop;
/// its token, the server's clock in µs at its grant, must lie past the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_is_not_purged_before_its_last_millisecond_has_passed() {
    let Some(url) = redis_url() else { return };
    for round in 0..5 {
        let (end_ms, granted_us) =
            holder_end_and_next_writer(&url, LockMode::Shared, Fairness::Fair).await;
        assert!(
            granted_us / 1000 > end_ms,
            "round {round}: a writer was granted at {granted_us} µs, in the reader's last millisecond {end_ms}"
        );
    }
}

/// A lone holder's horizon (the exclusive key `R`) lasts through the holder's last
/// millisecond and no less (so a sole holder found under the horizon is live — the
/// shared release's fast path relies on it). A non-fair writer, whose fast path takes
/// the name by `SET NX` alone (the key's own expiry decides, nothing is purged), asks
/// in a tight loop beside a permit holder that took an idle semaphore (the permits'
/// fast path) and beside a reader (the general path); its token must lie past the
/// holder's last millisecond.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_holders_horizon_lasts_through_its_last_millisecond() {
    let Some(url) = redis_url() else { return };
    for round in 0..6 {
        let (mode, what) = if round % 2 == 0 {
            (LockMode::Permits(1), "permit holder")
        } else {
            (LockMode::Shared, "reader")
        };
        let (end_ms, granted_us) = holder_end_and_next_writer(&url, mode, Fairness::NonFair).await;
        assert!(
            granted_us / 1000 > end_ms,
            "round {round}: a writer was granted at {granted_us} µs, in the {what}'s last millisecond {end_ms}"
        );
    }
}

/// On a new name: a holder in `mode` (of 3 permits, for permits) with a 100 ms
/// lease, then an exclusive request with `fairness` asked in a tight loop (bounded:
/// 2 s) until granted. Returns the holder's stored end (its last ms) and the writer's
/// token (the server's clock in µs at its grant).
async fn holder_end_and_next_writer(url: &str, mode: LockMode, fairness: Fairness) -> (u64, u64) {
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
async fn zrange_with_scores(
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

/// Another reader coming and going through a reader's last millisecond (see above)
/// has its releases answered, and the first reader stays until its end has passed:
/// the readers' horizon lasts through the last reader's last millisecond (a zero
/// TTL there deleted the readers and failed the release).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_coming_and_going_in_a_readers_last_millisecond_keep_it() {
    let Some(url) = redis_url() else { return };
    let backend = RedisBackend::connect(&url).await.unwrap();
    let mut c = raw_connection(&url).await;
    let mut in_last_ms = 0;
    // At least 10 rounds, and more (at most 60) until a release fell in a first
    // reader's last millisecond: a cycle of several ms on a loaded machine may
    // step over that millisecond in 10 rounds (seen once in a full run).
    for round in 0..60 {
        if round >= 10 && in_last_ms > 0 {
            break;
        }
        let lock = LockName::new(name("reader-horizon")).unwrap();
        let ask = |owner: &str, lease: u64| {
            AcquireRequest::new(
                lock.clone(),
                OwnerId::new(owner),
                dlock_api::spi::GrantId::new(1),
            )
            .with_mode(LockMode::Shared)
            .with_lease(Duration::from_millis(lease))
        };
        let first = backend.try_acquire(&ask("first", 30)).await.unwrap();
        assert!(first.is_acquired(), "round {round}: {first:?}");
        let readers = format!("dlock:{{{}}}:r", lock.as_str());
        let first_member = first_member(&mut c, &readers).await;
        let end_ms: u64 = redis::cmd("ZSCORE")
            .arg(&readers)
            .arg(&first_member)
            .query_async(&mut c)
            .await
            .unwrap();
        // The other reader comes and goes until the server's clock is past the
        // first one's end (bounded). Its own lease outlasts a stalled round trip
        // (a 10 ms one lapsed between acquire and release on a loaded machine); its
        // release leaves the first reader's end the horizon all the same.
        for cycle in 0..100_000 {
            let other = backend.try_acquire(&ask("other", 1000)).await.unwrap();
            let token = other.token().expect("readers share");
            let release = ReleaseRequest::new(
                lock.clone(),
                OwnerId::new("other"),
                dlock_api::spi::GrantId::new(1),
                LockMode::Shared,
                token,
            );
            let released = backend.release(&release).await;
            let now_ms = server_ms(&mut c).await;
            assert!(
                matches!(released, Ok(ReleaseResult::Released)),
                "round {round}: a reader's release before {now_ms} ms (the first one ends at {end_ms}): {released:?}"
            );
            if now_ms == end_ms {
                in_last_ms += 1;
            }
            if now_ms > end_ms {
                break;
            }
            assert!(
                cycle < 99_999,
                "round {round}: the clock never passed {end_ms}"
            );
        }
    }
    // The check above had work to do: releases in a first reader's last ms.
    assert!(
        in_last_ms > 0,
        "no release fell in a first reader's last millisecond"
    );
}

/// The first member of the sorted set `key` ("" when it is empty).
async fn first_member(c: &mut redis::aio::MultiplexedConnection, key: &str) -> String {
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
async fn server_ms(c: &mut redis::aio::MultiplexedConnection) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query_async(c).await.unwrap();
    s * 1000 + us / 1000
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

/// The checks for one TLS deployment at `url`; `plain` is the same servers without TLS.
async fn tls_refusals(url: &str, plain: &str) {
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
    let g = take(&m.lock(&name("tls")), Duration::ZERO).await;
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
    let lock = m.lock(&name("slow-reply"));
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

/// A writer queued behind a reader holds new readers back for as long as it waits,
/// also when its re-checks are far apart (a long liveness): readers stood back only
/// for a writer mark that expired after 1 s, while the writer re-checked every third
/// of its liveness.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_writer_holds_back_new_readers_however_rarely_it_rechecks() {
    let Some(url) = redis_url() else { return };
    let lock = name("rarely");
    let (_, readers) = dlock_client(&url, RedisOptions::default()).await;
    let options = RedisOptions::default().waiter_liveness(Duration::from_secs(30));
    let (_, writer_side) = dlock_client(&url, options).await;
    let first = take(readers.read_write_lock(&lock).read(), Duration::ZERO).await;
    let writer = take_in_background(writer_side.read_write_lock(&lock).write().clone());
    assert!(
        eventually(Duration::from_secs(5), || async {
            let state = readers.inspect(&lock).await.unwrap();
            state.and_then(|s| s.waiters).unwrap_or(0) == 1
        })
        .await,
        "the writer never queued"
    );
    let late_reader = readers.read_write_lock(&lock).read().clone();
    // Well past the old mark's 1 s, well inside the writer's first re-check (10 s).
    let until = Instant::now() + Duration::from_millis(2500);
    let mut tries = 0;
    while Instant::now() < until {
        tries += 1;
        let passed = late_reader.try_lock(Duration::ZERO).await.unwrap();
        assert!(
            passed.is_none(),
            "a new reader passed the queued writer (try {tries})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    first.unlock().await.unwrap();
    writer.await.unwrap();
    readers.close().await;
    writer_side.close().await;
}

/// Permit holders keep the name from an exclusive lock through its key (value `R`,
/// the holders' horizon): while any holds, a lock is refused; the last holder's
/// release frees the name at once (the shared release's fast path, nobody queued).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_permit_release_frees_the_name_at_once() {
    let Some(url) = redis_url() else { return };
    let (_, m) = dlock_client(&url, RedisOptions::default()).await;
    let n = name("sem-frees");
    let sem = m.semaphore(&n, 3);
    let a = take_permits(&sem, 1).await;
    let b = take_permits(&sem, 2).await;
    a.release().await.unwrap();
    let refused = m.lock(&n).try_lock(Duration::ZERO).await.unwrap();
    assert!(refused.is_none(), "a lock was granted past a permit holder");
    b.release().await.unwrap();
    let granted = m.lock(&n).try_lock(Duration::ZERO).await.unwrap();
    assert!(
        granted.is_some(),
        "the name stayed taken after the last release"
    );
    granted.unwrap().unlock().await.unwrap();
    m.close().await;
}

/// The converse: an exclusive holder keeps an idle semaphore's name from its first
/// permit holder (the permits' fast path takes the name with `SET NX`, never over a
/// writer's key), and the permits are granted once the writer is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_keeps_an_idle_semaphore_from_its_first_holder() {
    let Some(url) = redis_url() else { return };
    let (_, m) = dlock_client(&url, RedisOptions::default()).await;
    let n = name("sem-writer");
    let writer = take(&m.lock(&n), Duration::ZERO).await;
    let sem = m.semaphore(&n, 3);
    let refused = sem.try_acquire(1, Duration::ZERO).await.unwrap();
    assert!(
        refused.is_none(),
        "a permit was granted past an exclusive holder"
    );
    assert!(
        !writer.is_lost(),
        "the writer lost its lock to a permit holder"
    );
    writer.unlock().await.unwrap();
    let permit = take_permits(&sem, 1).await;
    permit.release().await.unwrap();
    m.close().await;
}

/// Backends built on the application's client and on its connection manager share
/// locks with one built from the URL, and wake their waiters by release notices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_on_the_applications_client_share_locks_with_one_from_the_url() {
    let Some(url) = redis_url() else { return };
    let client = redis::Client::open(url.as_str()).unwrap();
    let conn = client
        .get_connection_manager_with_config(
            redis::aio::ConnectionManagerConfig::new().set_response_timeout(None),
        )
        .await
        .unwrap();
    let built = [
        RedisBackend::from_client(client.clone(), RedisOptions::default())
            .await
            .unwrap(),
        RedisBackend::from_connection_manager(client, conn, RedisOptions::default())
            .await
            .unwrap(),
    ];
    let (_, theirs) = dlock_client(&url, RedisOptions::default()).await;
    for backend in built {
        assert!(backend.notices_connected(), "no release notices");
        let mine = DistributeLockManager::builder(backend.clone())
            .build()
            .unwrap();
        let lock = name("app-client");
        let held = take(&theirs.lock(&lock), Duration::ZERO).await;
        assert!(mine
            .lock(&lock)
            .try_lock(Duration::ZERO)
            .await
            .unwrap()
            .is_none());
        // A waiter on the application's client is woken by the release's notice.
        let woke = wake_after_release(held, mine.lock(&lock), &backend, Duration::ZERO).await;
        assert!(woke < Duration::from_millis(500), "woken after {woke:?}");
        mine.close().await;
    }
    theirs.close().await;
}

/// A backend built on the application's Cluster client (with clients for its nodes)
/// shares locks with one built from the `redis+cluster://` URL, wakes its waiters by
/// release notices and lists the locks held on every node; without a node client it
/// is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_on_the_applications_cluster_client_shares_locks_with_one_from_the_url() {
    if !selected().iter().any(|l| l == "redis-cluster") {
        eprintln!("redis-cluster is not selected in DLOCK_TEST_BACKENDS; nothing to check here");
        return;
    }
    let url = server_url("redis-cluster").unwrap();
    let seeds: Vec<String> = url
        .trim_start_matches("redis+cluster://")
        .split(',')
        .map(|h| format!("redis://{h}"))
        .collect();
    let cluster = || redis::cluster::ClusterClient::new(seeds.clone()).unwrap();
    let err = RedisBackend::from_cluster_client(cluster(), Vec::new(), RedisOptions::default())
        .await
        .map(drop)
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err:#}");
    let nodes = seeds
        .iter()
        .map(|u| redis::Client::open(u.as_str()).unwrap())
        .collect();
    let backend = RedisBackend::from_cluster_client(cluster(), nodes, RedisOptions::default())
        .await
        .unwrap();
    assert!(backend.notices_connected(), "no release notices");
    let (_, theirs) = dlock_client(&url, RedisOptions::default()).await;
    let mine = DistributeLockManager::builder(backend.clone())
        .build()
        .unwrap();
    // Names spread over the Cluster's slots: every node holds some.
    let prefix = name("app-cluster");
    let held: Vec<LockGuard> = {
        let mut held = Vec::new();
        for i in 0..12 {
            held.push(take(&theirs.lock(&format!("{prefix}-{i}")), Duration::ZERO).await);
        }
        held
    };
    let listed = dlock_api::spi::LockAdmin::live_locks(&backend, &prefix)
        .await
        .unwrap();
    assert_eq!(
        listed, 12,
        "locks listed through the application's node clients"
    );
    let mut held = held.into_iter();
    let first = held.next().unwrap();
    assert!(mine
        .lock(&format!("{prefix}-0"))
        .try_lock(Duration::ZERO)
        .await
        .unwrap()
        .is_none());
    let woke = wake_after_release(
        first,
        mine.lock(&format!("{prefix}-0")),
        &backend,
        Duration::ZERO,
    )
    .await;
    assert!(woke < Duration::from_millis(500), "woken after {woke:?}");
    for g in held {
        g.unlock().await.unwrap();
    }
    mine.close().await;
    theirs.close().await;
}

/// The lease left on a key, as the server counts it.
async fn pttl(c: &mut redis::aio::MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query_async(c).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_renews_each_hold_as_a_single_renewal_would() {
    use dlock_api::spi::{GrantId, RenewRequest, RenewResult};
    let Some(url) = redis_url() else { return };
    let backend = RedisBackend::connect(&url).await.unwrap();
    let mut raw = raw_connection(&url).await;
    let batch = backend
        .batch_renew()
        .expect("a single node renews in batches");
    let short = Duration::from_secs(2);
    let take_as = |lock: &LockName, owner: &str, mode: LockMode| {
        let req = AcquireRequest::new(lock.clone(), OwnerId::new(owner), GrantId::new(1))
            .with_lease(short)
            .with_mode(mode);
        let backend = backend.clone();
        async move {
            backend
                .try_acquire(&req)
                .await
                .unwrap()
                .token()
                .expect("granted")
        }
    };
    let locks: Vec<LockName> = (0..4)
        .map(|i| LockName::new(name(&format!("batch{i}"))).unwrap())
        .collect();
    // 0 and 1: held by "a"; 2: held by "b"; 3: read by "a" (renewed on its own).
    let mut tokens = Vec::new();
    for (lock, owner, mode) in [
        (&locks[0], "a", LockMode::Exclusive),
        (&locks[1], "a", LockMode::Exclusive),
        (&locks[2], "b", LockMode::Exclusive),
        (&locks[3], "a", LockMode::Shared),
    ] {
        tokens.push(take_as(lock, owner, mode).await);
    }
    let long = Duration::from_secs(60);
    let renew = |i: usize, owner: &str, mode: LockMode| {
        RenewRequest::new(
            locks[i].clone(),
            OwnerId::new(owner),
            GrantId::new(1),
            mode,
            long,
            tokens[i],
        )
    };
    let reqs = [
        renew(0, "a", LockMode::Exclusive),
        renew(2, "a", LockMode::Exclusive), // not a's: untouched
        renew(3, "a", LockMode::Shared),
        renew(1, "a", LockMode::Exclusive),
        renew(1, "b", LockMode::Exclusive), // not b's
    ];
    let calls = backend.renewal_calls();
    let answers: Vec<RenewResult> = batch
        .renew_batch(&reqs)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let renewed = |r: &RenewResult| matches!(r, RenewResult::Renewed { .. });
    let shape: Vec<bool> = answers.iter().map(renewed).collect();
    assert_eq!(shape, [true, false, true, true, false], "{answers:?}");
    // The exclusive ones went as one call; the reader's on its own.
    assert_eq!(backend.renewal_calls() - calls, 2);
    let key = |lock: &LockName, suffix: &str| format!("dlock:{{{}}}{suffix}", lock.as_str());
    for i in [0, 1] {
        let left = pttl(&mut raw, &key(&locks[i], ":x")).await;
        assert!(
            left > 50_000,
            "lock {i} has {left} ms left, not the renewed lease"
        );
    }
    let other = pttl(&mut raw, &key(&locks[2], ":x")).await;
    assert!(
        (1..=2_000).contains(&other),
        "b's lock was changed by a's renewal: {other} ms left"
    );
    let reader: f64 = redis::cmd("ZSCORE")
        .arg(key(&locks[3], ":r"))
        .arg(reqs[2].holder().as_str())
        .query_async(&mut raw)
        .await
        .unwrap();
    let now_ms: (u64, u64) = redis::cmd("TIME").query_async(&mut raw).await.unwrap();
    let now_ms = now_ms.0 * 1000 + now_ms.1 / 1000;
    assert!(
        reader > (now_ms + 50_000) as f64,
        "the reader's lease was not renewed: ends {reader}, now {now_ms}"
    );
    assert!(batch.renew_batch(&[]).await.is_empty());

    // A writer beside its owner's own reader: the write key lasts at least as long
    // as the reader, whatever lease the writer's renewal asks for.
    let both = LockName::new(name("batch-both")).unwrap();
    let write = take_as(&both, "a", LockMode::Exclusive).await;
    let read = AcquireRequest::new(both.clone(), OwnerId::new("a"), GrantId::new(2))
        .with_lease(long)
        .with_mode(LockMode::Shared)
        .with_alongside(Some(GrantId::new(1)));
    assert!(backend.try_acquire(&read).await.unwrap().is_acquired());
    let writer = |lease: Duration| {
        RenewRequest::new(
            both.clone(),
            OwnerId::new("a"),
            GrantId::new(1),
            LockMode::Exclusive,
            lease,
            write,
        )
    };
    // A shorter lease than the reader's: the key still lasts as long as the reader.
    // A longer one: the key lasts as long as the writer's renewed lease.
    for (lease, at_least) in [(short, 50_000), (Duration::from_secs(120), 100_000)] {
        let answers: Vec<RenewResult> = batch
            .renew_batch(&[writer(lease), reqs[0].clone()])
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert!(answers.iter().all(renewed), "{answers:?}");
        let left = pttl(&mut raw, &key(&both, ":x")).await;
        assert!(
            left > at_least,
            "renewed for {lease:?} beside a 60 s reader, the writer's key ends in {left} ms"
        );
    }
}

/// Counts the renewals handlers hear of.
#[derive(Default)]
struct RenewalCount(std::sync::atomic::AtomicUsize);

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_renews_many_holds_in_few_calls() {
    let Some(url) = redis_url() else { return };
    let backend = RedisBackend::connect(&url).await.unwrap();
    let count = std::sync::Arc::new(RenewalCount::default());
    let lease = Duration::from_millis(600);
    let m = DistributeLockManager::builder(backend.clone())
        .lease(lease)
        .with_shared_handler(count.clone())
        .build()
        .unwrap();
    const HOLDS: usize = 40;
    let tag = name("many");
    let mut guards = Vec::new();
    for i in 0..HOLDS {
        guards.push(m.lock(&format!("{tag}-{i}")).lock().await.unwrap());
        // Taken over ~80 ms: their renewals are not due at the same instant.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let calls = backend.renewal_calls();
    // Every hold renews every 200 ms: by the time each has renewed 5 times over,
    // one call per hold and renewal would be 200 calls.
    let renewals = || count.0.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        eventually(Duration::from_secs(3), || async { renewals() >= 5 * HOLDS }).await,
        "{HOLDS} holds renewing every 200 ms made {} renewals in 3 s",
        renewals()
    );
    let sent = backend.renewal_calls() - calls;
    let renewed = renewals() as u64;
    assert!(
        sent * 4 <= renewed,
        "{renewed} renewals took {sent} calls; in batches they take a few per round"
    );
    eprintln!("{renewed} renewals of {HOLDS} holds in {sent} calls");
    for g in &guards {
        g.check().unwrap();
        assert!(
            holder_of(&m, g.name().as_str()).await.is_some(),
            "{} is no longer held",
            g.name()
        );
    }
    for g in guards {
        g.unlock().await.unwrap();
    }
    m.close().await;
}
