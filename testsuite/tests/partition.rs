//! A leader partitioned from its store: every connection of its client black-holed
//! by the project's fault proxy (bytes swallowed, nothing reset — the leader's
//! process runs on, its renewals go nowhere). On every selected backend whose
//! connections a proxy can carry (not SQLite's file, not Redis Cluster or Sentinel,
//! whose servers hand out their own addresses), one after another:
//!
//! * the partitioned leader's lost signal fires, and before anyone else leads: on a
//!   lease backend at least the loss margin's floor (1 % of the lease) before, as a
//!   lock's guard (the same signal, the same margin);
//! * the candidate queued on a healthy connection then leads, with a greater token;
//! * once the partition heals and both are done, nothing is left behind.
//!
//! And a semaphore waiter cut off the same way while queued — dead, as the store
//! sees it — is skipped: the waiter queued behind it gets the permit it waits for
//! within the dead one's liveness (3 s for SQL and Redis; ZooKeeper: its session, etcd:
//! its lease) and [`SLACK`] of the cut.
//!
//! And a holder whose connections are reset while it lets go of its locks (a guard
//! dropped, an `unlock`): once they pass again, its releases reach the store within
//! [`SLACK`] — retried, not left to a lease or session far longer than the case.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_api::{DistributeLockManager, LostReason};
use testsuite::backends::{self, TestUrl};
use testsuite::conformance::{eventually, waiting};
use testsuite::lockcheck::nemesis::Nemesis;
use testsuite::lockcheck::servers::not_applicable;
use testsuite::proxy::{proxy_every_host, Fault, FaultProxy};
use testsuite::TestBackend;

/// The terms' lease; ZooKeeper sessions time out after the same time.
const LEASE: Duration = Duration::from_secs(2);

/// How long the next leader may take after the partitioned one's term could end
/// (the store's expiry, a ZooKeeper server's expiry tick, the queued candidate's
/// wake-up).
const SLACK: Duration = Duration::from_secs(3);

/// The label's URL with ZooKeeper's session timeout set to `lease`.
fn url_for(label: &str, lease: Duration) -> TestUrl {
    let url = backends::server_url(label).expect("a URL for the label");
    if label.starts_with("zk") {
        // zk-tls's URL has a query already (its TLS files).
        let sep = if url.as_str().contains('?') { '&' } else { '?' };
        url.with_suffix(&format!("{sep}session_timeout={}ms", lease.as_millis()))
    } else {
        url
    }
}

/// A test backend of `label` whose every host is reached through a fault proxy of
/// its own, and the proxies.
async fn behind_proxies(label: &str, url: &TestUrl) -> (Arc<dyn TestBackend>, Vec<FaultProxy>) {
    let (proxied, proxies) = proxy_every_host(url.as_str())
        .await
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    let backend = backends::open_at(label, TestUrl::fixed(proxied))
        .await
        .unwrap_or_else(|e| panic!("{label}: open through the proxies: {e}"));
    (backend, proxies)
}

/// One label's case world: a test backend reached directly and one reached through
/// fault proxies (one per host), a namespace of its own, and the managers' lease
/// (ZooKeeper: session timeout).
struct Partition {
    label: String,
    direct: Arc<dyn TestBackend>,
    proxied: Arc<dyn TestBackend>,
    proxies: Vec<FaultProxy>,
    namespace: String,
    lease: Duration,
}

impl Partition {
    /// The world with [`LEASE`].
    async fn open(label: &str) -> Self {
        Self::open_lasting(label, LEASE).await
    }

    async fn open_lasting(label: &str, lease: Duration) -> Self {
        let url = url_for(label, lease);
        let direct = backends::open_at(label, url.clone())
            .await
            .unwrap_or_else(|e| panic!("{label}: open: {e}"));
        let (proxied, proxies) = behind_proxies(label, &url).await;
        Partition {
            label: label.to_owned(),
            direct,
            proxied,
            proxies,
            namespace: format!("part{:016x}:", fastrand::u64(..)),
            lease,
        }
    }

    /// A manager on a new client of `backend`, in the case's namespace.
    async fn manager(&self, backend: &Arc<dyn TestBackend>) -> DistributeLockManager {
        let client = backend.client().await.expect("a client");
        DistributeLockManager::builder(client)
            .namespace(self.namespace.clone())
            .lease(self.lease)
            .build()
            .expect("manager builds")
    }

    /// A manager on a healthy connection.
    async fn healthy(&self) -> DistributeLockManager {
        self.manager(&self.direct).await
    }

