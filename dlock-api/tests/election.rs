//! Election behaviour that needs a test double around the in-memory backend: a
//! contender that panics, and a term whose grant arrives inside its transition window.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::Wrapped;
use dlock_api::spi::async_trait;
use dlock_api::{Contender, DistributeLockManager, Term, TermEnd};

struct Panicky {
    terms: Arc<AtomicUsize>,
}

#[async_trait]
impl Contender for Panicky {
    async fn on_acquired(&self, _term: Term) {
        self.terms.fetch_add(1, Ordering::SeqCst);
        panic!("the leader's work failed");
    }

    async fn on_released(&self, _term: Term, end: TermEnd) {
        assert_eq!(end, TermEnd::WorkDone);
    }
}

struct Steady;

#[async_trait]
impl Contender for Steady {
    async fn on_acquired(&self, term: Term) {
        term.stepping_down().await;
    }
}

/// A contender whose work panics ends its term (no longer leader), resigns, and
/// stays in the race; the other contender gets the leadership.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_contender_gives_the_leadership_up() {
    let backend = Wrapped::default();
    let m = DistributeLockManager::builder(backend.clone())
        .build()
        .unwrap();
    let terms = Arc::new(AtomicUsize::new(0));
    let panicky = m
        .election("p")
        .contend(
            "panicky",
            Panicky {
                terms: Arc::clone(&terms),
            },
        )
        .unwrap();
    // Its first term has begun (and panicked) before the steady one queues.
    let first = tokio::time::timeout(Duration::from_secs(5), async {
        while terms.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(first.is_ok(), "the panicky contender never led");
    let steady = m.election("p").contend("steady", Steady).unwrap();
    let mut leading = steady.leading();
    tokio::time::timeout(Duration::from_secs(5), leading.wait_for(|t| t.is_some()))
        .await
        .expect("the steady contender leads after the panicking one gave up")
        .unwrap();
    assert!(
        !panicky.is_leader(),
        "the panicking contender still says it leads"
    );
    panicky.stop().await;
    steady.stop().await;
    m.close().await;
    assert_eq!(backend.inner.active_locks(), 0);
}

/// With a transition window, a grant whose answer arrives after the holder's own
/// lease (inside the window) is not handed out: the term would start suspended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_term_that_arrives_in_its_window_is_not_handed_out() {
    let backend = Wrapped::default();
    let own = Duration::from_millis(300);
    let m = DistributeLockManager::builder(backend.clone())
        .lease(own)
        .build()
        .unwrap();
    backend.stall_after_grant.store(true, Ordering::SeqCst);
    let election = m.election("late").transition(Duration::from_secs(5));
    let campaign = tokio::spawn(async move {
        election
            .try_campaign("x", Duration::ZERO)
            .await
            .map(|t| t.map(|t| t.is_suspended()))
    });
    backend.granted.notified().await;
    // The answer is held back past the term's own lease, well inside the window.
    tokio::time::sleep(own + Duration::from_millis(50)).await;
    backend.stall_after_grant.store(false, Ordering::SeqCst);
    backend.release_gate.notify_one();
    let got = campaign.await.unwrap().unwrap();
    assert_eq!(got, None, "a term that arrived suspended was handed out");
    m.close().await;
}

/// The value of the stream's next change, within 3 s.
async fn next<S>(changes: &mut S) -> Option<dlock_api::spi::Bytes>
where
    S: futures_util::Stream<Item = dlock_api::Result<Option<dlock_api::Leader>>> + Unpin,
{
    use futures_util::StreamExt as _;
    tokio::time::timeout(Duration::from_secs(3), changes.next())
        .await
        .expect("a change within 3 s")
        .expect("the stream goes on")
        .expect("no error")
        .map(|l| l.value)
}

/// `observe().into_stream()` yields the same changes as `changed()`: nobody, the
/// leader, its proclaimed value, nobody — in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_observer_stream_yields_every_change_in_order() {
    let m = DistributeLockManager::connect("memory://").await.unwrap();
    let election = m.election("streamed");
    let mut changes = Box::pin(election.observe().into_stream());
    assert_eq!(next(&mut changes).await, None);
    let term = election
        .try_campaign("a", Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(next(&mut changes).await, Some("a".into()));
    term.proclaim("b").await.unwrap();
    assert_eq!(next(&mut changes).await, Some("b".into()));
    term.resign().await.unwrap();
    assert_eq!(next(&mut changes).await, None);
    m.close().await;
}

/// A leader value is held to the same bound as any holder context: an oversized
/// proclaim is refused before it reaches the store.
#[tokio::test]
async fn an_oversized_proclaim_is_refused() {
    let m = DistributeLockManager::connect("memory://").await.unwrap();
    let term = m
        .election("big")
        .try_campaign("a", Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    let big = vec![b'x'; dlock_api::spi::MAX_CONTEXT_LEN + 1];
    let err = term.proclaim(big).await.expect_err("an oversized value");
    assert_eq!(err.kind(), dlock_api::ErrorKind::InvalidArgument, "{err}");
    term.resign().await.unwrap();
    m.close().await;
}
