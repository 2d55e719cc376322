//! The Redis `LockRemoteResource`.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use dlock_spi::{
    redact_url, AcquireRequest, AcquireResult, Capabilities, Error, ErrorKind, Fairness,
    FencingToken, HoldPurpose, HolderInfo, LockAdmin, LockMode, LockName, LockRemoteResource,
    LockState, ReleaseRequest, ReleaseResult, RenewRequest, RenewResult, Result,
};
use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::{FromRedisValue, Value};

use crate::config::Target;
use crate::connection::{bounded, connection_config};
use crate::error::{config_error, map_redis};
use crate::keys::ms;
use crate::keys::{
    scan_pattern, HolderValue, LockKeys, OwnerPart, ScriptCall, ACQUIRE_EXCLUSIVE_KEYS, ALL,
    EXCLUSIVE, LEAN_KEYS, OBSERVERS, RELEASE_EXCLUSIVE_KEYS, RENEW_EXCLUSIVE_KEYS,
};
use crate::notices::{address, Endpoint, Notices, Registration};
use crate::scripts::Scripts;
use crate::sentinel::SentinelMaster;
use crate::RedisOptions;

/// How often a parked non-fair waiter re-checks even without a notice: a safety net
/// for notices lost in transit, not the way waiters normally wake.
const SAFETY_RECHECK: Duration = Duration::from_secs(5);
/// A handed-over lock whose provisional lease has less than this left is confirmed
/// by asking again (which extends the lease) rather than taken as it is.
const HANDOVER_MIN_LEFT: Duration = Duration::from_millis(50);

#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    /// The master Sentinel names, followed through failovers.
    Sentinel(Arc<SentinelMaster>),
}

impl Conn {
    /// Runs a script by SHA; loads it (on every primary, for Cluster) and runs it
    /// again if the server does not know it yet.
    async fn invoke<T: FromRedisValue>(&self, call: &ScriptCall<'_>) -> redis::RedisResult<T> {
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

    async fn query<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        match self {
            Conn::Single(c) => cmd.query_async(&mut c.clone()).await,
            Conn::Cluster(c) => cmd.query_async(&mut c.clone()).await,
            Conn::Sentinel(m) => m.query(cmd).await,
        }
    }

    /// Which master connection commands go to now (Sentinel; 0 otherwise): a
    /// `WAIT` counts only for writes sent on the connection it runs on.
    fn epoch(&self) -> u64 {
        match self {
            Conn::Sentinel(m) => m.epoch(),
            _ => 0,
        }
    }
}

struct Inner {
    conn: Conn,
    scripts: Scripts,
    options: RedisOptions,
    notices: Option<Arc<Notices>>,
    /// One client per node given in the URL, for SCAN (live-lock counting); empty
    /// behind Sentinel (the master is scanned).
    nodes: Vec<redis::Client>,
    attempts: AtomicU64,
    /// Calls sent to renew leases (a batch of many counts once).
    renewal_calls: AtomicU64,
}

/// A lock backend on Redis (single node or Cluster). Cheap to clone.
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

/// What an acquire attempt does if refused (the scripts' `waiting` argument).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Waiting {
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
struct Answer {
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
struct QueueSlot {
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

fn int(v: Option<&Value>) -> i64 {
    match v {
        Some(Value::Int(i)) => *i,
        Some(Value::BulkString(b)) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
        _ => 0,
    }
}

fn bytes(v: Option<&Value>) -> Vec<u8> {
    match v {
        Some(Value::BulkString(b)) => b.clone(),
        Some(Value::SimpleString(s)) => s.clone().into_bytes(),
        _ => Vec::new(),
    }
}

impl RedisBackend {
    /// Connects with default options. URLs: `redis://[user:pass@]host:port[/db]`,
    /// `rediss://…[?tls_ca=<pem>&tls_cert=<pem>&tls_key=<pem>]` (TLS, feature `tls`),
    /// `redis+cluster://[user:pass@]host1:port,host2:port,…`,
    /// `rediss+cluster://…` (a Cluster over TLS; the same TLS parameters),
    /// `redis+sentinel://[user:pass@]s1:26379,s2:26379,…/<master>[/<db>]` (the
    /// master Sentinel names, followed through failovers; the credentials are the
    /// data nodes', the sentinels' own are `sentinel_user`/`sentinel_password`
    /// parameters or [`RedisOptions::sentinel_auth`]), or `rediss+sentinel://…`
    /// (TLS to sentinels and data nodes; the same TLS parameters).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before it returns, the connections it opened close.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, RedisOptions::default()).await
    }

