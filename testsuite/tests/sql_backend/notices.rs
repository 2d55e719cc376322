//! Release notices: PostgreSQL's LISTEN/NOTIFY (who is told, a listener that comes back) and MariaDB/MySQL's bells.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_jdbc::{JdbcBackend, JdbcOptions};
use dlock_spi::{
    AcquireRequest, Backoff, GrantId, LockName, LockRemoteResource, OwnerId, ReleaseResult,
};
use sqlx::Connection;
use testsuite::conformance::{eventually, take};
use testsuite::proxy::Fault;

use super::fixtures::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_release_notices_go_out_when_someone_waits_or_a_term_ends() {
    let Some(url) = sql_url("postgres") else {
        return;
    };
    let backend = JdbcBackend::connect(&url).await.unwrap();
    let mut listener = sqlx::postgres::PgListener::connect(&url).await.unwrap();
    listener.listen("dlock_release").await.unwrap();
    let lock = format!("quiet-{:x}", fastrand::u64(..));
    let name = LockName::new(lock.clone()).unwrap();
    let ask = |owner: &str| {
        AcquireRequest::new(name.clone(), OwnerId::new(owner), GrantId::new(1))
            .with_lease(Duration::from_secs(30))
    };
    // Nobody waits: no notice.
    let alone = ask("a");
    assert!(backend.try_acquire(&alone).await.unwrap().is_acquired());
    let released = backend.release(&alone.release_of_grant()).await.unwrap();
    assert_eq!(released, ReleaseResult::Released);
    assert_eq!(release_notices_for(&mut listener, &url, &lock).await, 0);
    // A term of leadership ends: its observers hear of it, waiters or not.
    let term = ask("a").with_purpose(dlock_spi::HoldPurpose::Leadership);
    assert!(backend.try_acquire(&term).await.unwrap().is_acquired());
    backend.release(&term.release_of_grant()).await.unwrap();
    assert_eq!(release_notices_for(&mut listener, &url, &lock).await, 1);
    // Someone waits: the release tells it.
    assert!(backend.try_acquire(&alone).await.unwrap().is_acquired());
    let waiter = {
        let backend = backend.clone();
        let req = ask("b").with_deadline(Some(Instant::now() + Duration::from_secs(10)));
        tokio::spawn(async move { backend.try_acquire(&req).await.unwrap() })
    };
    assert!(
        eventually(Duration::from_secs(5), || async {
            backend
                .inspect(&name)
                .await
                .unwrap()
                .is_some_and(|state| state.waiters.is_some_and(|n| n > 0))
        })
        .await,
        "the waiter never queued"
    );
    backend.release(&alone.release_of_grant()).await.unwrap();
    assert!(waiter.await.unwrap().is_acquired());
    assert_eq!(release_notices_for(&mut listener, &url, &lock).await, 1);
    backend.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_notice_wakes_a_slow_poller_at_once() {
    for (label, url) in notified_backends() {
        // Pollers that would otherwise sleep 3 s between tries.
        let holder = manager(&url, JdbcOptions::default(), LONG_LEASE).await;
        let (backend, waiter) = backend_and_manager(&url, polling_every(3), LONG_LEASE).await;
        let name = format!("notify-{:x}", fastrand::u64(..));
        let g = take(&holder.lock(&name), Duration::ZERO).await;
        let delay = granted_after_release(&waiter, &backend, &name, g).await;
        assert!(
            delay < Duration::from_millis(1000),
            "{label}: woken {delay:?} after the release; the release notice did not arrive"
        );
        holder.close().await;
        waiter.close().await;
    }
}

/// A release on PostgreSQL or SQLite wakes the writer first in the queue, not a
/// waiter in every process: six waiters, each on a backend of its own (its own
/// `LISTEN` connection or notice socket, as a process of its own has), polling
/// only every 10 s; one release makes at most two acquire attempts among them (the head's, and at most one more), and the lock
/// passes on down the queue, one notice per release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_notice_wakes_the_writer_first_in_line_only() {
    const WAITERS: usize = 6;
    for (label, url) in notified_backends() {
        let slow = polling_every(10).waiter_liveness(Duration::from_secs(30));
        let holder = manager(&url, JdbcOptions::default(), LONG_LEASE).await;
        let name = format!("head-{:x}", fastrand::u64(..));
        let g = take(&holder.lock(&name), Duration::ZERO).await;
        let (mut backends, mut managers, mut tasks) = (Vec::new(), Vec::new(), Vec::new());
        let granted = Arc::new(tokio::sync::Semaphore::new(0));
        for _ in 0..WAITERS {
            let (backend, m) = backend_and_manager(&url, slow.clone(), LONG_LEASE).await;
            let (lock, granted) = (m.lock(&name), Arc::clone(&granted));
            tasks.push(tokio::spawn(async move {
                let got = lock
                    .try_lock(Duration::from_secs(30))
                    .await
                    .unwrap()
                    .unwrap();
                granted.add_permits(1);
                got.unlock().await.unwrap();
            }));
            backends.push(backend);
            managers.push(m);
        }
        let attempts = || {
            backends
                .iter()
                .map(JdbcBackend::acquire_attempts)
                .sum::<u64>()
        };
        let lock_name = LockName::new(name.clone()).unwrap();
        let queued = eventually(Duration::from_secs(5), || async {
            waiters_of(&backends[0], &lock_name).await == WAITERS
        })
        .await;
        assert!(queued, "{label}: the waiters did not all queue");
        // Each waiter looks once more soon after it queued (a release may have
        // missed its entry), then waits for its notice (its own next look is 10 s
        // off): count from when those looks are over — no attempt for 100 ms.
        let settled = eventually(Duration::from_secs(5), || {
            let last = attempts();
            async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                attempts() == last
            }
        })
        .await;
        assert!(settled, "{label}: the queued waiters kept looking");
        let before = attempts();
        g.unlock().await.unwrap();
        let first = tokio::time::timeout(Duration::from_secs(5), granted.acquire())
            .await
            .unwrap_or_else(|_| {
                panic!("{label}: no waiter was granted the lock within 5 s of the release")
            });
        first.unwrap().forget();
        tokio::time::sleep(Duration::from_millis(200)).await;
        // By now the first waiter has released and the next ones taken it in turn;
        // every release woke exactly its successor.
        let passed = granted.available_permits() + 1;
        let woken = attempts() - before;
        assert!(
            woken <= passed as u64 + 1,
            "{label}: {passed} grant(s) took {woken} acquire attempts among {WAITERS} waiters"
        );
        let all = tokio::time::timeout(Duration::from_secs(10), async {
            for t in tasks {
                t.await.unwrap();
            }
        })
        .await;
        assert!(all.is_ok(), "{label}: the lock did not pass down the queue");
        holder.close().await;
        for m in managers {
            m.close().await;
        }
    }
}

