//! Renewing many exclusive holds in one script call ([`dlock_spi::BatchRenew`]): the
//! script, its keys and arguments, and its reply, together.
//!
//! The manager's watchdog sends the renewals due together as one batch; here the
//! plain exclusive renewals among them (no context to store) go to the server as one
//! `EVALSHA`, so holding many locks on one node costs one call per renewal period.
//! The rest — shared and permit holds, proclaims — are renewed one by one, at the
//! same time. Behind Sentinel one `WAIT` covers the whole batch. Redis Cluster keeps
//! every lock's keys in its own slot: there the calls go one per node
//! ([`crate::cluster_batch`]).

use std::time::Instant;

use async_trait::async_trait;
use dlock_spi::{
    split_batch, BatchRenew, Error, LockMode, LockRemoteResource, RenewRequest, RenewResult, Result,
};
use futures_util::future::join_all;

use crate::backend::{Conn, RedisBackend};
use crate::cluster_batch::ELSEWHERE;
use crate::keys::{OwnerPart, ScriptCall, EXCLUSIVE, READERS};
use crate::scripts::MAX_PER_CALL;

/// What the batch script answered for one hold.
const NOT_OWNER: i64 = 0;
const RENEWED: i64 = 1;
const READERS_BESIDE: i64 = 2;

/// Whether a request goes into the batch script: a plain exclusive renewal.
fn batchable(req: &RenewRequest) -> bool {
    req.mode == LockMode::Exclusive && req.context.is_none()
}

#[async_trait]
impl BatchRenew for RedisBackend {
    async fn renew_batch(&self, reqs: &[RenewRequest]) -> Vec<Result<RenewResult>> {
        let together = |batched: Vec<usize>| self.renew_folded(reqs, batched);
        split_batch(reqs, batchable, together, |req| self.renew(req)).await
    }
}

/// What the batch script's code for one hold leaves to do.
enum Step {
    /// Answered.
    Done(Result<RenewResult>),
    /// Renewed by the script: once the replicas have it.
    Renewed,
    /// Readers beside the writer, or a Cluster node that does not serve the hold:
    /// its own renewal, horizon and all.
    Alone,
}

impl RedisBackend {
    /// The plain exclusive renewals `batched` (indexes into `reqs`) through the batch
    /// script: one answer each, in order.
    async fn renew_folded(
        &self,
        reqs: &[RenewRequest],
        batched: Vec<usize>,
    ) -> Vec<Result<RenewResult>> {
        let sent = Instant::now();
        let epoch = self.epoch();
        let codes = match &self.inner.conn {
            Conn::Cluster(conn) => self.cluster_codes(conn, reqs, &batched).await,
            Conn::Single(_) | Conn::Sentinel(_) => self.node_codes(reqs, &batched).await,
        };
        let steps: Vec<Step> = codes
            .into_iter()
            .map(|code| match code {
                Ok(NOT_OWNER) => Step::Done(Ok(RenewResult::NotOwner)),
                Ok(RENEWED) => Step::Renewed,
                Ok(READERS_BESIDE | ELSEWHERE) => Step::Alone,
                Ok(other) => Step::Done(Err(Error::backend(format!(
                    "the batch renewal script answered {other} for a hold; is another script loaded under its SHA?"
                )))),
                Err(err) => Step::Done(Err(err)),
            })
            .collect();
        // Renewals the replicas did not take would be undone by a failover: none of
        // the script's counts then (the single renewals wait for their own).
        let acknowledged = if steps.iter().any(|s| matches!(s, Step::Renewed)) {
            self.check_renewals_acknowledged(epoch).await
        } else {
            Ok(())
        };
        join_all(steps.into_iter().zip(batched).map(|(step, i)| {
            let acknowledged = &acknowledged;
            async move {
                match step {
                    Step::Done(answer) => answer,
                    Step::Renewed => match acknowledged {
                        Ok(()) => Ok(RenewResult::renewed(Some(sent + reqs[i].lease))),
                        Err(err) => Err(err.duplicate()),
                    },
                    Step::Alone => self.renew(&reqs[i]).await,
                }
            }
        }))
        .await
    }

    /// The batch script's answer for each of `batched` (indexes into `reqs`) on one
    /// node: calls of at most [`MAX_PER_CALL`] holds, sent at once (pipelined).
    async fn node_codes(&self, reqs: &[RenewRequest], batched: &[usize]) -> Vec<Result<i64>> {
        let chunks: Vec<&[usize]> = batched.chunks(MAX_PER_CALL).collect();
        let calls: Vec<ScriptCall<'_>> = chunks
            .iter()
            .map(|chunk| self.batch_call(chunk.iter().map(|&i| &reqs[i])))
            .collect();
        let answers = join_all(calls.iter().map(|call| {
            self.count_renewal_call();
            self.invoke_script::<Vec<i64>>(call, "renew")
        }))
        .await;
        let mut codes = Vec::with_capacity(batched.len());
        for (chunk, answer) in chunks.iter().zip(answers) {
            match answer {
                Ok(answered) if answered.len() == chunk.len() => {
                    codes.extend(answered.into_iter().map(Ok))
                }
                Ok(answered) => {
                    let err = Error::backend(format!(
                        "the batch renewal script answered {} results for {} holds; is another script loaded under its SHA?",
                        answered.len(),
                        chunk.len()
                    ));
                    codes.extend(chunk.iter().map(|_| Err(err.duplicate())));
                }
                Err(err) => codes.extend(chunk.iter().map(|_| Err(err.duplicate()))),
            }
        }
        codes
    }

    /// The batch script's call for `reqs` (all batchable).
    fn batch_call<'s, 'r>(
        &'s self,
        reqs: impl ExactSizeIterator<Item = &'r RenewRequest> + Clone,
    ) -> ScriptCall<'s> {
        let script = &self.scripts().renew_batch;
        let n = reqs.len();
        let mut cmd = redis::Cmd::with_capacity(3 + 4 * n, 64 * n);
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(2 * n);
        let keys: Vec<_> = reqs.clone().map(|r| self.keys(&r.name)).collect();
        for k in &keys {
            cmd.arg(k.key(EXCLUSIVE)).arg(k.key(READERS));
        }
        for r in reqs {
            cmd.arg(OwnerPart(r.holder().as_str()))
                .arg(crate::keys::ms(r.lease));
        }
        ScriptCall { script, cmd }
    }
}
