//! Flow control and coalescing on the in-memory backend (chain unit tests).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_plugin_flow_control::{CoalescingHandler, FlowControlHandler, OnLimit};
use dlock_spi::{
    AcquireContext, AcquireRequest, ErrorKind, HandlerChain, InMemoryBackend, LockHandler,
    LockMode, LockName, LockRemoteResource, OwnerId, ReleaseContext, ReleaseRequest,
};

fn req(name: &str, owner: &str, wait: Option<Duration>) -> AcquireRequest {
    AcquireRequest::new(
        LockName::new(name).unwrap(),
        OwnerId::new(owner),
        dlock_spi::GrantId::new(1),
    )
    .with_lease(Duration::from_secs(5))
    .with_deadline(wait.map(|w| Instant::now() + w))
}

fn chain(backend: &InMemoryBackend, h: Arc<dyn LockHandler>) -> HandlerChain {
    HandlerChain::new(Arc::new(backend.clone()), vec![h])
}

#[tokio::test]
async fn rate_limit_rejects_per_group_and_leaves_other_groups_alone() {
    let backend = InMemoryBackend::new();
    let c = chain(
        &backend,
        Arc::new(FlowControlHandler::default().with_rate_limit(NonZeroU32::new(2).unwrap())),
    );
    for i in 0..2 {
        let mut ctx = AcquireContext::new(req(&format!("hot:{i}"), "o", None), "memory");
        assert!(c.acquire(&mut ctx).await.unwrap().is_acquired());
    }
    let mut ctx = AcquireContext::new(req("hot:3", "o", None), "memory");
    let err = c.acquire(&mut ctx).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Rejected);
    assert!(err.to_string().contains("\"hot\""), "{err}");
    assert_eq!(
        backend.acquire_attempts(),
        2,
        "a rejected call reached the backend"
    );
    let mut other = AcquireContext::new(req("cold:1", "o", None), "memory");
    assert!(c.acquire(&mut other).await.unwrap().is_acquired());
}

#[tokio::test]
async fn rate_limit_can_wait_within_the_callers_deadline() {
    let backend = InMemoryBackend::new();
    let c = chain(
        &backend,
        Arc::new(
            FlowControlHandler::default()
                .with_rate_limit(NonZeroU32::new(10).unwrap())
                .with_on_limit(OnLimit::Wait),
        ),
    );
    let start = Instant::now();
    for i in 0..12 {
        let mut ctx = AcquireContext::new(
            req(&format!("g:{i}"), "o", Some(Duration::from_secs(2))),
            "memory",
        );
        assert!(c.acquire(&mut ctx).await.unwrap().is_acquired());
    }
    // 10 in the burst, 2 more at 10/s: about 200 ms.
    assert!(
        start.elapsed() >= Duration::from_millis(150),
        "{:?}",
        start.elapsed()
    );
    let mut hurried =
        AcquireContext::new(req("g:x", "o", Some(Duration::from_millis(1))), "memory");
    for _ in 0..20 {
        let _ = c
            .acquire(&mut AcquireContext::new(req("g:y", "o", None), "memory"))
            .await;
    }
    assert_eq!(
        c.acquire(&mut hurried).await.unwrap_err().kind(),
        ErrorKind::Rejected
    );
}