    /// A manager whose every connection the proxies carry.
    async fn behind(&self) -> DistributeLockManager {
        self.manager(&self.proxied).await
    }

    /// Black-holes every proxied connection; the instant it did.
    fn cut(&self) -> Instant {
        let at = Instant::now();
        self.set(Fault::Blackhole);
        at
    }

    /// Applies `fault` to every proxy.
    fn set(&self, fault: Fault) {
        for p in &self.proxies {
            p.set(fault);
        }
    }

    /// Lets traffic pass again, closes `managers` and checks nothing is left behind.
    async fn heal_and_finish(&self, managers: &[&DistributeLockManager]) {
        self.set(Fault::Pass);
        for m in managers {
            m.close().await;
        }
        let clean = eventually(Duration::from_secs(10), || async {
            self.direct.live_state(&self.namespace).await.ok() == Some(0)
        })
        .await;
        assert!(
            clean,
            "{}: state left behind after the partition healed",
            self.label
        );
    }
}

/// Waits (bounded) until `name` shows at least `n` waiters on `m`.
async fn waiters_shown(m: &DistributeLockManager, name: &str, n: usize) -> bool {
    eventually(Duration::from_secs(5), || async {
        waiting(m, name).await >= n
    })
    .await
}

/// Runs `case` on every selected backend a proxy can carry, one after another.
async fn on_every_proxyable_label<F, Fut>(case: F)
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for label in testsuite::runner::selected() {
        if let Some(why) = not_applicable(Nemesis::Proxy, &label) {
            println!("{label}: not applicable ({why})");
            continue;
        }
        case(label).await;
    }
}

/// The case on one label (panics with what went wrong).
async fn partitioned_leader(label: String) {
    let label = label.as_str();
    let world = Partition::open(label).await;
    let (leader_m, rival_m) = (world.behind().await, world.healthy().await);
    let lease_backend = rival_m.capabilities().lease;

    let term = tokio::time::timeout(SLACK, leader_m.election("p").campaign("partitioned"))
        .await
        .unwrap_or_else(|_| panic!("{label}: the first candidate did not lead"))
        .expect("campaign");
    let first = term.fencing_token();
    let election = rival_m.election("p");
    let next = tokio::spawn(async move {
        let led = election.campaign("healthy").await;
        (led, Instant::now())
    });
    assert!(
        waiters_shown(&rival_m, "p", 1).await,
        "{label}: the second candidate never showed as waiting"
    );

    let cut = world.cut();
    let reason = tokio::time::timeout(LEASE + SLACK, term.lost())
        .await
        .unwrap_or_else(|_| panic!("{label}: the partitioned leader was never told of its loss"));
    let lost_at = Instant::now();
    assert!(
        matches!(
            reason,
            LostReason::LeaseExpired | LostReason::SessionExpired
        ),
        "{label}: lost for {reason}"
    );
    let (led, led_at) = tokio::time::timeout(LEASE + SLACK * 2, next)
        .await
        .unwrap_or_else(|_| panic!("{label}: nobody led after the leader was partitioned"))
        .expect("candidate task");
    let led = led.unwrap_or_else(|e| panic!("{label}: the healthy candidate's campaign: {e}"));
    let required = if lease_backend {
        LEASE / 100
    } else {
        Duration::ZERO
    };
    assert!(
        led_at >= lost_at + required,
        "{label}: the next leader led {:?} after the partitioned one was told (need ≥ {required:?}; led first: {})",
        led_at.saturating_duration_since(lost_at),
        led_at < lost_at
    );
    assert!(
        led.fencing_token() > first,
        "{label}: the next term's token {} is not above the partitioned one's {first}",
        led.fencing_token()
    );
    println!(
        "{label}: told {reason} {} ms after the cut; the next leader led {} ms after that",
        lost_at.duration_since(cut).as_millis(),
        led_at.duration_since(lost_at).as_millis()
    );

    led.resign().await.expect("resign");
    drop(term);
    world.heal_and_finish(&[&leader_m, &rival_m]).await;
}

/// The case above on every selected backend a proxy can carry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_leader_is_told_before_the_next_one_leads() {
    on_every_proxyable_label(partitioned_leader).await;
}

/// How long a waiter lives in the store's queue without a word: SQL's and Redis's
/// default waiter liveness (ZooKeeper's session and etcd's lease are [`LEASE`]).
const WAITER_LIVENESS: Duration = Duration::from_secs(3);

