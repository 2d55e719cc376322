//! A hold's life after its grant in the row mode: release, renewal, inspection
//! and force-release.

use std::time::{Duration, Instant};

use dlock_spi::{
    FencingToken, HoldPurpose, HolderInfo, LockMode, LockName, LockState, ReleaseRequest,
    ReleaseResult, RenewRequest, RenewResult, Result,
};
use sqlx::Row;

use crate::backend::{lease_ms, remaining, JdbcBackend, STORE_TICK};
use crate::dialect::Dialect;
use crate::param::Param;
use crate::permits;
use crate::pool::{on_pool, query};

/// Rows of `inspect` and `contention`: owner, token, context, remaining ms.
type HolderRow = (Option<String>, i64, Option<Vec<u8>>, i64);

/// What `inspect` reads: the lock row (holder, live waiters, ms left of the holder's own lease) and the
/// readers and permit holders (with their permits).
type InspectRows = (Option<(HolderRow, i64, Option<i64>)>, Vec<(HolderRow, i64)>);

impl JdbcBackend {
    pub(crate) async fn release_now(&self, req: &ReleaseRequest) -> Result<ReleaseResult> {
        let s = &self.inner.statements;
        let name = Param::Text(req.name.as_str());
        let holder = req.holder();
        let owner = Param::Text(holder.as_str());
        // MySQL's permit release finds the holder's entry by a search pattern.
        let pattern = match (self.dialect(), req.mode) {
            (Dialect::MySql, LockMode::Permits(_)) => permits::search_pattern(holder.as_str()),
            _ => String::new(),
        };
        // SQLite: the release notice to send once the release committed.
        let mut notice: Option<String> = None;
        let released: std::result::Result<bool, sqlx::Error> = match req.mode {
            LockMode::Exclusive | LockMode::Permits(_) => on_pool!(&self.inner.pool, p => {
                let stmt = match (req.mode, req.purpose) {
                    (LockMode::Exclusive, HoldPurpose::Leadership) => &s.exclusive.release_announced,
                    (LockMode::Exclusive, HoldPurpose::Lock) => &s.exclusive.release,
                    _ => &s.permits.release,
                };
                // A statement binds the parameters it uses.
                let params = [name, owner, Param::Text(&pattern)];
                match self.dialect() {
                    // The statement notifies waiters and returns a row when it released.
                    Dialect::Postgres => query!(stmt, &params).fetch_optional(p).await.map(|r| r.is_some()),
                    // A row when it released, with the notice to send (NULL: none).
                    // All rows are read: the statement commits as it ends, and an
                    // error there is the release's.
                    Dialect::Sqlite => query!(stmt, &params).fetch_all(p).await.map(|rows| match rows.first() {
                        Some(row) => {
                            notice = row.try_get::<Option<String>, _>(0).ok().flatten();
                            true
                        }
                        None => false,
                    }),
                    Dialect::MySql => query!(stmt, &params).execute(p).await.map(|r| r.rows_affected() == 1),
                }
            }),
            LockMode::Shared => on_pool!(&self.inner.pool, p => {
                async {
                    let mut tx = p.begin().await?;
                    query!(&s.shared.lock_row, &[name]).execute(&mut *tx).await?;
                    let removed = query!(&s.shared.release_reader, &[name, owner]).execute(&mut *tx).await?.rows_affected();
                    query!(&s.shared.purge_readers, &[name]).execute(&mut *tx).await?;
                    query!(&s.shared.recompute, &[name]).execute(&mut *tx).await?;
                    if let (true, Some(stmt)) = (removed == 1, &s.notices.release) {
                        if self.dialect() == Dialect::Sqlite {
                            // No bus (notices off, or none beside this file): nobody to tell.
                            if self.inner.bus.is_some() {
                                notice = query!(stmt, &[name]).fetch_one(&mut *tx).await?.try_get(0)?;
                            }
                        } else {
                            query!(stmt, &[name]).execute(&mut *tx).await?;
                        }
                    }
                    tx.commit().await?;
                    Ok(removed == 1)
                }
                .await
            }),
        };
        let released = released.map_err(self.err("release"))?;
        if let (Some(bus), Some(notice)) = (&self.inner.bus, notice) {
            bus.send(&notice);
        }
        Ok(if released {
            ReleaseResult::Released
        } else {
            ReleaseResult::NotOwner
        })
    }

