//! Values of backend URL options (`?session_timeout=10s`), parsed one way for
//! every backend.

use std::time::Duration;

/// Parses a URL option's duration: `10s`, `2500ms`, `1m`, or a bare number of
/// milliseconds; `None` for anything else (the backend's URL parser says what is
/// wrong and how to write it).
///
/// ```
/// use std::time::Duration;
/// use dlock_spi::parse_url_duration;
/// assert_eq!(parse_url_duration("10s"), Some(Duration::from_secs(10)));
/// assert_eq!(parse_url_duration("2500ms"), Some(Duration::from_millis(2500)));
/// assert_eq!(parse_url_duration("250"), Some(Duration::from_millis(250)));
/// assert_eq!(parse_url_duration("1m"), Some(Duration::from_secs(60)));
/// assert_eq!(parse_url_duration("soon"), None);
/// assert_eq!(parse_url_duration("1h"), None);
/// ```
pub fn parse_url_duration(s: &str) -> Option<Duration> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let n: u64 = number.parse().ok()?;
    match unit {
        "" | "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => n.checked_mul(60).map(Duration::from_secs),
        _ => None,
    }
}

/// `%XX`-decodes a URL part (a user, password, path or option value); `None` if it
/// is not valid percent-encoded UTF-8.
///
/// ```
/// use dlock_spi::percent_decode;
/// assert_eq!(percent_decode("p%40ss%3Aw0rd").as_deref(), Some("p@ss:w0rd"));
/// assert_eq!(percent_decode("50%"), None);
/// ```
pub fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}
