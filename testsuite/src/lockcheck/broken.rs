//! Deliberately broken backends for the checker's self-tests: the in-memory backend
//! with one flaw each, so that each end-to-end run must be caught by its rule.

use std::time::Duration;

use async_trait::async_trait;
use dlock_spi::{
    AcquireRequest, AcquireResult, Capabilities, FencingToken, InMemoryBackend, LockAdmin,
    LockName, LockRemoteResource, LockState, ReleaseRequest, ReleaseResult, RenewRequest,
    RenewResult, Result,
};

/// The label of the release that ignores its owner (the classic self-test).
pub const LABEL: &str = "broken-memory";

/// The lock names [`Flaw::NeverGrants`] never grants (several, so that a run has
/// several chances to show a waiter starved).
pub const NEVER_GRANTED: [&str; 3] = ["x0", "x1", "f0"];

/// Bound on how long [`Flaw::NeverGrants`] keeps a waiter before answering.
const MAX_WAIT: Duration = Duration::from_secs(60);
/// Waits up to this long [`Flaw::NeverGrants`] refuses at once.
const SHORT_WAIT: Duration = Duration::from_secs(1);

/// What is wrong with a broken backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flaw {
    /// A release frees the lock whoever holds it, as a backend that deletes the key
    /// without checking the holder would (overlap, stale-write).
    ReleaseIgnoresOwner,
    /// Every grant carries token 1 (token-order).
    ReusesTokens,
    /// [`NEVER_GRANTED`] are never granted, though nobody holds them (starvation).
    NeverGrants,
}

impl Flaw {
    /// Every flaw, with its label.
    pub const ALL: [(&'static str, Flaw); 3] = [
        (LABEL, Flaw::ReleaseIgnoresOwner),
        ("broken-tokens", Flaw::ReusesTokens),
        ("broken-starve", Flaw::NeverGrants),
    ];

    /// The flaw a label selects, if it names one.
    pub fn of(label: &str) -> Option<Flaw> {
        Flaw::ALL
            .iter()
            .find(|(l, _)| *l == label)
            .map(|(_, flaw)| *flaw)
    }

    /// The label that selects this flaw.
    pub fn label(self) -> &'static str {
        Flaw::ALL
            .iter()
            .find(|(_, flaw)| *flaw == self)
            .map_or(LABEL, |(l, _)| l)
    }
}

/// Whether `name` (namespaced) is one of [`NEVER_GRANTED`].
fn never_granted(name: &LockName) -> bool {
    let name = name.as_str();
    NEVER_GRANTED.iter().any(|n| {
        name.strip_suffix(n)
            .is_some_and(|ns| ns.is_empty() || ns.ends_with(':'))
    })
}

/// An [`InMemoryBackend`] client with a [`Flaw`].
#[derive(Clone)]
pub struct BrokenBackend {
    inner: InMemoryBackend,
    flaw: Flaw,
}

impl BrokenBackend {
    /// A client of the store `inner` with `flaw`.
    pub fn over(inner: InMemoryBackend, flaw: Flaw) -> Self {
        BrokenBackend { inner, flaw }
    }
}

#[async_trait]
impl LockRemoteResource for BrokenBackend {
    fn backend_name(&self) -> &'static str {
        self.flaw.label()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<AcquireResult> {
        match self.flaw {
            Flaw::NeverGrants if never_granted(&req.name) => {
                // A short wait is refused at once (before a caller's cancellation,
                // which would make the history allow for a hidden grant); a long one
                // waits as if the lock were taken, then is refused.
                let now = std::time::Instant::now();
                if let Some(deadline) = req.deadline.filter(|d| *d > now + SHORT_WAIT) {
                    tokio::time::sleep_until(deadline.min(now + MAX_WAIT).into()).await;
                }
                Ok(AcquireResult::not_acquired(None, None))
            }
            Flaw::ReusesTokens => {
                let mut result = self.inner.try_acquire(req).await?;
                if let AcquireResult::Acquired { token, .. } = &mut result {
                    *token = FencingToken::new(1);
                }
                Ok(result)
            }
            _ => self.inner.try_acquire(req).await,
        }
    }

    async fn release(&self, req: &ReleaseRequest) -> Result<ReleaseResult> {
        if self.flaw == Flaw::ReleaseIgnoresOwner {
            // Whoever holds the lock loses it.
            self.inner.force_release(&req.name);
            return Ok(ReleaseResult::Released);
        }
        self.inner.release(req).await
    }

    async fn renew(&self, req: &RenewRequest) -> Result<RenewResult> {
        self.inner.renew(req).await
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockState>> {
        self.inner.inspect(name).await
    }

    fn admin(&self) -> Option<&dyn LockAdmin> {
        Some(&self.inner)
    }

    fn events(&self) -> Option<&dyn dlock_spi::LockEvents> {
        self.inner.events()
    }

    fn batch_renew(&self) -> Option<&dyn dlock_spi::BatchRenew> {
        None
    }
}

/// Whether `label` runs its "processes" as tasks of one process (its store cannot be
/// shared between processes): `memory` and the broken backends.
pub fn in_process(label: &str) -> bool {
    label == "memory" || Flaw::of(label).is_some()
}
