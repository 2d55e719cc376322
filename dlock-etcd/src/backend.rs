//! [`EtcdBackend`]: etcd's lock recipe with dlock's grants, leases and tokens.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use dlock_spi::{
    AcquireRequest, AcquireResult, Capabilities, Error, ErrorKind, FencingToken, HolderInfo,
    LockAdmin, LockEvents, LockName, LockRemoteResource, LockState, ReleaseRequest, ReleaseResult,
    RenewRequest, RenewResult, Result,
};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, EventType, GetOptions, KeyValue,
    LeaseClient, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, WatchFilterType,
    WatchOptions,
};
use tonic::transport::{Channel, Endpoint};

use crate::error::{map_etcd, timed_out};
use crate::keepalive::KeepAlives;
use crate::keys::{Keys, Side};
use crate::{parse_url, EtcdOptions};

/// How often a waiter whose key vanished (force-released, its lease lost in a
/// pause) queues again within one acquire before it gives up.
const MAX_PLACEMENTS: u32 = 64;

/// A [`LockRemoteResource`] on an etcd cluster. Cheap to clone: clones share one
/// connection (balanced over the members) and one lease keep-alive stream.
#[derive(Clone)]
pub struct EtcdBackend {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    keys: Keys,
    keep_alives: KeepAlives,
    timeout: Duration,
    /// The cluster's minimum lease TTL in seconds (a 1 s lease is granted this long).
    min_ttl: i64,
    attempts: AtomicU64,
}

impl std::fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("keys", &self.inner.keys)
            .finish_non_exhaustive()
    }
}

/// A lease's TTL in whole seconds, rounded up (etcd's unit), at least 1.
fn ttl_secs(lease: Duration) -> i64 {
    i64::try_from(lease.as_millis().div_ceil(1000))
        .unwrap_or(i64::MAX)
        .max(1)
}

/// Revokes a lease on drop unless disarmed: the key of an acquire that is
/// cancelled, fails or gives up goes with it, even one whose create is still in
/// flight (a create naming a revoked lease fails).
struct LeaseGuard {
    leases: Option<LeaseClient>,
    lease: i64,
}

impl LeaseGuard {
    fn disarm(mut self) {
        self.leases = None;
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if let (Some(mut leases), Ok(rt)) =
            (self.leases.take(), tokio::runtime::Handle::try_current())
        {
            let lease = self.lease;
            rt.spawn(async move {
                let _ = tokio::time::timeout(Duration::from_secs(5), leases.revoke(lease)).await;
            });
        }
    }
}

/// A contender's key in the queue.
struct Placed {
    /// Its create revision: its place and its fencing token.
    revision: i64,
    /// The lease it lives by.
    guard: LeaseGuard,
    /// When the last refresh of that lease that succeeded was sent.
    refreshed: Instant,
    /// The lease's TTL.
    ttl: Duration,
}

/// How a wait for the turn ended.
enum Turn {
    Granted,
    /// The key is gone (force-released, lease lost): queue again.
    Gone,
    /// The deadline passed first.
    TimedOut,
}

