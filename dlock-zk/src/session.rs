//! The ZooKeeper session every hold of a backend lives in, and its replacement when
//! it ends.
//!
//! A supervisor task follows the client's connection state and publishes a
//! [`SessionStatus`]:
//!
//! * connection down → [`SessionPhase::Suspended`] at once;
//! * still down 0.4 × the negotiated session timeout later, or the server reports the
//!   session expired → [`SessionPhase::Lost`], and a new session is opened.
//!
//! Why 0.4: the client notices a dead connection when nothing arrived for its
//! connection timeout (2/5 of the session timeout) plus at most one tick (1/20), so
//! the server last heard from it no earlier than 0.45 × timeout (plus a round trip)
//! before the client noticed, and cannot expire the session — and hand its locks to
//! others — sooner than 0.55 × timeout (minus a round trip) after. Declaring the loss
//! at 0.4 × timeout leaves 0.15 × timeout (1.5 s at the default 10 s) for round trips
//! and a late timer on a busy machine, provided the client's and the server's clocks
//! run at the same rate. A session judged lost is abandoned even if the connection
//! comes back: its client is dropped, which closes the session and deletes its nodes.

use std::sync::{Arc, PoisonError, RwLock, Weak};
use std::time::{Duration, Instant};

use dlock_spi::{Backoff, Drained, Error, ErrorKind, Jitter, Resubscribe, Result, Subscription};
use tokio::sync::watch;
use zookeeper_client::{Client, SessionState};

use crate::error::{connection_failure, map_zk};

/// How a lost session is replaced: a new one at once, then 50 ms doubling to 2 s
/// between failed tries (from 50 ms again for the next loss).
const NEW_SESSION: Resubscribe = Resubscribe::new(
    Backoff::exponential(Duration::from_millis(50), Duration::from_secs(2))
        .with_jitter(Jitter::None),
);

/// Identifies one session of this backend (ZooKeeper's session id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct SessionId(pub(crate) i64);

/// Where the current session stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SessionPhase {
    Connected,
    Suspended,
    Lost,
}

/// The current session and its phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SessionStatus {
    pub(crate) id: SessionId,
    pub(crate) phase: SessionPhase,
}

/// How to open a session.
#[derive(Debug, Clone)]
pub(crate) struct ConnectSpec {
    /// `host:port,host:port`.
    pub(crate) hosts: String,
    pub(crate) session_timeout: Duration,
    /// Digest credentials `user:password`.
    pub(crate) digest: Option<String>,
    /// The application's connector (its TLS, authentication and timeouts), used
    /// instead of one built from `session_timeout`.
    pub(crate) connector: Option<zookeeper_client::Connector>,
    /// TLS for a connector dlock builds (`zks://`), made once by [`tls_config`].
    pub(crate) tls: Option<TlsConfig>,
}

/// What a TLS connection is made with: zookeeper-client's options (whose `Debug`
/// leaves the client key out); without the `tls` feature there is none.
#[cfg(feature = "tls")]
pub(crate) type TlsConfig = zookeeper_client::TlsOptions;
/// What a TLS connection is made with; without the `tls` feature there is none.
#[cfg(not(feature = "tls"))]
pub(crate) type TlsConfig = std::convert::Infallible;

