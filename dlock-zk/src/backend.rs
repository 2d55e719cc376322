//! The ZooKeeper lock backend.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use dlock_spi::{
    async_trait, AcquireRequest, AcquireResult, Capabilities, Error, FencingToken, HoldPurpose,
    HolderInfo, HolderKey, LockAdmin, LockMode, LockName, LockRemoteResource, LockState,
    ReleaseRequest, ReleaseResult, RenewRequest, RenewResult, Result,
};
use tokio::sync::watch;
use zookeeper_client::Error as ZkError;

use crate::acls::NodeAcls;
use crate::error::map_zk;
use crate::layout::{self, ExclusiveNode};
use crate::nodes::{deadline_passed, node_data, parse_node_data, token_of};
use crate::session::{SessionPhase, Sessions};

/// The longest a release waits for its session's connection to come back after a
/// blip before it reports the failure (the manager then sends it again later).
pub(crate) const RECONNECT_WAIT: Duration = Duration::from_secs(2);

/// How often an acquire re-creates its node when it keeps vanishing (force-released,
/// session replaced) before giving up with an error.
pub(crate) const MAX_ENQUEUES: usize = 8;

/// Locks on ZooKeeper. Cheap to share (`Arc` inside); one session per backend.
#[derive(Clone)]
pub struct ZkBackend {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) sessions: Arc<Sessions>,
    pub(crate) root: String,
    pub(crate) exclusive: ExclusiveNode,
    pub(crate) acls: NodeAcls,
    /// Nodes this backend holds, by owner: for release, renew and reentry.
    pub(crate) held: Mutex<HashMap<HeldKey, HeldNode>>,
    /// Looks at a lock's queue (one per acquire, one per wake-up).
    pub(crate) attempts: AtomicU64,
    /// Dropped with the backend: stops the session supervisor.
    pub(crate) _shutdown: watch::Sender<()>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct HeldKey {
    pub(crate) name: LockName,
    pub(crate) holder: HolderKey,
    pub(crate) mode: LockMode,
}

impl HeldKey {
    pub(crate) fn new(name: &LockName, holder: HolderKey, mode: LockMode) -> Self {
        HeldKey {
            name: name.clone(),
            holder,
            mode,
        }
    }

    /// The grant this node is for.
    pub(crate) fn holder(&self) -> &HolderKey {
        &self.holder
    }
}

#[derive(Debug, Clone)]
pub(crate) struct HeldNode {
    pub(crate) path: String,
    pub(crate) token: FencingToken,
    /// A semaphore grant's other lease nodes (one per permit beyond the first).
    pub(crate) extra: Vec<String>,
}

impl ZkBackend {
    /// The path of a lock's node: give it to a Curator `InterProcessMutex` (or
    /// read-write lock) to share the lock with a Java service.
    pub fn lock_path(&self, name: &LockName) -> String {
        layout::lock_path(&self.inner.root, name)
    }

    /// The name prefix of a grant's contender node in `mode` (`_c_<uuid>-lock-` and
    /// the like; the uuid is derived from the grant's [`HolderKey`]): the grant's node
    /// among a lock's children is the one starting with it.
    pub fn node_prefix(&self, holder: &HolderKey, mode: LockMode) -> String {
        layout::node_prefix(holder, mode, self.inner.exclusive, HoldPurpose::Lock)
    }

    /// The root path locks live under.
    pub fn root(&self) -> &str {
        &self.inner.root
    }

    /// The session timeout the server granted.
    pub fn session_timeout(&self) -> Duration {
        self.inner.sessions.current().client.session_timeout()
    }

    /// How many times this backend has looked at a lock's queue to decide a grant:
    /// once per acquire, once more per wake-up (a waiter woken for nothing shows here).
    pub fn acquire_attempts(&self) -> u64 {
        self.inner.attempts.load(Ordering::Relaxed)
    }

    /// Whether the current session is connected.
    pub fn is_connected(&self) -> bool {
        self.inner.sessions.status().phase == SessionPhase::Connected
    }
}

impl Inner {
    pub(crate) fn held(&self) -> MutexGuard<'_, HashMap<HeldKey, HeldNode>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[async_trait]
impl LockRemoteResource for ZkBackend {
    fn backend_name(&self) -> &'static str {
        "zookeeper"
    }

    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::default();
        caps.lease = false;
        caps.renew = false;
        caps.reentrant = true;
        caps.fair = true;
        caps.shared = true;
        caps.push_wakeup = true;
        caps.fencing = true;
        caps.semaphore = true;
        caps.cross_mode = true;
        caps.upgrade = true;
        caps
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<AcquireResult> {
        let sessions = &self.inner.sessions;
        let mut ended = None;
        for _ in 0..MAX_ENQUEUES {
            let session = sessions.usable(ended, req.deadline).await?;
            match self.acquire_in(&session, req).await {
                // The session ended under us: its node is gone; queue again in the new one.
                Err(err) if sessions.has_ended(&session) && !deadline_passed(req.deadline) => {
                    tracing::debug!(error = %err, "dlock-zk: session ended while acquiring; retrying in the next");
                    ended = Some(session.id());
                }
                other => return other,
            }
        }
        Err(Error::new(
            dlock_spi::ErrorKind::Backend,
            "ZooKeeper sessions keep ending while acquiring; check the ensemble's health",
        )
        .set_retryable(true))
    }

