//! The ZooKeeper lock backend.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use dlock_spi::{
    async_trait, AcquireRequest, AcquireResult, Bytes, Capabilities, Error, FencingToken, HoldFeed,
    HoldPurpose, HoldStatus, HoldWatch, HolderInfo, HolderKey, LockAdmin, LockMode, LockName,
    LockRemoteResource, LockState, LostReason, ReleaseRequest, ReleaseResult, RenewRequest,
    RenewResult, Result,
};
use tokio::sync::watch;
use zookeeper_client::{
    Acls, CreateMode, CreateOptions, Error as ZkError, EventType, OneshotWatcher, WatchedEvent,
};

use crate::error::{connection_failure, map_zk};
use crate::layout::{self, Contender, ExclusiveNode};
use crate::session::{tls_config, ConnectSpec, Session, SessionPhase, Sessions};
use crate::{parse_url, ZkOptions};

/// The ACLs of the nodes dlock creates: open, or — when the URL carries digest
/// credentials — full rights for that identity only, so a root an operator secured
/// stays secured below the lock nodes dlock creates.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NodeAcls(Acls<'static>);

impl NodeAcls {
    fn new(authenticated: bool) -> Self {
        NodeAcls(if authenticated {
            Acls::creator_all()
        } else {
            Acls::anyone_all()
        })
    }

    pub(crate) fn contender(self) -> CreateOptions<'static> {
        CreateMode::EphemeralSequential.with_acls(self.0)
    }

    /// A contender placed at a sequence of dlock's choosing (a writer's read node,
    /// at its write node's sequence).
    fn placed(self) -> CreateOptions<'static> {
        CreateMode::Ephemeral.with_acls(self.0)
    }

    fn lock_node(self) -> CreateOptions<'static> {
        CreateMode::Container.with_acls(self.0)
    }

    fn root(self) -> CreateOptions<'static> {
        CreateMode::Persistent.with_acls(self.0)
    }
}

/// Marks node data written by dlock: `dlock1\n<owner>\n<context>`.
const DATA_MAGIC: &[u8] = b"dlock1\n";

/// How often an acquire re-creates its node when it keeps vanishing (force-released,
/// session replaced) before giving up with an error.
const MAX_ENQUEUES: usize = 8;

/// The longest a release waits for its session's connection to come back after a
/// blip before it reports the failure (the manager then sends it again later).
const RECONNECT_WAIT: Duration = Duration::from_secs(2);

/// Locks on ZooKeeper. Cheap to share (`Arc` inside); one session per backend.
#[derive(Clone)]
pub struct ZkBackend {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) sessions: Arc<Sessions>,
    pub(crate) root: String,
    exclusive: ExclusiveNode,
    pub(crate) acls: NodeAcls,
    /// Nodes this backend holds, by owner: for release, renew and reentry.
    held: Mutex<HashMap<HeldKey, HeldNode>>,
    /// Looks at a lock's queue (one per acquire, one per wake-up).
    pub(crate) attempts: AtomicU64,
    /// Dropped with the backend: stops the session supervisor.
    _shutdown: watch::Sender<()>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct HeldKey {
    name: LockName,
    holder: HolderKey,
    mode: LockMode,
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

/// How a contender waits for its turn.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Turn<'a> {
    /// Until when it may wait (`None`: look once).
    pub(crate) deadline: Option<Instant>,
    /// For a writer's read: its owner's write node, which it is placed beside (at
    /// that node's sequence, instead of ZooKeeper's next one) and which never
    /// blocks it.
    pub(crate) beside: Option<&'a Contender>,
}

impl Turn<'_> {
    /// A plain turn: queued last, by Curator's rules.
    pub(crate) fn until(deadline: Option<Instant>) -> Self {
        Turn {
            deadline,
            beside: None,
        }
    }
}

/// Our contender node, while we wait: found in the queue, or gone.
pub(crate) struct Enqueued {
    pub(crate) node: String,
    pub(crate) token: FencingToken,
    pub(crate) children: Vec<String>,
    /// The child watch set by the latest listing: the holder's steal detector.
    pub(crate) watch: OneshotWatcher,
    /// Whether `children` is the queue exactly as it was when our node was created
    /// (no child came or went in between).
    pub(crate) at_creation: bool,
}

/// A contender node to be made: on which session, for which grant, under which
/// lock node, with which name prefix and data.
#[derive(Clone, Copy)]
pub(crate) struct Contending<'a> {
    pub(crate) session: &'a Arc<Session>,
    pub(crate) key: &'a HeldKey,
    pub(crate) lock: &'a str,
    pub(crate) prefix: &'a str,
    pub(crate) data: &'a [u8],
}