/// PostgreSQL and SQLite: a queued writer waits for the release notice that names it, and
/// looks on its own only as often as the backoff's longest delay — not climbing
/// the backoff from its shortest, which costs every waiter of a hot lock a refused
/// attempt every few milliseconds. With the default backoff (5 ms doubling to
/// 250 ms, equal jitter) the climb makes 6 attempts within the first 160–320 ms of
/// a wait; a waiter that waits for its notice makes at most 4 in 300 ms (the first,
/// the look soon after it queued, then one every 125–250 ms). (That the release wakes
/// it at once: `a_release_notice_wakes_a_slow_poller_at_once`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_writer_waits_for_its_notice_not_a_climbing_backoff() {
    for (label, url) in notified_backends() {
        let holder = manager(&url, JdbcOptions::default(), LONG_LEASE).await;
        let (backend, waiter) = backend_and_manager(&url, JdbcOptions::default(), LONG_LEASE).await;
        let name = format!("told-{:x}", fastrand::u64(..));
        let held = take(&holder.lock(&name), Duration::ZERO).await;
        let started = Instant::now();
        let waiting = {
            let lock = waiter.fair_lock(&name);
            tokio::spawn(async move { lock.try_lock(Duration::from_secs(20)).await })
        };
        assert!(
            eventually(Duration::from_secs(5), || async {
                backend.acquire_attempts() >= 1
            })
            .await,
            "{label}: the waiter never looked"
        );
        tokio::time::sleep(Duration::from_millis(300).saturating_sub(started.elapsed())).await;
        let looks = backend.acquire_attempts();
        assert!(
            looks <= 4,
            "{label}: a queued writer looked {looks} times in its first 300 ms"
        );
        handed_over(held, waiting, &label).await;
        holder.close().await;
        waiter.close().await;
    }
}

