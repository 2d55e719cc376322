//! Renewing many holds in few requests ([`dlock_spi::BatchRenew`]).
//!
//! A single renewal reads its key (is it still this hold's?) and refreshes the
//! key's lease on the shared keep-alive stream. A batch reads the keys of up to
//! [`MAX_PER_TXN`] holds in one transaction — one request instead of one each — and
//! then refreshes their leases at once, back to back on the one stream. A hold whose
//! renewal needs more (a context to store, a lease of another length to move to) is
//! renewed on its own, at the same time.

use std::time::Instant;

use async_trait::async_trait;
use dlock_spi::{split_batch, BatchRenew, LockRemoteResource, RenewRequest, RenewResult, Result};
use etcd_client::{Txn, TxnOp, TxnOpResponse};
use futures_util::future::join_all;

use crate::backend::{ttl_secs, EtcdBackend};
use crate::resend::Repeat;

/// The most reads one transaction carries: etcd's default `--max-txn-ops`.
const MAX_PER_TXN: usize = 128;

#[async_trait]
impl BatchRenew for EtcdBackend {
    async fn renew_batch(&self, reqs: &[RenewRequest]) -> Vec<Result<RenewResult>> {
        // Transactions of at most `MAX_PER_TXN` reads, all at once; each answers
        // one result per hold, so their answers, joined, are in `batched`'s order.
        let together = |batched: Vec<usize>| async move {
            let chunks = batched.chunks(MAX_PER_TXN);
            let answers = join_all(chunks.map(|chunk| self.renew_chunk(reqs, chunk))).await;
            answers.into_iter().flatten().collect()
        };
        split_batch(
            reqs,
            |req| req.context.is_none(),
            together,
            |req| self.renew(req),
        )
        .await
    }
}

impl EtcdBackend {
    /// Renews the holds `chunk` (indexes into `reqs`, no context, at most
    /// [`MAX_PER_TXN`]): their keys read in one transaction, their leases refreshed
    /// at once; one result per hold, in order.
    async fn renew_chunk(
        &self,
        reqs: &[RenewRequest],
        chunk: &[usize],
    ) -> Vec<Result<RenewResult>> {
        let keys: Vec<Vec<u8>> = chunk
            .iter()
            .map(|&i| {
                let req = &reqs[i];
                self.inner
                    .keys
                    .contender(&req.name, req.mode, &req.holder())
            })
            .collect();
        let reads = Txn::new().and_then(
            keys.iter()
                .map(|key| TxnOp::get(key.clone(), None))
                .collect::<Vec<_>>(),
        );
        let answer = match self.txn("renew", Repeat::Safe, &reads).await {
            Ok(answer) => answer,
            Err(err) => return chunk.iter().map(|_| Err(err.duplicate())).collect(),
        };
        // Each hold's lease, when its key is still the hold's own.
        let leases: Vec<Option<i64>> = chunk
            .iter()
            .enumerate()
            .map(|(at, &i)| match answer.op_responses().get(at) {
                Some(TxnOpResponse::Get(read)) => read
                    .kvs()
                    .first()
                    .filter(|kv| {
                        u64::try_from(kv.create_revision()).ok() == Some(reqs[i].token.get())
                    })
                    .map(|kv| kv.lease()),
                _ => None,
            })
            .collect();
        let sent = Instant::now();
        let refreshed = join_all(leases.iter().map(|lease| async move {
            match lease {
                Some(lease) => Some(self.inner.keep_alives.refresh(*lease).await),
                None => None,
            }
        }))
        .await;
        // A lease of another length than asked: the single renewal moves the key.
        let moved = join_all(
            chunk
                .iter()
                .zip(&refreshed)
                .map(|(&i, refreshed)| async move {
                    let req = &reqs[i];
                    let wanted = ttl_secs(req.lease).max(self.inner.min_ttl);
                    match refreshed {
                        // The key is gone or another hold's.
                        None => Ok(RenewResult::NotOwner),
                        Some(Err(err)) => Err(err.duplicate()),
                        Some(Ok(ttl)) if *ttl <= 0 => Ok(RenewResult::NotOwner),
                        Some(Ok(ttl)) if *ttl == wanted => {
                            Ok(RenewResult::renewed(Some(sent + req.lease)))
                        }
                        Some(Ok(_)) => self.renew(req).await,
                    }
                }),
        );
        moved.await
    }
}
