//! What only the ZooKeeper backend promises, when `zk` (single server) or
//! `zk-ensemble` is in `DLOCK_TEST_BACKENDS`: Curator's node layout and mutual
//! exclusion with a real Java Curator client, finding an owner's node again, fencing
//! across the deletion of the lock's node, session loss signalled before anyone else
//! is granted the lock, and a stopped ensemble leader never losing a lock silently.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use dlock_api::{DistributeLockManager, LockMode, LostReason};
use dlock_spi::{AcquireRequest, HolderKey, LockName, LockRemoteResource, OwnerId};
use dlock_zk::{ZkBackend, ZkOptions};
use testsuite::backends::{assert_held_by_a_curator_node, server_url};
use testsuite::conformance::{eventually, take};
use testsuite::curator;
use testsuite::proxy::{join_hosts, split_url, Fault, FaultProxy};
use testsuite::runner::selected;
use testsuite::zk_cut::{ZkReplyCut, CREATE2, GET_CHILDREN, GET_CHILDREN2};
use zookeeper_client::Client;

fn url_for(label: &str) -> Option<String> {
    let url = selected()
        .iter()
        .any(|l| l == label)
        .then(|| server_url(label).unwrap().to_string());
    if url.is_none() {
        eprintln!("{label} is not selected in DLOCK_TEST_BACKENDS; nothing to check here");
    }
    url
}

fn name(tag: &str) -> String {
    format!("{tag}-{:x}", fastrand::u64(..))
}

/// `zk://hosts/root?…` → `hosts`.
fn hosts_of(url: &str) -> String {
    join_hosts(&split_url(url).unwrap().hosts)
}

/// The first ZooKeeper server of `url`.
fn first_host(url: &str) -> SocketAddr {
    split_url(url).unwrap().hosts[0]
}

async fn manager(url: &str) -> DistributeLockManager {
    DistributeLockManager::builder(ZkBackend::connect(url).await.unwrap())
        .build()
        .unwrap()
}

async fn raw_client(url: &str) -> Client {
    Client::connect(&hosts_of(url)).await.unwrap()
}

/// An ephemeral sequential node made by `raw` at `prefix` (another client's
/// contender): its stat and sequence number.
async fn contender_node(
    raw: &Client,
    prefix: &str,
) -> (zookeeper_client::Stat, zookeeper_client::CreateSequence) {
    raw.create(
        prefix,
        b"",
        &zookeeper_client::CreateMode::EphemeralSequential
            .with_acls(zookeeper_client::Acls::anyone_all()),
    )
    .await
    .unwrap()
}

/// Makes the lock's node (a container), as dlock would, if it is not there.
async fn lock_node(raw: &Client, path: &str) {
    let _ = raw
        .create(
            path,
            &[],
            &zookeeper_client::CreateMode::Container
                .with_acls(zookeeper_client::Acls::anyone_all()),
        )
        .await;
}

