//! [`EtcdBackend`]: etcd's lock recipe with dlock's grants, leases and tokens.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use dlock_spi::{
    AcquireRequest, AcquireResult, Capabilities, Error, ErrorKind, FencingToken, HolderInfo,
    LockAdmin, LockEvents, LockMode, LockName, LockRemoteResource, LockState, ReleaseRequest,
    ReleaseResult, RenewRequest, RenewResult, Result,
};
use etcd_client::{
    Client, Compare, CompareOp, DeleteOptions, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse,
    TxnResponse,
};

use crate::error::{is_old_auth_revision, map_etcd, timed_out, transport_failure};
use crate::keepalive::KeepAlives;
use crate::keys::{permit_total, stored_value, Keys, Side};
use crate::resend::{resending, Repeat, Sent, Unanswered};

/// A [`LockRemoteResource`] on an etcd cluster. Cheap to clone: clones share one
/// connection (balanced over the members) and one lease keep-alive stream.
#[derive(Clone)]
pub struct EtcdBackend {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) client: Client,
    pub(crate) keys: Keys,
    pub(crate) keep_alives: KeepAlives,
    pub(crate) timeout: Duration,
    /// The cluster's minimum lease TTL in seconds (a 1 s lease is granted this long).
    pub(crate) min_ttl: i64,
    pub(crate) attempts: AtomicU64,
    /// How many times a request that met a transport failure is sent again at
    /// once ([`crate::resend::budget`] of the members the URL names).
    pub(crate) resends: u32,
}

impl std::fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("keys", &self.inner.keys)
            .finish_non_exhaustive()
    }
}

/// A lease's TTL in whole seconds, rounded up (etcd's unit), at least 1.
pub(crate) fn ttl_secs(lease: Duration) -> i64 {
    i64::try_from(lease.as_millis().div_ceil(1000))
        .unwrap_or(i64::MAX)
        .max(1)
}

impl EtcdBackend {
    /// Backend-side acquire attempts: each placement of a key, and each look again
    /// at the contenders ahead of it after a wake-up, counts one.
    pub fn acquire_attempts(&self) -> u64 {
        self.inner.attempts.load(Ordering::Relaxed)
    }

    /// Runs one etcd request within the request timeout: `send` makes it on a
    /// client `make` gives (`Client::kv_client`, …), and makes it again after a
    /// transport failure when `repeat` allows it ([`crate::resend`]).
    pub(crate) async fn call<C, T, Fut>(
        &self,
        op: &'static str,
        repeat: Repeat,
        make: fn(&Client) -> C,
        send: impl FnMut(C) -> Fut,
    ) -> Result<T>
    where
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        Ok(self.call_noting(op, repeat, make, send).await?.answer)
    }

    /// Sends transaction `txn` with [`Self::call`] (cloned for each send).
    pub(crate) async fn txn(
        &self,
        op: &'static str,
        repeat: Repeat,
        txn: &Txn,
    ) -> Result<TxnResponse> {
        self.call(op, repeat, Client::kv_client, |mut kv| async move {
            kv.txn(txn.clone()).await
        })
        .await
    }

    /// [`Self::call`], also telling whether the request was sent again after a
    /// failure that may have come after it was applied.
    pub(crate) async fn call_noting<C, T, Fut>(
        &self,
        op: &'static str,
        repeat: Repeat,
        make: fn(&Client) -> C,
        mut send: impl FnMut(C) -> Fut,
    ) -> Result<Sent<T>>
    where
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let deadline = tokio::time::Instant::now() + self.inner.timeout;
        let client = &self.inner.client;
        let mut signed_in_again = 0;
        loop {
            let sent = resending(
                deadline,
                self.inner.resends,
                repeat,
                transport_failure,
                || send(make(client)),
            )
            .await;
            match sent {
                // Refused unapplied for a user or role change in flight: signed in
                // again (a new token), sent again — a few times, within the deadline.
                Err(Unanswered::Failed(e))
                    if is_old_auth_revision(&e)
                        && signed_in_again < AUTH_CHANGE_RESENDS
                        && tokio::time::Instant::now() < deadline =>
                {
                    signed_in_again += 1;
                    if let Ok(Err(e)) =
                        tokio::time::timeout_at(deadline, client.refresh_token()).await
                    {
                        tracing::debug!(error = %e, "dlock-etcd: signing in again after a change of users failed; sending the request again as it is");
                    }
                }
                other => {
                    return other.map_err(|u| u.into_error(|e| map_etcd(e, op), || timed_out(op)))
                }
            }
        }
    }
}

/// The keys of `kvs`, in their order.
pub(crate) fn keys_of(kvs: &[KeyValue]) -> impl ExactSizeIterator<Item = &[u8]> {
    kvs.iter().map(KeyValue::key)
}

