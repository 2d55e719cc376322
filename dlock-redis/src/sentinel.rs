//! Redis Sentinel: the backend follows a named master through failovers.
//!
//! `redis+sentinel://[user:pass@]s1:26379,s2:26379,s3:26379/<master>[/<db>]`
//! (`rediss+sentinel://` over TLS, to the sentinels and the data nodes alike). The
//! URL's credentials are the data nodes'; the sentinels' own, if they require any,
//! are the parameters `sentinel_user` and `sentinel_password` (or
//! [`RedisOptions::sentinel_auth`](crate::RedisOptions::sentinel_auth)).
//!
//! As Redis' client guidelines for Sentinel ask: the master's address comes from
//! the first sentinel that answers `SENTINEL get-master-addr-by-name` (the one that
//! answered last is asked first), and a connection to it is used only once `ROLE`
//! there says `master`. The connection is dropped, and the master looked up again,
//!
//! * when a command on it fails with a lost connection or `READONLY`/`MASTERDOWN`
//!   (a demoted master: Sentinel also closes every client connection of a master
//!   it reconfigures as a replica), and
//! * when a sentinel announces `+switch-master` for this master (one subscription,
//!   to one sentinel at a time): a client cut off from the sentinels' majority
//!   while it still reaches the old master learns of the failover this way.
//!
//! Each new connection has a new *epoch*; the release-notice connection follows the
//! epochs (it subscribes again on the new master), and a `replica_ack` wait counts
//! only for an acquire that ran on the connection it waits on.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use dlock_spi::{Backoff, Drained, Jitter, Resubscribe, Result, Subscription};
use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;
use redis::{FromRedisValue, RedisResult, Value};
use tokio::sync::watch;

use crate::config::SentinelUrl;
use crate::connection::{bounded, connection_config};
use crate::RedisOptions;

/// The connection to the master as now known.
struct Current {
    epoch: u64,
    client: redis::Client,
    conn: MultiplexedConnection,
}

/// How the data nodes (the master, wherever the sentinels say it is) are opened.
pub(crate) enum DataNodes {
    /// As the Sentinel URL names them: its scheme, credentials and database, the
    /// options' TLS files.
    Url(SentinelUrl),
    /// With the settings of the application's client for them (credentials,
    /// database, protocol, TLS), at the master's address.
    Like(Box<redis::ConnectionInfo>),
}

impl DataNodes {
    fn open(
        &self,
        host: &str,
        port: u16,
        shown: &str,
        options: &RedisOptions,
    ) -> Result<redis::Client> {
        match self {
            DataNodes::Url(url) => crate::tls::client(&url.data_node(host, port), shown, options),
            DataNodes::Like(info) => {
                let addr = match info.addr() {
                    redis::ConnectionAddr::TcpTls {
                        insecure,
                        tls_params,
                        ..
                    } => redis::ConnectionAddr::TcpTls {
                        host: host.to_owned(),
                        port,
                        insecure: *insecure,
                        tls_params: tls_params.clone(),
                    },
                    _ => redis::ConnectionAddr::Tcp(host.to_owned(), port),
                };
                redis::Client::open((**info).clone().set_addr(addr)).map_err(|e| {
                    dlock_spi::Error::new(
                        dlock_spi::ErrorKind::Config,
                        format!("cannot open a client for the master at {host}:{port} like the data-node client given: {e}"),
                    )
                })
            }
        }
    }
}

/// The master of one Sentinel-monitored group, followed through failovers.
pub(crate) struct SentinelMaster {
    /// The master's name, as the sentinels monitor it.
    name: String,
    /// Each sentinel as messages name it.
    sentinel_names: Vec<String>,
    nodes: DataNodes,
    shown: String,
    options: RedisOptions,
    sentinels: Vec<redis::Client>,
    /// The sentinel that answered last (asked first next time).
    preferred: AtomicUsize,
    current: Mutex<Option<Current>>,
    /// One lookup at a time.
    looking_up: tokio::sync::Mutex<()>,
    /// The epoch of the newest connection (0: none yet).
    epoch: watch::Sender<u64>,
    /// The failover watcher, stopped with the master's handle.
    watcher: Mutex<Option<dlock_spi::TaskGuard>>,
}

/// Whether `e` says the connection no longer reaches the master.
fn lost_master(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || matches!(
            e.kind(),
            redis::ErrorKind::Server(
                redis::ServerErrorKind::ReadOnly | redis::ServerErrorKind::MasterDown
            )
        )
}

