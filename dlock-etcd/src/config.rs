//! What an etcd backend is told: its options and credentials, and its URL
//! (`etcd://[user:password@]host:port,…/prefix?…`, `etcds://` over TLS) read with
//! [`BackendUrl`].

use std::time::Duration;

use dlock_spi::{BackendUrl, Result, TlsIdentity, UrlSpec};

/// An etcd user and its password, for a cluster with authentication enabled. Its
/// `Debug` shows the user only.
#[derive(Clone)]
pub struct EtcdCredentials {
    pub(crate) user: String,
    pub(crate) password: String,
}

impl EtcdCredentials {
    /// The user `user` with password `password`.
    pub fn new(user: impl Into<String>, password: impl Into<String>) -> Self {
        EtcdCredentials {
            user: user.into(),
            password: password.into(),
        }
    }

    /// The user's name.
    pub fn user(&self) -> &str {
        &self.user
    }
}

impl std::fmt::Debug for EtcdCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdCredentials")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Settings of an [`EtcdBackend`](crate::EtcdBackend).
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
    /// Sign in as this etcd user (what `etcd://user:password@…` sets). Default none.
    pub credentials: Option<EtcdCredentials>,
    /// Connect over TLS (what `etcds://` sets; needs the crate's `tls` feature).
    /// Default off.
    pub tls: bool,
    /// The CA certificate (PEM) that verifies the members over TLS (what `tls_ca`
    /// names); `None`: the system's roots.
    pub tls_root_certificate: Option<Vec<u8>>,
    /// A client certificate and key for members that require one
    /// (`--client-cert-auth`; what `tls_cert` and `tls_key` name).
    pub tls_identity: Option<TlsIdentity>,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            prefix: "dlock".to_owned(),
            timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(3),
            keep_alive: Duration::from_secs(10),
            credentials: None,
            tls: false,
            tls_root_certificate: None,
            tls_identity: None,
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

    /// Signs in as `credentials`' user.
    pub fn credentials(mut self, credentials: EtcdCredentials) -> Self {
        self.credentials = Some(credentials);
        self
    }

    /// Connects over TLS, verifying the members against `root_certificate` (PEM),
    /// or the system's roots when `None`.
    pub fn tls(mut self, root_certificate: Option<Vec<u8>>) -> Self {
        self.tls = true;
        self.tls_root_certificate = root_certificate;
        self
    }

    /// Presents `identity` as the client certificate over TLS.
    pub fn tls_identity(mut self, identity: TlsIdentity) -> Self {
        self.tls_identity = Some(identity);
        self
    }
}

/// A parsed `etcd://` URL.
#[derive(Debug)]
pub(crate) struct EtcdUrl {
    pub(crate) hosts: Vec<String>,
    pub(crate) options: EtcdOptions,
}

/// How etcd URLs are written ([`BackendUrl`]).
pub(crate) const URL: UrlSpec = UrlSpec::new(
    "etcd URL",
    &["etcd", "etcds"],
    "etcd[s]://[user:password@]host:2379,host2:2379/prefix?timeout=5s",
)
.default_port(2379)
.raw_slash_in_password();

