//! The acquire algorithm: one attempt (the acquire script, queueing a waiter that
//! may wait), and between attempts the wait for a release notice, a hand-over, or
//! the holder's lease end.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use dlock_spi::{
    AcquireRequest, AcquireResult, Error, ErrorKind, Fairness, FencingToken, HoldPurpose, LockMode,
    LockRemoteResource, Result,
};
use redis::{FromRedisValue, Value};

use crate::backend::RedisBackend;
use crate::error::map_redis;
use crate::keys::ms;
use crate::keys::{
    HolderValue, LockKeys, OwnerPart, ScriptCall, ACQUIRE_EXCLUSIVE_KEYS, ALL, EXCLUSIVE, LEAN_KEYS,
};
use crate::notices::{address, Registration};

/// How often a parked non-fair waiter re-checks even without a notice: a safety net
/// for notices lost in transit, not the way waiters normally wake.
const SAFETY_RECHECK: Duration = Duration::from_secs(5);

/// A handed-over lock whose provisional lease has less than this left is confirmed
/// by asking again (which extends the lease) rather than taken as it is.
const HANDOVER_MIN_LEFT: Duration = Duration::from_millis(50);

/// What an acquire attempt does if refused (the scripts' `waiting` argument).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waiting {
    /// Nothing: the caller returns.
    No,
    /// Queue, for its turn and to be named by a release (told on the backend's
    /// notice channel, or polling).
    Queue,
    /// Already queued: stay (refresh liveness); leave the queue if granted.
    Queued,
}

impl Waiting {
    fn arg(self) -> &'static str {
        match self {
            Waiting::No => "0",
            Waiting::Queue => "1",
            Waiting::Queued => "3",
        }
    }
}

/// An acquire script's answer.
pub(crate) struct Answer {
    granted: bool,
    /// Refused: the semaphore's holders have another total (`value`).
    total_differs: bool,
    /// The token when granted, else ms until the lock may be free (0: unknown).
    value: i64,
    /// Refused and queued.
    queued: bool,
    /// Refused: live waiters queued ahead of this one.
    ahead: i64,
    /// Refused: the lock's fencing counter when the refusal was decided.
    fence: u64,
}

impl Answer {
    /// A grant with `token`.
    fn granted(token: i64) -> Self {
        Answer {
            granted: true,
            total_differs: false,
            value: token,
            queued: false,
            ahead: 0,
            fence: 0,
        }
    }
}

/// Removes a waiter's queue entry if its acquire is dropped mid-wait.
pub(crate) struct QueueSlot {
    backend: RedisBackend,
    keys: LockKeys,
    owner: String,
    armed: bool,
}

impl Drop for QueueSlot {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let backend = self.backend.clone();
        let keys = self.keys.clone();
        let owner = std::mem::take(&mut self.owner);
        let what = format_args!(
            "{}'s entry of a cancelled waiter",
            self.keys.key(crate::keys::QUEUE)
        );
        dlock_spi::spawn_cleanup(&what, None, async move {
            if let Err(e) = backend.leave_queue(&keys, &owner).await {
                tracing::debug!(error = %e, "dlock-redis: leaving the queue failed; the entry (and a lock handed over to it) lapses with its liveness");
            }
        });
    }
}