impl Contending<'_> {
    /// The node `node` of this contender, armed to be deleted unless disarmed.
    pub(crate) fn pending(&self, sessions: &Arc<Sessions>, node: &str) -> PendingNode {
        PendingNode::new(sessions, self.session, format!("{}/{node}", self.lock))
    }
}

/// Where a new contender node goes in a lock's queue.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Place<'a> {
    /// At the back: ZooKeeper's next sequence.
    Next,
    /// At this key, not sequential (a writer's read, at its write node's key).
    At(&'a str),
    /// Right after the node with this key: the key followed by ZooKeeper's next
    /// sequence (an upgrade's write node).
    After(&'a str),
}

impl ZkBackend {
    /// Connects to the ensemble a `zk://` URL names, with default options for what the
    /// URL leaves out:
    /// `zk://[user:password@]host:port[,host:port…][/root][?session_timeout=10s&exclusive=mutex|rw]`.
    /// Creates the root path (default `/dlock`) if it is missing.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, ZkOptions::default()).await
    }

    /// Connects with `options`; what the URL sets overrides them.
    pub async fn connect_with(url: &str, options: ZkOptions) -> Result<Self> {
        let parsed = parse_url(url, options)?;
        // parse_url has checked that TLS is asked for with a CA, and certificates
        // only with TLS.
        let tls = match (&parsed.options.tls_root_certificate, parsed.options.tls) {
            (Some(ca), true) => Some(tls_config(ca, parsed.options.tls_identity.as_ref())?),
            _ => None,
        };
        let spec = ConnectSpec {
            hosts: parsed.hosts,
            session_timeout: parsed.options.session_timeout,
            digest: parsed.options.digest.clone(),
            connector: None,
            tls,
        };
        Self::assemble(spec, parsed.options, url).await
    }

    /// Builds the backend on the application's connector — its TLS, authentication
    /// and session timeout — for the ensemble `hosts` (`host:port,host:port`; with a
    /// chroot suffix if the application uses one). dlock opens its own sessions with
    /// it (the first now; a new one whenever a session is lost, as its holds end with
    /// their session), rather than sharing a client: a shared session would end the
    /// application's ephemeral nodes and watches along with dlock's holds, and dlock
    /// could not open the next one. [`ZkOptions::session_timeout`] does not apply
    /// (the connector has its own); with [`ZkOptions::digest`] set, dlock adds that
    /// digest authentication and creates its nodes writable by that identity only.
    ///
    /// ```no_run
    /// # async fn demo() -> dlock_spi::Result<()> {
    /// use std::time::Duration;
    /// use dlock_zk::{ZkBackend, ZkOptions};
    /// let connector = zookeeper_client::Client::connector()
    ///     .with_session_timeout(Duration::from_secs(6));
    /// let backend =
    ///     ZkBackend::from_connector(connector, "127.0.0.1:2181", ZkOptions::default()).await?;
    /// # let _ = backend; Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before it returns, the session it opened closes.
    pub async fn from_connector(
        connector: zookeeper_client::Connector,
        hosts: &str,
        options: ZkOptions,
    ) -> Result<Self> {
        let spec = ConnectSpec {
            hosts: hosts.to_owned(),
            session_timeout: options.session_timeout,
            digest: options.digest.clone(),
            connector: Some(connector),
            tls: None,
        };
        let shown = format!("zk://{hosts}");
        Self::assemble(spec, options, &shown).await
    }

    /// Opens the first session, creates the root and starts the supervisor.
    async fn assemble(spec: ConnectSpec, options: ZkOptions, url: &str) -> Result<Self> {
        let (shutdown, shutdown_rx) = watch::channel(());
        let sessions = Sessions::open(spec, shutdown_rx).await.map_err(|e| {
            Error::new(
                e.kind(),
                format!(
                    "cannot open a ZooKeeper session at {}: {}",
                    dlock_spi::redact_url(url),
                    e.message()
                ),
            )
            .set_retryable(e.is_retryable())
        })?;
        let root = options.root;
        let acls = NodeAcls::new(options.digest.is_some());
        sessions
            .current()
            .client
            .mkdir(&root, &acls.root())
            .await
            .map_err(|e| map_zk(e, "create root"))?;
        Ok(ZkBackend {
            inner: Arc::new(Inner {
                sessions,
                root,
                exclusive: options.exclusive_node,
                acls,
                held: Mutex::new(HashMap::new()),
                attempts: AtomicU64::new(0),
                _shutdown: shutdown,
            }),
        })
    }

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

    /// Puts our node into the lock's queue and lists the queue, in one round trip:
    /// the create and the listing go out back to back on the session, which the
    /// server serves in order. Creates the lock's node (a container) when missing,
    /// finds our node again after a connection loss, and keeps only the oldest when
    /// the owner already had one (a retried or repeated acquire). `place`: where the
    /// node goes in the queue. A blip that takes the answer to the create or to
    /// the listing is ridden out until `deadline` (`None`: not at all): once the
    /// connection is back, the session living on, the queue is listed again.
    pub(crate) async fn enqueue(
        &self,
        who: Contending<'_>,
        place: Place<'_>,
        deadline: Option<Instant>,
    ) -> Result<Enqueued> {
        let Contending {
            session,
            key,
            lock,
            prefix,
            data,
        } = who;
        let client = &session.client;
        let (name, options) = match place {
            Place::Next => (prefix.to_owned(), self.acls.contender()),
            Place::At(key) => (format!("{prefix}{key}"), self.acls.placed()),
            Place::After(key) => (format!("{prefix}{key}"), self.acls.contender()),
        };
        let sequential = !matches!(place, Place::At(_));
        let node_path = format!("{lock}/{name}");
        for _ in 0..3 {
            let create = client.create(&node_path, data, &options);
            let list = client.get_and_watch_children(lock);
            let (created, listed) = tokio::join!(create, list);
            let (node, token, czxid) = match created {
                Ok((stat, sequence)) => {
                    let node = if sequential {
                        format!("{name}{sequence}")
                    } else {
                        name.clone()
                    };
                    (node, token_of(stat.czxid), stat.czxid)
                }
                Err(ZkError::NoNode) => {
                    self.create_lock_node(session, lock).await?;
                    continue;
                }
                // A placed node made by an earlier try whose answer was lost.
                Err(lost)
                    if connection_failure(&lost)
                        || (!sequential && matches!(lost, ZkError::NodeExists)) =>
                {
                    // The create may have happened: look for our node by its prefix.
                    let (children, watch) = self
                        .sessions
                        .across_blips(session, live_deadline(deadline), || {
                            client.list_and_watch_children(lock)
                        })
                        .await
                        .map_err(|e| map_zk(e, "list"))?;
                    match self
                        .adopt(session, key, lock, prefix, &children, None)
                        .await?
                    {
                        Some((node, token)) => {
                            return Ok(Enqueued {
                                node,
                                token,
                                children,
                                watch,
                                at_creation: false,
                            })
                        }
                        None => continue,
                    }
                }
                Err(err) => return Err(map_zk(err, "create")),
            };
            // The node is made; a blip took the listing's answer: list again.
            let listed = match listed {
                Err(err) if self.sessions.back_from_blip(session, &err, deadline).await => {
                    self.sessions
                        .across_blips(session, deadline, || client.get_and_watch_children(lock))
                        .await
                }
                listed => listed,
            };
            let (children, parent, watch) = match listed {
                Ok(listed) => listed,
                Err(err) => {
                    self.sessions
                        .delete_later(session, format!("{lock}/{node}"));
                    return Err(map_zk(err, "list"));
                }
            };
            // Nothing changed among the children between our create and the listing.
            let at_creation = parent.pzxid == czxid;
            let created = node.clone();
            let (node, token) = self
                .adopt(session, key, lock, prefix, &children, Some((node, token)))
                .await?
                .ok_or_else(|| {
                    Error::new(
                        dlock_spi::ErrorKind::Backend,
                        "ZooKeeper lost a node it had just created; retry",
                    )
                })?;
            return Ok(Enqueued {
                at_creation: at_creation && node == created,
                node,
                token,
                children,
                watch,
            });
        }
        Err(Error::new(
            dlock_spi::ErrorKind::Backend,
            "could not queue for the lock: its ZooKeeper node keeps disappearing; retry",
        )
        .set_retryable(true))
    }

    /// Of the grant's nodes among `children` (same prefix), keeps the oldest one that
    /// belongs to `session` and deletes the others — also those of an earlier session
    /// of this backend (an acquire retried after its session ended), which must never
    /// be adopted: they vanish when that session expires. `created` is the node just
    /// made, with its token.
    async fn adopt(
        &self,
        session: &Session,
        key: &HeldKey,
        lock: &str,
        prefix: &str,
        children: &[String],
        created: Option<(String, FencingToken)>,
    ) -> Result<Option<(String, FencingToken)>> {
        let mut mine: Vec<Contender> = children
            .iter()
            .filter(|c| c.starts_with(prefix))
            .filter_map(|c| Contender::parse(c))
            .collect();
        mine.sort_by(|a, b| a.key.cmp(&b.key));
        // The common case: the node just created is the grant's only one.
        if let ([only], Some((node, _))) = (mine.as_slice(), &created) {
            if only.node == *node {
                return Ok(created);
            }
        }
        // Otherwise read every candidate's owner session, all requests out at once.
        let stats: Vec<_> = mine
            .iter()
            .map(|c| session.client.check_stat(&format!("{lock}/{}", c.node)))
            .collect();
        let mut kept: Option<(String, FencingToken)> = None;
        let mut extras = Vec::new();
        for (candidate, stat) in mine.iter().zip(stats) {
            match stat.await.map_err(|e| map_zk(e, "stat"))? {
                Some(stat) if stat.ephemeral_owner == session.id().0 && kept.is_none() => {
                    kept = Some((candidate.node.clone(), token_of(stat.czxid)));
                }
                Some(_) => extras.push(candidate.node.clone()),
                None => {}
            }
        }
        // Sent together, awaited together: the queue is clean when we answer.
        let deletes: Vec<_> = extras
            .iter()
            .map(|node| session.client.delete(&format!("{lock}/{node}"), None))
            .collect();
        for delete in deletes {
            match delete.await {
                Ok(()) | Err(ZkError::NoNode) => {}
                Err(err) => return Err(map_zk(err, "delete")),
            }
        }
        // A node this backend already tracks keeps its recorded token.
        Ok(kept.map(|(node, token)| {
            let path = format!("{lock}/{node}");
            let known = self
                .held()
                .get(key)
                .filter(|h| h.path == path)
                .map(|h| h.token);
            (node, known.unwrap_or(token))
        }))
    }

    /// Creates a lock's node (a container) — or a semaphore's `locks` or `leases`
    /// node below it — and what is missing above it, up to the root.
    pub(crate) async fn create_lock_node(&self, session: &Session, lock: &str) -> Result<()> {
        for _ in 0..2 {
            match session
                .client
                .create(lock, &[], &self.acls.lock_node())
                .await
            {
                Ok(_) | Err(ZkError::NodeExists) => return Ok(()),
                Err(ZkError::NoNode) => match lock.rsplit_once('/') {
                    Some((parent, _)) if parent.len() > self.root.len() => {
                        Box::pin(self.create_lock_node(session, parent)).await?;
                    }
                    // The root itself is gone (deleted by hand): put it back.
                    _ => session
                        .client
                        .mkdir(&self.root, &self.acls.root())
                        .await
                        .map_err(|e| map_zk(e, "create root"))?,
                },
                Err(err) => return Err(map_zk(err, "create lock node")),
            }
        }
        Ok(())
    }

    /// Finds an owner's node under a lock by its prefix (when this backend does not
    /// know it: another handle's stale guard, a restarted process).
    async fn find(&self, lock: &str, prefix: &str) -> Result<Option<String>> {
        let session = self.sessions.usable(None, None).await?;
        match session.client.list_children(lock).await {
            Ok(children) => Ok(children
                .into_iter()
                .filter(|c| c.starts_with(prefix))
                .min_by_key(|c| Contender::parse(c).map(|c| c.key))
                .map(|c| format!("{lock}/{c}"))),
            Err(ZkError::NoNode) => Ok(None),
            Err(err) => Err(map_zk(err, "list")),
        }
    }

    /// The path of the owner's node for a release or renewal (a semaphore grant's
    /// first lease).
    async fn node_of(&self, key: &HeldKey) -> Result<Option<String>> {
        if let Some(held) = self.held().get(key) {
            return Ok(Some(held.path.clone()));
        }
        let mut lock = layout::lock_path(&self.root, &key.name);
        if key.mode.permits().is_some() {
            lock = crate::layout::leases_dir(&lock);
        }
        // The protection id alone names the grant's node, whatever its marker.
        self.find(&lock, &layout::protected_prefix(&key.holder))
            .await
    }
}

