//! The bound on every backend call the chain makes, kept by one sweeper thread for
//! the process instead of a timer per call.
//!
//! Why: a tokio timer armed on each acquire and release and cleared when the answer
//! came (the wheel's insert, re-register, remove and clear, the driver's look at the
//! next expiry) was the largest cost the user API added to a backend call per cycle
//! (issue 51: ~700 instructions of an uncontended Redis cycle's ~6 300). Here a call
//! that does not answer on its first poll puts its deadline and waker in a slot
//! (one uncontended lock) and takes them out when it ends; the sweeper sleeps until
//! the earliest deadline and wakes the calls past theirs. A new deadline no earlier
//! than the sweeper's next look — the usual case: each call's is one operation
//! timeout after its start, so later than those before it — costs no wake-up.
//!
//! The sweeper is a thread of its own, not a task: it serves every runtime alike (a
//! manager shared by several, one that is not being driven, one shutting down), and
//! wakes calls through their wakers, which any thread may use. Idle, it looks once a
//! second while calls keep coming, then sleeps until the next one registers.

use std::future::Future;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

/// How long the sweeper sleeps with no call in flight while calls keep coming.
const IDLE_LOOK: Duration = Duration::from_secs(1);

/// Runs `fut` until it answers (`Some`) or `deadline` passes (`None`, and `fut` is
/// dropped). Without a sweeper (its thread could not be started) the bound is a
/// tokio timer, as before.
///
/// # Cancel safety
///
/// Cancel safe as `fut` is: dropped, its slot is given back.
pub(crate) async fn within<F: Future>(deadline: Instant, fut: F) -> Option<F::Output> {
    let Some(sweeper) = Sweeper::get() else {
        return tokio::time::timeout_at(deadline.into(), fut).await.ok();
    };
    let mut fut = std::pin::pin!(fut);
    let mut slot = SlotGuard {
        sweeper,
        index: None,
    };
    std::future::poll_fn(|cx| {
        if let Poll::Ready(answer) = fut.as_mut().poll(cx) {
            return Poll::Ready(Some(answer));
        }
        match slot.index {
            None => {
                slot.index = Some(sweeper.register(deadline, cx.waker()));
                Poll::Pending
            }
            Some(index) if sweeper.fired(index, cx.waker()) => Poll::Ready(None),
            Some(_) => Poll::Pending,
        }
    })
    .await
}

/// The process's sweeper: the calls in flight and the thread that bounds them.
struct Sweeper {
    state: Mutex<State>,
    /// Wakes the thread to look again (a deadline earlier than its next look).
    look: Condvar,
}

#[derive(Default)]
struct State {
    slots: Vec<Slot>,
    free: Vec<usize>,
    /// When the thread looks next; `None` while it sleeps until told.
    looks_at: Option<Instant>,
    /// Whether a call registered since the thread's last look.
    registered: bool,
}

enum Slot {
    Free,
    Waiting {
        deadline: Instant,
        waker: Waker,
    },
    /// Past its deadline: the call ends with a timeout when next polled.
    Fired,
}

impl Sweeper {
    /// The sweeper, its thread started on first use; `None` if it cannot be.
    fn get() -> Option<&'static Sweeper> {
        static SWEEPER: OnceLock<Option<&'static Sweeper>> = OnceLock::new();
        *SWEEPER.get_or_init(|| {
            let sweeper: &'static Sweeper = Box::leak(Box::new(Sweeper {
                state: Mutex::new(State::default()),
                look: Condvar::new(),
            }));
            std::thread::Builder::new()
                .name("dlock-deadlines".to_owned())
                .spawn(move || sweeper.run())
                .ok()
                .map(|_| sweeper)
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Puts a call's deadline in a slot, telling the thread if it would look too
    /// late; answers the slot.
    fn register(&self, deadline: Instant, waker: &Waker) -> usize {
        let mut state = self.lock();
        let slot = Slot::Waiting {
            deadline,
            waker: waker.clone(),
        };
        let index = match state.free.pop() {
            Some(index) => {
                state.slots[index] = slot;
                index
            }
            None => {
                state.slots.push(slot);
                state.slots.len() - 1
            }
        };
        state.registered = true;
        let tell = state.looks_at.is_none_or(|at| deadline < at);
        if tell {
            state.looks_at = Some(deadline);
        }
        drop(state);
        if tell {
            self.look.notify_one();
        }
        index
    }

    /// Whether the call in `index` is past its deadline; otherwise keeps `waker` as
    /// the one to wake.
    fn fired(&self, index: usize, waker: &Waker) -> bool {
        let mut state = self.lock();
        match &mut state.slots[index] {
            Slot::Fired => true,
            Slot::Waiting { waker: kept, .. } => {
                if !kept.will_wake(waker) {
                    kept.clone_from(waker);
                }
                false
            }
            Slot::Free => false,
        }
    }

    /// Gives a slot back.
    fn free(&self, index: usize) {
        let mut state = self.lock();
        let old = std::mem::replace(&mut state.slots[index], Slot::Free);
        state.free.push(index);
        drop(state);
        // (A waker is dropped outside the lock.)
        drop(old);
    }

    /// The thread: fires the calls past their deadlines, sleeps until the next one
    /// (or a look a second on while calls keep coming, or until told).
    fn run(&self) {
        let mut due: Vec<Waker> = Vec::new();
        let mut state = self.lock();
        loop {
            let now = Instant::now();
            let mut next: Option<Instant> = None;
            for slot in &mut state.slots {
                if let Slot::Waiting { deadline, .. } = slot {
                    if *deadline <= now {
                        if let Slot::Waiting { waker, .. } = std::mem::replace(slot, Slot::Fired) {
                            due.push(waker);
                        }
                    } else {
                        next = Some(next.map_or(*deadline, |n: Instant| n.min(*deadline)));
                    }
                }
            }
            if next.is_none() && std::mem::take(&mut state.registered) {
                next = now.checked_add(IDLE_LOOK);
            }
            state.looks_at = next;
            if !due.is_empty() {
                drop(state);
                for waker in due.drain(..) {
                    // A waker that panics (an executor's bug) must not end the thread:
                    // every later call would go unbounded.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| waker.wake()));
                }
                state = self.lock();
                continue;
            }
            state = match next {
                Some(at) => {
                    let wait = at.saturating_duration_since(now);
                    self.look
                        .wait_timeout(state, wait)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
                None => self
                    .look
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner),
            };
        }
    }
}

