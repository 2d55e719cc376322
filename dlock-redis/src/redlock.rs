//! Redlock: one lock over N independent Redis masters, held while a majority holds it.
//!
//! `redlock://[user:pass@]h1:6379,h2:6379,h3:6379[/<db>]` (`redlocks://` over TLS,
//! the same TLS parameters as `rediss://`). Each node is an ordinary single-node
//! [`RedisBackend`] (polling: no pub/sub connection per node); this file only counts.
//!
//! * **Acquire** sends the same grant to every node at once, each call bounded by
//!   the node timeout. Granted by a quorum (`N/2 + 1`), the hold is valid until
//!   `sent + lease − drift` (`drift` = 1 % of the lease + 2 ms: the nodes' clocks may
//!   run that much faster than ours), counted from before the first request left —
//!   Redlock's `validity = lease − elapsed − drift`. Short of a quorum, or with no
//!   validity left, the grant is released on **every** node (one that timed out may
//!   have granted it) and the attempt fails; waiting callers try again after a
//!   random backoff until their deadline. Nothing queues: Redlock is not fair.
//! * **Fencing token**: each node's grant takes `max(counter + 1, node clock µs)`;
//!   the hold's token is the largest of the granting quorum's, and before the grant
//!   is returned it is written back as a floor of the counter on every node where
//!   the grant still holds, of which a quorum must confirm. The next conflicting grant needs a quorum too, which
//!   shares a node with that one, so its token is larger: **strictly increasing as
//!   long as no node forgets its counter** (a node restarted without persistence
//!   forgets it; its clock part still orders grants made after the restart if the
//!   clocks agree within the time between them). Plain Redlock (one token per node)
//!   gives no such order.
//! * **Renewal** by quorum, with the same validity rule; **release** on every node.
//! * **Read-write locks**: each node keeps readers and writers apart, and any two
//!   quorums share a node, so a read and a write quorum cannot both be granted.
//!   Semaphores are refused: permits counted per node do not add up across quorums.
//!
//! What Redlock cannot do (Kleppmann's critique stands): a holder paused past its
//! validity keeps acting on a lock it lost (the token is what protects the
//! resource), and a node that restarts empty before the longest lease has passed can
//! make a second quorum — restart nodes with AOF `fsync always`, or keep them down
//! past the longest lease.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use dlock_spi::{
    redact_url, AcquireRequest, AcquireResult, Capabilities, Error, ErrorKind, FencingToken,
    HolderInfo, LockAdmin, LockEvents, LockMode, LockName, LockRemoteResource, LockState,
    ReleaseRequest, ReleaseResult, RenewRequest, RenewResult, Result,
};
use futures_util::future::join_all;
use tokio::sync::OnceCell;

use crate::config::Target;
use crate::keys::{EXCLUSIVE, FENCE, READERS, REDLOCK_WAITERS};
use crate::{RedisBackend, RedisOptions};

/// Raises a lock's fencing counter to at least `ARGV[1]`, only where the grant
/// still holds: its owner part `ARGV[2]` (`<length>|<holder>`) on the exclusive
/// key (`ARGV[4]` = `x`), or the live reader `ARGV[3]` (`s`). KEYS: fence, exclusive,
/// readers. Returns 1 if raised, 0 if the grant does not hold here.
///
/// Only such nodes count: a later conflicting grant on one of them comes after this
/// hold ends there, so after the raise.
static RAISE_FENCE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r#"
local held
if ARGV[4] == 'x' then
  local v = redis.call('GET', KEYS[2])
  held = v and string.sub(v, 1, #ARGV[2]) == ARGV[2]
else
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local until_ms = redis.call('ZSCORE', KEYS[3], ARGV[3])
  held = until_ms and tonumber(until_ms) > now
end
if not held then return 0 end
local c = tonumber(redis.call('GET', KEYS[1])) or 0
if c < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) end
return 1
"#,
    )
});

/// Registers (`ARGV[3]` = 1) or removes (0) the waiter `ARGV[1]` with a liveness of
/// `ARGV[2]` ms, after dropping lapsed ones. KEYS: the waiters. Returns the live
/// waiters ([`Waiter`] strings).
static WAITER: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if ARGV[3] == '1' then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
else
  redis.call('ZREM', KEYS[1], ARGV[1])
