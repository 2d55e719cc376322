//! Nodes as Curator lays them out: names under the root, another session's node not adopted, an upgrade's leftovers, semaphores' mutex, tokens across deletion, digest credentials.

use std::time::{Duration, Instant};

use dlock_api::LockMode;
use dlock_spi::{AcquireRequest, HolderKey, LockName, LockRemoteResource, OwnerId};
use dlock_zk::ZkBackend;
use testsuite::backends::assert_held_by_a_curator_node;
use testsuite::conformance::{eventually, take};
use zookeeper_client::Client;

use super::fixtures::*;

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
