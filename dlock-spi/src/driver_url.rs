//! A URL that a driver reads (sqlx, the redis crate) with dlock's own options among
//! its query's: taken off one way for every backend, the rest left to the driver
//! exactly as written.
//!
//! The driver keeps the URL's grammar (SQLite paths, `#insecure`, its own TLS
//! modes); dlock takes only the keys it owns. A backend whose URL is dlock's alone
//! reads it with [`BackendUrl`](crate::BackendUrl) instead.

use std::fmt;

use crate::error::{Error, ErrorKind, Result};
use crate::redact::redact_url;
use crate::tls::{take_tls_options, TlsIdentity};
use crate::url_option::{parse_url_duration, percent_decode};

/// A driver's URL with dlock's options taken off its query.
///
/// * Every `key=value` of the query whose key the backend owns (`is_own`) is taken,
///   its value percent-decoded (`+` stays a `+`: these values are paths and names,
///   not form fields); the others stay, in order and as written.
/// * A fragment (`#…`) stays the driver's; nothing before the query changes.
/// * Errors are [`ErrorKind::Config`] and show the URL without its secrets
///   ([`redact_url`]).
///
/// ```
/// use dlock_spi::DriverUrl;
/// let url = DriverUrl::split(
///     "mysql://app:p%40ss@db/test?ssl-mode=required&dlock_mode=session&dlock_table_prefix=a%2Fb",
///     |key| key.starts_with("dlock_"),
/// )
/// .unwrap();
/// assert_eq!(url.driver_url(), "mysql://app:p%40ss@db/test?ssl-mode=required");
/// assert_eq!(url.own_options()[1], ("dlock_table_prefix".into(), "a/b".into()));
/// let err = url.option_error("dlock_mode", "session", "expected row").message().to_owned();
/// assert_eq!(err, "URL option dlock_mode=\"session\" of \"mysql://app:***@db/test?ssl-mode=required&dlock_mode=session&dlock_table_prefix=a%2Fb\" is invalid: expected row");
/// ```
#[derive(Clone)]
pub struct DriverUrl {
    shown: String,
    driver: String,
    own: Vec<(String, String)>,
}

impl DriverUrl {
    /// Takes the options whose key `is_own` says is dlock's off `url`.
    pub fn split(url: &str, is_own: impl Fn(&str) -> bool) -> Result<Self> {
        let shown = redact_url(url);
        let (rest, fragment) = match url.split_once('#') {
            Some((rest, fragment)) => (rest, Some(fragment)),
            None => (url, None),
        };
        let Some((base, query)) = rest.split_once('?') else {
            return Ok(DriverUrl {
                shown,
                driver: url.to_owned(),
                own: Vec::new(),
            });
        };
        let mut kept = Vec::new();
        let mut own = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            if !is_own(key) {
                kept.push(pair);
                continue;
            }
            let decoded = percent_decode(value).ok_or_else(|| {
                Error::new(
                    ErrorKind::Config,
                    format!(
                        "URL option {key} of {shown:?} is not valid percent-encoded UTF-8; write a '%' as %25"
                    ),
                )
            })?;
            own.push((key.to_owned(), decoded));
        }
        let mut driver = base.to_owned();
        if !kept.is_empty() {
            driver.push('?');
            driver.push_str(&kept.join("&"));
        }
        if let Some(fragment) = fragment {
            driver.push('#');
            driver.push_str(fragment);
        }
        Ok(DriverUrl { shown, driver, own })
    }

    /// The URL for the driver: dlock's options taken off, the rest as written.
    pub fn driver_url(&self) -> &str {
        &self.driver
    }

    /// dlock's options, in order: each key as written and its value decoded.
    pub fn own_options(&self) -> &[(String, String)] {
        &self.own
    }

    /// The URL as given, its secrets hidden, for messages.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// The [`ErrorKind::Config`] error of option `key`'s `value`: `what` it
    /// should be.
    pub fn option_error(&self, key: &str, value: &str, what: impl fmt::Display) -> Error {
        Error::new(
            ErrorKind::Config,
            format!(
                "URL option {key}={value:?} of {:?} is invalid: {what}",
                self.shown
            ),
        )
    }

    /// Option `key`'s `value` as a positive duration of at least `min`
    /// ([`parse_url_duration`]), or an error saying how to write one.
    pub fn duration(
        &self,
        key: &str,
        value: &str,
        min: std::time::Duration,
    ) -> Result<std::time::Duration> {
        parse_url_duration(value)
            .filter(|d| *d >= min && !d.is_zero())
            .ok_or_else(|| {
                let what = if min.is_zero() {
                    "expected a positive duration".to_owned()
                } else {
                    format!("expected a duration of at least {min:?}")
                };
                self.option_error(key, value, format_args!("{what}, such as 500ms, 30s or 1m"))
            })
    }

    /// Reads the TLS file options among dlock's (`tls_ca`, `tls_cert`, `tls_key`,
    /// see [`TlsFiles`](crate::TlsFiles)) into `ca` and `identity`, as
    /// [`BackendUrl::take_tls_files`](crate::BackendUrl::take_tls_files) does, and
    /// returns the other options of dlock's.
    pub fn take_tls_files(
        &self,
        tls: bool,
        tls_scheme: &str,
        ca: &mut Option<Vec<u8>>,
        identity: &mut Option<TlsIdentity>,
    ) -> Result<Vec<(&str, &str)>> {
        take_tls_options(&self.shown, &self.own, tls, ca, identity, |key| {
            Error::new(
                ErrorKind::Config,
                format!(
                    "URL option {key} of {:?} is for TLS; use {tls_scheme}://",
                    self.shown
                ),
            )
        })
    }
}