fn failed(message: String) -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::NotConnected,
        message,
    ))
}

impl SentinelMaster {
    /// Builds the follower of the Sentinel URL's master (no connection yet) and
    /// starts watching for `+switch-master`; [`SentinelMaster::connection`] looks the
    /// master up.
    pub(crate) fn new(url: SentinelUrl, shown: &str, options: &RedisOptions) -> Result<Arc<Self>> {
        let sentinels = url
            .sentinels
            .iter()
            .map(|h| crate::tls::client(&url.sentinel(h), shown, options))
            .collect::<Result<Vec<_>>>()?;
        let (name, names) = (url.master.clone(), url.sentinels.clone());
        Ok(Self::start(
            name,
            names,
            sentinels,
            DataNodes::Url(url),
            shown,
            options,
        ))
    }

    /// Builds the follower of master `name` on the application's clients for the
    /// sentinels, opening the master like `nodes`.
    pub(crate) fn on_clients(
        name: &str,
        sentinels: Vec<redis::Client>,
        nodes: redis::Client,
        shown: &str,
        options: &RedisOptions,
    ) -> Arc<Self> {
        let names = sentinels
            .iter()
            .map(|c| c.get_connection_info().addr().to_string())
            .collect();
        let nodes = DataNodes::Like(Box::new(nodes.get_connection_info().clone()));
        Self::start(name.to_owned(), names, sentinels, nodes, shown, options)
    }

    fn start(
        name: String,
        sentinel_names: Vec<String>,
        sentinels: Vec<redis::Client>,
        nodes: DataNodes,
        shown: &str,
        options: &RedisOptions,
    ) -> Arc<Self> {
        let master = Arc::new(SentinelMaster {
            name,
            sentinel_names,
            nodes,
            shown: shown.to_owned(),
            options: options.clone(),
            sentinels,
            preferred: AtomicUsize::new(0),
            current: Mutex::new(None),
            looking_up: tokio::sync::Mutex::new(()),
            epoch: watch::channel(0).0,
            watcher: Mutex::new(None),
        });
        let task = tokio::spawn(watch_switches(Arc::downgrade(&master)));
        *master
            .watcher
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(dlock_spi::TaskGuard::new(task));
        master
    }

    fn current(&self) -> std::sync::MutexGuard<'_, Option<Current>> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The epoch of the connection in use (0 before the first).
    pub(crate) fn epoch(&self) -> u64 {
        *self.epoch.borrow()
    }

    /// Epoch changes, for the release-notice connection.
    pub(crate) fn epochs(&self) -> watch::Receiver<u64> {
        self.epoch.subscribe()
    }

    /// The connection to the master and its epoch; looks the master up if there is
    /// none (bounded by the connect timeout per sentinel asked).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped mid-lookup, nothing is kept and the next call looks again.
    pub(crate) async fn connection(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        if let Some(c) = self.current().as_ref() {
            return Ok((c.epoch, c.conn.clone()));
        }
        let _one = self.looking_up.lock().await;
        if let Some(c) = self.current().as_ref() {
            return Ok((c.epoch, c.conn.clone()));
        }
        let (client, conn) = self.look_up().await?;
        Ok((self.install(client, conn.clone()), conn))
    }

    /// Makes `conn` (to `client`'s server) the connection in use, under a new
    /// epoch, and announces the epoch. Called with `looking_up` held.
    fn install(&self, client: redis::Client, conn: MultiplexedConnection) -> u64 {
        let epoch = self.epoch() + 1;
        *self.current() = Some(Current {
            epoch,
            client,
            conn,
        });
        self.epoch.send_replace(epoch);
        epoch
    }

    /// A client for the master (for pub/sub and scans), and the epoch it belongs to.
    pub(crate) async fn client(&self) -> RedisResult<(u64, redis::Client)> {
        self.connection().await?;
        self.current()
            .as_ref()
            .map(|c| (c.epoch, c.client.clone()))
            .ok_or_else(|| failed("the Redis master was lost again while connecting".into()))
    }

    /// Drops the connection of `epoch` if it is still the one in use.
    pub(crate) fn forget(&self, epoch: u64) {
        let mut current = self.current();
        if current.as_ref().is_some_and(|c| c.epoch == epoch) {
            *current = None;
        }
    }

