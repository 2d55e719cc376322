//! The bound on every backend call the chain makes, kept by one sweeper task per
//! chain instead of a timer per call.
//!
//! Why: a tokio timer armed on each acquire and release and cleared when the answer
//! came (the wheel's insert, re-register, remove and clear, the driver's look at the
//! next expiry) was the largest cost the user API added to a backend call per cycle
//! (issue 51: ~950 instructions of an uncontended Redis cycle's ~6 300). Here a call
//! that does not answer on its first poll puts its deadline and waker in a slot
//! (one uncontended lock), and takes them out when it ends; the sweeper sleeps until
//! the earliest deadline and wakes the calls past theirs. A new deadline no earlier
//! than the sweeper's next wake — the usual case: each call's is one operation
//! timeout after its start, so later than those before it — costs no wake-up; the
//! sweeper, idle, stays asleep until an operation timeout after its last look.
//!
//! The sweeper runs on the runtime of the call that started it. A runtime that shuts
//! down drops it; the next call starts another on its own runtime. It ends by itself
//! once its chain is gone.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// The deadlines of one chain's calls in flight, and the handle of their sweeper.
pub(crate) struct Deadlines {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    /// Wakes the sweeper to look again (a deadline earlier than its next wake, or
    /// its chain gone). Held apart from the state: the sleeping sweeper keeps this
    /// alive, not the chain's state.
    rearm: Arc<Notify>,
    /// How long an idle sweeper sleeps (the chain's operation timeout).
    idle: Duration,
}

#[derive(Default)]
struct State {
    slots: Vec<Slot>,
    free: Vec<usize>,
    /// When the sweeper looks next; `None` while no sweeper runs.
    wakes_at: Option<Instant>,
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

impl Deadlines {
    /// Deadlines whose sweeper, idle, sleeps `idle` (the chain's operation timeout).
    pub(crate) fn new(idle: Duration) -> Self {
        Deadlines {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                rearm: Arc::new(Notify::new()),
                idle: idle.max(Duration::from_millis(1)),
            }),
        }
    }

    /// Runs `fut` until it answers (`Some`) or `deadline` passes (`None`, and `fut`
    /// is dropped).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe as `fut` is: dropped, its slot is given back.
    pub(crate) async fn within<F: Future>(&self, deadline: Instant, fut: F) -> Option<F::Output> {
        let mut fut = std::pin::pin!(fut);
        let mut slot = SlotGuard {
            shared: &self.shared,
            index: None,
        };
        std::future::poll_fn(|cx| {
            if let Poll::Ready(answer) = fut.as_mut().poll(cx) {
                return Poll::Ready(Some(answer));
            }
            match slot.index {
                None => {
                    slot.index = Some(self.shared.register(deadline, cx.waker()));
                    Poll::Pending
                }
                Some(index) if self.shared.fired(index, cx.waker()) => Poll::Ready(None),
                Some(_) => Poll::Pending,
            }
        })
        .await
    }
}

impl Drop for Deadlines {
    fn drop(&mut self) {
        // The sweeper, woken, finds its chain gone and ends.
        self.shared.rearm.notify_one();
    }
}