/// The TLS of a `zks://` URL (or [`crate::ZkOptions::tls`]): the servers verified
/// against `ca` (PEM), `identity` presented to servers that require a client
/// certificate. Checked here, once, before any connection is tried: the `tls`
/// feature, a process crypto provider, PEM that parses — a `Config` error saying
/// what to do if not.
#[cfg(feature = "tls")]
pub(crate) fn tls_config(
    ca: &[u8],
    identity: Option<&dlock_spi::TlsIdentity>,
) -> Result<TlsConfig> {
    use dlock_spi::{Error, ErrorKind};
    let config = |what: String| Error::new(ErrorKind::Config, what);
    // zookeeper-client builds its rustls config from the process's default crypto
    // provider and takes no other. Choosing it is the application's call; dlock
    // installs none, and refuses rather than let rustls panic.
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        return Err(config(
            "ZooKeeper over TLS (zks://) needs a rustls crypto provider installed for this process (the zookeeper-client crate uses the process default and takes no other); \
             install one before connecting, early in main: rustls::crypto::ring::default_provider().install_default()"
                .to_owned(),
        ));
    }
    let text = |pem: &[u8], what: &str| {
        std::str::from_utf8(pem)
            .map(str::to_owned)
            .map_err(|_| config(format!("the {what} is not PEM text")))
    };
    let options = zookeeper_client::TlsOptions::new()
        .with_pem_ca(&text(ca, "TLS CA (tls_ca)")?)
        .map_err(|e| config(format!("the TLS CA (tls_ca) is not usable PEM: {e}")))?;
    let Some(id) = identity else {
        return Ok(options);
    };
    options
        .with_pem_identity(
            &text(id.cert_pem(), "client certificate (tls_cert)")?,
            &text(id.key_pem(), "client key (tls_key)")?,
        )
        .map_err(|e| {
            config(format!(
                "the client certificate and key (tls_cert, tls_key) are not usable PEM: {e}"
            ))
        })
}

/// Without the `tls` feature there is no TLS to connect with.
#[cfg(not(feature = "tls"))]
pub(crate) fn tls_config(_: &[u8], _: Option<&dlock_spi::TlsIdentity>) -> Result<TlsConfig> {
    Err(dlock_spi::Error::new(
        dlock_spi::ErrorKind::Config,
        "ZooKeeper over TLS (zks://) needs dlock-zk's tls feature (dlock-api's zk-tls)",
    ))
}

impl ConnectSpec {
    pub(crate) async fn connect(&self) -> Result<Client> {
        // Try every host once and fail, rather than cycling until the session timeout:
        // an unreachable ensemble is reported at once; the supervisor retries itself.
        let mut connector = match &self.connector {
            Some(connector) => connector.clone(),
            None => Client::connector().with_session_timeout(self.session_timeout),
        }
        .with_fail_eagerly();
        if let Some(digest) = &self.digest {
            connector = connector.with_auth("digest", digest.as_bytes());
        }
        let connected = match &self.tls {
            #[cfg(feature = "tls")]
            Some(tls) => {
                connector
                    .with_tls(tls.clone())
                    .secure_connect(&self.hosts)
                    .await
            }
            #[cfg(not(feature = "tls"))]
            Some(never) => match *never {},
            None => connector.connect(&self.hosts).await,
        };
        connected.map_err(|e| {
            // The client reports a failed TLS handshake as an unreachable server.
            let handshake = self.tls.is_some()
                && (crate::error::connection_failure(&e)
                    || matches!(e, zookeeper_client::Error::NoHosts | zookeeper_client::Error::Timeout));
            let err = map_zk(e, "connect");
            if !handshake {
                return err;
            }
            let hint = format!(
                "{} (over TLS a failed handshake reads the same: check that tls_ca signed the servers' certificates, which must name the address connected to, and that the servers accept the client's certificate, tls_cert)",
                err.message()
            );
            let mut hinted = dlock_spi::Error::new(err.kind(), hint).set_retryable(err.is_retryable());
            for (key, value) in err.context() {
                hinted = hinted.with_context(key, value);
            }
            hinted
        })
    }
}

/// One live session.
pub(crate) struct Session {
    pub(crate) client: Client,
}

impl Session {
    pub(crate) fn id(&self) -> SessionId {
        SessionId(self.client.session_id().0)
    }
}

/// The backend's current session, replaced when it is lost.
pub(crate) struct Sessions {
    spec: ConnectSpec,
    current: RwLock<Arc<Session>>,
    status: watch::Sender<SessionStatus>,
}

impl Sessions {
    /// Opens the first session and starts the supervisor; the supervisor stops when
    /// `shutdown` is dropped.
    pub(crate) async fn open(
        spec: ConnectSpec,
        shutdown: watch::Receiver<()>,
    ) -> Result<Arc<Self>> {
        let client = spec.connect().await?;
        let session = Arc::new(Session { client });
        let status = watch::Sender::new(SessionStatus {
            id: session.id(),
            phase: SessionPhase::Connected,
        });
        let sessions = Arc::new(Sessions {
            spec,
            current: RwLock::new(session),
            status,
        });
        tokio::spawn(supervise(Arc::downgrade(&sessions), shutdown));
        Ok(sessions)
    }