    async fn release(&self, req: &ReleaseRequest) -> Result<ReleaseResult> {
        if req.mode.permits().is_some() {
            return self.release_permits(req).await;
        }
        let inner = &self.inner;
        let key = HeldKey::new(&req.name, req.holder(), req.mode);
        let held = inner.held().remove(&key);
        let path = match &held {
            Some(held) => held.path.clone(),
            None => match inner.node_of(&key).await? {
                Some(path) => path,
                None => return Ok(ReleaseResult::NotOwner),
            },
        };
        let session = inner.sessions.usable(None, None).await?;
        // A blip: the node survives it with the session; once the connection is
        // back (within 2 s, and the session's grace), delete it then — an `unlock`
        // returns with the lock free, not with an error and the lock held. Longer
        // outages are left to the manager's retries, so an `unlock` (and a `close`
        // of many holds) is not held up by them.
        let wait = (session.client.session_timeout() * 2 / 5).min(RECONNECT_WAIT);
        let deleted = inner
            .sessions
            .across_blips(&session, Some(Instant::now() + wait), || {
                session.client.delete(&path, None)
            })
            .await;
        match deleted {
            Ok(()) => Ok(ReleaseResult::Released),
            Err(ZkError::NoNode) => Ok(ReleaseResult::NotOwner),
            Err(err) => {
                if let Some(held) = held {
                    inner.held().insert(key, held);
                }
                Err(map_zk(err, "delete"))
            }
        }
    }

    async fn renew(&self, req: &RenewRequest) -> Result<RenewResult> {
        let key = HeldKey::new(&req.name, req.holder(), req.mode);
        let Some(path) = self.inner.node_of(&key).await? else {
            return Ok(RenewResult::NotOwner);
        };
        let session = self.inner.sessions.usable(None, None).await?;
        if let Some(context) = &req.context {
            // The node is the hold: rewriting its data is atomic with its existence.
            let data = node_data(&req.holder(), context);
            return match session.client.set_data(&path, &data, None).await {
                Ok(_) => Ok(RenewResult::renewed(None)),
                Err(ZkError::NoNode) => Ok(RenewResult::NotOwner),
                Err(err) => Err(map_zk(err, "set_data")),
            };
        }
        match session.client.check_stat(&path).await {
            Ok(Some(_)) => Ok(RenewResult::renewed(None)),
            Ok(None) => Ok(RenewResult::NotOwner),
            Err(err) => Err(map_zk(err, "stat")),
        }
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockState>> {
        let lock = layout::lock_path(&self.inner.root, name);
        let session = self.inner.sessions.usable(None, None).await?;
        // A ZooKeeper server answers reads from what it has applied, and a follower
        // may not have applied a write the ensemble committed yet: another client's
        // acquire that has returned could be missing from the list (seen in the
        // conformance suite on the ensemble). `sync` brings this client's server up
        // to the leader first, so the read sees every change committed before it.
        match session.client.sync(&lock).await {
            Ok(()) | Err(ZkError::NoNode) => {}
            Err(err) => return Err(map_zk(err, "sync")),
        }
        let children = match session.client.list_children(&lock).await {
            Ok(children) => children,
            Err(ZkError::NoNode) => return Ok(None),
            Err(err) => return Err(map_zk(err, "list")),
        };
        if crate::layout::is_semaphore(&children) {
            return self.inspect_semaphore(&session, &lock).await;
        }
        let queue = layout::contenders(&children);
        if queue.is_empty() {
            return Ok(None);
        }
        let holders = layout::holders(&queue);
        // All requests go out before the first answer is awaited.
        let reads: Vec<_> = holders
            .iter()
            .map(|c| session.client.get_data(&format!("{lock}/{}", c.node)))
            .collect();
        let mut infos = Vec::with_capacity(holders.len());
        for (contender, read) in holders.iter().zip(reads) {
            match read.await {
                Ok((data, stat)) => {
                    let (owner, context) = parse_node_data(&contender.node, data);
                    infos.push(HolderInfo::from_stored(
                        &owner,
                        contender.mode,
                        token_of(stat.czxid),
                        context,
                        None,
                    ));
                }
                Err(ZkError::NoNode) => {}
                Err(err) => return Err(map_zk(err, "get")),
            }
        }
        Ok(Some(LockState::new(
            infos,
            Some(queue.len() - holders.len()),
        )))
    }

    fn admin(&self) -> Option<&dyn LockAdmin> {
        Some(self)
    }

    fn events(&self) -> Option<&dyn dlock_spi::LockEvents> {
        Some(self)
    }

    fn batch_renew(&self) -> Option<&dyn dlock_spi::BatchRenew> {
        None
    }
}

#[async_trait]
impl dlock_spi::LockEvents for ZkBackend {
    async fn follow(&self, name: &LockName) -> Result<dlock_spi::ChangeFeed> {
        let lock = layout::lock_path(&self.inner.root, name);
        crate::follow::follow(Arc::clone(&self.inner.sessions), lock).await
    }
}

impl fmt::Debug for ZkBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkBackend")
            .field("root", &self.inner.root)
            .field("exclusive_node", &self.inner.exclusive)
            .field("connected", &self.is_connected())
            .finish()
    }
}
