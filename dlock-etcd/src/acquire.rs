//! The acquire algorithm: a contender's key placed under the lock (one transaction
//! that also grants it when nothing older conflicts), and the wait for its turn —
//! the older conflicting keys deleted, watched from the placement's revision.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use dlock_spi::{
    AcquireRequest, AcquireResult, Error, ErrorKind, FencingToken, LockMode, LockName, Result,
};
use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, KeyValue, LeaseClient, PutOptions,
    SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, WatchFilterType, WatchOptions, WatchResponse,
};

use crate::backend::{first_kv, gets, keys_of, ttl_secs, EtcdBackend};
use crate::error::transport_failure;
use crate::keys::{permit_total, prefix_end, stored_value, Side};
use crate::resend::{resending, Repeat};

/// How often a waiter whose key vanished (force-released, its lease lost in a
/// pause) queues again within one acquire before it gives up.
pub(crate) const MAX_PLACEMENTS: u32 = 64;

/// Revokes a lease on drop unless disarmed: the key of an acquire that is
/// cancelled, fails or gives up goes with it, even one whose create is still in
/// flight (a create naming a revoked lease fails).
pub(crate) struct LeaseGuard {
    leases: Option<LeaseClient>,
    lease: i64,
    /// The backend's resend budget ([`EtcdBackend::call`]).
    resends: u32,
}

impl LeaseGuard {
    fn disarm(mut self) {
        self.leases = None;
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if let Some(leases) = self.leases.take() {
            let (lease, resends) = (self.lease, self.resends);
            let what = format_args!("lease {lease:x} of an abandoned acquire");
            dlock_spi::spawn_cleanup(&what, None, async move {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
                let revoke = || {
                    let mut leases = leases.clone();
                    async move { leases.revoke(lease).await }
                };
                let _ = resending(deadline, resends, Repeat::Safe, transport_failure, revoke).await;
            });
        }
    }
}

/// A contender's key in the queue.
pub(crate) struct Placed {
    /// Its create revision: its place and its fencing token.
    revision: i64,
    /// The lease it lives by.
    guard: LeaseGuard,
    /// When the last refresh of that lease that succeeded was sent.
    refreshed: Instant,
    /// The lease's TTL.
    ttl: Duration,
}

/// What a look at the contenders ahead of a key found.
pub(crate) enum Look {
    /// The key holds.
    Granted,
    /// The key is gone.
    Gone,
    /// Not yet: watch the deletions of `key` (to `end` if set) from revision
    /// `after + 1`. With `ahead` (permits: the keys created up to the waiter's own,
    /// oldest first, its own last), only a deletion that leaves them all holding, or
    /// deletes the waiter's own, calls for a new look; otherwise any deletion does.
    Watch {
        after: i64,
        key: Vec<u8>,
        end: Option<Vec<u8>>,
        ahead: Option<Vec<Vec<u8>>>,
    },
}

/// How a wait for the turn ended.
pub(crate) enum Turn {
    Granted,
    /// The key is gone (force-released, lease lost): queue again.
    Gone,
    /// The deadline passed first.
    TimedOut,
}

/// A waiter's lease refresh in flight ([`KeepAlives::refresh`]).
pub(crate) type Refreshing = std::pin::Pin<Box<dyn Future<Output = Result<i64>> + Send>>;

/// The answer of the refresh in flight, with its send time; never resolves while
/// none is.
pub(crate) async fn refreshed(
    refreshing: &mut Option<(Instant, Refreshing)>,
) -> (Instant, Result<i64>) {
    match refreshing {
        Some((sent, refresh)) => (*sent, refresh.await),
        None => std::future::pending().await,
    }
}