end
return redis.call('ZRANGE', KEYS[1], 0, -1)
"#,
    )
});

/// How long a waiter stays shown without re-checking; waiters re-check at the pace
/// of their backoff ([`RedisOptions::polling`](crate::RedisOptions::polling); by
/// default at most every 250 ms) and at least every third of it.
const WAITER_LIVENESS: Duration = Duration::from_secs(3);

/// How long a waiter may be passed by callers that came after it (barging, for
/// throughput) before they stand back for it: no waiter starves.
const STARVATION_AFTER: Duration = Duration::from_millis(20);

/// A caller shown as waiting: `<mode>|<since, ms of the Unix epoch>|<holder>`.
/// Redlock does not queue; callers read the waiters to stand back for the ones
/// that were there first (see [`Waiter::goes_before`]).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Waiter {
    exclusive: bool,
    since_ms: u64,
    holder: String,
}

impl Waiter {
    fn new(exclusive: bool, holder: &str) -> Self {
        let since_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Waiter {
            exclusive,
            since_ms,
            holder: holder.to_owned(),
        }
    }

    fn member(&self) -> String {
        let mode = if self.exclusive { 'x' } else { 's' };
        format!("{mode}|{}|{}", self.since_ms, self.holder)
    }

    fn parse(member: &str) -> Option<Self> {
        let mut parts = member.splitn(3, '|');
        let exclusive = parts.next()? == "x";
        let since_ms = parts.next()?.parse().ok()?;
        let holder = parts.next()?.to_owned();
        Some(Waiter {
            exclusive,
            since_ms,
            holder,
        })
    }

    /// Whether this waiter goes before `me` (who waits since `me.since_ms`, or
    /// asks for the first time): it came first, wants a mode that conflicts, and
    /// is a writer ahead of a reader (writers are not starved by readers) or has
    /// waited past [`STARVATION_AFTER`].
    fn goes_before(&self, me: &Waiter, now_ms: u64) -> bool {
        let first = (self.since_ms, &self.holder) < (me.since_ms, &me.holder);
        let conflicts = self.exclusive || me.exclusive;
        let starving = now_ms.saturating_sub(self.since_ms)
            > u64::try_from(STARVATION_AFTER.as_millis()).unwrap_or(u64::MAX);
        self.holder != me.holder
            && first
            && conflicts
            && ((self.exclusive && !me.exclusive) || starving)
    }
}

/// How long one node may take to answer one call, by default.
const NODE_TIMEOUT: Duration = Duration::from_millis(200);

/// One node: its URL and, once connected, its backend.
struct Node {
    source: Source,
    backend: OnceCell<RedisBackend>,
}

/// Where a node's backend comes from.
enum Source {
    /// Its one-node URL, from the `redlock://` URL.
    Url(String),
    /// The application's client for it.
    Client(Box<redis::Client>),
}

impl Node {
    /// The node as messages name it (no password).
    fn shown(&self) -> String {
        match &self.source {
            Source::Url(url) => redact_url(url),
            Source::Client(client) => client.get_connection_info().addr().to_string(),
        }
    }
}

struct Inner {
    nodes: Vec<Node>,
    quorum: usize,
    options: RedisOptions,
    node_timeout: Duration,
    shown: String,
    attempts: AtomicU64,
}

/// Redlock over independent Redis masters (`redlock://h1,h2,h3`). Cheap to clone.
#[derive(Clone)]
pub struct RedlockBackend {
    inner: Arc<Inner>,
}

fn node_error(what: String) -> Error {
    Error::new(ErrorKind::Backend, what)
        .set_retryable(true)
        .with_context("backend", "redlock")
}

/// `options` as every Redlock node takes them: no replica acknowledgement (the nodes
/// are independent masters), waiters polling (Redlock has no pub/sub) at the
/// options' pace or [`Backoff::default`](dlock_spi::Backoff::default)'s.
fn redlock_options(options: RedisOptions) -> Result<RedisOptions> {
    if options.replica_ack.is_some() {
        return Err(Error::new(
            ErrorKind::Config,
            "replica_ack does not apply to Redlock (its nodes are independent masters, each a copy); remove it",
        ));
    }
    let backoff = options.polling.unwrap_or_default();
    Ok(options.polling(backoff))
}

