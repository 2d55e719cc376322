//! What a Redis backend is told: its options, and its URL read one way for every
//! deployment — one node (`redis://`), a Cluster (`redis+cluster://`), a master
//! followed through Sentinel (`redis+sentinel://`) and Redlock's independent masters
//! (`redlock://`), each with its TLS scheme.
//!
//! A one-node URL is the redis crate's own (its grammar, `#insecure`, `?protocol=`):
//! dlock takes its TLS file options off it ([`DriverUrl`]) and leaves the rest. The
//! others name several hosts, which the redis crate does not read: they are taken
//! apart by [`BackendUrl`], and each node gets a one-node URL with the credentials,
//! database and options they gave.

use std::time::Duration;

use dlock_spi::{BackendUrl, Backoff, DriverUrl, Error, ErrorKind, Result, TlsIdentity, UrlSpec};

/// Settings of a [`RedisBackend`](crate::RedisBackend).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RedisOptions {
    /// Prefix of every key. Default `dlock:`.
    pub key_prefix: String,
    /// `None` (default): waiters are woken by pub/sub release notices. `Some`: they
    /// poll with this backoff instead (for deployments that forbid pub/sub).
    pub polling: Option<Backoff>,
    /// After each acquire and renewal, require this many replicas to acknowledge
    /// within the timeout (`WAIT`); otherwise an acquire is released and fails, a
    /// renewal fails. Single node or Sentinel (not Cluster).
    pub replica_ack: Option<(u32, Duration)>,
    /// How long a queued waiter stays in the queue without re-checking (it re-checks
    /// every third of this): a crashed waiter is skipped at most this long after it
    /// died. Default 3 s.
    pub waiter_liveness: Duration,
    /// How long connecting may take (each connection: commands, notices) before
    /// `connect` fails. Default 5 s.
    pub connect_timeout: Duration,
    /// TLS URLs (`rediss://`, `rediss+cluster://`) only: the CA (PEM) that verifies
    /// the server, instead of the system's roots. The URL parameter `tls_ca=<file>`
    /// does the same.
    pub tls_root_certificate: Option<Vec<u8>>,
    /// TLS URLs only: the client certificate and key to present. The URL parameters
    /// `tls_cert=<file>&tls_key=<file>` do the same.
    pub tls_identity: Option<TlsIdentity>,
    /// Sentinel URLs only: the sentinels' own user (`None`: the default user) and
    /// password, when they require one. The URL parameters `sentinel_user` and
    /// `sentinel_password` do the same; these win. The URL's `user:pass@` are the
    /// master's and replicas' credentials.
    pub sentinel_auth: Option<SentinelAuth>,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            key_prefix: "dlock:".to_owned(),
            polling: None,
            replica_ack: None,
            waiter_liveness: Duration::from_secs(3),
            connect_timeout: Duration::from_secs(5),
            tls_root_certificate: None,
            tls_identity: None,
            sentinel_auth: None,
        }
    }
}

impl RedisOptions {
    /// Sets the key prefix.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// Waits by polling with `backoff` instead of pub/sub notices.
    pub fn polling(mut self, backoff: Backoff) -> Self {
        self.polling = Some(backoff);
        self
    }

    /// Sets how long a queued waiter stays queued without re-checking.
    pub fn waiter_liveness(mut self, liveness: Duration) -> Self {
        self.waiter_liveness = liveness;
        self
    }

    /// Sets how long connecting may take.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Verifies the server (`rediss://`) with this CA certificate (PEM).
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_root_certificate = Some(pem.into());
        self
    }

    /// Presents this client certificate (`rediss://`).
    pub fn tls_identity(mut self, identity: TlsIdentity) -> Self {
        self.tls_identity = Some(identity);
        self
    }

    /// Sentinel URLs: authenticates to the sentinels as `user` (`None`: the default
    /// user) with `password`.
    pub fn sentinel_auth(mut self, user: Option<String>, password: impl Into<String>) -> Self {
        self.sentinel_auth = Some(SentinelAuth::new(user, password));
        self
    }

    /// Requires `replicas` acknowledgements within `timeout` after each acquire and renewal.
    pub fn replica_ack(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replica_ack = Some((replicas, timeout));
        self
    }
}