    /// Connects with `options`.
    pub async fn connect_with(url: &str, options: RedisOptions) -> Result<Self> {
        let shown = url;
        let (target, options) = crate::config::parse(url, options)?;
        let (conn, nodes) = match target {
            Target::Cluster { nodes: node_urls, tls } => {
                if options.replica_ack.is_some() {
                    return Err(replica_ack_on_cluster());
                }
                let nodes = node_urls
                    .iter()
                    .map(|u| crate::tls::client(u, shown, &options))
                    .collect::<Result<Vec<_>>>()?;
                let builder = redis::cluster::ClusterClientBuilder::new(node_urls)
                    .connection_timeout(options.connect_timeout);
                let client = crate::tls::cluster(builder, &options, tls)?
                    .build()
                    .map_err(|e| config_error(shown, e))?;
                let conn = bounded(options.connect_timeout, client.get_async_connection())
                    .await
                    .map_err(|e| unreachable(shown, e))?;
                (Conn::Cluster(conn), nodes)
            }
            Target::Sentinel(sentinel) => {
                let master = SentinelMaster::new(sentinel, shown, &options)?;
                master
                    .connection()
                    .await
                    .map_err(|e| unreachable(shown, e))?;
                (Conn::Sentinel(master), Vec::new())
            }
            Target::Single(url) => {
                let client = crate::tls::client(&url, shown, &options)?;
                let conn = connection_manager(&client, &options)
                    .await
                    .map_err(|e| unreachable(shown, e))?;
                (Conn::Single(conn), vec![client])
            }
            Target::Redlock(_) => {
                return Err(Error::new(
                    ErrorKind::Config,
                    format!(
                        "{:?} is a Redlock URL: connect it with RedlockBackend::connect (dlock_api::open_backend takes it too)",
                        redact_url(shown)
                    ),
                ))
            }
        };
        Self::assemble(conn, nodes, options, shown).await
    }

    /// Builds the backend on the application's client for one node (`redis://` or
    /// `rediss://`, with the TLS settings and credentials it was built with): dlock
    /// opens its own connection manager from it — without a reply timeout, as
    /// [`RedisBackend::connect`] does — and, unless polling, one pub/sub connection.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before it returns, the connections it opened close.
    pub async fn from_client(client: redis::Client, options: RedisOptions) -> Result<Self> {
        let conn = connection_manager(&client, &options)
            .await
            .map_err(|e| unreachable(APPLICATION_CLIENT, e))?;
        Self::from_connection_manager(client, conn, options).await
    }

    /// Builds the backend on the application's connection manager (one node): dlock's
    /// scripts share its multiplexed connection with the application's commands;
    /// `client`, the one the manager came from, opens the pub/sub connection (unless
    /// polling) and scans for [`LockAdmin::live_locks`](dlock_spi::LockAdmin).
    ///
    /// Build the manager without a reply timeout
    /// (`ConnectionManagerConfig::set_response_timeout(None)`; the `redis` crate's
    /// default gives up after 500 ms): a script that ran but answered late would be
    /// reported as failed — an acquire as an error while it holds the lock until its
    /// lease ends, a release as failed though it released. dlock's own calls are
    /// bounded by the manager's `operation_timeout`.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use dlock_redis::{RedisBackend, RedisOptions};
    /// let client = redis::Client::open("redis://127.0.0.1:6379")?;
    /// let config = redis::aio::ConnectionManagerConfig::new().set_response_timeout(None);
    /// let conn = client.get_connection_manager_with_config(config).await?;
    /// let backend =
    ///     RedisBackend::from_connection_manager(client, conn, RedisOptions::default()).await?;
    /// # let _ = backend; Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before it returns, the pub/sub connection it opened closes.
    pub async fn from_connection_manager(
        client: redis::Client,
        conn: ConnectionManager,
        options: RedisOptions,
    ) -> Result<Self> {
        Self::assemble(
            Conn::Single(conn),
            vec![client],
            options,
            APPLICATION_CLIENT,
        )
        .await
    }

