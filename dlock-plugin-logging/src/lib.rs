//! # dlock-plugin-logging — access logs for dlock
//!
//! [`LoggingHandler`] records every acquire and release through `tracing`:
//!
//! * a span `dlock.acquire` / `dlock.release` with fields `lock`, `owner`, `mode`,
//!   `wait_ms`, `outcome`, `token`, `elapsed_ms` (so backend spans nest inside);
//! * one access-log event per call on the target [`ACCESS_TARGET`] (`dlock::access`),
//!   with structured fields `op`, `lock`, `owner`, `mode`, `backend`, `outcome`,
//!   `elapsed_ms` (and `token` on a release) for JSON or key-value subscribers, and
//!   the seed framework's line `acquire|<lock>|<owner>|<outcome>|<ms>` as its message
//!   — route that target to its own file with your subscriber's filters;
//! * outcomes: `acquired`, `busy` (a try-once found the lock held), `timeout` (waited,
//!   gave up), `released`, `not_owner`, or the error kind;
//! * failed calls at `ERROR` (through the chain's error hooks), failed renewals and lost
//!   locks at `WARN`, the error as a `&dyn Error` field (subscribers keep its causes).
//!
//! It logs lock names, owners, tokens and error messages, never connection URLs; errors
//! from dlock's backends already carry URLs with the password replaced by `***`.
//!
//! ```no_run
//! # async fn demo() -> dlock_spi::Result<()> {
//! use dlock_plugin_logging::LoggingHandler;
//! let backend = dlock_spi::InMemoryBackend::new();
//! let chain = dlock_spi::HandlerChain::new(
//!     std::sync::Arc::new(backend),
//!     vec![std::sync::Arc::new(LoggingHandler::default().with_access_log(true))],
//! );
//! # let _ = chain; Ok(()) }
//! ```
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

use std::time::Instant;

use async_trait::async_trait;
use dlock_spi::{
    AcquireChain, AcquireContext, AcquireResult, Error, LockHandler, LostEvent, ReleaseChain,
    ReleaseContext, ReleaseResult, RenewEvent, RenewResult, Result,
};
use tracing::field::Empty;
use tracing::Instrument;

/// The target of the access-log lines.
pub const ACCESS_TARGET: &str = "dlock::access";

/// Logs acquires, releases, renewals and losses. See the crate docs.
#[derive(Debug, Clone)]
pub struct LoggingHandler {
    access_log: bool,
    log_renewals: bool,
}

impl Default for LoggingHandler {
    /// Spans, access log, error/lost logs on; successful renewals not logged.
    fn default() -> Self {
        LoggingHandler {
            access_log: true,
            log_renewals: false,
        }
    }
}

impl LoggingHandler {
    /// Turns the access-log lines on or off (spans and error logs stay).
    pub fn with_access_log(mut self, on: bool) -> Self {
        self.access_log = on;
        self
    }

    /// Also logs successful renewals at `DEBUG` (failed ones are always logged).
    pub fn with_renewal_log(mut self, on: bool) -> Self {
        self.log_renewals = on;
        self
    }
}

fn ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

#[async_trait]
impl LockHandler for LoggingHandler {
    async fn acquire(&self, ctx: &AcquireContext, next: AcquireChain<'_>) -> Result<AcquireResult> {
        let req = &ctx.request;
        let span = tracing::info_span!(
            "dlock.acquire",
            lock = %req.name,
            owner = %req.owner,
            mode = req.mode.as_str(),
            wait_ms = u64::try_from(ctx.wait().as_millis()).unwrap_or(u64::MAX),
            backend = ctx.backend,
            outcome = Empty,
            token = Empty,
            elapsed_ms = Empty,
        );
        let access =
            self.access_log && tracing::enabled!(target: ACCESS_TARGET, tracing::Level::INFO);
        if span.is_disabled() && !access {
            // Nothing to record at the levels enabled: cost nothing (not even a clock read).
            return next.invoke(ctx).await;
        }
        let result = next.invoke(ctx).instrument(span.clone()).await;
        let elapsed = ms(ctx.started);
        if let Ok(AcquireResult::Acquired { token, .. }) = &result {
            span.record("token", token.get());
        }
        let outcome = ctx.outcome(&result).as_str();
        span.record("outcome", outcome);
        span.record("elapsed_ms", elapsed);
        if access {
            tracing::info!(
                target: ACCESS_TARGET,
                op = "acquire", lock = %req.name, owner = %req.owner, mode = req.mode.as_str(),
                backend = ctx.backend, outcome, elapsed_ms = elapsed,
                "acquire|{}|{}|{}|{}", req.name, req.owner, outcome, elapsed
            );
        }
        result
    }