impl RedisBackend {
    /// Acquires: attempts until granted, refused without a wait left, or failed
    /// (see [`LockRemoteResource::try_acquire`](dlock_spi::LockRemoteResource::try_acquire)).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped while queued, the queue entry is removed in a task of its
    /// own; a grant the script may have made is the caller's to give back.
    pub(crate) async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireResult> {
        let keys = self.keys(&req.name);
        // The grant's identity is what the scripts store and compare as the "owner".
        let holder = req.holder();
        // A caller that may wait registers for notices before its first attempt (the
        // backend's channel is subscribed already): no lost wake-up.
        let registration = match (&self.inner.notices, req.deadline) {
            (Some(n), Some(d)) if d > Instant::now() => Some(n.register(address(
                keys.key(EXCLUSIVE).to_string_lossy(),
                holder.as_str(),
            ))),
            _ => None,
        };
        // A waiter queues on the server (told or polling); it leaves the queue when
        // it gives up or is dropped.
        let mut slot: Option<QueueSlot> = None;
        let mut queued = false;
        let mut round = 0u32;
        let mut last_ahead = i64::MAX;
        loop {
            let now = Instant::now();
            let waiting = req.deadline.is_some_and(|d| d > now);
            if waiting && slot.is_none() {
                // Armed before the attempt that may queue: if the call is dropped
                // while it is in flight, the leave follows it on the same connection.
                slot = Some(QueueSlot {
                    backend: self.clone(),
                    keys: keys.clone(),
                    owner: holder.as_str().to_owned(),
                    armed: true,
                });
            }
            let epoch = self.inner.conn.epoch();
            let answer = self
                .attempt(req, holder.as_str(), &keys, waiting, queued)
                .await?;
            if answer.granted {
                if let Some(slot) = slot.as_mut() {
                    slot.armed = false;
                }
                let token = u64::try_from(answer.value).unwrap_or(0);
                self.check_replicas(req, epoch).await?;
                return Ok(AcquireResult::acquired(
                    FencingToken::new(token),
                    Some(now + req.lease),
                ));
            }
            queued |= answer.queued;
            let left = u64::try_from(answer.value)
                .ok()
                .filter(|m| *m > 0)
                .map(Duration::from_millis);
            let Some(deadline) = req.deadline.filter(|d| *d > Instant::now()) else {
                if let Some(slot) = slot.as_mut().filter(|s| s.armed) {
                    // Disarmed only once left: dropped mid-way, the slot leaves again.
                    self.leave_queue(&keys, holder.as_str()).await?;
                    slot.armed = false;
                }
                return Ok(AcquireResult::not_acquired(None, left));
            };
            // Re-check when the holder's lease runs out (a crashed holder sends no notice).
            let mut wake_at = deadline;
            if let Some(left) = left {
                wake_at = wake_at.min(Instant::now() + left + Duration::from_millis(1));
            }
            // A queued waiter re-checks often enough to stay live in the queue, also
            // when it polls with a backoff longer than that.
            if queued {
                wake_at = wake_at.min(Instant::now() + self.inner.options.waiter_liveness / 3);
            }
            // A polling waiter that moves up to the head of the queue, or next but
            // one, polls from the shortest delay again: it takes the lock soon after
            // it frees (and well within the provisional lease of a lock a release
            // hands over to it: its re-check confirms the lock as its own).
            if queued && answer.ahead < 2 && answer.ahead < last_ahead {
                round = 0;
            }
            last_ahead = answer.ahead;
            match (&registration, self.inner.options.polling) {
                (Some(r), None) if r.subscribed() => {
                    if !queued {
                        wake_at = wake_at.min(Instant::now() + SAFETY_RECHECK);
                    }
                    tokio::select! {
                        _ = r.notified() => {}
                        _ = tokio::time::sleep_until(wake_at.into()) => {}
                    }
                    if let Some(granted) = self.handed_over(r, now, epoch, answer.fence) {
                        if let Some(slot) = slot.as_mut() {
                            slot.armed = false;
                        }
                        return Ok(granted);
                    }
                }
                (_, polling) => {
                    let backoff = polling.unwrap_or_default();
                    let delay = backoff
                        .delay_within(round, wake_at)
                        .unwrap_or(Duration::ZERO);
                    tokio::time::sleep(delay).await;
                }
            }
            round = round.saturating_add(1);
        }
    }

    /// Runs an acquire script: `{1, token}` when granted, `{0, ms left, queued, ahead,
    /// fencing counter}` when not.
    pub(crate) async fn run_acquire(&self, inv: &ScriptCall<'_>) -> Result<Answer> {
        let reply: Value = self
            .inner
            .conn
            .invoke(inv)
            .await
            .map_err(|e| map_redis(e, "acquire"))?;
        // The hot path answers a grant with the bare token; every other path with a
        // list led by 1 (granted), 0 (refused) or -1 (a semaphore's total differs).
        let reply: Vec<i64> = match reply {
            Value::Int(token) => vec![1, token],
            list => Vec::from_redis_value(list)
                .map_err(|e| map_redis(redis::RedisError::from(e), "acquire"))?,
        };
        Ok(Answer {
            granted: reply.first() == Some(&1),
            total_differs: reply.first() == Some(&-1),
            value: reply.get(1).copied().unwrap_or(0),
            queued: reply.get(2) == Some(&1),
            ahead: reply.get(3).copied().unwrap_or(0),
            fence: reply
                .get(4)
                .and_then(|f| u64::try_from(*f).ok())
                .unwrap_or(0),
        })
    }

    pub(crate) async fn leave_queue(&self, keys: &LockKeys, owner: &str) -> Result<()> {
        let mut inv = keys.invocation(&self.inner.scripts.leave, &ALL);
        inv.arg(owner);
        self.inner
            .conn
            .invoke::<i64>(&inv)
            .await
            .map(drop)
            .map_err(|e| map_redis(e, "acquire"))
    }

