//! The tower layer: one request per key at a time, Busy when the wait runs out.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use dlock_api::tower::{LockLayer, LockedError};
use dlock_api::{DistributeLockManager, InMemoryBackend};
use tokio::sync::{oneshot, Mutex};
use tower::{service_fn, Layer, ServiceExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_is_serialised_other_keys_run_and_busy_is_reported() {
    let manager = DistributeLockManager::builder(InMemoryBackend::new())
        .build()
        .unwrap();
    let (entered_tx, entered_rx) = oneshot::channel::<()>();
    let (finish_tx, finish_rx) = oneshot::channel::<()>();
    let hooks = Arc::new(Mutex::new((Some(entered_tx), Some(finish_rx))));
    let m = manager.clone();
    let service = service_fn(move |req: String| {
        let hooks = Arc::clone(&hooks);
        let m = m.clone();
        async move {
            if req == "user:1 slow" {
                let (entered, finish) = {
                    let mut h = hooks.lock().await;
                    (h.0.take(), h.1.take())
                };
                // The lock is held while the inner service runs.
                assert!(m.inspect("user:1").await.unwrap().is_some());
                let _ = entered.unwrap().send(());
                let _ = finish.unwrap().await;
            }
            Ok::<_, std::convert::Infallible>(format!("done {req}"))
        }
    });
    let layer = LockLayer::new(manager.clone(), |req: &String| {
        req.split_whitespace().next().map(str::to_owned)
    });
    let svc = layer.layer(service);

    let slow = tokio::spawn(svc.clone().oneshot("user:1 slow".to_owned()));
    entered_rx.await.unwrap();
    match svc.clone().oneshot("user:1 fast".to_owned()).await {
        Err(LockedError::Busy { lock }) => assert_eq!(lock, "user:1"),
        other => panic!("expected Busy, got {other:?}"),
    }
    assert_eq!(
        svc.clone().oneshot("user:2 fast".to_owned()).await.unwrap(),
        "done user:2 fast"
    );
    finish_tx.send(()).unwrap();
    assert_eq!(slow.await.unwrap().unwrap(), "done user:1 slow");
    assert!(
        manager.inspect("user:1").await.unwrap().is_none(),
        "the lock was not released"
    );

    // With a wait, the second request runs after the first.
    let waiting = LockLayer::new(manager.clone(), |req: &String| Some(req.clone()))
        .wait(Duration::from_secs(2));
    let svc = waiting.layer(service_fn(|req: String| async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        Ok::<_, std::convert::Infallible>(req)
    }));
    let (a, b) = tokio::join!(
        svc.clone().oneshot("k".to_owned()),
        svc.clone().oneshot("k".to_owned())
    );
    assert!(a.is_ok() && b.is_ok());
}

/// Each cause of a `LockedError` is printed once by a reporter that prints the
/// error and walks `source()`: the lock's error is a source, not part of the text,
/// and an inner error is shown as itself with its own causes.
#[test]
fn locked_errors_print_each_cause_once() {
    fn report(e: &dyn std::error::Error) -> String {
        let mut text = e.to_string();
        let mut cause = e.source();
        while let Some(c) = cause {
            text.push_str(&format!(": {c}"));
            cause = c.source();
        }
        text
    }
    let io = || std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "peer-said-no");
    let lock: LockedError<dlock_api::Error> =
        LockedError::Lock(dlock_api::Error::backend("cannot reach the server").with_source(io()));
    let text = report(&lock);
    assert_eq!(text.matches("peer-said-no").count(), 1, "{text}");
    assert_eq!(text.matches("cannot reach the server").count(), 1, "{text}");
    let inner: LockedError<dlock_api::Error> =
        LockedError::Inner(dlock_api::Error::backend("the handler failed").with_source(io()));
    let text = report(&inner);
    assert_eq!(text.matches("peer-said-no").count(), 1, "{text}");
    assert_eq!(text.matches("the handler failed").count(), 1, "{text}");
}
