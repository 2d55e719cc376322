//! Renewing many exclusive holds in one script call ([`dlock_spi::BatchRenew`]): the
//! script, its keys and arguments, and its reply, together.
//!
//! The manager's watchdog sends the renewals due together as one batch; here the
//! plain exclusive renewals among them (no context to store) go to the server as one
//! `EVALSHA`, so holding many locks on one node costs one call per renewal period.
//! The rest — shared and permit holds, proclaims — are renewed one by one, at the
//! same time. Behind Sentinel one `WAIT` covers the whole batch. Redis Cluster keeps
//! every lock's keys in its own slot, so there the backend offers no batches.

use std::time::Instant;

use async_trait::async_trait;
use dlock_spi::{
    BatchRenew, Error, LockMode, LockRemoteResource, RenewRequest, RenewResult, Result,
};
use futures_util::future::join_all;

use crate::backend::RedisBackend;
use crate::keys::{OwnerPart, ScriptCall, EXCLUSIVE, READERS};

/// The most holds one script call renews: a script runs alone on the server, so a
/// batch of thousands is sent as several calls (pipelined) rather than one that
/// holds every other client up for milliseconds.
const MAX_PER_CALL: usize = 200;

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
        let sent = Instant::now();
        let epoch = self.epoch();
        let (batched, alone): (Vec<usize>, Vec<usize>) =
            (0..reqs.len()).partition(|&i| batchable(&reqs[i]));
        // Calls of at most `MAX_PER_CALL` holds, sent at once (pipelined), beside
        // the renewals that go on their own.
        let chunks: Vec<&[usize]> = batched.chunks(MAX_PER_CALL).collect();
        let calls: Vec<ScriptCall<'_>> = chunks
            .iter()
            .map(|chunk| self.batch_call(chunk.iter().map(|&i| &reqs[i])))
            .collect();
        let together = join_all(calls.iter().map(|call| {
            self.count_renewal_call();
            self.invoke_script::<Vec<i64>>(call, "renew")
        }));
        let singly = join_all(alone.iter().map(|&i| self.renew(&reqs[i])));
        let (answers, singles) = tokio::join!(together, singly);

        let mut out: Vec<Option<Result<RenewResult>>> = reqs.iter().map(|_| None).collect();
        for (&i, result) in alone.iter().zip(singles) {
            out[i] = Some(result);
        }
        let (mut renewed, mut again): (Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new());
        for (chunk, answer) in chunks.iter().zip(answers) {
            let answer = answer.and_then(|codes| {
                if codes.len() == chunk.len() {
                    Ok(codes)
                } else {
                    Err(Error::backend(format!(
                        "the batch renewal script answered {} results for {} holds; is another script loaded under its SHA?",
                        codes.len(),
                        chunk.len()
                    )))
                }
            });
            match answer {
                Ok(codes) => {
                    for (&i, code) in chunk.iter().zip(codes) {
                        match code {
                            NOT_OWNER => out[i] = Some(Ok(RenewResult::NotOwner)),
                            RENEWED => renewed.push(i),
                            READERS_BESIDE => again.push(i),
                            other => {
                                out[i] = Some(Err(Error::backend(format!(
                                    "the batch renewal script answered {other} for a hold; is another script loaded under its SHA?"
                                ))))
                            }
                        }
                    }
                }
                Err(err) => {
                    for &i in chunk.iter() {
                        out[i] = Some(Err(err.duplicate()));
                    }
                }
            }
        }
        // Readers beside the writer: the single renewal, horizon and all.
        let redone = join_all(again.iter().map(|&i| self.renew(&reqs[i]))).await;
        for (&i, result) in again.iter().zip(redone) {
            out[i] = Some(result);
        }
        // Renewals the replicas did not take would be undone by a failover: none of
        // the script's counts then (the single renewals waited for their own).
        if !renewed.is_empty() {
            let acknowledged = self.check_renewals_acknowledged(epoch).await;
            for i in renewed {
                out[i] = Some(match &acknowledged {
                    Ok(()) => Ok(RenewResult::renewed(Some(sent + reqs[i].lease))),
                    Err(err) => Err(err.duplicate()),
                });
            }
        }
        out.into_iter()
            .map(|result| {
                result.unwrap_or_else(|| {
                    Err(Error::backend(
                        "a renewal of the batch got no answer (a bug)",
                    ))
                })
            })
            .collect()
    }
}

impl RedisBackend {
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
