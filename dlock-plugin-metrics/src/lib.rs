//! # dlock-plugin-metrics — metrics for dlock
//!
//! [`MetricsHandler`] records through the [`metrics`] facade (install any recorder,
//! e.g. `metrics-exporter-prometheus`). Every series carries `backend` and `group`;
//! every counter and histogram also carries `outcome` (`dlock_lost_total`: `reason`):
//!
//! | metric | kind (unit) | `outcome` (`reason` for `dlock_lost_total`) |
//! |---|---|---|
//! | `dlock_acquire_total` | counter | `acquired`; `busy` (a try-once found it held); `timeout` (waited, gave up); or the error kind (`rejected` by a handler further in, `backend`, …) |
//! | `dlock_acquire_wait_seconds` | histogram (seconds) — from the call to its outcome | as `dlock_acquire_total` |
//! | `dlock_hold_seconds` | histogram (seconds) — first acquire to last release of a (reentrant) hold | the release's: `released`, `not_owner` (the hold had been lost), or the error kind |
//! | `dlock_held` | gauge — holds acquired and not yet released | — |
//! | `dlock_lost_total` | counter — holds lost without their owner releasing | (in `reason`) `lease_expired`, `not_owner`, `session_expired`, … |
//! | `dlock_renew_total` | counter — the watchdog's renewals | `renewed`, `not_owner`, or the error kind |
//!
//! Each metric is described (help text and unit) to the recorder when the handler
//! first records for a (backend, group), so exporters print `# HELP` and units.
//!
//! `group` is the lock name up to the first separator (`:` by default) — `orders:42`
//! → `orders` — never the full name, so label cardinality stays bounded. Names without
//! the separator are grouped as `-`.
//!
//! The handler registers its hot-path series once per (backend, group) and keeps the
//! handles, so the hot path does no label allocation or registry lookup: **install
//! your recorder before the first lock operation** (as with most `metrics` users).
//!
//! ```no_run
//! use dlock_plugin_metrics::MetricsHandler;
//! let handler = MetricsHandler::default().with_group_separator('/');
//! # let _ = handler;
//! ```
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

use async_trait::async_trait;
use dlock_spi::{
    AcquireChain, AcquireContext, AcquireOutcome, AcquireResult, LockHandler, LockName, LostEvent,
    ReleaseChain, ReleaseContext, ReleaseResult, RenewEvent, RenewResult, Result,
};
use metrics::Unit;

/// Histogram bucket bounds (seconds) that suit lock waits and holds; give them to your
/// exporter (e.g. `PrometheusBuilder::set_buckets`) so dashboards can compute
/// quantiles with `histogram_quantile`.
pub const SECONDS_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

const ACQUIRE_TOTAL: &str = "dlock_acquire_total";
const ACQUIRE_WAIT: &str = "dlock_acquire_wait_seconds";
const HOLD: &str = "dlock_hold_seconds";
const HELD: &str = "dlock_held";
const LOST_TOTAL: &str = "dlock_lost_total";
const RENEW_TOTAL: &str = "dlock_renew_total";

/// Describes every metric to the current recorder: with each new (backend, group)'s
/// handles, so rarely, and a recorder in place then has the descriptions.
fn describe() {
    metrics::describe_counter!(ACQUIRE_TOTAL, Unit::Count, "Lock acquisitions by outcome: acquired, busy (a try-once found the lock held), timeout (waited and gave up), or the error kind");
    metrics::describe_histogram!(
        ACQUIRE_WAIT,
        Unit::Seconds,
        "Time from an acquire call to its outcome"
    );
    metrics::describe_histogram!(
        HOLD,
        Unit::Seconds,
        "Time from the first acquire to the last release of a hold, by the release's outcome"
    );
    metrics::describe_gauge!(HELD, Unit::Count, "Holds acquired and not yet released");
    metrics::describe_counter!(
        LOST_TOTAL,
        Unit::Count,
        "Holds lost without their owner releasing them, by reason"
    );
    metrics::describe_counter!(
        RENEW_TOTAL,
        Unit::Count,
        "Lease renewals made by the watchdog, by outcome"
    );
}

/// The outcomes whose series are registered up front, in the order of
/// [`Handles::acquires`] and [`Handles::waits`].
const ACQUIRE_OUTCOMES: [AcquireOutcome; 3] = [
    AcquireOutcome::Acquired,
    AcquireOutcome::Busy,
    AcquireOutcome::Timeout,
];

/// The hot-path series of one (backend, group), registered once.
struct Handles {
    acquires: [metrics::Counter; 3],
    waits: [metrics::Histogram; 3],
    held: metrics::Gauge,
    hold_released: metrics::Histogram,
    renewed: metrics::Counter,
}

