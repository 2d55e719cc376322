//! Semaphores in Apache Curator's `InterProcessSemaphoreV2` layout, so Java clients
//! and dlock share one semaphore:
//!
//! ```text
//! <root>/<escaped name>/locks/_c_<protection id>-lock-0000000007    the recipe's mutex
//! <root>/<escaped name>/leases/_c_<protection id>-lease-0000000042  one permit each
//! ```
//!
//! An acquire of `n` permits takes the mutex (an `InterProcessMutex` on `…/locks`:
//! waiters queue in arrival order and each watches only its predecessor), creates `n`
//! ephemeral sequential lease nodes, and waits — still holding the mutex, so nobody
//! passes it — until the leases number at most the total; then it gives the mutex
//! up. A holder's leases vanish with its session. The grant's token is its first
//! lease's creation zxid.
//!
//! Curator keeps no total in ZooKeeper (each client passes its own). dlock records
//! the total of its clients as the data of `…/leases`, set while nobody holds a
//! lease; a dlock client naming another total while leases are held is refused.

use std::sync::Arc;

use dlock_spi::{
    AcquireRequest, AcquireResult, Error, FencingToken, HolderInfo, LockMode, LockState,
    ReleaseRequest, ReleaseResult, Result,
};
use zookeeper_client::Error as ZkError;

use crate::backend::{HeldKey, HeldNode, ZkBackend};
use crate::error::map_zk;
use crate::layout::{self, lease_sequence, leases_dir, locks_dir, LEASE_MARKER};
use crate::nodes::{
    deadline_passed, delete_children, node_data, parse_node_data, token_of, PendingNode,
};
use crate::session::Session;

/// The total recorded in `…/leases` by dlock clients (`None` when none is).
fn recorded_total(data: &[u8]) -> Option<u32> {
    std::str::from_utf8(data).ok()?.trim().parse().ok()
}

/// A grant's leases (node name and token each, the first's token the grant's) and
/// the watch on the leases node from the listing that granted them.
type Granted = (
    Vec<(String, FencingToken)>,
    zookeeper_client::OneshotWatcher,
);

/// What one acquire's leases are made with: the session, the leases node, and the
/// grant's protection prefix and data. Built once per acquire, shared by the
/// uncontended path and the path through the mutex.
struct LeaseMaker<'a> {
    backend: &'a ZkBackend,
    session: &'a Arc<Session>,
    /// The leases node.
    dir: String,
    /// The recipe's mutex node, whose children queue for it.
    mutex_dir: String,
    /// The grant's protection prefix, which names its leases.
    protected: &'a str,
    /// Path prefix of a new (sequential) lease.
    prefix: String,
    data: &'a [u8],
}

/// The leases made so far by one attempt, each armed to be deleted (when dropped,
/// in the background) until the grant keeps them.
#[derive(Default)]
struct Made {
    leases: Vec<(String, FencingToken)>,
    pending: Vec<PendingNode>,
}

impl Made {
    /// The leases are the grant's: kept past the attempt.
    fn keep(mut self) -> Vec<(String, FencingToken)> {
        for p in &mut self.pending {
            p.disarm();
        }
        std::mem::take(&mut self.leases)
    }

    /// Deletes the leases made and waits for the answers (all sent first).
    async fn give_back(&mut self) {
        PendingNode::delete_all(&mut self.pending).await;
    }
}

impl<'a> LeaseMaker<'a> {
    fn new(
        backend: &'a ZkBackend,
        session: &'a Arc<Session>,
        lock: &str,
        protected: &'a str,
        data: &'a [u8],
    ) -> Self {
        let dir = leases_dir(lock);
        LeaseMaker {
            backend,
            session,
            prefix: format!("{dir}/{protected}{LEASE_MARKER}"),
            dir,
            mutex_dir: locks_dir(lock),
            protected,
            data,
        }
    }

    /// Sends `count` lease creates; none is awaited yet.
    fn send(
        &self,
        count: usize,
    ) -> Vec<
        impl std::future::Future<
                Output = std::result::Result<
                    (zookeeper_client::Stat, zookeeper_client::CreateSequence),
                    ZkError,
                >,
            > + '_,
    > {
        let acls = self.backend.inner.acls.contender();
        (0..count)
            .map(|_| self.session.client.create(&self.prefix, self.data, &acls))
            .collect()
    }

