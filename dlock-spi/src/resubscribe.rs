//! Keeping a subscription up: subscribe, drain what arrives, and when it ends,
//! subscribe again — pausing between tries, telling whoever relies on it that
//! events may have been missed. One loop for every backend's release notices,
//! change feeds, watches and sessions, so each backend writes only what differs:
//! how to subscribe and what to do with an event.
//!
//! The rule every backend follows: a subscription is *live* once
//! [`Subscription::subscribe`] returns it (every event after that arrives), so what
//! happened between the end of one and the start of the next is unknown —
//! [`Subscription::resubscribed`] is where waiters re-check (a wake-all, a ping).

use std::future::Future;
use std::time::Duration;

use crate::backoff::{Backoff, Pacer};

/// How a live subscription ended ([`Subscription::drain`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drained {
    /// It ends as it does after each event (a one-shot watch fired, a session was
    /// lost and a new one is due): subscribe again at once, pausing only between
    /// failed tries.
    Rearm,
    /// It broke (a connection lost, a watch cancelled, a periodic renewal): pause,
    /// then subscribe again.
    Broke,
    /// Nobody needs it any more: the loop ends.
    Done,
}

/// What a backend keeps subscribed: how to subscribe and how to drain a live
/// subscription. [`Resubscribe::run`] is the loop around them.
pub trait Subscription: Send {
    /// A live subscription: a connection, a stream, armed watches.
    type Live: Send;

    /// Subscribes once; live on return (every event after it arrives). `None` when
    /// it failed (the implementation logs why): tried again after a pause.
    fn subscribe(&mut self) -> impl Future<Output = Option<Self::Live>> + Send;

    /// Delivers what arrives on `live` until it ends, and says how it ended.
    fn drain(&mut self, live: Self::Live) -> impl Future<Output = Drained> + Send;

    /// A new subscription is live after a gap: events may have been missed
    /// meanwhile, so whoever relies on them re-checks (wakes every waiter, pings a
    /// feed). Not called for the subscription [`Resubscribe::run`] started with.
    fn resubscribed(&mut self);

    /// The subscription broke ([`Drained::Broke`]); called before the pause (e.g.
    /// waiters switch to polling until it is back). Nothing by default.
    fn lost(&mut self) {}

    /// Whether anyone still needs the subscription; checked before each try to
    /// subscribe, `false` ends the loop. `true` by default (the loop's task is
    /// aborted with its owner).
    fn wanted(&self) -> bool {
        true
    }
}

/// The loop that keeps a [`Subscription`] up, with its pauses and when it gives up.
///
/// * After [`Drained::Broke`] it pauses, then subscribes; after [`Drained::Rearm`]
///   it subscribes at once. Failed tries are paced by the [`Backoff`].
/// * The pauses start over from the first after each live subscription (with
///   [`Resubscribe::give_up_after`]: after one that lasted `steady`).
/// * It ends on [`Drained::Done`], when [`Subscription::wanted`] says no, and (with
///   [`Resubscribe::give_up_after`]) after that many failures in a row.
///
/// ```
/// use std::time::Duration;
/// use dlock_spi::{Backoff, Drained, Resubscribe, Subscription};
///
/// /// A feed that breaks twice, then is no longer wanted.
/// struct Feed { tries: u32, missed: u32 }
///
/// impl Subscription for Feed {
///     type Live = u32;
///     async fn subscribe(&mut self) -> Option<u32> {
///         self.tries += 1;
///         Some(self.tries)
///     }
///     async fn drain(&mut self, live: u32) -> Drained {
///         if live < 3 { Drained::Broke } else { Drained::Done }
///     }
///     fn resubscribed(&mut self) {
///         self.missed += 1;
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let mut feed = Feed { tries: 0, missed: 0 };
/// Resubscribe::new(Backoff::constant(Duration::from_millis(1))).run(&mut feed, None).await;
/// assert_eq!((feed.tries, feed.missed), (3, 3));
/// # }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Resubscribe {
    pause: Backoff,
    give_up: Option<(u32, Duration)>,
}

impl Resubscribe {
    /// Pauses by `pause` between tries; never gives up.
    pub const fn new(pause: Backoff) -> Self {
        Resubscribe {
            pause,
            give_up: None,
        }
    }

    /// Gives up after `failures` in a row — a failed try, or a subscription that
    /// ended within `steady` of its start — and starts the pauses over only after a
    /// subscription that lasted `steady`.
    pub const fn give_up_after(mut self, failures: u32, steady: Duration) -> Self {
        self.give_up = Some((failures, steady));
        self
    }

