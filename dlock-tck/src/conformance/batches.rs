//! Renewal batches ([`dlock_spi::BatchRenew`]): a batch answers each hold as that
//! hold's own renewal would, and touches no other hold.

use std::sync::Arc;
use std::time::Duration;

use dlock_spi::{
    AcquireRequest, BatchRenew, FencingToken, GrantId, LockMode, LockName, OwnerId, ReleaseRequest,
    RenewRequest, RenewResult,
};

use super::Env;
use crate::TestBackend;

/// A hold taken on the SPI: its lock, owner, mode and token.
struct Held {
    name: LockName,
    owner: &'static str,
    mode: LockMode,
    token: FencingToken,
}

/// On a backend that renews in batches: a batch of renewals — the owner's
/// exclusive holds, a stranger's renewal of a held lock, the owner's renewal of a
/// lock another owns, a read hold (where the backend has them) — answers each as
/// its own renewal would (renewed, or `NotOwner`), extends the owner's holds to the
/// batch's lease (where the backend reports leases), leaves the other owner's hold
/// as it was, and an empty batch answers nothing. (A backend without batches has
/// the manager renew each hold alone: nothing of its own to check.)
pub async fn a_renewal_batch_answers_each_hold_as_its_own_renewal(backend: Arc<dyn TestBackend>) {
    let env = Env::new(backend);
    let client = env.backend().client().await.expect("client");
    let Some(batch) = client.batch_renew() else {
        eprintln!(
            "{}: renews each hold alone (no batches); nothing to check",
            env.backend().label()
        );
        return;
    };
    let caps = client.capabilities();
    let short = super::store_lease(&caps, Duration::from_secs(2));
    let long = Duration::from_secs(60);
    let mut plan = vec![
        ("b0", "a", LockMode::Exclusive),
        ("b1", "a", LockMode::Exclusive),
        ("b2", "b", LockMode::Exclusive),
    ];
    if caps.shared {
        plan.push(("b3", "a", LockMode::Shared));
    }
    let mut held = Vec::new();
    for (lock, owner, mode) in plan {
        let name = env.full(lock);
        let req = AcquireRequest::new(name.clone(), OwnerId::new(owner), GrantId::new(1))
            .with_lease(short)
            .with_mode(mode);
        let token = client
            .try_acquire(&req)
            .await
            .expect("acquire answers")
            .token()
            .unwrap_or_else(|| panic!("{lock} is free"));
        held.push(Held {
            name,
            owner,
            mode,
            token,
        });
    }
    let renew = |h: &Held, owner: &str| {
        RenewRequest::new(
            h.name.clone(),
            OwnerId::new(owner),
            GrantId::new(1),
            h.mode,
            long,
            h.token,
        )
    };
    // The owner's holds alone: every one renewed, in one go where the backend can.
    let mine: Vec<RenewRequest> = held
        .iter()
        .filter(|h| h.owner == "a")
        .map(|h| renew(h, "a"))
        .collect();
    assert_shape(batch, &mine, &vec![true; mine.len()]).await;
    for (i, h) in held.iter().enumerate() {
        let state = client
            .inspect(&h.name)
            .await
            .expect("inspect answers")
            .expect("still held");
        let holder = state
            .holders
            .iter()
            .find(|x| x.owner.as_str() == h.owner)
            .unwrap_or_else(|| panic!("{}: its holder is gone: {state:?}", h.name));
        // Where the backend reports the lease left: the renewed holds have the
        // batch's, the other owner's hold its own short one.
        if let Some(left) = holder.remaining_lease {
            if h.owner == "a" {
                assert!(left > short, "hold {i} was not extended: {left:?} left");
            } else {
                assert!(
                    left <= short,
                    "b's hold was extended by a's batch: {left:?} left"
                );
            }
        }
    }
    // Renewals that are not their owners' beside ones that are.
    let mixed = [
        renew(&held[0], "a"),
        renew(&held[2], "a"), // b's lock: not a's to renew
        renew(&held[1], "a"),
        renew(&held[1], "b"), // a's lock: not b's
    ];
    assert_shape(batch, &mixed, &[true, false, true, false]).await;
    assert!(batch.renew_batch(&[]).await.is_empty());
    for h in &held {
        let release = ReleaseRequest::new(
            h.name.clone(),
            OwnerId::new(h.owner),
            GrantId::new(1),
            h.mode,
            h.token,
        );
        client.release(&release).await.expect("release answers");
    }
    env.assert_no_leaks().await;
}

/// Sends `reqs` as one batch; each must answer, renewed where `renewed` says.
async fn assert_shape(batch: &dyn BatchRenew, reqs: &[RenewRequest], renewed: &[bool]) {
    let answers: Vec<RenewResult> = batch
        .renew_batch(reqs)
        .await
        .into_iter()
        .map(|a| a.expect("each renewal answers"))
        .collect();
    let shape: Vec<bool> = answers
        .iter()
        .map(|a| matches!(a, RenewResult::Renewed { .. }))
        .collect();
    assert_eq!(shape, renewed, "{answers:?}");
}
