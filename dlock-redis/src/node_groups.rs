//! Which Redis Cluster slots share a master, as the renewal batches' answers showed
//! ([`crate::cluster_batch`]): learnt, not asked for, and forgotten when a slot
//! answers from elsewhere.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use redis::cluster_routing::Slot;

/// Which slots share a master: slot → the slot whose master the calls for it go
/// to. A stale entry costs one answer from elsewhere, and is forgotten.
#[derive(Default)]
pub(crate) struct NodeGroups {
    with: Mutex<HashMap<Slot, Slot>>,
    /// The server refused the batch script (before Redis 7): every hold renews
    /// alone.
    refused: AtomicBool,
}

impl NodeGroups {
    /// The slots known so far, to read and to learn from a batch's answers.
    pub(crate) fn with(&self) -> MutexGuard<'_, HashMap<Slot, Slot>> {
        self.with.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the server refused the batch script.
    pub(crate) fn refused(&self) -> bool {
        self.refused.load(Ordering::Relaxed)
    }

    /// Records that the server refused the batch script: no more batches.
    pub(crate) fn refuse(&self) {
        self.refused.store(true, Ordering::Relaxed);
    }
}