/// A backend, a manager over it, and a raw client to look at the tree.
async fn setup(url: &str) -> (ZkBackend, DistributeLockManager, Client) {
    let backend = ZkBackend::connect(url).await.unwrap();
    let m = DistributeLockManager::builder(backend.clone())
        .build()
        .unwrap();
    (backend, m, raw_client(url).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_follow_curators_layout_and_names_stay_under_the_root() {
    let Some(url) = url_for("zk") else { return };
    let (backend, m, raw) = setup(&url).await;
    for lock in [
        name("layout"),
        format!("../../zookeeper/{}", name("x")),
        "zookeeper".to_owned(),
    ] {
        let full = LockName::new(lock.as_str()).unwrap();
        let path = backend.lock_path(&full);
        assert!(path.starts_with("/dlock-test/"), "{path}");
        assert_eq!(
            path.matches('/').count(),
            2,
            "{lock:?} left its segment: {path}"
        );
        let g = take(&m.lock(&lock), Duration::ZERO).await;
        assert_held_by_a_curator_node(&raw, &path, g.fencing_token().get()).await;
        g.unlock().await.unwrap();
        assert!(raw
            .list_children(&path)
            .await
            .map(|c| c.is_empty())
            .unwrap_or(true));
    }
    m.close().await;
}

/// A node with the grant's prefix left by *another* session (a dying session of an
/// acquire retried in a new one) is never adopted — it would vanish when that
/// session expires: the acquire deletes it and queues its own node. A retried acquire
/// in the same session is idempotent (same node, same token).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_sessions_node_is_not_adopted_and_a_retry_is_idempotent() {
    let Some(url) = url_for("zk") else { return };
    let backend = ZkBackend::connect(&url).await.unwrap();
    let lock = LockName::new(name("adopt")).unwrap();
    let owner = OwnerId::new(format!("test:{:x}", fastrand::u64(..)));
    let grant = dlock_spi::GrantId::new(1);
    let path = backend.lock_path(&lock);
    // The other session's node: ephemeral sequential, with the grant's prefix, made
    // by a session that stays open.
    let raw = raw_client(&url).await;
    lock_node(&raw, &path).await;
    let prefix = backend.node_prefix(&HolderKey::new(&owner, grant), LockMode::Exclusive);
    let (stat, _) = contender_node(&raw, &format!("{path}/{prefix}")).await;
    let req = AcquireRequest::new(lock.clone(), owner.clone(), grant)
        .with_deadline(Some(Instant::now() + Duration::from_secs(5)));
    let got = backend.try_acquire(&req).await.unwrap();
    let token = got.token().expect("granted").get();
    assert!(
        token > stat.czxid as u64,
        "the other session's node (czxid {}) was adopted: {got:?}",
        stat.czxid
    );
    let children = raw.list_children(&path).await.unwrap();
    assert_eq!(
        children.len(),
        1,
        "the other session's node was left next to ours: {children:?}"
    );
    // Acquiring again (a retry) is idempotent: same node, same token.
    let again = backend.try_acquire(&req).await.unwrap();
    assert_eq!(again.token(), got.token());
    assert_eq!(raw.list_children(&path).await.unwrap().len(), 1);
    let released = backend
        .release(&dlock_spi::ReleaseRequest::new(
            lock,
            owner,
            grant,
            LockMode::Exclusive,
            got.token().unwrap(),
        ))
        .await
        .unwrap();
    assert_eq!(released, dlock_spi::ReleaseResult::Released);
    assert!(raw
        .list_children(&path)
        .await
        .map(|c| c.is_empty())
        .unwrap_or(true));
}

/// An upgrade first clears the nodes of its grant left by an earlier placement (a
/// delete that failed, a create whose answer was lost): such a node, a write node
/// to every reader, would keep all later readers out for the rest of its session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_clears_its_grants_leftover_nodes() {
    let Some(url) = url_for("zk") else { return };
    let backend = ZkBackend::connect(&url).await.unwrap();
    let lock = LockName::new(name("leftover")).unwrap();
    let path = backend.lock_path(&lock);
    let owner = OwnerId::new(format!("test:{:x}", fastrand::u64(..)));
    let (read, write) = (dlock_spi::GrantId::new(1), dlock_spi::GrantId::new(2));
    let soon = || Some(Instant::now() + Duration::from_secs(5));
    // A node came and went first, so the read's key is above 0000000000.
    let raw = raw_client(&url).await;
    lock_node(&raw, &path).await;
    let (_, gone) = contender_node(&raw, &format!("{path}/gone-")).await;
    raw.delete(&format!("{path}/gone-{gone}"), None)
        .await
        .unwrap();
    let shared = AcquireRequest::new(lock.clone(), owner.clone(), read)
        .with_mode(LockMode::Shared)
        .with_deadline(soon());
    let read_token = backend.try_acquire(&shared).await.unwrap().token();
    assert!(read_token.is_some(), "the read is granted");
    // The leftover: a node of the upgrade's grant at another anchor, ahead of the
    // read, on a session that stays open.
    let prefix = backend.node_prefix(&HolderKey::new(&owner, write), LockMode::Exclusive);
    contender_node(&raw, &format!("{path}/{prefix}0000000000")).await;
    let upgrade = AcquireRequest::new(lock.clone(), owner.clone(), write)
        .with_alongside(Some(read))
        .with_deadline(soon());
    let upgraded = backend.try_acquire(&upgrade).await.unwrap();
    let upgrade_token = upgraded.token().expect("the upgrade is granted");
    for (grant, mode, token) in [
        (write, LockMode::Exclusive, upgrade_token),
        (read, LockMode::Shared, read_token.unwrap()),
    ] {
        let release =
            dlock_spi::ReleaseRequest::new(lock.clone(), owner.clone(), grant, mode, token);
        backend.release(&release).await.unwrap();
    }
    // Nothing of the owner is left: another reader gets the lock at once.
    let other = AcquireRequest::new(lock.clone(), OwnerId::new("other"), read)
        .with_mode(LockMode::Shared)
        .with_deadline(None);
    let got = backend.try_acquire(&other).await.unwrap();
    assert!(
        got.token().is_some(),
        "a reader is kept out after the upgrade: {:?}",
        raw.list_children(&path).await
    );
}

