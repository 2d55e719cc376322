//! Read holds and permits: the readers' horizon to its last millisecond, the last permit freeing the name, writers beside an idle semaphore.

use std::time::Duration;

use dlock_api::spi::{
    AcquireRequest, Fairness, LockName, LockRemoteResource, OwnerId, ReleaseRequest, ReleaseResult,
};
use dlock_api::LockMode;
use dlock_redis::{RedisBackend, RedisOptions};
use testsuite::conformance::{take, take_permits};

use super::fixtures::*;

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