    /// Awaits `creates`, adding the leases made to `made`; the last failure, if any.
    async fn collect(
        &self,
        made: &mut Made,
        creates: Vec<
            impl std::future::Future<
                Output = std::result::Result<
                    (zookeeper_client::Stat, zookeeper_client::CreateSequence),
                    ZkError,
                >,
            >,
        >,
    ) -> Option<ZkError> {
        let mut failed = None;
        for create in creates {
            match create.await {
                Ok((stat, sequence)) => {
                    let node = format!("{}{LEASE_MARKER}{sequence}", self.protected);
                    made.pending.push(PendingNode::new(
                        &self.backend.inner.sessions,
                        self.session,
                        format!("{}/{node}", self.dir),
                    ));
                    made.leases.push((node, token_of(stat.czxid)));
                }
                Err(err) => failed = Some(err),
            }
        }
        failed
    }

    /// A create failed with `err`; one lost with the connection may still have
    /// happened, so the grant's leases are swept by their prefix (the session's end
    /// removes any left). The error to return.
    async fn lost_create(&self, mut made: Made, err: ZkError) -> Error {
        made.give_back().await;
        if let Ok(children) = self.session.client.list_children(&self.dir).await {
            for child in children.iter().filter(|c| c.starts_with(self.protected)) {
                self.backend
                    .inner
                    .sessions
                    .delete_later(self.session, format!("{}/{child}", self.dir));
            }
        }
        map_zk(err, "create")
    }

    /// The uncontended grant, in one round trip and without the mutex: creates the
    /// `n` leases and, in the same flight, lists the leases (with the recorded total)
    /// and the mutex's queue. Granted when nobody queues for the mutex, the
    /// recorded total is this one and the leases number at most the total; otherwise
    /// `None` sends the acquire through the mutex, and the leases are deleted in the
    /// background meanwhile (while they last they only count against the total).
    ///
    /// Safe without the mutex, as every grant is decided by a listing made after the
    /// grant's own creates: of any set of grants held at once, the one whose last
    /// lease was created last listed every other's leases besides its own, so it was
    /// granted only if they all fit the total. The mutex only orders waiters, and a
    /// queue in it turns this path away, so nobody passes a waiter. A Java client
    /// holding the mutex may meet these leases in its count until their deletes
    /// (sent at once) land: it waits, as for any lease, until they are gone.
    async fn take_unqueued(&self, req: &AcquireRequest, n: u32) -> Result<Option<Granted>> {
        let client = &self.session.client;
        // All sent, in this order, before the first answer is awaited: the listings
        // follow the creates on the session.
        let creates = self.send(usize::try_from(n).unwrap_or(usize::MAX));
        let (listed, recorded, queue) = (
            client.list_and_watch_children(&self.dir),
            client.get_data(&self.dir),
            client.list_children(&self.mutex_dir),
        );
        let mut made = Made::default();
        let failed = self.collect(&mut made, creates).await;
        let (listed, recorded, queue) = tokio::join!(listed, recorded, queue);
        match failed {
            None => {}
            // The semaphore's first use (no leases node yet): through the mutex.
            Some(ZkError::NoNode) => return Ok(None),
            Some(err) => return Err(self.lost_create(made, err).await),
        }
        let queue = match queue {
            Ok(queue) => Ok(queue),
            Err(ZkError::NoNode) => Ok(Vec::new()),
            Err(err) => Err(err),
        };
        if let (Ok((children, watch)), Ok((recorded, _)), Ok(queue)) = (listed, recorded, queue) {
            let total = usize::try_from(req.capacity).unwrap_or(usize::MAX);
            let fits = layout::contenders(&queue).is_empty()
                && recorded_total(&recorded) == Some(req.capacity)
                && made.leases.iter().all(|(node, _)| children.contains(node))
                && children.len() <= total;
            if fits {
                return Ok(Some((made.keep(), watch)));
            }
        }
        Ok(None)
    }

