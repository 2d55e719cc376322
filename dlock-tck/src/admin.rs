//! [`AdminTestBackend`]: the [`TestBackend`] of a backend that administers its own
//! store ([`LockAdmin`]) — what most third-party backends need, from one connect
//! function, so a backend's `tests/tck.rs` need not write the trait out.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;
use dlock_spi::{LockAdmin, LockName, LockRemoteResource, Result};

use crate::TestBackend;

/// A connect function, boxed.
type Connect<B> = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<B>> + Send>> + Send + Sync>;

/// A [`TestBackend`] made from a connect function: every [`client`](TestBackend::client)
/// is a new connection (as another process would have), one more kept as the
/// operator's, whose [`LockAdmin`] steals locks and counts what is left. The
/// backend cannot count its acquire evaluations (`acquire_attempts` is `None`).
///
/// ```no_run
/// # use std::sync::Arc;
/// # use dlock_spi::InMemoryBackend;
/// # use dlock_tck::{AdminTestBackend, TestBackend};
/// fn main() -> std::process::ExitCode {
///     dlock_tck::run("mine", || async {
///         // A store every connection shares (here dlock's in-memory reference).
///         let store = InMemoryBackend::new();
///         let backend = AdminTestBackend::open("mine", move || {
///             let store = store.clone();
///             async move { Ok(store) }
///         })
///         .await?;
///         Ok(Arc::new(backend) as Arc<dyn TestBackend>)
///     })
/// }
/// ```
pub struct AdminTestBackend<B> {
    label: &'static str,
    connect: Connect<B>,
    admin: B,
}

impl<B> AdminTestBackend<B>
where
    B: LockRemoteResource + LockAdmin + 'static,
{
    /// Connects once for the operator's client and asks it one question
    /// (`live_locks("")`), so an unreachable store fails here, before any case.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe when `connect`'s future is: nothing is kept until it answers.
    pub async fn open<F, Fut>(label: &'static str, connect: F) -> Result<Self>
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<B>> + Send + 'static,
    {
        let connect: Connect<B> = Arc::new(move || Box::pin(connect()));
        let admin = connect().await?;
        admin.live_locks("").await?;
        Ok(AdminTestBackend {
            label,
            connect,
            admin,
        })
    }
}

#[async_trait]
impl<B> TestBackend for AdminTestBackend<B>
where
    B: LockRemoteResource + LockAdmin + 'static,
{
    fn label(&self) -> &'static str {
        self.label
    }

    async fn client(&self) -> Result<Arc<dyn LockRemoteResource>> {
        Ok(Arc::new((self.connect)().await?))
    }

    async fn steal(&self, name: &LockName) -> Result<()> {
        self.admin.force_release(name).await.map(drop)
    }

    async fn live_state(&self, prefix: &str) -> Result<usize> {
        self.admin.live_locks(prefix).await
    }

    fn acquire_attempts(&self) -> Option<u64> {
        None
    }
}
