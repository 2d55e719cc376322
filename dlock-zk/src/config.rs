//! What a ZooKeeper backend is told: its options, and its URL
//! (`zk://[user:password@]host:port,…/root?…`, `zks://` over TLS) read with
//! [`BackendUrl`].

use std::time::Duration;

use dlock_spi::{BackendUrl, Result, TlsIdentity, UrlSpec};

use crate::layout::{self, ExclusiveNode};

/// Settings of a [`ZkBackend`](crate::ZkBackend). Its `Debug` shows the digest's user, never its
/// password.
#[derive(Clone)]
#[non_exhaustive]
pub struct ZkOptions {
    /// The path every lock lives under. Default `/dlock`; created if missing.
    pub root: String,
    /// The session timeout to ask the server for (it clamps it to 2–20 ticks).
    /// Default 10 s.
    pub session_timeout: Duration,
    /// `user:password` for ZooKeeper's digest authentication. With it, the nodes
    /// dlock creates get a creator-all ACL (writable by this identity only); without,
    /// they are open to everyone.
    pub digest: Option<String>,
    /// How exclusive holds are named, for interoperating with Curator recipes.
    pub exclusive_node: ExclusiveNode,
    /// Connect over TLS (what `zks://` sets; needs the crate's `tls` feature).
    pub tls: bool,
    /// The CA certificates (PEM) that verify the servers over TLS (what `tls_ca`
    /// names); required with TLS.
    pub tls_root_certificate: Option<Vec<u8>>,
    /// A client certificate and its key (PEM), for servers that require one
    /// (`ssl.clientAuth=need`; what `tls_cert` and `tls_key` name).
    pub tls_identity: Option<TlsIdentity>,
}

impl std::fmt::Debug for ZkOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let digest = self
            .digest
            .as_deref()
            .map(|d| format!("{}:***", d.split_once(':').map_or(d, |(user, _)| user)));
        f.debug_struct("ZkOptions")
            .field("root", &self.root)
            .field("session_timeout", &self.session_timeout)
            .field("digest", &digest)
            .field("exclusive_node", &self.exclusive_node)
            .field("tls", &self.tls)
            .field("tls_root_certificate", &self.tls_root_certificate.is_some())
            .field("tls_identity", &self.tls_identity)
            .finish()
    }
}

impl Default for ZkOptions {
    fn default() -> Self {
        ZkOptions {
            root: "/dlock".to_owned(),
            session_timeout: Duration::from_secs(10),
            digest: None,
            exclusive_node: ExclusiveNode::Mutex,
            tls: false,
            tls_root_certificate: None,
            tls_identity: None,
        }
    }
}

impl ZkOptions {
    /// Sets the root path.
    pub fn root(mut self, root: impl Into<String>) -> Self {
        self.root = root.into();
        self
    }

    /// Sets the session timeout to ask for.
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// Authenticates with ZooKeeper's digest scheme as `user:password`.
    pub fn digest(mut self, credentials: impl Into<String>) -> Self {
        self.digest = Some(credentials.into());
        self
    }

    /// Names exclusive holds as the given Curator recipe does.
    pub fn exclusive_node(mut self, node: ExclusiveNode) -> Self {
        self.exclusive_node = node;
        self
    }

    /// Connects over TLS, verifying the servers against `root_certificate` (PEM; what
    /// `zks://` with `tls_ca` sets). Needs the crate's `tls` feature.
    pub fn tls(mut self, root_certificate: impl Into<Vec<u8>>) -> Self {
        self.tls = true;
        self.tls_root_certificate = Some(root_certificate.into());
        self
    }

    /// Presents `identity` to servers that require a client certificate.
    pub fn tls_identity(mut self, identity: TlsIdentity) -> Self {
        self.tls_identity = Some(identity);
        self
    }
}

/// A parsed `zk://` URL: the hosts and the options it sets.
#[derive(Debug)]
pub(crate) struct ZkUrl {
    pub(crate) hosts: String,
    pub(crate) options: ZkOptions,
}

/// How ZooKeeper URLs are written ([`BackendUrl`]).
pub(crate) const URL: UrlSpec = UrlSpec::new(
    "ZooKeeper URL",
    &["zk", "zks", "zookeeper"],
    "zk://host:2181,host2:2181/root?session_timeout=10s",
);

