//! The session mode: a failed context write, a stalled holder, a dropped wait.

use std::time::{Duration, Instant};

use dlock_jdbc::{JdbcBackend, JdbcOptions};
use dlock_spi::{
    AcquireRequest, AcquireResult, GrantId, LockMode, LockName, LockRemoteResource, OwnerId,
};
use testsuite::backends::{server_url, SESSION_MODE_TIMEOUT};
use testsuite::conformance::{eventually, take};
use testsuite::runner::selected;

use super::fixtures::*;

/// The session modes: a new context (a leader proclaiming) whose statement fails
/// (here: on a session an operator killed) closes the hold's connection: the hold's
/// feed reports the loss within its next ask — it read the empty slot as a release
/// and ended quietly before — and another client gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_mode_a_failed_context_write_is_reported_lost() {
    for label in ["postgres-session", "mysql-session"] {
        if !selected().iter().any(|l| l == label) {
            continue;
        }
        let url = server_url(label).unwrap();
        let backend = JdbcBackend::connect(&url).await.unwrap();
        let rival = JdbcBackend::connect(&url).await.unwrap();
        let name = LockName::new(format!("ctx-drop-{:x}", fastrand::u64(..))).unwrap();
        let req = AcquireRequest::new(
            name.clone(),
            OwnerId::new("holder".to_owned()),
            GrantId::new(1),
        );
        let AcquireResult::Acquired { token, watch, .. } = backend.try_acquire(&req).await.unwrap()
        else {
            panic!("{label}: uncontended grant refused");
        };
        let mut feed = watch
            .and_then(|w| w.take())
            .expect("a session hold has a feed");
        let renew = dlock_spi::RenewRequest::new(
            name.clone(),
            req.owner.clone(),
            req.grant,
            LockMode::Exclusive,
            Duration::from_secs(4),
            token,
        )
        .with_context(dlock_spi::Bytes::from_static(b"proclaimed"));
        // The session ended from outside (an operator's kill), then a new
        // context: its statement fails on the dead connection, which closes.
        let killed = dlock_spi::LockAdmin::force_release(&rival, &name)
            .await
            .unwrap();
        assert_eq!(killed, 1, "{label}: kill");
        assert!(
            backend.renew(&renew).await.is_err(),
            "{label}: a context written on a killed session"
        );
        let status = tokio::time::timeout(Duration::from_secs(3), feed.next())
            .await
            .unwrap_or_else(|_| panic!("{label}: no status within 3 s"));
        assert!(
            matches!(status, Some(dlock_spi::HoldStatus::Lost(_))),
            "{label}: the broken hold's feed said {status:?}"
        );
        let other = AcquireRequest::new(
            name.clone(),
            OwnerId::new("rival".to_owned()),
            GrantId::new(1),
        )
        .with_deadline(Some(Instant::now() + Duration::from_secs(2)));
        assert!(
            matches!(
                rival.try_acquire(&other).await.unwrap(),
                AcquireResult::Acquired { .. }
            ),
            "{label}: the lock did not come free with the broken session"
        );
        backend.close().await;
        rival.close().await;
    }
}

