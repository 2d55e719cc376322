//! What the Redis backend promises behind Sentinel, when `redis-sentinel` is in
//! `DLOCK_TEST_BACKENDS`: it follows the master through a forced failover (commands,
//! release notices and queued waiters; a backend on the URL and one on the
//! application's clients alike), and with `replica_ack` a renewal counts only
//! once the replicas have it. On the deployment scripts/lib/services.sh starts (a
//! master, two replicas, three sentinels); the failover comes from
//! `scripts/server-fault failover`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Stdio;
use std::time::{Duration, Instant};

use dlock_api::{DistributeLockManager, ErrorKind};
use dlock_redis::{RedisBackend, RedisOptions};
use testsuite::backends::{server_url, SENTINEL_REPLICAS};
use testsuite::conformance::{eventually, take};
use testsuite::runner::selected;

/// The tests here fail the deployment over or stop its servers: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn sentinel_url() -> Option<String> {
    let url = selected()
        .iter()
        .any(|l| l == "redis-sentinel")
        .then(|| server_url("redis-sentinel").unwrap().to_string());
    if url.is_none() {
        eprintln!("redis-sentinel is not selected in DLOCK_TEST_BACKENDS; nothing to check here");
    }
    url
}

fn name(tag: &str) -> String {
    format!("sentinel-{tag}-{:x}", fastrand::u64(..))
}

async fn cli(port: u16, args: &[&str]) -> String {
    let out = tokio::process::Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run redis-cli");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The master's port, as the first sentinel names it.
async fn master_port() -> u16 {
    let reply = cli(
        26400,
        &["sentinel", "get-master-addr-by-name", "dlock-master"],
    )
    .await;
    reply
        .lines()
        .nth(1)
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("the sentinel names no master: {reply:?}"))
}

/// Waits (bounded) until the master the sentinels name has both replicas online and
/// caught up (each at the master's replication offset): after a failover the old
/// master rejoins only once a sentinel reconfigures it (seconds later) and then
/// resynchronises, and the next test needs every replica to acknowledge writes.
async fn deployment_whole() {
    assert!(
        eventually(Duration::from_secs(60), || async {
            let info = cli(master_port().await, &["info", "replication"]).await;
            let field = |line: &str, key: &str| {
                line.split(',')
                    .find_map(|kv| kv.strip_prefix(key).map(|v| v.trim().to_owned()))
            };
            let master_offset = info.lines().find_map(|l| {
                l.strip_prefix("master_repl_offset:")
                    .map(|v| v.trim().to_owned())
            });
            let caught_up = info
                .lines()
                .filter(|l| l.starts_with("slave") && l.contains("state=online"))
                .filter(|l| field(l, "offset=") == master_offset)
                .count();
            caught_up == SENTINEL_REPLICAS as usize
        })
        .await,
        "the Sentinel deployment did not get both replicas back and caught up within 60 s"
    );
}

/// Runs `scripts/server-fault ARGS…` (bounded) and checks it succeeded.
async fn server_fault(args: &[&str]) {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    if let Err(e) = testsuite::lockcheck::servers::server_fault(&args).await {
        panic!("{e}");
    }
}

