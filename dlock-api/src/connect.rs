//! Opening a backend from a URL, so the CLI, config files and tests select backends
//! the same way.

use std::sync::Arc;

use dlock_spi::{redact_url, Error, ErrorKind, InMemoryBackend, LockRemoteResource, Result};

/// The URL schemes this build opens (aliases included), as the error for another
/// one lists them.
pub const SUPPORTED: &[&str] = &[
    "memory://",
    "mem://",
    #[cfg(feature = "sqlite")]
    "sqlite://",
    #[cfg(feature = "mysql")]
    "mysql://",
    #[cfg(feature = "mysql")]
    "mariadb://",
    #[cfg(feature = "postgres")]
    "postgres://",
    #[cfg(feature = "postgres")]
    "postgresql://",
    #[cfg(feature = "redis")]
    "redis://",
    #[cfg(feature = "redis")]
    "rediss://",
    #[cfg(feature = "redis")]
    "redis+cluster://",
    #[cfg(feature = "redis")]
    "rediss+cluster://",
    #[cfg(feature = "redis")]
    "redis+sentinel://",
    #[cfg(feature = "redis")]
    "rediss+sentinel://",
    #[cfg(feature = "redis")]
    "redlock://",
    #[cfg(feature = "redis")]
    "redlocks://",
    #[cfg(feature = "zk")]
    "zk://",
    #[cfg(feature = "zk")]
    "zks://",
    #[cfg(feature = "zk")]
    "zookeeper://",
    #[cfg(feature = "etcd")]
    "etcd://",
    #[cfg(feature = "etcd")]
    "etcds://",
    #[cfg(feature = "nats")]
    "nats://",
];

/// Opens the backend a URL names.
///
/// | scheme | backend | feature |
/// |---|---|---|
/// | `memory://` | process-local [`InMemoryBackend`] (a new, empty one per call) | always |
/// | `sqlite://path.db` | SQLite file via `dlock-jdbc` | `sqlite` |
/// | `mysql://…`, `mariadb://…` | MariaDB / MySQL via `dlock-jdbc` | `mysql` |
/// | `postgres://…`, `postgresql://…` | PostgreSQL via `dlock-jdbc` | `postgres` |
/// | `redis://…`, `rediss://…` | Redis via `dlock-redis` | `redis` |
/// | `redis+cluster://h1:p1,h2:p2,…`, `rediss+cluster://…` | Redis Cluster via `dlock-redis` (`rediss`: TLS, feature `redis-tls`) | `redis` |
/// | `redis+sentinel://s1:p1,s2:p2/<master>`, `rediss+sentinel://…` | the master Redis Sentinel names, via `dlock-redis` | `redis` |
/// | `redlock://h1:p1,h2:p2,h3:p3`, `redlocks://…` | Redlock over independent Redis masters, via `dlock-redis` | `redis` |
/// | `zk://h1:p1,h2:p2/root`, `zookeeper://…`, `zks://…` | ZooKeeper via `dlock-zk` (`zks`: TLS, feature `zk-tls`) | `zk` |
/// | `etcd://[user:pass@]h1:p1,h2:p2/prefix`, `etcds://…` | etcd via `dlock-etcd` (needs `protoc` to build; `etcds`: TLS, feature `etcd-tls`) | `etcd` |
/// | `nats://[user:pass@]h1:p1,h2:p2/bucket` | NATS JetStream key-value via `dlock-nats` (over TLS: `tls://…` with `dlock_nats::NatsBackend::connect`) | `nats` |
///
/// Unknown schemes, and schemes whose feature is not enabled, fail with
/// [`ErrorKind::Config`] naming what to do. Passwords in the URL never appear in errors.
///
/// # Cancel safety
///
/// Cancel-safe: dropped before it completes, the connections opened so far are
/// dropped with it.
pub async fn open_backend(url: &str) -> Result<Arc<dyn LockRemoteResource>> {
    let Some((scheme, _rest)) = url.split_once("://") else {
        return Err(Error::new(
            ErrorKind::Config,
            format!(
                "backend URL {:?} has no scheme; write it as scheme://…, e.g. memory://",
                redact_url(url)
            ),
        ));
    };
    match scheme.to_ascii_lowercase().as_str() {
        "memory" | "mem" => Ok(Arc::new(InMemoryBackend::new())),
        #[cfg(feature = "sqlite")]
        "sqlite" => Ok(Arc::new(dlock_jdbc::JdbcBackend::connect(url).await?)),
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => Ok(Arc::new(dlock_jdbc::JdbcBackend::connect(url).await?)),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => Ok(Arc::new(dlock_jdbc::JdbcBackend::connect(url).await?)),
        #[cfg(feature = "redis")]
        "redis" | "rediss" | "redis+cluster" | "rediss+cluster" | "redis+sentinel" | "rediss+sentinel" => {
            Ok(Arc::new(dlock_redis::RedisBackend::connect(url).await?))
        }
        #[cfg(feature = "redis")]
        "redlock" | "redlocks" => Ok(Arc::new(dlock_redis::RedlockBackend::connect(url).await?)),
        #[cfg(feature = "zk")]
        "zk" | "zookeeper" | "zks" => Ok(Arc::new(dlock_zk::ZkBackend::connect(url).await?)),
        #[cfg(feature = "etcd")]
        "etcd" | "etcds" => Ok(Arc::new(dlock_etcd::EtcdBackend::connect(url).await?)),
        #[cfg(feature = "nats")]
        "nats" => Ok(Arc::new(dlock_nats::NatsBackend::connect(url).await?)),
        other => Err(Error::new(
            ErrorKind::Config,
            format!(
                "unsupported backend scheme {other:?} in {:?}; this build supports {} (enable dlock-api's sqlite, mysql, postgres, redis, zk, etcd or nats features for more)",
                redact_url(url),
                SUPPORTED.join(", ")
            ),
        )),
    }
}

