//! The test backends the runner can open, by label.

use std::sync::Arc;

use async_trait::async_trait;
use dlock_spi::{Error, ErrorKind, InMemoryBackend, LockName, LockRemoteResource, Result};

use crate::TestBackend;

/// Every label the runner understands.
pub const KNOWN: &[&str] = &["memory"];

/// Opens a fresh test backend for one case. Unknown labels and unreachable backends
/// are errors (the runner turns them into failures).
pub async fn open(label: &str) -> Result<Arc<dyn TestBackend>> {
    match label {
        "memory" => Ok(Arc::new(MemoryTestBackend::default())),
        other => Err(Error::new(
            ErrorKind::Config,
            format!(
                "unknown test backend {other:?} in DLOCK_TEST_BACKENDS; known: {}",
                KNOWN.join(", ")
            ),
        )),
    }
}

/// The in-memory backend; one instance per case, shared by all its clients.
#[derive(Default)]
pub struct MemoryTestBackend {
    backend: InMemoryBackend,
}

#[async_trait]
impl TestBackend for MemoryTestBackend {
    fn label(&self) -> &'static str {
        "memory"
    }

    async fn client(&self) -> Result<Arc<dyn LockRemoteResource>> {
        Ok(Arc::new(self.backend.clone()))
    }

    async fn steal(&self, name: &LockName) -> Result<()> {
        self.backend.force_release(name);
        Ok(())
    }

    async fn live_state(&self, _prefix: &str) -> Result<usize> {
        // One instance per case: everything in it belongs to the case.
        Ok(self.backend.active_locks())
    }

    fn acquire_attempts(&self) -> Option<u64> {
        Some(self.backend.acquire_attempts())
    }
}
