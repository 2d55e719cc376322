//! Reusable retry delays for backends that wait by polling.

use std::time::{Duration, Instant};

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
    pub fn constant(delay: Duration) -> Self {
        Backoff {
            kind: BackoffKind::Constant(delay),
            jitter: Jitter::Equal,
        }
    }

    /// Doubling from `initial` up to `max`, with equal jitter.
    pub fn exponential(initial: Duration, max: Duration) -> Self {
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
    pub fn with_jitter(mut self, jitter: Jitter) -> Self {
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
