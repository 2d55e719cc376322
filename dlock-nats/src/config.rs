//! What a NATS backend is told: its options, and its URL
//! (`nats://[user:password@]host:port,…[/bucket]?…`, `tls://` over TLS) read with
//! the toolkit's [`BackendUrl`].

use std::path::PathBuf;
use std::time::Duration;

use dlock_spi::{BackendUrl, Error, ErrorKind, Result, UrlSpec};

/// The URLs [`NatsBackend::connect`](crate::NatsBackend::connect) takes.
const URL: UrlSpec = UrlSpec::new(
    "NATS URL",
    &["nats", "tls"],
    "nats://host:4222/dlock?token=…",
)
.default_port(4222);

/// How the backend signs in to the server, when it must. `Debug` shows no secret.
#[derive(Clone)]
#[non_exhaustive]
pub enum NatsAuth {
    /// A user and its password (`nats://user:password@…`).
    UserPassword {
        /// The user.
        user: String,
        /// Its password.
        password: String,
    },
    /// A token (`?token=…`).
    Token(String),
}

impl std::fmt::Debug for NatsAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NatsAuth::UserPassword { user, .. } => f
                .debug_struct("UserPassword")
                .field("user", user)
                .field("password", &"<redacted>")
                .finish(),
            NatsAuth::Token(_) => f.write_str("Token(<redacted>)"),
        }
    }
}

/// Settings of a [`NatsBackend`](crate::NatsBackend).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct NatsOptions {
    /// The key-value bucket the locks live in (made if missing). Default `dlock`.
    pub bucket: String,
    /// How long one request to the server may take before it fails with a
    /// retryable backend error. Default 5 s.
    pub timeout: Duration,
    /// How long connecting may take. Default 3 s.
    pub connect_timeout: Duration,
    /// How long the bucket keeps a key nobody rewrites: the release markers and
    /// the keys of contenders gone for good are dropped after it. A lease may be at
    /// most half of it. Default 24 h (applies when the bucket is made).
    pub max_age: Duration,
    /// Sign in so. Default none.
    pub auth: Option<NatsAuth>,
    /// Connect over TLS (what `tls://` sets). Default off.
    pub tls: bool,
    /// A PEM file of the CA the server's certificate is checked against
    /// (`?tls_ca=`); without it, the system's roots.
    pub tls_ca: Option<PathBuf>,
    /// A PEM client certificate and its key (`?tls_cert=…&tls_key=…`), for a
    /// server that verifies clients.
    pub tls_client: Option<(PathBuf, PathBuf)>,
}

impl Default for NatsOptions {
    fn default() -> Self {
        NatsOptions {
            bucket: "dlock".to_owned(),
            timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(3),
            max_age: Duration::from_secs(24 * 3600),
            auth: None,
            tls: false,
            tls_ca: None,
            tls_client: None,
        }
    }
}

/// A URL taken apart: the servers to connect to and the options.
#[derive(Debug)]
pub(crate) struct Parsed {
    pub(crate) servers: Vec<String>,
    pub(crate) options: NatsOptions,
}

/// Reads `nats://[user:password@]host[:port],…[/bucket]?timeout=…&token=…&tls_ca=…`.
pub(crate) fn parse_url(url: &str) -> Result<Parsed> {
    let parsed = BackendUrl::parse(url, &URL.optional_credentials())?;
    let mut options = NatsOptions {
        tls: parsed.scheme() == "tls",
        ..NatsOptions::default()
    };
    if let Some((user, password)) = parsed.credentials() {
        options.auth = Some(NatsAuth::UserPassword {
            user: user.to_owned(),
            password: password.to_owned(),
        });
    }
    let bucket = parsed.path().trim_start_matches('/');
    if !bucket.is_empty() {
        options.bucket = bucket.to_owned();
    }
    check_bucket(&options.bucket).map_err(|why| parsed.error(why))?;
    let shown = dlock_spi::redact_url(url);
    let (mut cert, mut key) = (None, None);
    for (name, value) in parsed.options() {
        match name.as_str() {
            "timeout" => options.timeout = parsed.duration(name, value)?,
            "connect_timeout" => options.connect_timeout = parsed.duration(name, value)?,
            "max_age" => options.max_age = parsed.duration(name, value)?,
            "token" => options.auth = Some(NatsAuth::Token(value.clone())),
            "tls_ca" | "tls_cert" | "tls_key" if !options.tls => {
                return Err(parsed.error(format_args!("{name} is for TLS; use tls://")));
            }
            "tls_ca" => options.tls_ca = Some(readable(&shown, name, value)?),
            "tls_cert" => cert = Some(readable(&shown, name, value)?),
            "tls_key" => key = Some(readable(&shown, name, value)?),
            other => {
                return Err(parsed.unknown_option(
                    other,
                    &[
                        "timeout",
                        "connect_timeout",
                        "max_age",
                        "token",
                        "tls_ca",
                        "tls_cert",
                        "tls_key",
                    ],
                ))
            }
        }
    }
    options.tls_client = match (cert, key) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        _ => return Err(parsed.error("tls_cert and tls_key go together")),
    };
    Ok(Parsed {
        servers: parsed.hosts().to_vec(),
        options,
    })
}

/// A TLS file option's path, once it reads as PEM.
fn readable(shown: &str, name: &str, path: &str) -> Result<PathBuf> {
    dlock_spi::read_pem_file(shown, name, path)?;
    Ok(PathBuf::from(path))
}

/// Why `bucket` cannot name a key-value bucket, if it cannot.
pub(crate) fn check_bucket(bucket: &str) -> std::result::Result<(), String> {
    if !bucket.is_empty()
        && bucket
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        Ok(())
    } else {
        Err(format!(
            "bucket {bucket:?} is not a key-value bucket name: use letters, digits, '_' and '-'"
        ))
    }
}

/// Refuses a lease the bucket cannot keep (longer than half its `max_age`).
pub(crate) fn check_lease(lease: Duration, max_age: Duration) -> Result<()> {
    if lease > max_age / 2 {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "a lease of {lease:?} is longer than half the bucket's max_age ({max_age:?}); use a shorter lease or a bucket with a longer max_age"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_give_servers_bucket_and_options() {
        let parsed =
            parse_url("nats://app:p%40ss@127.0.0.1,127.0.0.2:4333/locks?timeout=2s").unwrap();
        assert_eq!(parsed.servers, ["127.0.0.1:4222", "127.0.0.2:4333"]);
        assert_eq!(parsed.options.bucket, "locks");
        assert_eq!(parsed.options.timeout, Duration::from_secs(2));
        assert!(matches!(
            parsed.options.auth,
            Some(NatsAuth::UserPassword { ref user, ref password }) if user == "app" && password == "p@ss"
        ));
        assert!(!format!("{:?}", parsed.options).contains("p@ss"));
        let token = parse_url("nats://127.0.0.1?token=s3cret").unwrap();
        assert!(!format!("{:?}", token.options).contains("s3cret"));
        let bad = parse_url("nats://127.0.0.1/a.b?token=s3cret").unwrap_err();
        assert_eq!(bad.kind(), ErrorKind::Config);
        assert!(!bad.to_string().contains("s3cret"), "{bad}");
        let tls = parse_url("nats://127.0.0.1?tls_ca=/x.pem").unwrap_err();
        assert!(tls.to_string().contains("use tls://"), "{tls}");
        let unknown = parse_url("nats://127.0.0.1?colour=red").unwrap_err();
        assert!(unknown.to_string().contains("colour"), "{unknown}");
    }
}
