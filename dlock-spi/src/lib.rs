//! # dlock-spi — the contracts of dlock
//!
//! Everything a third party needs to write a **backend** or a **handler plugin** for
//! dlock, and nothing else:
//!
//! * [`LockRemoteResource`] — the backend trait (capabilities, try-acquire with a
//!   deadline, release, renew, inspect). Its docs list the semantics each method must
//!   honour; the `testsuite` crate checks them.
//! * [`LockHandler`] with [`AcquireChain`] / [`ReleaseChain`] — interceptors on the
//!   acquire and release paths, composed by [`HandlerChain`] as
//!   Head → handlers in registration order → Tail → backend.
//! * [`HoldWatch`] / [`HoldFeed`] — how a session-bound backend (ZooKeeper) tells the
//!   manager that a hold is suspended or lost.
//! * Value types: [`LockName`] (validated), [`OwnerId`], [`GrantId`] and [`HolderKey`]
//!   (one grant's identity), [`FencingToken`],
//!   [`LockMode`], [`Fairness`], requests, results, [`Capabilities`].
//! * [`Error`] with a non-exhaustive [`ErrorKind`] and [`Error::is_retryable`].
//! * [`Backoff`] policies for backends that wait by polling, with [`Pacer`] for a
//!   loop's pauses and [`Backoff::retry`] for calls sent again up to a deadline.
//! * [`TaskGuard`] for a task that stops with its owner, and [`spawn_cleanup`] for
//!   work a dropped call leaves to finish.
//! * [`InMemoryBackend`] — the reference backend, for tests and single-process use.
//!
//! ## Writing a backend
//!
//! Implement [`LockRemoteResource`] for your client type, map your driver's errors to
//! [`Error`] in one function, declare what you support in [`Capabilities`], and run the
//! `testsuite` conformance cases against it. Read [`InMemoryBackend`]'s source for a
//! complete example of waiting, fairness, wake-one and cancellation.
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod backoff;
mod batch;
mod capabilities;
mod chain;
mod deadline;
mod driver_url;
mod error;
mod events;
mod extensions;
mod hold_watch;
mod memory;
mod name;
mod outcome;
mod redact;
mod request;
mod resource;
mod resubscribe;
#[cfg(feature = "serde")]
mod serde_impls;
mod task;
mod tls;
mod types;
mod url;
mod url_option;

pub use backoff::{Backoff, BackoffKind, Jitter, Pacer};
pub use batch::split_batch;
pub use capabilities::Capabilities;
pub use chain::{
    lease_out_of_range, AcquireChain, AcquireContext, AcquireOutcome, HandlerChain, LockHandler,
    LostEvent, ReleaseChain, ReleaseContext, RenewEvent, MAX_CONTEXT_LEN, MAX_LEASE, MIN_LEASE,
};
pub use driver_url::DriverUrl;
pub use error::{Error, ErrorKind, Result};
pub use events::{ChangeFeed, LockEvents};
pub use extensions::Extensions;
pub use hold_watch::{HoldFeed, HoldStatus, HoldWatch};
pub use memory::InMemoryBackend;
pub use name::LockName;
pub use outcome::{AcquireResult, HolderInfo, LockState, ReleaseResult, RenewResult};
pub use redact::redact_url;
pub use request::{AcquireRequest, ReleaseRequest, RenewRequest};
pub use resource::{BatchRenew, IntoResource, LockAdmin, LockRemoteResource};
pub use resubscribe::{Drained, Resubscribe, Subscription};
pub use task::{spawn_cleanup, TaskGuard};
pub use tls::{read_pem_file, TlsFiles, TlsIdentity};
pub use types::{
    Fairness, FencingToken, GrantId, HoldPurpose, HolderKey, LockMode, LostReason, OwnerId,
};
pub use url::{BackendUrl, UrlSpec};
pub use url_option::{parse_url_duration, percent_decode};

/// Re-exported so implementors use the same `async_trait` and `bytes` as the traits.
pub use async_trait::async_trait;
pub use bytes::Bytes;

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