/// The sentinels' own credentials ([`RedisOptions::sentinel_auth`]); its `Debug`
/// shows no password.
#[derive(Clone)]
pub struct SentinelAuth {
    pub(crate) user: Option<String>,
    pub(crate) password: String,
}

impl SentinelAuth {
    /// `user` (`None`: the default user) with `password`.
    pub fn new(user: Option<String>, password: impl Into<String>) -> Self {
        SentinelAuth {
            user,
            password: password.into(),
        }
    }
}

impl std::fmt::Debug for SentinelAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelAuth")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Where the sentinels are and what they are asked for, from a Sentinel URL. Its
/// `Debug` shows no credentials.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct SentinelUrl {
    /// `redis` or `rediss` (TLS to sentinels and data nodes).
    pub(crate) scheme: &'static str,
    /// `host:port` of each sentinel.
    pub(crate) sentinels: Vec<String>,
    /// The master's name, as the sentinels monitor it.
    pub(crate) master: String,
    /// The data nodes' user and password (decoded), if any.
    pub(crate) credentials: Option<(String, String)>,
    /// The database number on the data nodes.
    pub(crate) db: i64,
    /// The sentinels' own credentials: [`RedisOptions::sentinel_auth`], else the
    /// URL's `sentinel_user` and `sentinel_password`.
    pub(crate) sentinel_user: Option<String>,
    pub(crate) sentinel_password: Option<String>,
}

impl SentinelUrl {
    /// The URL of a data node at `host:port` (`host` bracketed if IPv6).
    pub(crate) fn data_node(&self, host: &str, port: u16) -> String {
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.to_owned()
        };
        node_url(
            self.scheme,
            self.credentials
                .as_ref()
                .map(|(u, p)| (u.as_str(), p.as_str())),
            &format!("{host}:{port}"),
            &format!("/{}", self.db),
            &[],
        )
    }

    /// The URL of the sentinel at `host` (one of [`SentinelUrl::sentinels`]), with
    /// the sentinels' own credentials.
    pub(crate) fn sentinel(&self, host: &str) -> String {
        let credentials = match (&self.sentinel_user, &self.sentinel_password) {
            (None, None) => None,
            (user, password) => Some((
                user.as_deref().unwrap_or(""),
                password.as_deref().unwrap_or(""),
            )),
        };
        node_url(self.scheme, credentials, host, "", &[])
    }
}

impl std::fmt::Debug for SentinelUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelUrl")
            .field("scheme", &self.scheme)
            .field("sentinels", &self.sentinels)
            .field("master", &self.master)
            .field("db", &self.db)
            .field("credentials", &self.credentials.is_some())
            .field("sentinel_user", &self.sentinel_user)
            .finish_non_exhaustive()
    }
}

/// What a URL names: the deployment and how to reach it.
#[derive(Debug)]
pub(crate) enum Target {
    /// One node: the URL for the redis crate (dlock's options taken off).
    Single(String),
    /// A Cluster: one-node URLs of its seed nodes; `tls` for `rediss+cluster://`.
    Cluster { nodes: Vec<String>, tls: bool },
    /// A master followed through Sentinel.
    Sentinel(SentinelUrl),
    /// Redlock's independent masters: one-node URLs.
    Redlock(Vec<String>),
}

