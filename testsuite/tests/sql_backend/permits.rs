//! Semaphores' permits: across the schema's upgrade, lapsed holders, a retried grant, a release that names its owner.

use std::time::Duration;

use dlock_api::{DistributeLockManager, ErrorKind};
use dlock_jdbc::{JdbcBackend, JdbcOptions};
use dlock_spi::{LockName, LockRemoteResource, ReleaseResult};
use testsuite::conformance::{eventually, take_permits};

use super::fixtures::*;

/// Schema version 5 keeps a semaphore's holders in its own row; a process still on
/// version 4 wrote a `readers` row per holder instead. While such a row is live, no
/// permit is granted (the new grant cannot count it): an upgrade never over-grants
/// past a holder from before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_holder_from_schema_4_keeps_the_permits_from_being_granted() {
    for (label, url) in sql_backends() {
        let m = manager(&url, JdbcOptions::default(), LONG_LEASE).await;
        let name = format!("sem-v4-{:x}", fastrand::u64(..));
        let sem = m.semaphore(&name, 3);
        // The semaphore's row exists (a first grant), then a version-4 holder of 1.
        take_permits(&sem, 1).await.release().await.unwrap();
        raw_scalars(
            &label,
            &url,
            "INSERT INTO dlock_readers (name, owner, token, context, acquired_at, expires_at, permits) \
             VALUES (?, 'v4-holder', 1, NULL, 0, 9000000000000000, 1)",
            &name,
        )
        .await;
        let refused = sem.try_acquire(1, Duration::ZERO).await.unwrap();
        assert!(
            refused.is_none(),
            "{label}: a permit was granted past a version-4 holder"
        );
        raw_scalars(
            &label,
            &url,
            "DELETE FROM dlock_readers WHERE name = ?",
            &name,
        )
        .await;
        let granted = sem.try_acquire(1, Duration::ZERO).await.unwrap();
        assert!(
            granted.is_some(),
            "{label}: the holder left, the permits did not come back"
        );
        granted.unwrap().release().await.unwrap();
        m.close().await;
    }
}

/// A semaphore's holders live in its row, which does not grow with holders that
/// died: a lapsed entry leaves at the next renewal of a live holder, and a lapsed
/// oldest entry with the next grant (on SQLite and PostgreSQL every lapsed entry
/// does; MySQL's grant drops the oldest only, keeping one `JSON_TABLE` per grant).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lapsed_permit_holders_leave_the_semaphores_row() {
    for (label, url) in sql_backends() {
        // Short, so the lapses are quick, yet long enough for the live holder's
        // renewals (every third) on a loaded machine: at 300 ms one came too late
        // once, the live holder lapsed too and nobody renewed to drop the entries.
        let lease = Duration::from_millis(900);
        let live = manager(&url, JdbcOptions::default(), lease).await;
        let dead = DistributeLockManager::builder(JdbcBackend::connect(&url).await.unwrap())
            .lease(lease)
            .watchdog(false)
            .build()
            .unwrap();
        let name = format!("sem-row-{:x}", fastrand::u64(..));
        let entries_sql = match label.as_str() {
            "sqlite" => "SELECT json_array_length(holders) FROM dlock_locks WHERE name = ?",
            "mysql" => "SELECT JSON_LENGTH(holders) FROM dlock_locks WHERE name = ?",
            _ => "SELECT jsonb_array_length(holders)::bigint FROM dlock_locks WHERE name = ?",
        };
        let entries = || raw_scalars(&label, &url, entries_sql, &name);
        let sem = live.semaphore(&name, 3);
        let lapse = |what: &'static str| {
            let dead = &dead;
            let name = &name;
            let label = &label;
            async move {
                let lapsing = take_permits(&dead.semaphore(name, 3), 1).await;
                let lost =
                    tokio::time::timeout(Duration::from_secs(5), lapsing.lost_signal().lost())
                        .await;
                assert!(
                    lost.is_ok(),
                    "{label}: {what}: the unrenewed holder kept its permit"
                );
                lapsing
            }
        };
        // A live (renewed) holder first, then one that lapses behind it.
        let renewed = take_permits(&sem, 1).await;
        let lapsed = lapse("behind a renewed holder").await;
        let dropped = eventually(Duration::from_secs(5), || async { entries().await == [1] }).await;
        assert!(
            dropped,
            "{label}: a renewal kept the lapsed entry: {:?}",
            entries().await
        );
        renewed.release().await.unwrap();
        assert_eq!(entries().await, [0], "{label}: entries after the release");
        drop(lapsed);
        // A lapsed oldest entry leaves with the next grant.
        let lapsed = lapse("alone").await;
        // The lost signal fires a margin before the lease ends: wait for the end.
        let ended = eventually(Duration::from_secs(5), || async {
            sem.held().await.is_ok_and(|n| n == 0)
        })
        .await;
        assert!(ended, "{label}: the unrenewed holder's lease did not end");
        let granted = take_permits(&sem, 1).await;
        assert_eq!(
            entries().await,
            [1],
            "{label}: entries after a grant past a lapsed holder"
        );
        granted.release().await.unwrap();
        drop(lapsed);
        live.close().await;
        dead.close().await;
    }
}