    /// Builds the backend on the application's Cluster client (its credentials, TLS
    /// and routing settings): dlock opens its own Cluster connection from it.
    /// `nodes` are clients for the Cluster's nodes, built with the same credentials
    /// and TLS: release notices are subscribed through the first (a Cluster
    /// broadcasts `PUBLISH` to every node), and [`LockAdmin::live_locks`] scans each
    /// — give every master for a complete listing, as a `redis+cluster://` URL's
    /// node list does.
    ///
    /// Build the client without a reply timeout (the `redis` crate's Cluster builder
    /// sets none unless `response_timeout` is called): a script that ran but
    /// answered late would be reported as failed. dlock's own calls are bounded by
    /// the manager's `operation_timeout`.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use dlock_redis::{RedisBackend, RedisOptions};
    /// let seeds = ["redis://127.0.0.1:7000", "redis://127.0.0.1:7001", "redis://127.0.0.1:7002"];
    /// let cluster = redis::cluster::ClusterClient::new(seeds.to_vec())?;
    /// let nodes = seeds.iter().map(|u| redis::Client::open(*u)).collect::<Result<_, _>>()?;
    /// let backend = RedisBackend::from_cluster_client(cluster, nodes, RedisOptions::default()).await?;
    /// # let _ = backend; Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`] when `nodes` is empty or the options ask for replica
    /// acknowledgement (single node only); a connection error when the Cluster
    /// cannot be reached within [`RedisOptions::connect_timeout`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before it returns, the connections it opened close.
    pub async fn from_cluster_client(
        client: redis::cluster::ClusterClient,
        nodes: Vec<redis::Client>,
        options: RedisOptions,
    ) -> Result<Self> {
        if nodes.is_empty() {
            return Err(Error::new(
                ErrorKind::Config,
                "from_cluster_client needs a client for at least one of the Cluster's nodes (for release notices and listing locks); pass one per master",
            ));
        }
        if options.replica_ack.is_some() {
            return Err(replica_ack_on_cluster());
        }
        let conn = bounded(options.connect_timeout, client.get_async_connection())
            .await
            .map_err(|e| unreachable(APPLICATION_CLUSTER_CLIENT, e))?;
        Self::assemble(
            Conn::Cluster(conn),
            nodes,
            options,
            APPLICATION_CLUSTER_CLIENT,
        )
        .await
    }

    /// The backend on its connections: checks the options, opens the notices.
    async fn assemble(
        conn: Conn,
        nodes: Vec<redis::Client>,
        options: RedisOptions,
        shown: &str,
    ) -> Result<Self> {
        if options.sentinel_auth.is_some() && !matches!(conn, Conn::Sentinel(_)) {
            return Err(Error::new(
                ErrorKind::Config,
                "RedisOptions::sentinel_auth is for Sentinel URLs (redis+sentinel://…); remove it, or connect through the sentinels",
            ));
        }
        if options.key_prefix.contains(['{', '}', '\n']) {
            return Err(Error::new(
                ErrorKind::Config,
                "the key prefix may not contain '{' or '}' (they delimit the Cluster hash tag) or a newline (it separates the parts of a release notice)",
            ));
        }
        let endpoint = match (&conn, nodes.first()) {
            (Conn::Sentinel(m), _) => Some(Endpoint::Sentinel(Arc::clone(m))),
            (_, node) => node.map(|n| Endpoint::Node(Box::new(n.clone()))),
        };
        let notices = match (&options.polling, endpoint) {
            (None, Some(endpoint)) => {
                let start = Notices::start(endpoint, &options.key_prefix);
                let notices = bounded(options.connect_timeout, start).await.map_err(|e| {
                    let message = format!(
                        "cannot open the release-notice (pub/sub) connection to {}: {e}; if pub/sub is not allowed, use RedisOptions::polling",
                        redact_url(shown)
                    );
                    connect_error(&e, message)
                })?;
                Some(notices)
            }
            _ => None,
        };
        Ok(RedisBackend {
            inner: Arc::new(Inner {
                conn,
                scripts: Scripts::new(),
                options,
                notices,
                nodes,
                attempts: AtomicU64::new(0),
                renewal_calls: AtomicU64::new(0),
            }),
        })
    }

