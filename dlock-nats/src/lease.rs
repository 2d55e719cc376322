//! Leases, judged on the server's clock: each contender's lease lives under its
//! own key ([`lease_key`]), rewritten by every renewal; a contender with none yet
//! lives by its contender key's write. A contender is taken out only by whoever
//! *claims* its lease first — deleting the lease key naming the revision judged
//! (or, with none, making it as a tombstone) — so a renewal racing the judgement
//! either lands first (the claim fails) or finds its lease claimed (not owner).

use std::time::{Duration, Instant};

use async_nats::jetstream::kv::{Operation, UpdateErrorKind};
use bytes::Bytes;
use dlock_spi::{RenewRequest, RenewResult, Result};

use crate::backend::{NatsBackend, Written};
use crate::error::map_nats;
use crate::feed::Seen;
use crate::keys::{lease_key, nanos, Stored};

/// The key whose write timestamps tell the server's clock (a token `=` alone: no
/// lock's filter reaches it).
const CLOCK_KEY: &str = "=.=clock";

/// What a claimed lease key holds.
const TOMBSTONE: &[u8] = b"claimed";

/// A contender's lease as last written.
#[derive(Debug, Clone)]
pub(crate) struct Lease {
    /// When it ends on the server's clock (ns since the epoch); `None` once claimed.
    pub(crate) ends_ns: Option<i128>,
    /// The lease key's revision (its value's or its delete marker's; 0: none).
    revision: u64,
    /// The context its latest renewal stored, if any.
    pub(crate) context: Option<Bytes>,
    /// Deleted after the contender's key was written: the hold is being given back
    /// (a release deletes the contender's key, then this one; a force-release this
    /// one first). Waiters still judge it by its key's write (its key's deletion
    /// comes through their feed); a reader showing holders leaves it out.
    pub(crate) going: bool,
}

/// How a renewal went.
pub(crate) enum Refreshed {
    /// Renewed from `sent` (the renewal's send time).
    Renewed { sent: Instant },
    /// The lease was claimed, or the contender's key is gone.
    NotOwner,
}

impl NatsBackend {
    /// The lease of contender `seen` of lock `name`.
    pub(crate) async fn lease_of(&self, name: &str, seen: &Seen) -> Result<Lease> {
        let key = lease_key(name, &seen.parts.holder);
        let entry = self
            .store
            .entry(key.as_str())
            .await
            .map_err(|e| map_nats(e, "read a lease"))?;
        Ok(match entry {
            Some(e) if e.operation == Operation::Put && e.value.as_ref() == TOMBSTONE => Lease {
                ends_ns: None,
                revision: e.revision,
                context: None,
                going: false,
            },
            Some(e) if e.operation == Operation::Put => {
                let stored = Stored::decode(&e.value);
                let lease = stored.as_ref().map_or(seen.stored.lease, |s| s.lease);
                Lease {
                    ends_ns: Some(e.created.unix_timestamp_nanos() + nanos(lease)),
                    revision: e.revision,
                    context: stored.map(|s| s.context),
                    going: false,
                }
            }
            // No lease written since the contender's key was (a delete marker is
            // what a cancelled placement of the same grant left): it lives by its
            // key's write.
            Some(e) => Lease {
                ends_ns: Some(seen.expires_ns()),
                revision: e.revision,
                context: None,
                going: e.revision > seen.revision,
            },
            None => Lease {
                ends_ns: Some(seen.expires_ns()),
                revision: 0,
                context: None,
                going: false,
            },
        })
    }

    /// Claims the lease `lease` of contender `seen` (judged run out) and deletes its
    /// key; false if it was renewed meanwhile.
    pub(crate) async fn claim(
        &self,
        name: &str,
        seen: &Seen,
        key: &str,
        lease: Lease,
    ) -> Result<bool> {
        let lkey = lease_key(name, &seen.parts.holder);
        // A claim leaves a tombstone (never a delete marker, which a renewal may
        // write over), over exactly the revision judged.
        let claimed = match lease.ends_ns {
            None => Ok(()),
            Some(_) => self
                .store
                .update(&lkey, Bytes::from_static(TOMBSTONE), lease.revision)
                .await
                .map(drop),
        };
        match claimed {
            Ok(()) => {}
            Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => return Ok(false),
            Err(e) => return Err(map_nats(e, "claim a run-out lease")),
        }
        self.store
            .delete(key)
            .await
            .map_err(|e| map_nats(e, "delete a run-out contender"))?;
        Ok(true)
    }

