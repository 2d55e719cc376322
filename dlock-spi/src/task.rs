//! Background work a backend (or the manager) leaves running, in one place with one
//! rule each:
//!
//! * a task that must stop with its owner — a change feed's follower, a notice
//!   listener, a failover watcher — is kept as a [`TaskGuard`], which aborts it when
//!   dropped (aborting needs no runtime, so this holds on any thread);
//! * work a dropped call or guard leaves to finish — give back a grant a cancelled
//!   acquire may have made, leave a queue, revoke a lease, release a dropped guard's
//!   hold — is started by [`spawn_cleanup`]: on the runtime of the thread that drops,
//!   else on the runtime the guard was made on (when its owner kept one), else not at
//!   all, with a warning naming what is left to lapse on the server (every such
//!   state has a lease, a liveness or a session that ends it there).

use std::fmt;
use std::future::Future;

use tokio::runtime::Handle;
use tokio::task::{AbortHandle, JoinHandle};

/// A spawned task that is aborted when this guard is dropped (or [`TaskGuard::abort`]
/// is called): the task lives exactly as long as what keeps the guard.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use dlock_spi::TaskGuard;
/// let guard = TaskGuard::new(tokio::spawn(std::future::pending::<()>()));
/// assert!(!guard.is_finished());
/// let handle = guard.abort_handle();
/// drop(guard);
/// tokio::task::yield_now().await;
/// assert!(handle.is_finished());
/// # }
/// ```
pub struct TaskGuard(AbortHandle);

impl TaskGuard {
    /// Keeps `task`: it is aborted when the guard goes.
    pub fn new<T>(task: JoinHandle<T>) -> Self {
        TaskGuard(task.abort_handle())
    }

    /// Aborts the task now (it stops at its next await); dropping the guard later
    /// does nothing more.
    pub fn abort(&self) {
        self.0.abort();
    }

    /// Whether the task has ended (returned, panicked or been aborted).
    pub fn is_finished(&self) -> bool {
        self.0.is_finished()
    }

    /// Another handle that can abort the task or tell whether it ended, without
    /// keeping it alive.
    pub fn abort_handle(&self) -> AbortHandle {
        self.0.clone()
    }
}

impl Drop for TaskGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl fmt::Debug for TaskGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskGuard")
            .field("finished", &self.0.is_finished())
            .finish()
    }
}

/// Starts `work`, what a dropped call or guard leaves to finish, in the background:
/// on the current thread's runtime, else on `made_on` (the runtime its owner was
/// made on, when it kept one). Returns whether it started; when it did not (no
/// runtime to run it on: a guard dropped on a plain thread) it logs a warning that
/// `what` is left to lapse on the server — by its lease, liveness or session, which
/// every such state has.
///
/// Dropping is never blocked on `work`; a runtime that is shutting down may drop it
/// unrun, as it drops every task (the state lapses the same way).
pub fn spawn_cleanup<F>(what: &dyn fmt::Display, made_on: Option<&Handle>, work: F) -> bool
where
    F: Future<Output = ()> + Send + 'static,
{
    match Handle::try_current() {
        Ok(rt) => drop(rt.spawn(work)),
        Err(_) => match made_on {
            Some(rt) => drop(rt.spawn(work)),
            None => {
                tracing::warn!(
                    "dlock: {what} was left to lapse on the server: dropped outside a tokio runtime, with none to run it on"
                );
                return false;
            }
        },
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[tokio::test]
    async fn a_guard_aborts_its_task_when_dropped() {
        let guard = TaskGuard::new(tokio::spawn(std::future::pending::<()>()));
        let handle = guard.abort_handle();
        tokio::task::yield_now().await;
        assert!(!handle.is_finished());
        drop(guard);
        tokio::task::yield_now().await;
        assert!(handle.is_finished());
    }

    #[test]
    fn cleanup_runs_on_the_runtime_it_was_made_on_from_a_plain_thread() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        let ran = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let flag = Arc::clone(&ran);
        let started = spawn_cleanup(&"a test's cleanup", Some(rt.handle()), async move {
            flag.store(true, Ordering::SeqCst);
            let _ = tx.send(());
        });
        assert!(started);
        rx.recv_timeout(std::time::Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("the cleanup did not run: {e}"));
        assert!(ran.load(Ordering::SeqCst));
    }

    #[test]
    fn cleanup_without_a_runtime_is_not_started() {
        let started = spawn_cleanup(&"a test's cleanup", None, async {});
        assert!(!started);
    }
}