#[tokio::test]
async fn concurrency_limit_counts_calls_in_flight() {
    let backend = InMemoryBackend::new();
    let c = chain(
        &backend,
        Arc::new(FlowControlHandler::default().with_concurrency_limit(1)),
    );
    // Hold "busy:a" elsewhere so the next acquire waits at the backend (in flight).
    let mut holder = AcquireContext::new(req("busy:a", "holder", None), "memory");
    assert!(c.acquire(&mut holder).await.unwrap().is_acquired());
    let c2 = c.clone();
    let waiting = tokio::spawn(async move {
        let mut ctx =
            AcquireContext::new(req("busy:a", "w", Some(Duration::from_secs(5))), "memory");
        c2.acquire(&mut ctx).await.map(|r| r.is_acquired())
    });
    // Wait until the first call is parked at the backend.
    let t = Instant::now();
    while backend.acquire_attempts() < 2 && t.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut second = AcquireContext::new(req("busy:b", "x", None), "memory");
    assert_eq!(
        c.acquire(&mut second).await.unwrap_err().kind(),
        ErrorKind::Rejected
    );
    let rel = ReleaseContext::new(
        ReleaseRequest::new(
            holder.request.name.clone(),
            OwnerId::new("holder"),
            dlock_spi::GrantId::new(1),
            LockMode::Exclusive,
            dlock_spi::FencingToken::new(0),
        ),
        "memory",
        None,
    );
    c.release(&rel).await.unwrap();
    assert!(waiting.await.unwrap().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalescing_lets_one_acquirer_per_lock_reach_the_backend() {
    let backend = InMemoryBackend::new();
    let coalescing = Arc::new(CoalescingHandler::default());
    let c = chain(&backend, coalescing.clone());
    let mut holder = AcquireContext::new(req("hot", "holder", None), "memory");
    let token = c.acquire(&mut holder).await.unwrap().token().unwrap();
    let mut tasks = Vec::new();
    for i in 0..8 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let mut ctx = AcquireContext::new(
                req("hot", &format!("w{i}"), Some(Duration::from_secs(10))),
                "memory",
            );
            let t = c.acquire(&mut ctx).await.unwrap().token().unwrap();
            let rel = ReleaseContext::new(
                ReleaseRequest::new(
                    ctx.request.name.clone(),
                    ctx.request.owner.clone(),
                    ctx.request.grant,
                    LockMode::Exclusive,
                    t,
                ),
                "memory",
                None,
            );
            c.release(&rel).await.unwrap();
        }));
    }
    // The holder took its lock through the same handler, so all eight waiters queue
    // locally: none of them reaches the backend while it holds. (A negative check
    // needs a window.)
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(
        backend.acquire_attempts(),
        1,
        "a local waiter reached the backend"
    );
    let state = backend
        .inspect(&LockName::new("hot").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(state.waiters, Some(0), "waiters at the backend");
    let rel = ReleaseContext::new(
        ReleaseRequest::new(
            holder.request.name.clone(),
            OwnerId::new("holder"),
            dlock_spi::GrantId::new(1),
            LockMode::Exclusive,
            token,
        ),
        "memory",
        None,
    );
    c.release(&rel).await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    // One backend acquire per acquisition: the holder's and one per waiter.
    assert_eq!(backend.acquire_attempts(), 1 + 8);
    assert_eq!(
        coalescing.queued_locks(),
        0,
        "local queues were not cleaned up"
    );
}

/// An upgrade (a write beside the owner's own read) does not queue behind this
/// process's other writers: they wait for that read, so the upgrade waiting for
/// them would never end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalescing_lets_an_upgrade_past_local_writers() {
    use dlock_spi::GrantId;
    let backend = InMemoryBackend::new();
    let c = Arc::new(chain(&backend, Arc::new(CoalescingHandler::default())));
    let read = req("doc", "upgrader", None).with_mode(LockMode::Shared);
    let mut ctx = AcquireContext::new(read, "memory");
    assert!(c.acquire(&mut ctx).await.unwrap().is_acquired());
    // Another owner of this process waits to write: it holds the local turn.
    let writer = Arc::clone(&c);
    let waiting = tokio::spawn(async move {
        let mut ctx =
            AcquireContext::new(req("doc", "writer", Some(Duration::from_secs(5))), "memory");
        writer.acquire(&mut ctx).await.unwrap().is_acquired()
    });
    let probe = backend.clone();
    let queued = async {
        let name = LockName::new("doc").unwrap();
        loop {
            let waiters = probe.inspect(&name).await.unwrap().and_then(|s| s.waiters);
            if waiters.unwrap_or(0) > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), queued)
        .await
        .expect("the writer queued");
    let upgrade = AcquireRequest::new(
        LockName::new("doc").unwrap(),
        OwnerId::new("upgrader"),
        GrantId::new(2),
    )
    .with_lease(Duration::from_secs(5))
    .with_alongside(Some(GrantId::new(1)))
    .with_deadline(Some(Instant::now() + Duration::from_secs(2)));
    let mut ctx = AcquireContext::new(upgrade, "memory");
    assert!(
        c.acquire(&mut ctx).await.unwrap().is_acquired(),
        "the upgrade waited behind a local writer that waits for its read"
    );
    let release = |owner: &str, grant: u64, mode| {
        ReleaseContext::new(
            ReleaseRequest::new(
                LockName::new("doc").unwrap(),
                OwnerId::new(owner),
                GrantId::new(grant),
                mode,
                dlock_spi::FencingToken::new(0),
            ),
            "memory",
            None,
        )
    };
    c.release(&release("upgrader", 2, LockMode::Exclusive))
        .await
        .unwrap();
    c.release(&release("upgrader", 1, LockMode::Shared))
        .await
        .unwrap();
    assert!(waiting.await.unwrap(), "the writer is granted in the end");
}