    /// [`LockRemoteResource::renew`](dlock_spi::LockRemoteResource::renew): the
    /// hold's lease renewed ([`Self::refresh`]).
    pub(crate) async fn renewal(&self, req: &RenewRequest) -> Result<RenewResult> {
        crate::config::check_lease(req.lease, self.options.max_age)?;
        let holder = req.holder();
        let key = Self::key_of(&req.name, req.mode, &holder);
        let refreshed = self
            .refresh(
                req.name.as_str(),
                holder.as_str(),
                &key,
                req.lease,
                req.context.as_ref(),
            )
            .await?;
        Ok(match refreshed {
            Refreshed::Renewed { sent } => RenewResult::renewed(Some(sent + req.lease)),
            Refreshed::NotOwner => RenewResult::NotOwner,
        })
    }

    /// Renews the lease of grant `holder` of lock `name` (contender key `key`) for
    /// `lease`, with `context` if given. One write when this backend wrote the
    /// lease key last (its revision remembered); otherwise the key is read first.
    /// A lease claimed (deleted) by a waiter, or removed by a force-release, answers
    /// `NotOwner` — and so does a renewal that would carry the hold past half the
    /// bucket's `max_age` from its contender key's write ([`Self::outlives_key`]).
    pub(crate) async fn refresh(
        &self,
        name: &str,
        holder: &str,
        key: &str,
        lease: Duration,
        context: Option<&Bytes>,
    ) -> Result<Refreshed> {
        let lkey = lease_key(name, holder);
        let known = self.remembered(&lkey);
        if self.outlives_key(known.as_ref(), &lkey, key, lease).await? {
            return Ok(Refreshed::NotOwner);
        }
        if let Some(Written {
            revision: Some(revision),
            context: previous,
            ..
        }) = known
        {
            let context = context.cloned().unwrap_or(previous);
            match self.write_lease(&lkey, lease, context, revision).await? {
                Some(sent) => return Ok(Refreshed::Renewed { sent }),
                // Not the revision remembered (an earlier write's answer lost, or
                // claimed): read it.
                None => self.unknown_revision(&lkey),
            }
        }
        let entry = self
            .store
            .entry(lkey.as_str())
            .await
            .map_err(|e| map_nats(e, "read a lease"))?;
        let marker = entry.as_ref().map_or(0, |e| e.revision);
        let (previous, revision) = match &entry {
            Some(e) if e.operation == Operation::Put && e.value.as_ref() == TOMBSTONE => {
                return Ok(Refreshed::NotOwner);
            }
            Some(e) if e.operation == Operation::Put => (Stored::decode(&e.value), e.revision),
            _ => {
                // No lease written yet: the contender's key must still be there.
                let Some(context) = self.contender_context(key).await? else {
                    return Ok(Refreshed::NotOwner);
                };
                (
                    Some(Stored {
                        lease,
                        token: 0,
                        permits: 0,
                        total: 0,
                        context,
                    }),
                    marker,
                )
            }
        };
        let context = match (context, previous) {
            (Some(c), _) => c.clone(),
            (None, Some(p)) => p.context,
            (None, None) => Bytes::new(),
        };
        Ok(
            match self.write_lease(&lkey, lease, context, revision).await? {
                Some(sent) => Refreshed::Renewed { sent },
                None => Refreshed::NotOwner,
            },
        )
    }

    /// Writes lease key `lkey` over revision `revision` (0: it must not exist);
    /// the send time, or `None` if the key is not at that revision.
    async fn write_lease(
        &self,
        lkey: &str,
        lease: Duration,
        context: Bytes,
        revision: u64,
    ) -> Result<Option<Instant>> {
        let value = Stored {
            lease,
            token: 0,
            permits: 0,
            total: 0,
            context: context.clone(),
        };
        let sent = Instant::now();
        match self.store.update(lkey, value.encode(), revision).await {
            Ok(written) => {
                self.remember(lkey, written, context);
                Ok(Some(sent))
            }
            Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => Ok(None),
            Err(e) => Err(map_nats(e, "renew a lease")),
        }
    }