/// A semaphore's uncontended grant skips the recipe's mutex, but never passes an
/// acquirer queued in it: with a (Java-style) contender node in `…/locks` and
/// permits free, a try-once newcomer is refused; once the node is gone, granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_newcomer_does_not_pass_an_acquirer_queued_in_the_mutex() {
    let Some(url) = url_for("zk") else { return };
    let (backend, m, raw) = setup(&url).await;
    let sem_name = name("sem-queue");
    let sem = m.semaphore(&sem_name, 3);
    let granted_now = |why: &'static str| {
        let sem = sem.clone();
        async move {
            let permit = sem.try_acquire(1, Duration::ZERO).await.unwrap();
            permit.expect(why).release().await.unwrap();
        }
    };
    // First use (records the total), then idle with 3 permits free.
    granted_now("a free permit").await;
    let queued_prefix = format!(
        "{}/locks/_c_00000000-0000-0000-0000-000000000000-lock-",
        backend.lock_path(&LockName::new(sem_name.as_str()).unwrap())
    );
    let (_, queued) = contender_node(&raw, &queued_prefix).await;
    assert!(
        sem.try_acquire(1, Duration::ZERO).await.unwrap().is_none(),
        "a newcomer passed an acquirer queued in the semaphore's mutex"
    );
    raw.delete(&format!("{queued_prefix}{queued}"), None)
        .await
        .unwrap();
    granted_now("a free permit once nobody queues").await;
    m.close().await;
}

/// A semaphore acquire cut short anywhere — also between its mutex node's create
/// and the create's answer — leaves no node in the recipe's mutex (`…/locks`): 40
/// acquires of a full semaphore, each cut at a point swept across its first 6 ms;
/// then, the holder gone, the mutex empties within 2 s and a newcomer is granted at
/// once (a node left behind would hold every acquirer back for as long as the
/// session lives).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_acquire_cut_short_leaves_no_mutex_node() {
    let Some(url) = url_for("zk") else { return };
    let (backend, m, raw) = setup(&url).await;
    let sem_name = name("sem-cut");
    let sem = m.semaphore(&sem_name, 1);
    let held = sem
        .try_acquire(1, Duration::ZERO)
        .await
        .unwrap()
        .expect("a free permit");
    for i in 0..40u64 {
        let cut = Duration::from_micros(i * 150);
        let _ = tokio::time::timeout(cut, sem.try_acquire(1, Duration::from_millis(50))).await;
    }
    held.release().await.unwrap();
    let locks = format!(
        "{}/locks",
        backend.lock_path(&LockName::new(sem_name.as_str()).unwrap())
    );
    let emptied = eventually(Duration::from_secs(2), || async {
        raw.list_children(&locks)
            .await
            .map_or(true, |c| c.is_empty())
    })
    .await;
    assert!(
        emptied,
        "cut acquires left mutex nodes: {:?}",
        raw.list_children(&locks).await
    );
    let permit = sem.try_acquire(1, Duration::ZERO).await.unwrap();
    permit
        .expect("a newcomer is granted the free permit")
        .release()
        .await
        .unwrap();
    m.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_increase_across_deletion_of_the_lock_node() {
    let Some(url) = url_for("zk") else { return };
    let (backend, m, raw) = setup(&url).await;
    let lock = name("fence");
    let path = backend.lock_path(&LockName::new(lock.as_str()).unwrap());
    let mut last = 0;
    for round in 0..3 {
        let g = take(&m.lock(&lock), Duration::ZERO).await;
        let token = g.fencing_token().get();
        assert!(token > last, "round {round}: token {token} after {last}");
        last = token;
        g.unlock().await.unwrap();
        // Remove the lock's node itself; the next acquire recreates it.
        raw.delete(&path, None).await.unwrap();
        assert!(raw.check_stat(&path).await.unwrap().is_none());
    }
    m.close().await;
}

