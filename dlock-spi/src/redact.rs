//! Keeping secrets out of logs and error messages.

/// Replaces the secrets of a URL with `***`, so it can be logged and shown in errors:
/// the password of `scheme://user:password@host…`, and the value of every query
/// parameter whose name says it holds one (`password`, `pwd`, `pass`, `secret`,
/// `token`, `auth`, … in any case, as part of a longer name too: `sslpassword`,
/// `auth_token`).
///
/// A string that is not such a URL (`mysql:/root:pw@host`, a `//` missing) fails
/// closed: whatever comes before its last `@` (where a URL's user info would end)
/// is hidden, but for a leading `scheme:`.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return redact_unparsed(url);
    };
    // The user info ends at the last '@': a password may hold a '/', '?' or '#' that
    // was not percent-encoded (hiding too much is the safe side). The host part
    // ends at the first '/', '?' or '#' after it.
    let (userinfo, after) = match rest.rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    let (host, tail) = split_host(after);
    let authority = match userinfo {
        Some(userinfo) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:***@{host}"),
            None => format!("{userinfo}@{host}"),
        },
        None => host.to_owned(),
    };
    format!("{scheme}://{authority}{}", redact_query(tail))
}

/// What follows a URL's user info, split where its host part ends: at the first
/// `/`, `?` or `#`.
fn split_host(after: &str) -> (&str, &str) {
    after.split_at(after.find(['/', '?', '#']).unwrap_or(after.len()))
}

/// [`redact_url`] of a string without `://`.
fn redact_unparsed(url: &str) -> String {
    let scheme_end = url
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
        .filter(|&i| i > 0 && url[i..].starts_with(':'))
        .map_or(0, |i| i + 1);
    let (scheme, rest) = url.split_at(scheme_end);
    match rest.rfind('@') {
        Some(at) => {
            let (host, tail) = split_host(&rest[at + 1..]);
            format!("{scheme}***@{host}{}", redact_query(tail))
        }
        None => format!("{scheme}{}", redact_query(rest)),
    }
}

/// Whether a query parameter's name says its value is a secret.
fn secret_parameter(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["pass", "pwd", "secret", "token", "auth", "credential"]
        .iter()
        .any(|marker| name.contains(marker))
}

/// `path?query#fragment` with the secret parameters' values replaced.
fn redact_query(tail: &str) -> String {
    let Some(q) = tail.find('?') else {
        return tail.to_owned();
    };
    let (path, query) = tail.split_at(q + 1);
    let (query, fragment) = match query.find('#') {
        Some(h) => query.split_at(h),
        None => (query, ""),
    };
    let query: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _)) if secret_parameter(name) => format!("{name}=***"),
            _ => pair.to_owned(),
        })
        .collect();
    format!("{path}{}{fragment}", query.join("&"))
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

    /// Seen in a user's error message: `backend URL "mysql:/root:S3cretPW@…" has no
    /// scheme` echoed the password of a URL whose `//` was mistyped.
    #[test]
    fn a_string_that_is_not_a_url_hides_its_user_info_too() {
        for (url, shown) in [
            (
                "mysql:/root:S3cretPW@127.0.0.1/test",
                "mysql:***@127.0.0.1/test",
            ),
            ("mysql//root:S3cretPW@127.0.0.1/test", "***@127.0.0.1/test"),
            ("redis:/:S3cretPW@h:6379/0?x=1", "redis:***@h:6379/0?x=1"),
            ("root:S3cretPW@h", "root:***@h"),
            ("etcd:/u:p@ss@h?token=k", "etcd:***@h?token=***"),
            ("mysql:/h/db?password=S3cretPW", "mysql:/h/db?password=***"),
            ("sqlite:dlock.db", "sqlite:dlock.db"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    #[test]
    fn a_password_holding_url_delimiters_is_hidden_whole() {
        for (url, shown) in [
            ("etcd://app:pa/ss@h:2379/p", "etcd://app:***@h:2379/p"),
            ("etcd://app:pa?ss@h/p", "etcd://app:***@h/p"),
            (
                "etcd://app:pa#ss@h/p?timeout=x",
                "etcd://app:***@h/p?timeout=x",
            ),
            ("redis://:p@ss@host/0", "redis://:***@host/0"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    #[test]
    fn redacts_secrets_in_query_parameters() {
        assert_eq!(
            redact_url("postgres://u@h/db?sslmode=require&password=hunter2&application_name=x"),
            "postgres://u@h/db?sslmode=require&password=***&application_name=x"
        );
        assert_eq!(
            redact_url("mysql://h/db?PWD=a%20b#frag"),
            "mysql://h/db?PWD=***#frag"
        );
        assert_eq!(
            redact_url("redis://h/0?sslpassword=k1&auth_token=k2&secret=k3&pass=k4"),
            "redis://h/0?sslpassword=***&auth_token=***&secret=***&pass=***"
        );
        assert_eq!(
            redact_url("zk://u:p@h:2181/root?session_timeout=3s"),
            "zk://u:***@h:2181/root?session_timeout=3s"
        );
        assert_eq!(
            redact_url("sqlite://a.db?mode=rwc"),
            "sqlite://a.db?mode=rwc"
        );
    }
}
