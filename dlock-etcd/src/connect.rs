//! Connecting: a backend from an `etcd://` URL and its options.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use dlock_spi::{Error, ErrorKind, Result};
use etcd_client::{Client, ConnectOptions};
use tonic::transport::{Channel, Endpoint};

use crate::backend::{EtcdBackend, Inner};
use crate::config::{parse_url, EtcdOptions};
use crate::error::{map_etcd, map_sign_in, timed_out, transport_failure};
use crate::keepalive::KeepAlives;
use crate::keys::Keys;
use crate::resend::{resending, Repeat};

impl EtcdBackend {
    /// Connects to `etcd://host:port[,host:port…][/prefix][?timeout=5s]` and checks
    /// that the cluster answers.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, EtcdOptions::default()).await
    }

    /// Connects with `options`; what the URL sets overrides them.
    pub async fn connect_with(url: &str, options: EtcdOptions) -> Result<Self> {
        let parsed = parse_url(url, options)?;
        let options = parsed.options;
        let tls = crate::tls::client_config(&options)?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        let resends = crate::resend::budget(parsed.hosts.len());
        let mut endpoints = Vec::with_capacity(parsed.hosts.len());
        for host in &parsed.hosts {
            let endpoint = Endpoint::from_shared(format!("{scheme}://{host}"))
                .map_err(|e| {
                    Error::new(
                        ErrorKind::Config,
                        format!("etcd URL: {host:?} is not a host:port"),
                    )
                    .with_source(e)
                })?
                .connect_timeout(options.connect_timeout)
                .tcp_nodelay(true)
                // etcd refuses pings more often than every 5 s (GOAWAY
                // too_many_pings) and pings without a call in flight.
                .http2_keep_alive_interval(options.keep_alive)
                .keep_alive_timeout(Duration::from_secs(5))
                .keep_alive_while_idle(false);
            #[cfg(feature = "tls")]
            let endpoint = match &tls {
                Some(tls) => endpoint.tls_config(tls.clone()).map_err(|e| {
                    Error::new(
                        ErrorKind::Config,
                        "etcd's TLS settings were refused (a certificate or key that is not PEM?)",
                    )
                    .with_source(e)
                })?,
                None => endpoint,
            };
            endpoints.push(endpoint);
        }
        let channel = Channel::balance_list(endpoints.into_iter());
        let mut connect = ConnectOptions::new().with_require_leader(true);
        if let Some(c) = &options.credentials {
            // The token expires (etcd's --auth-token-ttl): signed in again when
            // etcd says so, and the call retried.
            connect = connect
                .with_user(c.user(), c.password.clone())
                .with_auto_token_refresh(true);
        }
        let reached = async {
            // Both steps are safe to send twice: sent again at once after a
            // transport failure, as every request is ([`Self::call`]). One deadline.
            let deadline = tokio::time::Instant::now() + options.timeout;
            // With credentials, this signs in: one round trip.
            let sign_in = || {
                let channel = etcd_client::Channel::Tonic(channel.clone());
                Client::from_channel(channel, Some(connect.clone()))
            };
            let client = resending(deadline, resends, Repeat::Safe, transport_failure, sign_in)
                .await
                .map_err(|u| {
                    u.into_error(
                        |e| map_sign_in(e, options.credentials.as_ref()),
                        || timed_out("connect"),
                    )
                })?
                .answer;
            let min_ttl = min_ttl(&client, deadline, resends, options.timeout).await?;
            Ok::<_, Error>((client, min_ttl))
        };
        let (client, min_ttl) = reached.await.map_err(|e| {
            if options.tls && options.tls_identity.is_none() && e.kind() != ErrorKind::Config {
                // Members started with --client-cert-auth close such connections
                // after the handshake, with no reason a client can read.
                e.with_context(
                    "tls",
                    "no client certificate was given: if the members require one (--client-cert-auth), give tls_cert and tls_key",
                )
            } else {
                e
            }
        })?;
        let keep_alives = KeepAlives::start(channel, options.timeout, resends);
        Ok(Self::assemble(
            client,
            &options,
            keep_alives,
            min_ttl,
            resends,
        ))
    }

    /// A backend on the application's own `client` (its endpoints, credentials,
    /// TLS and interceptors), with `options`' prefix and timeout; checks that the
    /// cluster answers.
    ///
    /// The client's connection settings are its own: `options` must not carry
    /// credentials or TLS settings (a [`ErrorKind::Config`] error says so). Each
    /// lease refresh opens a keeper stream of its own through the client, where
    /// [`connect`](Self::connect) sends every refresh on one shared stream: the
    /// same renewals, a stream opened per renewal.
    ///
    /// ```no_run
    /// # async fn demo() -> dlock_spi::Result<()> {
    /// let client = dlock_etcd::etcd_client::Client::connect(["127.0.0.1:2379"], None)
    ///     .await
    ///     .map_err(|e| dlock_spi::Error::backend(e.to_string()))?;
    /// let etcd = dlock_etcd::EtcdBackend::from_client(
    ///     client,
    ///     dlock_etcd::EtcdOptions::default().prefix("apps/orders"),
    /// )
    /// .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it leaves at most the probe's one-second lease behind, which
    /// expires by itself.
    pub async fn from_client(client: Client, options: EtcdOptions) -> Result<Self> {
        if options.credentials.is_some()
            || options.tls
            || options.tls_root_certificate.is_some()
            || options.tls_identity.is_some()
        {
            return Err(Error::new(
                ErrorKind::Config,
                "EtcdBackend::from_client: the client's credentials and TLS are its own \
                 (set them on etcd_client::ConnectOptions); leave them unset in EtcdOptions",
            ));
        }
        // The members behind the client are not known here: the budget of one.
        let resends = crate::resend::budget(1);
        let deadline = tokio::time::Instant::now() + options.timeout;
        let min_ttl = min_ttl(&client, deadline, resends, options.timeout).await?;
        let keep_alives = KeepAlives::through(client.lease_client(), options.timeout);
        Ok(Self::assemble(
            client,
            &options,
            keep_alives,
            min_ttl,
            resends,
        ))
    }

    fn assemble(
        client: Client,
        options: &EtcdOptions,
        keep_alives: KeepAlives,
        min_ttl: i64,
        resends: u32,
    ) -> Self {
        EtcdBackend {
            inner: Arc::new(Inner {
                client,
                keys: Keys::new(&options.prefix),
                keep_alives,
                timeout: options.timeout,
                min_ttl,
                attempts: AtomicU64::new(0),
                resends,
            }),
        }
    }
}

/// The cluster's shortest lease TTL in seconds (etcd raises shorter ones to 1.5
/// election timeouts), by granting a one-second lease by `deadline` and revoking
/// it: one round trip, so an unreachable cluster also fails here.
async fn min_ttl(
    client: &Client,
    deadline: tokio::time::Instant,
    resends: u32,
    timeout: Duration,
) -> Result<i64> {
    let leases = client.lease_client();
    let grant = || {
        let mut leases = leases.clone();
        async move { leases.grant(1, None).await }
    };
    let probe = resending(deadline, resends, Repeat::Safe, transport_failure, grant)
        .await
        .map_err(|u| u.into_error(|e| map_etcd(e, "connect"), || timed_out("connect")))?
        .answer;
    let _ = tokio::time::timeout(timeout, leases.clone().revoke(probe.id())).await;
    Ok(probe.ttl().max(1))
}
