//! Connection blips ridden out: waiters, a queueing's lost answer, an upgrade's and a semaphore waiter's look.

use std::time::{Duration, Instant};

use dlock_api::LockMode;
use dlock_spi::{AcquireRequest, LockName, LockRemoteResource, OwnerId};
use dlock_zk::ZkBackend;
use testsuite::conformance::{eventually, take};
use testsuite::proxy::{Fault, FaultProxy};
use testsuite::zk_cut::{ZkReplyCut, CREATE2, GET_CHILDREN, GET_CHILDREN2};

use super::fixtures::*;

/// A connection blip (reset, back within the session timeout) does not cost a waiter
/// its place: the release it missed while disconnected wakes it once it is back. And a
/// waiter that times out while disconnected has its node deleted once the connection
/// returns, so it does not block the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_ride_out_a_connection_blip_and_leave_no_node_behind() {
    let Some(url) = url_for("zk") else { return };
    let upstream = first_host(&url);
    let proxy = FaultProxy::start(upstream).await.unwrap();
    let via_proxy = format!("zk://{}/dlock-test?session_timeout=5000ms", proxy.addr());
    let (holder, waiter) = (manager(&url).await, manager(&via_proxy).await);
    let lock = name("blip");
    let waiters = |n: usize| {
        let (holder, lock) = (holder.clone(), lock.clone());
        async move {
            eventually(Duration::from_secs(5), || async {
                holder.inspect(&lock).await.unwrap().and_then(|s| s.waiters) == Some(n)
            })
            .await
        }
    };

    // 1. The release happens while the waiter is cut off.
    let held = take(&holder.lock(&lock), Duration::ZERO).await;
    let contender = waiter.lock(&lock);
    let waiting = tokio::spawn(async move { contender.try_lock(Duration::from_secs(15)).await });
    assert!(waiters(1).await, "the waiter queued");
    proxy.set(Fault::Reset);
    held.unlock().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await; // the outage being tested
    proxy.set(Fault::Pass);
    let got = waiting
        .await
        .unwrap()
        .unwrap()
        .expect("the waiter got the lock after the blip");
    assert!(!got.is_lost());
    let state = holder.inspect(&lock).await.unwrap().expect("held");
    assert_eq!(state.holders[0].token, got.fencing_token());
    got.unlock().await.unwrap();

    // 2. A waiter times out while cut off: its node goes once the connection is back.
    let held = take(&holder.lock(&lock), Duration::ZERO).await;
    let contender = waiter.lock(&lock);
    let waiting =
        tokio::spawn(async move { contender.try_lock(Duration::from_millis(1500)).await });
    assert!(waiters(1).await, "the waiter queued");
    proxy.set(Fault::Reset);
    let outcome = waiting.await.unwrap();
    assert!(
        !matches!(outcome, Ok(Some(_))),
        "no lock while cut off: {outcome:?}"
    );
    proxy.set(Fault::Pass);
    assert!(
        waiters(0).await,
        "the timed-out waiter's node is gone once reconnected"
    );
    held.unlock().await.unwrap();
    assert!(holder.inspect(&lock).await.unwrap().is_none());
    holder.close().await;
    waiter.close().await;
}

/// A blip that takes the answer to a waiter's queueing — its node made, the answer
/// to its create or to the listing sent with it lost with the connection — costs the
/// waiter nothing once the connection is back within its wait: it finds its node (or
/// lists the queue again), waits its turn and is granted at the release; no node is
/// left. (Before, a lost listing failed the acquire: "cannot reach ZooKeeper". A
/// lost create's answer was ridden out already — its listing, sent while the
/// connection was down, waited for it — and stays so.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blip_that_takes_the_answer_to_a_waiters_queueing_is_ridden_out() {
    let Some(url) = url_for("zk") else { return };
    let cutter = ZkReplyCut::start(first_host(&url)).await.unwrap();
    let via_cutter = format!("zk://{}/dlock-test?session_timeout=5000ms", cutter.addr());
    let (holder, waiter) = (manager(&url).await, manager(&via_cutter).await);
    let lock = name("cut-answer");
    for (round, (op, what)) in [(GET_CHILDREN2, "listing"), (CREATE2, "create")]
        .into_iter()
        .enumerate()
    {
        let held = take(&holder.lock(&lock), Duration::ZERO).await;
        cutter.cut_before_answer_to(op);
        let contender = waiter.lock(&lock);
        let waiting =
            tokio::spawn(async move { contender.try_lock(Duration::from_secs(15)).await });
        let cut = tokio::time::timeout(Duration::from_secs(5), cutter.cut(round as u32 + 1));
        assert!(cut.await.is_ok(), "{what}: the answer was cut");
        held.unlock().await.unwrap();
        let got = waiting
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("{what}: the blip failed the acquire: {e}"))
            .unwrap_or_else(|| panic!("{what}: the waiter was not granted the free lock"));
        assert!(!got.is_lost(), "{what}");
        let state = holder.inspect(&lock).await.unwrap().expect("held");
        assert_eq!(state.holders[0].token, got.fencing_token(), "{what}");
        assert_eq!(state.waiters, Some(0), "{what}: a node left in the queue");
        got.unlock().await.unwrap();
        assert!(
            holder.inspect(&lock).await.unwrap().is_none(),
            "{what}: a node left behind"
        );
    }
    holder.close().await;
    waiter.close().await;
}

