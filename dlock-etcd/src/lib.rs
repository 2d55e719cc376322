//! # dlock-etcd — etcd backend for dlock
//!
//! A [`LockRemoteResource`](dlock_spi::LockRemoteResource) on the `etcd-client`
//! crate, following etcd's own lock recipe (`clientv3/concurrency`'s `Mutex`).
//!
//! ```no_run
//! # async fn demo() -> dlock_spi::Result<()> {
//! let etcd = dlock_etcd::EtcdBackend::connect(
//!     "etcd://127.0.0.1:2379,127.0.0.1:12379,127.0.0.1:22379/apps/orders").await?;
//! # Ok(()) }
//! ```
//!
//! ## How it works
//!
//! * **One key per contender** under the lock's range:
//!   `<prefix>\0<name>\0w/<owner>#<grant>` for a writer (an exclusive hold),
//!   `…\0r/…` for a reader. Names and prefixes hold no control characters, so
//!   each NUL ends one and no name reaches another lock's keys, nor one prefix
//!   another's.
//! * **Ordered by create revision**, etcd's cluster-wide counter: a writer holds when
//!   no key of the lock was created before its own, a reader when no writer was.
//!   Each waiter watches only the deletion of the last such key before it (no herd)
//!   and looks again. Fair by construction; non-fair requests get the same order.
//! * **One round trip to decide** once the lease is granted: the key's create and
//!   the look at the first contender ahead are one transaction.
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
//!
//! Read-write locks are supported; semaphores, and a read or write beside the
//! owner's own hold in the other mode (downgrades, upgrades), are not yet:
//! requests for them get `Unsupported` from the manager.
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod backend;
mod error;
mod keepalive;
mod keys;

use std::time::Duration;

use dlock_spi::{parse_url_duration, redact_url, Error, ErrorKind, Result};

pub use backend::EtcdBackend;

/// Settings of an [`EtcdBackend`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EtcdOptions {
    /// The key prefix every lock lives under. Default `dlock`.
    pub prefix: String,
    /// How long one request may take before it fails with `Timeout`. Default 5 s.
    pub timeout: Duration,
    /// How long connecting to a member may take. Default 3 s.
    pub connect_timeout: Duration,
    /// HTTP/2 keep-alive ping interval, while a call is in flight, that finds a
    /// dead connection (a ping unanswered for 5 s closes it). Default 10 s; etcd
    /// closes connections that ping more often than its `--grpc-keepalive-min-time`
    /// (5 s by default).
    pub keep_alive: Duration,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            prefix: "dlock".to_owned(),
            timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(3),
            keep_alive: Duration::from_secs(10),
        }
    }
}

impl EtcdOptions {
    /// Sets the key prefix.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Sets the request timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

/// A parsed `etcd://` URL.
#[derive(Debug)]
struct EtcdUrl {
    hosts: Vec<String>,
    options: EtcdOptions,
}

/// Parses `etcd://host:port[,host:port…][/prefix][?option=value&…]`.
///
/// Options: `timeout`, `connect_timeout` (`5s`, `2500ms`).
fn parse_url(url: &str, mut options: EtcdOptions) -> Result<EtcdUrl> {
    let shown = redact_url(url);
    let bad = |what: String| {
        Error::new(
            ErrorKind::Config,
            format!("etcd URL {shown:?}: {what}; write it as etcd://host:2379,host2:2379/prefix?timeout=5s"),
        )
    };
    let rest = url
        .strip_prefix("etcd://")
        .ok_or_else(|| bad("the scheme must be etcd://".into()))?;
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, prefix) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, ""),
    };
    if authority.contains('@') {
        return Err(bad(
            "credentials are not supported yet; use an etcd without authentication on a private network".into(),
        ));
    }
    if authority.is_empty() || authority.split(',').any(|h| h.trim().is_empty()) {
        return Err(bad("no host given (or an empty one between commas)".into()));
    }
    let hosts = authority
        .split(',')
        .map(|h| {
            let h = h.trim();
            if h.contains(':') {
                h.to_owned()
            } else {
                format!("{h}:2379")
            }
        })
        .collect();
    let prefix = prefix.trim_end_matches('/');
    if !prefix.is_empty() {
        options.prefix = prefix.to_owned();
    }
    if options.prefix.is_empty() || options.prefix.chars().any(char::is_control) {
        return Err(bad(
            "the prefix must be non-empty, without control characters".into(),
        ));
    }
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let duration = || {
            parse_url_duration(value)
                .filter(|d| !d.is_zero())
                .ok_or_else(|| {
                    bad(format!(
                        "{key}={value:?} is not a duration like 5s or 2500ms"
                    ))
                })
        };
        match key {
            "timeout" => options.timeout = duration()?,
            "connect_timeout" => options.connect_timeout = duration()?,
            _ => {
                return Err(bad(format!(
                    "unknown option {key:?} (known: timeout, connect_timeout)"
                )))
            }
        }
    }
    Ok(EtcdUrl { hosts, options })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_and_bad_ones_say_what_is_wrong() {
        let u = parse_url(
            "etcd://127.0.0.1:2379,localhost/apps/x/?timeout=2s",
            EtcdOptions::default(),
        );
        let Ok(u) = u else { panic!("{u:?}") };
        assert_eq!(u.hosts, ["127.0.0.1:2379", "localhost:2379"]);
        assert_eq!(u.options.prefix, "apps/x");
        assert_eq!(u.options.timeout, Duration::from_secs(2));
        for (url, says) in [
            ("redis://x", "scheme"),
            ("etcd:///p", "no host"),
            ("etcd://a,,b", "no host"),
            ("etcd://a?timeout=soon", "timeout"),
            ("etcd://a?color=red", "unknown option"),
            ("etcd://u:secret@a", "credentials"),
        ] {
            let err = parse_url(url, EtcdOptions::default())
                .err()
                .map(|e| e.to_string());
            let err = err.unwrap_or_default();
            assert!(err.contains(says), "{url}: {err}");
            assert!(!err.contains("secret"), "{url}: {err}");
        }
    }
}

/// The README's examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
