//! # dlock-plugin-metrics — metrics for dlock
//!
//! [`MetricsHandler`] records through the [`metrics`] facade (install any recorder,
//! e.g. `metrics-exporter-prometheus`):
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `dlock_acquire_total` | counter | `outcome` (acquired, timeout, or the error kind), `backend`, `group` |
//! | `dlock_acquire_wait_seconds` | histogram | `backend`, `group` |
//! | `dlock_hold_seconds` | histogram — first acquire to last release of a (reentrant) hold | `backend`, `group` |
//! | `dlock_held` | gauge | `backend`, `group` |
//! | `dlock_lost_total` | counter | `reason`, `group` |
//! | `dlock_renew_total` | counter | `outcome` (renewed, not_owner, error) |
//! | `dlock_rejected_total` | counter | `group` (calls refused by a handler further in) |
//!
//! `group` is the lock name up to the first separator (`:` by default) — `orders:42`
//! → `orders` — never the full name, so label cardinality stays bounded. Names without
//! the separator are grouped as `-`.
//!
//! The handler registers its metrics once per (backend, group) and keeps the handles,
//! so the hot path does no label allocation or registry lookup: **install your
//! recorder before the first lock operation** (as with most `metrics` users).
//!
//! ```no_run
//! use dlock_plugin_metrics::MetricsHandler;
//! let handler = MetricsHandler::default().with_group_separator('/');
//! # let _ = handler;
//! ```
#![deny(missing_docs)]

use std::sync::{Arc, PoisonError, RwLock};

use async_trait::async_trait;
use dlock_spi::{
    AcquireChain, AcquireContext, AcquireResult, ErrorKind, LockHandler, LockName, LostEvent,
    ReleaseChain, ReleaseContext, ReleaseResult, RenewEvent, RenewResult, Result,
};

/// Histogram bucket bounds (seconds) that suit lock waits and holds; give them to your
/// exporter (e.g. `PrometheusBuilder::set_buckets`) so dashboards can compute
/// quantiles with `histogram_quantile`.
pub const SECONDS_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// The hot-path metrics of one (backend, group), registered once.
struct Handles {
    acquired: metrics::Counter,
    timeout: metrics::Counter,
    wait: metrics::Histogram,
    held: metrics::Gauge,
    hold: metrics::Histogram,
}

impl Handles {
    fn new(backend: &'static str, group: &str) -> Self {
        let g = group.to_owned();
        Handles {
            acquired: metrics::counter!("dlock_acquire_total", "outcome" => "acquired", "backend" => backend, "group" => g.clone()),
            timeout: metrics::counter!("dlock_acquire_total", "outcome" => "timeout", "backend" => backend, "group" => g.clone()),
            wait: metrics::histogram!("dlock_acquire_wait_seconds", "backend" => backend, "group" => g.clone()),
            held: metrics::gauge!("dlock_held", "backend" => backend, "group" => g.clone()),
            hold: metrics::histogram!("dlock_hold_seconds", "backend" => backend, "group" => g),
        }
    }
}

/// group → [(backend, handles)]: one hash per call; a process has few backends.
type HandleMap = std::collections::HashMap<String, Vec<(&'static str, Arc<Handles>)>>;

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
        h.wait.record(ctx.started.elapsed().as_secs_f64());
        match &result {
            Ok(AcquireResult::Acquired { .. }) => {
                h.acquired.increment(1);
                h.held.increment(1.0);
            }
            Ok(AcquireResult::NotAcquired { .. }) => h.timeout.increment(1),
            Err(e) => {
                // Errors are rare: register their series on demand.
                metrics::counter!("dlock_acquire_total", "outcome" => e.kind().as_str(), "backend" => ctx.backend, "group" => group.to_owned())
                    .increment(1);
                if e.kind() == ErrorKind::Rejected {
                    metrics::counter!("dlock_rejected_total", "group" => group.to_owned())
                        .increment(1);
                }
            }
        }
        result
    }

    async fn release(&self, ctx: &ReleaseContext, next: ReleaseChain<'_>) -> Result<ReleaseResult> {
        let result = next.invoke(ctx).await;
        let h = self.handles(ctx.backend, self.group_of(&ctx.request.name));
        h.held.decrement(1.0);
        if let Some(at) = ctx.acquired_at {
            h.hold.record(at.elapsed().as_secs_f64());
        }
        result
    }

    fn on_renew(&self, event: &RenewEvent<'_>) {
        let outcome = match event.outcome {
            Ok(RenewResult::Renewed { .. }) => "renewed",
            Ok(RenewResult::NotOwner) => "not_owner",
            Err(_) => "error",
        };
        metrics::counter!("dlock_renew_total", "outcome" => outcome).increment(1);
    }

    fn on_lost(&self, event: &LostEvent<'_>) {
        let group = self.group_of(event.name).to_owned();
        metrics::counter!("dlock_lost_total", "reason" => event.reason.as_str(), "group" => group)
            .increment(1);
    }
}
