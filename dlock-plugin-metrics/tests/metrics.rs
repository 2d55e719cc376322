//! What the metrics handler records, read back from a debugging recorder.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_plugin_metrics::MetricsHandler;
use dlock_spi::{
    AcquireContext, AcquireRequest, HandlerChain, InMemoryBackend, LockMode, LockName, LostEvent,
    LostReason, OwnerId, ReleaseContext, ReleaseRequest,
};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::MetricKind;

#[derive(Debug, PartialEq)]
enum V {
    Counter(u64),
    Gauge(f64),
    Histogram(Vec<f64>),
}

fn find(
    snapshot: &[(
        metrics_util::CompositeKey,
        Option<metrics::Unit>,
        Option<metrics::SharedString>,
        DebugValue,
    )],
    kind: MetricKind,
    name: &str,
    labels: &[(&str, &str)],
) -> Option<V> {
    snapshot.iter().find_map(|(key, _, _, value)| {
        let k = key.key();
        let matches = key.kind() == kind
            && k.name() == name
            && labels
                .iter()
                .all(|(l, v)| k.labels().any(|lab| lab.key() == *l && lab.value() == *v));
        if !matches {
            return None;
        }
        Some(match value {
            DebugValue::Counter(c) => V::Counter(*c),
            DebugValue::Gauge(g) => V::Gauge(g.into_inner()),
            DebugValue::Histogram(h) => V::Histogram(h.iter().map(|x| x.into_inner()).collect()),
        })
    })
}

#[test]
fn records_acquires_holds_losses_and_groups_by_prefix() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let backend = Arc::new(InMemoryBackend::new());
            let chain = HandlerChain::new(backend, vec![Arc::new(MetricsHandler::default())]);
            let name = LockName::new("orders:42").unwrap();
            let req = |owner: &str| {
                AcquireRequest::new(
                    name.clone(),
                    OwnerId::new(owner),
                    dlock_spi::GrantId::new(1),
                )
                .with_lease(Duration::from_secs(5))
            };
            let mut a = AcquireContext::new(req("a"), "memory");
            let token = chain.acquire(&mut a).await.unwrap().token().unwrap();
            // A try-once finds it held (busy); a waiting call gives up (timeout).
            let mut b = AcquireContext::new(req("b"), "memory");
            assert!(!chain.acquire(&mut b).await.unwrap().is_acquired());
            let mut c = AcquireContext::new(
                req("c").with_deadline(Some(Instant::now() + Duration::from_millis(30))),
                "memory",
            );
            assert!(!chain.acquire(&mut c).await.unwrap().is_acquired());
            tokio::time::sleep(Duration::from_millis(20)).await; // the hold being measured
            let rel = ReleaseContext::new(
                ReleaseRequest::new(
                    name.clone(),
                    OwnerId::new("a"),
                    dlock_spi::GrantId::new(1),
                    LockMode::Exclusive,
                    token,
                ),
                "memory",
                Some(a.started),
            );
            chain.release(&rel).await.unwrap();
            chain.notify_lost(&LostEvent::new(
                "memory",
                &name,
                &OwnerId::new("a"),
                LockMode::Exclusive,
                token,
                LostReason::NotOwner,
            ));
        });
    });
    let snap = snapshotter.snapshot().into_vec();
    let acquired = find(
        &snap,
        MetricKind::Counter,
        "dlock_acquire_total",
        &[
            ("outcome", "acquired"),
            ("group", "orders"),
            ("backend", "memory"),
        ],
    );
    assert_eq!(acquired, Some(V::Counter(1)));
    for outcome in ["busy", "timeout"] {
        let refused = find(
            &snap,
            MetricKind::Counter,
            "dlock_acquire_total",
            &[("outcome", outcome), ("group", "orders")],
        );
        assert_eq!(refused, Some(V::Counter(1)), "{outcome}");
    }
    match find(
        &snap,
        MetricKind::Histogram,
        "dlock_acquire_wait_seconds",
        &[("outcome", "timeout"), ("group", "orders")],
    ) {
        Some(V::Histogram(v)) => assert!(v.len() == 1 && v[0] >= 0.03, "{v:?}"),
        other => panic!("no wait histogram of the timeout: {other:?}"),
    }
    assert_eq!(
        find(
            &snap,
            MetricKind::Gauge,
            "dlock_held",
            &[("group", "orders")]
        ),
        Some(V::Gauge(0.0))
    );
    match find(
        &snap,
        MetricKind::Histogram,
        "dlock_hold_seconds",
        &[("group", "orders"), ("outcome", "released")],
    ) {
        Some(V::Histogram(v)) => assert!(v.len() == 1 && v[0] >= 0.02, "{v:?}"),
        other => panic!("no hold histogram: {other:?}"),
    }
    assert_eq!(
        find(
            &snap,
            MetricKind::Counter,
            "dlock_lost_total",
            &[
                ("reason", "not_owner"),
                ("group", "orders"),
                ("backend", "memory")
            ]
        ),
        Some(V::Counter(1))
    );
    // One label set: backend and group on every series, outcome on every counter and
    // histogram (reason on the losses'); each metric described with a unit and help;
    // the full name never a label value.
    for (key, unit, help, _) in &snap {
        let labels: Vec<&str> = key.key().labels().map(|l| l.key()).collect();
        let mut want = vec!["backend", "group"];
        if key.key().name() == "dlock_lost_total" {
            want.push("reason");
        } else if key.kind() != MetricKind::Gauge {
            want.push("outcome");
        }
        let mut have = labels.clone();
        have.sort_unstable();
        want.sort_unstable();
        assert_eq!(have, want, "{key:?}");
        assert!(unit.is_some() && help.is_some(), "{key:?} is not described");
        assert!(
            key.key().labels().all(|l| l.value() != "orders:42"),
            "{key:?}"
        );
    }
    let names: std::collections::HashSet<&str> =
        snap.iter().map(|(k, _, _, _)| k.key().name()).collect();
    for name in [
        "dlock_acquire_total",
        "dlock_acquire_wait_seconds",
        "dlock_hold_seconds",
        "dlock_held",
        "dlock_lost_total",
    ] {
        assert!(names.contains(name), "{name} was not recorded");
    }
}

#[test]
fn group_is_the_prefix_up_to_the_separator() {
    let n = |s: &str| LockName::new(s).unwrap();
    let h = MetricsHandler::default();
    assert_eq!(h.group_of(&n("user:7:cart")), "user");
    assert_eq!(h.group_of(&n("plain")), "-");
    assert_eq!(h.group_of(&n(":x")), "-");
    let slash = MetricsHandler::default().with_group_separator('/');
    assert_eq!(slash.group_of(&n("a/b")), "a");
    assert_eq!(slash.group_of(&n("a:b")), "-");
}
