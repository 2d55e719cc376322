//! Keeping secrets out of logs and error messages.

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
}
