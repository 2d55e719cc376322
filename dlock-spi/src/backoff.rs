//! Reusable retry delays for backends that wait by polling, reconnect or send again:
//! a [`Backoff`] policy, a [`Pacer`] that counts a loop's attempts and pauses by it,
//! and [`Backoff::retry`], which sends again after retryable errors up to a deadline.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::error::Result;

/// How the delay grows between attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackoffKind {
    /// The same delay every time.
    Constant(Duration),
    /// `initial × factor^attempt`, capped at `max`.
    Exponential {
        /// The first delay.
        initial: Duration,
        /// The cap.
        max: Duration,
        /// The growth factor (≥ 1).
        factor: u32,
    },
}

/// How much randomness is mixed into each delay, so many pollers do not move in step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Jitter {
    /// Exactly the computed delay.
    None,
    /// Uniform in `[0, delay]` ("full jitter").
    Full,
    /// Uniform in `[delay/2, delay]` ("equal jitter").
    Equal,
}

/// A backoff policy: a growth rule plus jitter.
///
/// ```
/// use std::time::Duration;
/// use dlock_spi::{Backoff, Jitter};
/// let b = Backoff::exponential(Duration::from_millis(10), Duration::from_millis(200))
///     .with_jitter(Jitter::None);
/// assert_eq!(b.delay(0), Duration::from_millis(10));
/// assert_eq!(b.delay(3), Duration::from_millis(80));
/// assert_eq!(b.delay(10), Duration::from_millis(200));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The growth rule.
    pub kind: BackoffKind,
    /// The jitter.
    pub jitter: Jitter,
}

impl Default for Backoff {
    /// Exponential from 5 ms to 250 ms, doubling, with equal jitter.
    fn default() -> Self {
        Backoff::exponential(Duration::from_millis(5), Duration::from_millis(250))
    }
}

impl Backoff {
    /// A constant delay with equal jitter.
    pub const fn constant(delay: Duration) -> Self {
        Backoff {
            kind: BackoffKind::Constant(delay),
            jitter: Jitter::Equal,
        }
    }

    /// Doubling from `initial` up to `max`, with equal jitter.
    pub const fn exponential(initial: Duration, max: Duration) -> Self {
        Backoff {
            kind: BackoffKind::Exponential {
                initial,
                max,
                factor: 2,
            },
            jitter: Jitter::Equal,
        }
    }

    /// Replaces the jitter.
    pub const fn with_jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// The longest delay this backoff waits (before jitter, which only shortens it).
    pub fn longest(&self) -> Duration {
        match self.kind {
            BackoffKind::Constant(d) => d,
            BackoffKind::Exponential { max, .. } => max,
        }
    }

    /// The delay before attempt number `attempt + 1` (attempt 0 follows the first try).
    pub fn delay(&self, attempt: u32) -> Duration {
        let base = match self.kind {
            BackoffKind::Constant(d) => d,
            BackoffKind::Exponential {
                initial,
                max,
                factor,
            } => {
                let mult = factor
                    .max(1)
                    .checked_pow(attempt.min(32))
                    .unwrap_or(u32::MAX);
                initial.checked_mul(mult).unwrap_or(max).min(max)
            }
        };
        let nanos = u64::try_from(base.as_nanos()).unwrap_or(u64::MAX);
        match self.jitter {
            Jitter::None => base,
            Jitter::Full => Duration::from_nanos(fastrand::u64(0..=nanos)),
            Jitter::Equal => Duration::from_nanos(nanos / 2 + fastrand::u64(0..=nanos - nanos / 2)),
        }
    }

    /// The delay before the next attempt, clamped so the attempt happens no later than
    /// `deadline`; `None` once the deadline has passed (stop waiting).
    pub fn delay_within(&self, attempt: u32, deadline: Instant) -> Option<Duration> {
        let left = deadline.checked_duration_since(Instant::now())?;
        if left.is_zero() {
            return None;
        }
        Some(self.delay(attempt).min(left))
    }
}