    async fn release(&self, ctx: &ReleaseContext, next: ReleaseChain<'_>) -> Result<ReleaseResult> {
        let req = &ctx.request;
        let span = tracing::info_span!(
            "dlock.release",
            lock = %req.name,
            owner = %req.owner,
            mode = req.mode.as_str(),
            token = req.token.get(),
            backend = ctx.backend,
            outcome = Empty,
            held_ms = Empty,
            elapsed_ms = Empty,
        );
        let access =
            self.access_log && tracing::enabled!(target: ACCESS_TARGET, tracing::Level::INFO);
        if span.is_disabled() && !access {
            let result = next.invoke(ctx).await;
            if matches!(result, Ok(ReleaseResult::NotOwner)) {
                tracing::warn!(lock = %req.name, owner = %req.owner, "dlock: released a lock this owner no longer held");
            }
            return result;
        }
        let result = next.invoke(ctx).instrument(span.clone()).await;
        let elapsed = ms(ctx.started);
        let outcome = match &result {
            Ok(ReleaseResult::Released) => "released",
            Ok(ReleaseResult::NotOwner) => "not_owner",
            Err(e) => e.kind().as_str(),
        };
        span.record("outcome", outcome);
        span.record("elapsed_ms", elapsed);
        if let Some(at) = ctx.acquired_at {
            span.record("held_ms", ms(at));
        }
        if access {
            tracing::info!(
                target: ACCESS_TARGET,
                op = "release", lock = %req.name, owner = %req.owner, mode = req.mode.as_str(),
                backend = ctx.backend, token = req.token.get(), outcome, elapsed_ms = elapsed,
                "release|{}|{}|{}|{}", req.name, req.owner, outcome, elapsed
            );
        }
        if matches!(result, Ok(ReleaseResult::NotOwner)) {
            tracing::warn!(lock = %req.name, owner = %req.owner, "dlock: released a lock this owner no longer held");
        }
        result
    }

    fn on_acquire_error(&self, ctx: &AcquireContext, err: &Error) {
        tracing::error!(lock = %ctx.request.name, owner = %ctx.request.owner, error = err as &dyn std::error::Error, retryable = err.is_retryable(), "dlock: acquire failed");
    }

    fn on_release_error(&self, ctx: &ReleaseContext, err: &Error) {
        tracing::error!(lock = %ctx.request.name, owner = %ctx.request.owner, error = err as &dyn std::error::Error, retryable = err.is_retryable(), "dlock: release failed");
    }

    fn on_renew(&self, event: &RenewEvent<'_>) {
        let req = event.request;
        match event.outcome {
            Ok(RenewResult::Renewed { .. }) => {
                if self.log_renewals {
                    tracing::debug!(lock = %req.name, owner = %req.owner, elapsed_ms = event.elapsed.as_millis() as u64, "dlock: lease renewed");
                }
            }
            Ok(RenewResult::NotOwner) => {
                tracing::warn!(lock = %req.name, owner = %req.owner, "dlock: renewal refused: not the owner any more");
            }
            Err(e) => {
                tracing::warn!(lock = %req.name, owner = %req.owner, error = e as &dyn std::error::Error, "dlock: renewal failed; retrying until the lease ends");
            }
        }
    }

    fn on_lost(&self, event: &LostEvent<'_>) {
        tracing::warn!(lock = %event.name, owner = %event.owner, token = event.token.get(), reason = %event.reason, "dlock: lock lost");
    }
}

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