/// The semaphore case on one label (panics with what went wrong).
async fn cut_off_semaphore_waiter(label: String) {
    let label = label.as_str();
    let world = Partition::open(label).await;
    let (holder_m, dead_m, next_m) = (
        world.healthy().await,
        world.behind().await,
        world.healthy().await,
    );
    if !holder_m.capabilities().semaphore {
        println!("{label}: no semaphores");
        return;
    }
    let permit = holder_m
        .semaphore("s", 1)
        .try_acquire(1, Duration::ZERO)
        .await
        .expect("acquire")
        .unwrap_or_else(|| panic!("{label}: a free semaphore"));
    let dead = dead_m.semaphore("s", 1);
    let dead_wait = tokio::spawn(async move { dead.try_acquire(1, Duration::from_secs(60)).await });
    assert!(
        waiters_shown(&holder_m, "s", 1).await,
        "{label}: the first waiter never showed"
    );
    let next = next_m.semaphore("s", 1);
    let next_wait = tokio::spawn(async move {
        let got = next.try_acquire(1, Duration::from_secs(60)).await;
        (got, Instant::now())
    });
    assert!(
        waiters_shown(&holder_m, "s", 2).await,
        "{label}: the second waiter never showed"
    );

    let cut = world.cut();
    permit.release().await.expect("release");
    let bound = WAITER_LIVENESS + SLACK;
    let (got, granted_at) = tokio::time::timeout(bound, next_wait)
        .await
        .unwrap_or_else(|_| {
            panic!("{label}: the waiter behind a dead one had no permit {bound:?} after the cut")
        })
        .expect("waiter task");
    let got = got
        .unwrap_or_else(|e| panic!("{label}: the live waiter's acquire: {e}"))
        .unwrap_or_else(|| panic!("{label}: the live waiter gave up"));
    println!(
        "{label}: the waiter behind a cut-off one got its permit {} ms after the cut",
        granted_at.duration_since(cut).as_millis()
    );
    got.release().await.expect("release");
    dead_wait.abort();
    let _ = dead_wait.await;
    world.heal_and_finish(&[&holder_m, &dead_m, &next_m]).await;
}

/// The semaphore case on every selected backend a proxy can carry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_semaphore_waiter_is_skipped_within_its_liveness() {
    on_every_proxyable_label(cut_off_semaphore_waiter).await;
}

/// The locks' lease (ZooKeeper: session timeout) in the release case: far longer
/// than the case waits, so only a release that reached the store frees a lock in time.
const LONG_LEASE: Duration = Duration::from_secs(30);

/// How long the release case's connections stay reset (a server restart, a flapping
/// link): far shorter than [`LONG_LEASE`], so ZooKeeper's session outlives it.
const OUTAGE: Duration = Duration::from_millis(700);

/// The release case on one label (panics with what went wrong): a holder whose
/// connections are reset lets go of two locks — one guard dropped, one unlocked —
/// while its releases cannot reach the store; once the connections pass again, a
/// client on a healthy connection must get both within [`SLACK`]: the releases were
/// retried, not left to the lease or the session (which outlive the case).
async fn release_across_an_outage(label: String) {
    let label = label.as_str();
    let world = Partition::open_lasting(label, LONG_LEASE).await;
    let (holder_m, next_m) = (world.behind().await, world.healthy().await);
    let dropped = holder_m.lock("dropped").lock().await.expect("lock");
    let unlocked = holder_m.lock("unlocked").lock().await.expect("lock");

    world.set(Fault::Reset);
    drop(dropped);
    let unlock = unlocked.unlock().await;
    tokio::time::sleep(OUTAGE).await;
    let healed = Instant::now();
    world.set(Fault::Pass);

    for name in ["dropped", "unlocked"] {
        let guard = next_m
            .lock(name)
            .try_lock(SLACK)
            .await
            .unwrap_or_else(|e| panic!("{label}: try_lock {name}: {e}"))
            .unwrap_or_else(|| {
                panic!(
                    "{label}: {name} still held {SLACK:?} after the connections healed \
                     (the unlock answered {unlock:?}); its release was not retried"
                )
            });
        guard.unlock().await.expect("unlock");
    }
    println!(
        "{label}: both locks free {} ms after the connections healed (the unlock during \
         the outage answered: {})",
        healed.elapsed().as_millis(),
        match &unlock {
            Ok(()) => "ok".to_owned(),
            Err(e) => e.to_string(),
        }
    );
    world.heal_and_finish(&[&holder_m, &next_m]).await;
}

/// The release case on every selected backend a proxy can carry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_the_store_missed_is_retried_once_the_connection_heals() {
    on_every_proxyable_label(release_across_an_outage).await;
}