impl RedlockBackend {
    /// Connects to the nodes of `redlock://h1:6379,h2:6379,h3:6379[/db]` with default
    /// options. A quorum must answer now; the others are connected on first use.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before it returns, the connections it opened close.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, RedisOptions::default()).await
    }

    /// Connects with `options` for every node (their key prefix, TLS and connect
    /// timeout) and its waiters (they poll — Redlock has no pub/sub — at the pace of
    /// `polling`'s backoff, [`Backoff::default`](dlock_spi::Backoff::default) when
    /// none is given). `replica_ack` is refused: Redlock's nodes are independent
    /// masters.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before it returns, the connections it opened close.
    pub async fn connect_with(url: &str, options: RedisOptions) -> Result<Self> {
        let (target, options) = crate::config::parse(url, redlock_options(options)?)?;
        let Target::Redlock(node_urls) = target else {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "{:?} is not a Redlock URL; write redlock://[user:pass@]host1:6379,host2:6379,host3:6379[/<db>] (redlocks:// for TLS)",
                    redact_url(url)
                ),
            ));
        };
        let nodes = node_urls.into_iter().map(Source::Url).collect();
        Self::assemble(nodes, options, redact_url(url)).await
    }

    /// Builds the backend on the application's clients, one per independent master
    /// (each with the credentials and TLS it was built with), with `options` for
    /// every node as [`connect_with`](Self::connect_with) takes them. A quorum must
    /// answer now; the others are connected on first use. Each node's backend is
    /// [`RedisBackend::from_client`] on its client.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use dlock_redis::{RedlockBackend, RedisOptions};
    /// let clients = ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"]
    ///     .iter()
    ///     .map(|u| redis::Client::open(*u))
    ///     .collect::<Result<Vec<_>, _>>()?;
    /// let backend = RedlockBackend::from_clients(clients, RedisOptions::default()).await?;
    /// # let _ = backend; Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`] when `clients` is empty or the options ask for replica
    /// acknowledgement; [`ErrorKind::Backend`] when fewer than a quorum answer.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before it returns, the connections it opened close.
    pub async fn from_clients(clients: Vec<redis::Client>, options: RedisOptions) -> Result<Self> {
        if clients.is_empty() {
            return Err(Error::new(
                ErrorKind::Config,
                "RedlockBackend::from_clients needs a client for each of the independent masters (three or five); none was given",
            ));
        }
        let options = redlock_options(options)?;
        let shown = clients
            .iter()
            .map(|c| c.get_connection_info().addr().to_string())
            .collect::<Vec<_>>()
            .join(",");
        let nodes = clients
            .into_iter()
            .map(|c| Source::Client(Box::new(c)))
            .collect();
        Self::assemble(
            nodes,
            options,
            format!("the application's Redlock clients ({shown})"),
        )
        .await
    }

    /// The backend on its nodes: a quorum must answer now.
    async fn assemble(sources: Vec<Source>, options: RedisOptions, shown: String) -> Result<Self> {
        let nodes: Vec<Node> = sources
            .into_iter()
            .map(|source| Node {
                source,
                backend: OnceCell::new(),
            })
            .collect();
        let quorum = nodes.len() / 2 + 1;
        let backend = RedlockBackend {
            inner: Arc::new(Inner {
                nodes,
                quorum,
                node_timeout: NODE_TIMEOUT,
                options,
                shown,
                attempts: AtomicU64::new(0),
            }),
        };
        let first = backend.inner.options.connect_timeout;
        let connected = backend.on_all(first, |_| async { Ok(()) }).await;
        let answered = connected.iter().filter(|c| c.is_ok()).count();
        if answered < quorum {
            return Err(Error::new(
                ErrorKind::Backend,
                format!(
                    "fewer than a quorum ({quorum} of {}) of the Redlock nodes of {} answer: {}",
                    backend.inner.nodes.len(),
                    backend.inner.shown,
                    backend.failing_nodes(&connected)
                ),
            )
            .set_retryable(true)
            .with_context("backend", "redlock")
            .with_context("op", "connect"));
        }
        Ok(backend)
    }

    /// How many nodes must agree.
    pub fn quorum(&self) -> usize {
        self.inner.quorum
    }

    /// Test hook: acquire rounds (one request to every node each) sent by this backend.
    pub fn acquire_attempts(&self) -> u64 {
        self.inner.attempts.load(Ordering::Relaxed)
    }

    /// The node's backend, connecting it if it is not yet (callers bound it: see
    /// [`RedlockBackend::on_all`]).
    async fn node<'a>(&self, node: &'a Node) -> Result<&'a RedisBackend> {
        let options = self.inner.options.clone();
        node.backend
            .get_or_try_init(|| async {
                match &node.source {
                    Source::Url(url) => RedisBackend::connect_with(url, options).await,
                    Source::Client(client) => {
                        RedisBackend::from_client((**client).clone(), options).await
                    }
                }
            })
            .await
    }

    /// Runs `call` on every node at once, each bounded by `limit`; the answers in
    /// node order.
    async fn on_all<'s, T, F, Fut>(&'s self, limit: Duration, call: F) -> Vec<Result<T>>
    where
        F: Fn(&'s RedisBackend) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        join_all(self.inner.nodes.iter().map(|n| {
            let call = &call;
            async move {
                // Connecting (a node that was down) counts within the bound too.
                tokio::time::timeout(limit, async {
                    let backend = self.node(n).await?;
                    call(backend).await
                })
                .await
                .unwrap_or_else(|_| Err(node_error(format!("no answer within {limit:?}"))))
            }
        }))
        .await
    }

    /// What each node whose answer in `answers` (node order) is an error said.
    fn failing_nodes<T>(&self, answers: &[Result<T>]) -> String {
        answers
            .iter()
            .zip(&self.inner.nodes)
            .filter_map(|(a, n)| a.as_ref().err().map(|e| format!("{}: {e}", n.shown())))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// The error for a call that `got` of the nodes answered as needed, short of a
    /// quorum: what each failing node said, so the reader knows which to check.
    fn short_of_quorum<T>(&self, answers: &[Result<T>], got: usize, what: &str) -> Error {
        let failing = self.failing_nodes(answers);
        let detail = if failing.is_empty() {
            String::new()
        } else {
            format!("; {failing}")
        };
        node_error(format!(
            "only {got} of {} Redlock nodes {what} (a quorum is {}){detail}",
            self.inner.nodes.len(),
            self.inner.quorum
        ))
    }

    /// The per-node bound for a hold of `lease`: the node timeout, and at most a
    /// third of the lease (slow nodes must leave validity).
    fn limit(&self, lease: Duration) -> Duration {
        self.inner
            .node_timeout
            .min(lease / 3)
            .max(Duration::from_millis(1))
    }

    /// When a hold of `lease` requested at `sent` stops being valid: Redlock's
    /// validity, `lease − elapsed − drift`, on this process's clock.
    fn valid_until(sent: Instant, lease: Duration) -> Instant {
        let drift = lease / 100 + Duration::from_millis(2);
        sent + lease.saturating_sub(drift)
    }

    /// One attempt on every node: the token and validity when a quorum granted it
    /// (and raised its counters), else `None` after releasing it everywhere.
    async fn attempt(&self, req: &AcquireRequest) -> Result<Option<(u64, Instant)>> {
        let mut once = req.clone();
        once.deadline = None;
        self.inner.attempts.fetch_add(1, Ordering::Relaxed);
        let limit = self.limit(req.lease);
        let sent = Instant::now();
        let answers = self.on_all(limit, |b| b.try_acquire(&once)).await;
        let until = Self::valid_until(sent, req.lease);
        let tokens: Vec<u64> = answers
            .iter()
            .filter_map(|a| match a {
                Ok(AcquireResult::Acquired { token, .. }) => Some(token.get()),
                _ => None,
            })
            .collect();
        let failed = answers.iter().filter(|a| a.is_err()).count();
        if tokens.len() >= self.inner.quorum && Instant::now() < until {
            let token = tokens.iter().copied().max().unwrap_or(0);
            let holder = req.holder();
            let exclusive = req.mode == LockMode::Exclusive;
            let raised = self
                .on_all(limit, |b| {
                    b.raise_fence(&req.name, token, holder.as_str(), exclusive)
                })
                .await
                .iter()
                .filter(|r| matches!(r, Ok(true)))
                .count();
            if raised >= self.inner.quorum && Instant::now() < until {
                return Ok(Some((token, until)));
            }
        }
        // Short of a quorum (or of time): undo it everywhere, including where the
        // answer was lost.
        let release = req.release_of_grant();
        let _ = self.on_all(limit, |b| b.release(&release)).await;
        if failed > self.inner.nodes.len() - self.inner.quorum {
            let answered = self.inner.nodes.len() - failed;
            return Err(self.short_of_quorum(&answers, answered, "answered"));
        }
        Ok(None)
    }
}