impl EtcdBackend {
    /// Connects to `etcd://host:port[,host:port…][/prefix][?timeout=5s]` and checks
    /// that the cluster answers.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, EtcdOptions::default()).await
    }

    /// Connects with `options`; what the URL sets overrides them.
    pub async fn connect_with(url: &str, options: EtcdOptions) -> Result<Self> {
        let parsed = parse_url(url, options)?;
        let options = parsed.options;
        let mut endpoints = Vec::with_capacity(parsed.hosts.len());
        for host in &parsed.hosts {
            let endpoint = Endpoint::from_shared(format!("http://{host}"))
                .map_err(|e| {
                    Error::new(
                        ErrorKind::Config,
                        format!("etcd URL: {host:?} is not a host:port"),
                    )
                    .with_source(e)
                })?
                .connect_timeout(options.connect_timeout)
                .tcp_nodelay(true)
                // etcd refuses pings more often than every 5 s (GOAWAY
                // too_many_pings) and pings without a call in flight.
                .http2_keep_alive_interval(options.keep_alive)
                .keep_alive_timeout(Duration::from_secs(5))
                .keep_alive_while_idle(false);
            endpoints.push(endpoint);
        }
        let channel = Channel::balance_list(endpoints.into_iter());
        let client = Client::from_channel(
            etcd_client::Channel::Tonic(channel.clone()),
            Some(ConnectOptions::new().with_require_leader(true)),
        )
        .await
        .map_err(|e| map_etcd(e, "connect"))?;
        // The cluster's shortest lease (etcd raises shorter ones to 1.5 election
        // timeouts): one round trip, so an unreachable cluster also fails here.
        let mut leases = client.lease_client();
        let probe = match tokio::time::timeout(options.timeout, leases.grant(1, None)).await {
            Ok(granted) => granted.map_err(|e| map_etcd(e, "connect"))?,
            Err(_) => return Err(timed_out("connect")),
        };
        let _ = tokio::time::timeout(options.timeout, leases.revoke(probe.id())).await;
        Ok(EtcdBackend {
            inner: Arc::new(Inner {
                client,
                keys: Keys::new(&options.prefix),
                keep_alives: KeepAlives::start(channel, options.timeout),
                timeout: options.timeout,
                min_ttl: probe.ttl().max(1),
                attempts: AtomicU64::new(0),
            }),
        })
    }

    /// Backend-side acquire attempts (each placement of a key counts one).
    pub fn acquire_attempts(&self) -> u64 {
        self.inner.attempts.load(Ordering::Relaxed)
    }

    /// Runs one etcd request within the request timeout.
    async fn call<T>(
        &self,
        op: &'static str,
        request: impl Future<Output = std::result::Result<T, etcd_client::Error>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.inner.timeout, request).await {
            Ok(answer) => answer.map_err(|e| map_etcd(e, op)),
            Err(_) => Err(timed_out(op)),
        }
    }

    fn guard(&self, lease: i64) -> LeaseGuard {
        LeaseGuard {
            leases: Some(self.inner.client.lease_client()),
            lease,
        }
    }

    /// The range a contender on `side` waits on: every key of the lock for a
    /// writer, its writers for a reader.
    fn ahead_range(&self, name: &LockName, side: Side) -> Vec<u8> {
        match side {
            Side::Write => self.inner.keys.lock(name),
            Side::Read => self.inner.keys.writers(name),
        }
    }

    /// Puts the grant's key in the queue (or finds it, for a retried acquire), on a
    /// lease of its own; answers it and whether it holds already.
    async fn place(
        &self,
        req: &AcquireRequest,
        key: &[u8],
        side: Side,
    ) -> Result<Option<(Placed, bool)>> {
        self.inner.attempts.fetch_add(1, Ordering::Relaxed);
        let sent = Instant::now();
        let mut leases = self.inner.client.lease_client();
        let granted = self
            .call("acquire", leases.grant(ttl_secs(req.lease), None))
            .await?;
        let guard = self.guard(granted.id());
        let ttl = Duration::from_secs(u64::try_from(granted.ttl()).unwrap_or(0));
        let first = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1)
            .with_keys_only();
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(
                    key,
                    req.context.to_vec(),
                    Some(PutOptions::new().with_lease(granted.id())),
                ),
                TxnOp::get(self.ahead_range(&req.name, side), Some(first)),
            ])
            // A retry of this grant finds its key from an earlier attempt and moves
            // it onto this attempt's lease (same key, same create revision): a
            // revocation of the earlier lease still in flight cannot remove it.
            .or_else([
                TxnOp::put(
                    key,
                    req.context.to_vec(),
                    Some(PutOptions::new().with_lease(granted.id()).with_prev_key()),
                ),
                TxnOp::get(key, None),
            ]);
        let mut kv = self.inner.client.kv_client();
        let answer = self.call("acquire", kv.txn(txn)).await?;
        let revision = answer.header().map_or(0, |h| h.revision());
        let responses = answer.op_responses();
        if answer.succeeded() {
            // The first contender ahead (writers only, for a reader): none, or our key.
            let ahead = first_kv(&responses);
            let holds = match side {
                Side::Write => ahead.is_none_or(|kv| kv.key() == key),
                Side::Read => ahead.is_none(),
            };
            let placed = Placed {
                revision,
                guard,
                refreshed: sent,
                ttl,
            };
            return Ok(Some((placed, holds)));
        }
        // A retry of this grant: its key now lives by the new lease; the earlier one
        // carries nothing any more.
        let earlier = responses.iter().find_map(|r| match r {
            TxnOpResponse::Put(put) => put.prev_key().map(KeyValue::lease),
            _ => None,
        });
        if let Some(earlier) = earlier.filter(|l| *l != 0) {
            drop(self.guard(earlier));
        }
        let Some(existing) = first_kv(&responses) else {
            return Ok(None);
        };
        let placed = Placed {
            revision: existing.create_revision(),
            guard,
            refreshed: sent,
            ttl,
        };
        Ok(Some((placed, false)))
    }

    /// Waits until no contender the key must wait for is left before it, its key
    /// is gone, or the deadline passes; keeps the key's lease alive meanwhile.
    async fn wait_turn(
        &self,
        req: &AcquireRequest,
        key: &[u8],
        side: Side,
        placed: &mut Placed,
    ) -> Result<Turn> {
        let ahead = self.ahead_range(&req.name, side);
        let mut kv = self.inner.client.kv_client();
        let mut watches = self.inner.client.watch_client();
        loop {
            let last_before = GetOptions::new()
                .with_prefix()
                .with_max_create_revision(placed.revision - 1)
                .with_sort(SortTarget::Create, SortOrder::Descend)
                .with_limit(1)
                .with_keys_only();
            let txn = Txn::new()
                .when([Compare::create_revision(
                    key,
                    CompareOp::Equal,
                    placed.revision,
                )])
                .and_then([TxnOp::get(ahead.clone(), Some(last_before))]);
            let answer = self.call("acquire", kv.txn(txn)).await?;
            if !answer.succeeded() {
                return Ok(Turn::Gone);
            }
            let seen = answer.header().map_or(0, |h| h.revision());
            let responses = answer.op_responses();
            let Some(before) = first_kv(&responses) else {
                return Ok(Turn::Granted);
            };
            let deadline = match req.deadline {
                Some(d) if Instant::now() < d => d,
                _ => return Ok(Turn::TimedOut),
            };
            // Watch that one key's deletion from just after the look.
            let only_deletes = WatchOptions::new()
                .with_start_revision(seen + 1)
                .with_filters([WatchFilterType::NoPut]);
            let mut watch = self
                .call("acquire", watches.watch(before.key(), Some(only_deletes)))
                .await?;
            let mut refresh_at = placed.refreshed + placed.ttl / 3;
            loop {
                tokio::select! {
                    message = watch.message() => match message {
                        Ok(Some(m)) if m.canceled() || m.events().iter().any(|e| e.event_type() == EventType::Delete) => break,
                        Ok(Some(_)) => {}
                        // The watch failed: look again (after a pause, so a broken
                        // connection does not spin).
                        Ok(None) | Err(_) => {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            break;
                        }
                    },
                    _ = tokio::time::sleep_until(refresh_at.into()) => {
                        let sent = Instant::now();
                        match self.inner.keep_alives.refresh(placed.guard.lease).await {
                            Ok(ttl) if ttl > 0 => {
                                placed.refreshed = sent;
                                refresh_at = sent + placed.ttl / 3;
                            }
                            Ok(_) => return Ok(Turn::Gone),
                            // Tried again soon; only a refresh that succeeded moves
                            // `refreshed` (the grant's lease is counted from it). A
                            // lease that runs out meanwhile shows as the key gone.
                            Err(err) => {
                                tracing::debug!(error = %err, "dlock-etcd: a waiter's lease refresh failed");
                                refresh_at = Instant::now() + Duration::from_millis(250);
                            }
                        }
                    }
                    _ = tokio::time::sleep_until(deadline.into()) => break,
                }
            }
        }
    }

    /// Every key of a lock, oldest first, with values.
    async fn contenders(&self, name: &LockName) -> Result<Vec<KeyValue>> {
        let all = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend);
        let mut kv = self.inner.client.kv_client();
        let mut answer = self
            .call("inspect", kv.get(self.inner.keys.lock(name), Some(all)))
            .await?;
        Ok(answer.take_kvs())
    }

    /// How many of `contenders` (oldest first) hold: the first writer alone, or the
    /// readers before the first writer.
    fn holding(&self, contenders: &[KeyValue]) -> usize {
        let sides = contenders
            .iter()
            .map(|kv| self.inner.keys.parse(kv.key()).map(|(_, side, _)| side));
        let mut holding = 0;
        for side in sides {
            match side {
                Some(Side::Write) if holding == 0 => return 1,
                Some(Side::Write) => break,
                Some(Side::Read) => holding += 1,
                None => {}
            }
        }
        holding
    }
}

