//! The Redis `LockRemoteResource`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use dlock_spi::{
    AcquireRequest, AcquireResult, Capabilities, Error, ErrorKind, FencingToken, HoldPurpose,
    HolderInfo, LockAdmin, LockMode, LockName, LockRemoteResource, LockState, ReleaseRequest,
    ReleaseResult, RenewRequest, RenewResult, Result,
};
use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::{FromRedisValue, Value};

use crate::error::map_redis;
use crate::keys::ms;
use crate::keys::{
    HolderValue, LockKeys, OwnerPart, ScriptCall, ALL, RELEASE_EXCLUSIVE_KEYS, RENEW_EXCLUSIVE_KEYS,
};
use crate::notices::Notices;
use crate::scripts::Scripts;
use crate::sentinel::SentinelMaster;
use crate::RedisOptions;

#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    /// The master Sentinel names, followed through failovers.
    Sentinel(Arc<SentinelMaster>),
}

impl Conn {
    /// Runs a script by SHA; loads it (on every primary, for Cluster) and runs it
    /// again if the server does not know it yet.
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        call: &ScriptCall<'_>,
    ) -> redis::RedisResult<T> {
        match self.query(&call.cmd).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                let load = call.script.prepare_invoke();
                match self {
                    Conn::Single(c) => load.load_async(&mut c.clone()).await?,
                    Conn::Cluster(c) => load.load_async(&mut c.clone()).await?,
                    Conn::Sentinel(m) => m.load(&load).await?,
                };
                self.query(&call.cmd).await
            }
            result => result,
        }
    }

    pub(crate) async fn query<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        match self {
            Conn::Single(c) => cmd.query_async(&mut c.clone()).await,
            Conn::Cluster(c) => cmd.query_async(&mut c.clone()).await,
            Conn::Sentinel(m) => m.query(cmd).await,
        }
    }

    /// Which master connection commands go to now (Sentinel; 0 otherwise): a
    /// `WAIT` counts only for writes sent on the connection it runs on.
    pub(crate) fn epoch(&self) -> u64 {
        match self {
            Conn::Sentinel(m) => m.epoch(),
            _ => 0,
        }
    }
}

pub(crate) struct Inner {
    pub(crate) conn: Conn,
    pub(crate) scripts: Scripts,
    pub(crate) options: RedisOptions,
    pub(crate) notices: Option<Arc<Notices>>,
    /// One client per node given in the URL, for SCAN (live-lock counting); empty
    /// behind Sentinel (the master is scanned).
    pub(crate) nodes: Vec<redis::Client>,
    pub(crate) attempts: AtomicU64,
    /// Calls sent to renew leases (a batch of many counts once).
    pub(crate) renewal_calls: AtomicU64,
    /// Which Cluster slots share a node, for renewal batches.
    pub(crate) node_groups: crate::node_groups::NodeGroups,
}

/// A lock backend on Redis (single node or Cluster). Cheap to clone.
#[derive(Clone)]
pub struct RedisBackend {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) fn int(v: Option<&Value>) -> i64 {
    match v {
        Some(Value::Int(i)) => *i,
        Some(Value::BulkString(b)) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
        _ => 0,
    }
}

pub(crate) fn bytes(v: Option<&Value>) -> Vec<u8> {
    match v {
        Some(Value::BulkString(b)) => b.clone(),
        Some(Value::SimpleString(s)) => s.clone().into_bytes(),
        _ => Vec::new(),
    }
}

impl RedisBackend {
    /// Whether release notices are flowing (pub/sub connected); false in polling mode.
    pub fn notices_connected(&self) -> bool {
        self.inner.notices.as_ref().is_some_and(|n| n.connected())
    }

    /// Runs a script that answers 1 (done) or 0 (not the owner).
    pub(crate) async fn run_flag(&self, inv: &ScriptCall<'_>, op: &'static str) -> Result<bool> {
        let n: i64 = self
            .inner
            .conn
            .invoke(inv)
            .await
            .map_err(|e| map_redis(e, op))?;
        Ok(n == 1)
    }

    /// Test hook: acquire attempts made by this backend (one each, whether it sent
    /// one script or two: a permits request's lean script, then the general one).
    pub fn acquire_attempts(&self) -> u64 {
        self.inner.attempts.load(Ordering::Relaxed)
    }

    /// Test hook: calls this backend sent to the server to renew leases (a batch of
    /// many renewals counts once; see [`dlock_spi::BatchRenew`]).
    pub fn renewal_calls(&self) -> u64 {
        self.inner.renewal_calls.load(Ordering::Relaxed)
    }