    /// Under the mutex: creates `n` leases (and the leases node on first use), checks
    /// the total against the other holders', and waits until the leases number at
    /// most the total. `None` when the deadline passed first (the leases deleted
    /// again). Two round trips when permits are free: the creates, then the listing
    /// with the recorded total.
    async fn take_under_mutex(&self, req: &AcquireRequest, n: u32) -> Result<Option<Granted>> {
        let client = &self.session.client;
        let total = req.capacity;
        let wanted = usize::try_from(n).unwrap_or(usize::MAX);
        let dir = &self.dir;
        let mut made = Made::default();
        for round in 0..2 {
            // All sent before the first answer is awaited.
            let creates = self.send(wanted - made.leases.len());
            match self.collect(&mut made, creates).await {
                None => break,
                // The semaphore's first use: its leases node, then the creates again.
                Some(ZkError::NoNode) if round == 0 => {
                    self.backend
                        .inner
                        .create_lock_node(self.session, dir)
                        .await?;
                }
                Some(err) => return Err(self.lost_create(made, err).await),
            }
        }
        let first = made
            .leases
            .first()
            .map(|(node, _)| node.clone())
            .unwrap_or_default();
        let (mut listed, mut recorded) =
            tokio::join!(client.list_and_watch_children(dir), client.get_data(dir));
        // A blip took an answer: both asked again once the connection is back.
        if let Err(err) = listed.as_ref().and(recorded.as_ref()) {
            let sessions = &self.backend.inner.sessions;
            if sessions
                .back_from_blip(self.session, err, req.deadline)
                .await
            {
                (listed, recorded) = tokio::join!(
                    sessions.across_blips(self.session, req.deadline, || {
                        client.list_and_watch_children(dir)
                    }),
                    sessions.across_blips(self.session, req.deadline, || client.get_data(dir))
                );
            }
        }
        let (mut children, mut watch) = listed.map_err(|e| map_zk(e, "list"))?;
        let (recorded, stat) = recorded.map_err(|e| map_zk(e, "get"))?;
        let others = children.iter().any(|c| !c.starts_with(self.protected));
        match recorded_total(&recorded) {
            Some(held) if held != total && others => {
                made.give_back().await;
                return Err(Error::semaphore_total_differs(held, total));
            }
            Some(held) if held == total => {}
            // Idle (or never recorded): record this total. Only the mutex's holder
            // writes it, so the version check fails only if someone bypassed it.
            _ => match client
                .set_data(dir, total.to_string().as_bytes(), Some(stat.version))
                .await
            {
                Ok(_) | Err(ZkError::BadVersion) => {}
                Err(err) => return Err(map_zk(err, "set_data")),
            },
        }
        loop {
            if !children.contains(&first) {
                return Err(Error::new(
                    dlock_spi::ErrorKind::Backend,
                    "a semaphore lease vanished while it waited (deleted by someone, or the session ended); retry",
                )
                .set_retryable(true));
            }
            // As Curator counts: every child of the leases node is a permit in use.
            if children.len() <= usize::try_from(total).unwrap_or(usize::MAX) {
                return Ok(Some((made.keep(), watch)));
            }
            let deadline = match req.deadline {
                Some(d) if !deadline_passed(Some(d)) => d,
                _ => break,
            };
            tokio::select! {
                _ = watch.changed() => {}
                () = tokio::time::sleep_until(deadline.into()) => break,
            }
            // (A blip is ridden out until the deadline.)
            (children, watch) = self
                .backend
                .inner
                .sessions
                .across_blips(self.session, Some(deadline), || {
                    client.list_and_watch_children(dir)
                })
                .await
                .map_err(|e| map_zk(e, "list"))?;
        }
        made.give_back().await;
        Ok(None)
    }
}

