//! A statement that runs to its end whatever happens to the caller's future.
//!
//! A statement cut off mid-flight is not undone: the database may still run it, and
//! a grant it commits for a caller that is gone stays held until its lease ends. So
//! each grant, release and renewal runs to its end.
//!
//! A single statement ([`Where::Here`]) runs in the caller's own task while the
//! caller waits — no task is spawned and no other worker woken on the common path —
//! and only a caller dropped before the end hands the rest of it to a task of its
//! own, followed by what must be done with an answer nobody takes (a grant is given
//! back). A transaction ([`Where::Apart`]) runs in a task of its own from the start:
//! a caller that kept its future without polling it would otherwise hold the
//! transaction, and the row locks it took, open.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use dlock_spi::{Error, ErrorKind, LockMode, Result};
use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// Where an operation runs ([`run_to_end`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Where {
    /// In the caller's task; the rest in a task of its own if the caller leaves.
    /// For single statements: sent, one runs to its end on the server whether or
    /// not its client polls on.
    Here,
    /// In a task of its own from the start. For transactions: one left open between
    /// its statements would hold its row locks.
    Apart,
}

/// `op`, run to its end whatever happens to the caller: where `place` says; a caller
/// gone before the end leaves the rest of `op` running, and then `orphaned` with its
/// output. An `op` that panics (or a runtime shutting down under it) ends with an
/// error, as a task that panicked does.
///
/// # Cancel safety
///
/// Cancel-safe: that is what it is for.
pub(crate) async fn run_to_end<F, G, H>(place: Where, op: F, orphaned: G) -> Result<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
    G: FnOnce(F::Output) -> H + Send + 'static,
    H: Future<Output = ()> + Send + 'static,
{
    let answer = match place {
        Where::Here => Here::new(op, orphaned).await.ok(),
        Where::Apart => {
            let (answer, answered) = oneshot::channel();
            tokio::spawn(async move {
                if let Err(unheard) = answer.send(op.await) {
                    orphaned(unheard).await;
                }
            });
            answered.await.ok()
        }
    };
    answer.ok_or_else(ended_without_an_answer)
}

fn ended_without_an_answer() -> Error {
    Error::new(
        ErrorKind::Backend,
        "the statement ended without an answer (it panicked, or the runtime is shutting down)",
    )
}

/// [`Where::Here`]: `op` polled in the caller's task (`Err` if it panicked).
struct Here<F: Future> {
    /// `None` once it has ended (or panicked).
    op: Option<Pin<Box<F>>>,
    /// Spawns the rest of `op` on the runtime given, followed by `orphaned`.
    orphaned: Option<Orphaned<F>>,
    /// The runtime the op was first polled on: the rest runs there if the caller
    /// is dropped, wherever that happens.
    runtime: Option<Handle>,
}

type Orphaned<F> = Box<dyn FnOnce(Pin<Box<F>>, &Handle) + Send>;

impl<F: Future> Here<F> {
    fn new<G, H>(op: F, orphaned: G) -> Self
    where
        F: Send + 'static,
        F::Output: Send + 'static,
        G: FnOnce(F::Output) -> H + Send + 'static,
        H: Future<Output = ()> + Send + 'static,
    {
        Here {
            op: Some(Box::pin(op)),
            orphaned: Some(Box::new(move |op: Pin<Box<F>>, runtime: &Handle| {
                drop(runtime.spawn(async move { orphaned(op.await).await }));
            })),
            runtime: None,
        }
    }
}

// Neither field is ever pinned in place: `op` is boxed, the others only moved.
impl<F: Future> Unpin for Here<F> {}

impl<F: Future> Future for Here<F> {
    type Output = std::result::Result<F::Output, Panicked>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        // Out while polled: an op that panics is dropped by the unwinding, never
        // handed to a task to be resumed.
        let Some(mut op) = this.op.take() else {
            return Poll::Ready(Err(Panicked));
        };
        if this.runtime.is_none() {
            this.runtime = Handle::try_current().ok();
        }
        let polled =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| op.as_mut().poll(cx)));
        match polled {
            Ok(Poll::Pending) => {
                this.op = Some(op);
                Poll::Pending
            }
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Err(_) => Poll::Ready(Err(Panicked)),
        }
    }
}

