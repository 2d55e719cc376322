//! Connecting: a backend from a URL or the application's connector; each ends in `assemble`.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use dlock_spi::{Error, Result};
use tokio::sync::watch;

use crate::acls::NodeAcls;
use crate::backend::{Inner, ZkBackend};
use crate::config::{parse_url, ZkOptions};
use crate::error::map_zk;
use crate::session::{tls_config, ConnectSpec, Sessions};

impl ZkBackend {
    /// Connects to the ensemble a `zk://` URL names, with default options for what the
    /// URL leaves out:
    /// `zk://[user:password@]host:port[,host:port…][/root][?session_timeout=10s&exclusive=mutex|rw]`.
    /// Creates the root path (default `/dlock`) if it is missing.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, ZkOptions::default()).await
    }

    /// Connects with `options`; what the URL sets overrides them.
    pub async fn connect_with(url: &str, options: ZkOptions) -> Result<Self> {
        let parsed = parse_url(url, options)?;
        // parse_url has checked that TLS is asked for with a CA, and certificates
        // only with TLS.
        let tls = match (&parsed.options.tls_root_certificate, parsed.options.tls) {
            (Some(ca), true) => Some(tls_config(ca, parsed.options.tls_identity.as_ref())?),
            _ => None,
        };
        let spec = ConnectSpec {
            hosts: parsed.hosts,
            session_timeout: parsed.options.session_timeout,
            digest: parsed.options.digest.clone(),
            connector: None,
            tls,
        };
        Self::assemble(spec, parsed.options, url).await
    }

    /// Builds the backend on the application's connector — its TLS, authentication
    /// and session timeout — for the ensemble `hosts` (`host:port,host:port`; with a
    /// chroot suffix if the application uses one). dlock opens its own sessions with
    /// it (the first now; a new one whenever a session is lost, as its holds end with
    /// their session), rather than sharing a client: a shared session would end the
    /// application's ephemeral nodes and watches along with dlock's holds, and dlock
    /// could not open the next one. [`ZkOptions::session_timeout`] does not apply
    /// (the connector has its own); with [`ZkOptions::digest`] set, dlock adds that
    /// digest authentication and creates its nodes writable by that identity only.
    ///
    /// ```no_run
    /// # async fn demo() -> dlock_spi::Result<()> {
    /// use std::time::Duration;
    /// use dlock_zk::{ZkBackend, ZkOptions};
    /// let connector = dlock_zk::zookeeper_client::Client::connector()
    ///     .with_session_timeout(Duration::from_secs(6));
    /// let backend =
    ///     ZkBackend::from_connector(connector, "127.0.0.1:2181", ZkOptions::default()).await?;
    /// # let _ = backend; Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before it returns, the session it opened closes.
    pub async fn from_connector(
        connector: zookeeper_client::Connector,
        hosts: &str,
        options: ZkOptions,
    ) -> Result<Self> {
        let spec = ConnectSpec {
            hosts: hosts.to_owned(),
            session_timeout: options.session_timeout,
            digest: options.digest.clone(),
            connector: Some(connector),
            tls: None,
        };
        let shown = format!("zk://{hosts}");
        Self::assemble(spec, options, &shown).await
    }

    /// Opens the first session, creates the root and starts the supervisor.
    async fn assemble(spec: ConnectSpec, options: ZkOptions, url: &str) -> Result<Self> {
        let (shutdown, shutdown_rx) = watch::channel(());
        let sessions = Sessions::open(spec, shutdown_rx).await.map_err(|e| {
            Error::new(
                e.kind(),
                format!(
                    "cannot open a ZooKeeper session at {}: {}",
                    dlock_spi::redact_url(url),
                    e.message()
                ),
            )
            .set_retryable(e.is_retryable())
        })?;
        let root = options.root;
        let acls = NodeAcls::new(options.digest.is_some());
        sessions
            .current()
            .client
            .mkdir(&root, &acls.root())
            .await
            .map_err(|e| map_zk(e, "create root"))?;
        Ok(ZkBackend {
            inner: Arc::new(Inner {
                sessions,
                root,
                exclusive: options.exclusive_node,
                acls,
                held: Mutex::new(HashMap::new()),
                attempts: AtomicU64::new(0),
                _shutdown: shutdown,
            }),
        })
    }
}