/// A blip that takes the answer to an upgrade's look at the queue (before it places
/// its node) is ridden out within the upgrade's wait: the upgrade is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blip_that_takes_the_answer_to_an_upgrades_look_is_ridden_out() {
    let Some(url) = url_for("zk") else { return };
    let cutter = ZkReplyCut::start(first_host(&url)).await.unwrap();
    let via_cutter = format!("zk://{}/dlock-test?session_timeout=5000ms", cutter.addr());
    let backend = ZkBackend::connect(&via_cutter).await.unwrap();
    let lock = LockName::new(name("cut-upgrade")).unwrap();
    let owner = OwnerId::new(format!("test:{:x}", fastrand::u64(..)));
    let (read, write) = (dlock_spi::GrantId::new(1), dlock_spi::GrantId::new(2));
    let soon = || Some(Instant::now() + Duration::from_secs(10));
    let shared = AcquireRequest::new(lock.clone(), owner.clone(), read)
        .with_mode(LockMode::Shared)
        .with_deadline(soon());
    let read_token = backend.try_acquire(&shared).await.unwrap().token();
    let read_token = read_token.expect("the read is granted");
    settled(&cutter).await;
    cutter.cut_before_answer_to(GET_CHILDREN);
    let upgrade = AcquireRequest::new(lock.clone(), owner.clone(), write)
        .with_alongside(Some(read))
        .with_deadline(soon());
    let upgraded = backend.try_acquire(&upgrade).await;
    assert!(
        tokio::time::timeout(Duration::ZERO, cutter.cut(1))
            .await
            .is_ok(),
        "the upgrade's look was cut"
    );
    let upgrade_token = upgraded
        .unwrap_or_else(|e| panic!("the blip failed the upgrade: {e}"))
        .token()
        .expect("the upgrade is granted");
    for (grant, mode, token) in [
        (write, LockMode::Exclusive, upgrade_token),
        (read, LockMode::Shared, read_token),
    ] {
        let release =
            dlock_spi::ReleaseRequest::new(lock.clone(), owner.clone(), grant, mode, token);
        backend.release(&release).await.unwrap();
    }
    assert!(
        backend.inspect(&lock).await.unwrap().is_none(),
        "a node left behind"
    );
}

/// A blip that takes the answer to a semaphore waiter's look at the leases, after a
/// release woke it, is ridden out within its wait: it is granted the permit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blip_that_takes_the_answer_to_a_semaphore_waiters_look_is_ridden_out() {
    let Some(url) = url_for("zk") else { return };
    let (backend, holder, raw) = setup(&url).await;
    let cutter = ZkReplyCut::start(first_host(&url)).await.unwrap();
    let via_cutter = format!("zk://{}/dlock-test?session_timeout=5000ms", cutter.addr());
    let waiter = manager(&via_cutter).await;
    let sem_name = name("cut-sem");
    let leases = format!(
        "{}/leases",
        backend.lock_path(&LockName::new(sem_name.as_str()).unwrap())
    );
    let held = holder
        .semaphore(&sem_name, 1)
        .try_acquire(1, Duration::ZERO)
        .await
        .unwrap()
        .expect("a free permit");
    let sem = waiter.semaphore(&sem_name, 1);
    let waiting = tokio::spawn(async move { sem.try_acquire(1, Duration::from_secs(15)).await });
    // The waiter holds the recipe's mutex, its lease is made, and it waits on its
    // watch of the leases.
    let mutex = format!("{}/locks", leases.trim_end_matches("/leases"));
    let queued = eventually(Duration::from_secs(5), || async {
        let in_mutex = raw.list_children(&mutex).await.is_ok_and(|c| c.len() == 1);
        in_mutex && raw.list_children(&leases).await.is_ok_and(|c| c.len() == 2)
    })
    .await;
    assert!(queued, "the waiter made its lease");
    settled(&cutter).await;
    cutter.cut_before_answer_to(GET_CHILDREN);
    held.release().await.unwrap();
    let cut = tokio::time::timeout(Duration::from_secs(5), cutter.cut(1));
    assert!(cut.await.is_ok(), "the waiter's look was cut");
    let permit = waiting
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("the blip failed the acquire: {e}"))
        .expect("the waiter is granted the free permit");
    permit.release().await.unwrap();
    let emptied = eventually(Duration::from_secs(2), || async {
        raw.list_children(&leases).await.is_ok_and(|c| c.is_empty())
    })
    .await;
    assert!(emptied, "a lease left behind");
    holder.close().await;
    waiter.close().await;
}
