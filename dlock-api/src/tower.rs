//! A `tower` layer that runs a service while holding a lock named from the request —
//! per user, per idempotency key, per resource (feature `tower`).
//!
//! ```no_run
//! # fn demo(manager: dlock_api::DistributeLockManager) {
//! use std::time::Duration;
//! use dlock_api::tower::LockLayer;
//! // Requests carrying the same key run one at a time, across every replica.
//! let layer = LockLayer::new(manager, |req: &String| Some(format!("req:{req}")))
//!     .wait(Duration::from_millis(200));
//! # let _ = layer; }
//! ```
//!
//! When the lock is not acquired within the wait the service answers
//! [`LockedError::Busy`]; map it to a response (e.g. HTTP 409) with your framework's
//! error handling (axum: `HandleErrorLayer`). Requests for which the key function
//! returns `None` run without a lock.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tower_layer::Layer;
use tower_service::Service;

use crate::DistributeLockManager;

/// Wraps services so each request runs under the lock its key names.
pub struct LockLayer<K> {
    manager: DistributeLockManager,
    key: Arc<K>,
    wait: Duration,
    lease: Option<Duration>,
}

impl<K> Clone for LockLayer<K> {
    fn clone(&self) -> Self {
        LockLayer {
            manager: self.manager.clone(),
            key: Arc::clone(&self.key),
            wait: self.wait,
            lease: self.lease,
        }
    }
}

impl<K> fmt::Debug for LockLayer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockLayer")
            .field("wait", &self.wait)
            .field("lease", &self.lease)
            .finish()
    }
}

impl<K> LockLayer<K> {
    /// Locks `key(&request)` (`None`: no lock) around every call. Defaults: no wait
    /// (try once), lease renewed by the manager's watchdog.
    pub fn new(manager: DistributeLockManager, key: K) -> Self {
        LockLayer {
            manager,
            key: Arc::new(key),
            wait: Duration::ZERO,
            lease: None,
        }
    }

    /// How long a request may wait for its lock before it is answered `Busy`.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// A fixed lease instead of watchdog renewal (the lock frees itself after it).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }
}

impl<S, K> Layer<S> for LockLayer<K> {
    type Service = LockService<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        LockService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`LockLayer`] produces.
pub struct LockService<S, K> {
    inner: S,
    layer: LockLayer<K>,
}

impl<S: Clone, K> Clone for LockService<S, K> {
    fn clone(&self) -> Self {
        LockService {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S, K> fmt::Debug for LockService<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockService")
            .field("layer", &self.layer)
            .finish()
    }
}

/// Why a locked call did not produce the inner service's response.
#[derive(Debug)]
pub enum LockedError<E> {
    /// The request's lock stayed held by someone else for the whole wait.
    Busy {
        /// The lock's name.
        lock: String,
    },
    /// Taking the lock failed (backend unreachable, invalid name, …).
    Lock(crate::Error),
    /// The inner service failed.
    Inner(E),
}

impl<E: fmt::Display> fmt::Display for LockedError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockedError::Busy { lock } => {
                write!(f, "lock {lock:?} is held by another request; retry later")
            }
            LockedError::Lock(_) => f.write_str("could not take the request's lock"),
            LockedError::Inner(e) => fmt::Display::fmt(e, f),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for LockedError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LockedError::Busy { .. } => None,
            LockedError::Lock(e) => Some(e),
            // Displayed as the inner error itself: its causes are this one's.
            LockedError::Inner(e) => e.source(),
        }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, K, Req> Service<Req> for LockService<S, K>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    S::Response: Send,
    K: Fn(&Req) -> Option<String> + Send + Sync + 'static,
    Req: Send + 'static,
{
    type Response = S::Response;
    type Error = LockedError<S::Error>;
    type Future = BoxFuture<Result<S::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(LockedError::Inner)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        // The ready service handles this request; a fresh clone takes its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let name = (self.layer.key)(&req);
        let manager = self.layer.manager.clone();
        let (wait, lease) = (self.layer.wait, self.layer.lease);
        Box::pin(async move {
            let Some(name) = name else {
                return inner.call(req).await.map_err(LockedError::Inner);
            };
            let lock = manager.lock(&name);
            let acquired = match lease {
                Some(lease) => {
                    lock.try_lock_with(wait, &crate::LockOptions::new().lease(lease))
                        .await
                }
                None => lock.try_lock(wait).await,
            };
            let guard = match acquired {
                Ok(Some(guard)) => guard,
                Ok(None) => return Err(LockedError::Busy { lock: name }),
                Err(e) => return Err(LockedError::Lock(e)),
            };
            let response = inner.call(req).await;
            if let Err(e) = guard.unlock().await {
                tracing::warn!(lock = %name, error = &e as &dyn std::error::Error, "dlock: the request's lock was not held to the end");
            }
            response.map_err(LockedError::Inner)
        })
    }
}