#[async_trait]
impl LockRemoteResource for RedlockBackend {
    fn backend_name(&self) -> &'static str {
        "redlock"
    }

    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::default();
        caps.lease = true;
        caps.renew = true;
        caps.reentrant = true;
        caps.shared = true;
        caps.fencing = true;
        caps
    }

    /// # Cancel safety
    ///
    /// Cancel-safe: dropped mid-attempt, nodes may hold the grant until the
    /// manager's release of it reaches them (each node's requests are applied in
    /// order, so the release cannot overtake the grant) or its lease ends.
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<AcquireResult> {
        if let LockMode::Permits(_) = req.mode {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "Redlock has no semaphores: permits counted on each node do not add up across quorums",
            ));
        }
        // The pace the options ask for (`connect_with` makes polling the default).
        let backoff = self.inner.options.polling.unwrap_or_default();
        let me = Waiter::new(req.mode == LockMode::Exclusive, req.holder().as_str());
        let mut shown = WaiterSlot {
            backend: self.clone(),
            name: req.name.clone(),
            member: me.member(),
            armed: false,
        };
        // The waiters the last registration saw (it answers with them): a waiting
        // round reads them from there, not in a round trip of its own; only waiters
        // that came after this one can be missing, and none of them goes before it.
        let mut known: Option<Vec<Waiter>> = None;
        for round in 0u32.. {
            // Stand back for the waiters that go first (they are shown on the nodes).
            let waiters = match known.take() {
                Some(seen) => seen,
                None => self.waiters(&req.name, None).await,
            };
            let now_ms = Waiter::new(false, "").since_ms;
            let ahead = waiters.iter().any(|w| w.goes_before(&me, now_ms));
            let granted = if ahead {
                Ok(None)
            } else {
                self.attempt(req).await
            };
            // Never longer than a third of the shown waiter's liveness, whatever the
            // backoff: it re-checks (and stays shown) well within it.
            let delay = req
                .deadline
                .and_then(|d| backoff.delay_within(round, d))
                .map(|d| d.min(WAITER_LIVENESS / 3));
            if shown.armed && (delay.is_none() || !matches!(granted, Ok(None))) {
                // Disarmed only once the nodes answered: cut short before, the slot's
                // drop sends the removal again (a waiter left shown would hold back
                // later writers for its whole liveness).
                self.waiters(&req.name, Some((&shown.member, false))).await;
                shown.armed = false;
            }
            if let Some((token, until)) = granted? {
                return Ok(AcquireResult::acquired(
                    FencingToken::new(token),
                    Some(until),
                ));
            }
            let Some(delay) = delay else { break };
            // Shown as waiting while it waits (for inspect, and for the callers that
            // must stand back for it); removed when it stops.
            shown.armed = true;
            known = Some(self.waiters(&req.name, Some((&shown.member, true))).await);
            tokio::time::sleep(delay).await;
        }
        Ok(AcquireResult::not_acquired(None, None))
    }

    async fn release(&self, req: &ReleaseRequest) -> Result<ReleaseResult> {
        let answers = self
            .on_all(self.inner.node_timeout, |b| b.release(req))
            .await;
        if answers
            .iter()
            .any(|a| matches!(a, Ok(ReleaseResult::Released)))
        {
            return Ok(ReleaseResult::Released);
        }
        let answered = answers.iter().filter(|a| a.is_ok()).count();
        if answered >= self.inner.quorum {
            return Ok(ReleaseResult::NotOwner);
        }
        Err(self.short_of_quorum(&answers, answered, "answered the release"))
    }

    async fn renew(&self, req: &RenewRequest) -> Result<RenewResult> {
        let sent = Instant::now();
        let answers = self.on_all(self.limit(req.lease), |b| b.renew(req)).await;
        let until = Self::valid_until(sent, req.lease);
        let renewed = answers
            .iter()
            .filter(|a| matches!(a, Ok(RenewResult::Renewed { .. })))
            .count();
        if renewed >= self.inner.quorum && Instant::now() < until {
            return Ok(RenewResult::renewed(Some(until)));
        }
        let gone = answers
            .iter()
            .filter(|a| matches!(a, Ok(RenewResult::NotOwner)))
            .count();
        if gone > self.inner.nodes.len() - self.inner.quorum {
            return Ok(RenewResult::NotOwner);
        }
        Err(self.short_of_quorum(&answers, renewed, "renewed in time"))
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockState>> {
        let answers = self
            .on_all(self.inner.node_timeout, |b| b.inspect(name))
            .await;
        let answered = answers.iter().filter(|a| a.is_ok()).count();
        if answered < self.inner.quorum {
            return Err(self.short_of_quorum(&answers, answered, "answered"));
        }
        let waiting = self.waiters(name, None).await.len();
        let states: Vec<LockState> = answers
            .into_iter()
            .filter_map(|a| a.ok().flatten())
            .collect();
        let holders = quorum_holders(&states, self.inner.quorum);
        Ok((!holders.is_empty() || waiting > 0).then(|| LockState::new(holders, Some(waiting))))
    }

    fn admin(&self) -> Option<&dyn LockAdmin> {
        Some(self)
    }

    fn events(&self) -> Option<&dyn LockEvents> {
        None
    }

    fn batch_renew(&self) -> Option<&dyn dlock_spi::BatchRenew> {
        None
    }
}