const ONE_NODE: &str = "redis://[user:pass@]host:6379[/db] or rediss://… (TLS)";
const CLUSTER: UrlSpec = UrlSpec::new(
    "Redis Cluster URL",
    &["redis+cluster", "rediss+cluster"],
    "redis+cluster://[user:pass@]host1:7000,host2:7001 (rediss+cluster:// for TLS)",
)
.default_port(6379)
.optional_credentials();
const SENTINEL: UrlSpec = UrlSpec::new(
    "Redis Sentinel URL",
    &["redis+sentinel", "rediss+sentinel"],
    "redis+sentinel://[user:pass@]host1:26379,host2:26379/<master name>[/<db>] (rediss+sentinel:// for TLS)",
)
.default_port(26379)
.optional_credentials();
const REDLOCK: UrlSpec = UrlSpec::new(
    "Redlock URL",
    &["redlock", "redlocks"],
    "redlock://[user:pass@]host1:6379,host2:6379,host3:6379[/<db>] (redlocks:// for TLS)",
)
.default_port(6379)
.optional_credentials();

/// The TLS file options (taken by dlock, read into the options).
const TLS_FILES: [&str; 3] = ["tls_ca", "tls_cert", "tls_key"];

/// Reads `url` for `options`: what it names, and the options with its TLS files
/// (and, for Sentinel, the sentinels' credentials) read in.
pub(crate) fn parse(url: &str, mut options: RedisOptions) -> Result<(Target, RedisOptions)> {
    let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
    let target = match scheme {
        "redis" | "rediss" => {
            let url = DriverUrl::split(url, |key| TLS_FILES.contains(&key))?;
            // Only the TLS files were taken as dlock's: nothing else is left.
            url.take_tls_files(
                scheme == "rediss",
                "rediss",
                &mut options.tls_root_certificate,
                &mut options.tls_identity,
            )?;
            Target::Single(url.driver_url().to_owned())
        }
        "redis+cluster" | "rediss+cluster" => {
            let url = BackendUrl::parse(url, &CLUSTER)?;
            let tls = scheme == "rediss+cluster";
            let rest = url.take_tls_files(tls, "rediss+cluster", &mut options.tls_root_certificate, &mut options.tls_identity)?;
            if !matches!(url.path(), "" | "/" | "/0") {
                return Err(url.error("a Cluster has database 0 only: drop the path"));
            }
            let node_scheme = if tls { "rediss" } else { "redis" };
            let nodes = url
                .hosts()
                .iter()
                .map(|host| node_url(node_scheme, url.credentials(), host, "", &rest))
                .collect();
            Target::Cluster { nodes, tls }
        }
        "redis+sentinel" | "rediss+sentinel" => Target::Sentinel(sentinel(url, &mut options)?),
        "redlock" | "redlocks" => {
            let url = BackendUrl::parse(url, &REDLOCK)?;
            let tls = scheme == "redlocks";
            let rest = url.take_tls_files(tls, "redlocks", &mut options.tls_root_certificate, &mut options.tls_identity)?;
            let node_scheme = if tls { "rediss" } else { "redis" };
            let nodes = url
                .hosts()
                .iter()
                .map(|host| node_url(node_scheme, url.credentials(), host, url.path(), &rest))
                .collect();
            Target::Redlock(nodes)
        }
        _ => {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "{:?} is not a Redis URL; use {ONE_NODE}, redis+cluster://host1:7000,host2:7001, rediss+cluster://… (Cluster over TLS), redis+sentinel://s1:26379,s2:26379/<master>, rediss+sentinel://… (Sentinel, over TLS) or redlock://h1,h2,h3 (Redlock; redlocks:// over TLS)",
                    dlock_spi::redact_url(url)
                ),
            ))
        }
    };
    Ok((target, options))
}

