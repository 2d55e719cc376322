//! A backend URL taken apart one way for every backend:
//! `scheme://[user:password@]host[:port][,host[:port]…][/path][?key=value&…]`.

use std::fmt;

use crate::error::{Error, ErrorKind, Result};
use crate::redact::redact_url;
use crate::tls::{take_tls_options, TlsIdentity};
use crate::url_option::{parse_url_duration, percent_decode};

/// What a backend's URLs look like: the schemes it takes, the port a host without
/// one gets, where the user information ends, and how its errors name the URL and
/// show it written right. Built in a `const`:
///
/// ```
/// use dlock_spi::UrlSpec;
/// const URL: UrlSpec = UrlSpec::new("etcd URL", &["etcd", "etcds"], "etcd://host:2379/prefix")
///     .default_port(2379);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct UrlSpec {
    label: &'static str,
    schemes: &'static [&'static str],
    default_port: Option<u16>,
    raw_slash_in_password: bool,
    optional_credentials: bool,
    example: &'static str,
}

impl UrlSpec {
    /// URLs that errors call `label` (e.g. `"etcd URL"`), with one of `schemes`
    /// (without `://`), shown written right as `example` in every error; hosts kept
    /// as written, the user information within the authority.
    pub const fn new(
        label: &'static str,
        schemes: &'static [&'static str],
        example: &'static str,
    ) -> Self {
        UrlSpec {
            label,
            schemes,
            default_port: None,
            raw_slash_in_password: false,
            optional_credentials: false,
            example,
        }
    }

    /// A host written without a port gets `port`.
    pub const fn default_port(mut self, port: u16) -> Self {
        self.default_port = Some(port);
        self
    }

    /// The user information ends at the **last** `@` before the query, so a
    /// password may hold a `/` as it is — and a path may not hold an `@`. Without
    /// it (RFC 3986), the user information ends within the authority (before the
    /// first `/`): a `/` in a password is written `%2F`, and a path may hold `@`.
    pub const fn raw_slash_in_password(mut self) -> Self {
        self.raw_slash_in_password = true;
        self
    }

    /// Either credential may be left out, as Redis' URLs allow: `:password@` (the
    /// server's default user; [`BackendUrl::credentials`] gives an empty user) or
    /// `user@` (no password: an empty one). Without it both are required.
    pub const fn optional_credentials(mut self) -> Self {
        self.optional_credentials = true;
        self
    }
}

/// A backend URL, taken apart: `scheme://[user:password@]host[:port][,host[:port]…]
/// [/path][?key=value&…]`.
///
/// * The user information ends at the last `@` of the authority (or, with
///   [`UrlSpec::raw_slash_in_password`], the last `@` before the query); user and
///   password are percent-decoded, and the user may not be empty. A `?` or `#`
///   inside them must be percent-encoded (`%3F`, `%23`): such a URL is refused,
///   saying so.
/// * Hosts are separated by commas; none may be empty, a port is digits, an IPv6
///   address is in brackets. A host without a port gets [`UrlSpec::default_port`].
/// * The path is kept as written (from its `/`), for the backend to read.
/// * Option values are percent-decoded; keys are kept as written, in order, for the
///   backend to take one by one (and refuse the ones it does not know).
///
/// Every error is [`ErrorKind::Config`], shows the URL with its secrets hidden
/// ([`redact_url`]) and how to write it (the example given to [`UrlSpec::new`]).
///
/// ```
/// use dlock_spi::{BackendUrl, UrlSpec};
/// const SPEC: UrlSpec = UrlSpec::new("example URL", &["ex", "exs"], "ex://host:7000/path?timeout=5s")
///     .default_port(7000);
/// let url = BackendUrl::parse("exs://app:p%40ss@h1,h2:7001/locks?timeout=2s", &SPEC).unwrap();
/// assert_eq!(url.scheme(), "exs");
/// assert_eq!(url.credentials(), Some(("app", "p@ss")));
/// assert_eq!(url.hosts(), ["h1:7000", "h2:7001"]);
/// assert_eq!(url.path(), "/locks");
/// let (key, value) = &url.options()[0];
/// assert_eq!((key.as_str(), url.duration(key, value).unwrap().as_secs()), ("timeout", 2));
/// let err = BackendUrl::parse("ex://app:secret@", &SPEC).unwrap_err();
/// assert_eq!(
///     err.message(),
///     "example URL \"ex://app:***@\": no host given (or an empty one between commas); write it as ex://host:7000/path?timeout=5s"
/// );
/// ```
#[derive(Clone)]
pub struct BackendUrl {
    spec: UrlSpec,
    shown: String,
    scheme: String,
    credentials: Option<(String, String)>,
    hosts: Vec<String>,
    path: String,
    options: Vec<(String, String)>,
}