/// PostgreSQL: a writer that queues behind another queued writer does not look again
/// right after it queued — a release it raced would have named the writer ahead,
/// whose own release names it — so until its turn its first look is its only one;
/// then the chain of release notices hands the lock to both in turn. Both waiters
/// poll only every 5 s, so each hand-over within 3 s is a notice's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_writer_queued_behind_a_writer_looks_again_only_when_told() {
    let Some(url) = sql_url("postgres") else {
        return;
    };
    let holder = manager(&url, JdbcOptions::default(), LONG_LEASE).await;
    let slow = || polling_every(5).waiter_liveness(Duration::from_secs(30));
    let (ahead_backend, ahead) = backend_and_manager(&url, slow(), LONG_LEASE).await;
    let (backend, behind) = backend_and_manager(&url, slow(), LONG_LEASE).await;
    let name = format!("behind-{:x}", fastrand::u64(..));
    let held = take(&holder.lock(&name), Duration::ZERO).await;
    let wait = Duration::from_secs(30);
    let (ahead_waiting, _) =
        queued_waiter(&ahead_backend, ahead.fair_lock(&name), wait, 2, "postgres").await;
    // Its just-queued look would come 10 ms after its entry; its next poll, 5 s.
    let (behind_waiting, looks) =
        queued_waiter(&backend, behind.lock(&name), wait, 1, "postgres").await;
    assert_eq!(
        looks, 1,
        "postgres: a writer queued behind a writer looked {looks} times in its first 300 ms"
    );
    handed_over(held, ahead_waiting, "postgres").await;
    granted_within(behind_waiting, Duration::from_secs(3), || {
        "postgres: the writer behind was not told when the writer ahead released".into()
    })
    .await;
    holder.close().await;
    ahead.close().await;
    behind.close().await;
}

/// PostgreSQL: notices sent while a backend's `LISTEN` connection is down are lost;
/// when it has connected and listened again, every queued waiter looks at once, so
/// a release it missed costs it a round trip, not its next poll. The waiter polls
/// only every 5 s; the server ends its backend's listener (this test's table prefix
/// names the channel).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_listener_that_comes_back_has_every_waiter_look() {
    let Some(url) = sql_url("postgres") else {
        return;
    };
    let prefix = "dlock_relisten_";
    let holder = manager(
        &url,
        JdbcOptions::default().table_prefix(prefix),
        LONG_LEASE,
    )
    .await;
    let slow = polling_every(5)
        .table_prefix(prefix)
        .waiter_liveness(Duration::from_secs(30));
    let (backend, waiter) = backend_and_manager(&url, slow, LONG_LEASE).await;
    let name = format!("relisten-{:x}", fastrand::u64(..));
    let held = take(&holder.lock(&name), Duration::ZERO).await;
    let (waiting, seen) = queued_waiter(
        &backend,
        waiter.lock(&name),
        Duration::from_secs(30),
        2,
        "postgres",
    )
    .await;
    let mut admin = sqlx::PgConnection::connect(&url).await.unwrap();
    let ended: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE query LIKE 'LISTEN%dlock_relisten_release%'",
    )
    .fetch_all(&mut admin)
    .await
    .unwrap();
    assert!(
        ended.contains(&true),
        "postgres: no listener ended: {ended:?}"
    );
    assert!(
        eventually(Duration::from_secs(2), || async {
            backend.acquire_attempts() > seen
        })
        .await,
        "postgres: the waiter did not look again when its listener came back"
    );
    handed_over(held, waiting, "postgres").await;
    holder.close().await;
    waiter.close().await;
}