/// Reads a Sentinel URL: sentinels, master, database, and the sentinels' own
/// credentials ([`RedisOptions::sentinel_auth`] wins over the URL's).
fn sentinel(url: &str, options: &mut RedisOptions) -> Result<SentinelUrl> {
    let parsed = BackendUrl::parse(url, &SENTINEL)?;
    let tls = parsed.scheme() == "rediss+sentinel";
    let rest = parsed.take_tls_files(
        tls,
        "rediss+sentinel",
        &mut options.tls_root_certificate,
        &mut options.tls_identity,
    )?;
    let mut parts = parsed.path().split('/').filter(|p| !p.is_empty());
    let master = parts
        .next()
        .map(str::to_owned)
        .ok_or_else(|| parsed.error("it names no master (the path)"))?;
    let db = match parts.next() {
        Some(db) => db
            .parse()
            .map_err(|_| parsed.error(format_args!("database {db:?} is not a number")))?,
        None => 0,
    };
    if parts.next().is_some() {
        return Err(parsed.error("the path holds more than <master>/<db>"));
    }
    let (mut sentinel_user, mut sentinel_password) = (None, None);
    for (key, value) in rest {
        match key {
            "sentinel_user" => sentinel_user = Some(value.to_owned()),
            "sentinel_password" => sentinel_password = Some(value.to_owned()),
            other => {
                return Err(parsed.unknown_option(
                    other,
                    &[
                        "sentinel_user",
                        "sentinel_password",
                        "tls_ca",
                        "tls_cert",
                        "tls_key",
                    ],
                ))
            }
        }
    }
    if let Some(auth) = &options.sentinel_auth {
        sentinel_user = auth.user.clone();
        sentinel_password = Some(auth.password.clone());
    }
    Ok(SentinelUrl {
        scheme: if tls { "rediss" } else { "redis" },
        sentinels: parsed.hosts().to_vec(),
        master,
        credentials: parsed
            .credentials()
            .map(|(u, p)| (u.to_owned(), p.to_owned())),
        db,
        sentinel_user,
        sentinel_password,
    })
}

/// A one-node URL for the redis crate: `scheme://[user:password@]host[path][?options]`,
/// the credentials and option values percent-encoded again (the redis crate decodes
/// them).
fn node_url(
    scheme: &str,
    credentials: Option<(&str, &str)>,
    host: &str,
    path: &str,
    options: &[(&str, &str)],
) -> String {
    let mut url = format!("{scheme}://");
    if let Some((user, password)) = credentials {
        url.push_str(&encode(user));
        if !password.is_empty() {
            url.push(':');
            url.push_str(&encode(password));
        }
        url.push('@');
    }
    url.push_str(host);
    url.push_str(path);
    for (i, (key, value)) in options.iter().enumerate() {
        url.push(if i == 0 { '?' } else { '&' });
        url.push_str(key);
        url.push('=');
        url.push_str(&encode(value));
    }
    url
}