/// Digest credentials in the URL are used: under a root only an authenticated user
/// may write to, the client with the credentials locks and the one without gets a
/// configuration error saying access was refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digest_credentials_in_the_url_are_used() {
    let Some(url) = url_for("zk") else { return };
    let hosts = hosts_of(&url);
    let root = format!("/dlock-secure-{:x}", fastrand::u64(..));
    let owner = Client::connector()
        .with_auth("digest", b"app:s3cret")
        .connect(&hosts)
        .await
        .unwrap();
    owner
        .create(
            &root,
            &[],
            &zookeeper_client::CreateMode::Persistent
                .with_acls(zookeeper_client::Acls::creator_all()),
        )
        .await
        .unwrap();

    let allowed = manager(&format!("zk://app:s3cret@{hosts}{root}")).await;
    let g = take(&allowed.lock("secure"), Duration::ZERO).await;
    assert!(g.fencing_token().get() > 0);
    g.unlock().await.unwrap();
    allowed.close().await;

    for (who, url) in [
        ("no credentials", format!("zk://{hosts}{root}")),
        ("a wrong password", format!("zk://app:wrong@{hosts}{root}")),
    ] {
        let refused = manager(&url).await;
        let err = refused
            .lock("secure")
            .try_lock(Duration::ZERO)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), dlock_api::ErrorKind::Config, "{who}: {err}");
        assert!(err.to_string().contains("refused access"), "{who}: {err}");
        refused.close().await;
    }
    for child in owner.list_children(&root).await.unwrap() {
        let _ = owner.delete(&format!("{root}/{child}"), None).await;
    }
    owner.delete(&root, None).await.unwrap();
}

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

/// Waits (5 s at most) until every request through `cutter` has been answered: its
/// clients wait on watches only.
async fn settled(cutter: &ZkReplyCut) {
    let idle = eventually(Duration::from_secs(5), || async { cutter.idle() }).await;
    assert!(idle, "requests through the proxy are still unanswered");
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

/// The ensemble member (1–3) whose `srvr` says it leads.
async fn ensemble_leader() -> Option<u16> {
    for i in 1..=3u16 {
        if zk_mode(2190 + i).await.as_deref() == Some("leader") {
            return Some(i);
        }
    }
    None
}

/// A server's mode (`leader`, `follower`, `standalone`) from the `srvr` command.
async fn zk_mode(port: u16) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let attempt = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        s.write_all(b"srvr").await.ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).await.ok()?;
        out.lines()
            .find_map(|l| l.strip_prefix("Mode: "))
            .map(|m| m.trim().to_owned())
    };
    tokio::time::timeout(Duration::from_secs(2), attempt)
        .await
        .ok()
        .flatten()
}

/// Restarts a stopped ensemble member (with the start.sh the script left in its
/// directory) when told to, or at the latest when dropped (also while a failed
/// assertion unwinds).
struct Restart {
    dir: Option<PathBuf>,
}

impl Restart {
    fn now(&mut self) {
        if let Some(dir) = self.dir.take() {
            let started = std::process::Command::new("sh")
                .arg(dir.join("start.sh"))
                .stdin(Stdio::null())
                .status();
            assert!(
                started.is_ok_and(|s| s.success()),
                "could not restart {}",
                dir.display()
            );
        }
    }
}

impl Drop for Restart {
    fn drop(&mut self) {
        self.now();
    }
}

