//! Opening backend clients for a label, in-process or at a URL, and putting a fault
//! proxy in front of a URL's hosts.

use std::net::SocketAddr;
use std::sync::Arc;

use async_trait::async_trait;
use dlock_jdbc::JdbcBackend;
use dlock_redis::RedisBackend;
use dlock_spi::{Error, ErrorKind, InMemoryBackend, LockRemoteResource, Result};
use dlock_zk::ZkBackend;

use crate::backends::{self, ServerClient};

use super::broken::{self, BrokenBackend};

/// Whether `label` runs its "processes" as tasks of one process (its store cannot be
/// shared between processes).
pub fn in_process(label: &str) -> bool {
    label == "memory" || label == broken::LABEL
}

/// Whether the checker knows `label`.
pub fn known(label: &str) -> bool {
    label == broken::LABEL || backends::KNOWN.contains(&label)
}

/// Where a worker gets its clients from.
#[async_trait]
pub trait ClientSource: Send + Sync + 'static {
    /// A new client (a new connection or pool where the backend has them).
    async fn open(&self) -> Result<Arc<dyn LockRemoteResource>>;
}

/// Clients of one in-process store (memory, broken-memory).
pub struct SharedStore(pub Arc<dyn LockRemoteResource>);

impl SharedStore {
    /// A fresh store for an in-process label.
    pub fn for_label(label: &str) -> Result<SharedStore> {
        match label {
            "memory" => Ok(SharedStore(Arc::new(InMemoryBackend::new()))),
            broken::LABEL => Ok(SharedStore(BrokenBackend::new().client())),
            other => Err(Error::new(
                ErrorKind::Config,
                format!("{other:?} is not an in-process backend"),
            )),
        }
    }
}

#[async_trait]
impl ClientSource for SharedStore {
    async fn open(&self) -> Result<Arc<dyn LockRemoteResource>> {
        Ok(Arc::clone(&self.0))
    }
}

/// Clients of a server-backed label at a URL, opened as the conformance suite opens
/// them (`ServerClient::open`, so e.g. `redis-polling` gets polling options).
pub struct ServerStore {
    /// The label.
    pub label: String,
    /// The URL (possibly rewritten to go through a fault proxy).
    pub url: String,
}

#[async_trait]
impl ClientSource for ServerStore {
    async fn open(&self) -> Result<Arc<dyn LockRemoteResource>> {
        let label = self.label.as_str();
        let url = self.url.as_str();
        Ok(match label {
            "sqlite" | "mysql" | "postgres" => {
                Arc::new(<JdbcBackend as ServerClient>::open(label, url).await?)
            }
            "redis" | "redis-polling" | "redis-cluster" | "redis-tls" | "redis-cluster-tls" => {
                Arc::new(<RedisBackend as ServerClient>::open(label, url).await?)
            }
            "zk" | "zk-ensemble" => Arc::new(<ZkBackend as ServerClient>::open(label, url).await?),
            other => {
                return Err(Error::new(
                    ErrorKind::Config,
                    format!("lockcheck cannot open a server client for {other:?}"),
                ))
            }
        })
    }
}

/// Why the proxy nemesis cannot be used with `label`, if it cannot.
pub fn proxy_not_applicable(label: &str) -> Option<&'static str> {
    match label {
        "memory" | broken::LABEL => Some("in-process backend, no connection to fault"),
        "sqlite" => Some("a local file, no connection to fault"),
        "redis-cluster" | "redis-cluster-tls" => {
            Some("cluster redirects name the nodes' own addresses and bypass a proxy")
        }
        _ => None,
    }
}

/// A URL split around its host list: `scheme://[user@]` + hosts + `[/path][?query]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitUrl {
    /// Everything before the first host.
    pub head: String,
    /// The hosts, all on loopback.
    pub hosts: Vec<SocketAddr>,
    /// Everything after the last host.
    pub tail: String,
}

/// Splits `url` around its comma-separated `host:port` list. Only loopback hosts
/// (`127.0.0.1`, `localhost`, `[::1]`) with explicit ports are accepted.
pub fn split_url(url: &str) -> std::result::Result<SplitUrl, String> {
    let scheme_end = url
        .find("://")
        .ok_or_else(|| "the URL has no scheme://".to_owned())?
        + 3;
    let rest = &url[scheme_end..];
    let authority_len = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..authority_len];
    let hosts_start = authority.rfind('@').map_or(0, |i| i + 1);
    let mut hosts = Vec::new();
    for host in authority[hosts_start..].split(',') {
        let host = host.replace("localhost", "127.0.0.1");
        let addr: SocketAddr = host
            .parse()
            .map_err(|_| format!("{host:?} is not a loopback host:port"))?;
        if !addr.ip().is_loopback() {
            return Err(format!("{host} is not on loopback"));
        }
        hosts.push(addr);
    }
    Ok(SplitUrl {
        head: url[..scheme_end + hosts_start].to_owned(),
        hosts,
        tail: rest[authority_len..].to_owned(),
    })
}

impl SplitUrl {
    /// The URL with its hosts replaced by `hosts`.
    pub fn with_hosts(&self, hosts: &[SocketAddr]) -> String {
        let list: Vec<String> = hosts.iter().map(ToString::to_string).collect();
        format!("{}{}{}", self.head, list.join(","), self.tail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_and_rewrite() {
        let u = split_url("mysql://root@127.0.0.1:3306/test").unwrap();
        assert_eq!(u.head, "mysql://root@");
        assert_eq!(u.tail, "/test");
        let p: SocketAddr = "127.0.0.1:9".parse().unwrap();
        assert_eq!(u.with_hosts(&[p]), "mysql://root@127.0.0.1:9/test");
        let z = split_url("zk://127.0.0.1:2191,localhost:2192/dlock-test").unwrap();
        assert_eq!(z.hosts.len(), 2);
        let r = split_url("rediss://127.0.0.1:6390/?tls_ca=/x/ca.crt").unwrap();
        assert_eq!(r.tail, "/?tls_ca=/x/ca.crt");
        assert!(split_url("redis://10.0.0.1:6379").is_err());
        let plain = split_url("redis://127.0.0.1:6379").unwrap();
        assert_eq!(plain.with_hosts(&[p]), "redis://127.0.0.1:9");
    }
}
