//! The Grafana dashboard in the repo queries only series the handler exports, rendered
//! by the real Prometheus exporter with the recommended buckets.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use dlock_plugin_metrics::{MetricsHandler, SECONDS_BUCKETS};
use dlock_spi::{
    async_trait, AcquireChain, AcquireContext, AcquireRequest, AcquireResult, Error, ErrorKind,
    HandlerChain, InMemoryBackend, LockHandler, LockMode, LockName, LostEvent, LostReason, OwnerId,
    ReleaseChain, ReleaseContext, ReleaseRequest, ReleaseResult, RenewRequest, Result,
};
use metrics_exporter_prometheus::PrometheusBuilder;

/// Refuses locks of the group "blocked", as flow control would.
struct Refuse;

#[async_trait]
impl LockHandler for Refuse {
    async fn acquire(&self, ctx: &AcquireContext, next: AcquireChain<'_>) -> Result<AcquireResult> {
        if ctx.request.name.as_str().starts_with("blocked:") {
            return Err(Error::new(ErrorKind::Rejected, "refused by test"));
        }
        next.invoke(ctx).await
    }
    async fn release(&self, ctx: &ReleaseContext, next: ReleaseChain<'_>) -> Result<ReleaseResult> {
        next.invoke(ctx).await
    }
}

#[test]
fn every_dashboard_query_names_an_exported_series() {
    let recorder = PrometheusBuilder::new()
        .set_buckets(SECONDS_BUCKETS)
        .unwrap()
        .build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let chain = HandlerChain::new(
                Arc::new(InMemoryBackend::new()),
                vec![Arc::new(MetricsHandler::default()), Arc::new(Refuse)],
            );
            let name = LockName::new("orders:1").unwrap();
            let owner = OwnerId::new("o");
            let mut ctx = AcquireContext::new(
                AcquireRequest::new(name.clone(), owner.clone(), dlock_spi::GrantId::new(1))
                    .with_lease(Duration::from_secs(5)),
                "memory",
            );
            let token = chain.acquire(&mut ctx).await.unwrap().token().unwrap();
            chain
                .renew(&RenewRequest::new(
                    name.clone(),
                    owner.clone(),
                    dlock_spi::GrantId::new(1),
                    LockMode::Exclusive,
                    Duration::from_secs(5),
                    token,
                ))
                .await
                .unwrap();
            let rel = ReleaseContext::new(
                ReleaseRequest::new(
                    name.clone(),
                    owner.clone(),
                    dlock_spi::GrantId::new(1),
                    LockMode::Exclusive,
                    token,
                ),
                "memory",
                Some(ctx.started),
            );
            chain.release(&rel).await.unwrap();
            let mut blocked = AcquireContext::new(
                AcquireRequest::new(
                    LockName::new("blocked:1").unwrap(),
                    owner.clone(),
                    dlock_spi::GrantId::new(1),
                ),
                "memory",
            );
            assert!(chain.acquire(&mut blocked).await.is_err());
            chain.notify_lost(&LostEvent::new(
                "memory",
                &name,
                &owner,
                LockMode::Exclusive,
                token,
                LostReason::LeaseExpired,
            ));
        });
    });
    let rendered = handle.render();

    let raw = include_str!("../../dashboards/dlock-grafana.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(raw).expect("the dashboard is valid JSON");
    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let legend = target["legendFormat"].as_str().unwrap_or_default();
            exprs.push((
                target["expr"].as_str().unwrap().to_owned(),
                legend.to_owned(),
            ));
        }
    }
    assert!(exprs.len() >= 6);
    for (expr, legend) in &exprs {
        // Every label the query groups by, filters on or names in its legend is on
        // the series it reads.
        let metric = expr
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .find(|w| w.starts_with("dlock_"))
            .expect("a query of a dlock series");
        let mut labels: Vec<&str> = Vec::new();
        for by in expr.split("by (").skip(1) {
            labels.extend(by.split(')').next().unwrap().split(',').map(str::trim));
        }
        for shown in legend.split("{{").skip(1) {
            labels.extend(shown.split("}}").next().map(str::trim));
        }
        for filter in expr.split('{').skip(1) {
            let inside = filter.split('}').next().unwrap();
            labels.extend(
                inside
                    .split(',')
                    .filter_map(|m| m.split(['=', '!']).next().map(str::trim)),
            );
        }
        // `job` and `instance` are Prometheus's own, put on every series it scrapes.
        for label in labels
            .into_iter()
            .filter(|l| !l.is_empty() && !matches!(*l, "le" | "job" | "instance"))
        {
            assert!(
                rendered
                    .lines()
                    .any(|l| l.starts_with(metric) && l.contains(&format!("{label}=\""))),
                "dashboard query {expr:?} uses the label {label} that {metric} does not carry:\n{rendered}"
            );
        }

        for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if word.starts_with("dlock_") {
                assert!(
                    rendered.lines().any(|l| l.starts_with(word)),
                    "dashboard query {expr:?} uses {word}, which the exporter does not emit:\n{rendered}"
                );
            }
        }
    }
}

/// How the dashboard reads as a dashboard: every panel says its unit; every rate
/// uses Grafana's `$__rate_interval` (a fixed `[1m]` is empty below a 15 s scrape
/// interval's four samples, and coarse above); `backend`, `job` and `instance`
/// variables beside `group`, and every query filtered on all four; a lock lost is
/// counted by its `reason`, not an `outcome`.
#[test]
fn the_dashboard_has_units_rate_intervals_and_filters() {
    let raw = include_str!("../../dashboards/dlock-grafana.json");
    let dashboard: serde_json::Value = serde_json::from_str(raw).unwrap();
    let variables: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    for wanted in ["group", "backend", "job", "instance"] {
        assert!(
            variables.contains(&wanted),
            "no ${wanted} variable: {variables:?}"
        );
    }
    for panel in dashboard["panels"].as_array().unwrap() {
        let title = panel["title"].as_str().unwrap_or_default();
        let unit = panel["fieldConfig"]["defaults"]["unit"].as_str();
        assert!(
            unit.is_some_and(|u| !u.is_empty()),
            "panel {title:?} has no unit"
        );
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            if expr.contains("rate(") {
                assert!(
                    expr.contains("[$__rate_interval]") && !expr.contains("[1m]"),
                    "panel {title:?}: {expr}"
                );
            }
            for (label, variable) in [
                ("group", "$group"),
                ("backend", "$backend"),
                ("job", "$job"),
                ("instance", "$instance"),
            ] {
                assert!(
                    expr.contains(&format!("{label}=~\"{variable}\"")),
                    "panel {title:?} does not filter on {label}: {expr}"
                );
            }
            if expr.contains("dlock_lost_total") {
                assert!(expr.contains("by (reason)"), "panel {title:?}: {expr}");
            }
        }
    }
}

/// A lost hold is counted with its reason in a `reason` label.
#[test]
fn a_lost_hold_is_counted_by_reason() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        let chain = HandlerChain::new(
            Arc::new(InMemoryBackend::new()),
            vec![Arc::new(MetricsHandler::default())],
        );
        chain.notify_lost(&LostEvent::new(
            "memory",
            &LockName::new("orders:1").unwrap(),
            &OwnerId::new("o"),
            LockMode::Exclusive,
            dlock_spi::FencingToken::new(7),
            LostReason::LeaseExpired,
        ));
    });
    let rendered = handle.render();
    assert!(
        rendered.lines().any(|l| l.starts_with("dlock_lost_total{")
            && l.contains("reason=\"lease_expired\"")
            && !l.contains("outcome=")),
        "{rendered}"
    );
}
