//! What the handler chain costs: acquire+release on the in-memory backend called
//! directly (the floor), through Head+Tail alone, through three pass-through handlers,
//! and through the full user API (manager, handle, guard, watchdog registration);
//! and a semaphore's acquire + release against the lock's own cycle.
//!
//! Run: `cargo bench -p testsuite --bench chain`
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use dlock_api::DistributeLockManager;
use dlock_spi::{
    async_trait, AcquireChain, AcquireContext, AcquireRequest, AcquireResult, HandlerChain,
    InMemoryBackend, LockHandler, LockMode, LockName, LockRemoteResource, OwnerId, ReleaseChain,
    ReleaseContext, ReleaseRequest, ReleaseResult, Result,
};

/// Does nothing but pass the call on: the cost of one link.
struct PassThrough;

#[async_trait]
impl LockHandler for PassThrough {
    async fn acquire(&self, ctx: &AcquireContext, next: AcquireChain<'_>) -> Result<AcquireResult> {
        next.invoke(ctx).await
    }
    async fn release(&self, ctx: &ReleaseContext, next: ReleaseChain<'_>) -> Result<ReleaseResult> {
        next.invoke(ctx).await
    }
}

fn handlers(n: usize) -> Vec<Arc<dyn LockHandler>> {
    (0..n)
        .map(|_| Arc::new(PassThrough) as Arc<dyn LockHandler>)
        .collect()
}

/// One acquire + release through `chain`.
async fn chain_cycle(chain: &HandlerChain, request: &AcquireRequest) {
    let mut ctx = AcquireContext::new(request.clone(), "memory");
    let token = chain.acquire(&mut ctx).await.unwrap().token().unwrap();
    let rel = ReleaseRequest::new(
        request.name.clone(),
        request.owner.clone(),
        request.grant,
        LockMode::Exclusive,
        token,
    );
    let ctx = ReleaseContext::new(rel, "memory", Some(ctx.started));
    assert_eq!(chain.release(&ctx).await.unwrap(), ReleaseResult::Released);
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let name = LockName::new("bench").unwrap();
    let owner = OwnerId::new("bench-owner");
    let request = AcquireRequest::new(name.clone(), owner.clone(), dlock_spi::GrantId::new(1))
        .with_lease(Duration::from_secs(30));
    let mut group = c.benchmark_group("acquire_release");

    let backend = InMemoryBackend::new();
    group.bench_function("backend_direct", |b| {
        b.to_async(&rt).iter(|| async {
            let token = backend
                .try_acquire(&request)
                .await
                .unwrap()
                .token()
                .unwrap();
            let rel = ReleaseRequest::new(
                name.clone(),
                owner.clone(),
                dlock_spi::GrantId::new(1),
                LockMode::Exclusive,
                token,
            );
            assert_eq!(
                backend.release(&rel).await.unwrap(),
                ReleaseResult::Released
            );
        })
    });

    for n in [0usize, 3] {
        let chain = HandlerChain::new(Arc::new(InMemoryBackend::new()), handlers(n));
        group.bench_function(format!("chain_{n}_handlers"), |b| {
            b.to_async(&rt).iter(|| chain_cycle(&chain, &request))
        });
    }

    // The three stock plugins: logging (no subscriber: a disabled level), metrics with
    // a real Prometheus recorder installed, and flow control with limits never reached.
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .unwrap();
    let stock: Vec<Arc<dyn LockHandler>> = vec![
        Arc::new(dlock_api::logging::LoggingHandler::default()),
        Arc::new(dlock_api::metrics::MetricsHandler::default()),
        Arc::new(
            dlock_api::flow_control::FlowControlHandler::default()
                .with_rate_limit(std::num::NonZeroU32::new(u32::MAX).unwrap())
                .with_concurrency_limit(1 << 16),
        ),
    ];
    for (label, one) in [
        ("chain_logging_only", 0usize),
        ("chain_metrics_only", 1),
        ("chain_flow_control_only", 2),
    ] {
        let chain = HandlerChain::new(
            Arc::new(InMemoryBackend::new()),
            vec![Arc::clone(&stock[one])],
        );
        group.bench_function(label, |b| {
            b.to_async(&rt).iter(|| chain_cycle(&chain, &request))
        });
    }
    let chain = HandlerChain::new(Arc::new(InMemoryBackend::new()), stock);
    group.bench_function("chain_stock_plugins", |b| {
        b.to_async(&rt).iter(|| chain_cycle(&chain, &request))
    });
    assert!(recorder.render().contains("dlock_acquire_total"));

    let manager = rt.block_on(async {
        let mut builder = DistributeLockManager::builder(InMemoryBackend::new());
        for h in handlers(3) {
            builder = builder.with_shared_handler(h);
        }
        builder.build().unwrap()
    });
    let lock = manager.lock("bench");
    group.bench_function("api_try_lock_unlock_3_handlers", |b| {
        b.to_async(&rt).iter(|| async {
            let g = lock.try_lock(Duration::ZERO).await.unwrap().unwrap();
            g.unlock().await.unwrap();
        })
    });
    group.finish();

    // A semaphore's acquire + release against the lock's own cycle, same backend,
    // user API, no handlers (issue 14's target: ≥ 0.8× the lock's cycles per second).
    let mut group = c.benchmark_group("semaphore_vs_lock");
    let plain = DistributeLockManager::builder(InMemoryBackend::new())
        .build()
        .unwrap();
    let lock = plain.lock("bench");
    group.bench_function("lock_try_lock_unlock", |b| {
        b.to_async(&rt).iter(|| async {
            let g = lock.try_lock(Duration::ZERO).await.unwrap().unwrap();
            g.unlock().await.unwrap();
        })
    });
    let semaphore = plain.semaphore("bench-sem", 4);
    group.bench_function("semaphore_try_acquire_release", |b| {
        b.to_async(&rt).iter(|| async {
            let p = semaphore
                .try_acquire(1, Duration::ZERO)
                .await
                .unwrap()
                .unwrap();
            p.release().await.unwrap();
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