/// A grant asked for again (the same owner and grant: a retried statement) is
/// granted and keeps one entry — the retry's, with the token it returned — which one
/// release removes. On MySQL a holder identity longer than its 255-byte column is
/// refused with `InvalidArgument` (it would be cut short when read back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_permit_grant_keeps_one_entry() {
    for (label, url) in sql_backends() {
        let backend = JdbcBackend::connect(&url).await.unwrap();
        let name = LockName::new(format!("sem-retry-{:x}", fastrand::u64(..))).unwrap();
        let req = permit_request(&name, "retrier", 7, 2);
        let mut token = None;
        for attempt in 0..2 {
            token = backend.try_acquire(&req).await.unwrap().token();
            assert!(token.is_some(), "{label}: attempt {attempt} refused");
        }
        // The entry is the retry's: the token it returned.
        let state = backend.inspect(&name).await.unwrap().unwrap();
        assert_eq!(state.holders.len(), 1, "{label}: {state:?}");
        assert_eq!(Some(state.holders[0].token), token, "{label}: {state:?}");
        let release = permit_release(&name, "retrier", 7, 2);
        assert_eq!(
            backend.release(&release).await.unwrap(),
            ReleaseResult::Released
        );
        assert!(
            backend.inspect(&name).await.unwrap().is_none(),
            "{label}: holders left"
        );
        let long = permit_request(&name, &"o".repeat(300), 1, 1);
        let answer = backend.try_acquire(&long).await;
        if label == "mysql" {
            let err = answer.expect_err("a 300-byte holder identity on MySQL");
            assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        } else {
            assert!(
                answer.unwrap().token().is_some(),
                "{label}: a long owner was refused"
            );
        }
        backend.close().await;
    }
}

/// Owners are any text (`OwnerId::new`): a release finds its own entry in the
/// semaphore's row byte for byte, never another owner's that a pattern would match
/// (MySQL looks it up with `JSON_SEARCH`, whose `%` and `_` are wildcards).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_release_finds_its_owner_exactly() {
    for (label, url) in sql_backends() {
        let backend = JdbcBackend::connect(&url).await.unwrap();
        let name = LockName::new(format!("sem-owner-{:x}", fastrand::u64(..))).unwrap();
        // Granted in this order: the first would match the others' text as a pattern.
        let owners = ["oX1%", "o_1%", "O_1\\%"];
        for owner in owners {
            let granted = backend
                .try_acquire(&permit_request(&name, owner, 1, 1))
                .await
                .unwrap();
            assert!(granted.token().is_some(), "{label}: {owner} was refused");
        }
        for owner in owners.iter().rev() {
            assert_eq!(
                backend
                    .release(&permit_release(&name, owner, 1, 1))
                    .await
                    .unwrap(),
                ReleaseResult::Released,
                "{label}: {owner}'s release"
            );
        }
        assert!(
            backend.inspect(&name).await.unwrap().is_none(),
            "{label}: holders left"
        );
        backend.close().await;
    }
}