#[async_trait]
impl LockAdmin for RedlockBackend {
    /// Clears the name on every node; the largest count any node reports.
    async fn force_release(&self, name: &LockName) -> Result<usize> {
        let answers = self
            .on_all(self.inner.node_timeout, |b| b.force_release(name))
            .await;
        answers
            .into_iter()
            .try_fold(0, |most, a| a.map(|n| most.max(n)))
    }

    /// The largest count of any node (each node counts the names it holds state for).
    async fn live_locks(&self, prefix: &str) -> Result<usize> {
        let answers = self
            .on_all(self.inner.options.connect_timeout, |b| b.live_locks(prefix))
            .await;
        answers
            .into_iter()
            .try_fold(0, |most, a| a.map(|n| most.max(n)))
    }
}

impl RedlockBackend {
    /// The live waiters of `name` any node shows, after showing (`Some((member,
    /// true))`) or no longer showing (`false`) one on every node. Best effort: an
    /// entry a node missed lapses with its liveness.
    async fn waiters(&self, name: &LockName, change: Option<(&str, bool)>) -> Vec<Waiter> {
        let answers = self
            .on_all(self.inner.node_timeout, |b| b.redlock_waiters(name, change))
            .await;
        let mut all: Vec<Waiter> = Vec::new();
        for member in answers.into_iter().filter_map(|a| a.ok()).flatten() {
            if let Some(w) = Waiter::parse(&member) {
                if !all.contains(&w) {
                    all.push(w);
                }
            }
        }
        all
    }
}