/// A forced failover moves everything to the new master: the holder's watchdog
/// renews there, the release notices are subscribed there (a waiter queued before
/// the failover is woken by the holder's release after it), and new locks are
/// granted there.
/// A backend on the application's clients for the deployment of `url`: one per
/// sentinel, and a data-node client at an address where nothing listens (only its
/// settings count). No sentinel client is refused.
async fn on_application_clients(url: &str) -> RedisBackend {
    let nodes = || redis::Client::open("redis://127.0.0.1:1/0").unwrap();
    let none = RedisBackend::from_sentinel_clients(
        Vec::new(),
        "dlock-master",
        nodes(),
        RedisOptions::default(),
    )
    .await
    .map(drop)
    .unwrap_err();
    assert_eq!(none.kind(), ErrorKind::Config, "{none}");
    let (hosts, master) = url
        .trim_start_matches("redis+sentinel://")
        .split_once('/')
        .unwrap();
    let sentinels = hosts
        .split(',')
        .map(|h| redis::Client::open(format!("redis://{h}")).unwrap())
        .collect();
    RedisBackend::from_sentinel_clients(sentinels, master, nodes(), RedisOptions::default())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_moves_commands_notices_and_waiters_to_the_new_master() {
    let Some(url) = sentinel_url() else { return };
    let _serial = SERIAL.lock().await;
    let a = RedisBackend::connect(&url).await.unwrap();
    // The waiter's backend is on the application's clients: the sentinels', and one
    // whose settings (not its address: nothing listens there) open the master.
    let b = on_application_clients(&url).await;
    // Longer than a forced failover's window (about 2 s here) in which the clients
    // still write to the old master, which no longer replicates to the promoted one:
    // a renewal made then is lost with it, and the hold lives on what the promoted
    // replica had.
    let lease = Duration::from_secs(10);
    let ma = DistributeLockManager::builder(a.clone())
        .lease(lease)
        .build()
        .unwrap();
    let mb = DistributeLockManager::builder(b.clone()).build().unwrap();
    let lock = name("moved");
    let holder = take(&ma.lock(&lock), Duration::ZERO).await;
    // The waiter queues (its re-checks are a second apart: the default 3 s
    // liveness / 3) before the failover.
    let waiting = {
        let handle = mb.lock(&lock);
        tokio::spawn(async move { handle.try_lock(Duration::from_secs(30)).await })
    };
    let old = master_port().await;
    assert!(
        eventually(Duration::from_secs(5), || async {
            cli(old, &["zcard", &format!("dlock:{{{lock}}}:q")])
                .await
                .trim()
                == "1"
        })
        .await,
        "the waiter did not queue on the master"
    );

    server_fault(&["failover", "redis-sentinel"]).await;
    let new = master_port().await;
    assert_ne!(old, new, "the failover named the same master");

    // Both clients' notice connections subscribe on the new master.
    for backend in [&a, &b] {
        let channel = backend.notice_channel().to_owned();
        assert!(
            eventually(Duration::from_secs(10), || async {
                cli(new, &["pubsub", "channels", &channel]).await.trim() == channel
            })
            .await,
            "the release notices of a client are not subscribed on the new master {new}"
        );
    }
    // The holder's watchdog renews it on the new master: a third of the lease
    // after the switch, the store's lease there is fresher than that.
    let switched = Instant::now();
    assert!(
        eventually(lease / 2, || async {
            let pttl: i64 = cli(new, &["pttl", &format!("dlock:{{{lock}}}:x")])
                .await
                .trim()
                .parse()
                .unwrap_or(-2);
            let since = u64::try_from(switched.elapsed().as_millis()).unwrap_or(u64::MAX);
            // Renewed since the switch: more left than a lease that was not.
            since > 200
                && pttl > 0
                && (pttl as u64) > (lease.as_millis() as u64).saturating_sub(since) + 100
        })
        .await,
        "the watchdog did not renew the hold on the new master"
    );
    assert!(!holder.is_lost(), "the hold was lost through the failover");

    // The waiter is woken by the release's notice, well before its next re-check.
    let released = Instant::now();
    holder.unlock().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the queued waiter never got the lock")
        .unwrap()
        .unwrap()
        .expect("the queued waiter was refused");
    let woke = released.elapsed();
    assert!(
        woke < Duration::from_millis(500),
        "the waiter was not woken by a release notice ({woke:?})"
    );
    guard.unlock().await.unwrap();

    // New locks are granted on the new master.
    let other = name("after");
    let g = take(&ma.lock(&other), Duration::ZERO).await;
    assert_eq!(
        cli(new, &["exists", &format!("dlock:{{{other}}}:x")])
            .await
            .trim(),
        "1"
    );
    g.unlock().await.unwrap();
    ma.close().await;
    mb.close().await;
    deployment_whole().await;
}

/// Over TLS (sentinels, replication and clients, client certificates required;
/// `redis-sentinel-tls`): the backend finds the master through the sentinels, and
/// after a forced failover its hold is renewed and new locks granted on the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_deployment_is_followed_through_a_failover() {
    if !selected().iter().any(|l| l == "redis-sentinel-tls") {
        eprintln!(
            "redis-sentinel-tls is not selected in DLOCK_TEST_BACKENDS; nothing to check here"
        );
        return;
    }
    let url = server_url("redis-sentinel-tls").unwrap().to_string();
    let _serial = SERIAL.lock().await;
    let m = DistributeLockManager::builder(RedisBackend::connect(&url).await.unwrap())
        .lease(Duration::from_secs(10))
        .build()
        .unwrap();
    let lock = name("tls");
    let held = take(&m.lock(&lock), Duration::ZERO).await;
    server_fault(&["failover", "redis-sentinel-tls"]).await;
    // Renewed on the new master (the old one, demoted, refuses writes), and new
    // locks are granted there.
    assert!(
        eventually(Duration::from_secs(5), || async {
            held.extend(Duration::from_secs(10)).await.is_ok()
        })
        .await,
        "the hold could not be renewed after the failover"
    );
    assert!(!held.is_lost(), "the hold was lost through the failover");
    let other = take(&m.lock(name("tls-after")), Duration::from_secs(5)).await;
    other.unlock().await.unwrap();
    held.unlock().await.unwrap();
    m.close().await;
}