impl BackendUrl {
    /// Takes `url` apart as `spec` says its backend writes URLs.
    pub fn parse(url: &str, spec: &UrlSpec) -> Result<Self> {
        let mut parsed = BackendUrl {
            spec: *spec,
            shown: redact_url(url),
            scheme: String::new(),
            credentials: None,
            hosts: Vec::new(),
            path: String::new(),
            options: Vec::new(),
        };
        let (scheme, rest) = url
            .split_once("://")
            .filter(|(s, _)| spec.schemes.contains(s))
            .ok_or_else(|| {
                parsed.error(format_args!(
                    "the scheme must be {}",
                    spec.schemes
                        .iter()
                        .map(|s| format!("{s}://"))
                        .collect::<Vec<_>>()
                        .join(" or ")
                ))
            })?;
        parsed.scheme = scheme.to_owned();
        if rest.contains('#') {
            return Err(parsed.error(
                "it holds a '#' (these URLs have no fragment): percent-encode it as %23 in a user or password",
            ));
        }
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        // An '@' in the query's first key, before any '=': the '?' was a password's.
        let first_key = query.split(['=', '&']).next().unwrap_or("");
        if first_key.contains('@') {
            return Err(parsed.error("a user or password holds a '?': percent-encode it as %3F"));
        }
        let (userinfo, authority, path) = if spec.raw_slash_in_password {
            // The user information ends at the last '@' (a password may hold a '/').
            let (userinfo, rest) = match rest.rsplit_once('@') {
                Some((userinfo, rest)) => (Some(userinfo), rest),
                None => (None, rest),
            };
            let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            (userinfo, authority, path)
        } else {
            let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            match authority.rsplit_once('@') {
                Some((userinfo, hosts)) => (Some(userinfo), hosts, path),
                None => (None, authority, path),
            }
        };
        if let Some(userinfo) = userinfo {
            let (user, password) = match userinfo.split_once(':') {
                Some(both) => both,
                None if spec.optional_credentials => (userinfo, ""),
                None => {
                    return Err(
                        parsed.error("credentials need a user and a password (user:password@)")
                    )
                }
            };
            let user = parsed.decoded(user, "the user")?;
            if user.is_empty() && !spec.optional_credentials {
                return Err(parsed.error("the user is empty"));
            }
            let password = parsed.decoded(password, "the password")?;
            parsed.credentials = Some((user, password));
        }
        if authority.split(',').any(|h| h.trim().is_empty()) {
            return Err(parsed.error("no host given (or an empty one between commas)"));
        }
        for h in authority.split(',').map(str::trim) {
            if h.matches(':').count() > 1 && !h.starts_with('[') {
                return Err(parsed.error(format_args!(
                    "host {h:?} is an IPv6 address without brackets: write it as [{h}] (a port after them: [{h}]:port)"
                )));
            }
            // The port written, if any: after "]:" for an IPv6 address, else the last ':'.
            let port = match h.strip_prefix('[') {
                Some(v6) => v6
                    .split_once(']')
                    .and_then(|(_, after)| after.strip_prefix(':')),
                None => h.rsplit_once(':').map(|(_, port)| port),
            };
            if port.is_some_and(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit())) {
                return Err(parsed.error(format_args!(
                    "host {h:?}: a port is digits (a '/' in a password is written %2F)"
                )));
            }
        }
        parsed.hosts = authority
            .split(',')
            .map(|h| {
                let h = h.trim();
                match spec.default_port {
                    Some(port) if !has_port(h) => format!("{h}:{port}"),
                    _ => h.to_owned(),
                }
            })
            .collect();
        parsed.path = path.to_owned();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = parsed.decoded(value, &format!("option {key}"))?;
            parsed.options.push((key.to_owned(), value));
        }
        Ok(parsed)
    }

    /// The scheme, without `://`.
    pub fn scheme(&self) -> &str {
        &self.scheme
    }

    /// The user and password, decoded (either may be empty only with
    /// [`UrlSpec::optional_credentials`]).
    pub fn credentials(&self) -> Option<(&str, &str)> {
        self.credentials
            .as_ref()
            .map(|(u, p)| (u.as_str(), p.as_str()))
    }

    /// The hosts, each `host:port` (or as written, without a default port).
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// The path as written, from its `/` (empty when there is none).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The options, in order: each key as written and its value decoded.
    pub fn options(&self) -> &[(String, String)] {
        &self.options
    }

    /// A [`ErrorKind::Config`] error about this URL: `what` is wrong, shown with the
    /// URL (secrets hidden) and how to write it.
    pub fn error(&self, what: impl fmt::Display) -> Error {
        Error::new(
            ErrorKind::Config,
            format!(
                "{} {:?}: {what}; write it as {}",
                self.spec.label, self.shown, self.spec.example
            ),
        )
    }

    /// Option `key`'s `value` as a positive duration ([`parse_url_duration`]), or an
    /// error saying how to write one.
    pub fn duration(&self, key: &str, value: &str) -> Result<std::time::Duration> {
        parse_url_duration(value)
            .filter(|d| !d.is_zero())
            .ok_or_else(|| {
                self.error(format_args!(
                    "{key}={value:?} is not a duration like 10s, 2500ms or 1m"
                ))
            })
    }

    /// The error of an option this backend does not know; `known` lists the ones it
    /// does.
    pub fn unknown_option(&self, key: &str, known: &[&str]) -> Error {
        self.error(format_args!(
            "unknown option {key:?} (known: {})",
            known.join(", ")
        ))
    }

    /// Reads the TLS file options (`tls_ca`, `tls_cert`, `tls_key`: PEM files, see
    /// [`TlsFiles`](crate::TlsFiles)) into `ca` and `identity` — the URL's win over what they held —
    /// and returns the other options, in order, for the backend to take. Without
    /// `tls` (a plain connection) a TLS option is refused, saying to use
    /// `tls_scheme`.
    pub fn take_tls_files(
        &self,
        tls: bool,
        tls_scheme: &str,
        ca: &mut Option<Vec<u8>>,
        identity: &mut Option<TlsIdentity>,
    ) -> Result<Vec<(&str, &str)>> {
        take_tls_options(&self.shown, &self.options, tls, ca, identity, |key| {
            self.error(format_args!("{key} is for TLS; use {tls_scheme}://"))
        })
    }

    fn decoded(&self, part: &str, what: &str) -> Result<String> {
        percent_decode(part)
            .ok_or_else(|| self.error(format_args!("{what} is not valid percent-encoded UTF-8")))
    }
}