/// The holders a quorum of the nodes' `states` shows, each as the quorum sees it:
/// its token the largest any node shows (the hold's token is the largest of its
/// granting quorum's, written back to the nodes only after the grant: a node may
/// show its own, smaller, meanwhile), its context one a quorum shows (a proclaimed
/// value counts once a quorum has it; until then the earlier one, if a quorum
/// still has that), its remaining lease the quorum's (a hold lasts while a quorum
/// keeps it: the quorum-th longest).
fn quorum_holders(states: &[LockState], quorum: usize) -> Vec<HolderInfo> {
    let mut holders: Vec<HolderInfo> = Vec::new();
    for state in states {
        for h in &state.holders {
            let same = |o: &HolderInfo| o.owner == h.owner && o.grant == h.grant;
            if holders.iter().any(same) {
                continue;
            }
            let seen: Vec<&HolderInfo> = states
                .iter()
                .filter_map(|s| s.holders.iter().find(|o| same(o)))
                .collect();
            if seen.len() < quorum {
                continue;
            }
            let mut holder = h.clone();
            holder.token = seen.iter().map(|o| o.token).max().unwrap_or(h.token);
            if let Some(agreed) = seen
                .iter()
                .find(|o| seen.iter().filter(|p| p.context == o.context).count() >= quorum)
            {
                holder.context = agreed.context.clone();
            }
            let mut leases: Vec<Duration> = seen.iter().filter_map(|o| o.remaining_lease).collect();
            if leases.len() >= quorum {
                leases.sort_unstable_by(|a, b| b.cmp(a));
                holder.remaining_lease = Some(leases[quorum - 1]);
            }
            holders.push(holder);
        }
    }
    holders
}