/// PostgreSQL: a listener whose connection cannot come back at once — the database
/// refusing connections for longer than the pool's connect bound, so sqlx's own
/// reconnect fails — listens again once it can, and every queued waiter then looks:
/// a release sent while it was down costs the waiter a round trip after the outage,
/// not its next poll (5 s here). (Before, the next `try_recv` reconnected and then
/// waited for a notice; the lost ones were never made up for.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_listener_back_after_a_failed_reconnect_has_every_waiter_look() {
    let Some(url) = sql_url("postgres") else {
        return;
    };
    let prefix = "dlock_relisten_late_";
    let holder = manager(
        &url,
        JdbcOptions::default().table_prefix(prefix),
        LONG_LEASE,
    )
    .await;
    let (proxy, via_proxy) = proxied(&url).await;
    let slow = polling_every(5)
        .table_prefix(prefix)
        .waiter_liveness(Duration::from_secs(30))
        .acquire_timeout(Duration::from_millis(300));
    let (backend, waiter) = backend_and_manager(&via_proxy, slow, LONG_LEASE).await;
    let name = format!("relisten-late-{:x}", fastrand::u64(..));
    let held = take(&holder.lock(&name), Duration::ZERO).await;
    let (waiting, _) = queued_waiter(
        &backend,
        waiter.lock(&name),
        Duration::from_secs(30),
        2,
        "postgres",
    )
    .await;
    // The outage being tested: over three times the pool's connect bound. The
    // release's notice, sent meanwhile, is lost to the waiter's backend.
    proxy.set(Fault::Reset);
    tokio::time::sleep(Duration::from_secs(1)).await;
    held.unlock().await.unwrap();
    proxy.set(Fault::Pass);
    granted_within(waiting, Duration::from_millis(2500), || {
        "postgres: the waiter did not look again once its listener was back".into()
    })
    .await;
    holder.close().await;
    waiter.close().await;
}

/// PostgreSQL: a waiter first in the queue that leaves it while the lock is free —
/// cancelled after the release notice named it, before it took the lock — passes
/// the notice on: the writer queued behind it looks at once instead of at its next
/// poll (5 s here). The first waiter's connections are slowed (100 ms each way), so
/// it is cancelled before the notice reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_waiter_leaving_a_free_lock_passes_the_notice_on() {
    let Some(url) = sql_url("postgres") else {
        return;
    };
    let prefix = "dlock_pass_on_";
    let holder = manager(
        &url,
        JdbcOptions::default().table_prefix(prefix),
        LONG_LEASE,
    )
    .await;
    let slow = || {
        polling_every(5)
            .table_prefix(prefix)
            .waiter_liveness(Duration::from_secs(30))
    };
    let (proxy, via_proxy) = proxied(&url).await;
    let (first_backend, first) = backend_and_manager(&via_proxy, slow(), LONG_LEASE).await;
    let (next_backend, next) = backend_and_manager(&url, slow(), LONG_LEASE).await;
    let name = format!("pass-on-{:x}", fastrand::u64(..));
    let held = take(&holder.lock(&name), Duration::ZERO).await;
    let (first_waiting, _) = queued_waiter(
        &first_backend,
        first.lock(&name),
        Duration::from_secs(30),
        2,
        "postgres",
    )
    .await;
    let (next_waiting, _) = queued_waiter(
        &next_backend,
        next.lock(&name),
        Duration::from_secs(30),
        1,
        "postgres",
    )
    .await;
    proxy.set(Fault::Delay(Duration::from_millis(100)));
    let released = Instant::now();
    held.unlock().await.unwrap();
    first_waiting.abort();
    assert!(first_waiting.await.is_err_and(|e| e.is_cancelled()));
    granted_within(next_waiting, Duration::from_secs(3), || {
        format!(
            "postgres: the next writer was not told when the first left a free lock ({:?} since the release)",
            released.elapsed()
        )
    })
    .await;
    proxy.set(Fault::Pass);
    holder.close().await;
    first.close().await;
    next.close().await;
}