impl ZkBackend {
    /// One acquire of `n` permits in one session (see the module docs).
    pub(crate) async fn acquire_permits_in(
        &self,
        session: &Arc<Session>,
        req: &AcquireRequest,
        n: u32,
    ) -> Result<AcquireResult> {
        let inner = &self.inner;
        let lock = layout::lock_path(&inner.root, &req.name);
        let holder = req.holder();
        let data = node_data(&holder, &req.context);
        let protected = layout::protected_prefix(&holder);
        let maker = LeaseMaker::new(self, session, &lock, &protected, &data);
        if let Some((leases, watch)) = maker.take_unqueued(req, n).await? {
            return Ok(self.hold_leases(session, req, &lock, leases, watch));
        }
        // The mutex: the recipe's own InterProcessMutex node.
        let mutex_key = HeldKey::new(&req.name, holder.clone(), LockMode::Exclusive);
        let mutex_prefix = format!("{protected}{}", layout::MUTEX_MARKER);
        let mutex_dir = locks_dir(&lock);
        let mutex_node = crate::queue::Contending {
            session,
            key: &mutex_key,
            lock: &mutex_dir,
            prefix: &mutex_prefix,
            data: &data,
        };
        let Some((_, mut mutex)) = self
            .wait_turn(mutex_node, crate::acquire::Turn::until(req.deadline))
            .await?
        else {
            return Ok(AcquireResult::not_acquired(None, None));
        };
        let taken = maker.take_under_mutex(req, n).await;
        // Given up whatever happened (on an error, dropping it deletes it).
        mutex.delete().await;
        let Some((leases, watch)) = taken? else {
            return Ok(AcquireResult::not_acquired(None, None));
        };
        Ok(self.hold_leases(session, req, &lock, leases, watch))
    }

    /// Records a grant's leases as held and watches its first.
    fn hold_leases(
        &self,
        session: &Arc<Session>,
        req: &AcquireRequest,
        lock: &str,
        leases: Vec<(String, FencingToken)>,
        watch: zookeeper_client::OneshotWatcher,
    ) -> AcquireResult {
        let dir = leases_dir(lock);
        let (first, token) = leases[0].clone();
        let key = HeldKey::new(&req.name, req.holder(), req.mode);
        self.inner.held().insert(
            key.clone(),
            HeldNode {
                path: format!("{dir}/{first}"),
                token,
                extra: leases[1..]
                    .iter()
                    .map(|(node, _)| format!("{dir}/{node}"))
                    .collect(),
            },
        );
        let watch = self.watch_hold(session, key, dir, first, token, watch);
        AcquireResult::acquired(token, None).with_watch(watch)
    }

    /// Gives a grant's permits back: deletes its lease nodes. When this backend does
    /// not know them (an acquire cut short, whose answer never came), they are found
    /// by the grant's prefix — and so is its mutex node, which an acquire cut short
    /// between the node's create and its answer leaves behind (it would hold every
    /// later acquirer back for as long as the session lives).
    pub(crate) async fn release_permits(&self, req: &ReleaseRequest) -> Result<ReleaseResult> {
        let inner = &self.inner;
        let key = HeldKey::new(&req.name, req.holder(), req.mode);
        let held = inner.held().remove(&key);
        let session = inner.sessions.usable(None, None).await?;
        // (path, whether it is a lease: only those count as permits given back)
        let paths: Vec<(String, bool)> = match &held {
            Some(h) => std::iter::once(h.path.clone())
                .chain(h.extra.iter().cloned())
                .map(|path| (path, true))
                .collect(),
            None => {
                let lock = layout::lock_path(&inner.root, &req.name);
                let protected = layout::protected_prefix(&req.holder());
                let (leases, mutex) = (leases_dir(&lock), locks_dir(&lock));
                let (in_leases, in_mutex) = tokio::join!(
                    session.client.list_children(&leases),
                    session.client.list_children(&mutex)
                );
                let mut found = Vec::new();
                for (dir, children, lease) in
                    [(&leases, in_leases, true), (&mutex, in_mutex, false)]
                {
                    match children {
                        Ok(children) => found.extend(
                            children
                                .into_iter()
                                .filter(|c| c.starts_with(&protected))
                                .map(|c| (format!("{dir}/{c}"), lease)),
                        ),
                        Err(ZkError::NoNode) => {}
                        Err(err) => return Err(map_zk(err, "list")),
                    }
                }
                found
            }
        };
        let deletes: Vec<_> = paths
            .iter()
            .map(|(p, lease)| (session.client.delete(p, None), *lease))
            .collect();
        let mut released = false;
        for (delete, lease) in deletes {
            match delete.await {
                Ok(()) => released |= lease,
                Err(ZkError::NoNode) => {}
                Err(err) => {
                    if let Some(held) = held {
                        inner.held().insert(key, held);
                    }
                    return Err(map_zk(err, "delete"));
                }
            }
        }
        Ok(if released {
            ReleaseResult::Released
        } else {
            ReleaseResult::NotOwner
        })
    }

