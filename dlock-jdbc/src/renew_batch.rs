//! Renewing many exclusive holds in one statement ([`dlock_spi::BatchRenew`]).
//!
//! The manager's watchdog sends the renewals due together as one batch; here the
//! plain exclusive renewals among them (no context to store), grouped by lease, go
//! to the database as one `UPDATE` per [`RENEW_MANY_MAX`] holds, so holding many
//! locks costs one statement — one round trip, one commit — per renewal period
//! instead of one per lock. The rest (read and permit holds, proclaims) are renewed
//! one by one, at the same time. Session modes hold no lease and offer no batches.
//!
//! One statement answers only how many rows it renewed. All of them: each hold was
//! renewed, as its single renewal would have been. Fewer (a hold lost, or a hold
//! named twice): the statement's holds are renewed again one by one, which renews
//! each live one again and says which were lost — a second pass only when a hold
//! was lost.

use std::collections::BTreeMap;
use std::time::Instant;

use async_trait::async_trait;
use dlock_spi::{
    split_batch, BatchRenew, LockMode, LockRemoteResource, RenewRequest, RenewResult, Result,
};
use futures_util::future::join_all;

use crate::backend::{lease_ms, JdbcBackend};
use crate::error::retry_conflicts;
use crate::param::Param;
use crate::pool::{on_pool, query};
use crate::run_to_end::{detached, Where};
use crate::statements::RENEW_MANY_MAX;

/// Whether a request goes into a batch statement: a plain exclusive renewal.
fn batchable(req: &RenewRequest) -> bool {
    req.mode == LockMode::Exclusive && req.context.is_none()
}

#[async_trait]
impl BatchRenew for JdbcBackend {
    async fn renew_batch(&self, reqs: &[RenewRequest]) -> Vec<Result<RenewResult>> {
        let together = |batched: Vec<usize>| async move {
            // By lease and own lease (a statement sets one of each), in calls of at
            // most `RENEW_MANY_MAX` holds, all at once.
            let mut groups: BTreeMap<(i64, i64), Vec<usize>> = BTreeMap::new();
            for (at, &i) in batched.iter().enumerate() {
                let req = &reqs[i];
                let own = req.lease.saturating_sub(req.transition);
                groups
                    .entry((lease_ms(req.lease), lease_ms(own)))
                    .or_default()
                    .push(at);
            }
            let chunks: Vec<&[usize]> = groups
                .values()
                .flat_map(|group| group.chunks(RENEW_MANY_MAX))
                .collect();
            let indexes: Vec<Vec<usize>> = chunks
                .iter()
                .map(|chunk| chunk.iter().map(|&at| batched[at]).collect())
                .collect();
            let answers = join_all(indexes.iter().map(|chunk| self.renew_chunk(reqs, chunk))).await;
            let mut out: Vec<Option<Result<RenewResult>>> = batched.iter().map(|_| None).collect();
            for (chunk, answer) in chunks.iter().zip(answers) {
                for (&at, result) in chunk.iter().zip(answer) {
                    out[at] = Some(result);
                }
            }
            out.into_iter()
                .map(|answer| {
                    answer.unwrap_or_else(|| {
                        Err(dlock_spi::Error::backend(
                            "a renewal of the batch got no answer (a bug)",
                        ))
                    })
                })
                .collect()
        };
        split_batch(reqs, batchable, together, |req| self.renew(req)).await
    }
}

impl JdbcBackend {
    /// Renews the holds `chunk` (indexes into `reqs`, batchable, one lease, at most
    /// [`RENEW_MANY_MAX`]) in one statement; answers one result per hold, in order.
    async fn renew_chunk(
        &self,
        reqs: &[RenewRequest],
        chunk: &[usize],
    ) -> Vec<Result<RenewResult>> {
        let holds: std::sync::Arc<[(String, String)]> = chunk
            .iter()
            .map(|&i| {
                let req = &reqs[i];
                (
                    req.name.as_str().to_owned(),
                    req.holder().as_str().to_owned(),
                )
            })
            .collect();
        let Some(&first) = chunk.first() else {
            return Vec::new();
        };
        let lease = reqs[first].lease;
        let own = lease.saturating_sub(reqs[first].transition);
        let sent = Instant::now();
        let this = self.clone();
        let wanted = u64::try_from(holds.len()).unwrap_or(u64::MAX);
        let renewed = {
            let holds = std::sync::Arc::clone(&holds);
            detached(Where::Here, async move {
                retry_conflicts(|| this.renew_many(&holds, lease_ms(lease), lease_ms(own))).await
            })
            .await
        };
        match renewed {
            Ok(n) if n == wanted => {
                if let Some(bells) = &self.inner.bells {
                    for (name, holder) in holds.iter() {
                        bells.renewed(name, holder, sent + lease);
                    }
                }
                holds
                    .iter()
                    .map(|_| Ok(RenewResult::renewed(Some(sent + lease))))
                    .collect()
            }
            // A hold lost (or named twice): each on its own says which.
            Ok(_) => join_all(reqs.iter().map(|req| self.renew(req))).await,
            Err(err) => holds.iter().map(|_| Err(err.duplicate())).collect(),
        }
    }

    /// One statement renewing `holds` (name, owner) for `lease` ms, the holder's own
    /// lease `own` ms; answers how many rows it renewed.
    async fn renew_many(&self, holds: &[(String, String)], lease: i64, own: i64) -> Result<u64> {
        // The statement for the next power of two of holds, the last hold repeated
        // to fill it (a term that matches no other row): a few statements cached per
        // connection, not one per batch size.
        let Some(last) = holds.last() else {
            return Ok(0);
        };
        let size = holds.len().max(2).next_power_of_two();
        let index = size.trailing_zeros() as usize - 1;
        let stmt = self
            .inner
            .statements
            .exclusive
            .renew_many
            .get(index)
            .ok_or_else(|| {
                dlock_spi::Error::backend(
                    "a renewal batch larger than the statements made for it (a bug)",
                )
            })?;
        let mut params = Vec::with_capacity(2 + 2 * size);
        params.push(Param::Int(lease));
        params.push(Param::Int(own));
        for i in 0..size {
            let (name, owner) = holds.get(i).unwrap_or(last);
            params.push(Param::Text(name));
            params.push(Param::Text(owner));
        }
        let renewed: std::result::Result<u64, sqlx::Error> = on_pool!(&self.inner.pool, p => {
            query!(stmt, &params).execute(p).await.map(|r| r.rows_affected())
        });
        renewed.map_err(self.err("renew"))
    }
}