/// A Java service using Curator's `InterProcessMutex` and two dlock clients increment
/// one non-atomic counter under the same ZooKeeper lock: no update is lost and no two
/// holders ever overlap. Then the same with Curator's read-write lock (writers) against
/// dlock's read-write lock configured with `exclusive=rw`, with Curator's
/// `LeaderLatch` against dlock's election (one leader among both), and with Curator's
/// `InterProcessSemaphoreV2` of 2 against dlock's semaphore of 2 (each holder claims
/// one of 2 slot files: never more than 2 holders among both). Last, Curator's
/// writers against dlock writers that downgrade to a read after each increment:
/// while the downgraded read lasts, the counter does not move and no writer is
/// inside (a Curator writer queued during the write must not get in at the
/// downgrade).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlock_and_java_curator_exclude_each_other() {
    let Some(url) = url_for("zk") else { return };
    const PERMITS: u32 = 2;
    for (recipe, query) in [
        ("mutex", ""),
        ("rw", "?exclusive=rw"),
        ("latch", ""),
        ("semaphore", ""),
        ("rw-downgrade", "?exclusive=rw"),
    ] {
        let dlock_url = format!("{url}{query}");
        let backend = ZkBackend::connect(&dlock_url).await.unwrap();
        let lock = name(&format!("curator-{recipe}"));
        let path = backend.lock_path(&LockName::new(lock.as_str()).unwrap());
        let dir = tempfile::tempdir().unwrap();
        let counter = dir.path().join("counter");
        std::fs::write(&counter, "0").unwrap();

        const JAVA_ITERATIONS: u64 = 150;
        const DLOCK_ITERATIONS: u64 = 100;
        let mut java = curator::worker().unwrap_or_else(|e| panic!("{e}"));
        let mut child = java
            .args(["counter", &hosts_of(&url), &path])
            .arg(&counter)
            .arg(JAVA_ITERATIONS.to_string())
            .arg(match recipe {
                "semaphore" => format!("semaphore-{PERMITS}"),
                "rw-downgrade" => "rw".to_owned(),
                _ => recipe.to_owned(),
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("run java");
        let stdout = child.stdout.take().unwrap();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let reader = std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let mut ready = Some(ready_tx);
            let mut last = String::new();
            for line in lines.by_ref() {
                let line = line.unwrap_or_default();
                if line == "ready" {
                    if let Some(tx) = ready.take() {
                        let _ = tx.send(());
                    }
                } else {
                    last = line;
                }
            }
            last
        });
        tokio::time::timeout(Duration::from_secs(60), ready_rx)
            .await
            .expect("the Java worker connected within 60 s")
            .expect("the Java worker started");

        let mut workers = Vec::new();
        for _ in 0..2 {
            let m = manager(&dlock_url).await;
            let (lock, counter) = (lock.clone(), counter.clone());
            workers.push(tokio::spawn(async move {
                let handle = m.read_write_lock(&lock);
                let mut overlaps = 0;
                for i in 0..DLOCK_ITERATIONS {
                    if recipe == "semaphore" {
                        // 1 and 2 permits by turns (2: the whole semaphore).
                        let n = 1 + u32::try_from(i % 2).unwrap();
                        let permit = m
                            .semaphore(&lock, PERMITS)
                            .try_acquire(n, Duration::from_secs(60))
                            .await
                            .unwrap()
                            .expect("permits within 60 s");
                        overlaps += claim_slots(&counter, n, PERMITS);
                        permit.release().await.unwrap();
                        continue;
                    }
                    if recipe == "latch" {
                        let term = m
                            .election(&lock)
                            .try_campaign("dlock", Duration::from_secs(60))
                            .await
                            .unwrap()
                            .expect("leading within 60 s");
                        overlaps += increment(&counter);
                        term.resign().await.unwrap();
                        continue;
                    }
                    if recipe == "rw-downgrade" {
                        let g = handle
                            .write()
                            .try_lock(Duration::from_secs(60))
                            .await
                            .unwrap()
                            .expect("lock within 60 s");
                        overlaps += increment(&counter);
                        let read = g.downgrade().await.unwrap();
                        overlaps += watch_still(&counter);
                        read.unlock().await.unwrap();
                        continue;
                    }
                    let g = if recipe == "rw" {
                        handle.write().try_lock(Duration::from_secs(60)).await
                    } else {
                        m.lock(&lock).try_lock(Duration::from_secs(60)).await
                    };
                    let g = g.unwrap().expect("lock within 60 s");
                    overlaps += increment(&counter);
                    g.unlock().await.unwrap();
                }
                m.close().await;
                overlaps
            }));
        }
        let mut overlaps = 0;
        for w in workers {
            overlaps += w.await.unwrap();
        }
        let status = tokio::task::spawn_blocking(move || child.wait())
            .await
            .unwrap()
            .unwrap();
        let summary = reader.join().unwrap();
        assert!(status.success(), "the Java worker failed: {summary}");
        assert_eq!(
            summary,
            format!("curator acquired={JAVA_ITERATIONS} overlaps=0"),
            "{recipe}"
        );
        let value: u64 = std::fs::read_to_string(&counter)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(overlaps, 0, "{recipe}: dlock saw too many holders inside");
        if recipe == "semaphore" {
            // Holders overlap by design: slots are the check, not the counter.
            eprintln!(
                "semaphore: {JAVA_ITERATIONS} (Curator) + {} (dlock) leases of {PERMITS}, never more than {PERMITS} holders",
                2 * DLOCK_ITERATIONS
            );
            drop(backend);
            continue;
        }
        assert_eq!(
            value,
            JAVA_ITERATIONS + 2 * DLOCK_ITERATIONS,
            "{recipe}: lost updates"
        );
        eprintln!(
            "{recipe}: counter {value} = {JAVA_ITERATIONS} (Curator) + {} (dlock), 0 overlaps",
            2 * DLOCK_ITERATIONS
        );
        drop(backend);
    }
}

