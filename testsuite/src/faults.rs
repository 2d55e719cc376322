//! Fault scenarios shared by the backend-specific fault tests.

use std::time::Duration;

use dlock_api::{DistributeLockManager, ErrorKind, LostReason};

use crate::conformance::eventually;
use crate::proxy::{Fault, FaultProxy};

/// The backend goes away behind `proxy` while `manager` holds a lock (taken without an
/// explicit lease, renewed by the watchdog with lease `lease`), then comes back:
///
/// * calls fail with typed (`Backend` or `Timeout`), retryable errors;
/// * the held lock's lost signal fires with `LeaseExpired`, a loss margin before the
///   lease ends (not earlier than two thirds of it);
/// * once traffic passes again, the same manager takes the lock again (its client
///   reconnected by itself).
///
/// `label` names the backend in failure messages.
pub async fn outage_is_typed_loses_on_time_and_recovers(
    label: &str,
    manager: &DistributeLockManager,
    proxy: &FaultProxy,
    lease: Duration,
) {
    let name = format!("outage-{:x}", fastrand::u64(..));
    let held = manager
        .lock(&name)
        .try_lock(Duration::ZERO)
        .await
        .expect("acquire before the outage")
        .expect("a free lock");

    proxy.set(Fault::Reset);
    let err = manager
        .lock("other")
        .try_lock(Duration::ZERO)
        .await
        .expect_err("a call during the outage fails");
    assert!(
        matches!(err.kind(), ErrorKind::Backend | ErrorKind::Timeout),
        "{label}: {err}"
    );
    assert!(err.is_retryable(), "{label}: {err}");
    let reason = tokio::time::timeout(lease * 3, held.lost())
        .await
        .unwrap_or_else(|_| panic!("{label}: the lost signal did not fire"));
    assert_eq!(reason, LostReason::LeaseExpired, "{label}");
    // Lost a loss margin (at most a third of the lease) before the store can expire
    // the hold: not before that, and not after the lease.
    let lost_after = held.acquired_at().elapsed();
    assert!(
        lost_after >= lease * 2 / 3,
        "{label}: declared lost after {lost_after:?}, more than a third of the {lease:?} lease early"
    );
    drop(held);

    proxy.set(Fault::Pass);
    let back = eventually(Duration::from_secs(20), || async {
        match manager.lock(&name).try_lock(Duration::from_secs(1)).await {
            Ok(Some(g)) => g.unlock().await.is_ok(),
            _ => false,
        }
    })
    .await;
    assert!(
        back,
        "{label}: the client did not reconnect after the backend came back"
    );
}