/// Gives a call's slot back when the call ends, however it ends.
struct SlotGuard<'a> {
    shared: &'a Shared,
    index: Option<usize>,
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        if let Some(index) = self.index {
            let mut state = self.shared.lock();
            state.slots[index] = Slot::Free;
            state.free.push(index);
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Puts a call's deadline in a slot (starting the sweeper if none runs, waking
    /// it if it sleeps past `deadline`); answers the slot.
    fn register(self: &Arc<Self>, deadline: Instant, waker: &Waker) -> usize {
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
        match state.wakes_at {
            None => {
                state.wakes_at = Some(deadline);
                drop(state);
                tokio::spawn(sweep(Arc::downgrade(self), Arc::clone(&self.rearm)));
            }
            Some(at) if deadline < at => {
                state.wakes_at = Some(deadline);
                drop(state);
                self.rearm.notify_one();
            }
            Some(_) => {}
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

    /// Fires every call past its deadline; answers when to look next.
    fn sweep_once(&self, now: Instant) -> Instant {
        let mut state = self.lock();
        let mut next = now + self.idle;
        for slot in &mut state.slots {
            if let Slot::Waiting { deadline, .. } = slot {
                if *deadline <= now {
                    if let Slot::Waiting { waker, .. } = std::mem::replace(slot, Slot::Fired) {
                        waker.wake();
                    }
                } else {
                    next = next.min(*deadline);
                }
            }
        }
        state.wakes_at = Some(next);
        next
    }
}

/// The sweeper: fires calls past their deadlines until its chain is gone.
async fn sweep(shared: Weak<Shared>, rearm: Arc<Notify>) {
    // However it ends (its runtime shutting down included), the next call starts
    // another.
    struct Ended(Weak<Shared>);
    impl Drop for Ended {
        fn drop(&mut self) {
            if let Some(shared) = self.0.upgrade() {
                shared.lock().wakes_at = None;
            }
        }
    }
    let _ended = Ended(shared.clone());
    loop {
        let Some(next) = shared.upgrade().map(|s| s.sweep_once(Instant::now())) else {
            return;
        };
        tokio::select! {
            () = tokio::time::sleep_until(next.into()) => {}
            () = rearm.notified() => {}
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

    #[tokio::test]
    async fn an_answer_in_time_is_returned() {
        let deadlines = Deadlines::new(Duration::from_secs(10));
        let answer = deadlines
            .within(Instant::now() + Duration::from_secs(5), async {
                tokio::time::sleep(Duration::from_millis(10)).await;
                7
            })
            .await;
        assert_eq!(answer, Some(7));
    }

    #[tokio::test]
    async fn a_call_past_its_deadline_ends_then() {
        let deadlines = Deadlines::new(Duration::from_secs(10));
        let start = Instant::now();
        let answer = bounded(deadlines.within(
            start + Duration::from_millis(100),
            std::future::pending::<()>(),
        ))
        .await;
        let took = start.elapsed();
        assert_eq!(answer, None);
        assert!(
            took >= Duration::from_millis(100) && took < Duration::from_millis(600),
            "{took:?}"
        );
    }

    /// A deadline earlier than the sweeper's next wake wakes it: a short call after
    /// a long one still ends on time.
    #[tokio::test]
    async fn an_earlier_deadline_wakes_the_sweeper() {
        let deadlines = Arc::new(Deadlines::new(Duration::from_secs(30)));
        let long = {
            let deadlines = Arc::clone(&deadlines);
            tokio::spawn(async move {
                deadlines
                    .within(
                        Instant::now() + Duration::from_secs(20),
                        std::future::pending::<()>(),
                    )
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        let start = Instant::now();
        let short = bounded(deadlines.within(
            start + Duration::from_millis(100),
            std::future::pending::<()>(),
        ))
        .await;
        assert_eq!(short, None);
        assert!(start.elapsed() < Duration::from_millis(600));
        long.abort();
    }

    /// The sweeper's runtime gone, the next call starts one on its own.
    #[test]
    fn a_new_runtime_gets_a_new_sweeper() {
        let deadlines = Deadlines::new(Duration::from_secs(10));
        for _ in 0..2 {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap_or_else(|e| panic!("runtime: {e}"));
            let start = Instant::now();
            let answer = rt.block_on(bounded(deadlines.within(
                start + Duration::from_millis(50),
                std::future::pending::<()>(),
            )));
            assert_eq!(answer, None);
            assert!(start.elapsed() < Duration::from_millis(600));
        }
    }

    /// Slots are given back: many calls, answered or timed out or dropped, leave
    /// none waiting.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn slots_are_given_back() {
        let deadlines = Arc::new(Deadlines::new(Duration::from_secs(10)));
        let mut tasks = Vec::new();
        for i in 0..64u64 {
            let deadlines = Arc::clone(&deadlines);
            tasks.push(tokio::spawn(async move {
                let until = Instant::now() + Duration::from_millis(50);
                deadlines
                    .within(until, tokio::time::sleep(Duration::from_millis(i % 3 * 40)))
                    .await
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
        let dropped = deadlines.within(
            Instant::now() + Duration::from_secs(5),
            std::future::pending::<()>(),
        );
        let _ = tokio::time::timeout(Duration::from_millis(10), dropped).await;
        let state = deadlines.shared.lock();
        assert!(state.slots.iter().all(|s| matches!(s, Slot::Free)));
        assert_eq!(state.free.len(), state.slots.len());
    }
}