/// An upgrade beside Curator's readers and writers (the lock-history checker's
/// overlap that once kept ZooKeeper from upgrading): dlock holds an upgradeable
/// read; a Curator writer queues behind it, with a wait that runs out, and a
/// Curator reader behind that writer. The upgrade holds at once (neither holds),
/// and when the writer gives up the reader must still stay out while the write
/// side is held: it finds dlock's marker file if it gets in. Released, the reader
/// gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_reader_whose_writer_leaves_stays_out_of_an_upgrade() {
    let Some(url) = url_for("zk") else { return };
    let url = format!("{url}?exclusive=rw");
    let m = manager(&url).await;
    let backend = ZkBackend::connect(&url).await.unwrap();
    let lock = name("curator-upgrade");
    let path = backend.lock_path(&LockName::new(lock.as_str()).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("upgraded");
    let rw = m.read_write_lock(&lock);
    let mut up = rw.upgradeable_read().lock().await.unwrap();

    const WRITER_WAIT: Duration = Duration::from_secs(3);
    let mut java = curator::worker().unwrap_or_else(|e| panic!("{e}"));
    let mut child = java
        .args(["upgrade-witness", &hosts_of(&url), &path])
        .arg(&marker)
        .arg(WRITER_WAIT.as_millis().to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run java");
    let stdout = child.stdout.take().unwrap();
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let _ = lines_tx.send(line.unwrap_or_default());
        }
    });
    assert_eq!(
        next_line(&mut lines, Duration::from_secs(60)).await,
        "queued"
    );

    // Neither queued Curator node holds: the upgrade is granted well before the
    // writer gives up.
    let asked = Instant::now();
    assert!(
        up.try_upgrade(WRITER_WAIT / 2).await.unwrap(),
        "the upgrade waited for the queued writer or its reader"
    );
    assert!(asked.elapsed() < WRITER_WAIT);
    std::fs::write(&marker, "held").unwrap();
    assert_eq!(
        next_line(&mut lines, WRITER_WAIT * 3).await,
        "writer gave-up"
    );
    // The reader behind the writer looks again as the writer's node goes (a watch
    // event, milliseconds): a second is far more than it needs to get in.
    let early = next_line(&mut lines, Duration::from_secs(1)).await;
    assert_eq!(early, "", "the Curator reader got in beside the upgrade");
    up.check()
        .expect("the upgraded hold stayed live throughout");
    std::fs::remove_file(&marker).unwrap();
    up.unlock().await.unwrap();
    assert_eq!(
        next_line(&mut lines, Duration::from_secs(30)).await,
        "reader acquired overlap=0"
    );
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());
    m.close().await;
}