impl fmt::Debug for DriverUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The redacted form only: no password, no secret option.
        f.debug_tuple("DriverUrl").field(&self.shown).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own(key: &str) -> bool {
        key.starts_with("dlock_") || key.starts_with("tls_")
    }

    #[test]
    fn the_drivers_part_stays_as_written_with_its_fragment() {
        let u = DriverUrl::split(
            "rediss://u:p%2B@h:1/0?protocol=resp3&tls_other=x&dlock_a=1+2&flag#insecure",
            own,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            u.driver_url(),
            "rediss://u:p%2B@h:1/0?protocol=resp3&flag#insecure"
        );
        assert_eq!(
            u.own_options(),
            [
                ("tls_other".into(), "x".into()),
                ("dlock_a".into(), "1+2".into())
            ]
        );
        let plain =
            DriverUrl::split("sqlite:///tmp/x.db#a?b", own).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(plain.driver_url(), "sqlite:///tmp/x.db#a?b");
        let none =
            DriverUrl::split("mysql://h/db?dlock_mode=row", own).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(none.driver_url(), "mysql://h/db");
    }

    #[test]
    fn a_bad_value_is_refused_without_the_secret() {
        let err = DriverUrl::split("mysql://u:secret@h/db?dlock_table_prefix=50%", own).err();
        let message = err.map(|e| e.message().to_owned()).unwrap_or_default();
        assert!(
            message.contains("option dlock_table_prefix of"),
            "{message}"
        );
        assert!(message.contains("not valid percent-encoded"), "{message}");
        assert!(!message.contains("secret"), "{message}");
        let u = DriverUrl::split("mysql://u:secret@h/db?dlock_session_timeout=0s", own)
            .unwrap_or_else(|e| panic!("{e}"));
        let (key, value) = &u.own_options()[0];
        let err = u
            .duration(key, value, std::time::Duration::from_secs(1))
            .err();
        assert!(
            err.as_ref().is_some_and(
                |e| e.message().contains("at least 1s") && !e.message().contains("secret")
            ),
            "{err:?}"
        );
        assert!(!format!("{u:?}").contains("secret"));
    }

    #[test]
    fn tls_files_are_refused_on_a_plain_connection() {
        let u = DriverUrl::split("redis://h?tls_ca=/nowhere.pem", own)
            .unwrap_or_else(|e| panic!("{e}"));
        let err = u
            .take_tls_files(false, "rediss", &mut None, &mut None)
            .err();
        assert!(
            err.as_ref().is_some_and(|e| e
                .message()
                .contains("tls_ca of \"redis://h?tls_ca=/nowhere.pem\" is for TLS; use rediss://")),
            "{err:?}"
        );
    }
}
