//! A lock handle's state, shared by its clones and its guards: the manager, the
//! name, owner and mode, what its grants ask for, its current hold, and where it
//! sits in a read-write lock.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use dlock_spi::{Error, Fairness, GrantId, HoldPurpose, LockMode, LockName, OwnerId, Result};

use crate::hold::Hold;
use crate::inner::{Config, ManagerInner};

pub(crate) struct Handle {
    pub(crate) manager: Arc<ManagerInner>,
    pub(crate) name: std::result::Result<LockName, Error>,
    pub(crate) owner: OwnerId,
    pub(crate) mode: LockMode,
    pub(crate) fairness: Fairness,
    /// What every grant of the handle asks for besides name, owner and mode.
    pub(crate) spec: HoldSpec,
    /// The current hold of this handle (shared by its clones), if any.
    pub(crate) current: Slot,
    /// Where the handle sits in a read-write lock, if it is one's side.
    pub(crate) side: Side,
    /// A read-write lock's sides: told of every grant of a side, so a request of
    /// another side that waits can go beside it.
    pub(crate) family: Option<Arc<tokio::sync::watch::Sender<u64>>>,
    /// Serialises remote acquires of this handle's clones, so they re-enter instead
    /// of racing to the backend with the same owner.
    pub(crate) gate: tokio::sync::Mutex<()>,
}

/// A handle's current hold, shared with the other sides of its read-write lock.
pub(crate) type Slot = Arc<Mutex<Option<Arc<Hold>>>>;

/// Where a handle sits in a read-write lock: which of the owner's other holds its
/// requests go beside.
pub(crate) enum Side {
    /// A lock of its own.
    Alone,
    /// The read side: beside the write side's hold (a writer reading).
    Read {
        /// The write side's current hold.
        write: Slot,
    },
    /// The write side: beside the read side's hold while the upgradeable side is
    /// held (an upgrade); refused beside a plain read hold (it would wait for
    /// itself).
    Write {
        /// The read side (a downgrade takes it).
        read: Arc<Handle>,
        /// The upgradeable side's current hold.
        upgrade: Slot,
    },
}

/// Where a handle stands: its owner, its hold's slot and its side.
pub(crate) struct Place {
    pub(crate) owner: OwnerId,
    pub(crate) current: Slot,
    pub(crate) side: Side,
    /// Shared by a read-write lock's sides (see [`Handle`]).
    pub(crate) family: Option<Arc<tokio::sync::watch::Sender<u64>>>,
}

/// The live hold in `slot`, if any.
pub(crate) fn live(slot: &Slot) -> Option<Arc<Hold>> {
    slot.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_ref()
        .filter(|h| h.lost_reason().is_none())
        .cloned()
}

/// What a handle's grants carry beyond name, owner, mode and fairness: a lock's
/// take the manager's context and nothing else; an election's and a semaphore's set
/// the rest.
#[derive(Debug, Clone)]
pub(crate) struct HoldSpec {
    /// Stored with every grant and shown by `inspect` (an election's value).
    pub(crate) context: Bytes,
    /// A lock's or a leadership's grants.
    pub(crate) purpose: HoldPurpose,
    /// A transition window added to every lease (an election's; zero otherwise).
    pub(crate) transition: Duration,
    /// A semaphore's total permits (zero otherwise).
    pub(crate) capacity: u32,
    /// How long a grant may be held at most (the manager's `max_hold` for locks and
    /// permits; none for leaderships).
    pub(crate) max_hold: Option<Duration>,
}

impl HoldSpec {
    /// A lock's: the manager's context and bound.
    pub(crate) fn lock(config: &Config) -> Self {
        HoldSpec {
            context: config.context.clone(),
            purpose: HoldPurpose::Lock,
            transition: Duration::ZERO,
            capacity: 0,
            max_hold: config.max_hold,
        }
    }
}

impl Handle {
    pub(crate) fn current(&self) -> MutexGuard<'_, Option<Arc<Hold>>> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn side(&self) -> &Side {
        &self.side
    }

    /// The grant of the owner's hold in the other mode that this handle's request
    /// goes beside, if any; an error for a write beside a plain read hold.
    pub(crate) fn alongside(&self, name: &LockName) -> Result<Option<GrantId>> {
        match &self.side {
            Side::Alone => Ok(None),
            Side::Read { write } => Ok(live(write).map(|h| h.grant)),
            Side::Write { read, upgrade } => {
                let Some(reading) = live(&read.current) else {
                    return Ok(None);
                };
                if live(upgrade).is_none() {
                    return Err(Error::invalid_argument(
                        "this read-write lock's owner holds its read side: a write beside a plain read would wait for itself (or for another reader doing the same); release the read side first (then write, or take upgradeable_read() and upgrade() it)",
                    )
                    .with_context("lock", name));
                }
                Ok(Some(reading.grant))
            }
        }
    }
}
