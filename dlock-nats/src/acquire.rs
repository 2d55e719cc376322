//! The acquire algorithm: a contender's key placed under the lock, then its turn
//! awaited on the lock's feed — the contenders ahead that conflict released,
//! deleted by others, or run out of lease (then claimed and deleted by this one).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use async_nats::jetstream::kv::{CreateErrorKind, Operation, Store};
use dlock_spi::{AcquireRequest, AcquireResult, Error, FencingToken, HolderKey, Result};

use crate::backend::NatsBackend;
use crate::error::map_nats;
use crate::feed::{Feed, Seen};
use crate::keys::{contender_key, lease_key, lock_filter, Stored};
use crate::lease::{Lease, Refreshed};
use crate::queue::{turn, Turn};

/// How often a waiter whose key vanished (force-released, its lease claimed after
/// a pause) queues again within one acquire before it gives up.
const MAX_PLACEMENTS: u32 = 16;

/// Deletes a contender's key (and its lease key) on drop unless disarmed: the key of
/// an acquire that is cancelled, fails or gives up goes with it — after its create,
/// if that is still in flight (one connection: the server applies them in order).
struct Placed {
    store: Option<Store>,
    keys: [String; 2],
}

impl Placed {
    fn disarm(mut self) {
        self.store = None;
    }

    /// Deletes the keys now and disarms.
    async fn remove(mut self) -> Result<()> {
        if let Some(store) = self.store.take() {
            for key in &self.keys {
                store
                    .delete(key)
                    .await
                    .map_err(|e| map_nats(e, "delete a contender's key"))?;
            }
        }
        Ok(())
    }
}

impl Drop for Placed {
    fn drop(&mut self) {
        if let Some(store) = self.store.take() {
            let keys = std::mem::take(&mut self.keys);
            let what = format!("the NATS key {} of an abandoned acquire", keys[0]);
            dlock_spi::spawn_cleanup(&what, None, async move {
                for key in &keys {
                    let _ = store.delete(key).await;
                }
            });
        }
    }
}

impl NatsBackend {
    /// [`LockRemoteResource::try_acquire`](dlock_spi::LockRemoteResource::try_acquire).
    pub(crate) async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireResult> {
        crate::config::check_lease(req.lease, self.options.max_age)?;
        let holder = HolderKey::new(&req.owner, req.grant);
        let name = req.name.as_str();
        let key = contender_key(name, req.mode, holder.as_str());
        let stored = Stored {
            lease: req.lease,
            token: 0,
            permits: req.mode.permits().unwrap_or(0),
            total: req.capacity,
            context: req.context.clone(),
        };
        for placement in 0..MAX_PLACEMENTS {
            let lkey = lease_key(name, holder.as_str());
            if placement > 0 {
                // The earlier placement's lease was claimed (a tombstone): this
                // grant queues again with a lease of its own.
                self.forget(&lkey);
                let _ = self.store.delete(&lkey).await;
            }
            let sent = Instant::now();
            let placed = Placed {
                store: Some(self.store.clone()),
                keys: [key.clone(), lease_key(name, holder.as_str())],
            };
            let token = match self.store.create(&key, stored.encode()).await {
                Ok(revision) => {
                    // No lease key yet: the first renewal makes it, in one write.
                    self.placed(&lkey, sent, req.context.clone());
                    revision
                }
                Err(e) if e.kind() == CreateErrorKind::AlreadyExists => {
                    // A retry of this grant: its key is there, with its token.
                    match self.store.entry(key.as_str()).await {
                        Ok(Some(entry)) if entry.operation == Operation::Put => entry.revision,
                        Ok(_) => continue,
                        Err(e) => return Err(map_nats(e, "read a contender's key")),
                    }
                }
                Err(e) => return Err(map_nats(e, "create a contender's key")),
            };
            match self
                .wait_turn(req, holder.as_str(), &key, token, sent)
                .await?
            {
                Some(result) => {
                    if result.is_acquired() {
                        placed.disarm();
                    } else {
                        placed.remove().await?;
                    }
                    return Ok(result);
                }
                None => drop(placed.remove().await),
            }
        }
        Ok(AcquireResult::not_acquired(None, None))
    }