    /// Keeps `sub` subscribed, starting from `live` (a subscription made already,
    /// whose events nobody missed) or by subscribing; returns when the loop ends.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped, it stops where it is; a live subscription is dropped.
    pub async fn run<S: Subscription>(&self, mut sub: S, mut live: Option<S::Live>) {
        let mut pacer = Pacer::new(self.pause);
        let mut failures = 0u32;
        let mut pause_first = false;
        loop {
            let current = match live.take() {
                Some(current) => current,
                None => loop {
                    if !sub.wanted() || self.give_up.is_some_and(|(most, _)| failures >= most) {
                        return;
                    }
                    if pause_first {
                        pacer.pause().await;
                    }
                    pause_first = true;
                    if let Some(current) = sub.subscribe().await {
                        sub.resubscribed();
                        break current;
                    }
                    failures += 1;
                },
            };
            let started = tokio::time::Instant::now();
            pause_first = match sub.drain(current).await {
                Drained::Done => return,
                Drained::Rearm => false,
                Drained::Broke => {
                    sub.lost();
                    true
                }
            };
            match self.give_up {
                Some((_, steady)) if started.elapsed() < steady => failures += 1,
                _ => {
                    failures = 0;
                    pacer.reset();
                }
            }
        }
    }
}

impl<S: Subscription> Subscription for &mut S {
    type Live = S::Live;

    fn subscribe(&mut self) -> impl Future<Output = Option<Self::Live>> + Send {
        (**self).subscribe()
    }

    fn drain(&mut self, live: Self::Live) -> impl Future<Output = Drained> + Send {
        (**self).drain(live)
    }

    fn resubscribed(&mut self) {
        (**self).resubscribed();
    }

    fn lost(&mut self) {
        (**self).lost();
    }

    fn wanted(&self) -> bool {
        (**self).wanted()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// A scripted subscription: each try's result, each drain's end, and what
    /// happened, in order.
    struct Script {
        tries: VecDeque<bool>,
        ends: VecDeque<(Duration, Drained)>,
        log: Vec<String>,
    }

    impl Subscription for Script {
        type Live = ();
        async fn subscribe(&mut self) -> Option<()> {
            let ok = self.tries.pop_front().unwrap_or(false);
            self.log.push(format!("subscribe {ok} at {:?}", now()));
            ok.then_some(())
        }
        async fn drain(&mut self, (): ()) -> Drained {
            let (lasts, end) = self
                .ends
                .pop_front()
                .unwrap_or((Duration::ZERO, Drained::Done));
            tokio::time::sleep(lasts).await;
            end
        }
        fn resubscribed(&mut self) {
            self.log.push("resubscribed".into());
        }
        fn lost(&mut self) {
            self.log.push("lost".into());
        }
    }

    fn now() -> u128 {
        START.with(|s| s.elapsed().as_millis())
    }

    thread_local! {
        static START: tokio::time::Instant = tokio::time::Instant::now();
    }

    fn script(tries: &[bool], ends: &[(u64, Drained)]) -> Script {
        Script {
            tries: tries.iter().copied().collect(),
            ends: ends
                .iter()
                .map(|(ms, d)| (Duration::from_millis(*ms), *d))
                .collect(),
            log: Vec::new(),
        }
    }

    const DOUBLING: Backoff =
        Backoff::exponential(Duration::from_millis(100), Duration::from_secs(2))
            .with_jitter(crate::Jitter::None);

    #[tokio::test(start_paused = true)]
    async fn a_broken_subscription_pauses_first_a_fired_one_rearms_at_once() {
        let _ = now();
        let mut s = script(
            &[false, true, true],
            &[(0, Drained::Broke), (0, Drained::Rearm)],
        );
        Resubscribe::new(DOUBLING).run(&mut s, Some(())).await;
        assert_eq!(
            s.log,
            [
                "lost",
                "subscribe false at 100",
                "subscribe true at 300",
                "resubscribed",
                "subscribe true at 300",
                "resubscribed",
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn it_gives_up_after_failures_in_a_row_and_starts_over_after_a_steady_run() {
        let _ = now();
        let steady = Duration::from_secs(10);
        // Up 10 s (steady: failures back to 0), then breaks at once twice, then
        // every try fails: the third failure in a row ends it.
        let mut s = script(
            &[true, true, false, false, false],
            &[
                (10_000, Drained::Broke),
                (0, Drained::Broke),
                (0, Drained::Broke),
            ],
        );
        Resubscribe::new(DOUBLING)
            .give_up_after(3, steady)
            .run(&mut s, Some(()))
            .await;
        assert_eq!(
            s.log,
            [
                "lost",
                "subscribe true at 10100",
                "resubscribed",
                "lost",
                "subscribe true at 10300",
                "resubscribed",
                "lost",
                "subscribe false at 10700",
            ]
        );
    }
}