    /// One attempt. `waiting`: the caller will wait if it fails; `queued`: it is in
    /// the lock's queue already.
    async fn attempt(
        &self,
        req: &AcquireRequest,
        holder: &str,
        keys: &LockKeys,
        waiting: bool,
        queued: bool,
    ) -> Result<Answer> {
        self.inner.attempts.fetch_add(1, Ordering::Relaxed);
        let o = &self.inner.options;
        let value = HolderValue(OwnerPart(holder), req.context.as_ref());
        let waiting = match (waiting, queued) {
            (_, true) => Waiting::Queued,
            (false, false) => Waiting::No,
            (true, false) => Waiting::Queue,
        };
        if req.mode == LockMode::Exclusive
            && req.fairness == Fairness::NonFair
            && req.alongside.is_none()
        {
            // The hot path: a lean script; a caller that will not wait declares only
            // the two keys it can touch and sends only its value and lease.
            let declared = if waiting == Waiting::No {
                &ACQUIRE_EXCLUSIVE_KEYS[..2]
            } else {
                &ACQUIRE_EXCLUSIVE_KEYS[..]
            };
            let mut inv = keys.invocation(&self.inner.scripts.acquire_exclusive, declared);
            inv.arg(value).arg(ms(req.lease));
            if waiting != Waiting::No {
                inv.arg(waiting.arg())
                    .arg(ms(o.waiter_liveness))
                    .arg(self.notice_channel());
            }
            return self.run_acquire(&inv).await;
        }
        if let (LockMode::Permits(n), false) = (req.mode, waiting == Waiting::Queued) {
            // The plain case first, on its lean script (a queued waiter's re-check
            // never is: the queue is there); nil sends the general script.
            let mut inv = keys.invocation(&self.inner.scripts.acquire_permits_fast, &LEAN_KEYS);
            inv.arg(holder)
                .arg(ms(req.lease))
                .arg(req.context.as_ref())
                .arg(n)
                .arg(req.capacity);
            // A token, or nil: not its case, the general script decides.
            if let Some(token) = self.invoke_script::<Option<i64>>(&inv, "acquire").await? {
                return Ok(Answer::granted(token));
            }
        }
        let mut inv = keys.invocation(&self.inner.scripts.acquire, &ALL);
        inv.arg(holder)
            .arg(match req.mode {
                LockMode::Exclusive => "x",
                LockMode::Shared => "s",
                LockMode::Permits(_) => "p",
            })
            .arg(ms(req.lease))
            .arg(value)
            .arg(if req.fairness == Fairness::Fair {
                "1"
            } else {
                "0"
            })
            .arg(waiting.arg())
            .arg(ms(o.waiter_liveness))
            .arg(self.notice_channel())
            .arg(req.context.as_ref())
            .arg(if req.purpose == HoldPurpose::Leadership {
                "1"
            } else {
                "0"
            });
        match (req.mode, req.alongside_holder()) {
            (LockMode::Permits(n), _) => {
                inv.arg(n).arg(req.capacity);
            }
            (_, Some(beside)) => {
                inv.arg(beside.as_str());
            }
            (_, None) => {}
        }
        let answer = self.run_acquire(&inv).await?;
        if answer.total_differs {
            return Err(Error::semaphore_total_differs(answer.value, req.capacity));
        }
        Ok(answer)
    }

    /// A grant a release handed over to this waiter (told by its notice), held from
    /// the notice on. The last refused attempt — sent at `sent` on connection `epoch`,
    /// refused while the lock's counter stood at `fence` — orders it: a hand-over
    /// whose token is above `fence` came after that attempt ran (tokens only grow),
    /// so its provisional lease runs from no earlier than `sent`; one whose token is
    /// not came before, and had lapsed by then (else the attempt would have found the
    /// lock its own), so it is stale. `None` — the waiter
    /// asks again, which confirms a handed-over lock as its own — when no hand-over
    /// came, when replicas must acknowledge grants (the wait is for this client's
    /// own writes: the re-check writes the lease), when the Sentinel master changed
    /// since or the notice came from another master, or when too little of the
    /// provisional lease is left to be of use.
    fn handed_over(
        &self,
        registration: &Registration,
        sent: Instant,
        epoch: u64,
        fence: u64,
    ) -> Option<AcquireResult> {
        let handover = registration.take_handover()?;
        if handover.token <= fence {
            return None;
        }
        let until = sent + handover.lease;
        let usable = self.inner.options.replica_ack.is_none()
            && epoch == self.inner.conn.epoch()
            && handover.epoch == epoch
            && until > Instant::now() + HANDOVER_MIN_LEFT;
        usable.then(|| AcquireResult::acquired(FencingToken::new(handover.token), Some(until)))
    }

    /// After an acquire: releases and fails if too few replicas acknowledged it.
    async fn check_replicas(&self, req: &AcquireRequest, epoch: u64) -> Result<()> {
        let Some((why, retry)) = self.unacknowledged(epoch, "acquire").await? else {
            return Ok(());
        };
        let _ = self.release(&req.release_of_grant()).await;
        Err(Error::new(
            ErrorKind::Backend,
            format!("{why}; the lock was released — check replication, or lower replica_ack"),
        )
        .set_retryable(retry))
    }
}
