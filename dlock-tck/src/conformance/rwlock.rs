//! Cases on a read-write lock's one owner: a writer reads beside its write hold and
//! downgrades without letting a writer in; a plain reader may not write; an
//! upgradeable reader admits plain readers, excludes writers and other upgradeable
//! readers, and upgrades ahead of a queued writer.

use std::sync::Arc;
use std::time::Duration;

use dlock_api::{Acquisition, DistributeLock, DistributeLockManager, LockGuard, ReadWriteLock};
use dlock_spi::{ErrorKind, LockMode};

use super::{eventually, holders, refusal, take, waiters, Env};
use crate::TestBackend;

/// How long a queued rival may wait in these cases (they release long before).
const RIVAL_WAIT: Duration = Duration::from_secs(30);

/// Whether every holder of `name` is the owner of `rw` (and there is one).
async fn only_ours(m: &DistributeLockManager, rw: &ReadWriteLock, name: &str) -> bool {
    let found = holders(m, name).await;
    !found.is_empty() && found.iter().all(|o| o == rw.read().owner())
}

/// A task whose `writer` waits for "doc" (up to `RIVAL_WAIT`) and must be granted
/// in the end; returns once `m` sees it queued.
async fn queue_writer(
    m: &DistributeLockManager,
    writer: &DistributeLock,
) -> tokio::task::JoinHandle<()> {
    let queued = writer.clone();
    let task = tokio::spawn(async move {
        let guard = queued
            .try_lock(RIVAL_WAIT)
            .await
            .expect("acquire")
            .expect("the queued writer is granted once the holds it waits for go");
        guard.unlock().await.expect("unlock");
    });
    assert!(
        eventually(Duration::from_secs(5), || async {
            waiters(m, "doc").await >= 1
        })
        .await,
        "the writer never queued"
    );
    task
}

/// Downgrades `write` (of "doc"), and waits (bounded) until `m` sees the write
/// side let go: one hold left.
async fn downgrade(m: &DistributeLockManager, write: LockGuard) -> LockGuard {
    let read = write.downgrade().await.expect("downgrade");
    assert!(
        eventually(Duration::from_secs(5), || async {
            holders(m, "doc").await.len() == 1
        })
        .await,
        "the write side was not let go"
    );
    read
}

/// Whether `lock`, tried once, is refused (an error fails the case).
async fn refused(lock: &DistributeLock) -> bool {
    lock.try_lock(Duration::ZERO)
        .await
        .expect("no error")
        .is_none()
}

/// True when the backend lets one owner hold both modes; otherwise checks that a
/// writer's read is refused as unsupported.
async fn cross_mode_or_refused(m: &DistributeLockManager) -> bool {
    if m.capabilities().cross_mode || !m.capabilities().shared {
        return m.capabilities().cross_mode;
    }
    let rw = m.read_write_lock("refused");
    let _write = take(rw.write(), Duration::ZERO).await;
    let err = refusal(rw.read(), "a read beside the write is refused").await;
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    false
}

