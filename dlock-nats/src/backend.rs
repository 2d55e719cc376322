//! The [`LockRemoteResource`] implementation: the constructors, and release,
//! renewal, inspection and the operator's actions (acquire is
//! [`crate::acquire`]).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::kv::{Operation, Store};
use async_nats::Client;
use async_trait::async_trait;
use bytes::Bytes;
use dlock_spi::{
    AcquireRequest, AcquireResult, BatchRenew, Capabilities, FencingToken, HolderInfo, LockAdmin,
    LockEvents, LockMode, LockName, LockRemoteResource, LockState, ReleaseRequest, ReleaseResult,
    RenewRequest, RenewResult, Result,
};

use crate::config::{check_bucket, parse_url, NatsOptions};
use crate::error::map_nats;
use crate::feed::{Feed, Seen};
use crate::keys::{contender_key, lock_filter};
use crate::queue::{turn, Turn};

/// A dlock backend on a NATS JetStream key-value bucket. Cheap to clone: clones
/// share the connection.
#[derive(Clone)]
pub struct NatsBackend {
    pub(crate) client: Client,
    pub(crate) store: Store,
    pub(crate) options: NatsOptions,
    /// Per lease key of a grant this backend placed: the revision and context it
    /// last wrote (so a renewal is one write; a stale entry costs one read more)
    /// and when the grant's contender key was sent (renewals stop before the
    /// bucket's `max_age` can drop that key).
    pub(crate) written:
        std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, Written>>>,
}

/// What a backend remembers of a lease key of a grant it placed.
#[derive(Debug, Clone)]
pub(crate) struct Written {
    /// The revision it last wrote the key at (0: not written yet); `None` when
    /// that is not known (read the key).
    pub(crate) revision: Option<u64>,
    /// The context it last wrote.
    pub(crate) context: Bytes,
    /// When the grant's contender key was sent (`None`: placed by another
    /// backend, or before this one remembered it).
    pub(crate) placed: Option<Instant>,
}

impl std::fmt::Debug for NatsBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsBackend")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl NatsBackend {
    /// Connects as `url` says:
    /// `nats://[user:password@]host[:port][,host[:port]…][/bucket][?option=value&…]`,
    /// `tls://…` over TLS. Options: `token`, `timeout`, `connect_timeout`, `max_age`
    /// (see [`NatsOptions`]), `tls_ca`, `tls_cert`, `tls_key` (PEM files). The
    /// bucket (default `dlock`) is made if missing.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropped, it leaves no connection behind (a bucket it made
    /// stays, as it would have).
    pub async fn connect(url: &str) -> Result<Self> {
        let parsed = parse_url(url)?;
        let client = crate::connect::connect(&parsed.servers, &parsed.options).await?;
        Self::from_client(client, parsed.options).await
    }

    /// A backend on an application's own connection: its servers, credentials and
    /// TLS are used as they are; of `options`, the bucket, `timeout` and
    /// `max_age` apply.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`NatsBackend::connect`].
    pub async fn from_client(client: Client, options: NatsOptions) -> Result<Self> {
        check_bucket(&options.bucket)
            .map_err(|why| dlock_spi::Error::new(dlock_spi::ErrorKind::Config, why))?;
        let store = crate::connect::bucket(&client, &options).await?;
        Ok(NatsBackend {
            client,
            store,
            options,
            written: std::sync::Arc::default(),
        })
    }

    /// The key of the hold a release or renewal names.
    pub(crate) fn key_of(name: &LockName, mode: LockMode, holder: &dlock_spi::HolderKey) -> String {
        contender_key(name.as_str(), mode, holder.as_str())
    }

    /// The live contenders of `name` (or of the bucket, `filter` `>`), and a lower
    /// bound of the server's clock now — for display and counting only: the later
    /// of the newest write read and this machine's wall clock.
    async fn look(&self, filter: &str) -> Result<(Vec<(String, Seen)>, i128)> {
        let feed = Feed::open(&self.client, &self.store, filter).await?;
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i128::try_from(d.as_nanos()).unwrap_or(0));
        let now = feed.stamp.map_or(wall, |s| s.now_ns().max(wall));
        let mut live = Vec::with_capacity(feed.entries.len());
        for (key, mut seen) in feed.entries {
            let lease = self.lease_of(&seen.parts.name, &seen).await?;
            let Some(end) = lease.ends_ns.filter(|&end| end > now && !lease.going) else {
                continue;
            };
            // Shown as its lease stands: the end and the context of its latest
            // renewal.
            seen.written_ns = end - crate::keys::nanos(seen.stored.lease);
            if let Some(context) = lease.context {
                seen.stored.context = context;
            }
            live.push((key, seen));
        }
        Ok((live, now))
    }
}