/// Percent-encodes a credential or an option value (everything but RFC 3986's
/// unreserved characters).
fn encode(s: &str) -> String {
    const RESERVED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~');
    percent_encoding::utf8_percent_encode(s, RESERVED).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(url: &str) -> Result<Target> {
        parse(url, RedisOptions::default()).map(|(target, _)| target)
    }

    #[test]
    fn one_node_urls_are_the_redis_crates_with_the_tls_files_taken_off() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let ca = dir.path().join("ca a.pem");
        std::fs::write(&ca, b"CA").unwrap_or_else(|e| panic!("{e}"));
        let url = format!(
            "rediss://u:secret@127.0.0.1:6390/0?protocol=resp3&tls_ca={}#insecure",
            ca.display().to_string().replace(' ', "%20")
        );
        let (target, options) =
            parse(&url, RedisOptions::default()).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            matches!(&target, Target::Single(u) if u == "rediss://u:secret@127.0.0.1:6390/0?protocol=resp3#insecure"),
            "{target:?}"
        );
        assert_eq!(options.tls_root_certificate.as_deref(), Some(&b"CA"[..]));
    }

    #[test]
    fn cluster_urls_name_their_nodes_with_the_right_scheme() {
        let nodes = |url: &str| match target(url) {
            Ok(Target::Cluster { nodes, tls }) => Ok((nodes, tls)),
            Ok(other) => panic!("{other:?}"),
            Err(e) => Err(e),
        };
        assert_eq!(
            nodes("redis+cluster://u:p%2Fw@h1:7000,h2/?protocol=resp3").ok(),
            Some((
                vec![
                    "redis://u:p%2Fw@h1:7000?protocol=resp3".to_owned(),
                    "redis://u:p%2Fw@h2:6379?protocol=resp3".to_owned()
                ],
                false
            ))
        );
        assert_eq!(
            nodes("rediss+cluster://:pw@h1:7100,h2:7101").ok(),
            Some((
                vec![
                    "rediss://:pw@h1:7100".to_owned(),
                    "rediss://:pw@h2:7101".to_owned()
                ],
                true
            ))
        );
    }

    #[test]
    fn redlock_urls_name_every_node_with_the_credentials_and_db() {
        let nodes = |url: &str| match target(url) {
            Ok(Target::Redlock(nodes)) => nodes,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            nodes("redlock://u:p@h1:6379,h2:6380/2"),
            vec!["redis://u:p@h1:6379/2", "redis://u:p@h2:6380/2"]
        );
        assert_eq!(nodes("redlocks://app@h1"), vec!["rediss://app@h1:6379"]);
    }

    #[test]
    fn sentinel_urls_name_sentinels_master_db_and_credentials() {
        let sentinel = |url: &str, options: RedisOptions| match parse(url, options) {
            Ok((Target::Sentinel(s), _)) => s,
            other => panic!("{other:?}"),
        };
        let u = sentinel(
            "redis+sentinel://u:p%40ss@h1:26379,h2/mymaster/3?sentinel_password=s%263",
            RedisOptions::default(),
        );
        assert_eq!(u.scheme, "redis");
        assert_eq!(u.sentinels, vec!["h1:26379", "h2:26379"]);
        assert_eq!((u.master.as_str(), u.db), ("mymaster", 3));
        assert_eq!(u.data_node("::1", 6380), "redis://u:p%40ss@[::1]:6380/3");
        assert_eq!(u.sentinel("h1:26379"), "redis://:s%263@h1:26379");
        let t = sentinel(
            "rediss+sentinel://127.0.0.1:26379/m",
            RedisOptions::default(),
        );
        assert_eq!((t.scheme, t.db, t.credentials), ("rediss", 0, None));
        let auth = RedisOptions::default().sentinel_auth(Some("sen".into()), "pw");
        let a = sentinel("redis+sentinel://h/m?sentinel_password=url", auth);
        assert_eq!(a.sentinel("h:26379"), "redis://sen:pw@h:26379");
    }

    #[test]
    fn bad_urls_say_what_is_wrong_without_the_password() {
        for (url, says) in [
            ("redis+sentinel://u:secret@/m", "no host given"),
            ("redis+sentinel://u:secret@h1:26379", "names no master"),
            ("redis+sentinel://u:secret@h1:26379/", "names no master"),
            ("redis+sentinel://u:secret@h1/m/x", "not a number"),
            ("redis+sentinel://u:secret@h1/m/1/2", "more than"),
            ("redis+sentinel://u:secret@h1/m?bogus=1", "\"bogus\""),
            (
                "redis+sentinel://u:secret@h1/m?tls_ca=/x",
                "use rediss+sentinel://",
            ),
            ("redis+cluster://u:secret@/", "no host given"),
            ("redis+cluster://u:secret@h1/3", "database 0 only"),
            (
                "redis+cluster://u:secret@h1?tls_ca=/x",
                "use rediss+cluster://",
            ),
            ("redlock://u:secret@/0", "no host given"),
            ("redlock://u:secret@h1?tls_key=/x", "use redlocks://"),
            ("redis://u:secret@h1?tls_ca=/x", "use rediss://"),
            ("rediss://u:secret@h1?tls_ca=/nonexistent/ca.pem", "tls_ca"),
            ("rediss://u:secret@h1?tls_cert=/etc/hostname", "tls_key"),
            ("mysql://u:secret@h1", "is not a Redis URL"),
        ] {
            let e = target(url)
                .err()
                .unwrap_or_else(|| panic!("{url} was accepted"));
            let text = e.to_string();
            assert_eq!(e.kind(), ErrorKind::Config, "{url}");
            assert!(text.contains(says), "{url}: {text}");
            assert!(!text.contains("secret"), "{url}: {text}");
        }
    }
}
