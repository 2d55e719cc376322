//! Semaphores: permits never exceed the total (and are really shared), waiters are
//! served in arrival order, a dead holder's permits come back after its lease, and
//! the total is a property of the semaphore while it is in use. A backend without
//! semaphores must refuse them with `Unsupported`.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use dlock_api::{DistributeLockManager, Semaphore, SemaphorePermit};
use dlock_spi::ErrorKind;

use super::Env;
use crate::TestBackend;

/// True when the backend has semaphores; otherwise checks that it refuses them, as
/// a backend without them must, and the case ends there.
async fn has_semaphores(env: &Env, m: &DistributeLockManager) -> bool {
    if m.capabilities().semaphore {
        return true;
    }
    let err = m
        .semaphore("refused", 2)
        .try_acquire(1, Duration::ZERO)
        .await
        .expect_err("a backend without semaphores refuses permits");
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    env.assert_no_leaks().await;
    false
}

/// How many wait for lock or semaphore `name`, as `inspect` tells (0 when it cannot).
pub async fn waiting(m: &DistributeLockManager, name: &str) -> usize {
    m.inspect(name)
        .await
        .ok()
        .flatten()
        .and_then(|s| s.waiters)
        .unwrap_or(0)
}

/// Takes `n` permits of `sem` without waiting; they must be free (as [`super::take`]
/// for a lock).
pub async fn take_permits(sem: &Semaphore, n: u32) -> SemaphorePermit {
    sem.try_acquire(n, Duration::ZERO)
        .await
        .expect("acquire without error")
        .unwrap_or_else(|| panic!("{n} permits of {:?} not free", sem.name().ok()))
}

