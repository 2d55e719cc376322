//! # dlock-etcd — etcd backend for dlock
//!
//! A [`LockRemoteResource`](dlock_spi::LockRemoteResource) on the `etcd-client`
//! crate, following etcd's own lock recipe (`clientv3/concurrency`'s `Mutex`).
//!
//! ```no_run
//! # async fn demo() -> dlock_spi::Result<()> {
//! let etcd = dlock_etcd::EtcdBackend::connect(
//!     "etcd://127.0.0.1:2379,127.0.0.1:12379,127.0.0.1:22379/apps/orders").await?;
//! // With etcd's authentication, over TLS with a client certificate (`tls` feature):
//! let secured = dlock_etcd::EtcdBackend::connect(
//!     "etcds://app:s3cret@etcd1:2379,etcd2:2379/apps/orders\
//!      ?tls_ca=/etc/etcd/ca.pem&tls_cert=/etc/etcd/app.pem&tls_key=/etc/etcd/app-key.pem").await?;
//! # Ok(()) }
//! ```
//!
//! An application that has an `etcd_client::Client` already hands it over with
//! [`EtcdBackend::from_client`]: its endpoints, credentials and TLS are used as they
//! are.
//!
//! ## Security
//!
//! * **Authentication**: `etcd://user:password@…` (or [`EtcdOptions::credentials`])
//!   signs in as an etcd user; the client renews its token when etcd says it
//!   expired. The user needs read and write permission on the key prefix only
//!   (`etcdctl role grant-permission <role> --prefix=true readwrite <prefix>`).
//!   The password shows in no `Debug`, `Display` or error.
//! * **TLS** (`etcds://`, the crate's `tls` feature): the members are verified
//!   against the CA of `tls_ca` (a PEM file) or, without it, the system's roots;
//!   `tls_cert` and `tls_key` give a client certificate for members started with
//!   `--client-cert-auth`. The rustls crypto provider is the application's, if it
//!   installed one as the process default; otherwise ring's (dlock installs none).
//!
//! ## How it works
//!
//! * **One key per contender** under the lock's range:
//!   `<prefix>\0<name>\0w/<owner>#<grant>` for a writer (an exclusive hold),
//!   `…\0r/…` for a reader, `…\0s/<permits>/…` for permits of a semaphore (its
//!   value starts with `<total>\n`, then the context). Names and prefixes hold
//!   no control characters, so each NUL ends one and no name reaches another lock's
//!   keys, nor one prefix another's.
//! * **Ordered by create revision**, etcd's cluster-wide counter: a writer holds when
//!   no key of the lock was created before its own, a reader when no writer or
//!   permits were, permits when only permits were and all of them, its own
//!   included, fit in the total. Each waiter watches only the deletion of the last
//!   such key before it (no herd) and looks again; a permit waiter watches the
//!   lock's deletions and counts them against the keys it saw ahead of it, looking
//!   again only when they leave room for its own — a release wakes the waiters it
//!   frees, each told by the release itself, never through another waiter's client.
//!   Fair by construction; non-fair requests get the same order (permits always go
//!   in arrival order).
//! * **Semaphore totals**: the semaphore's total is its oldest permit key's. A
//!   permit key is placed only while that key is still the one read (or no permit
//!   key exists) — a compare in the placing transaction — so every permit key shares
//!   one total; a request naming another, while anyone holds or waits for permits,
//!   is refused (`InvalidArgument`) before it writes anything. Once the semaphore is
//!   idle the next request sets it.
//! * **One round trip to decide** once the lease is granted: the key's create and
//!   the look at the contenders ahead (the first one; for permits, all of their
//!   keys) are one transaction; a permit request's read of the semaphore's total
//!   goes alongside the lease grant.
//! * **Fencing token**: the key's create revision — strictly increasing across the
//!   cluster, every lock and every restart; a retried acquire of the same grant finds
//!   its key and answers the same token.
//! * **The hold's lease is an etcd lease** of the hold's own, with a TTL of the
//!   requested lease rounded up to whole seconds (etcd may raise it to its minimum):
//!   the key vanishes with it. The manager's watchdog renews it; every refresh of
//!   every hold and waiter of one backend goes through **one keep-alive stream**. A
//!   renewal checks that the key is still there (a force-release or a revoked lease
//!   answers `NotOwner`); an extend past the TTL moves the key to a new lease.
//! * **Waiters keep their own lease alive** while they wait; a waiter whose key was
//!   removed (force-release, lease lost during a pause) queues again at the back.
//! * **No orphans**: a cancelled or timed-out acquire revokes its lease, which
//!   removes its key even if the create was still in flight (a create naming a
//!   revoked lease fails) — a release can never be overtaken by its grant's create.
//! * **Election observers** follow one watch on the lock's keys
//!   ([`LockEvents`](dlock_spi::LockEvents)); a broken watch is started again and
//!   the observer told to read again.
//!
//! Read-write locks and semaphores are supported; a read or write beside the
//! owner's own hold in the other mode (downgrades, upgrades) is not yet: requests
//! for it get `Unsupported` from the manager.
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod acquire;
mod admin;
mod backend;
mod config;
mod connect;
mod error;
mod follow;
mod keepalive;
mod keys;
mod renew_batch;
mod resend;
mod tls;

pub use backend::EtcdBackend;
pub use config::{EtcdCredentials, EtcdOptions};
pub use dlock_spi::TlsIdentity;
/// The `etcd-client` crate this backend is built on: an application hands its own
/// `etcd_client::Client` to [`EtcdBackend::from_client`] from this re-export, so
/// the versions always match.
pub use etcd_client;

/// The README's examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