    /// A semaphore's holders (permits per grant; Java clients' leases one each, by
    /// node) and waiters (acquirers queued for, or holding, the mutex). The leases of
    /// an acquirer still waiting under the mutex are not holders.
    pub(crate) async fn inspect_semaphore(
        &self,
        session: &Session,
        lock: &str,
    ) -> Result<Option<LockState>> {
        let client = &session.client;
        let dir = leases_dir(lock);
        let (leases, mutex, recorded) = tokio::join!(
            client.list_children(&dir),
            client.list_children(&locks_dir(lock)),
            client.get_data(&dir)
        );
        let ok_or_empty = |r: std::result::Result<Vec<String>, ZkError>| match r {
            Ok(v) => Ok(v),
            Err(ZkError::NoNode) => Ok(Vec::new()),
            Err(err) => Err(map_zk(err, "list")),
        };
        let mut leases = ok_or_empty(leases)?;
        let waiters = layout::contenders(&ok_or_empty(mutex)?).len();
        let total = recorded.ok().and_then(|(data, _)| recorded_total(&data));
        leases.sort_by_key(|node| lease_sequence(node));
        let reads: Vec<_> = leases
            .iter()
            .map(|node| client.get_data(&format!("{dir}/{node}")))
            .collect();
        // (owner, permits, token of its first lease, context), in lease order.
        let mut grants: Vec<(String, u32, FencingToken, dlock_spi::Bytes)> = Vec::new();
        for (node, read) in leases.iter().zip(reads) {
            match read.await {
                Ok((data, stat)) => {
                    let (owner, context) = parse_node_data(node, data);
                    match grants.iter_mut().find(|g| g.0 == owner) {
                        Some(grant) => grant.1 += 1,
                        None => grants.push((owner, 1, token_of(stat.czxid), context)),
                    }
                }
                Err(ZkError::NoNode) => {}
                Err(err) => return Err(map_zk(err, "get")),
            }
        }
        let in_use: u32 = grants.iter().map(|g| g.1).sum();
        if total.is_some_and(|t| in_use > t) {
            // Over the total: the newest leases are the waiting acquirer's.
            grants.pop();
        }
        if grants.is_empty() && waiters == 0 {
            return Ok(None);
        }
        let holders = grants
            .into_iter()
            .map(|(owner, permits, token, context)| {
                HolderInfo::from_stored(&owner, LockMode::Permits(permits), token, context, None)
            })
            .collect();
        Ok(Some(LockState::new(holders, Some(waiters))))
    }

    /// Whether a semaphore has leases or acquirers (for `live_locks`).
    pub(crate) async fn semaphore_live(&self, session: &Session, lock: &str) -> Result<bool> {
        Ok(self.inspect_semaphore(session, lock).await?.is_some())
    }

    /// Deletes every lease and mutex node of a semaphore; the number of grants
    /// whose leases were removed.
    pub(crate) async fn force_release_semaphore(
        &self,
        session: &Session,
        lock: &str,
    ) -> Result<usize> {
        let holders = self
            .inspect_semaphore(session, lock)
            .await?
            .map_or(0, |s| s.holders.len());
        for dir in [leases_dir(lock), locks_dir(lock)] {
            let children = match session.client.list_children(&dir).await {
                Ok(children) => children,
                Err(ZkError::NoNode) => continue,
                Err(err) => return Err(map_zk(err, "list")),
            };
            delete_children(session, &dir, children.iter().map(String::as_str)).await?;
        }
        Ok(holders)
    }
}