#[async_trait]
impl LockRemoteResource for NatsBackend {
    fn backend_name(&self) -> &'static str {
        "nats"
    }

    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::default();
        caps.lease = true;
        caps.renew = true;
        caps.reentrant = true;
        caps.fair = true;
        caps.semaphore = true;
        caps.shared = true;
        caps.push_wakeup = true;
        caps.fencing = true;
        caps
    }

    /// # Cancel safety
    ///
    /// Cancel safe: dropped at any await, the contender's key is deleted (by a task
    /// of its own, after the create if that is in flight).
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<AcquireResult> {
        self.acquire(req).await
    }

    /// # Cancel safety
    ///
    /// Cancel safe: one delete naming the revision read, applied or not.
    async fn release(&self, req: &ReleaseRequest) -> Result<ReleaseResult> {
        let holder = req.holder();
        let key = Self::key_of(&req.name, req.mode, &holder);
        let entry = self
            .store
            .entry(key.as_str())
            .await
            .map_err(|e| map_nats(e, "read a hold"))?;
        if !entry.is_some_and(|e| e.operation == Operation::Put) {
            return Ok(ReleaseResult::NotOwner);
        }
        // The contender's key first: that frees the lock, and no reader ever sees
        // the hold without its lease. (Lease first, an observer read in between
        // found the holder living by its key's write, with the value it was taken
        // with instead of the one it last proclaimed: the kit's
        // observers_see_every_change_in_order, about 1 run in 3.) The lease key
        // then goes too; one left behind (this call dropped, or its delete failed)
        // belongs to no contender, so no reader looks at it, and the bucket's
        // max_age sweeps it.
        self.store
            .delete(&key)
            .await
            .map_err(|e| map_nats(e, "delete a hold"))?;
        let lease = crate::keys::lease_key(req.name.as_str(), holder.as_str());
        self.forget(&lease);
        if let Err(e) = self.store.delete(&lease).await {
            tracing::debug!(error = %e, "dlock-nats: a released hold's lease key was left to max_age");
        }
        Ok(ReleaseResult::Released)
    }

    /// # Cancel safety
    ///
    /// Cancel safe: one write naming the revision read, applied or not.
    async fn renew(&self, req: &RenewRequest) -> Result<RenewResult> {
        self.renewal(req).await
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockState>> {
        let (live, now) = self.look(&lock_filter(name.as_str())).await?;
        if live.is_empty() {
            return Ok(None);
        }
        let entries = live.iter().cloned().collect();
        let mut holders: Vec<(u64, HolderInfo)> = Vec::new();
        for (key, seen) in &live {
            if matches!(turn(&entries, key), Turn::Holds) {
                let mode = match seen.parts.side {
                    'w' => LockMode::Exclusive,
                    'r' => LockMode::Shared,
                    _ => LockMode::Permits(seen.stored.permits),
                };
                let left = (seen.expires_ns() - now).max(0);
                let left = Duration::from_nanos(u64::try_from(left).unwrap_or(0));
                holders.push((
                    seen.token(),
                    HolderInfo::from_stored(
                        &seen.parts.holder,
                        mode,
                        FencingToken::new(seen.token()),
                        seen.stored.context.clone(),
                        Some(left),
                    ),
                ));
            }
        }
        holders.sort_by_key(|(token, _)| *token);
        let waiters = live.len() - holders.len();
        Ok(Some(LockState::new(
            holders.into_iter().map(|(_, h)| h).collect(),
            Some(waiters),
        )))
    }

    fn admin(&self) -> Option<&dyn LockAdmin> {
        Some(self)
    }

    fn events(&self) -> Option<&dyn LockEvents> {
        None
    }

    fn batch_renew(&self) -> Option<&dyn BatchRenew> {
        None
    }
}