/// Stops showing a waiter whose acquire is dropped mid-wait.
struct WaiterSlot {
    backend: RedlockBackend,
    name: LockName,
    member: String,
    armed: bool,
}

impl Drop for WaiterSlot {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let backend = self.backend.clone();
        let name = self.name.clone();
        let member = std::mem::take(&mut self.member);
        let what = format_args!("lock {}'s entry of a cancelled waiter", self.name);
        dlock_spi::spawn_cleanup(&what, None, async move {
            backend.waiters(&name, Some((&member, false))).await;
        });
    }
}

impl RedisBackend {
    /// Redlock's waiters of `name` on this node (members), after registering
    /// (`Some((member, true))`) or removing (`Some((member, false))`) one.
    pub(crate) async fn redlock_waiters(
        &self,
        name: &LockName,
        change: Option<(&str, bool)>,
    ) -> Result<Vec<String>> {
        let keys = self.keys(name);
        let mut call = keys.invocation(&WAITER, &[REDLOCK_WAITERS]);
        let (holder, on) = change.unwrap_or(("", false));
        call.arg(holder)
            .arg(WAITER_LIVENESS.as_millis().to_string())
            .arg(if on { "1" } else { "0" });
        self.invoke_script(&call, "inspect").await
    }

    /// Raises the fencing counter of `name` to at least `token` if `holder` (an
    /// exclusive or a shared grant) still holds it here (Redlock's write-back);
    /// whether it did.
    pub(crate) async fn raise_fence(
        &self,
        name: &LockName,
        token: u64,
        holder: &str,
        exclusive: bool,
    ) -> Result<bool> {
        let keys = self.keys(name);
        let mut call = keys.invocation(&RAISE_FENCE, &[FENCE, EXCLUSIVE, READERS]);
        call.arg(token.to_string())
            .arg(format!("{}|{holder}", holder.len()))
            .arg(holder)
            .arg(if exclusive { "x" } else { "s" });
        self.invoke_script::<i64>(&call, "acquire")
            .await
            .map(|raised| raised == 1)
    }
}

impl std::fmt::Debug for RedlockBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedlockBackend")
            .field("nodes", &self.inner.nodes.len())
            .field("quorum", &self.inner.quorum)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiters_go_first_when_they_conflict_and_came_first() {
        let w = |x: bool, since: u64, h: &str| Waiter {
            exclusive: x,
            since_ms: since,
            holder: h.to_owned(),
        };
        let writer = w(true, 1_000, "a");
        assert_eq!(Waiter::parse(&writer.member()), Some(writer.clone()));
        // A queued writer holds back a later reader at once…
        assert!(writer.goes_before(&w(false, 1_005, "b"), 1_006));
        // …and a later writer only once it has waited past the starvation bound.
        assert!(!writer.goes_before(&w(true, 1_005, "b"), 1_010));
        assert!(writer.goes_before(&w(true, 1_005, "b"), 1_100));
        // Readers do not hold back readers; nobody holds back itself or one before it.
        assert!(!w(false, 1_000, "a").goes_before(&w(false, 1_005, "b"), 2_000));
        assert!(!writer.goes_before(&w(true, 1_000, "a"), 2_000));
        assert!(!writer.goes_before(&w(true, 900, "b"), 2_000));
    }

    #[test]
    fn validity_leaves_out_the_drift() {
        let sent = Instant::now();
        let until = RedlockBackend::valid_until(sent, Duration::from_secs(10));
        assert_eq!(until - sent, Duration::from_millis(10_000 - 100 - 2));
    }
}