    /// Waits for the turn of the contender at `key` (token `token`, its lease
    /// started no earlier than `renewed`) until the request's deadline. `None`: the
    /// key vanished (place it again). The caller removes the key unless granted.
    async fn wait_turn(
        &self,
        req: &AcquireRequest,
        holder: &str,
        key: &str,
        token: u64,
        mut renewed: Instant,
    ) -> Result<Option<AcquireResult>> {
        let name = req.name.as_str();
        let mut feed = Feed::open(&self.client, &self.store, &lock_filter(name)).await?;
        let refresh_every = req.lease / 3;
        // The leases of the contenders waited for, as last read: when each ends on
        // this process's clock (at the earliest).
        let mut ends: HashMap<String, Instant> = HashMap::new();
        loop {
            let blockers = match turn(&feed.entries, key) {
                Turn::Gone => return Ok(None),
                Turn::TotalDiffers(total) => {
                    return Err(Error::semaphore_total_differs(total, req.capacity));
                }
                Turn::Holds => {
                    // A grant rests on a lease renewed now: one that ran out (this
                    // process paused while it waited) may have been claimed by a
                    // waiter, which then finds the lease renewed or this finds it
                    // claimed.
                    match self.refresh(name, holder, key, req.lease, None).await? {
                        Refreshed::Renewed { sent } => renewed = sent,
                        Refreshed::NotOwner => return Ok(None),
                    }
                    let lease_until = Some(renewed + req.lease);
                    return Ok(Some(AcquireResult::acquired(
                        FencingToken::new(token),
                        lease_until,
                    )));
                }
                Turn::Waits { blockers } => blockers,
            };
            let now = Instant::now();
            let deadline = match req.deadline {
                Some(deadline) if deadline > now => deadline,
                _ => {
                    let holder = blockers
                        .first()
                        .and_then(|k| feed.entries.get(k))
                        .map(|e| HolderKey::parse(&e.parts.holder).0);
                    let retry = blockers
                        .first()
                        .and_then(|k| ends.get(k))
                        .map(|at| at.saturating_duration_since(now));
                    return Ok(Some(AcquireResult::not_acquired(holder, retry)));
                }
            };
            ends.retain(|k, _| feed.entries.contains_key(k));
            let unknown = blockers.iter().any(|k| !ends.contains_key(k));
            let soonest = blockers.iter().filter_map(|k| ends.get(k)).min().copied();
            if unknown || soonest.is_some_and(|at| at <= now) {
                let waited: Vec<(String, Seen)> = blockers
                    .iter()
                    .filter_map(|k| feed.entries.get(k).map(|e| (k.clone(), e.clone())))
                    .collect();
                // A claimed contender's deletion comes through the feed.
                self.judge(name, waited, &mut ends).await?;
            }
            let soonest = blockers.iter().filter_map(|k| ends.get(k)).min().copied();
            let refresh_at = renewed + refresh_every;
            let wake = soonest
                .map_or(deadline, |at| at.min(deadline))
                .min(refresh_at);
            tokio::select! {
                next = feed.next() => {
                    next?;
                }
                () = tokio::time::sleep_until(wake.into()) => {
                    if Instant::now() >= refresh_at {
                        match self.refresh(name, holder, key, req.lease, None).await? {
                            Refreshed::Renewed { sent } => renewed = sent,
                            Refreshed::NotOwner => return Ok(None),
                        }
                    }
                }
            }
        }
    }

    /// Reads the leases of the contenders `waited` for and claims those run out on
    /// the server's clock (their deletions come through the feed); notes in `ends`
    /// when the others end.
    async fn judge(
        &self,
        name: &str,
        waited: Vec<(String, Seen)>,
        ends: &mut HashMap<String, Instant>,
    ) -> Result<()> {
        let mut leases: Vec<(String, Seen, Lease)> = Vec::with_capacity(waited.len());
        for (key, seen) in waited {
            let lease = self.lease_of(name, &seen).await?;
            leases.push((key, seen, lease));
        }
        // Read after the leases: a lower bound of the server's clock now.
        let (server_ns, read_at) = self.server_now().await?;
        for (key, seen, lease) in leases {
            match lease.ends_ns {
                Some(end) if end > server_ns => {
                    let left = u64::try_from(end - server_ns).unwrap_or(u64::MAX);
                    ends.insert(key, read_at + Duration::from_nanos(left));
                }
                _ => {
                    if self.claim(name, &seen, &key, lease).await? {
                        // Gone once the feed shows its deletion; not judged again.
                        ends.insert(key, read_at + Duration::from_secs(3600));
                    } else {
                        // Renewed meanwhile: judged again at once.
                        ends.insert(key, read_at);
                    }
                }
            }
        }
        Ok(())
    }
}