/// One owner for both sides: the write side re-enters, the read side is granted
/// beside it (and re-enters), other owners stay out of both, also once that read is
/// let go (the write side stays); a downgrade takes the
/// read side and lets the write side go while a writer is queued — that writer
/// stays out until the read is released; a plain reader asking for the write side
/// or the upgradeable side is refused with `InvalidArgument`, touching nothing.
pub async fn a_writer_reads_and_downgrades(backend: Arc<dyn TestBackend>) {
    let env = Env::new(backend);
    let (a, b) = env.two_managers().await;
    if !cross_mode_or_refused(&a).await {
        env.finish(&[&a, &b]).await;
        return;
    }
    let rw = a.read_write_lock("doc");
    let rival = b.read_write_lock("doc");
    let w1 = take(rw.write(), Duration::ZERO).await;
    let w2 = take(rw.write(), Duration::ZERO).await;
    assert_eq!(w2.acquisition(), Acquisition::Reentered);
    assert_eq!(w2.fencing_token(), w1.fencing_token());
    let r1 = take(rw.read(), Duration::ZERO).await;
    assert_eq!(
        r1.acquisition(),
        Acquisition::New,
        "a read beside the write"
    );
    assert_eq!(r1.mode(), LockMode::Shared);
    let r2 = take(rw.read(), Duration::ZERO).await;
    assert_eq!(r2.acquisition(), Acquisition::Reentered);
    assert_eq!(r2.fencing_token(), r1.fencing_token());
    for side in [rival.read(), rival.write()] {
        assert!(
            refused(side).await,
            "another owner took the {:?} side beside a writer",
            side.mode()
        );
    }
    assert!(only_ours(&a, &rw, "doc").await);
    drop(r2);
    r1.unlock().await.expect("unlock the read side");
    // Its own read let go, the writer holds as before.
    assert!(
        refused(rival.write()).await,
        "another owner took the lock when its writer let go of the read beside it"
    );
    w1.check().expect("the write hold is live");
    assert!(only_ours(&a, &rw, "doc").await);
    drop(w2);

    // Downgraded with nobody queued, the read keeps writers out.
    let read = downgrade(&a, w1).await;
    assert!(
        refused(rival.write()).await,
        "a writer took the lock from a downgraded reader"
    );
    read.unlock().await.expect("unlock");

    // A write hold that lapses beside its owner's read leaves the read in force.
    if a.capabilities().lease {
        let lease = Duration::from_millis(600);
        let lapsing = rw
            .write()
            .try_lock_with(Duration::ZERO, &dlock_api::LockOptions::new().lease(lease))
            .await
            .expect("no error")
            .expect("the write side is free");
        let read = take(rw.read(), Duration::ZERO).await;
        lapsing.lost().await;
        assert!(
            rival
                .write()
                .try_lock(lease + Duration::from_millis(400))
                .await
                .expect("no error")
                .is_none(),
            "a writer took the lock from a live read after its owner's write lapsed"
        );
        read.check().expect("the read hold is live");
        // Released before the next take, not dropped: a dropped guard's release goes
        // in the background, and a store may keep a writer's value beside its
        // owner's read until that release (Redis keeps it through the read's lease).
        let err = lapsing
            .unlock()
            .await
            .expect_err("the lapsed write is lost");
        assert_eq!(err.kind(), ErrorKind::LockLost, "{err}");
        read.unlock().await.expect("unlock");
    }

    let w1 = take(rw.write(), Duration::ZERO).await;

    // A writer queues; the downgrade keeps it out.
    let writer = queue_writer(&a, rival.write()).await;
    let read = downgrade(&a, w1).await;
    assert_eq!(read.mode(), LockMode::Shared);
    assert_eq!(read.acquisition(), Acquisition::New);
    assert!(
        only_ours(&a, &rw, "doc").await,
        "a writer got in during the downgrade"
    );
    assert!(!writer.is_finished(), "the queued writer was granted");

    // A plain reader may not write: refused, nothing touched.
    let err = refusal(rw.write(), "a write beside a plain read is refused").await;
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    // Nor the upgradeable side (two readers doing so would wait for each other).
    let err = rw
        .upgradeable_read()
        .try_lock(Duration::ZERO)
        .await
        .expect_err("an upgradeable read beside a plain read is refused");
    let refusal = if a.capabilities().upgrade {
        ErrorKind::InvalidArgument
    } else {
        ErrorKind::Unsupported
    };
    assert_eq!(err.kind(), refusal, "{err}");
    read.check().expect("the read hold is untouched");
    assert!(only_ours(&a, &rw, "doc").await);
    read.unlock().await.expect("unlock");
    writer.await.expect("the writer");
    env.finish(&[&a, &b]).await;
}