impl ZkBackend {
    /// The feed that tells the guard how the hold stands: suspended while the
    /// connection is down, lost when the session ends or our node is deleted by
    /// someone else. It rides on the child watch the acquire's listing already set
    /// (no extra request): a change among the lock's children makes it list again and
    /// check that our node is still there. The manager drives it; it ends on release.
    pub(crate) fn watch_hold(
        &self,
        session: &Arc<Session>,
        key: HeldKey,
        lock: String,
        node: String,
        token: FencingToken,
        children_watch: OneshotWatcher,
    ) -> HoldWatch {
        HoldWatch::new(ZkHoldFeed {
            client: session.client.clone(),
            session: session.id(),
            sessions: self.inner.sessions.subscribe(),
            inner: Arc::downgrade(&self.inner),
            key,
            token,
            lock,
            node,
            watcher: Some(Box::pin(children_watch.changed())),
            last: HoldStatus::Held,
        })
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

impl ZkBackend {
    /// One acquire in one session.
    async fn acquire_in(
        &self,
        session: &Arc<Session>,
        req: &AcquireRequest,
    ) -> Result<AcquireResult> {
        if let LockMode::Permits(n) = req.mode {
            return self.acquire_permits_in(session, req, n).await;
        }
        let inner = &self.inner;
        let lock = layout::lock_path(&inner.root, &req.name);
        // Nodes belong to the grant: its key makes the protection id and the data, so
        // each grant has its own node, and releasing one never deletes — or adopts —
        // another's.
        let holder = req.holder();
        let prefix = layout::node_prefix(&holder, req.mode, inner.exclusive, req.purpose);
        let data = node_data(&holder, &req.context);
        let key = HeldKey::new(&req.name, holder, req.mode);
        // A read beside the owner's own write node is placed at that node's key, so
        // it stays ahead of every writer queued behind the write — and keeps them
        // out once the write goes (a downgrade). A write beside the owner's read is
        // an upgrade (the `upgrade` module), which finds that read in its own
        // listings.
        let other = req.alongside_holder();
        let upgrading = other
            .as_ref()
            .filter(|_| req.mode != LockMode::Shared)
            .map(layout::protected_prefix);
        let beside = match &other {
            Some(own) if req.mode == LockMode::Shared => self.own_node(session, &lock, own).await?,
            _ => None,
        };
        let who = Contending {
            session,
            key: &key,
            lock: &lock,
            prefix: &prefix,
            data: &data,
        };
        let waited = match &upgrading {
            Some(read) => self.wait_upgrade(who, read, req.deadline).await?,
            None => {
                let turn = Turn {
                    deadline: req.deadline,
                    beside: beside.as_ref(),
                };
                self.wait_turn(who, turn).await?
            }
        };
        let Some((mine, mut pending)) = waited else {
            return Ok(AcquireResult::not_acquired(None, None));
        };
        pending.disarm();
        // A read placed beside its owner's write carries the write's token: it goes
        // on with that tenure. Its own node's zxid is newer than those of the writers
        // queued behind the write, which are granted after it and must have newer
        // tokens. An upgrade carries its read's token for the same reason: the
        // writers queued behind that read are granted after the upgrade. (Only if
        // the other node was still there at the grant: else it was granted by the
        // plain rules, and its own zxid is its token.)
        let stood_on = match (&upgrading, &beside) {
            (Some(read), _) => mine
                .children
                .iter()
                .find(|c| c.starts_with(read.as_str()))
                .map(|node| (node.as_str(), LockMode::Shared)),
            (None, Some(write)) => mine
                .children
                .contains(&write.node)
                .then_some((write.node.as_str(), LockMode::Exclusive)),
            (None, None) => None,
        };
        let token = match (other, stood_on) {
            (Some(own), Some((node, mode))) => {
                let known = inner
                    .held()
                    .get(&HeldKey::new(&req.name, own, mode))
                    .map(|h| h.token);
                match known {
                    Some(token) => token,
                    None => match session.client.check_stat(&format!("{lock}/{node}")).await {
                        Ok(Some(stat)) => token_of(stat.czxid),
                        Ok(None) | Err(_) => mine.token,
                    },
                }
            }
            _ => mine.token,
        };
        inner.held().insert(
            key.clone(),
            HeldNode {
                path: format!("{lock}/{}", mine.node),
                token,
                extra: Vec::new(),
            },
        );
        let watch = self.watch_hold(session, key, lock, mine.node, token, mine.watch);
        Ok(AcquireResult::acquired(token, None).with_watch(watch))
    }

    /// The owner's node named by `own` (its protection id, whatever its marker)
    /// among the children of `lock`, if it is there.
    async fn own_node(
        &self,
        session: &Session,
        lock: &str,
        own: &HolderKey,
    ) -> Result<Option<Contender>> {
        let prefix = layout::protected_prefix(own);
        match session.client.list_children(lock).await {
            Ok(children) => Ok(children
                .iter()
                .filter(|c| c.starts_with(&prefix))
                .find_map(|c| Contender::parse(c))),
            Err(ZkError::NoNode) => Ok(None),
            Err(err) => Err(map_zk(err, "list")),
        }
    }

    /// Queues a contender node (`prefix`, `data`) under `lock` and waits until it
    /// stands first by Curator's rules ([`layout::standing`]): `Some` with the node
    /// (still armed to be deleted: the caller disarms it to keep it), or `None` once
    /// the turn's deadline passes (the node deleted). Watches only the node just
    /// ahead.
    pub(crate) async fn wait_turn(
        &self,
        who: Contending<'_>,
        turn: Turn<'_>,
    ) -> Result<Option<(Enqueued, PendingNode)>> {
        let inner = &self.inner;
        let (session, lock) = (who.session, who.lock);
        let Turn { deadline, beside } = turn;
        let place = beside.map_or(Place::Next, |own| Place::At(&own.key));
        let mut mine = inner.enqueue(who, place, deadline).await?;
        let mut pending = who.pending(&inner.sessions, &mine.node);
        // A read placed beside a write that was gone by the time it was made (the
        // writers queued behind that write may hold now) must not stand there: it
        // queues at the back, as any other.
        let mut beside = beside.map(|own| own.node.as_str());
        if beside.is_some_and(|own| !mine.children.iter().any(|c| c == own)) {
            pending.delete().await;
            mine = inner.enqueue(who, Place::Next, deadline).await?;
            pending = who.pending(&inner.sessions, &mine.node);
            beside = None;
        }
        let mut enqueues = 1;
        loop {
            inner.attempts.fetch_add(1, Ordering::Relaxed);
            let queue = layout::contenders(&mine.children);
            let Some(index) = queue.iter().position(|c| c.node == mine.node) else {
                // Our node vanished (deleted by an operator, or its session ended).
                pending.disarm();
                if enqueues >= MAX_ENQUEUES || deadline_passed(deadline) {
                    return Ok(None);
                }
                // Queued again at the back, by the plain rules (the hold it stood
                // beside may be gone by now too).
                beside = None;
                mine = inner.enqueue(who, Place::Next, deadline).await?;
                pending = who.pending(&inner.sessions, &mine.node);
                enqueues += 1;
                continue;
            };
            let ahead = match layout::standing(&queue, index, beside) {
                Ok(ahead) => ahead.map(|c| format!("{lock}/{}", c.node)),
                Err(()) => {
                    return Err(Error::new(
                        dlock_spi::ErrorKind::Backend,
                        "dlock-zk lost track of its node in the queue (a bug); retry",
                    ))
                }
            };
            let Some(ahead) = ahead else {
                return Ok(Some((mine, pending)));
            };
            if !self
                .wait_behind(session, lock, &ahead, deadline, &mut mine, &mut pending)
                .await?
            {
                return Ok(None);
            }
        }
    }

    /// Waits for the node at `ahead` to go (or change), then lists the lock's queue
    /// again into `mine`; `false`, with our node deleted, when the deadline passed
    /// first.
    pub(crate) async fn wait_behind(
        &self,
        session: &Arc<Session>,
        lock: &str,
        ahead: &str,
        deadline: Option<Instant>,
        mine: &mut Enqueued,
        pending: &mut PendingNode,
    ) -> Result<bool> {
        let Some(deadline) = live_deadline(deadline) else {
            pending.delete().await;
            return Ok(false);
        };
        if !self.await_change(session, ahead, deadline).await? {
            pending.delete().await;
            return Ok(false);
        }
        let listed = self
            .inner
            .sessions
            .across_blips(session, Some(deadline), || {
                session.client.list_and_watch_children(lock)
            })
            .await;
        match listed {
            Ok((children, watch)) => (mine.children, mine.watch) = (children, watch),
            // The lock node is gone, and our node with it.
            Err(ZkError::NoNode) => mine.children.clear(),
            Err(err) => return Err(map_zk(err, "list")),
        }
        Ok(true)
    }

    /// Waits until the node at `ahead` goes (or changes); `false` when `deadline`
    /// comes first.
    pub(crate) async fn await_change(
        &self,
        session: &Arc<Session>,
        ahead: &str,
        deadline: Instant,
    ) -> Result<bool> {
        match session.client.check_and_watch_stat(ahead).await {
            Ok((None, _)) => Ok(true),
            Ok((Some(_), watcher)) => Ok(tokio::select! {
                _ = watcher.changed() => true,
                () = tokio::time::sleep_until(deadline.into()) => false,
            }),
            // A blip: our node survives it with the session; look again.
            Err(err)
                if self
                    .inner
                    .sessions
                    .back_from_blip(session, &err, Some(deadline))
                    .await =>
            {
                Ok(true)
            }
            Err(err) => Err(map_zk(err, "watch")),
        }
    }
}

#[async_trait]
impl LockAdmin for ZkBackend {
    async fn force_release(&self, name: &LockName) -> Result<usize> {
        let lock = layout::lock_path(&self.inner.root, name);
        let session = self.inner.sessions.usable(None, None).await?;
        let children = match session.client.list_children(&lock).await {
            Ok(children) => children,
            Err(ZkError::NoNode) => return Ok(0),
            Err(err) => return Err(map_zk(err, "list")),
        };
        if crate::layout::is_semaphore(&children) {
            return self.force_release_semaphore(&session, &lock).await;
        }
        let queue = layout::contenders(&children);
        let holders = layout::holders(&queue).len();
        delete_children(&session, &lock, queue.iter().map(|c| c.node.as_str())).await?;
        Ok(holders)
    }

    async fn live_locks(&self, prefix: &str) -> Result<usize> {
        let session = self.inner.sessions.usable(None, None).await?;
        let root = &self.inner.root;
        let locks = match session.client.list_children(root).await {
            Ok(locks) => locks,
            Err(ZkError::NoNode) => return Ok(0),
            Err(err) => return Err(map_zk(err, "list")),
        };
        let paths: Vec<String> = locks
            .iter()
            .filter(|segment| {
                layout::decode_segment(segment).is_some_and(|name| name.starts_with(prefix))
            })
            .map(|segment| format!("{root}/{segment}"))
            .collect();
        let lists: Vec<_> = paths
            .iter()
            .map(|path| session.client.list_children(path))
            .collect();
        let mut live = 0;
        for (path, list) in paths.iter().zip(lists) {
            match list.await {
                Ok(children) if crate::layout::is_semaphore(&children) => {
                    if self.semaphore_live(&session, path).await? {
                        live += 1;
                    }
                }
                Ok(children) if !layout::contenders(&children).is_empty() => live += 1,
                Ok(_) | Err(ZkError::NoNode) => {}
                Err(err) => return Err(map_zk(err, "list")),
            }
        }
        Ok(live)
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

/// How one hold stands, worked out when its follower polls: child-watch events on
/// the lock's node and the session's status.
struct ZkHoldFeed {
    client: zookeeper_client::Client,
    session: crate::session::SessionId,
    sessions: watch::Receiver<crate::session::SessionStatus>,
    inner: Weak<Inner>,
    key: HeldKey,
    /// The node's creation zxid: tells our node from a later one of the same owner.
    token: FencingToken,
    lock: String,
    node: String,
    /// The pending child-watch event; `None` while there is no watch (trouble).
    watcher: Option<PendingEvent>,
    last: HoldStatus,
}

impl ZkHoldFeed {
    /// Whether this backend still holds the node (not released by its owner).
    fn still_ours(&self) -> bool {
        self.inner.upgrade().is_some_and(|inner| {
            inner
                .held()
                .get(&self.key)
                .is_some_and(|h| h.token == self.token)
        })
    }

    /// Lists the lock's children with a new watch: `Some(Lost)` if our node is gone,
    /// `None` otherwise (watch renewed, or connection trouble: the session decides).
    async fn recheck(&mut self) -> Option<HoldStatus> {
        match self.client.list_and_watch_children(&self.lock).await {
            Ok((children, w)) if children.contains(&self.node) => {
                self.watcher = Some(Box::pin(w.changed()));
                None
            }
            Ok(_) | Err(ZkError::NoNode) => Some(HoldStatus::Lost(LostReason::NotOwner)),
            Err(_) => None,
        }
    }
}

#[async_trait]
impl HoldFeed for ZkHoldFeed {
    async fn next(&mut self) -> Option<HoldStatus> {
        loop {
            if matches!(self.last, HoldStatus::Lost(_)) {
                return None;
            }
            let status = tokio::select! {
                event = next_event(&mut self.watcher) => {
                    self.watcher = None;
                    if !self.still_ours() {
                        return None;
                    }
                    if event.event_type == EventType::Session {
                        // The session status below tells suspension from expiry.
                        continue;
                    }
                    match self.recheck().await {
                        Some(lost) => lost,
                        None => continue,
                    }
                }
                changed = self.sessions.changed() => {
                    if changed.is_err() {
                        return None;
                    }
                    let status = *self.sessions.borrow_and_update();
                    match status.phase {
                        _ if status.id != self.session => HoldStatus::Lost(LostReason::SessionExpired),
                        SessionPhase::Lost => HoldStatus::Lost(LostReason::SessionExpired),
                        SessionPhase::Suspended => HoldStatus::Suspended,
                        // Back after trouble that cost us the watch: check and watch again.
                        SessionPhase::Connected if self.watcher.is_none() => {
                            self.recheck().await.unwrap_or(HoldStatus::Held)
                        }
                        SessionPhase::Connected => HoldStatus::Held,
                    }
                }
            };
            if !self.still_ours() {
                return None;
            }
            if status != self.last {
                self.last = status;
                return Some(status);
            }
        }
    }
}

/// A child-watch event still to come.
type PendingEvent = std::pin::Pin<Box<dyn std::future::Future<Output = WatchedEvent> + Send>>;

/// The next child-watch event, or never when there is no watch.
async fn next_event(watcher: &mut Option<PendingEvent>) -> WatchedEvent {
    match watcher {
        Some(event) => event.await,
        None => std::future::pending().await,
    }
}

/// A contender node that must not outlive a failed, timed-out or cancelled acquire.
pub(crate) struct PendingNode {
    sessions: Arc<Sessions>,
    session: Arc<Session>,
    path: Option<String>,
}

impl PendingNode {
    pub(crate) fn new(sessions: &Arc<Sessions>, session: &Arc<Session>, path: String) -> Self {
        PendingNode {
            sessions: Arc::clone(sessions),
            session: Arc::clone(session),
            path: Some(path),
        }
    }

    /// The node is ours to keep (granted) or already gone.
    pub(crate) fn disarm(&mut self) {
        self.path = None;
    }

    /// Deletes the node and waits for the answer, so the queue is clean on return
    /// (when the connection is down, the delete is retried in the background).
    pub(crate) async fn delete(&mut self) {
        Self::delete_all(std::slice::from_mut(self)).await;
    }

    /// [`Self::delete`] for several nodes, every request sent before the first
    /// answer is awaited.
    pub(crate) async fn delete_all(nodes: &mut [PendingNode]) {
        let deletes: Vec<_> = nodes
            .iter_mut()
            .filter_map(|node| {
                let path = node.path.take()?;
                let delete = node.session.client.delete(&path, None);
                Some((node, path, delete))
            })
            .collect();
        for (node, path, delete) in deletes {
            match delete.await {
                Ok(()) | Err(ZkError::NoNode) => {}
                Err(_) => node.sessions.delete_later(&node.session, path),
            }
        }
    }
}

impl Drop for PendingNode {
    fn drop(&mut self) {
        if let Some(path) = self.path.take() {
            // Cancelled while waiting: the delete is sent now, on this session.
            self.sessions.delete_later(&self.session, path);
        }
    }
}

/// Deletes `children` of `parent`, all requests out before the first answer is
/// awaited; children already gone are fine.
pub(crate) async fn delete_children<'a>(
    session: &Session,
    parent: &str,
    children: impl Iterator<Item = &'a str>,
) -> Result<()> {
    let deletes: Vec<_> = children
        .map(|c| session.client.delete(&format!("{parent}/{c}"), None))
        .collect();
    for delete in deletes {
        match delete.await {
            Ok(()) | Err(ZkError::NoNode) => {}
            Err(err) => return Err(map_zk(err, "delete")),
        }
    }
    Ok(())
}

pub(crate) fn deadline_passed(deadline: Option<Instant>) -> bool {
    live_deadline(deadline).is_none()
}

/// The deadline, if it has not passed (`None`: look once, no waiting).
pub(crate) fn live_deadline(deadline: Option<Instant>) -> Option<Instant> {
    deadline.filter(|d| *d > Instant::now())
}

pub(crate) fn token_of(czxid: i64) -> FencingToken {
    FencingToken::new(u64::try_from(czxid).unwrap_or(0))
}

pub(crate) fn node_data(holder: &HolderKey, context: &Bytes) -> Vec<u8> {
    let mut data = Vec::with_capacity(DATA_MAGIC.len() + holder.as_str().len() + 1 + context.len());
    data.extend_from_slice(DATA_MAGIC);
    data.extend_from_slice(holder.as_str().as_bytes());
    data.push(b'\n');
    data.extend_from_slice(context);
    data
}

/// The holder key and context stored in a node; a foreign node (Curator's) is
/// described by its own name and data.
pub(crate) fn parse_node_data(node: &str, data: Vec<u8>) -> (String, Bytes) {
    if let Some(rest) = data.strip_prefix(DATA_MAGIC) {
        if let Some(at) = rest.iter().position(|b| *b == b'\n') {
            if let Ok(holder) = std::str::from_utf8(&rest[..at]) {
                return (holder.to_owned(), Bytes::copy_from_slice(&rest[at + 1..]));
            }
        }
    }
    (node.to_owned(), Bytes::from(data))
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_spi::OwnerId;

    #[test]
    fn node_data_round_trips_and_foreign_data_is_kept() {
        let holder = HolderKey::new(&OwnerId::new("m:7"), dlock_spi::GrantId::new(3));
        let data = node_data(&holder, &Bytes::from_static(b"pid=1\nhost=a"));
        let (o, c) = parse_node_data("_c_x-lock-0000000001", data);
        assert_eq!(o, holder.as_str());
        assert_eq!(&c[..], b"pid=1\nhost=a");
        let (o, c) = parse_node_data("_c_x-lock-0000000002", b"10.0.0.7".to_vec());
        assert_eq!(o, "_c_x-lock-0000000002");
        assert_eq!(&c[..], b"10.0.0.7");
    }
}