/// Gives a call's slot back when the call ends, however it ends.
struct SlotGuard {
    sweeper: &'static Sweeper,
    index: Option<usize>,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        if let Some(index) = self.index {
            self.sweeper.free(index);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `fut`, which must end within 2 s (a sweeper that never fires fails the test
    /// rather than hanging it).
    async fn bounded<T>(fut: impl Future<Output = Option<T>>) -> Option<T> {
        tokio::time::timeout(Duration::from_secs(2), fut)
            .await
            .unwrap_or_else(|_| panic!("the call outlived its deadline by 2 s"))
    }

    /// A call that never answers ends `after` from now, not much later.
    async fn times_out_on_time(after: Duration) {
        let start = Instant::now();
        let answer = bounded(within(start + after, std::future::pending::<()>())).await;
        let took = start.elapsed();
        assert_eq!(answer, None);
        assert!(
            took >= after && took < after + Duration::from_millis(500),
            "{took:?}"
        );
    }

    #[tokio::test]
    async fn an_answer_in_time_is_returned() {
        let answer = within(Instant::now() + Duration::from_secs(5), async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            7
        })
        .await;
        assert_eq!(answer, Some(7));
    }

    #[tokio::test]
    async fn a_call_past_its_deadline_ends_then() {
        times_out_on_time(Duration::from_millis(100)).await;
    }

    /// A deadline earlier than the sweeper's next look wakes it: a short call beside
    /// a long one still ends on time.
    #[tokio::test]
    async fn an_earlier_deadline_wakes_the_sweeper() {
        let long = tokio::spawn(within(
            Instant::now() + Duration::from_secs(20),
            std::future::pending::<()>(),
        ));
        tokio::time::sleep(Duration::from_millis(20)).await;
        times_out_on_time(Duration::from_millis(100)).await;
        long.abort();
    }

    /// Calls on runtimes that come and go, and on one that is not driven between
    /// its calls, are all bounded: the sweeper belongs to none of them.
    #[test]
    fn every_runtime_is_served() {
        let idle = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("runtime: {e}"));
        idle.block_on(times_out_on_time(Duration::from_millis(10)));
        for _ in 0..2 {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap_or_else(|e| panic!("runtime: {e}"));
            rt.block_on(times_out_on_time(Duration::from_millis(50)));
        }
        drop(idle);
    }

    /// A waker that panics when woken does not end the sweeper: later calls are
    /// still bounded.
    #[tokio::test]
    async fn a_panicking_waker_does_not_end_the_sweeper() {
        struct Panics;
        impl std::task::Wake for Panics {
            fn wake(self: std::sync::Arc<Self>) {
                panic!("a waker that panics (as a test wants)");
            }
        }
        let waker = Waker::from(std::sync::Arc::new(Panics));
        let mut cx = std::task::Context::from_waker(&waker);
        let call = within(
            Instant::now() + Duration::from_millis(20),
            std::future::pending::<()>(),
        );
        let mut call = std::pin::pin!(call);
        assert!(call.as_mut().poll(&mut cx).is_pending());
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(call.as_mut().poll(&mut cx), Poll::Ready(None));
        times_out_on_time(Duration::from_millis(50)).await;
    }

    /// Slots are given back: many calls, answered or timed out or dropped, leave
    /// none waiting (this test's own; others may run beside it).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn slots_are_given_back() {
        let mut tasks = Vec::new();
        for i in 0..64u64 {
            tasks.push(tokio::spawn(async move {
                let until = Instant::now() + Duration::from_millis(50);
                within(until, tokio::time::sleep(Duration::from_millis(i % 3 * 40))).await
            }));
        }
        let mut answered = 0;
        for t in tasks {
            answered += usize::from(t.await.ok().flatten().is_some());
        }
        assert!(answered > 0 && answered < 64, "{answered}");
        let dropped = within(
            Instant::now() + Duration::from_secs(5),
            std::future::pending::<()>(),
        );
        let _ = tokio::time::timeout(Duration::from_millis(10), dropped).await;
        let Some(sweeper) = Sweeper::get() else {
            panic!("no sweeper thread");
        };
        let state = sweeper.lock();
        let in_use = state.slots.len() - state.free.len();
        // Other tests of this binary may hold slots now; none of these 65 calls does.
        assert!(in_use <= 4, "{in_use} slots still in use");
    }
}