impl Handles {
    fn new(backend: &'static str, group: &str) -> Self {
        describe();
        let g = || group.to_owned();
        let counter = |o: AcquireOutcome| metrics::counter!(ACQUIRE_TOTAL, "backend" => backend, "group" => g(), "outcome" => o.as_str());
        let wait = |o: AcquireOutcome| metrics::histogram!(ACQUIRE_WAIT, "backend" => backend, "group" => g(), "outcome" => o.as_str());
        Handles {
            acquires: ACQUIRE_OUTCOMES.map(counter),
            waits: ACQUIRE_OUTCOMES.map(wait),
            held: metrics::gauge!(HELD, "backend" => backend, "group" => g()),
            hold_released: metrics::histogram!(HOLD, "backend" => backend, "group" => g(), "outcome" => "released"),
            renewed: metrics::counter!(RENEW_TOTAL, "backend" => backend, "group" => g(), "outcome" => "renewed"),
        }
    }
}

/// group → [(backend, handles)]: one hash per call; a process has few backends.
type HandleMap = HashMap<String, Vec<(&'static str, Arc<Handles>)>>;

/// Records dlock metrics. See the crate docs for names and labels.
pub struct MetricsHandler {
    separator: char,
    handles: RwLock<HandleMap>,
}

impl Default for MetricsHandler {
    /// Groups by the name's prefix up to `:`.
    fn default() -> Self {
        MetricsHandler {
            separator: ':',
            handles: RwLock::new(HandleMap::default()),
        }
    }
}

impl std::fmt::Debug for MetricsHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsHandler")
            .field("separator", &self.separator)
            .finish()
    }
}

impl MetricsHandler {
    /// Sets the character that ends a name's group prefix.
    pub fn with_group_separator(mut self, separator: char) -> Self {
        self.separator = separator;
        self
    }

    fn handles(&self, backend: &'static str, group: &str) -> Arc<Handles> {
        let find = |list: &Vec<(&'static str, Arc<Handles>)>| {
            list.iter()
                .find(|(b, _)| std::ptr::eq(*b, backend) || *b == backend)
                .map(|(_, h)| Arc::clone(h))
        };
        if let Some(h) = self
            .handles
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(group)
            .and_then(find)
        {
            return h;
        }
        let mut map = self.handles.write().unwrap_or_else(PoisonError::into_inner);
        let list = map.entry(group.to_owned()).or_default();
        if let Some(h) = find(list) {
            return h;
        }
        let h = Arc::new(Handles::new(backend, group));
        list.push((backend, Arc::clone(&h)));
        h
    }

    /// The group label of a lock name (see [`dlock_spi::LockName::group`]).
    pub fn group_of<'a>(&self, name: &'a LockName) -> &'a str {
        name.group(self.separator)
    }
}

#[async_trait]
impl LockHandler for MetricsHandler {
    async fn acquire(&self, ctx: &AcquireContext, next: AcquireChain<'_>) -> Result<AcquireResult> {
        let result = next.invoke(ctx).await;
        let group = self.group_of(&ctx.request.name);
        let h = self.handles(ctx.backend, group);
        let waited = ctx.started.elapsed().as_secs_f64();
        let outcome = ctx.outcome(&result);
        if outcome == AcquireOutcome::Acquired {
            h.held.increment(1.0);
        }
        let Some(series) = ACQUIRE_OUTCOMES.iter().position(|o| *o == outcome) else {
            // Errors are rare: register their series on demand.
            let (backend, group, outcome) = (ctx.backend, group.to_owned(), outcome.as_str());
            metrics::counter!(ACQUIRE_TOTAL, "backend" => backend, "group" => group.clone(), "outcome" => outcome).increment(1);
            metrics::histogram!(ACQUIRE_WAIT, "backend" => backend, "group" => group, "outcome" => outcome).record(waited);
            return result;
        };
        h.acquires[series].increment(1);
        h.waits[series].record(waited);
        result
    }

    async fn release(&self, ctx: &ReleaseContext, next: ReleaseChain<'_>) -> Result<ReleaseResult> {
        let result = next.invoke(ctx).await;
        let group = self.group_of(&ctx.request.name);
        let h = self.handles(ctx.backend, group);
        h.held.decrement(1.0);
        if let Some(at) = ctx.acquired_at {
            let held = at.elapsed().as_secs_f64();
            match &result {
                Ok(ReleaseResult::Released) => h.hold_released.record(held),
                other => {
                    let outcome = match other {
                        Err(e) => e.kind().as_str(),
                        _ => "not_owner",
                    };
                    metrics::histogram!(HOLD, "backend" => ctx.backend, "group" => group.to_owned(), "outcome" => outcome)
                        .record(held);
                }
            }
        }
        result
    }

    fn on_renew(&self, event: &RenewEvent<'_>) {
        let group = self.group_of(&event.request.name);
        let outcome = match event.outcome {
            Ok(RenewResult::Renewed { .. }) => {
                self.handles(event.backend, group).renewed.increment(1);
                return;
            }
            Ok(RenewResult::NotOwner) => "not_owner",
            Err(e) => e.kind().as_str(),
        };
        metrics::counter!(RENEW_TOTAL, "backend" => event.backend, "group" => group.to_owned(), "outcome" => outcome)
            .increment(1);
    }

    fn on_lost(&self, event: &LostEvent<'_>) {
        let group = self.group_of(event.name).to_owned();
        metrics::counter!(LOST_TOTAL, "backend" => event.backend, "group" => group, "reason" => event.reason.as_str())
            .increment(1);
    }
}

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