#[async_trait]
impl LockAdmin for NatsBackend {
    async fn force_release(&self, name: &LockName) -> Result<usize> {
        let feed = Feed::open(&self.client, &self.store, &lock_filter(name.as_str())).await?;
        let mut removed = 0;
        for (key, seen) in &feed.entries {
            // The lease first: its holder's next renewal finds it gone.
            let lease = crate::keys::lease_key(name.as_str(), &seen.parts.holder);
            for key in [&lease, key] {
                self.store
                    .delete(key)
                    .await
                    .map_err(|e| map_nats(e, "delete a hold"))?;
            }
            removed += 1;
        }
        Ok(removed)
    }

    async fn live_locks(&self, prefix: &str) -> Result<usize> {
        let (live, _) = self.look(">").await?;
        let mut names: Vec<&str> = live
            .iter()
            .map(|(_, seen)| seen.parts.name.as_str())
            .filter(|name| name.starts_with(prefix))
            .collect();
        names.sort_unstable();
        names.dedup();
        Ok(names.len())
    }
}

#[cfg(test)]
mod tests {
    use dlock_spi::{GrantId, HolderKey, OwnerId};

    use super::*;
    use crate::keys::lease_key;

    /// A holder whose lease key was deleted after its contender key was written is
    /// on its way out (a release deletes the contender key, then the lease key; a
    /// force-release the other way round): not shown as holding. A reader between
    /// the two deletions showed it with its first context — an observer saw the
    /// leader's value go back from "a2" to "a1" after the resignation (the kit's
    /// observers_see_every_change_in_order, now and then).
    #[tokio::test]
    async fn a_holder_whose_lease_was_deleted_after_its_key_is_not_shown() {
        if !dlock_tck::runner::selected("nats") {
            return;
        }
        let server =
            std::env::var("DLOCK_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned());
        let url = format!("{}/dlock_kit?max_age=10m", server.trim_end_matches('/'));
        let backend = NatsBackend::connect(&url).await.expect("connect");
        let name = LockName::new(format!("deleted-lease-{}", std::process::id())).expect("name");
        let (owner, grant) = (OwnerId::new("a"), GrantId::new(1));
        let lease = Duration::from_secs(30);
        let got = backend
            .try_acquire(
                &AcquireRequest::new(name.clone(), owner.clone(), grant)
                    .with_lease(lease)
                    .with_context(Bytes::from_static(b"a1")),
            )
            .await
            .expect("acquire");
        let token = got.token().expect("a free lock is granted");
        let renewed = backend
            .renew(
                &RenewRequest::new(
                    name.clone(),
                    owner.clone(),
                    grant,
                    LockMode::Exclusive,
                    lease,
                    token,
                )
                .with_context(Bytes::from_static(b"a2")),
            )
            .await
            .expect("renew");
        assert!(
            matches!(renewed, RenewResult::Renewed { .. }),
            "{renewed:?}"
        );
        let shown = backend
            .inspect(&name)
            .await
            .expect("inspect")
            .expect("held");
        assert_eq!(shown.holders[0].context, "a2");

        // Half a release: the lease key gone, the contender key still there.
        let holder = HolderKey::new(&owner, grant);
        backend
            .store
            .delete(lease_key(name.as_str(), holder.as_str()))
            .await
            .expect("delete the lease key");
        let shown = backend.inspect(&name).await.expect("inspect");
        assert!(shown.is_none(), "shown as held: {shown:?}");

        backend
            .release(&ReleaseRequest::new(
                name,
                owner,
                grant,
                LockMode::Exclusive,
                token,
            ))
            .await
            .expect("release");
    }
}