/// Parses `etcd[s]://[user:password@]host:port[,host:port…][/prefix][?option=value&…]`.
///
/// Options: `timeout`, `connect_timeout` (`5s`, `2500ms`); `tls_ca`, `tls_cert`,
/// `tls_key` (paths of PEM files, `etcds://` only). The user and password may be
/// percent-encoded.
pub(crate) fn parse_url(url: &str, mut options: EtcdOptions) -> Result<EtcdUrl> {
    let u = BackendUrl::parse(url, &URL)?;
    if u.scheme() == "etcds" {
        options.tls = true;
    }
    if let Some((user, password)) = u.credentials() {
        options.credentials = Some(EtcdCredentials::new(user.to_owned(), password.to_owned()));
    }
    let path = u.path();
    let prefix = path.strip_prefix('/').unwrap_or(path).trim_end_matches('/');
    if !prefix.is_empty() {
        options.prefix = prefix.to_owned();
    }
    if options.prefix.is_empty() || options.prefix.chars().any(char::is_control) {
        return Err(u.error("the prefix must be non-empty, without control characters"));
    }
    let options_left = u.take_tls_files(
        options.tls,
        "etcds",
        &mut options.tls_root_certificate,
        &mut options.tls_identity,
    )?;
    for (key, value) in options_left {
        match key {
            "timeout" => options.timeout = u.duration(key, value)?,
            "connect_timeout" => options.connect_timeout = u.duration(key, value)?,
            _ => {
                return Err(u.unknown_option(
                    key,
                    &[
                        "timeout",
                        "connect_timeout",
                        "tls_ca",
                        "tls_cert",
                        "tls_key",
                    ],
                ))
            }
        }
    }
    Ok(EtcdUrl {
        hosts: u.hosts().to_vec(),
        options,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_asked_for_in_the_options_is_kept_under_a_plain_scheme() {
        let u = parse_url("etcd://h", EtcdOptions::default().tls(None));
        let Ok(u) = u else { panic!("{u:?}") };
        assert!(
            u.options.tls,
            "EtcdOptions::tls was dropped by an etcd:// URL"
        );
        // A prefix after more than one slash keeps the ones past the first.
        let u = parse_url("etcd://h//x", EtcdOptions::default());
        let Ok(u) = u else { panic!("{u:?}") };
        assert_eq!(u.options.prefix, "/x");
    }

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
            ("etcd://justuser@a", "user and a password"),
            ("etcd://:secret@a", "user is empty"),
            ("etcd://u:secret%zz@a", "password is not valid"),
            ("etcd://u:secret@a?tls_ca=/no/such/ca.pem", "etcds://"),
            ("etcds://u:secret@a?tls_ca=/no/such/ca.pem", "tls_ca"),
            ("etcds://u:secret@a?tls_cert=/etc/hostname", "both"),
            ("etcd://u:se#cret@a/p?timeout=x", "%23"),
            ("etcd://u:se?cret@a/p", "%3F"),
            ("etcd://u:se/cret@a/p?timeout=x", "timeout"),
        ] {
            let err = parse_url(url, EtcdOptions::default())
                .err()
                .map(|e| e.to_string());
            let err = err.unwrap_or_default();
            assert!(err.contains(says), "{url}: {err}");
            assert!(!err.contains("secret"), "{url}: {err}");
        }
    }

    #[test]
    fn credentials_and_tls_come_from_the_url_and_the_password_never_shows() {
        let u = parse_url(
            "etcds://app%40x:p%40ss%3Aw0rd@h1:2379/p",
            EtcdOptions::default(),
        );
        let Ok(u) = u else { panic!("{u:?}") };
        assert!(u.options.tls);
        let creds = u.options.credentials.clone();
        let Some(creds) = creds else {
            panic!("no credentials")
        };
        assert_eq!(
            (creds.user(), creds.password.as_str()),
            ("app@x", "p@ss:w0rd")
        );
        let shown = format!("{:?}", u.options);
        assert!(
            shown.contains("app@x") && !shown.contains("p@ss"),
            "{shown}"
        );
        // An unencoded '/' or '@' in the password is the password's.
        let slashed = parse_url("etcd://app:p/a@ss@h1/pre", EtcdOptions::default());
        let Ok(slashed) = slashed else {
            panic!("{slashed:?}")
        };
        let creds = slashed.options.credentials.clone();
        assert_eq!(creds.map(|c| c.password), Some("p/a@ss".to_owned()));
        assert_eq!(
            (slashed.hosts.as_slice(), slashed.options.prefix.as_str()),
            (&["h1:2379".to_owned()][..], "pre")
        );
        let plain = parse_url("etcd://h1", EtcdOptions::default());
        let Ok(plain) = plain else {
            panic!("{plain:?}")
        };
        assert!(!plain.options.tls && plain.options.credentials.is_none());
    }
}
