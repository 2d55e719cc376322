//! Opening a backend from a URL, so the CLI, config files and tests select backends
//! the same way.

use std::sync::Arc;

use dlock_spi::{Error, ErrorKind, InMemoryBackend, LockRemoteResource, Result};

/// The URL schemes this build understands.
pub const SUPPORTED: &[&str] = &[
    "memory://",
    #[cfg(feature = "sqlite")]
    "sqlite://",
    #[cfg(feature = "mysql")]
    "mysql://",
    #[cfg(feature = "postgres")]
    "postgres://",
];

/// Opens the backend a URL names.
///
/// | scheme | backend | feature |
/// |---|---|---|
/// | `memory://` | process-local [`InMemoryBackend`] (a new, empty one per call) | always |
/// | `sqlite://path.db` | SQLite file via `dlock-jdbc` | `sqlite` |
/// | `mysql://…`, `mariadb://…` | MariaDB / MySQL via `dlock-jdbc` | `mysql` |
/// | `postgres://…`, `postgresql://…` | PostgreSQL via `dlock-jdbc` | `postgres` |
///
/// Unknown schemes, and schemes whose feature is not enabled, fail with
/// [`ErrorKind::Config`] naming what to do. Passwords in the URL never appear in errors.
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
        other => Err(Error::new(
            ErrorKind::Config,
            format!(
                "unsupported backend scheme {other:?} in {:?}; this build supports {} (enable dlock-api's sqlite, mysql or postgres features for more)",
                redact_url(url),
                SUPPORTED.join(", ")
            ),
        )),
    }
}

/// Replaces the password of `scheme://user:password@host…` with `***`, so URLs can be
/// logged and shown in errors.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rfind('@') {
        Some(at) => {
            let userinfo = &authority[..at];
            let host = &authority[at + 1..];
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            let redacted = if userinfo.contains(':') {
                format!("{user}:***")
            } else {
                user.to_owned()
            };
            format!("{scheme}://{redacted}@{host}{tail}")
        }
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords_only() {
        assert_eq!(
            redact_url("mysql://root:s3cret@127.0.0.1:3306/test"),
            "mysql://root:***@127.0.0.1:3306/test"
        );
        assert_eq!(redact_url("redis://:pw@host/0"), "redis://:***@host/0");
        assert_eq!(redact_url("redis://user@host"), "redis://user@host");
        assert_eq!(redact_url("sqlite://a.db"), "sqlite://a.db");
        assert_eq!(redact_url("nonsense"), "nonsense");
    }

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
}
