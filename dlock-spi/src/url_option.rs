//! Values of backend URL options (`?session_timeout=10s`), parsed one way for
//! every backend.

use std::time::Duration;

/// Parses a URL option's duration: a whole number with a unit — `us`, `ms`, `s`,
/// `m` or `h` — or a bare number of milliseconds; `None` for anything else (a
/// fraction, a sign, another unit, a value past the range; the backend's URL parser
/// says what is wrong and how to write it).
///
/// ```
/// use std::time::Duration;
/// use dlock_spi::parse_url_duration;
/// assert_eq!(parse_url_duration("10s"), Some(Duration::from_secs(10)));
/// assert_eq!(parse_url_duration("2500ms"), Some(Duration::from_millis(2500)));
/// assert_eq!(parse_url_duration("250"), Some(Duration::from_millis(250)));
/// assert_eq!(parse_url_duration("1m"), Some(Duration::from_secs(60)));
/// assert_eq!(parse_url_duration("2h"), Some(Duration::from_secs(7200)));
/// assert_eq!(parse_url_duration("750us"), Some(Duration::from_micros(750)));
/// assert_eq!(parse_url_duration("soon"), None);
/// assert_eq!(parse_url_duration("1.5s"), None);
/// assert_eq!(parse_url_duration("+5s"), None);
/// assert_eq!(parse_url_duration("1d"), None);
/// ```
pub fn parse_url_duration(s: &str) -> Option<Duration> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let n: u64 = number.parse().ok()?;
    match unit {
        "us" => Some(Duration::from_micros(n)),
        "" | "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => n.checked_mul(60).map(Duration::from_secs),
        "h" => n.checked_mul(3600).map(Duration::from_secs),
        _ => None,
    }
}

/// `%XX`-decodes a URL part (a user, password, path or option value); `None` if it
/// is not valid percent-encoded UTF-8: every `%` must start two hexadecimal digits
/// (checked here: the decoding crate passes a stray `%` through as it is).
///
/// ```
/// use dlock_spi::percent_decode;
/// assert_eq!(percent_decode("p%40ss%3Aw0rd").as_deref(), Some("p@ss:w0rd"));
/// assert_eq!(percent_decode("50%"), None);
/// assert_eq!(percent_decode("%+f"), None);
/// assert_eq!(percent_decode("%c3%28"), None); // not UTF-8
/// ```
pub fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let well_formed = bytes.iter().enumerate().all(|(i, &b)| {
        b != b'%'
            || bytes
                .get(i + 1..i + 3)
                .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit))
    });
    if !well_formed {
        return None;
    }
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .ok()
        .map(std::borrow::Cow::into_owned)
}