/// The session modes: a holder whose process stood still past half the session
/// timeout `K` (4 s) — here its runtime is not run for 2.5 s, as under a SIGSTOP or
/// a long pause: its feed's asks at `K/5` and its loss at `K/2` fall due meanwhile —
/// is told its hold is lost as soon as it runs again, and the lock passes to the
/// waiter only when the server would have ended the silent session on its own (`K`
/// after the hold's last answered ask): the lost signal leads the next grant by `K`
/// less the stall (1.5 s). The feed used to close the session the moment it
/// declared the loss, and the waiter was granted within milliseconds of the signal
/// — the lock-history checker's `mysql-session` stop run (seed 3702187) saw a
/// process continued from a 3 s stop write 5 ms after its lost signal, 2 ms after
/// the next grant.
#[test]
fn session_mode_a_stalled_holder_is_told_before_its_lock_passes_on() {
    const STALL: Duration = Duration::from_millis(2500);
    for label in ["postgres-session", "mysql-session"] {
        if !selected().iter().any(|l| l == label) {
            continue;
        }
        let url = server_url(label).unwrap().to_string();
        let name = format!("stalled-{:x}", fastrand::u64(..));
        // The holder's runtime runs only inside its `block_on` calls.
        let holder_rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (holder, guard) = holder_rt.block_on(async {
            let m = manager(&url, JdbcOptions::default(), LONG_LEASE).await;
            let g = take(&m.lock(&name), Duration::ZERO).await;
            (m, g)
        });
        let granted = Instant::now();
        let waiter = std::thread::spawn({
            let (url, name) = (url.clone(), name.clone());
            move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    let m = manager(&url, JdbcOptions::default(), LONG_LEASE).await;
                    let g = take(&m.lock(&name), Duration::from_secs(10)).await;
                    let at = Instant::now();
                    g.unlock().await.unwrap();
                    m.close().await;
                    at
                })
            }
        });
        // The stall is the fault under test: nothing of the holder's runs.
        std::thread::sleep(STALL);
        // From here on the holder's runtime runs (its tasks close what it must)
        // until the waiter is done.
        let (told, next_grant) = holder_rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(1), guard.lost())
                .await
                .unwrap_or_else(|_| panic!("{label}: not told of the loss once running again"));
            let told = Instant::now();
            let next_grant = tokio::task::spawn_blocking(move || waiter.join().unwrap())
                .await
                .unwrap();
            (told, next_grant)
        });
        let lead = next_grant.saturating_duration_since(told);
        println!(
            "{label}: told {:?} after the grant, the next grant {:?} after it",
            told - granted,
            lead
        );
        assert!(
            lead >= Duration::from_secs(1),
            "{label}: the lost signal led the next grant by {lead:?}, not K less the stall (1.5 s)"
        );
        assert!(
            next_grant - granted < SESSION_MODE_TIMEOUT + Duration::from_secs(1),
            "{label}: the lock passed on {:?} after the grant, not by K",
            next_grant - granted
        );
        holder_rt.block_on(async {
            drop(guard);
            holder.close().await;
        });
    }
}

/// MariaDB's session mode: a dropped wait ends its statement in the server at once
/// (`KILL QUERY` from a task of its own), not when its `GET_LOCK` slice (1 s) runs
/// out — the server does not notice a client gone while a statement runs. The wait
/// is dropped as soon as the server shows it waiting, with most of its slice left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_session_a_dropped_wait_ends_its_statement_at_once() {
    if !selected().iter().any(|l| l == "mysql-session") {
        return;
    }
    let url = server_url("mysql-session").unwrap();
    let holder = manager(&url, JdbcOptions::default(), LONG_LEASE).await;
    let (backend, waiter) = backend_and_manager(&url, JdbcOptions::default(), LONG_LEASE).await;
    let name = format!("dropped-wait-{:x}", fastrand::u64(..));
    let g = take(&holder.lock(&name), Duration::ZERO).await;
    let full = g.name().clone();
    for round in 0..3 {
        let lock = waiter.lock(&name);
        let waiting = tokio::spawn(async move { lock.try_lock(Duration::from_secs(10)).await });
        assert!(
            eventually(Duration::from_secs(5), || async {
                waiters_of(&backend, &full).await == 1
            })
            .await,
            "round {round}: the wait never showed in the server"
        );
        waiting.abort();
        let dropped = Instant::now();
        assert!(
            eventually(Duration::from_millis(400), || async {
                waiters_of(&backend, &full).await == 0
            })
            .await,
            "round {round}: the dropped wait still waited in the server {:?} later",
            dropped.elapsed()
        );
    }
    g.unlock().await.unwrap();
    holder.close().await;
    waiter.close().await;
}