    /// Counts a call sent to renew leases.
    pub(crate) fn count_renewal_call(&self) {
        self.inner.renewal_calls.fetch_add(1, Ordering::Relaxed);
    }

    /// Runs a script call on this backend's connection; `op` names it in errors.
    pub(crate) async fn invoke_script<T: FromRedisValue>(
        &self,
        call: &ScriptCall<'_>,
        op: &'static str,
    ) -> Result<T> {
        self.inner
            .conn
            .invoke(call)
            .await
            .map_err(|e| map_redis(e, op))
    }

    pub(crate) fn keys(&self, name: &LockName) -> LockKeys {
        LockKeys::new(&self.inner.options.key_prefix, name)
    }

    /// The channel this backend's waiters are told on (one per backend, subscribed
    /// at connect); empty in polling mode.
    pub fn notice_channel(&self) -> &str {
        self.inner.notices.as_ref().map_or("", |n| n.channel())
    }

    /// `WAIT` for replicas after a write (an acquire or a renewal) sent at `epoch`
    /// (the Sentinel connection it went on: a wait on another connection, to another
    /// master, says nothing about it). `None` when enough replicas acknowledged it
    /// (or none were asked for), else why not and whether a retry may help.
    pub(crate) async fn unacknowledged(
        &self,
        epoch: u64,
        op: &'static str,
    ) -> Result<Option<(String, bool)>> {
        let Some((want, timeout)) = self.inner.options.replica_ack else {
            return Ok(None);
        };
        let wait = redis::cmd("WAIT").arg(want).arg(ms(timeout)).clone();
        let acked: i64 = match &self.inner.conn {
            Conn::Single(conn) => wait.query_async(&mut conn.clone()).await,
            Conn::Sentinel(m) => match m.connection().await {
                Ok((now, mut conn)) if now == epoch => wait.query_async(&mut conn).await,
                Ok(_) => Ok(-1),
                Err(e) => Err(e),
            },
            Conn::Cluster(_) => return Ok(None),
        }
        .map_err(|e| map_redis(e, op))?;
        Ok(if acked < 0 {
            Some((
                "the Redis master changed (Sentinel failover) before replicas acknowledged it"
                    .to_owned(),
                true,
            ))
        } else if acked < i64::from(want) {
            Some((
                format!("only {acked} of {want} replicas acknowledged it within {timeout:?}"),
                false,
            ))
        } else {
            None
        })
    }

    /// After renewals sent on connection `epoch`: fails if too few replicas
    /// acknowledged them — a renewal the replicas did not take would be undone by a
    /// failover, so the lease stands as last acknowledged.
    pub(crate) async fn check_renewals_acknowledged(&self, epoch: u64) -> Result<()> {
        match self.unacknowledged(epoch, "renew").await? {
            None => Ok(()),
            Some((why, retry)) => Err(Error::new(
                ErrorKind::Backend,
                format!(
                    "{why}; the renewal does not count — the lease stands as last acknowledged"
                ),
            )
            .set_retryable(retry)),
        }
    }

    /// Which master connection commands go to now (see `Conn::epoch`).
    pub(crate) fn epoch(&self) -> u64 {
        self.inner.conn.epoch()
    }

    /// The backend's scripts.
    pub(crate) fn scripts(&self) -> &Scripts {
        &self.inner.scripts
    }
}

/// A release or renewal call of one grant (its [`dlock_spi::HolderKey`]): the exclusive
/// script identifies the holder by the owner part of its value, the shared one (all
/// keys; readers and permit holders) by the key itself.
pub(crate) fn owner_call<'s>(
    keys: &LockKeys,
    holder: &str,
    mode: LockMode,
    (exclusive, exclusive_keys): (&'s redis::Script, &[&'static str]),
    shared: &'s redis::Script,
) -> ScriptCall<'s> {
    match mode {
        LockMode::Exclusive => {
            let mut call = keys.invocation(exclusive, exclusive_keys);
            call.arg(OwnerPart(holder));
            call
        }
        // Permit holders are readers.
        LockMode::Shared | LockMode::Permits(_) => {
            let mut call = keys.invocation(shared, &ALL);
            call.arg(holder);
            call
        }
    }
}

