//! Fault scenarios shared by the backend-specific fault tests.

use std::time::{Duration, Instant};

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

/// The holder's connection is black-holed (bytes swallowed, nothing reset) while
/// `holder` (behind `proxy`) holds a watchdog-renewed lock with lease `lease`, and
/// `rival` (on a healthy connection) waits for it. The holder's lost signal must come
/// at least the loss margin before the rival is granted the lock: `margin` when the
/// holder's manager was built with `loss_margin(margin)`, else the default's floor,
/// 1 % of the lease. The measured lead is conservative: the loss is timed when the
/// test hears of it, the grant when the store's answer has already arrived.
///
/// Returns the lead, for the caller's figures.
pub async fn black_holed_loss_leads_the_next_grant(
    label: &str,
    holder: &DistributeLockManager,
    rival: &DistributeLockManager,
    proxy: &FaultProxy,
    lease: Duration,
    margin: Option<Duration>,
) -> Duration {
    let name = format!("margin-{:x}", fastrand::u64(..));
    let held = holder
        .lock(&name)
        .try_lock(Duration::ZERO)
        .await
        .expect("acquire before the black hole")
        .expect("a free lock");
    let waiting = rival.lock(&name);
    proxy.set(Fault::Blackhole);
    let next = tokio::spawn(async move {
        let got = waiting.try_lock(lease * 3).await;
        (got, Instant::now())
    });
    let reason = tokio::time::timeout(lease * 2, held.lost())
        .await
        .unwrap_or_else(|_| panic!("{label}: the lost signal did not fire within two leases"));
    let lost_at = Instant::now();
    assert_eq!(reason, LostReason::LeaseExpired, "{label}");
    let (got, granted_at) = next.await.expect("rival task");
    let guard = got
        .unwrap_or_else(|e| panic!("{label}: the rival's wait failed: {e}"))
        .unwrap_or_else(|| panic!("{label}: the rival was not granted within three leases"));
    let required = margin.unwrap_or(lease / 100);
    let lead = granted_at.saturating_duration_since(lost_at);
    assert!(
        granted_at >= lost_at + required,
        "{label}: the lost signal led the next grant by {lead:?} (granted before it: {}), less than the {required:?} margin",
        granted_at < lost_at
    );
    guard.unlock().await.expect("rival unlock");
    proxy.set(Fault::Pass);
    drop(held);
    lead
}