/// The range answers of a transaction's operations, in order.
pub(crate) fn gets(responses: &[TxnOpResponse]) -> impl Iterator<Item = &[KeyValue]> {
    responses.iter().filter_map(|r| match r {
        TxnOpResponse::Get(get) => Some(get.kvs()),
        _ => None,
    })
}

/// The first key of the first range answer of a transaction.
pub(crate) fn first_kv(responses: &[TxnOpResponse]) -> Option<KeyValue> {
    responses.iter().find_map(|r| match r {
        TxnOpResponse::Get(get) => get.kvs().first().cloned(),
        _ => None,
    })
}

/// How many times one request refused for a change of users in flight
/// ([`is_old_auth_revision`]) is sent again, signed in anew each time.
pub(crate) const AUTH_CHANGE_RESENDS: u32 = 3;

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
        c.semaphore = true;
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
        self.acquire(req).await
    }

    /// # Cancel safety
    ///
    /// Cancel safe: the key is deleted by one delete request (sent again at once
    /// after a transport failure), applied or not; the lease's
    /// revocation afterwards runs on its own.
    async fn release(&self, req: &ReleaseRequest) -> Result<ReleaseResult> {
        let key = self
            .inner
            .keys
            .contender(&req.name, req.mode, &req.holder());
        let key = &key;
        // A delete sent twice finds nothing the second time: sent again after any
        // transport failure, but "not owner" after one that may have followed the
        // first delete's being applied is no answer — the caller sends it again.
        let sent = self
            .call_noting(
                "release",
                Repeat::Safe,
                Client::kv_client,
                |mut kv| async move {
                    kv.delete(key.clone(), Some(DeleteOptions::new().with_prev_key()))
                        .await
                },
            )
            .await?;
        let Some(was) = sent.answer.prev_kvs().first() else {
            if sent.resent_maybe_applied {
                return Err(Error::new(
                    ErrorKind::Backend,
                    "the connection to etcd broke under the release, and the key was gone when it was sent again: the first send may have released it, or the lease ended; nothing of this grant is held now — retry, and a \"not owner\" answer means the same",
                )
                .set_retryable(true));
            }
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
        let side = Side::of(req.mode);
        let key = self
            .inner
            .keys
            .contender(&req.name, req.mode, &req.holder());
        let answer = self
            .call("renew", Repeat::Safe, Client::kv_client, |mut kv| {
                let key = key.clone();
                async move { kv.get(key, None).await }
            })
            .await?;
        let Some(held) = answer.kvs().first() else {
            return Ok(RenewResult::NotOwner);
        };
        let (lease, revision) = (held.lease(), held.create_revision());
        // Permits keep the total at the head of their value.
        let held_total = permit_total(held.value()).map(|(total, _)| total);
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
                let granted = self
                    .call(
                        "renew",
                        Repeat::Safe,
                        Client::lease_client,
                        |mut l| async move { l.grant(wanted, None).await },
                    )
                    .await?;
                moved_to = Some(granted.id());
                PutOptions::new().with_lease(granted.id())
            } else {
                PutOptions::new().with_ignore_lease()
            };
            let options = match &req.context {
                Some(_) => options,
                None => options.with_ignore_value(),
            };
            let value = match &req.context {
                Some(c) => match held_total {
                    Some(total) if side == Side::Permits => stored_value(req.mode, total, c),
                    _ => c.to_vec(),
                },
                None => Vec::new(),
            };
            let txn = Txn::new()
                .when([same])
                .and_then([TxnOp::put(key, value, Some(options))]);
            let answer = self.txn("renew", Repeat::Safe, &txn).await?;
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
        let holding = self.held_prefix(keys_of(&contenders), self.total_among(&contenders));
        let mut holders = Vec::with_capacity(holding);
        for kv in &contenders[..holding] {
            let Some(contender) = self.inner.keys.parse(kv.key()) else {
                continue;
            };
            let context = match contender.mode {
                LockMode::Permits(_) => permit_total(kv.value()).map_or(&[][..], |(_, c)| c),
                LockMode::Exclusive | LockMode::Shared => kv.value(),
            };
            let lease = kv.lease();
            let left = self
                .call(
                    "inspect",
                    Repeat::Safe,
                    Client::lease_client,
                    |mut l| async move { l.time_to_live(lease, None).await },
                )
                .await?
                .ttl();
            let left = Duration::from_secs(u64::try_from(left).unwrap_or(0));
            holders.push(HolderInfo::from_stored(
                contender.holder,
                contender.mode,
                FencingToken::new(u64::try_from(kv.create_revision()).unwrap_or(0)),
                Bytes::copy_from_slice(context),
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
        Some(self)
    }

    fn batch_renew(&self) -> Option<&dyn dlock_spi::BatchRenew> {
        Some(self)
    }
}