#[async_trait]
impl LockRemoteResource for RedisBackend {
    fn backend_name(&self) -> &'static str {
        "redis"
    }

    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::default();
        caps.lease = true;
        caps.renew = true;
        caps.reentrant = true;
        caps.fair = true;
        caps.shared = true;
        caps.push_wakeup = self.inner.notices.is_some();
        caps.fencing = true;
        caps.semaphore = true;
        caps.cross_mode = true;
        caps.upgrade = true;
        caps
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<AcquireResult> {
        self.acquire(req).await
    }

    async fn release(&self, req: &ReleaseRequest) -> Result<ReleaseResult> {
        let keys = self.keys(&req.name);
        let scripts = &self.inner.scripts;
        let mut inv = owner_call(
            &keys,
            req.holder().as_str(),
            req.mode,
            (&scripts.release_exclusive, &RELEASE_EXCLUSIVE_KEYS),
            &scripts.release_shared,
        );
        if req.mode == LockMode::Exclusive {
            inv.arg(if req.purpose == HoldPurpose::Leadership {
                "1"
            } else {
                "0"
            });
        }
        Ok(if self.run_flag(&inv, "release").await? {
            ReleaseResult::Released
        } else {
            ReleaseResult::NotOwner
        })
    }

    async fn renew(&self, req: &RenewRequest) -> Result<RenewResult> {
        let keys = self.keys(&req.name);
        let sent = Instant::now();
        let scripts = &self.inner.scripts;
        let mut inv = owner_call(
            &keys,
            req.holder().as_str(),
            req.mode,
            (&scripts.renew_exclusive, &RENEW_EXCLUSIVE_KEYS),
            &scripts.renew_shared,
        );
        inv.arg(ms(req.lease));
        match (&req.context, req.mode) {
            (Some(context), LockMode::Exclusive) => {
                inv.arg(HolderValue(
                    OwnerPart(req.holder().as_str()),
                    context.as_ref(),
                ));
            }
            (Some(context), LockMode::Shared | LockMode::Permits(_)) => {
                inv.arg(context.as_ref());
            }
            (None, _) => {}
        }
        let epoch = self.inner.conn.epoch();
        self.count_renewal_call();
        Ok(if self.run_flag(&inv, "renew").await? {
            self.check_renewals_acknowledged(epoch).await?;
            RenewResult::renewed(Some(sent + req.lease))
        } else {
            RenewResult::NotOwner
        })
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockState>> {
        let keys = self.keys(name);
        let inv = keys.invocation(&self.inner.scripts.inspect, &ALL);
        let v: Vec<Value> = self
            .inner
            .conn
            .invoke(&inv)
            .await
            .map_err(|e| map_redis(e, "inspect"))?;
        let mut holders = Vec::new();
        let owner = bytes(v.first());
        let pttl = int(v.get(3));
        if !owner.is_empty() && pttl > 0 {
            holders.push(HolderInfo::from_stored(
                &String::from_utf8_lossy(&owner),
                LockMode::Exclusive,
                FencingToken::new(u64::try_from(int(v.get(1))).unwrap_or(0)),
                bytes(v.get(2)).into(),
                Some(Duration::from_millis(u64::try_from(pttl).unwrap_or(0))),
            ));
        }
        let waiters = usize::try_from(int(v.get(4))).unwrap_or(0);
        for r in v.get(5..).unwrap_or_default().chunks(5) {
            let mode = match u32::try_from(int(r.get(4))) {
                Ok(0) | Err(_) => LockMode::Shared,
                Ok(n) => LockMode::Permits(n),
            };
            holders.push(HolderInfo::from_stored(
                &String::from_utf8_lossy(&bytes(r.first())),
                mode,
                FencingToken::new(u64::try_from(int(r.get(1))).unwrap_or(0)),
                bytes(r.get(2)).into(),
                Some(Duration::from_millis(
                    u64::try_from(int(r.get(3))).unwrap_or(0),
                )),
            ));
        }
        if holders.is_empty() && waiters == 0 {
            return Ok(None);
        }
        Ok(Some(LockState::new(holders, Some(waiters))))
    }

    fn admin(&self) -> Option<&dyn LockAdmin> {
        Some(self)
    }

    fn events(&self) -> Option<&dyn dlock_spi::LockEvents> {
        // Observers are told over pub/sub; in polling mode they poll.
        self.inner
            .notices
            .as_ref()
            .map(|_| self as &dyn dlock_spi::LockEvents)
    }

    fn batch_renew(&self) -> Option<&dyn dlock_spi::BatchRenew> {
        Some(self)
    }
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("cluster", &matches!(self.inner.conn, Conn::Cluster(_)))
            .field("sentinel", &matches!(self.inner.conn, Conn::Sentinel(_)))
            .field("key_prefix", &self.inner.options.key_prefix)
            .field("push_wakeup", &self.inner.notices.is_some())
            .finish()
    }
}