/// Whether `host` ends in a port (`h:1`, `[::1]:1`; `[::1]` has none). An IPv6
/// address outside brackets is refused before this is asked.
fn has_port(host: &str) -> bool {
    host.rsplit_once(':')
        .is_some_and(|(_, port)| !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()))
}

impl fmt::Debug for BackendUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The redacted form only: no password, no secret option.
        f.debug_tuple("BackendUrl").field(&self.shown).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: UrlSpec = UrlSpec::new("test URL", &["t", "ts"], "t://host:1/path")
        .default_port(1)
        .raw_slash_in_password();
    /// As RFC 3986 reads a URL: the user information within the authority.
    const RFC: UrlSpec = UrlSpec::new("test URL", &["t"], "t://host:1/path").default_port(1);

    fn parse(url: &str) -> Result<BackendUrl> {
        BackendUrl::parse(url, &SPEC)
    }

    #[test]
    fn without_raw_slashes_in_passwords_a_path_may_hold_an_at() {
        let u = BackendUrl::parse("t://u:p%2Fw@h/app@v2?ca=/c/ca@2.pem", &RFC)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(u.credentials(), Some(("u", "p/w")));
        assert_eq!((u.hosts(), u.path()), (&["h:1".to_owned()][..], "/app@v2"));
        assert_eq!(u.options()[0].1, "/c/ca@2.pem");
        let u = BackendUrl::parse("t://h/app@v2", &RFC).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((u.credentials(), u.path()), (None, "/app@v2"));
        let err = BackendUrl::parse("t://u:p/w@h", &RFC).err();
        assert!(
            err.as_ref()
                .is_some_and(|e| e.message().contains("written %2F")),
            "{err:?}"
        );
    }

    #[test]
    fn a_password_may_hold_a_slash_and_encoded_reserved_characters() {
        let u = parse("t://u%3Ax:p/a%40%3F%23ss@h:2,[::1],[::1]:3/p/q?k=v%26w&flag")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(u.credentials(), Some(("u:x", "p/a@?#ss")));
        assert_eq!(u.hosts(), ["h:2", "[::1]:1", "[::1]:3"]);
        assert_eq!(u.path(), "/p/q");
        assert_eq!(
            u.options(),
            [("k".into(), "v&w".into()), ("flag".into(), String::new())]
        );
    }

    #[test]
    fn malformed_urls_are_refused_with_what_is_wrong_and_no_secret() {
        for (url, says) in [
            ("x://h", "the scheme must be t:// or ts://"),
            ("t://u:p@", "no host given"),
            ("t://h1,,h2", "no host given"),
            ("t://fe80::1", "without brackets: write it as [fe80::1]"),
            ("t://h:", "a port is digits"),
            ("t://h:abc", "a port is digits"),
            ("t://alone@h", "need a user and a password"),
            ("t://:secret@h", "the user is empty"),
            (
                "t://u:se%zzcret@h",
                "the password is not valid percent-encoded",
            ),
            ("t://u:se#cret@h", "percent-encode it as %23"),
            ("t://u:se?cret@h", "percent-encode it as %3F"),
            ("t://h?k=50%", "option k is not valid percent-encoded"),
        ] {
            let err = parse(url)
                .err()
                .unwrap_or_else(|| panic!("{url} was accepted"));
            assert_eq!(err.kind(), ErrorKind::Config);
            assert!(err.message().contains(says), "{url}: {err}");
            assert!(!err.message().contains("secret"), "{url}: {err}");
            assert!(
                err.message().contains("write it as t://host:1/path"),
                "{err}"
            );
        }
    }

    #[test]
    fn tls_file_options_are_refused_on_a_plain_connection_and_the_rest_passed_on() {
        let u = parse("t://h?tls_ca=/nowhere.pem&k=v").unwrap_or_else(|e| panic!("{e}"));
        let (mut ca, mut identity) = (None, None);
        let err = u.take_tls_files(false, "ts", &mut ca, &mut identity).err();
        assert!(
            err.as_ref()
                .is_some_and(|e| e.message().contains("tls_ca is for TLS; use ts://")),
            "{err:?}"
        );
        let u = parse("ts://h?k=v&tls_other=x").unwrap_or_else(|e| panic!("{e}"));
        let rest = u
            .take_tls_files(true, "ts", &mut ca, &mut identity)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(rest, [("k", "v"), ("tls_other", "x")]);
    }

    #[test]
    fn optional_credentials_take_a_password_alone_or_a_user_alone() {
        const OPT: UrlSpec = RFC.optional_credentials();
        let creds = |url: &str, spec: &UrlSpec| {
            BackendUrl::parse(url, spec)
                .map(|u| u.credentials().map(|(u, p)| (u.to_owned(), p.to_owned())))
        };
        assert_eq!(
            creds("t://:p%40ss@h", &OPT).ok().flatten(),
            Some((String::new(), "p@ss".into()))
        );
        assert_eq!(
            creds("t://app@h", &OPT).ok().flatten(),
            Some(("app".into(), String::new()))
        );
        assert!(creds("t://:p@h", &RFC).is_err() && creds("t://app@h", &RFC).is_err());
    }

    #[test]
    fn debug_shows_no_secret() {
        let u = parse("t://u:secret@h?token=abc").unwrap_or_else(|e| panic!("{e}"));
        let shown = format!("{u:?}");
        assert!(
            !shown.contains("secret") && !shown.contains("abc"),
            "{shown}"
        );
    }
}