/// What [`open_existing_backend`] found.
pub enum ExistingBackend {
    /// The store exists; the backend on it.
    Open(Arc<dyn LockRemoteResource>),
    /// The SQLite database file the URL names does not exist (and none was made):
    /// nothing is held there.
    NoDatabaseFile(std::path::PathBuf),
    /// The SQL database has no dlock tables of the URL's table prefix (and none were
    /// made): nothing was ever locked there with that prefix.
    NoTables,
}

/// Opens the backend a URL names only where its store already exists, creating
/// nothing in it: a `sqlite:` URL whose file does not exist is
/// [`ExistingBackend::NoDatabaseFile`] (and no file is made); a SQL database is
/// opened with its migrations off (`dlock_migrate=false`: no DDL, so a user with
/// `SELECT` only can read it), and one without dlock's tables of the URL's prefix
/// is [`ExistingBackend::NoTables`]; every other URL is [`open_backend`]'s (a server
/// is there or the call fails). For readers — status pages, `dlock status`, `dlock
/// unlock --force` — that must not leave a database file or tables behind where
/// nothing was ever locked.
///
/// Errors as for [`open_backend`].
///
/// # Cancel safety
///
/// Cancel-safe: dropped before it returns, nothing is left open (no file is made
/// by the existence check).
pub async fn open_existing_backend(url: &str) -> Result<ExistingBackend> {
    #[cfg_attr(
        not(any(feature = "sqlite", feature = "mysql", feature = "postgres")),
        allow(unused_variables)
    )]
    let scheme = url
        .split_once("://")
        .map(|(scheme, _)| scheme.to_ascii_lowercase());
    #[cfg(feature = "sqlite")]
    if scheme.as_deref() == Some("sqlite") {
        let file = dlock_jdbc::sqlite_file(url)?;
        if !file.exists() {
            return Ok(ExistingBackend::NoDatabaseFile(file));
        }
    }
    #[cfg(any(feature = "sqlite", feature = "mysql", feature = "postgres"))]
    if let Some("sqlite" | "mysql" | "mariadb" | "postgres" | "postgresql") = scheme.as_deref() {
        // The last `dlock_migrate` wins: the URL's own is overridden.
        let sep = if url.contains('?') { '&' } else { '?' };
        let reader = format!("{url}{sep}dlock_migrate=false");
        let backend = dlock_jdbc::JdbcBackend::connect(&reader).await?;
        if !backend.has_tables().await? {
            backend.close().await;
            return Ok(ExistingBackend::NoTables);
        }
        return Ok(ExistingBackend::Open(Arc::new(backend)));
    }
    open_backend(url).await.map(ExistingBackend::Open)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn unknown_scheme_is_a_config_error_without_the_password() {
        let err = open_backend("nope://u:topsecret@h").await.err();
        let err = err.map(|e| (e.kind(), e.to_string()));
        assert!(
            matches!(&err, Some((ErrorKind::Config, msg)) if !msg.contains("topsecret") && msg.contains("memory://"))
        );
        let err = open_backend("no-scheme").await.err().map(|e| e.kind());
        assert_eq!(err, Some(ErrorKind::Config));
    }

    /// The schemes the "unsupported scheme" error lists are exactly those this build
    /// opens: `rediss://` was opened but not listed (a user without the TLS feature
    /// read that Cluster and Sentinel over TLS were supported, plain TLS not).
    #[tokio::test]
    async fn the_schemes_listed_are_the_schemes_opened() {
        const CANDIDATES: &[&str] = &[
            "memory",
            "mem",
            "sqlite",
            "mysql",
            "mariadb",
            "postgres",
            "postgresql",
            "redis",
            "rediss",
            "redis+cluster",
            "rediss+cluster",
            "redis+sentinel",
            "rediss+sentinel",
            "redlock",
            "redlocks",
            "zk",
            "zks",
            "zookeeper",
            "etcd",
            "etcds",
            "nats",
            "tls",
        ];
        for scheme in CANDIDATES {
            // Nothing listens on port 1; a path no one can create.
            let url = format!("{scheme}://127.0.0.1:1/dlock-no-such-dir/x/y.db");
            let opened = tokio::time::timeout(Duration::from_millis(300), open_backend(&url)).await;
            let unsupported = matches!(&opened, Ok(Err(e)) if e.to_string().contains("unsupported backend scheme"));
            let listed = SUPPORTED.contains(&format!("{scheme}://").as_str());
            assert_eq!(
                listed, !unsupported,
                "{scheme}:// listed {listed}, opened {}",
                !unsupported
            );
        }
    }

    /// A user's mistyped URL (one `/` short) was echoed whole, password included.
    #[tokio::test]
    async fn a_url_without_its_slashes_is_refused_without_the_password() {
        let err = open_backend("mysql:/root:S3cretPW@127.0.0.1/test")
            .await
            .err();
        let err = err.map(|e| (e.kind(), e.to_string()));
        assert!(
            matches!(&err, Some((ErrorKind::Config, msg))
                if !msg.contains("S3cretPW") && msg.contains("mysql:***@127.0.0.1/test") && msg.contains("scheme://")),
            "{err:?}"
        );
    }
}
