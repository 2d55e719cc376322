//! A deliberately broken backend for the checker's self-test: the in-memory backend,
//! except that a release ignores its owner and frees the lock whoever holds it (as a
//! backend that deletes the key without checking the holder value would).

use async_trait::async_trait;
use dlock_spi::{
    AcquireRequest, AcquireResult, Capabilities, InMemoryBackend, LockAdmin, LockName,
    LockRemoteResource, LockState, ReleaseRequest, ReleaseResult, RenewRequest, RenewResult,
    Result,
};

/// The label that selects it (in-process only; `backends::open_at` opens it, the
/// conformance runner does not).
pub const LABEL: &str = "broken-memory";

/// [`InMemoryBackend`] whose release frees the lock without checking the owner.
#[derive(Clone)]
pub struct BrokenBackend {
    inner: InMemoryBackend,
}

impl BrokenBackend {
    /// A broken client of the store `inner`.
    pub fn over(inner: InMemoryBackend) -> Self {
        BrokenBackend { inner }
    }
}

#[async_trait]
impl LockRemoteResource for BrokenBackend {
    fn backend_name(&self) -> &'static str {
        LABEL
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<AcquireResult> {
        self.inner.try_acquire(req).await
    }

    /// The bug: whoever holds the lock loses it.
    async fn release(&self, req: &ReleaseRequest) -> Result<ReleaseResult> {
        self.inner.force_release(&req.name);
        Ok(ReleaseResult::Released)
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
}
