//! The session mode ([`crate::JdbcMode::Session`], `dlock_mode=session`): a hold is
//! a lock of the database's own that lasts as long as a session — PostgreSQL's
//! advisory locks ([`postgres`]), MariaDB's named locks ([`mysql`]) — on a
//! connection dlock keeps for it, with fencing tokens from a sequence and loss
//! declared when the session may have ended ([`hold`]: what both share).
//!
//! Without the database features the type has no value, so the routing in
//! [`crate::backend`] needs no `cfg` of its own.
use dlock_spi::{
    AcquireRequest, AcquireResult, Capabilities, LockName, LockState, ReleaseRequest,
    ReleaseResult, RenewRequest, RenewResult, Result,
};

#[cfg(any(feature = "postgres", feature = "mysql"))]
mod hold;
#[cfg(feature = "mysql")]
pub(crate) mod mysql;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;

/// The session mode of one backend, by database.
pub(crate) enum Sessions {
    /// PostgreSQL: advisory locks.
    #[cfg(feature = "postgres")]
    Postgres(Box<postgres::Sessions>),
    /// MariaDB: named locks (`GET_LOCK`).
    #[cfg(feature = "mysql")]
    Mysql(Box<mysql::Sessions>),
}

/// Runs `$body` with `$s` bound to the database's sessions.
macro_rules! each {
    ($self:expr, $s:ident => $body:expr) => {
        match *$self {
            #[cfg(feature = "postgres")]
            Sessions::Postgres(ref $s) => $body,
            #[cfg(feature = "mysql")]
            Sessions::Mysql(ref $s) => $body,
        }
    };
}

// Without a database feature no method runs, and none reads its arguments.
#[cfg_attr(
    not(any(feature = "postgres", feature = "mysql")),
    allow(unused_variables)
)]
impl Sessions {
    pub(crate) fn capabilities(&self) -> Capabilities {
        each!(self, s => s.capabilities())
    }

    /// # Cancel safety
    ///
    /// Cancel-safe: the session a dropped call used is closed with it, and any lock
    /// it took ends with the session (the database's docs say when a blocked wait
    /// notices).
    pub(crate) async fn try_acquire(&self, req: &AcquireRequest) -> Result<AcquireResult> {
        each!(self, s => s.try_acquire(req).await)
    }

    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before the answer, the hold's session is closed, which
    /// ends the hold.
    pub(crate) async fn release(&self, req: &ReleaseRequest) -> Result<ReleaseResult> {
        each!(self, s => s.release(req).await)
    }

    /// # Cancel safety
    ///
    /// Cancel-safe: dropped mid-statement, the hold's session is closed, which ends
    /// the hold (its feed reports the loss).
    pub(crate) async fn renew(&self, req: &RenewRequest) -> Result<RenewResult> {
        each!(self, s => s.renew(req).await)
    }

    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads, on a session it closes if dropped.
    pub(crate) async fn inspect(&self, name: &LockName) -> Result<Option<LockState>> {
        each!(self, s => s.inspect(name).await)
    }

    /// # Cancel safety
    ///
    /// Cancel-safe: the sessions it ended stay ended; nothing else changes.
    pub(crate) async fn force_release(&self, name: &LockName) -> Result<usize> {
        each!(self, s => s.force_release(name).await)
    }

    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    pub(crate) async fn live_locks(&self, prefix: &str) -> Result<usize> {
        each!(self, s => s.live_locks(prefix).await)
    }

    /// # Cancel safety
    ///
    /// Cancel-safe: the sessions not yet closed close when dropped.
    pub(crate) async fn close(&self) {
        each!(self, s => s.close().await)
    }
}