impl Backoff {
    /// Runs `attempt` until it is answered: after a retryable error
    /// ([`crate::Error::is_retryable`]) it pauses by this backoff and tries again,
    /// as long as the next try would start before `until`; returns the answer, or the
    /// last error. For calls that are safe to send again (they name what they
    /// change, so a repeat changes nothing — a release naming its grant, say).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe as far as `attempt` is: dropped, it sends nothing more.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use std::time::{Duration, Instant};
    /// use dlock_spi::{Backoff, Error, ErrorKind, Jitter};
    /// let backoff = Backoff::constant(Duration::from_millis(1)).with_jitter(Jitter::None);
    /// let mut sent = 0;
    /// let answer = backoff
    ///     .retry(Instant::now() + Duration::from_secs(5), || {
    ///         sent += 1;
    ///         let n = sent;
    ///         async move {
    ///             if n < 3 {
    ///                 Err(Error::new(ErrorKind::Backend, "the connection broke").set_retryable(true))
    ///             } else {
    ///                 Ok(n)
    ///             }
    ///         }
    ///     })
    ///     .await;
    /// assert_eq!(answer.ok(), Some(3));
    /// # }
    /// ```
    pub async fn retry<T, F, Fut>(&self, until: Instant, mut attempt: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let mut pacer = Pacer::new(*self);
        loop {
            match attempt().await {
                Err(err) if err.is_retryable() => {
                    if !pacer.pause_before(until).await {
                        return Err(err);
                    }
                }
                answered => return answered,
            }
        }
    }
}

/// A loop's pauses by a [`Backoff`]: it counts the attempts, so each pause is the
/// backoff's delay for the attempts so far, and starts again from the first delay
/// after [`Pacer::reset`] (a connection that came back, say).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::time::Duration;
/// use dlock_spi::{Backoff, Jitter, Pacer};
/// let mut pacer = Pacer::new(
///     Backoff::exponential(Duration::from_millis(1), Duration::from_millis(4)).with_jitter(Jitter::None),
/// );
/// assert_eq!(pacer.next_delay(), Duration::from_millis(1));
/// pacer.pause().await;
/// pacer.pause().await;
/// assert_eq!((pacer.attempts(), pacer.next_delay()), (2, Duration::from_millis(4)));
/// pacer.reset();
/// assert_eq!(pacer.next_delay(), Duration::from_millis(1));
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Pacer {
    backoff: Backoff,
    attempts: u32,
}

impl Pacer {
    /// A pacer at its first delay.
    pub const fn new(backoff: Backoff) -> Self {
        Pacer {
            backoff,
            attempts: 0,
        }
    }

    /// The pauses taken since the start or the last [`Pacer::reset`].
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The delay the next pause is drawn for (before jitter, which only shortens
    /// it: with [`Jitter::None`], exactly the next pause).
    pub fn next_delay(&self) -> Duration {
        self.backoff.with_jitter(Jitter::None).delay(self.attempts)
    }

    /// Back to the first delay.
    pub fn reset(&mut self) {
        self.attempts = 0;
    }

    /// Sleeps the next delay, and counts it.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped mid-sleep, the pause is not counted.
    pub async fn pause(&mut self) {
        tokio::time::sleep(self.backoff.delay(self.attempts)).await;
        self.attempts = self.attempts.saturating_add(1);
    }

    /// Sleeps the next delay and counts it, if the pause would end before `until`;
    /// otherwise returns `false` at once (give up: the next attempt would start too
    /// late).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped mid-sleep, the pause is not counted.
    pub async fn pause_before(&mut self, until: Instant) -> bool {
        let pause = self.backoff.delay(self.attempts);
        if Instant::now() + pause >= until {
            return false;
        }
        tokio::time::sleep(pause).await;
        self.attempts = self.attempts.saturating_add(1);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_in_its_band() {
        let d = Duration::from_millis(100);
        for _ in 0..200 {
            let full = Backoff::constant(d).with_jitter(Jitter::Full).delay(0);
            assert!(full <= d);
            let equal = Backoff::constant(d).delay(0);
            assert!(equal >= d / 2 && equal <= d, "{equal:?}");
        }
    }

    #[test]
    fn exponential_saturates_instead_of_overflowing() {
        let b = Backoff::exponential(Duration::from_secs(1), Duration::from_secs(60))
            .with_jitter(Jitter::None);
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(60));
    }

    #[test]
    fn delay_within_honours_the_deadline() {
        let b = Backoff::constant(Duration::from_secs(10)).with_jitter(Jitter::None);
        let soon = Instant::now() + Duration::from_millis(50);
        let d = b.delay_within(0, soon);
        assert!(d.is_some_and(|d| d <= Duration::from_millis(50)));
        assert_eq!(
            b.delay_within(0, Instant::now() - Duration::from_millis(1)),
            None
        );
    }
}