/// MariaDB/MySQL: a waiter blocked on the lock's bell is granted as soon as the
/// holder releases, though it would poll only every 3 s. The holder waited for the
/// lock itself (on the bell, which it found free and kept), so it holds the bell,
/// and its release rings it — after the release committed: a ring before it wakes
/// the waiter to a lock still held, and it goes back to polling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_release_rings_the_bell_its_waiter_blocks_on() {
    let Some(url) = sql_url("mysql") else {
        return;
    };
    let first = manager(&url, JdbcOptions::default(), LONG_LEASE).await;
    let (holder_backend, holder) =
        backend_and_manager(&url, JdbcOptions::default(), LONG_LEASE).await;
    // Polls every 3 s, and blocks on a bell at most a third of its 9 s liveness.
    let slow = polling_every(3).waiter_liveness(Duration::from_secs(9));
    let (waiter_backend, waiter) = backend_and_manager(&url, slow, LONG_LEASE).await;
    let name = format!("bell-{:x}", fastrand::u64(..));

    // The holder waits for `first`'s hold: it takes the free bell and keeps it.
    let g = take(&first.lock(&name), Duration::ZERO).await;
    let lock = holder.lock(&name);
    let holding = tokio::spawn(async move { lock.try_lock(Duration::from_secs(20)).await });
    assert!(
        eventually(Duration::from_secs(5), || async {
            holder_backend.bells_taken() >= 1
        })
        .await,
        "the holder never took the bell"
    );
    g.unlock().await.unwrap();
    let held = holding.await.unwrap().unwrap().expect("the holder's grant");

    // The waiter blocks on the holder's bell; the release wakes it.
    let delay = granted_after_release(&waiter, &waiter_backend, &name, held).await;
    assert_eq!(
        waiter_backend.bells_taken(),
        1,
        "the waiter was granted without the bell ringing"
    );
    assert!(
        delay < Duration::from_millis(1500),
        "woken {delay:?} after the release (its bell wait ends after 3 s)"
    );
    for m in [first, holder, waiter] {
        m.close().await;
    }
}

/// MariaDB/MySQL: waiters block in queue order, each on the bell of the waiter just
/// ahead of it, so a hand-over wakes the next waiter and nobody else: bells taken
/// stay near one per grant. (One bell per lock, whose line disagreed with the queue,
/// passed the bell down its line about 2.7 times per grant; without bells nobody
/// takes one.) Six backends cycle one fair lock for 2 s; their longest backoff
/// delay (2 s) lets waiters block on MySQL too, which reads `GET_LOCK`'s timeout in
/// whole seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_hand_over_wakes_the_next_waiter_in_queue_order() {
    const TASKS: usize = 6;
    let Some(url) = sql_url("mysql") else {
        return;
    };
    let name = format!("line-{:x}", fastrand::u64(..));
    let grants = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + Duration::from_secs(2);
    let (mut backends, mut tasks) = (Vec::new(), Vec::new());
    for _ in 0..TASKS {
        let options = JdbcOptions::default()
            .backoff(Backoff::exponential(
                Duration::from_millis(1),
                Duration::from_secs(2),
            ))
            .waiter_liveness(Duration::from_secs(6));
        let (backend, m) = backend_and_manager(&url, options, LONG_LEASE).await;
        let (lock, grants) = (m.fair_lock(&name), Arc::clone(&grants));
        tasks.push(tokio::spawn(async move {
            while Instant::now() < end {
                let g = lock
                    .try_lock(Duration::from_secs(5))
                    .await
                    .unwrap()
                    .expect("granted within 5 s");
                tokio::time::sleep(Duration::from_millis(1)).await;
                g.unlock().await.unwrap();
                grants.fetch_add(1, Ordering::Relaxed);
            }
            m.close().await;
        }));
        backends.push(backend);
    }
    for t in tasks {
        t.await.unwrap();
    }
    let grants = grants.load(Ordering::Relaxed);
    let taken: u64 = backends.iter().map(JdbcBackend::bells_taken).sum();
    assert!(grants >= 20, "only {grants} grants in 2 s");
    assert!(
        taken * 2 <= grants * 3,
        "{taken} bells taken for {grants} grants: the bells' line does not follow the queue"
    );
    assert!(
        taken * 2 >= grants,
        "{taken} bells taken for {grants} grants: most hand-overs did not wake a blocked waiter"
    );
}
