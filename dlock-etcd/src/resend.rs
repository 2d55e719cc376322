//! Sending a request again at once after a transport failure.
//!
//! tonic keeps each member's failed connect and hands it, as the answer, to the
//! next request routed to that member, unsent; it then counts the member as
//! ready, and its balancer picks evenly among ready members (it reports no load).
//! After an outage every member may hold such a failure, and a member that stays
//! down makes a new one for every request routed there. So a request that failed
//! in the transport is sent again at once — when [`Repeat`] allows it for that
//! failure — rather than costing the caller's retry a pause for each (a
//! background release: seconds, long after the connections healed).

use std::future::Future;

use tokio::time::Instant;

use crate::error::TransportFailure;

/// How many times per member a request that met a transport failure is sent again
/// (at least [`MIN_RESENDS`]). Not once: with `m` members each send meets a dead
/// member's failure with a chance of up to 1/m, and a request fails for it only if
/// every send does — ≤ (1/m)^(resends + 1), about 10⁻⁷ for three members. Each
/// resend is immediate, and costs a connect attempt only to a member that is down.
const RESENDS_PER_MEMBER: u32 = 4;

/// The fewest resends after transport failures (a cluster of one or two members).
const MIN_RESENDS: u32 = 12;

/// The resend budget of one request on a cluster of `members`.
pub(crate) fn budget(members: usize) -> u32 {
    u32::try_from(members)
        .unwrap_or(u32::MAX)
        .saturating_mul(RESENDS_PER_MEMBER)
        .max(MIN_RESENDS)
}

/// Whether a request may be applied twice: what [`resending`] sends again after a
/// transport failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Repeat {
    /// Applied twice it is as once (a read, a refresh, a revoke, a put of the same
    /// value, a new watch, a sign-in, a spare lease that expires unused): sent
    /// again after any transport failure.
    Safe,
    /// Applied twice it answers otherwise (a placement, a delete of many keys):
    /// sent again only after a failure that shows it never left.
    IfUnsent,
}

/// A request's answer, and whether it was sent again after a failure that may
/// have come after it was applied.
pub(crate) struct Sent<T> {
    pub(crate) answer: T,
    pub(crate) resent_maybe_applied: bool,
}

/// Why a request got no answer.
pub(crate) enum Unanswered<E> {
    /// It failed, and was not (or no more) to be sent again.
    Failed(E),
    /// The deadline passed; with the transport failure that had it sent again,
    /// if one did (it says more than the deadline).
    TimedOut(Option<E>),
}

impl<E> Unanswered<E> {
    /// The error to report: `failed` of the last failure, else `timed_out()`.
    pub(crate) fn into_error<R>(
        self,
        failed: impl FnOnce(E) -> R,
        timed_out: impl FnOnce() -> R,
    ) -> R {
        match self {
            Unanswered::Failed(e) | Unanswered::TimedOut(Some(e)) => failed(e),
            Unanswered::TimedOut(None) => timed_out(),
        }
    }
}

/// Sends the request `send` makes until it is answered, fails otherwise than in
/// the transport (as `failure` classifies its errors), has been sent again
/// `budget` times, or `deadline` passes.
pub(crate) async fn resending<T, E, Fut>(
    deadline: Instant,
    mut budget: u32,
    repeat: Repeat,
    failure: impl Fn(&E) -> Option<TransportFailure>,
    mut send: impl FnMut() -> Fut,
) -> Result<Sent<T>, Unanswered<E>>
where
    Fut: Future<Output = Result<T, E>>,
{
    let mut resent_maybe_applied = false;
    let mut failed = None;
    loop {
        let err = match tokio::time::timeout_at(deadline, send()).await {
            Ok(Ok(answer)) => {
                return Ok(Sent {
                    answer,
                    resent_maybe_applied,
                })
            }
            Ok(Err(err)) => err,
            Err(_) => return Err(Unanswered::TimedOut(failed)),
        };
        let kind = failure(&err);
        let again = match kind {
            Some(TransportFailure::Unsent) => true,
            Some(TransportFailure::MaybeSent) => repeat == Repeat::Safe,
            None => false,
        };
        if !again || budget == 0 || Instant::now() >= deadline {
            return Err(Unanswered::Failed(err));
        }
        budget -= 1;
        resent_maybe_applied |= kind == Some(TransportFailure::MaybeSent);
        failed = Some(err);
    }
}