/// 6 tasks on 3 clients take 1 or 2 of 3 permits, 60 times in all: the permits in
/// use never exceed 3, and holders really overlap (it is not a mutex). Every grant's
/// token is new (holders overlap, so grants may reach a shared register out of
/// order; but no two grants share a token, and each task's tokens grow). Then 8
/// try-once acquirers at one instant on the idle semaphore: at most 3 granted.
pub async fn semaphore_permits_never_exceed_the_total(backend: Arc<dyn TestBackend>) {
    const TOTAL: u32 = 3;
    const GRANTS: usize = 60;
    let env = Env::new(backend);
    let managers = [
        env.manager().await,
        env.manager().await,
        env.manager().await,
    ];
    if !has_semaphores(&env, &managers[0]).await {
        for m in &managers {
            m.close().await;
        }
        return;
    }
    let in_use = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));
    let over = Arc::new(AtomicUsize::new(0));
    let grants = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(Mutex::new(HashSet::new()));
    let mut tasks = Vec::new();
    for t in 0..6 {
        let sem = managers[t % 3].semaphore("pool", TOTAL);
        let (in_use, most, over, grants, tokens) = (
            Arc::clone(&in_use),
            Arc::clone(&most),
            Arc::clone(&over),
            Arc::clone(&grants),
            Arc::clone(&tokens),
        );
        tasks.push(tokio::spawn(async move {
            let mut last = 0;
            while grants.fetch_add(1, Ordering::SeqCst) < GRANTS {
                let n = 1 + u32::from(fastrand::bool());
                let permit = sem
                    .try_acquire(n, Duration::from_secs(30))
                    .await
                    .expect("acquire without error")
                    .expect("permits within 30 s");
                assert_eq!(permit.permits(), n);
                let token = permit.fencing_token().get();
                assert!(
                    token > last,
                    "a task's next grant has token {token} after {last}"
                );
                last = token;
                let fresh = tokens
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(token);
                assert!(fresh, "two grants share token {token}");
                let now = in_use.fetch_add(n, Ordering::SeqCst) + n;
                most.fetch_max(now, Ordering::SeqCst);
                if now > TOTAL {
                    over.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(fastrand::u64(2..=15))).await;
                in_use.fetch_sub(n, Ordering::SeqCst);
                permit.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    assert_eq!(
        over.load(Ordering::SeqCst),
        0,
        "more than {TOTAL} permits in use"
    );
    assert!(
        most.load(Ordering::SeqCst) >= 2,
        "holders never overlapped: the semaphore acted as a mutex"
    );
    assert_eq!(
        tokens.lock().unwrap_or_else(PoisonError::into_inner).len(),
        GRANTS
    );
    assert_eq!(
        managers[0]
            .semaphore("pool", TOTAL)
            .held()
            .await
            .expect("held"),
        0
    );
    // A burst on the idle semaphore: 8 try-once acquirers at the same instant,
    // nobody queued (the uncontended path, where a backend has one). Grants are kept
    // until every attempt has answered: at most 3 may stand.
    let start = Arc::new(tokio::sync::Barrier::new(8));
    let burst: Vec<_> = (0..8)
        .map(|i| {
            let sem = managers[i % 3].semaphore("pool", TOTAL);
            let start = Arc::clone(&start);
            tokio::spawn(async move {
                start.wait().await;
                sem.try_acquire(1, Duration::ZERO)
                    .await
                    .expect("acquire without error")
            })
        })
        .collect();
    let mut standing = Vec::new();
    for attempt in burst {
        standing.extend(attempt.await.expect("task"));
    }
    assert!(
        standing.len() <= TOTAL as usize,
        "{} of 8 simultaneous try-once acquirers were granted a permit of {TOTAL}",
        standing.len()
    );
    for permit in standing {
        permit.release().await.expect("release");
    }
    let refs: Vec<&DistributeLockManager> = managers.iter().collect();
    env.finish(&refs).await;
}

/// Waiters are served in arrival order: with a waiter for 2 queued, a newcomer for
/// 1 does not pass it even when 1 is free, and a waiter for 1 queued after it is
/// served after it.
/// A holder that stops renewing (a dead process) loses its permits after its lease
/// — its lost signal first — and they come back to the queue. On session-bound
/// backends (ZooKeeper), where holds have no lease, the holder's manager closes
/// instead (its session ends).
pub async fn semaphore_serves_in_order_and_recovers_dead_permits(backend: Arc<dyn TestBackend>) {
    let env = Env::new(backend);
    let live = env.manager().await;
    if !has_semaphores(&env, &live).await {
        live.close().await;
        return;
    }
    let leased = live.capabilities().lease;
    let dead = if leased {
        env.manager_with(|b| b.lease(Duration::from_millis(600)).watchdog(false))
            .await
    } else {
        env.manager().await
    };
    // The dead holder takes 1, a live holder the other 1 of 2.
    let lapsing = take_permits(&dead.semaphore("queue", 2), 1).await;
    let lost = lapsing.lost_signal();
    let lost_at = tokio::spawn(async move {
        lost.lost().await;
        Instant::now()
    });
    let held = take_permits(&live.semaphore("queue", 2), 1).await;
    // B wants both, queued first; C wants one, queued after B.
    let sem = live.semaphore("queue", 2);
    let b = tokio::spawn({
        let sem = sem.clone();
        async move {
            let p = sem.acquire(2).await.expect("B acquires");
            (p, Instant::now())
        }
    });
    let queued = super::eventually(Duration::from_secs(5), || async {
        waiting(&live, "queue").await >= 1
    })
    .await;
    assert!(queued, "B never showed as waiting");
    // The dead holder's permit lapses (its lost signal first): one is free, but a
    // newcomer for 1 may not pass B, queued first for 2.
    if !leased {
        dead.close().await;
    }
    let lost_at = tokio::time::timeout(Duration::from_secs(5), lost_at)
        .await
        .expect("the dead holder's lost signal fires")
        .expect("task");
    let lapsed = super::eventually(Duration::from_secs(5), || async {
        sem.held().await.is_ok_and(|n| n == 1)
    })
    .await;
    assert!(lapsed, "the dead holder's permit did not come back");
    let passing = sem.try_acquire(1, Duration::ZERO).await.expect("acquire");
    assert!(
        passing.is_none(),
        "a newcomer passed B, who was queued first"
    );
    let c = tokio::spawn({
        let sem = sem.clone();
        async move {
            let p = sem.acquire(1).await.expect("C acquires");
            (p, Instant::now())
        }
    });
    held.release().await.expect("release");
    let (pb, b_at) = tokio::time::timeout(Duration::from_secs(5), b)
        .await
        .expect("B gets both permits once they are free")
        .expect("task");
    assert!(
        lost_at <= b_at,
        "the dead holder learned of its loss after B was granted"
    );
    assert!(!c.is_finished(), "C got a permit while B held both");
    pb.release().await.expect("release");
    let (pc, _) = tokio::time::timeout(Duration::from_secs(5), c)
        .await
        .expect("C gets its permit after B")
        .expect("task");
    pc.release().await.expect("release");
    drop(lapsing);
    env.finish(&[&live, &dead]).await;
}

/// A release wakes only the waiters it frees room for, not all: with 6 waiters for
/// 1 permit each parked behind a holder of both of 2, the release grants exactly
/// two, the first two (still so 200 ms later, by the waiters and by `inspect`),
/// and, where waiters are told of releases, it costs at most 4 backend attempts
/// (each grant's, and one by the waiter behind, who finds no room) — a herd would
/// make all 6 try. (MariaDB's permit waiters are not told: they look at their own
/// next poll, and the release costs no attempt at once.)
pub async fn semaphore_release_wakes_only_whom_it_frees(backend: Arc<dyn TestBackend>) {
    const WAITERS: usize = 6;
    let env = Env::new(backend);
    let a = env.manager().await;
    if !has_semaphores(&env, &a).await {
        a.close().await;
        return;
    }
    let holder = take_permits(&a.semaphore("herd", 2), 2).await;
    let base = env.backend().acquire_attempts();
    let (granted_tx, mut granted) = tokio::sync::mpsc::unbounded_channel();
    let release_now = Arc::new(tokio::sync::Semaphore::new(0));
    let (waiter_managers, told) = env.told_managers(2).await;
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let sem = waiter_managers[i % 2].semaphore("herd", 2);
        let (granted_tx, release_now) = (granted_tx.clone(), Arc::clone(&release_now));
        tasks.push(tokio::spawn(async move {
            let permit = sem
                .try_acquire(1, Duration::from_secs(30))
                .await
                .expect("acquire without error")
                .expect("a permit within 30 s");
            granted_tx.send(i).expect("the test listens");
            release_now.acquire().await.expect("semaphore").forget();
            permit.release().await.expect("release");
        }));
        // One at a time, so each is parked before the next arrives.
        let queued = super::eventually(Duration::from_secs(5), || async {
            waiting(&a, "herd").await > i
        })
        .await;
        assert!(queued, "waiter {i} never showed as waiting");
    }
    let before = super::all_parked(&env, told, base, WAITERS).await;
    holder.release().await.expect("release");
    // Counted from the release (see `release_wakes_one`).
    super::no_herd_since(&env, told, before, 4, "releasing 2 permits", WAITERS).await;
    let mut first = Vec::new();
    for _ in 0..2 {
        let i = tokio::time::timeout(Duration::from_secs(10), granted.recv())
            .await
            .expect("a waiter got a permit after the release")
            .expect("waiters are running");
        first.push(i);
    }
    first.sort_unstable();
    assert_eq!(first, [0, 1], "the first two waiters are served first");
    // Time for a grant too many to show itself.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        granted.try_recv().is_err(),
        "a third waiter got a permit while two held both"
    );
    let state = a.inspect("herd").await.expect("inspect").expect("held");
    let held: u32 = state.holders.iter().filter_map(|h| h.mode.permits()).sum();
    assert_eq!(held, 2, "{state:?}");
    release_now.add_permits(WAITERS);
    for t in tasks {
        t.await.expect("waiter");
    }
    env.finish(&[&a, &waiter_managers[0], &waiter_managers[1]])
        .await;
}

/// The watchdog keeps permits past their lease: held for four leases, they are not
/// lost, still counted (nobody else gets the room), and still shown with a lease
/// no longer than one; once released the room is there again.
pub async fn semaphore_watchdog_keeps_permits(backend: Arc<dyn TestBackend>) {
    let env = Env::new(backend);
    let lease = super::WATCHED_LEASE;
    let a = env.manager_with(|b| b.lease(lease)).await;
    let b = env.manager().await;
    if !has_semaphores(&env, &a).await {
        env.finish(&[&a, &b]).await;
        return;
    }
    let permits = take_permits(&a.semaphore("watched", 2), 2).await;
    // Time passing is the subject of this test.
    tokio::time::sleep(lease * 4).await;
    assert!(!permits.is_lost(), "lost: {:?}", permits.lost_reason());
    let other = b.semaphore("watched", 2);
    let refused = other.try_acquire(1, Duration::ZERO).await.expect("acquire");
    assert!(
        refused.is_none(),
        "a permit was granted past a watched holder of both"
    );
    let state = b
        .inspect("watched")
        .await
        .expect("inspect")
        .expect("the semaphore is held");
    assert_eq!(state.holders.len(), 1, "{state:?}");
    let holder = &state.holders[0];
    assert_eq!(holder.mode.permits(), Some(2), "{holder:?}");
    if a.capabilities().lease {
        let left = holder
            .remaining_lease
            .expect("a leased hold shows its lease");
        assert!(left <= lease, "{left:?} left of a {lease:?} lease");
        assert_eq!(a.watched_count(), 1);
    }
    permits.release().await.expect("release");
    assert_eq!(a.watched_count(), 0);
    let granted = take_permits(&other, 2).await;
    granted.release().await.expect("release");
    env.finish(&[&a, &b]).await;
}

/// The total is the semaphore's while it is in use: a different one is refused
/// (and changes nothing), bad permit counts are refused, and once the semaphore is
/// idle a new total takes effect.
pub async fn semaphore_totals_must_agree(backend: Arc<dyn TestBackend>) {
    let env = Env::new(backend);
    let m = env.manager().await;
    if !has_semaphores(&env, &m).await {
        m.close().await;
        return;
    }
    let three = m.semaphore("totals", 3);
    let permit = take_permits(&three, 2).await;
    let err = m
        .semaphore("totals", 5)
        .try_acquire(1, Duration::ZERO)
        .await
        .expect_err("another total while in use");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(three
        .try_acquire(1, Duration::ZERO)
        .await
        .expect("acquire")
        .is_some_and(|p| p.permits() == 1));
    for bad in [0, 4] {
        let err = three
            .try_acquire(bad, Duration::ZERO)
            .await
            .expect_err("a bad permit count");
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{bad}: {err}");
    }
    permit.release().await.expect("release");
    // Idle now (the 1-permit guard above was dropped): a new total takes effect.
    let five = m.semaphore("totals", 5);
    let reset = super::eventually(Duration::from_secs(5), || async {
        five.try_acquire(5, Duration::ZERO)
            .await
            .ok()
            .flatten()
            .is_some()
    })
    .await;
    assert!(reset, "the idle semaphore did not take its new total");
    env.finish(&[&m]).await;
}