/// An upgradeable read admits plain readers, and keeps writers and other
/// upgradeable readers out; it cannot upgrade while a reader reads; its upgrade
/// waits for that reader, goes ahead of a writer queued before it (which stays out
/// throughout), makes new readers stand back, and carries a token no older than its
/// read's; a write guard re-entering the upgrade keeps the read it stands beside
/// when the upgradeable guard goes; released, the queued writer gets the lock.
pub async fn upgradeable_reads_upgrade_without_a_writer_between(backend: Arc<dyn TestBackend>) {
    let env = Env::new(backend);
    let (a, b) = env.two_managers().await;
    let c = env.manager().await;
    if !a.capabilities().upgrade {
        if a.capabilities().shared {
            let err = a
                .read_write_lock("doc")
                .upgradeable_read()
                .try_lock(Duration::ZERO)
                .await
                .expect_err("refused");
            assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
        }
        env.finish(&[&a, &b, &c]).await;
        return;
    }
    let rw = a.read_write_lock("doc");
    let mut up = rw
        .upgradeable_read()
        .try_lock(Duration::ZERO)
        .await
        .expect("no error")
        .expect("the upgradeable side is free");
    let reading = up.fencing_token();
    let reader = b.read_write_lock("doc");
    let read = take(reader.read(), Duration::ZERO).await;
    let other = b.read_write_lock("doc");
    assert!(
        other
            .upgradeable_read()
            .try_lock(Duration::ZERO)
            .await
            .expect("no error")
            .is_none(),
        "two upgradeable readers at once"
    );
    assert!(
        refused(other.write()).await,
        "a writer beside an upgradeable reader"
    );
    assert!(
        !up.try_upgrade(Duration::ZERO).await.expect("no error"),
        "upgraded while another reader reads"
    );
    assert!(!up.is_upgraded());

    // A writer queues first; the upgrade then waits for the reader, ahead of it.
    let writer = queue_writer(&a, c.read_write_lock("doc").write()).await;
    let (upgraded, ()) = tokio::join!(tokio::time::timeout(RIVAL_WAIT, up.upgrade()), async {
        assert!(
            eventually(Duration::from_secs(5), || async {
                waiters(&a, "doc").await >= 2
            })
            .await,
            "the upgrade never waited"
        );
        read.unlock().await.expect("the reader leaves");
    });
    upgraded
        .expect("the upgrade waited behind the queued writer (deadlock)")
        .expect("upgrade");
    assert!(up.is_upgraded());
    // Newer, or (ZooKeeper) the read's: the upgrade goes on with its read's tenure.
    assert!(
        up.fencing_token() >= reading,
        "the write side's token is older than the read's"
    );
    up.check().expect("every hold is live");
    assert!(
        only_ours(&a, &rw, "doc").await,
        "someone else holds beside the upgraded hold"
    );
    assert!(!writer.is_finished(), "the queued writer got in");
    assert!(
        refused(reader.read()).await,
        "a reader beside the upgraded hold"
    );

    // A write guard taken beside the upgrade (it re-enters the upgraded hold)
    // outlasts the upgradeable guard: the read it was granted beside stays with it,
    // so the queued writer stays out (on ZooKeeper the read's node keeps it out).
    let kept = take(rw.write(), Duration::ZERO).await;
    assert_eq!(kept.acquisition(), Acquisition::Reentered);
    up.unlock().await.expect("unlock");
    let state = a.inspect("doc").await.expect("inspect").expect("held");
    assert!(
        state
            .holders
            .iter()
            .any(|h| h.mode == LockMode::Shared && h.owner == *rw.read().owner()),
        "the read an upgraded write stands beside was let go before the write: {state:?}"
    );
    assert!(
        only_ours(&a, &rw, "doc").await,
        "someone else holds beside the kept write"
    );
    assert!(!writer.is_finished(), "the queued writer got in");
    kept.unlock().await.expect("unlock");
    writer.await.expect("the writer");
    env.finish(&[&a, &b, &c]).await;
}

/// A request naming an own hold in the other mode that is not there (released, or
/// never made) is judged as any other, on every backend: a read beside a missing
/// write is granted on a free lock, and a write beside a missing read is refused
/// while another owner reads.
pub async fn a_request_beside_a_missing_hold_is_judged_as_any_other(backend: Arc<dyn TestBackend>) {
    use dlock_spi::{AcquireRequest, GrantId, OwnerId};
    let env = Env::new(backend);
    let m = env.manager().await;
    if !m.capabilities().cross_mode {
        env.finish(&[&m]).await;
        return;
    }
    let resource = env
        .backend()
        .client()
        .await
        .unwrap_or_else(|e| panic!("a client: {e}"));
    let name = env.full("doc");
    // The lock has been used (and is free): stores that keep a row or a key per
    // lock have one.
    let before = AcquireRequest::new(name.clone(), OwnerId::new("earlier"), GrantId::new(7));
    assert!(resource
        .try_acquire(&before)
        .await
        .expect("no error")
        .is_acquired());
    resource
        .release(&before.release_of_grant())
        .await
        .expect("release");
    let reader = OwnerId::new("reader-beside-nothing");
    let read = AcquireRequest::new(name.clone(), reader.clone(), GrantId::new(1))
        .with_mode(LockMode::Shared)
        .with_alongside(Some(GrantId::new(99)));
    let granted = resource.try_acquire(&read).await.expect("no error");
    assert!(
        granted.is_acquired(),
        "a read beside a write that is not there was refused on a free lock"
    );
    let writer = OwnerId::new("writer-beside-nothing");
    let write = AcquireRequest::new(name.clone(), writer, GrantId::new(2))
        .with_alongside(Some(GrantId::new(98)));
    let refused = resource.try_acquire(&write).await.expect("no error");
    assert!(
        !refused.is_acquired(),
        "a write beside a read that is not there was granted beside another owner's read"
    );
    let release = read.release_of_grant();
    resource.release(&release).await.expect("release");
    env.finish(&[&m]).await;
}