/// Parses `zk://[user:password@]host:port[,host:port…][/root][?option=value&…]`
/// (`zks://` for TLS); user and password may be percent-encoded (a `/` in the password
/// as `%2F`: the root may hold an `@`).
///
/// Options: `session_timeout` (`10s`, `2500ms`), `exclusive` (`mutex` or `rw`);
/// `tls_ca`, `tls_cert`, `tls_key` (paths of PEM files, `zks://` only).
pub(crate) fn parse_url(url: &str, mut options: ZkOptions) -> Result<ZkUrl> {
    let u = BackendUrl::parse(url, &URL)?;
    if u.scheme() == "zks" {
        options.tls = true;
    } else if options.tls {
        // The scheme says whether the connection is TLS: options that ask for it
        // under a plain scheme are a contradiction, not a choice to make silently.
        return Err(u.error(
            "the options ask for TLS (ZkOptions::tls) but the scheme is plain; use zks://",
        ));
    }
    if let Some((user, password)) = u.credentials() {
        if user.contains(':') {
            // The digest is "user:password", split at its first ':'.
            return Err(u.error("the user holds a ':' (ZooKeeper's digest is user:password)"));
        }
        options.digest = Some(format!("{user}:{password}"));
    }
    let root = u.path();
    if !root.is_empty() && root != "/" {
        options.root = root.trim_end_matches('/').to_owned();
    }
    let options_left = u.take_tls_files(
        options.tls,
        "zks",
        &mut options.tls_root_certificate,
        &mut options.tls_identity,
    )?;
    for (key, value) in options_left {
        match key {
            "session_timeout" => options.session_timeout = u.duration(key, value)?,
            "exclusive" => {
                options.exclusive_node = match value {
                    "mutex" => ExclusiveNode::Mutex,
                    "rw" | "readwrite" => ExclusiveNode::ReadWrite,
                    _ => {
                        return Err(u.error(format_args!("exclusive={value:?} must be mutex or rw")))
                    }
                };
            }
            _ => {
                return Err(u.unknown_option(
                    key,
                    &[
                        "session_timeout",
                        "exclusive",
                        "tls_ca",
                        "tls_cert",
                        "tls_key",
                    ],
                ))
            }
        }
    }
    if !options.tls && (options.tls_root_certificate.is_some() || options.tls_identity.is_some()) {
        return Err(
            u.error("TLS certificates are given (ZkOptions) for a plain connection; use zks://")
        );
    }
    if options.tls && options.tls_root_certificate.is_none() {
        return Err(u.error(
            "zks:// needs tls_ca=<pem file>: the CA that signed the servers' certificates",
        ));
    }
    layout::validate_root(&options.root)?;
    Ok(ZkUrl {
        hosts: u.hosts().join(","),
        options,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_spi::ErrorKind;

    #[test]
    fn credentials_are_percent_decoded_and_may_hold_a_slash() {
        let u = parse_url(
            "zk://app:p%40ss%2Fw%3Ard@10.0.0.1:2181/locks",
            ZkOptions::default(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(u.options.digest.as_deref(), Some("app:p@ss/w:rd"));
        assert_eq!(u.options.root, "/locks");
        assert_eq!(u.hosts, "10.0.0.1:2181");
        // A root may hold an '@' (it is no user information).
        let u = parse_url("zk://10.0.0.1:2181/app@v2", ZkOptions::default())
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (u.options.digest, u.options.root.as_str()),
            (None, "/app@v2")
        );
        let refused = parse_url("zk://a%3Ab:pw@h:2181", ZkOptions::default());
        assert!(refused.is_err_and(|e| e.message().contains("holds a ':'")));
    }

    #[test]
    fn urls_parse_hosts_root_credentials_and_options() {
        let u = parse_url(
            "zk://app:s3cret@10.0.0.1:2181,10.0.0.2:2181/apps/locks?session_timeout=2500ms&exclusive=rw",
            ZkOptions::default(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(u.hosts, "10.0.0.1:2181,10.0.0.2:2181");
        assert_eq!(u.options.root, "/apps/locks");
        assert_eq!(u.options.digest.as_deref(), Some("app:s3cret"));
        assert_eq!(u.options.session_timeout, Duration::from_millis(2500));
        assert_eq!(u.options.exclusive_node, ExclusiveNode::ReadWrite);
        let d = parse_url("zk://127.0.0.1:2181", ZkOptions::default())
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (d.options.root.as_str(), d.options.digest),
            ("/dlock", None)
        );
    }

    #[test]
    fn zks_urls_read_the_tls_files() {
        // Any readable file stands in for PEM here: parsing reads, it does not judge.
        let u = parse_url(
            "zks://h:2281/r?tls_ca=/etc/hostname&tls_cert=/etc/hostname&tls_key=/etc/hostname",
            ZkOptions::default(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(u.options.tls);
        assert!(u.options.tls_root_certificate.is_some() && u.options.tls_identity.is_some());
        assert_eq!(
            (u.hosts.as_str(), u.options.root.as_str()),
            ("h:2281", "/r")
        );
        let plain =
            parse_url("zk://h:2181", ZkOptions::default()).unwrap_or_else(|e| panic!("{e}"));
        assert!(!plain.options.tls);
        // Paths are percent-decoded, as in the other backends' URLs.
        let encoded = parse_url(
            "zks://h:2281?tls_ca=%2Fetc%2Fhostname",
            ZkOptions::default(),
        );
        assert!(encoded.is_ok_and(|u| u.options.tls_root_certificate.is_some()));
        // TLS asked for in the options under a plain scheme is refused.
        let clash = parse_url("zk://h:2181", ZkOptions::default().tls(b"PEM".to_vec()));
        assert!(
            clash.is_err_and(|e| e.kind() == ErrorKind::Config && e.message().contains("zks://"))
        );
        // So are certificates without TLS.
        let certs =
            ZkOptions::default().tls_identity(TlsIdentity::new(b"C".to_vec(), b"K".to_vec()));
        let plain_certs = parse_url("zk://h:2181", certs);
        assert!(plain_certs
            .is_err_and(|e| e.kind() == ErrorKind::Config && e.message().contains("zks://")));
        // The options' Debug shows that there is TLS material, not the material.
        let key = std::env::temp_dir().join(format!("dlock-zk-key-{}", std::process::id()));
        std::fs::write(&key, "SECRET-KEY-MATERIAL").unwrap_or_else(|e| panic!("{e}"));
        let url = format!(
            "zks://h:2281?tls_ca=/etc/hostname&tls_cert=/etc/hostname&tls_key={}",
            key.display()
        );
        let parsed = parse_url(&url, ZkOptions::default());
        let _ = std::fs::remove_file(&key);
        let shown = format!("{:?}", parsed.unwrap_or_else(|e| panic!("{e}")).options);
        assert!(
            !shown.contains("SECRET-KEY-MATERIAL") && shown.contains("tls: true"),
            "{shown}"
        );
    }

    #[test]
    fn debug_of_options_hides_the_digest_password() {
        let options = ZkOptions::default().digest("alice:s3cr3t-zk");
        let shown = format!("{options:?}");
        assert!(!shown.contains("s3cr3t-zk"), "{shown}");
        assert!(shown.contains("alice"), "{shown}");
        let parsed = parse_url("zk://bob:pw-in-url@127.0.0.1:2181/r", ZkOptions::default())
            .map(|u| format!("{u:?}"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(!parsed.contains("pw-in-url"), "{parsed}");
        assert!(parsed.contains("bob"), "{parsed}");
    }

    #[test]
    fn bad_urls_are_config_errors_without_the_password() {
        for url in [
            "redis://x",
            "zk://",
            "zk://h1,,h2",
            "zk://h:1/a//b",
            "zk://h:1/zookeeper",
            "zk://h:1?session_timeout=soon",
            "zk://h:1?exclusive=maybe",
            "zk://h:1?nope=1",
            "zk://justuser@h:1",
            "zk://u:topsecret@h:1?nope=1",
            // TLS options: only on zks://, a CA required, a certificate with its key.
            "zk://u:topsecret@h:1?tls_ca=/etc/hostname",
            "zks://u:topsecret@h:1",
            "zks://u:topsecret@h:1?tls_ca=/etc/hostname&tls_cert=/etc/hostname",
            "zks://u:topsecret@h:1?tls_ca=/no/such/ca.pem",
        ] {
            let err = parse_url(url, ZkOptions::default()).err();
            let err = err.map(|e| (e.kind(), e.to_string()));
            assert!(
                matches!(&err, Some((ErrorKind::Config, msg)) if !msg.contains("topsecret")),
                "{url}: {err:?}"
            );
        }
    }
}
