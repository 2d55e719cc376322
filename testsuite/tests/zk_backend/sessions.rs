//! Sessions: a loss signalled before another client gets the lock, the leader stopped, the scripts' readiness probe.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use dlock_api::{DistributeLockManager, LostReason};
use dlock_zk::ZkBackend;
use testsuite::conformance::{eventually, take};
use testsuite::proxy::{Fault, FaultProxy};

use super::fixtures::*;

/// A partition between the holder and ZooKeeper: the guard is suspended at once and
/// lost once 0.4 × the session timeout passes; the server expires the session later,
/// and only then does another client get the lock. After the partition heals, the
/// first client works again on a new session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_loss_is_signalled_before_another_client_gets_the_lock() {
    let Some(url) = url_for("zk") else { return };
    let upstream = first_host(&url);
    let proxy = FaultProxy::start(upstream).await.unwrap();
    let a = manager(&format!(
        "zk://{}/dlock-test?session_timeout=4000ms",
        proxy.addr()
    ))
    .await;
    let b = manager(&url).await;
    let lock = name("expire");
    let held = take(&a.lock(&lock), Duration::ZERO).await;
    let signal = held.lost_signal();

    proxy.set(Fault::Blackhole);
    let cut = Instant::now();
    assert!(
        eventually(Duration::from_secs(5), || async { held.is_suspended() }).await,
        "the guard was not suspended when the connection went dark"
    );
    assert!(!held.is_lost());
    let contender = b.lock(&lock);
    let taker = tokio::spawn(async move {
        let g = contender.try_lock(Duration::from_secs(20)).await.unwrap();
        (Instant::now(), g)
    });
    let reason = tokio::time::timeout(Duration::from_secs(10), signal.lost())
        .await
        .expect("the lost signal fired");
    let lost_at = Instant::now();
    assert_eq!(reason, LostReason::SessionExpired);
    assert!(!held.is_suspended());
    let (taken_at, taken) = taker.await.unwrap();
    let taken = taken.expect("the other client got the lock once the session expired");
    assert!(
        lost_at < taken_at,
        "lost signal {:?} after the cut, but the other client had the lock at {:?}",
        lost_at - cut,
        taken_at - cut
    );
    eprintln!(
        "suspended → lost at {:?}, other client granted at {:?} after the cut",
        lost_at - cut,
        taken_at - cut
    );
    assert!(
        held.unlock().await.is_err(),
        "a lost guard's unlock reports the loss"
    );

    // Heal: A's backend opens a new session and takes the lock after B.
    proxy.set(Fault::Pass);
    let before = taken.fencing_token();
    taken.unlock().await.unwrap();
    let again = a
        .lock(&lock)
        .try_lock(Duration::from_secs(15))
        .await
        .unwrap()
        .expect("the first client works again after the partition");
    assert!(again.fencing_token() > before);
    again.unlock().await.unwrap();
    a.close().await;
    b.close().await;
}

/// Stopping the ensemble's leader while a lock is held: the holder either keeps the
/// lock (the ensemble still lists its node first once a new leader is elected) or its
/// guard says it lost it — never a silent loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_the_leader_keeps_the_lock_or_reports_its_loss() {
    let Some(url) = url_for("zk-ensemble") else {
        return;
    };
    // Where scripts/lib/services.sh keeps the members: DIR/<n>/{zoo.cfg,pid,start.sh}.
    let dir = std::env::var("DLOCK_ZK_ENSEMBLE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| std::env::temp_dir().join("dlock-zookeeper/ensemble"));
    let backend = ZkBackend::connect(&url).await.unwrap();
    let holder = DistributeLockManager::builder(backend.clone())
        .build()
        .unwrap();
    let other = manager(&url).await;
    let lock = name("leader");
    let guard = take(&holder.lock(&lock), Duration::ZERO).await;

    let leader = ensemble_leader().await.expect("the ensemble has a leader");
    let node_dir = dir.join(leader.to_string());
    let pid = std::fs::read_to_string(node_dir.join("pid")).unwrap();
    let stopped = std::process::Command::new("kill")
        .arg(pid.trim())
        .status()
        .unwrap();
    assert!(stopped.success(), "could not stop leader {leader}");
    // Restart the stopped node whatever happens below, so the ensemble is whole again.
    assert!(
        node_dir.join("start.sh").exists(),
        "{} has no start.sh: start the ensemble with scripts/test",
        node_dir.display()
    );
    let mut restart = Restart {
        dir: Some(node_dir),
    };
    {
        // A new leader among the other two.
        assert!(
            eventually(Duration::from_secs(30), || async {
                ensemble_leader().await.is_some_and(|l| l != leader)
            })
            .await,
            "no new leader within 30 s"
        );
        // Settle: the holder reconnects (suspension clears) or is told it lost the lock.
        assert!(
            eventually(Duration::from_secs(20), || async {
                guard.is_lost() || (backend.is_connected() && !guard.is_suspended())
            })
            .await,
            "the guard stayed suspended without a verdict"
        );
        if guard.is_lost() {
            eprintln!(
                "leader {leader} stopped: the holder was told it lost the lock ({:?})",
                guard.lost_reason()
            );
        } else {
            // Still held: the ensemble agrees, and nobody else can take it.
            let state = other.inspect(&lock).await.unwrap().expect("held");
            assert_eq!(state.holders.len(), 1);
            assert_eq!(state.holders[0].token, guard.fencing_token());
            assert!(other
                .lock(&lock)
                .try_lock(Duration::ZERO)
                .await
                .unwrap()
                .is_none());
            eprintln!("leader {leader} stopped: the holder kept the lock");
        }
    }
    restart.now();
    assert!(
        eventually(Duration::from_secs(60), || async {
            zk_mode(2190 + leader).await.is_some()
        })
        .await,
        "the restarted node did not rejoin"
    );
    let _ = guard.unlock().await;
    holder.close().await;
    other.close().await;
}

/// The scripts' readiness probe of a ZooKeeper server (`zk_serving`, which
/// `scripts/server-fault restart zk` waits on, 90 s at most) gives up on a server
/// that takes its connection and never answers — as ZooKeeper 3.8 does to a `srvr`
/// sent while it is still starting: one restart in the lock-history checker's run
/// waited 180 s on such a probe, past every bound around it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scripts_readiness_probe_gives_up_on_a_server_that_never_answers() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // Takes the connection, reads, answers nothing and keeps it open.
    let silent = std::thread::spawn(move || {
        let (conn, _) = listener.accept().unwrap();
        std::thread::sleep(Duration::from_secs(8));
        drop(conn);
    });
    let services = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/lib/services.sh");
    let started = Instant::now();
    let mut probe = tokio::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source '{}' && zk_serving {port}",
            services.display()
        ))
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(6), probe.wait())
        .await
        .expect("the probe still waited on the silent server after 6 s")
        .unwrap();
    assert!(
        !status.success(),
        "a server that never answered counted as serving"
    );
    assert!(started.elapsed() < Duration::from_secs(6));
    silent.join().unwrap();
}
