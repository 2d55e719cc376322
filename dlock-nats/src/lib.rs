//! # dlock-nats — NATS JetStream backend for dlock
//!
//! A [`LockRemoteResource`](dlock_spi::LockRemoteResource) on a JetStream
//! key-value bucket, written against `dlock-spi` alone (and proven with
//! `dlock-tck`), as a third party would write one.
//!
//! ```no_run
//! # async fn demo() -> dlock_spi::Result<()> {
//! let nats = dlock_nats::NatsBackend::connect("nats://127.0.0.1:4222/dlock").await?;
//! // Signed in with a token, over TLS checked against a CA:
//! let secured = dlock_nats::NatsBackend::connect(
//!     "tls://nats1:4222,nats2:4222/locks?token=s3cret&tls_ca=/etc/nats/ca.pem").await?;
//! # Ok(()) }
//! ```
//!
//! An application that has an `async_nats::Client` hands it over with
//! [`NatsBackend::from_client`]. The crate re-exports [`async_nats`], so the
//! versions match.
//!
//! ## Status
//!
//! In the workspace's default test run (`nats` label): the whole conformance kit
//! (`tests/tck.rs`), the lock-history checker under the stop, kill, proxy and
//! server-restart nemeses, and the `dlock` command's own tests. The first design
//! rewrote each contender's key on every renewal; the kit then found a double
//! grant (a holder missing from a snapshot the 2.9 server called complete, its key
//! rewritten while the snapshot was being delivered) — contender keys are now
//! written once, and leases live apart (below).
//!
//! **Limits.** A hold lasts at most half the bucket's `max_age` (default 24 h: 12 h)
//! from its placement: the bucket drops a contender key that old however often its
//! lease was renewed, so renewals stop before then and the holder is told it lost
//! the lock while its last lease still runs (take the lock again for longer). A
//! waiter waiting that long queues again at the back. Release markers stay in the
//! bucket until `max_age` and slow every watch as they pile up (on NATS 2.9 opening
//! a lock's watch costs time in proportion to the bucket's messages): measured, the
//! checker's 6 s run with a stopped worker did 598 operations in a fresh bucket and
//! 122 in one holding 100 000 markers. A bucket under heavy churn wants a shorter
//! `max_age` (the tests use 10 min).
//!
//! ## How it works
//!
//! * **One key per contender**: `<name>.w|r|s.<owner#grant>` (each part one subject
//!   token, other bytes as `=XX`), written once when it queues and deleted once;
//!   its value the lease, for permits the count and the semaphore's total, and
//!   the context.
//! * **Ordered by fencing token**, the key's revision (the stream sequence of its
//!   write) — strictly increasing across the bucket, every lock and every server
//!   restart (the store is kept on disk). A writer holds when no contender came
//!   before it, a reader when no writer did (a waiting writer keeps later readers
//!   out), permits when only permits came before and all fit in the total. Fair by
//!   construction. Since contender keys are never rewritten, a snapshot of them
//!   misses none that exists.
//! * **Leases apart, judged on the server's clock**: each contender's lease lives
//!   under `=.<name>.<owner#grant>`, rewritten by every renewal (one write naming
//!   the revision last written); until the first renewal the contender lives by
//!   its key's write. A waiter judges a lease run out against the server's clock
//!   (the timestamp of a write of its own, read back), then *claims* it — a
//!   tombstone written over exactly the revision it judged — before deleting the
//!   contender: a renewal racing the claim lands first (the claim fails) or finds
//!   the tombstone (not owner). Every grant renews its own lease first. (NATS 2.9
//!   has no per-key TTL; the bucket's `max_age` only sweeps up release markers and
//!   long-dead keys.)
//! * **Wake-ups** come from one watch (an ordered consumer) on the lock's keys
//!   per waiter: a release, deletion or renewal reaches each waiter of that lock,
//!   which judges its own turn from what it already knows — no reads of the
//!   store, only the waiter it lets in acts.
//! * **No orphans**: a cancelled or timed-out acquire deletes its key (after its
//!   create, on the same connection); a waiter that dies leaves a key that runs
//!   out of lease.
//!
//! Elections run on exclusive holds (observers poll `inspect`); downgrades and
//! upgrades (a read beside the owner's write) are not offered: the manager answers
//! `Unsupported`.
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod acquire;
mod backend;
mod config;
mod connect;
mod error;
mod feed;
mod keys;
mod lease;
mod queue;

pub use async_nats;
pub use backend::NatsBackend;
pub use config::{NatsAuth, NatsOptions};

/// The README's examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