/// The op panicked (or was polled after its end).
struct Panicked;

impl<F: Future> Drop for Here<F> {
    fn drop(&mut self) {
        if let (Some(op), Some(orphaned), Some(runtime)) =
            (self.op.take(), self.orphaned.take(), self.runtime.take())
        {
            orphaned(op, &runtime);
        }
    }
}

/// Runs `op` to its end, whatever happens to the caller's future ([`run_to_end`]),
/// where `place` says. Releases and renewals run transactions (shared mode): cut off
/// between `BEGIN` and `COMMIT`/`ROLLBACK` — a `BEGIN` whose future is dropped in
/// flight leaves sqlx nothing to roll back — the pooled connection would stay inside
/// the transaction, and a grant later run on that connection would be seen by its
/// own client only and undone when the connection dies, while another client takes
/// the same lock.
pub(crate) async fn detached<T: Send + 'static>(
    place: Where,
    op: impl std::future::Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    run_to_end(place, op, |_| async {}).await?
}

/// Where a statement of `mode` runs ([`run_to_end`]): a shared hold's grant, release
/// and renewal are transactions.
pub(crate) fn statement_place(mode: LockMode) -> Where {
    match mode {
        LockMode::Shared => Where::Apart,
        LockMode::Exclusive | LockMode::Permits(_) => Where::Here,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn a_caller_that_waits_gets_the_output_and_nothing_follows() {
        for place in [Where::Here, Where::Apart] {
            let followed = Arc::new(AtomicBool::new(false));
            let f = Arc::clone(&followed);
            let out = run_to_end(place, async { 7 }, move |_: i32| async move {
                f.store(true, Ordering::SeqCst);
            })
            .await;
            assert_eq!(out.ok(), Some(7), "{place:?}");
            tokio::task::yield_now().await;
            assert!(!followed.load(Ordering::SeqCst), "{place:?}");
        }
    }

    #[tokio::test]
    async fn a_dropped_caller_leaves_the_rest_running_and_then_the_follow_up() {
        for place in [Where::Here, Where::Apart] {
            let (went_on, mut ended) = tokio::sync::mpsc::channel(1);
            let (release, released) = oneshot::channel::<()>();
            let op = async move {
                let _ = released.await;
                5
            };
            let cut = tokio::time::timeout(
                Duration::from_millis(10),
                run_to_end(place, op, move |out: i32| async move {
                    let _ = went_on.send(out).await;
                }),
            )
            .await;
            assert!(cut.is_err(), "{place:?}: the op was still waiting");
            release
                .send(())
                .expect("the op runs on after the caller left");
            let out = tokio::time::timeout(Duration::from_secs(5), ended.recv()).await;
            assert_eq!(out.ok().flatten(), Some(5), "{place:?}");
        }
    }

    #[tokio::test]
    async fn an_op_that_panics_ends_with_an_error_and_is_not_resumed() {
        let followed = Arc::new(AtomicBool::new(false));
        let (f, g) = (Arc::clone(&followed), Arc::clone(&followed));
        let op = async move {
            tokio::task::yield_now().await;
            if g.load(Ordering::SeqCst) {
                return 0;
            }
            panic!("the op fails");
        };
        let out = run_to_end(Where::Here, op, move |_: i32| async move {
            f.store(true, Ordering::SeqCst);
        })
        .await;
        assert_eq!(
            out.map_err(|e| e.kind()).err(),
            Some(ErrorKind::Backend),
            "a panic is an error"
        );
        tokio::task::yield_now().await;
        assert!(
            !followed.load(Ordering::SeqCst),
            "nothing runs after a panic"
        );
    }
}