    /// Whether release notices are flowing (pub/sub connected); false in polling mode.
    pub fn notices_connected(&self) -> bool {
        self.inner.notices.as_ref().is_some_and(|n| n.connected())
    }

    /// Runs an acquire script: `{1, token}` when granted, `{0, ms left, queued, ahead,
    /// fencing counter}` when not.
    async fn run_acquire(&self, inv: &ScriptCall<'_>) -> Result<Answer> {
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

    /// Runs a script that answers 1 (done) or 0 (not the owner).
    async fn run_flag(&self, inv: &ScriptCall<'_>, op: &'static str) -> Result<bool> {
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

    async fn leave_queue(&self, keys: &LockKeys, owner: &str) -> Result<()> {
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

    /// `WAIT` for replicas after a write (an acquire or a renewal) sent at `epoch`
    /// (the Sentinel connection it went on: a wait on another connection, to another
    /// master, says nothing about it). `None` when enough replicas acknowledged it
    /// (or none were asked for), else why not and whether a retry may help.
    async fn unacknowledged(&self, epoch: u64, op: &'static str) -> Result<Option<(String, bool)>> {
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

/// A release or renewal call of one grant (its [`dlock_spi::HolderKey`]): the exclusive
/// script identifies the holder by the owner part of its value, the shared one (all
/// keys; readers and permit holders) by the key itself.
fn owner_call<'s>(
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

/// How messages name a client the application gave (it has no URL to show).
const APPLICATION_CLIENT: &str = "the application's Redis client";
const APPLICATION_CLUSTER_CLIENT: &str = "the application's Redis Cluster client";

fn replica_ack_on_cluster() -> Error {
    Error::new(
        ErrorKind::Config,
        "replica acknowledgement (WAIT) is supported on a single node only; remove replica_ack for Cluster",
    )
}

/// dlock's connection manager on `client`. No retry loop inside connect (the redis
/// crate's default backs off for minutes): an unreachable server is reported at once;
/// after a loss, the next command reconnects. No reply timeout (the crate's default
/// is 500 ms): a script that ran but answered late must not be reported as failed;
/// the chain bounds every call by the manager's `operation_timeout`.
async fn connection_manager(
    client: &redis::Client,
    options: &RedisOptions,
) -> redis::RedisResult<ConnectionManager> {
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_number_of_retries(0)
        .set_connection_timeout(Some(options.connect_timeout))
        .set_response_timeout(None);
    client.get_connection_manager_with_config(config).await
}

fn unreachable(url: &str, e: redis::RedisError) -> Error {
    let hint = match crate::error::classify(&e) {
        (_, _, true) => "check that the server is up and the address (and, for rediss://, its certificates) are right",
        (_, hint, false) => hint,
    };
    connect_error(
        &e,
        format!("cannot connect to {}: {e}; {hint}", redact_url(url)),
    )
}

/// A failed connection as a dlock error: the redis error's kind and retryability,
/// `message` saying what failed and what to check.
fn connect_error(e: &redis::RedisError, message: String) -> Error {
    let (kind, _, transient) = crate::error::classify(e);
    Error::new(kind, message)
        .set_retryable(transient)
        .with_context("backend", "redis")
        .with_context("op", "connect")
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
        // A Cluster keeps each lock's keys in a slot of its own: one script cannot
        // reach several locks' keys there.
        match self.inner.conn {
            Conn::Cluster(_) => None,
            Conn::Single(_) | Conn::Sentinel(_) => Some(self),
        }
    }
}

/// How long an observer's registration lives unless refreshed (every third of it).
const OBSERVER_LIVENESS: Duration = Duration::from_secs(10);

#[async_trait]
impl dlock_spi::LockEvents for RedisBackend {
    /// Registers the observer in the election's observer set with this backend's
    /// notice channel; grants, releases and proclaims of the election publish one
    /// message to each live observer. The registration is refreshed every few
    /// seconds and removed when the feed is dropped; a crashed observer's lapses.
    async fn follow(&self, name: &LockName) -> Result<dlock_spi::ChangeFeed> {
        let Some(notices) = self.inner.notices.clone() else {
            return Err(Error::unsupported(
                "this Redis backend polls (RedisOptions::polling): it has no change feed",
            ));
        };
        let keys = self.keys(name);
        let id = format!("{:016x}", fastrand::u64(..));
        let registration = notices.register(address(keys.key(OBSERVERS).to_string_lossy(), &id));
        let member = format!("{id} {}", notices.channel());
        self.observe(&keys, &member).await?;
        let (tx, rx) = tokio::sync::watch::channel(0u64);
        let this = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = registration.notified() => tx.send_modify(|n| *n = n.wrapping_add(1)),
                    () = tokio::time::sleep(OBSERVER_LIVENESS / 3) => {
                        if let Err(err) = this.observe(&keys, &member).await {
                            tracing::debug!(error = %err, "dlock-redis: refreshing an observer failed");
                            // Changes may be missed while unregistered: re-read.
                            tx.send_modify(|n| *n = n.wrapping_add(1));
                        }
                    }
                    () = tx.closed() => {
                        let mut cmd = redis::cmd("ZREM");
                        cmd.arg(keys.key(OBSERVERS)).arg(&member);
                        if let Err(err) = this.inner.conn.query::<i64>(&cmd).await {
                            tracing::debug!(error = %err, "dlock-redis: removing an observer failed; it lapses");
                        }
                        return;
                    }
                }
            }
        });
        Ok(dlock_spi::ChangeFeed::new(rx, ()))
    }
}

impl RedisBackend {
    /// Registers or refreshes observer `member` of the lock `keys`.
    async fn observe(&self, keys: &LockKeys, member: &str) -> Result<()> {
        let mut inv = keys.invocation(&self.inner.scripts.observe, &[OBSERVERS]);
        inv.arg(member).arg(ms(OBSERVER_LIVENESS));
        self.run_flag(&inv, "observe").await.map(drop)
    }
}

#[async_trait]
impl LockAdmin for RedisBackend {
    async fn force_release(&self, name: &LockName) -> Result<usize> {
        let keys = self.keys(name);
        let inv = keys.invocation(&self.inner.scripts.force_release, &ALL);
        let n: i64 = self
            .inner
            .conn
            .invoke(&inv)
            .await
            .map_err(|e| map_redis(e, "force_release"))?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    async fn live_locks(&self, prefix: &str) -> Result<usize> {
        let pattern = scan_pattern(&self.inner.options.key_prefix, prefix);
        let mut names = HashSet::new();
        let mut nodes = self.inner.nodes.clone();
        if let Conn::Sentinel(m) = &self.inner.conn {
            let (_, master) = m.client().await.map_err(|e| map_redis(e, "live_locks"))?;
            nodes.push(master);
        }
        for node in &nodes {
            let mut conn = node
                .get_multiplexed_async_connection_with_config(&connection_config(
                    self.inner.options.connect_timeout,
                ))
                .await
                .map_err(|e| map_redis(e, "live_locks"))?;
            let mut cursor = 0u64;
            loop {
                let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(1000)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| map_redis(e, "live_locks"))?;
                for key in keys {
                    let Some((base, kind)) = key.rsplit_once(':') else {
                        continue;
                    };
                    let live = match kind {
                        // Queued waiters, readers, and observers of an election
                        // (removed when the last one stops following).
                        "r" | "q" | "o" => true,
                        // A free marker (the last token) is not holder state.
                        "x" => {
                            let v: Option<String> = redis::cmd("GET")
                                .arg(&key)
                                .query_async(&mut conn)
                                .await
                                .map_err(|e| map_redis(e, "live_locks"))?;
                            // The exclusive key exists only while held (by a writer or
                            // readers, or a waiter it was handed over to).
                            v.is_some()
                        }
                        _ => false,
                    };
                    if live {
                        names.insert(base.to_owned());
                    }
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(names.len())
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