    /// Whether renewing for `lease` now would carry a hold past half the bucket's
    /// `max_age` from its contender key's write. The bucket drops a key that old
    /// (the contender key is written once, however often the lease is renewed),
    /// and a lock whose holder's key is gone looks free: so the hold must end
    /// first, and a renewal that would keep it past then answers not owner (the
    /// holder is told it lost the lock while its last lease still runs). Half, as
    /// leases are (`check_lease`): room for clock-rate drift and a late sweep.
    /// Judged on this process's clock from the key's send time when this backend
    /// placed the grant; otherwise on the server's, from the key's write time
    /// (three round trips more, a rare path: the key's age then found is
    /// remembered for lease key `lkey` as a placement on this clock, so the next
    /// renewal through this backend is judged here).
    async fn outlives_key(
        &self,
        known: Option<&Written>,
        lkey: &str,
        key: &str,
        lease: Duration,
    ) -> Result<bool> {
        let limit = self.options.max_age / 2;
        if let Some(placed) = known.and_then(|w| w.placed) {
            return Ok(placed.elapsed() + lease > limit);
        }
        let entry = self
            .store
            .entry(key)
            .await
            .map_err(|e| map_nats(e, "read a hold"))?;
        let Some(written_ns) = entry
            .filter(|e| e.operation == Operation::Put)
            .map(|e| e.created.unix_timestamp_nanos())
        else {
            // Gone: the renewal answers not owner on its own.
            return Ok(false);
        };
        let (now_ns, read_at) = self.server_now().await?;
        let age = u64::try_from(now_ns - written_ns).map_or(Duration::ZERO, Duration::from_nanos);
        if let Some(placed) = read_at.checked_sub(age) {
            self.edit(lkey, |w| w.placed = Some(placed));
        }
        Ok(age + lease > limit)
    }

    /// What this backend remembers of lease key `lkey`.
    fn remembered(&self, lkey: &str) -> Option<Written> {
        self.written.lock().ok()?.get(lkey).cloned()
    }

    /// Remembers a grant placed with contender key sent at `sent`: its lease key
    /// `lkey` not written yet, the context `context`.
    pub(crate) fn placed(&self, lkey: &str, sent: Instant, context: Bytes) {
        if let Ok(mut map) = self.written.lock() {
            map.insert(
                lkey.to_owned(),
                Written {
                    revision: Some(0),
                    context,
                    placed: Some(sent),
                },
            );
        }
    }

    /// Remembers that lease key `lkey` is at `revision` with `context` (when the
    /// grant was placed is kept).
    fn remember(&self, lkey: &str, revision: u64, context: Bytes) {
        self.edit(lkey, |w| {
            w.revision = Some(revision);
            w.context = context;
        });
    }

    /// Applies `change` to what is remembered of lease key `lkey` (nothing known
    /// before: an entry with nothing known).
    fn edit(&self, lkey: &str, change: impl FnOnce(&mut Written)) {
        if let Ok(mut map) = self.written.lock() {
            change(map.entry(lkey.to_owned()).or_insert(Written {
                revision: None,
                context: Bytes::new(),
                placed: None,
            }));
        }
    }

    /// Marks the revision of lease key `lkey` unknown (an answer lost, or claimed;
    /// when the grant was placed is kept).
    fn unknown_revision(&self, lkey: &str) {
        if let Ok(mut map) = self.written.lock() {
            if let Some(entry) = map.get_mut(lkey) {
                entry.revision = None;
            }
        }
    }

    /// Forgets lease key `lkey` (released, or not at the revision remembered).
    pub(crate) fn forget(&self, lkey: &str) {
        if let Ok(mut map) = self.written.lock() {
            map.remove(lkey);
        }
    }

    /// The context stored with contender key `key`; `None` if the key is gone.
    async fn contender_context(&self, key: &str) -> Result<Option<Bytes>> {
        let entry = self
            .store
            .entry(key)
            .await
            .map_err(|e| map_nats(e, "read a hold"))?;
        Ok(entry.filter(|e| e.operation == Operation::Put).map(|e| {
            Stored::decode(&e.value)
                .map(|s| s.context)
                .unwrap_or_default()
        }))
    }

    /// A lower bound of the server's clock now: the timestamp of the bucket's
    /// clock key, written and read back (one key for every lock and backend: any
    /// write's timestamp read after this write is no later than the server's now).
    pub(crate) async fn server_now(&self) -> Result<(i128, Instant)> {
        self.store
            .put(CLOCK_KEY, Bytes::new())
            .await
            .map_err(|e| map_nats(e, "write the clock key"))?;
        let entry = self
            .store
            .entry(CLOCK_KEY)
            .await
            .map_err(|e| map_nats(e, "read the clock key"))?;
        let read_at = Instant::now();
        let stamp = entry.map_or(0, |e| e.created.unix_timestamp_nanos());
        Ok((stamp, read_at))
    }
}
