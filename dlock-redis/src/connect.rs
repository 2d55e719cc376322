//! Connecting: a backend from a URL (one node, Cluster, Sentinel), or on the
//! application's client, connection manager or Cluster client; each ends in
//! [`RedisBackend::assemble`].

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use dlock_spi::{redact_url, Error, ErrorKind, Result};
use redis::aio::ConnectionManager;

use crate::backend::{Conn, Inner, RedisBackend};
use crate::config::Target;
use crate::connection::bounded;
use crate::error::config_error;
use crate::notices::{Endpoint, Notices};
use crate::scripts::Scripts;
use crate::sentinel::SentinelMaster;
use crate::RedisOptions;

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
    /// let client = dlock_redis::redis::Client::open("redis://127.0.0.1:6379")?;
    /// let config = dlock_redis::redis::aio::ConnectionManagerConfig::new().set_response_timeout(None);
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
    /// broadcasts `PUBLISH` to every node), and [`LockAdmin::live_locks`](dlock_spi::LockAdmin::live_locks) scans each
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

    /// Builds the backend on the application's clients for Redis Sentinel: one per
    /// sentinel (with the sentinels' own credentials and TLS), the master's name as
    /// they monitor it, and `data_nodes`, a client whose settings — credentials,
    /// database, protocol, TLS — open the master wherever the sentinels say it is
    /// (its own address is not used). The master is followed through failovers as
    /// with a `redis+sentinel://` URL; it must answer now.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use dlock_redis::{RedisBackend, RedisOptions};
    /// let sentinels = ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"]
    ///     .iter()
    ///     .map(|u| redis::Client::open(*u))
    ///     .collect::<Result<Vec<_>, _>>()?;
    /// let data_nodes = redis::Client::open("redis://:s3cret@any-host/2")?;
    /// let backend =
    ///     RedisBackend::from_sentinel_clients(sentinels, "orders", data_nodes, RedisOptions::default())
    ///         .await?;
    /// # let _ = backend; Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`] when `sentinels` is empty or the options carry
    /// [`RedisOptions::sentinel_auth`] (the sentinels' clients carry their
    /// credentials); a connection error when no sentinel names a reachable master
    /// within [`RedisOptions::connect_timeout`] per sentinel.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before it returns, the connections it opened close.
    pub async fn from_sentinel_clients(
        sentinels: Vec<redis::Client>,
        master: &str,
        data_nodes: redis::Client,
        options: RedisOptions,
    ) -> Result<Self> {
        if sentinels.is_empty() {
            return Err(Error::new(
                ErrorKind::Config,
                "from_sentinel_clients needs a client for at least one sentinel (three or more in production); none was given",
            ));
        }
        if options.sentinel_auth.is_some() {
            return Err(Error::new(
                ErrorKind::Config,
                "RedisOptions::sentinel_auth is for Sentinel URLs: give the sentinels' credentials to their clients instead",
            ));
        }
        let master = SentinelMaster::on_clients(
            master,
            sentinels,
            data_nodes,
            APPLICATION_SENTINEL_CLIENTS,
            &options,
        );
        master
            .connection()
            .await
            .map_err(|e| unreachable(APPLICATION_SENTINEL_CLIENTS, e))?;
        Self::assemble(
            Conn::Sentinel(master),
            Vec::new(),
            options,
            APPLICATION_SENTINEL_CLIENTS,
        )
        .await
    }

    /// The backend on its connections: checks the options, opens the notices.
    pub(crate) async fn assemble(
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
                node_groups: Default::default(),
            }),
        })
    }
}

/// How messages name a client the application gave (it has no URL to show).
pub(crate) const APPLICATION_CLIENT: &str = "the application's Redis client";

pub(crate) const APPLICATION_CLUSTER_CLIENT: &str = "the application's Redis Cluster client";

pub(crate) const APPLICATION_SENTINEL_CLIENTS: &str = "the application's Redis Sentinel clients";

pub(crate) fn replica_ack_on_cluster() -> Error {
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
pub(crate) async fn connection_manager(
    client: &redis::Client,
    options: &RedisOptions,
) -> redis::RedisResult<ConnectionManager> {
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_number_of_retries(0)
        .set_connection_timeout(Some(options.connect_timeout))
        .set_response_timeout(None);
    client.get_connection_manager_with_config(config).await
}

pub(crate) fn unreachable(url: &str, e: redis::RedisError) -> Error {
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
pub(crate) fn connect_error(e: &redis::RedisError, message: String) -> Error {
    let (kind, _, transient) = crate::error::classify(e);
    Error::new(kind, message)
        .set_retryable(transient)
        .with_context("backend", "redis")
        .with_context("op", "connect")
}