impl EtcdBackend {
    /// Acquires: places the contender's key and waits for its turn while the
    /// deadline allows (see [`LockRemoteResource::try_acquire`](dlock_spi::LockRemoteResource::try_acquire)).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped, the contender's key is deleted with its lease (revoked
    /// in a task of its own).
    pub(crate) async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireResult> {
        let side = Side::of(req.mode);
        if req.alongside.is_some() {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "the etcd backend cannot take a lock beside the owner's hold in the other mode yet (no downgrades or upgrades); release one side first",
            ));
        }
        let key = self
            .inner
            .keys
            .contender(&req.name, req.mode, &req.holder());
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
                    let lease = placed.guard.lease;
                    if self
                        .call(
                            "acquire",
                            Repeat::Safe,
                            Client::lease_client,
                            |mut l| async move { l.revoke(lease).await },
                        )
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

    pub(crate) fn guard(&self, lease: i64) -> LeaseGuard {
        LeaseGuard {
            leases: Some(self.inner.client.lease_client()),
            lease,
            resends: self.inner.resends,
        }
    }

    /// Puts the grant's key in the queue (or finds it, for a retried acquire), on a
    /// lease of its own; answers it and whether it holds already.
    pub(crate) async fn place(
        &self,
        req: &AcquireRequest,
        key: &[u8],
        side: Side,
    ) -> Result<Option<(Placed, bool)>> {
        self.inner.attempts.fetch_add(1, Ordering::Relaxed);
        let sent = Instant::now();
        let ttl = ttl_secs(req.lease);
        let grant = self.call(
            "acquire",
            Repeat::Safe,
            Client::lease_client,
            |mut l| async move { l.grant(ttl, None).await },
        );
        // Permits are placed only under the semaphore's total (its oldest permit
        // key's, pinned by the placing transaction), so every permit key shares one:
        // a request naming another is refused before it writes anything.
        let (granted, same_total) = match side {
            Side::Permits => {
                let (granted, same_total) = tokio::join!(grant, self.same_total(req));
                (granted?, Some(same_total))
            }
            Side::Write | Side::Read => (grant.await?, None),
        };
        let guard = self.guard(granted.id());
        // (Refused: the lease carries nothing; the guard revokes it.)
        let same_total = same_total.transpose()?;
        let ttl = Duration::from_secs(u64::try_from(granted.ttl()).unwrap_or(0));
        let value = stored_value(req.mode, req.capacity, &req.context);
        let (start, end) = self.inner.keys.ahead(&req.name, side);
        let look = GetOptions::new()
            .with_range(end)
            .with_sort(SortTarget::Create, SortOrder::Ascend);
        let mut placing = vec![TxnOp::put(
            key,
            value.clone(),
            Some(PutOptions::new().with_lease(granted.id())),
        )];
        let look = match side {
            // Permits need every contender (their keys say their permits).
            Side::Permits => look.with_keys_only(),
            Side::Write | Side::Read => look.with_limit(1).with_keys_only(),
        };
        placing.push(TxnOp::get(start, Some(look)));
        let mut placeable = vec![Compare::create_revision(key, CompareOp::Equal, 0)];
        placeable.extend(same_total);
        // A retry of this grant finds its key from an earlier attempt and moves it
        // onto this attempt's lease (same key, same create revision): a revocation
        // of the earlier lease still in flight cannot remove it. (Not there either:
        // the semaphore's oldest permit key changed since it was read; placed again.)
        let retry = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Greater, 0)])
            .and_then([
                TxnOp::put(
                    key,
                    value,
                    Some(PutOptions::new().with_lease(granted.id()).with_prev_key()),
                ),
                TxnOp::get(key, None),
            ]);
        let txn = Txn::new()
            .when(placeable)
            .and_then(placing)
            .or_else([TxnOp::txn(retry)]);
        let answer = self.txn("acquire", Repeat::IfUnsent, &txn).await?;
        let revision = answer.header().map_or(0, |h| h.revision());
        let responses = answer.op_responses();
        if answer.succeeded() {
            let holds = match side {
                // The first contender ahead: none, or our key.
                Side::Write => first_kv(&responses).is_none_or(|kv| kv.key() == key),
                // The first writer or permits: none.
                Side::Read => first_kv(&responses).is_none(),
                // Every permit key is under the request's total (the placing
                // transaction's compare).
                Side::Permits => {
                    let all = gets(&responses).next().unwrap_or_default();
                    let mine = all.iter().position(|kv| kv.key() == key);
                    mine.is_some_and(|i| i < self.held_prefix(keys_of(all), Some(req.capacity)))
                }
            };
            let placed = Placed {
                revision,
                guard,
                refreshed: sent,
                ttl,
            };
            return Ok(Some((placed, holds)));
        }
        let retried = responses.iter().find_map(|r| match r {
            TxnOpResponse::Txn(t) if t.succeeded() => Some(t.op_responses()),
            _ => None,
        });
        let Some(responses) = retried else {
            // The semaphore's oldest permit key changed since it was read.
            return Ok(None);
        };
        // A retry of this grant: its key now lives by the new lease; the earlier one
        // carries nothing any more.
        let earlier = responses.iter().find_map(|r| match r {
            TxnOpResponse::Put(put) => put.prev_key().map(KeyValue::lease),
            _ => None,
        });
        // (Never the lease the key lives on now: the one this attempt granted.)
        if let Some(earlier) = earlier.filter(|l| *l != 0 && *l != granted.id()) {
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

    /// Looks at the contenders a writer or reader waits for: the key holds when
    /// none was made before it; otherwise it watches the deletion of the last one.
    pub(crate) async fn look_lock(
        &self,
        req: &AcquireRequest,
        key: &[u8],
        side: Side,
        revision: i64,
    ) -> Result<Look> {
        let (start, end) = self.inner.keys.ahead(&req.name, side);
        let last_before = GetOptions::new()
            .with_range(end)
            .with_max_create_revision(revision - 1)
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(1)
            .with_keys_only();
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, revision)])
            .and_then([TxnOp::get(start, Some(last_before))]);
        let answer = self.txn("acquire", Repeat::Safe, &txn).await?;
        if !answer.succeeded() {
            return Ok(Look::Gone);
        }
        let after = answer.header().map_or(0, |h| h.revision());
        Ok(match first_kv(&answer.op_responses()) {
            None => Look::Granted,
            Some(before) => Look::Watch {
                after,
                key: before.key().to_vec(),
                end: None,
                ahead: None,
            },
        })
    }

    /// Looks at the contenders before a key for permits: it holds when they all
    /// hold permits that leave room for its own in the semaphore's total (the
    /// request's: every permit key was placed under it). Otherwise it watches the
    /// lock's deletions and counts them against the keys it saw ahead of it (no key
    /// is ever created ahead of it later: create revisions only grow), looking again
    /// only when one leaves those ahead holding with room for its own — a release
    /// wakes the waiters it frees, not all, and each one is told by the release
    /// itself, whatever the waiters ahead of it are doing. (Told instead by the
    /// waiter ahead once that one was granted, a waiter waited for that one's client:
    /// stalled or paused, it held back the answer of the waiter behind, while a
    /// request placed later was answered at once.)
    pub(crate) async fn look_permits(
        &self,
        req: &AcquireRequest,
        key: &[u8],
        revision: i64,
    ) -> Result<Look> {
        let lock = self.inner.keys.lock(&req.name);
        let end = prefix_end(&lock);
        let up_to_mine = GetOptions::new()
            .with_range(end.clone())
            .with_max_create_revision(revision)
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_keys_only();
        let same = Compare::create_revision(key, CompareOp::Equal, revision);
        let txn = Txn::new()
            .when([same])
            .and_then([TxnOp::get(lock.clone(), Some(up_to_mine))]);
        let answer = self.txn("acquire", Repeat::Safe, &txn).await?;
        if !answer.succeeded() {
            return Ok(Look::Gone);
        }
        let after = answer.header().map_or(0, |h| h.revision());
        let responses = answer.op_responses();
        let up_to_mine = gets(&responses).next().unwrap_or_default();
        if self.held_prefix(keys_of(up_to_mine), Some(req.capacity)) >= up_to_mine.len() {
            return Ok(Look::Granted);
        }
        Ok(Look::Watch {
            after,
            key: lock,
            end: Some(end),
            ahead: Some(up_to_mine.iter().map(|kv| kv.key().to_vec()).collect()),
        })
    }

    /// Whether watch message `m` calls for a new look by the waiter with `key`: a
    /// deletion of the watched key, or (with `ahead`, which it updates) one that
    /// deletes the waiter's own key or leaves every key ahead holding with room for
    /// its own.
    pub(crate) fn woken_by(
        &self,
        m: &WatchResponse,
        key: &[u8],
        ahead: Option<&mut Vec<Vec<u8>>>,
        total: u32,
    ) -> bool {
        let deleted = m
            .events()
            .iter()
            .filter(|e| e.event_type() == EventType::Delete)
            .filter_map(|e| e.kv().map(KeyValue::key));
        let Some(ahead) = ahead else {
            return deleted.count() > 0;
        };
        let before = ahead.len();
        for gone in deleted {
            if gone == key {
                return true;
            }
            ahead.retain(|k| k.as_slice() != gone);
        }
        ahead.len() < before
            && self.held_prefix(ahead.iter().map(Vec::as_slice), Some(total)) >= ahead.len()
    }

    /// The compare that places a permit request only under the semaphore's total as
    /// read now: its oldest permit key still there (its total is the request's), or
    /// no permit key at all. A semaphore in use with another total refuses the
    /// request here, before anything is written.
    pub(crate) async fn same_total(&self, req: &AcquireRequest) -> Result<Compare> {
        let (start, end) = self.inner.keys.side(&req.name, Side::Permits);
        let oldest = GetOptions::new()
            .with_range(end.clone())
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let (start_ref, oldest) = (&start, &oldest);
        let answer = self
            .call(
                "acquire",
                Repeat::Safe,
                Client::kv_client,
                |mut kv| async move { kv.get(start_ref.clone(), Some(oldest.clone())).await },
            )
            .await?;
        Ok(match answer.kvs().first() {
            None => Compare::create_revision(start, CompareOp::Equal, 0).with_range(end),
            Some(first) => {
                let total = total_of(answer.kvs());
                if total != Some(req.capacity) {
                    return Err(total_differs(total, req.capacity));
                }
                Compare::create_revision(first.key(), CompareOp::Equal, first.create_revision())
            }
        })
    }

    /// Waits until the key holds, is gone, or the deadline passes; keeps the key's
    /// lease alive meanwhile.
    pub(crate) async fn wait_turn(
        &self,
        req: &AcquireRequest,
        key: &[u8],
        side: Side,
        placed: &mut Placed,
    ) -> Result<Turn> {
        let mut woken = false;
        loop {
            if woken {
                self.inner.attempts.fetch_add(1, Ordering::Relaxed);
            }
            woken = true;
            let look = match side {
                Side::Permits => self.look_permits(req, key, placed.revision).await?,
                Side::Write | Side::Read => self.look_lock(req, key, side, placed.revision).await?,
            };
            let (after, watched, end, mut ahead) = match look {
                Look::Granted => return Ok(Turn::Granted),
                Look::Gone => return Ok(Turn::Gone),
                Look::Watch {
                    after,
                    key,
                    end,
                    ahead,
                } => (after, key, end, ahead),
            };
            let deadline = match req.deadline {
                Some(d) if Instant::now() < d => d,
                _ => return Ok(Turn::TimedOut),
            };
            // Deletions, from just after the look.
            let mut options = WatchOptions::new()
                .with_start_revision(after + 1)
                .with_filters([WatchFilterType::NoPut]);
            if let Some(end) = end {
                options = options.with_range(end);
            }
            let (watched, options) = (&watched, &options);
            let mut watch = self
                .call(
                    "acquire",
                    Repeat::Safe,
                    Client::watch_client,
                    |mut w| async move { w.watch(watched.clone(), Some(options.clone())).await },
                )
                .await?;
            let mut refresh_at = placed.refreshed + placed.ttl / 3;
            // A refresh in flight runs beside the watch: a deletion that grants the
            // key is heard while the keep-alive stream is slow to answer.
            let mut refreshing: Option<(Instant, Refreshing)> = None;
            loop {
                tokio::select! {
                    message = watch.message() => match message {
                        Ok(Some(m)) if m.canceled() => break,
                        Ok(Some(m)) => {
                            if self.woken_by(&m, key, ahead.as_mut(), req.capacity) {
                                break;
                            }
                        }
                        // The watch failed: look again (after a pause, so a broken
                        // connection does not spin).
                        Ok(None) | Err(_) => {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            break;
                        }
                    },
                    _ = tokio::time::sleep_until(refresh_at.into()), if refreshing.is_none() => {
                        let (keep_alives, lease) = (self.inner.keep_alives.clone(), placed.guard.lease);
                        let refresh: Refreshing = Box::pin(async move { keep_alives.refresh(lease).await });
                        refreshing = Some((Instant::now(), refresh));
                    }
                    refreshed = refreshed(&mut refreshing) => {
                        let (sent, answer) = refreshed;
                        refreshing = None;
                        match answer {
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
    pub(crate) async fn contenders(&self, name: &LockName) -> Result<Vec<KeyValue>> {
        let all = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend);
        let (lock, all) = (&self.inner.keys.lock(name), &all);
        let mut answer = self
            .call(
                "inspect",
                Repeat::Safe,
                Client::kv_client,
                |mut kv| async move { kv.get(lock.clone(), Some(all.clone())).await },
            )
            .await?;
        Ok(answer.take_kvs())
    }

    /// The mode a stored contender holds or waits for; a key that is not one
    /// counts as a writer: it blocks everyone behind it.
    pub(crate) fn mode_of(&self, key: &[u8]) -> LockMode {
        self.inner
            .keys
            .parse(key)
            .map_or(LockMode::Exclusive, |c| c.mode)
    }

    /// The semaphore's total among `contenders` (oldest first, with values): the
    /// oldest permit key's.
    pub(crate) fn total_among(&self, contenders: &[KeyValue]) -> Option<u32> {
        let oldest = contenders
            .iter()
            .position(|kv| self.mode_of(kv.key()).permits().is_some())?;
        total_of(&contenders[oldest..=oldest])
    }

    /// How many of `contenders` (oldest first) hold — always a run from the front:
    /// a writer when first; a reader when no writer or permits came before it;
    /// permits when only permits came before them and all of them fit in the
    /// semaphore's `total` (none fit without one).
    pub(crate) fn held_prefix<'k, I>(&self, contenders: I, total: Option<u32>) -> usize
    where
        I: IntoIterator<Item = &'k [u8]>,
        I::IntoIter: ExactSizeIterator,
    {
        let contenders = contenders.into_iter();
        let count = contenders.len();
        let total = u64::from(total.unwrap_or(0));
        let mut used = 0u64;
        let (mut only_readers, mut only_permits) = (true, true);
        for (i, key) in contenders.enumerate() {
            let mode = self.mode_of(key);
            let holds = match mode {
                LockMode::Exclusive => i == 0,
                LockMode::Shared => only_readers,
                LockMode::Permits(n) => {
                    used += u64::from(n);
                    only_permits && used <= total
                }
            };
            if !holds {
                return i;
            }
            only_readers &= mode == LockMode::Shared;
            only_permits &= mode.permits().is_some();
        }
        count
    }
}

/// The semaphore's total: the one in the value of its oldest permit key, if any.
pub(crate) fn total_of(oldest: &[KeyValue]) -> Option<u32> {
    oldest
        .first()
        .and_then(|kv| permit_total(kv.value()))
        .map(|(t, _)| t)
}

/// The refusal of a request for `asked` permits in all, as the semaphore has
/// `total` (or no readable total).
pub(crate) fn total_differs(total: Option<u32>, asked: u32) -> Error {
    match total {
        Some(total) => Error::semaphore_total_differs(total, asked),
        None => Error::new(
            ErrorKind::Backend,
            "the oldest permit key of this semaphore in etcd has no readable total; check for something writing to dlock's keys",
        ),
    }
}