    /// The session new operations go to.
    pub(crate) fn current(&self) -> Arc<Session> {
        Arc::clone(&self.current.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// The latest status.
    pub(crate) fn status(&self) -> SessionStatus {
        *self.status.borrow()
    }

    /// Waits (until `deadline`) for a status `ready` accepts; `None` if none came.
    async fn wait_until(
        &self,
        deadline: Instant,
        ready: impl FnMut(&SessionStatus) -> bool,
    ) -> Option<SessionStatus> {
        let mut status = self.status.subscribe();
        let waited = tokio::time::timeout_at(deadline.into(), status.wait_for(ready)).await;
        // Copied out before `status` goes: the borrow guard must not outlive it.
        let seen = waited.ok()?.ok().map(|s| *s);
        #[allow(clippy::let_and_return)]
        seen
    }

    /// The session to use: the current one unless it is lost (or is `ended`), else
    /// its replacement, waited for until `deadline` (`None`: not at all).
    pub(crate) async fn usable(
        &self,
        ended: Option<SessionId>,
        deadline: Option<Instant>,
    ) -> Result<Arc<Session>> {
        let ready = |s: &SessionStatus| s.phase != SessionPhase::Lost && Some(s.id) != ended;
        if ready(&self.status()) {
            return Ok(self.current());
        }
        match self
            .wait_until(deadline.unwrap_or_else(Instant::now), ready)
            .await
        {
            Some(_) => Ok(self.current()),
            None => Err(Error::new(
                ErrorKind::Backend,
                "no ZooKeeper session: the last one was lost and a new one is not open yet; retry",
            )
            .set_retryable(true)
            .with_context("backend", "zookeeper")),
        }
    }

    /// Waits until `session` is connected again; false if it ended (or was given up
    /// on) instead, or `deadline` passed first.
    async fn reconnected(&self, session: &Session, deadline: Instant) -> bool {
        let id = session.id();
        self.wait_until(deadline, |s| {
            s.id != id || s.phase != SessionPhase::Suspended
        })
        .await
        .is_some_and(|s| s.id == id && s.phase == SessionPhase::Connected)
    }

    /// Whether a request on `session` that failed with `err` can be sent again: the
    /// connection broke under it (a blip) and came back, the session living on,
    /// before `deadline` (`None`, or passed: not waited for).
    pub(crate) async fn back_from_blip(
        &self,
        session: &Session,
        err: &zookeeper_client::Error,
        deadline: Option<Instant>,
    ) -> bool {
        match deadline {
            Some(deadline) if connection_failure(err) && Instant::now() < deadline => {
                self.reconnected(session, deadline).await
            }
            _ => false,
        }
    }

    /// Runs `op` on `session` — a request met by a blip is sent again once the
    /// connection is back, the session living on — until `until`; every try waits
    /// no longer than that (one sent while the connection is down waits for it).
    /// Its answer, or the last error. `None`: sent once, as a plain request.
    pub(crate) async fn across_blips<T, F, Fut>(
        &self,
        session: &Session,
        until: Option<Instant>,
        mut op: F,
    ) -> Result<T, zookeeper_client::Error>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, zookeeper_client::Error>>,
    {
        let Some(until) = until else {
            return op().await;
        };
        loop {
            let answered = tokio::time::timeout_at(until.into(), op())
                .await
                .unwrap_or(Err(zookeeper_client::Error::ConnectionLoss));
            match answered {
                Err(err) if self.back_from_blip(session, &err, Some(until)).await => {}
                answered => return answered,
            }
        }
    }

    /// Deletes a node we no longer want (an abandoned contender) in the background.
    /// If the connection is down, the delete is sent again once it is back; if the
    /// session ends instead, the server removes the (ephemeral) node itself.
    pub(crate) fn delete_later(self: &Arc<Self>, session: &Arc<Session>, path: String) {
        let sessions = Arc::downgrade(self);
        let session = Arc::clone(session);
        // (A copy of the path for the warning: a rare path, a cancelled contender.)
        let node = path.clone();
        let what = format_args!("abandoned contender node {node}");
        dlock_spi::spawn_cleanup(&what, None, async move {
            let Some(sessions) = sessions.upgrade() else {
                return;
            };
            let until = Instant::now() + session.client.session_timeout();
            let deleted = sessions
                .across_blips(&session, Some(until), || session.client.delete(&path, None))
                .await;
            match deleted {
                Ok(()) | Err(zookeeper_client::Error::NoNode) => {}
                // Still cut off: the session ends, and the node with it.
                Err(err) if connection_failure(&err) => {}
                Err(err) => {
                    tracing::warn!(node = %path, error = %err, "dlock-zk: could not delete an abandoned contender node; it goes with the session");
                }
            }
        });
    }

    /// Whether `session` has ended (expired, closed, or given up on).
    pub(crate) fn has_ended(&self, session: &Session) -> bool {
        let status = self.status();
        session.client.state().is_terminated()
            || status.id != session.id()
            || status.phase == SessionPhase::Lost
    }

    /// Follows the status of the current session and its successors.
    pub(crate) fn subscribe(&self) -> watch::Receiver<SessionStatus> {
        self.status.subscribe()
    }

    fn publish(&self, id: SessionId, phase: SessionPhase) {
        self.status.send_if_modified(|status| {
            let changed = status.id != id || status.phase != phase;
            *status = SessionStatus { id, phase };
            changed
        });
    }
}

/// Follows the current session's connection state; replaces the session when lost
/// (at once, then pausing by [`NEW_SESSION`] between failed tries), until the
/// backend ends.
async fn supervise(sessions: Weak<Sessions>, mut shutdown: watch::Receiver<()>) {
    let Some(current) = sessions.upgrade().map(|s| s.current()) else {
        return;
    };
    let supervisor = Supervisor { sessions };
    tokio::select! {
        () = NEW_SESSION.run(supervisor, Some(current)) => {}
        _ = shutdown.changed() => {}
    }
}

/// The backend's session, kept up by [`NEW_SESSION`].
struct Supervisor {
    sessions: Weak<Sessions>,
}

impl Subscription for Supervisor {
    type Live = Arc<Session>;

    /// Opens a new session and makes it the current one.
    async fn subscribe(&mut self) -> Option<Arc<Session>> {
        let spec = self.sessions.upgrade()?.spec.clone();
        match spec.connect().await {
            Ok(client) => {
                let strong = self.sessions.upgrade()?;
                let session = Arc::new(Session { client });
                let id = session.id();
                *strong
                    .current
                    .write()
                    .unwrap_or_else(PoisonError::into_inner) = Arc::clone(&session);
                strong.publish(id, SessionPhase::Connected);
                tracing::info!(session = id.0, "dlock-zk: new session");
                Some(session)
            }
            Err(err) => {
                tracing::warn!(error = %err, "dlock-zk: cannot open a new session yet");
                None
            }
        }
    }

    /// Publishes the session's phase as it changes, until it is lost.
    async fn drain(&mut self, session: Arc<Session>) -> Drained {
        let grace = session.client.session_timeout() * 2 / 5;
        let mut states = session.client.state_watcher();
        let mut state = states.state();
        loop {
            let Some(strong) = self.sessions.upgrade() else {
                return Drained::Done;
            };
            let phase = match state {
                SessionState::SyncConnected | SessionState::ConnectedReadOnly => {
                    SessionPhase::Connected
                }
                SessionState::Disconnected => SessionPhase::Suspended,
                _ => SessionPhase::Lost,
            };
            strong.publish(session.id(), phase);
            drop(strong);
            if phase == SessionPhase::Lost {
                return Drained::Rearm;
            }
            let give_up = async {
                if phase == SessionPhase::Suspended {
                    tokio::time::sleep(grace).await;
                } else {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                next = states.changed() => state = next,
                () = give_up => {
                    tracing::warn!(session = session.id().0, "dlock-zk: disconnected for 0.4 × the session timeout; the session's locks are declared lost");
                    state = SessionState::Expired;
                }
            }
        }
    }

    /// The new session's phase is published as it is made current.
    fn resubscribed(&mut self) {}

    fn wanted(&self) -> bool {
        self.sessions.strong_count() > 0
    }
}
