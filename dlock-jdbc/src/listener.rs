//! Release notices to this process's waiters: PostgreSQL's `LISTEN` connection,
//! kept up by [`dlock_spi::Resubscribe`], or SQLite's local bus.

use std::sync::Arc;

use crate::config::JdbcOptions;
use crate::local_bus;
use crate::pool::Pool;
use crate::wakeups::Wakeups;

/// What carries release notices to a backend's waiters: the waiters' wake-ups, the
/// task that receives the notices, and (SQLite) the bus they are sent on.
pub(crate) type Listener = (
    Option<Arc<Wakeups>>,
    Option<dlock_spi::TaskGuard>,
    Option<local_bus::LocalBus>,
);

/// The pause before each try to listen again after the listener broke (waiters poll
/// meanwhile).
#[cfg(feature = "postgres")]
pub(crate) const RELISTEN_PAUSE: dlock_spi::Backoff =
    dlock_spi::Backoff::constant(std::time::Duration::from_millis(500))
        .with_jitter(dlock_spi::Jitter::None);

/// On PostgreSQL, one listener connection per backend carries release notices to
/// local waiters, on a session of its own beside the statements' pool (see
/// `listen`); on SQLite (Unix), the local bus of the database file
/// ([`local_bus`]). Elsewhere (or if listening fails) waiters just poll.
pub(crate) async fn start_listener(pool: &Pool, options: &JdbcOptions) -> Listener {
    #[cfg(all(feature = "sqlite", unix))]
    #[allow(irrefutable_let_patterns)] // SQLite may be the only database built in
    if let (Pool::Sqlite(p), true) = (pool, options.local_notices) {
        let wakeups = Arc::new(Wakeups::default());
        let file = p.connect_options().get_filename().to_path_buf();
        return match local_bus::LocalBus::open(&file, &options.table_prefix, Arc::clone(&wakeups)) {
            // A backend that cannot receive notices has no waiters to wake: they poll.
            // (The bus's own thread receives; it ends with the bus.)
            Ok((bus, true)) => (Some(wakeups), None, Some(bus)),
            Ok((bus, false)) => (None, None, Some(bus)),
            Err(e) => {
                tracing::warn!(error = %e, file = %file.display(), "dlock-jdbc: no release notices beside the SQLite file; waiters will poll only");
                (None, None, None)
            }
        };
    }
    #[cfg(feature = "postgres")]
    #[allow(irrefutable_let_patterns)] // PostgreSQL may be the only database built in
    if let Pool::Postgres(pg) = pool {
        let channel = format!("{}release", options.table_prefix);
        let change = format!("{}change", options.table_prefix);
        let channels = [channel.clone(), change];
        let listener = match listen(pg, options.acquire_timeout, &channels).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "dlock-jdbc: LISTEN failed; waiters will poll only");
                return (None, None, None);
            }
        };
        let wakeups = Arc::new(Wakeups::default());
        let relisten = Relisten {
            statements: pg.clone(),
            timeout: options.acquire_timeout,
            channels,
            target: Arc::clone(&wakeups),
        };
        let task = tokio::spawn(async move {
            RELISTEN.run(relisten, Some(listener)).await;
        });
        return (Some(wakeups), Some(dlock_spi::TaskGuard::new(task)), None);
    }
    let _ = (pool, options);
    (None, None, None)
}

/// The PostgreSQL listener, kept up by [`RELISTEN`]: notices wake waiters and
/// followers; when its connection fails, a new listener (its connection given back
/// now, not after the outage), and every waiter re-checks. sqlx's own reconnect is
/// not relied on: `try_recv` would reconnect and then wait for the next notice, the
/// missed ones never made up for — or, its connection reset rather than closed,
/// keep failing on it.
#[cfg(feature = "postgres")]
pub(crate) struct Relisten {
    statements: sqlx::PgPool,
    timeout: std::time::Duration,
    channels: [String; 2],
    target: Arc<Wakeups>,
}

#[cfg(feature = "postgres")]
impl dlock_spi::Subscription for Relisten {
    type Live = sqlx::postgres::PgListener;

    async fn subscribe(&mut self) -> Option<sqlx::postgres::PgListener> {
        match listen(&self.statements, self.timeout, &self.channels).await {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::debug!(error = %e, "dlock-jdbc: LISTEN failed again");
                None
            }
        }
    }

    async fn drain(&mut self, mut listener: sqlx::postgres::PgListener) -> dlock_spi::Drained {
        loop {
            // `try_recv` answers `None` when the connection dropped, once it has
            // connected and listened again, and an error when that failed.
            match listener.try_recv().await {
                Ok(Some(note)) => {
                    if note.channel() == self.channels[0] {
                        let notice = crate::wakeups::ReleaseNotice::parse(note.payload());
                        self.target.wake(&notice);
                        self.target.changed(notice.name);
                    } else {
                        self.target.changed(note.payload());
                    }
                }
                // Listening again (sqlx reconnects before it answers): notices sent
                // meanwhile are lost.
                Ok(None) => self.target.notices_missed(),
                Err(e) => {
                    tracing::debug!(error = %e, "dlock-jdbc: release listener interrupted");
                    return dlock_spi::Drained::Broke;
                }
            }
        }
    }

    fn resubscribed(&mut self) {
        self.target.notices_missed();
    }
}

/// How the PostgreSQL listener listens again: 500 ms after it failed and between
/// failed tries (polling covers the gap).
#[cfg(feature = "postgres")]
pub(crate) const RELISTEN: dlock_spi::Resubscribe = dlock_spi::Resubscribe::new(RELISTEN_PAUSE);

/// A session listening on `channels`, with the connect options `statements` (the
/// statements' pool) has now — an application may change them, e.g. rotating
/// credentials — in a pool of its own: taken from `statements`, it would hold one
/// of its connections for as long as it listens.
#[cfg(feature = "postgres")]
pub(crate) async fn listen(
    statements: &sqlx::PgPool,
    timeout: std::time::Duration,
    channels: &[String],
) -> std::result::Result<sqlx::postgres::PgListener, sqlx::Error> {
    let own = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(timeout)
        .connect_lazy_with((*statements.connect_options()).clone());
    let mut listener = sqlx::postgres::PgListener::connect_with(&own).await?;
    listener
        .listen_all(channels.iter().map(String::as_str))
        .await?;
    Ok(listener)
}