    pub(crate) async fn renew_now(&self, req: &RenewRequest) -> Result<RenewResult> {
        let s = &self.inner.statements;
        let holder = req.holder();
        let context = Param::Bytes(req.context.as_deref().unwrap_or_default());
        let context_hex = permits::context_hex(req.context.as_deref().unwrap_or_default());
        let exclusive = [
            Param::Text(req.name.as_str()),
            Param::Text(holder.as_str()),
            Param::Int(lease_ms(req.lease)),
            Param::Int(lease_ms(req.lease.saturating_sub(req.transition))),
            context,
        ];
        let shared = [exclusive[0], exclusive[1], exclusive[2], context];
        let permit = [
            exclusive[0],
            exclusive[1],
            exclusive[2],
            Param::Text(&context_hex),
        ];
        // The context is bound only by the statements that store it.
        let (renew_exclusive, renew_reader, renew_permits) = match req.context {
            Some(_) => (
                &s.exclusive.renew_context,
                &s.shared.renew_reader_context,
                &s.permits.renew_context,
            ),
            None => (&s.exclusive.renew, &s.shared.renew_reader, &s.permits.renew),
        };
        let sent = Instant::now();
        let renewed: std::result::Result<bool, sqlx::Error> = match req.mode {
            LockMode::Exclusive => on_pool!(&self.inner.pool, p => {
                query!(renew_exclusive, &exclusive).execute(p).await.map(|r| r.rows_affected() == 1)
            }),
            LockMode::Permits(_) => on_pool!(&self.inner.pool, p => {
                query!(renew_permits, &permit).execute(p).await.map(|r| r.rows_affected() == 1)
            }),
            // A reader's row and the horizon, which rises with its lease.
            LockMode::Shared => on_pool!(&self.inner.pool, p => {
                async {
                    let mut tx = p.begin().await?;
                    query!(&s.shared.renew_row, &shared).execute(&mut *tx).await?;
                    let n = query!(renew_reader, &shared).execute(&mut *tx).await?.rows_affected();
                    if n == 1 {
                        tx.commit().await?;
                    } else {
                        tx.rollback().await?;
                    }
                    Ok(n == 1)
                }
                .await
            }),
        };
        let renewed = renewed.map_err(self.err("renew"))?;
        if let Some(bells) = &self.inner.bells {
            if renewed {
                bells.renewed(req.name.as_str(), holder.as_str(), sent + req.lease);
            } else if req.mode == LockMode::Exclusive {
                // The hold is lost: its bell wakes whoever waits.
                self.ring_bell(&req.name, holder.clone());
            }
        }
        if renewed && req.context.is_some() {
            // A proclaimed value: observers re-read.
            self.notify(s.notices.change.as_ref(), &req.name).await;
        }
        Ok(if renewed {
            RenewResult::renewed(Some(sent + req.lease))
        } else {
            RenewResult::NotOwner
        })
    }

    pub(crate) async fn inspect_now(&self, name: &LockName) -> Result<Option<LockState>> {
        let s = &self.inner.statements;
        let p_name = [Param::Text(name.as_str())];
        let rows: std::result::Result<InspectRows, sqlx::Error> = on_pool!(&self.inner.pool, p => {
            async {
                let lock = match query!(&s.admin.inspect_lock, &p_name).fetch_optional(p).await? {
                    Some(r) => Some(((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, r.try_get(3)?), r.try_get(4)?, r.try_get(5)?)),
                    None => None,
                };
                let mut readers = Vec::new();
                for r in query!(&s.admin.inspect_readers, &p_name).fetch_all(p).await? {
                    readers.push(((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, r.try_get(3)?), r.try_get(4)?));
                }
                for r in query!(&s.permits.inspect, &p_name).fetch_all(p).await? {
                    let context: Option<String> = r.try_get(2)?;
                    let context = context.as_deref().and_then(permits::context_bytes);
                    readers.push(((r.try_get(0)?, r.try_get(1)?, context, r.try_get(3)?), r.try_get(4)?));
                }
                Ok((lock, readers))
            }
            .await
        });
        let (lock, readers) = rows.map_err(self.err("inspect"))?;
        let mut holders = Vec::new();
        let mut waiters = 0;
        if let Some(((owner, token, context, left), queued, ttl_left)) = lock {
            waiters = usize::try_from(queued).unwrap_or(0);
            if let (Some(owner), Some(left)) = (owner, remaining(left)) {
                // The holder's own lease: zero once in its transition window; unknown
                // on a row granted before the column existed.
                let ttl = ttl_left.map(|ms| remaining(ms).unwrap_or(Duration::ZERO));
                holders.push(
                    holder(
                        owner,
                        LockMode::Exclusive,
                        token,
                        context,
                        left.saturating_sub(STORE_TICK),
                    )
                    .with_remaining_ttl(ttl),
                );
            }
        }
        for ((owner, token, context, left), permits) in readers {
            if let (Some(owner), Some(left)) = (owner, remaining(left)) {
                let mode = match u32::try_from(permits) {
                    Ok(0) | Err(_) => LockMode::Shared,
                    Ok(n) => LockMode::Permits(n),
                };
                holders.push(holder(
                    owner,
                    mode,
                    token,
                    context,
                    left.saturating_sub(STORE_TICK),
                ));
            }
        }
        if holders.is_empty() && waiters == 0 {
            return Ok(None);
        }
        Ok(Some(LockState::new(holders, Some(waiters))))
    }

    pub(crate) async fn force_release_now(&self, name: &LockName) -> Result<usize> {
        let s = &self.inner.statements;
        let p_name = [Param::Text(name.as_str())];
        let removed: std::result::Result<u64, sqlx::Error> = on_pool!(&self.inner.pool, p => {
            async {
                let mut tx = p.begin().await?;
                let x = query!(&s.admin.force_exclusive, &p_name).execute(&mut *tx).await?.rows_affected();
                let permit_holders: i64 = query!(&s.permits.count_holders, &p_name).fetch_one(&mut *tx).await?.try_get(0)?;
                query!(&s.admin.force_clear, &p_name).execute(&mut *tx).await?;
                let r = query!(&s.admin.force_readers, &p_name).execute(&mut *tx).await?.rows_affected();
                tx.commit().await?;
                Ok(x + r + u64::try_from(permit_holders).unwrap_or(0))
            }
            .await
        });
        let removed = removed.map_err(self.err("force_release"))?;
        self.notify(s.notices.release.as_ref(), name).await;
        Ok(usize::try_from(removed).unwrap_or(usize::MAX))
    }
}

fn holder(
    owner: String,
    mode: LockMode,
    token: i64,
    context: Option<Vec<u8>>,
    left: Duration,
) -> HolderInfo {
    HolderInfo::from_stored(
        &owner,
        mode,
        FencingToken::new(u64::try_from(token).unwrap_or(0)),
        context.unwrap_or_default().into(),
        Some(left),
    )
}