/// With `replica_ack`, a renewal the replicas did not take does not count (a
/// failover would undo it): `extend` fails while a replica is frozen, and works
/// again once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_counts_only_once_the_replicas_have_it() {
    let Some(url) = sentinel_url() else { return };
    let _serial = SERIAL.lock().await;
    deployment_whole().await;
    let backend = RedisBackend::connect_with(
        &url,
        // Under the sentinels' 1 s down-after: the frozen replica below stays
        // frozen this long and must not be taken for down.
        RedisOptions::default().replica_ack(SENTINEL_REPLICAS, Duration::from_millis(500)),
    )
    .await
    .unwrap();
    let m = DistributeLockManager::builder(backend)
        .lease(Duration::from_secs(10))
        .build()
        .unwrap();
    let lock = name("ack");
    // Setup, not the subject: on a loaded machine a replica back from the previous
    // test's failover may still answer one WAIT late, which fails that call (and
    // releases the lock). A few bounded tries; the last error is reported.
    let mut last_error = None;
    let mut guard = None;
    for _ in 0..5 {
        match m.lock(&lock).try_lock(Duration::ZERO).await {
            Ok(Some(g)) => match g.extend(Duration::from_secs(10)).await {
                Ok(_) => {
                    guard = Some(g);
                    break;
                }
                Err(e) => {
                    let _ = g.unlock().await;
                    last_error = Some(e);
                }
            },
            Ok(None) => panic!("{lock} is held (a try above whose release failed: {last_error:?})"),
            Err(e) => last_error = Some(e),
        }
    }
    let guard = guard.unwrap_or_else(|| {
        panic!("could not take and renew {lock} with both replicas: {last_error:?}")
    });

    // Freeze one replica (SIGSTOP, well under the sentinels' 1 s down-after).
    let master = master_port().await;
    let replica = [6400u16, 6401, 6402]
        .into_iter()
        .find(|p| *p != master)
        .unwrap();
    let pidfile = std::env::temp_dir()
        .join("dlock-sentinel")
        .join(replica.to_string())
        .join("redis.pid");
    let pid = std::fs::read_to_string(&pidfile)
        .unwrap_or_else(|e| panic!("{}: {e}", pidfile.display()))
        .trim()
        .to_owned();
    let signal = |sig: &'static str| {
        let pid = pid.clone();
        async move {
            let ok = tokio::process::Command::new("kill")
                .args([sig, &pid])
                .status()
                .await
                .unwrap()
                .success();
            assert!(ok, "kill {sig} {pid}");
        }
    };
    signal("-STOP").await;
    let frozen = guard.extend(Duration::from_secs(10)).await;
    signal("-CONT").await;
    let err = frozen.expect_err("a renewal one replica never saw counted");
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    assert!(err.to_string().contains("replicas acknowledged"), "{err}");

    assert!(
        eventually(Duration::from_secs(10), || async {
            guard.extend(Duration::from_secs(10)).await.is_ok()
        })
        .await,
        "renewals did not work again once the replica was back"
    );
    guard.unlock().await.unwrap();
    m.close().await;
}