/// The first key of the first range answer of a transaction.
fn first_kv(responses: &[TxnOpResponse]) -> Option<KeyValue> {
    responses.iter().find_map(|r| match r {
        TxnOpResponse::Get(get) => get.kvs().first().cloned(),
        _ => None,
    })
}

#[async_trait]
impl LockRemoteResource for EtcdBackend {
    fn backend_name(&self) -> &'static str {
        "etcd"
    }

    fn capabilities(&self) -> Capabilities {
        let mut c = Capabilities::default();
        c.lease = true;
        c.renew = true;
        c.reentrant = true;
        c.fair = true;
        c.shared = true;
        c.push_wakeup = true;
        c.fencing = true;
        c.min_lease = Some(Duration::from_secs(
            u64::try_from(self.inner.min_ttl).unwrap_or(1),
        ));
        c
    }

    /// # Cancel safety
    ///
    /// Cancel safe: a dropped acquire revokes the lease of the key it placed, which
    /// removes the key whether or not its create was applied yet.
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<AcquireResult> {
        let side = Side::of(req.mode).ok_or_else(|| Error::no_semaphores("etcd"))?;
        if req.alongside.is_some() {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "the etcd backend cannot take a lock beside the owner's hold in the other mode yet (no downgrades or upgrades); release one side first",
            ));
        }
        let key = self.inner.keys.contender(&req.name, side, &req.holder());
        for _ in 0..MAX_PLACEMENTS {
            let Some((mut placed, holds)) = self.place(req, &key, side).await? else {
                continue;
            };
            let turn = if holds {
                Turn::Granted
            } else if req.deadline.is_none_or(|d| Instant::now() >= d) {
                // Trying once: the placing look already saw someone ahead.
                Turn::TimedOut
            } else {
                self.wait_turn(req, &key, side, &mut placed).await?
            };
            match turn {
                Turn::Granted => {
                    let lease_until = placed.refreshed + req.lease.min(placed.ttl);
                    let token = FencingToken::new(u64::try_from(placed.revision).unwrap_or(0));
                    placed.guard.disarm();
                    return Ok(AcquireResult::acquired(token, Some(lease_until)));
                }
                Turn::TimedOut => {
                    // Withdraw: revoking the lease removes the key (and if this is
                    // cancelled or fails, the guard revokes it in the background).
                    let mut leases = self.inner.client.lease_client();
                    if self
                        .call("acquire", leases.revoke(placed.guard.lease))
                        .await
                        .is_ok()
                    {
                        placed.guard.disarm();
                    }
                    return Ok(AcquireResult::not_acquired(None, None));
                }
                Turn::Gone => {
                    if req.deadline.is_none_or(|d| Instant::now() >= d) {
                        return Ok(AcquireResult::not_acquired(None, None));
                    }
                }
            }
        }
        Err(Error::new(
            ErrorKind::Backend,
            "the etcd backend's key was removed from the queue every time it queued; check for something deleting dlock's keys",
        ))
    }

    /// # Cancel safety
    ///
    /// Cancel safe: the key is deleted in one request, applied or not; the lease's
    /// revocation afterwards runs on its own.
    async fn release(&self, req: &ReleaseRequest) -> Result<ReleaseResult> {
        let side = Side::of(req.mode).ok_or_else(|| Error::no_semaphores("etcd"))?;
        let key = self.inner.keys.contender(&req.name, side, &req.holder());
        let mut kv = self.inner.client.kv_client();
        let answer = self
            .call(
                "release",
                kv.delete(key, Some(DeleteOptions::new().with_prev_key())),
            )
            .await?;
        let Some(was) = answer.prev_kvs().first() else {
            return Ok(ReleaseResult::NotOwner);
        };
        // The lease carried only this key; it would expire anyway.
        drop(self.guard(was.lease()));
        Ok(ReleaseResult::Released)
    }

    /// # Cancel safety
    ///
    /// Cancel safe: each step (look, refresh, move to a longer lease) is one request
    /// that leaves the hold as it was or renewed.
    async fn renew(&self, req: &RenewRequest) -> Result<RenewResult> {
        let side = Side::of(req.mode).ok_or_else(|| Error::no_semaphores("etcd"))?;
        let key = self.inner.keys.contender(&req.name, side, &req.holder());
        let mut kv = self.inner.client.kv_client();
        let answer = self.call("renew", kv.get(key.clone(), None)).await?;
        let Some(held) = answer.kvs().first() else {
            return Ok(RenewResult::NotOwner);
        };
        let (lease, revision) = (held.lease(), held.create_revision());
        if u64::try_from(revision).ok() != Some(req.token.get()) {
            // The grant's key made again (not by this hold): not this hold.
            return Ok(RenewResult::NotOwner);
        }
        let sent = Instant::now();
        let ttl = self.inner.keep_alives.refresh(lease).await?;
        if ttl <= 0 {
            return Ok(RenewResult::NotOwner);
        }
        let wanted = ttl_secs(req.lease).max(self.inner.min_ttl);
        if ttl != wanted || req.context.is_some() {
            let same = Compare::create_revision(key.clone(), CompareOp::Equal, revision);
            let mut moved_to = None;
            let options = if ttl != wanted {
                // An extend to another lease: the key moves to a lease of that TTL.
                // The new lease is not revoked if the answer is lost (the move may
                // have been applied); unused, it expires by itself.
                let mut leases = self.inner.client.lease_client();
                let granted = self.call("renew", leases.grant(wanted, None)).await?;
                moved_to = Some(granted.id());
                PutOptions::new().with_lease(granted.id())
            } else {
                PutOptions::new().with_ignore_lease()
            };
            let options = match &req.context {
                Some(_) => options,
                None => options.with_ignore_value(),
            };
            let value = req.context.as_ref().map_or_else(Vec::new, |c| c.to_vec());
            let txn = Txn::new()
                .when([same])
                .and_then([TxnOp::put(key, value, Some(options))]);
            let answer = self.call("renew", kv.txn(txn)).await?;
            if !answer.succeeded() {
                if let Some(unused) = moved_to {
                    drop(self.guard(unused));
                }
                return Ok(RenewResult::NotOwner);
            }
            if moved_to.is_some() {
                drop(self.guard(lease)); // the old lease carries nothing now
            }
        }
        Ok(RenewResult::renewed(Some(sent + req.lease)))
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockState>> {
        let contenders = self.contenders(name).await?;
        if contenders.is_empty() {
            return Ok(None);
        }
        let holding = self.holding(&contenders);
        let mut holders = Vec::with_capacity(holding);
        let mut leases = self.inner.client.lease_client();
        for kv in &contenders[..holding] {
            let Some((_, side, holder)) = self.inner.keys.parse(kv.key()) else {
                continue;
            };
            let left = self
                .call("inspect", leases.time_to_live(kv.lease(), None))
                .await?
                .ttl();
            let left = Duration::from_secs(u64::try_from(left).unwrap_or(0));
            holders.push(HolderInfo::from_stored(
                holder,
                side.mode(),
                FencingToken::new(u64::try_from(kv.create_revision()).unwrap_or(0)),
                Bytes::copy_from_slice(kv.value()),
                Some(left),
            ));
        }
        Ok(Some(LockState::new(
            holders,
            Some(contenders.len() - holding),
        )))
    }

    fn admin(&self) -> Option<&dyn LockAdmin> {
        Some(self)
    }

    fn events(&self) -> Option<&dyn LockEvents> {
        None
    }
}

#[async_trait]
impl LockAdmin for EtcdBackend {
    async fn force_release(&self, name: &LockName) -> Result<usize> {
        let mut kv = self.inner.client.kv_client();
        let all = DeleteOptions::new().with_prefix().with_prev_key();
        let answer = self
            .call(
                "force_release",
                kv.delete(self.inner.keys.lock(name), Some(all)),
            )
            .await?;
        let mut removed = answer.prev_kvs().to_vec();
        removed.sort_by_key(KeyValue::create_revision);
        for was in &removed {
            drop(self.guard(was.lease()));
        }
        Ok(self.holding(&removed))
    }

    async fn live_locks(&self, prefix: &str) -> Result<usize> {
        let mut kv = self.inner.client.kv_client();
        let keys = GetOptions::new().with_prefix().with_keys_only();
        let answer = self
            .call(
                "live_locks",
                kv.get(self.inner.keys.names_starting(prefix), Some(keys)),
            )
            .await?;
        let mut names: Vec<&str> = answer
            .kvs()
            .iter()
            .filter_map(|kv| self.inner.keys.parse(kv.key()).map(|(name, _, _)| name))
            .collect();
        names.sort_unstable();
        names.dedup();
        Ok(names.len())
    }
}
