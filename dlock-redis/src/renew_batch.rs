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
use dlock_spi::{BatchRenew, LockMode, LockRemoteResource, RenewRequest, RenewResult, Result};

use crate::backend::RedisBackend;
use crate::keys::{OwnerPart, ScriptCall, EXCLUSIVE, READERS};

/// The batch script. KEYS: per hold, its exclusive key and its readers key. ARGV: per
/// hold, the owner part of its holder value and the lease in ms (so hold *i* has
/// `KEYS[2i-1], KEYS[2i]` and `ARGV[2i-1], ARGV[2i]`). Answers per hold: 0 — not the
/// holder (nothing changed); 1 — renewed; 2 — lease extended, but readers of the
/// same owner are beside the writer, whose horizon the single renewal keeps (the
/// client sends that one for it).
pub(crate) const RENEW_BATCH: &str = r#"
local out = {}
for i = 1, #KEYS, 2 do
  local owner = ARGV[i]
  local v = redis.call('GET', KEYS[i])
  if not v or string.sub(v, 1, #owner) ~= owner then
    out[#out + 1] = 0
  else
    redis.call('PEXPIRE', KEYS[i], ARGV[i + 1])
    out[#out + 1] = redis.call('EXISTS', KEYS[i + 1]) == 0 and 1 or 2
  end
end
return out
"#;

/// What the batch script answered for one hold.
const NOT_OWNER: i64 = 0;
const RENEWED: i64 = 1;

/// Whether a request goes into the batch script: a plain exclusive renewal.
fn batchable(req: &RenewRequest) -> bool {
    req.mode == LockMode::Exclusive && req.context.is_none()
}

#[async_trait]
impl BatchRenew for RedisBackend {
    async fn renew_batch(&self, reqs: &[RenewRequest]) -> Result<Vec<RenewResult>> {
        let sent = Instant::now();
        let batched: Vec<&RenewRequest> = reqs.iter().filter(|r| batchable(r)).collect();
        let epoch = self.epoch();
        let script = self.batch_call(&batched);
        let together = async {
            match script {
                Some(call) => {
                    self.count_renewal_call();
                    self.invoke_script::<Vec<i64>>(&call, "renew").await
                }
                None => Ok(Vec::new()),
            }
        };
        let alone = async {
            let mut out = Vec::new();
            for req in reqs.iter().filter(|r| !batchable(r)) {
                out.push(self.renew(req).await);
            }
            out
        };
        let (answers, singles) = tokio::join!(together, alone);
        let answers = answers?;
        if answers.len() != batched.len() {
            return Err(dlock_spi::Error::backend(format!(
                "the batch renewal script answered {} results for {} holds; is another script loaded under its SHA?",
                answers.len(),
                batched.len()
            )));
        }
        // Readers beside the writer: the single renewal keeps their horizon.
        let mut answers = answers.into_iter().zip(&batched);
        let mut singles = singles.into_iter();
        let mut out = Vec::with_capacity(reqs.len());
        let mut renewed_any = false;
        for req in reqs {
            let result = if batchable(req) {
                match answers.next() {
                    Some((NOT_OWNER, _)) => RenewResult::NotOwner,
                    Some((RENEWED, _)) => {
                        renewed_any = true;
                        RenewResult::renewed(Some(sent + req.lease))
                    }
                    Some((_, req)) => self.renew(req).await?,
                    None => RenewResult::NotOwner,
                }
            } else {
                match singles.next() {
                    Some(result) => result?,
                    None => RenewResult::NotOwner,
                }
            };
            out.push(result);
        }
        // Renewals the replicas did not take would be undone by a failover: none of
        // them counts (the single renewals above waited for their own).
        if renewed_any {
            self.check_renewals_acknowledged(epoch).await?;
        }
        Ok(out)
    }
}

impl RedisBackend {
    /// The batch script's call for `reqs` (all batchable), or `None` when empty.
    fn batch_call<'s>(&'s self, reqs: &[&RenewRequest]) -> Option<ScriptCall<'s>> {
        if reqs.is_empty() {
            return None;
        }
        let script = &self.scripts().renew_batch;
        let mut cmd = redis::Cmd::with_capacity(3 + 4 * reqs.len(), 64 * reqs.len());
        cmd.arg("EVALSHA")
            .arg(script.get_hash())
            .arg(2 * reqs.len());
        let keys: Vec<_> = reqs.iter().map(|r| self.keys(&r.name)).collect();
        for k in &keys {
            cmd.arg(k.key(EXCLUSIVE)).arg(k.key(READERS));
        }
        for r in reqs {
            cmd.arg(OwnerPart(r.holder().as_str()))
                .arg(crate::backend::ms(r.lease));
        }
        Some(ScriptCall { script, cmd })
    }
}