/// The Java worker's next line within `within` (empty if none came).
async fn next_line(
    lines: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    within: Duration,
) -> String {
    tokio::time::timeout(within, lines.recv())
        .await
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// The semaphore's step (as the Java worker's): claim `n` of the `total` slot files
/// with exclusive creates (1 when fewer are free: more permits held than the total),
/// pause, drop them.
fn claim_slots(counter: &Path, n: u32, total: u32) -> u32 {
    let claimed: Vec<PathBuf> = (0..total)
        .map(|s| PathBuf::from(format!("{}.slot{s}", counter.display())))
        .filter(|slot| {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(slot)
                .is_ok()
        })
        .take(usize::try_from(n).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(5));
    let short = u32::from(claimed.len() < usize::try_from(n).unwrap());
    for slot in claimed {
        std::fs::remove_file(slot).unwrap();
    }
    short
}

/// The counter step both sides run: claim the marker file exclusively (counting an
/// overlap if someone else is inside), read, pause, write + 1, drop the marker.
/// A reader's work: 1 if the counter moved, or a writer was inside, during 2 ms.
fn watch_still(counter: &Path) -> u32 {
    let marker = PathBuf::from(format!("{}.held", counter.display()));
    let before = std::fs::read_to_string(counter).unwrap();
    std::thread::sleep(Duration::from_millis(2));
    let inside = marker.exists();
    let after = std::fs::read_to_string(counter).unwrap();
    u32::from(inside || before != after)
}

fn increment(counter: &Path) -> u32 {
    let marker = PathBuf::from(format!("{}.held", counter.display()));
    let claimed = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&marker)
        .is_ok();
    let value: u64 = std::fs::read_to_string(counter)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1));
    std::fs::write(counter, (value + 1).to_string()).unwrap();
    if claimed {
        std::fs::remove_file(&marker).unwrap();
        0
    } else {
        1
    }
}

/// A backend built on the application's connector opens its sessions with it (the
/// connector's session timeout, not dlock's default) and shares locks with one built
/// from the URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_on_the_applications_connector_shares_locks_with_one_from_the_url() {
    let Some(url) = url_for("zk") else { return };
    let hosts = hosts_of(&url);
    let root = format!("/dlock-connector-{:x}", fastrand::u64(..));
    let connector = Client::connector().with_session_timeout(Duration::from_secs(4));
    let backend = ZkBackend::from_connector(connector, &hosts, ZkOptions::default().root(&root))
        .await
        .unwrap();
    assert_eq!(backend.session_timeout(), Duration::from_secs(4));
    let mine = DistributeLockManager::builder(backend).build().unwrap();
    let theirs = DistributeLockManager::builder(
        ZkBackend::connect(&format!("zk://{hosts}{root}"))
            .await
            .unwrap(),
    )
    .build()
    .unwrap();
    let held = mine.lock("shared").try_lock(Duration::ZERO).await.unwrap();
    let held = held.expect("the connector's backend was refused");
    assert!(theirs
        .lock("shared")
        .try_lock(Duration::ZERO)
        .await
        .unwrap()
        .is_none());
    held.unlock().await.unwrap();
    let g = theirs
        .lock("shared")
        .try_lock(Duration::from_secs(5))
        .await
        .unwrap();
    assert!(g.is_some(), "not free after the release");
    mine.close().await;
    theirs.close().await;
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

/// A change feed's watches are one-shot: each event must set them again and ping
/// the feed, so a grant, its release and the next grant each wake it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_feed_wakes_on_every_change_not_only_the_first() {
    let Some(url) = url_for("zk") else { return };
    let backend = ZkBackend::connect(&url).await.unwrap();
    let other = ZkBackend::connect(&url).await.unwrap();
    let lock = LockName::new(name("fed")).unwrap();
    let events = backend.events().expect("ZooKeeper follows locks");
    let mut feed = events.follow(&lock).await.unwrap();
    let within = Duration::from_secs(3);
    for (round, owner) in ["a", "b", "c"].into_iter().enumerate() {
        let req = AcquireRequest::new(
            lock.clone(),
            OwnerId::new(owner),
            dlock_spi::GrantId::new(round as u64 + 1),
        )
        .with_lease(Duration::from_secs(10));
        let token = other.try_acquire(&req).await.unwrap().token().unwrap();
        let pinged = tokio::time::timeout(within, feed.changed()).await;
        assert_eq!(
            pinged.ok(),
            Some(true),
            "round {round}: the grant was not reported"
        );
        let release = dlock_spi::ReleaseRequest::new(
            lock.clone(),
            OwnerId::new(owner),
            dlock_spi::GrantId::new(round as u64 + 1),
            dlock_spi::LockMode::Exclusive,
            token,
        );
        other.release(&release).await.unwrap();
        let pinged = tokio::time::timeout(within, feed.changed()).await;
        assert_eq!(
            pinged.ok(),
            Some(true),
            "round {round}: the release was not reported"
        );
    }
}