    /// Follows a `+switch-master` announcement to `host:port` (confirmed with
    /// `ROLE`), rather than asking the sentinels again (one cut off from the
    /// majority could still name the old master). Falls back to a lookup.
    async fn follow(&self, host: String, port: u16) {
        let _one = self.looking_up.lock().await;
        *self.current() = None;
        let found = match self.connect_master(host, port).await {
            Ok(found) => Ok(found),
            Err(_) => self.look_up().await,
        };
        match found {
            Ok((client, conn)) => {
                self.install(client, conn);
            }
            Err(e) => {
                tracing::debug!(error = %e, "dlock-redis: the new master is not reachable yet; the next command looks again");
            }
        }
    }

    /// Checks that the master connection in use answers (`PING` within the
    /// connect timeout); forgets it if not, so the next command looks the master up
    /// rather than waiting on a dead one.
    async fn check_alive(&self) {
        let Some((epoch, mut conn)) = self.current().as_ref().map(|c| (c.epoch, c.conn.clone()))
        else {
            return;
        };
        let limit = self.options.connect_timeout;
        let pong: RedisResult<String> =
            bounded(limit, redis::cmd("PING").query_async(&mut conn)).await;
        if let Err(e) = pong {
            tracing::debug!(error = %e, "dlock-redis: the Redis master does not answer; looking it up again");
            self.forget(epoch);
        }
    }

    /// Runs `cmd` on the master. A lost connection or a demoted master drops the
    /// connection (the next call looks the master up); `READONLY` (the command wrote
    /// nothing) is retried once on the master found then.
    pub(crate) async fn query<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> RedisResult<T> {
        let mut retried = false;
        loop {
            let (epoch, mut conn) = self.connection().await?;
            match cmd.query_async(&mut conn).await {
                Err(e) if lost_master(&e) => {
                    self.forget(epoch);
                    let readonly = matches!(
                        e.kind(),
                        redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
                    );
                    if readonly && !retried {
                        retried = true;
                        continue;
                    }
                    return Err(e);
                }
                result => return result,
            }
        }
    }

    /// Loads `script` on the master.
    pub(crate) async fn load(&self, script: &redis::ScriptInvocation<'_>) -> RedisResult<String> {
        let (epoch, mut conn) = self.connection().await?;
        let loaded = script.load_async(&mut conn).await;
        if let Err(e) = &loaded {
            if lost_master(e) {
                self.forget(epoch);
            }
        }
        loaded
    }

    /// Asks the sentinels, the one that answered last first, for the master; the
    /// first address whose server says it is master wins.
    async fn look_up(&self) -> RedisResult<(redis::Client, MultiplexedConnection)> {
        let n = self.sentinels.len();
        let first = self.preferred.load(Ordering::Relaxed) % n.max(1);
        let mut errors = Vec::new();
        for i in 0..n {
            let at = (first + i) % n;
            match self.ask(&self.sentinels[at]).await {
                Ok(found) => {
                    self.preferred.store(at, Ordering::Relaxed);
                    return Ok(found);
                }
                Err(e) => errors.push(format!("{}: {e}", self.sentinel_names[at])),
            }
        }
        Err(failed(format!(
            "no sentinel named a reachable master {:?}: {}",
            self.name,
            errors.join("; ")
        )))
    }

    async fn ask(
        &self,
        sentinel: &redis::Client,
    ) -> RedisResult<(redis::Client, MultiplexedConnection)> {
        let limit = self.options.connect_timeout;
        let mut s = bounded(
            limit,
            sentinel.get_multiplexed_async_connection_with_config(&connection_config(limit)),
        )
        .await?;
        let addr: Option<(String, u16)> = bounded(
            limit,
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(&self.name)
                .query_async(&mut s),
        )
        .await?;
        let Some((host, port)) = addr else {
            return Err(failed(format!(
                "it monitors no master named {:?}",
                self.name
            )));
        };
        self.connect_master(host, port).await
    }

    /// A connection to `host:port`, once `ROLE` there says `master`.
    async fn connect_master(
        &self,
        host: String,
        port: u16,
    ) -> RedisResult<(redis::Client, MultiplexedConnection)> {
        let limit = self.options.connect_timeout;
        let client = self
            .nodes
            .open(&host, port, &self.shown, &self.options)
            .map_err(|e| failed(e.to_string()))?;
        let mut conn = bounded(
            limit,
            client.get_multiplexed_async_connection_with_config(&connection_config(limit)),
        )
        .await?;
        let role: Vec<Value> = bounded(limit, redis::cmd("ROLE").query_async(&mut conn)).await?;
        match role.first() {
            Some(Value::BulkString(r)) if r == b"master" => Ok((client, conn)),
            Some(Value::SimpleString(r)) if r == "master" => Ok((client, conn)),
            _ => Err(failed(format!(
                "it names {host}:{port}, which is not a master (yet)"
            ))),
        }
    }
}

