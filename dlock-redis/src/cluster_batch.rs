//! Renewal batches on Redis Cluster: one script call per node, not per lock.
//!
//! A Cluster keeps each lock's keys in a slot of its own, and a script's declared
//! keys must share a slot. So the Cluster's batch script (`renew_batch_cluster.lua`,
//! flagged `allow-cross-slot-keys`, Redis 7 and later) declares no key: it takes the
//! holds' keys as arguments and renews those its node serves, answering
//! [`ELSEWHERE`] for a key it does not (the server refuses a script's access to a
//! key of another node, and the script reads the refusal with `pcall`). Nothing is
//! written on a node for a key it does not serve.
//!
//! Which slots share a node is learnt from the answers ([`NodeGroups`]): each call
//! goes to the master of one slot (the client's own routing), carrying the holds
//! whose slots answered there before; holds of slots not seen yet go, all of them,
//! to the master of the first one's slot — a probe, whose answers say which of them
//! live there. A hold answered [`ELSEWHERE`] (a slot not seen there, or moved since)
//! goes again in the batch's next round, [`ROUNDS`] at most, and is renewed alone
//! after the last, as is every hold when the server cannot load the script (before
//! Redis 7): a three-master Cluster is learnt in two batches, and then each batch
//! is one call per master.

use std::collections::HashMap;

use dlock_spi::{Error, RenewRequest, Result};
use futures_util::future::join_all;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr};
use redis::FromRedisValue;

use crate::backend::RedisBackend;
use crate::error::map_redis;
use crate::keys::{ms, OwnerPart, EXCLUSIVE, READERS};
use crate::scripts::MAX_PER_CALL;
use crate::scripts::RENEW_BATCH_CLUSTER;

/// What the script answers for a hold whose keys its node does not serve.
pub(crate) const ELSEWHERE: i64 = 3;

/// The rounds of calls a batch makes: each sends the holds of the slots known to
/// share a master to it, and those of slots not seen yet to one master (a probe).
const ROUNDS: usize = 2;

impl RedisBackend {
    /// The batch script's answer for each of `batched` (indexes into `reqs`, plain
    /// exclusive renewals), in order: renewed, not the owner, readers beside, or
    /// [`ELSEWHERE`] — renewed alone by the caller.
    pub(crate) async fn cluster_codes(
        &self,
        conn: &ClusterConnection,
        reqs: &[RenewRequest],
        batched: &[usize],
    ) -> Vec<Result<i64>> {
        let groups = &self.inner.node_groups;
        if groups.refused() {
            return batched.iter().map(|_| Ok(ELSEWHERE)).collect();
        }
        let mut codes: Vec<Option<Result<i64>>> = batched.iter().map(|_| None).collect();
        let slots: Vec<Slot> = batched
            .iter()
            .map(|&i| Slot::for_key(self.keys(&reqs[i].name).key(EXCLUSIVE).to_string_lossy()))
            .collect();
        let mut pending: Vec<usize> = (0..batched.len()).collect();
        for _ in 0..ROUNDS {
            if pending.is_empty() || groups.refused() {
                break;
            }
            // The pending holds by the slot whose master they go to; those of
            // slots not seen yet with the first of them (a probe).
            let mut by_node: HashMap<Slot, Vec<usize>> = HashMap::new();
            {
                let with = groups.with();
                let mut probe = None;
                for &p in &pending {
                    let to = match with.get(&slots[p]) {
                        Some(to) => *to,
                        None => *probe.get_or_insert(slots[p]),
                    };
                    by_node.entry(to).or_default().push(p);
                }
            }
            let calls: Vec<(Slot, &[usize])> = by_node
                .iter()
                .flat_map(|(to, ps)| ps.chunks(MAX_PER_CALL).map(move |chunk| (*to, chunk)))
                .collect();
            let answers = join_all(calls.iter().map(|(to, chunk)| {
                self.cluster_call(conn, *to, chunk.iter().map(|&p| &reqs[batched[p]]))
            }))
            .await;
            let mut again = Vec::new();
            let mut with = groups.with();
            for ((to, chunk), answer) in calls.iter().zip(answers) {
                match answer {
                    Ok(answered) => {
                        for (&p, code) in chunk.iter().zip(answered) {
                            // Served elsewhere: its slot is not (or no longer) with
                            // `to`; the next round (or its own renewal) has it.
                            if code == ELSEWHERE {
                                with.remove(&slots[p]);
                                again.push(p);
                            } else {
                                with.insert(slots[p], *to);
                            }
                            codes[p] = Some(Ok(code));
                        }
                    }
                    Err(err) => {
                        for &p in chunk.iter() {
                            codes[p] = Some(Err(err.duplicate()));
                        }
                    }
                }
            }
            pending = again;
        }
        codes
            .into_iter()
            .map(|code| code.unwrap_or(Ok(ELSEWHERE)))
            .collect()
    }

    /// One call of the Cluster's batch script on the master of slot `to`, for
    /// `reqs`: one code per hold (all [`ELSEWHERE`] when the server refuses the
    /// script).
    async fn cluster_call<'r>(
        &self,
        conn: &ClusterConnection,
        to: Slot,
        reqs: impl Iterator<Item = &'r RenewRequest>,
    ) -> Result<Vec<i64>> {
        let script = &self.scripts().renew_batch_cluster;
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(0);
        let mut n = 0;
        for req in reqs {
            let keys = self.keys(&req.name);
            cmd.arg(keys.key(EXCLUSIVE))
                .arg(keys.key(READERS))
                .arg(OwnerPart(req.holder().as_str()))
                .arg(ms(req.lease));
            n += 1;
        }
        let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::with_slot(
            to,
            SlotAddr::Master,
        )));
        let mut conn = conn.clone();
        self.count_renewal_call();
        // A server's error comes back as a value from a routed command.
        let answer = match conn
            .route_command(cmd.clone(), route.clone())
            .await
            .and_then(redis::Value::extract_error)
        {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                let mut load = redis::cmd("SCRIPT");
                load.arg("LOAD").arg(RENEW_BATCH_CLUSTER);
                match conn
                    .route_command(load, route.clone())
                    .await
                    .and_then(redis::Value::extract_error)
                {
                    // The server answered, refusing the script: it is older than
                    // Redis 7 (no script flags).
                    Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError) => {
                        tracing::debug!(error = %e, "the Cluster cannot run the batch renewal script; renewing one lock per call");
                        self.inner.node_groups.refuse();
                        return Ok(vec![ELSEWHERE; n]);
                    }
                    Err(e) => return Err(map_redis(e, "renew")),
                    Ok(_) => conn
                        .route_command(cmd, route)
                        .await
                        .and_then(redis::Value::extract_error),
                }
            }
            answer => answer,
        }
        .map_err(|e| map_redis(e, "renew"))?;
        let codes = Vec::<i64>::from_redis_value(answer).map_err(|e| {
            Error::backend(format!(
                "the Cluster's batch renewal script answered {e}; is another script loaded under its SHA?"
            ))
        })?;
        if codes.len() != n {
            return Err(Error::backend(format!(
                "the Cluster's batch renewal script answered {} results for {n} holds; is another script loaded under its SHA?",
                codes.len()
            )));
        }
        Ok(codes)
    }
}
