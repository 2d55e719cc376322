//! # dlock-zk — ZooKeeper backend for dlock
//!
//! A [`LockRemoteResource`](dlock_spi::LockRemoteResource) on the `zookeeper-client`
//! crate, following Apache Curator's lock recipes so that Java services using Curator's
//! `InterProcessMutex` (or `InterProcessReadWriteLock`, see [`ExclusiveNode`]) on the
//! same path are mutually excluded with dlock.
//!
//! ```no_run
//! # async fn demo() -> dlock_spi::Result<()> {
//! let zk = dlock_zk::ZkBackend::connect(
//!     "zk://127.0.0.1:2181,127.0.0.1:2182/apps/orders/locks?session_timeout=10s").await?;
//! # Ok(()) }
//! ```
//!
//! ## TLS
//!
//! With the `tls` feature, `zks://` connects over TLS (a server's
//! `secureClientPort`): `zks://host:2281/root?tls_ca=ca.pem&tls_cert=client.pem&tls_key=client-key.pem`.
//! The servers are verified against the CA of `tls_ca` (a PEM file; required, as
//! ZooKeeper's certificates come from a private CA) and by their address;
//! `tls_cert` and `tls_key` give a client certificate for servers that require one
//! (`ssl.clientAuth=need`). The digest password of the URL then travels encrypted.
//! The `zookeeper-client` crate builds its TLS on the process's default rustls
//! crypto provider and takes no other: install one early in `main`
//! (`rustls::crypto::ring::default_provider().install_default()`); without one
//! `zks://` is refused with a `Config` error rather than a panic. The layout stays
//! Curator's: a Java service on the same ensemble (over TLS or not) shares the locks.
//!
//! ## How it works
//!
//! * **Layout** `<root>/<escaped name>/_c_<owner uuid>-lock-<sequence>`: one ephemeral
//!   sequential node per contender under the lock's node (a container, which the server
//!   deletes once empty). Names are one path segment: `/`, `%`, `.`, `..` and
//!   `zookeeper` are percent-encoded, so no name escapes the root or reaches another
//!   lock. [`ZkBackend::lock_path`] tells the path a Java service must use.
//! * **Fair by construction**: the lowest sequence holds; each waiter watches only the
//!   node just before it (no herd); a reader holds when no writer is ahead of it and
//!   watches the first writer ahead. Non-fair requests get the same order.
//! * **Read-write locks with one owner**, Curator-compatible: a writer's read node
//!   is placed at its write node's sequence (a downgrade lets no queued writer in);
//!   an upgradeable read's upgrade is a write node named so that it sorts right
//!   behind the readers that may hold (`…-__WRIT__<their last key><sequence>`),
//!   judged on the queue as it was when it was made — Curator's readers queued
//!   behind a writer stay out even when that writer gives up.
//! * **One round trip to acquire** when the lock is free: the create and the listing
//!   of the children are sent back to back on the session, which ZooKeeper serves in
//!   order, so the listing already contains the new node.
//! * **No orphans**: the node's prefix is derived from the owner, so after a connection
//!   loss the owner finds the node it may have created; a timed-out or cancelled
//!   acquire deletes its node.
//! * **Blips ridden out**: a request whose answer a dropped connection took is sent
//!   again once the connection is back, the session living on, within the call's
//!   wait (a waiter's queueing and its looks at the queue); a try-once call may answer
//!   with a retryable error instead.
//! * **Fencing token**: the node's creation zxid — strictly increasing across all
//!   clients, all locks, and the deletion of the lock's node. Reentry keeps it.
//! * **Session, not lease**: holds need no renewal (the watchdog stays idle). Each hold
//!   pushes its status to its guard: *suspended* as soon as the connection drops,
//!   *lost* ([`LostReason::SessionExpired`](dlock_spi::LostReason)) when the session
//!   expires or stays disconnected for 0.4 × the session timeout — early enough that
//!   the server cannot have handed the lock to another client yet (see the `session`
//!   module's notes for the exact bound) — and lost
//!   ([`LostReason::NotOwner`](dlock_spi::LostReason)) when someone deletes the node.
//! * **Semaphores** in Curator's `InterProcessSemaphoreV2` layout:
//!   `<lock>/locks/_c_<uuid>-lock-<seq>` (the recipe's mutex, which serialises lease
//!   creation in arrival order) and `<lock>/leases/_c_<uuid>-lease-<seq>`, one
//!   ephemeral node per permit; the mutex's holder waits until the leases number at
//!   most the total. Java services using the recipe share the semaphore with dlock.
//!   When nobody queues in the mutex, dlock grants in one round trip without it: it
//!   creates its leases and, in the same flight, lists the leases and the mutex's
//!   queue; it keeps them if the queue is empty and the leases fit the total, and
//!   otherwise deletes them and queues in the mutex. Safe because every grant is
//!   decided by a listing made after its own creates (the last-created of any set of
//!   concurrent holders saw all the others).
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod acls;
mod acquire;
mod admin;
mod backend;
mod config;
mod connect;
mod error;
mod follow;
mod hold_feed;
mod layout;
mod nodes;
mod queue;
mod semaphore;
mod session;
mod upgrade;

pub use backend::ZkBackend;
pub use config::ZkOptions;
pub use layout::ExclusiveNode;
/// The `zookeeper-client` crate this backend is built on: an application's own
/// `zookeeper_client::Connector` goes to [`ZkBackend::from_connector`] from this
/// re-export, so the versions always match.
pub use zookeeper_client;

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