/// How long the switch watcher waits before trying the next sentinel.
const WATCH_RETRY: Backoff =
    Backoff::constant(Duration::from_millis(500)).with_jitter(Jitter::None);
/// How often the watcher checks that the master connection answers.
const HEALTH_EVERY: Duration = Duration::from_secs(1);
/// How long the watcher keeps one subscription before subscribing again (a
/// sentinel that died silently leaves it deaf at most this long).
const RESUBSCRIBE_EVERY: Duration = Duration::from_secs(30);

/// Subscribes to `+switch-master` on one sentinel at a time (the next one when a
/// connection fails, and again every [`RESUBSCRIBE_EVERY`]), pausing
/// [`WATCH_RETRY`] between rounds; an announcement for this master moves the
/// connection to the announced one at once, so the release notices follow too.
/// Every [`HEALTH_EVERY`] it checks that the master answers. A switch announced
/// while no sentinel was watched is noticed by that check (the old master demoted
/// answers `READONLY`, or not at all).
async fn watch_switches(master: Weak<SentinelMaster>) {
    Resubscribe::new(WATCH_RETRY)
        .run(SwitchWatch { master, round: 0 }, None)
        .await;
}

/// The `+switch-master` subscription, on sentinel `round` (modulo their number)
/// after the preferred one.
struct SwitchWatch {
    master: Weak<SentinelMaster>,
    round: usize,
}

impl Subscription for SwitchWatch {
    type Live = (redis::aio::PubSub, String);

    async fn subscribe(&mut self) -> Option<Self::Live> {
        let m = self.master.upgrade()?;
        let at = (m.preferred.load(Ordering::Relaxed) + self.round) % m.sentinels.len().max(1);
        self.round += 1;
        let sentinel = m.sentinels.get(at)?.clone();
        let (name, limit) = (m.name.clone(), m.options.connect_timeout);
        drop(m);
        let subscribed = async {
            let mut p = bounded(limit, sentinel.get_async_pubsub()).await?;
            bounded(limit, p.subscribe("+switch-master")).await?;
            RedisResult::Ok(p)
        };
        match subscribed.await {
            Ok(p) => Some((p, name)),
            Err(e) => {
                tracing::debug!(error = %e, "dlock-redis: cannot watch a sentinel for master switches; trying the next");
                None
            }
        }
    }

    async fn drain(&mut self, (mut p, name): Self::Live) -> Drained {
        let mut stream = p.on_message();
        let resubscribe = tokio::time::sleep(RESUBSCRIBE_EVERY);
        tokio::pin!(resubscribe);
        let mut health = tokio::time::interval(HEALTH_EVERY);
        loop {
            let msg = tokio::select! {
                msg = stream.next() => match msg {
                    Some(msg) => msg,
                    None => return Drained::Broke,
                },
                _ = health.tick() => {
                    let Some(m) = self.master.upgrade() else { return Drained::Done };
                    m.check_alive().await;
                    continue;
                }
                () = &mut resubscribe => return Drained::Broke,
            };
            let payload = String::from_utf8_lossy(msg.get_payload_bytes()).into_owned();
            // `<name> <old ip> <old port> <new ip> <new port>`
            let parts: Vec<&str> = payload.split(' ').collect();
            if parts.first() != Some(&name.as_str()) {
                continue;
            }
            let Some(m) = self.master.upgrade() else {
                return Drained::Done;
            };
            tracing::info!(master = %name, switch = %payload, "dlock-redis: Sentinel switched the master; following it");
            match (parts.get(3), parts.get(4).and_then(|p| p.parse().ok())) {
                (Some(host), Some(port)) => m.follow((*host).to_owned(), port).await,
                _ => {
                    let epoch = m.epoch();
                    m.forget(epoch);
                }
            }
        }
    }

    /// A switch missed meanwhile is caught by the health check.
    fn resubscribed(&mut self) {}

    fn wanted(&self) -> bool {
        self.master.strong_count() > 0
    }
}
