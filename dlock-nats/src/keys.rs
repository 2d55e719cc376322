//! Where a lock's contenders live in the bucket, and what their values hold.
//!
//! `<name>.<side>.<holder key>`: the lock's name and the grant's
//! [`HolderKey`](dlock_spi::HolderKey), each encoded as one subject token (bytes
//! outside `[A-Za-z0-9_/-]` as `=XX`), and the side `w` (exclusive), `r` (shared)
//! or `s` (permits). A name's token holds no `.`, so `<name>.>` reaches that lock's
//! keys and no other's; the encoding keeps prefixes (a name's prefix encodes to a
//! prefix of its encoding), so counting by name prefix reads the keys alone.
//!
//! The value is `<lease ms> <token> <permits> <total>\n<context>`: the contender's
//! lease, a token field (always 0: the token is the key's revision, the key never
//! rewritten), and for permits the count taken and the semaphore's total. A
//! contender's lease lives apart, under [`lease_key`]: rewritten by each renewal
//! (the same layout, with the context a leader may change), so the contenders' keys
//! are written once and deleted once — a snapshot of them read through a consumer
//! misses none that still exists.

use std::fmt::Write as _;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use dlock_spi::LockMode;

/// Encodes `text` as one subject token: `[A-Za-z0-9_/-]` as they are, every other
/// byte (`.`, `=`, spaces, UTF-8) as `=XX`.
///
/// ```text
/// orders.eu → orders=2Eeu
/// ```
pub(crate) fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'_' | b'/' | b'-') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "={b:02X}");
        }
    }
    out
}

/// The text [`encode`] made `token` from; `None` if it is not such a token.
pub(crate) fn decode(token: &str) -> Option<String> {
    let bytes = token.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'=' {
            let hex = token.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The side tag of a mode.
fn side(mode: LockMode) -> &'static str {
    match mode {
        LockMode::Exclusive => "w",
        LockMode::Shared => "r",
        LockMode::Permits(_) => "s",
    }
}

/// The key of grant `holder` (a [`dlock_spi::HolderKey`]'s text) of lock `name`.
pub(crate) fn contender_key(name: &str, mode: LockMode, holder: &str) -> String {
    format!("{}.{}.{}", encode(name), side(mode), encode(holder))
}

/// The key of the lease of grant `holder` of lock `name`: `=.<name>.<holder>` (a
/// token `=` alone is no encoded name, so no lock's filter reaches it). Rewritten
/// by every renewal; the contender's key is written once.
pub(crate) fn lease_key(name: &str, holder: &str) -> String {
    format!("=.{}.{}", encode(name), encode(holder))
}

/// The subject filter (after the bucket's prefix) of every contender key of lock
/// `name`.
pub(crate) fn lock_filter(name: &str) -> String {
    format!("{}.>", encode(name))
}

/// A contender's key taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyParts {
    /// The lock's name.
    pub(crate) name: String,
    /// `w`, `r` or `s`.
    pub(crate) side: char,
    /// The grant's holder key text.
    pub(crate) holder: String,
}

/// Takes a key made by [`contender_key`] apart; `None` for any other key.
pub(crate) fn parse_key(key: &str) -> Option<KeyParts> {
    let mut parts = key.split('.');
    let (name, side, holder) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || !matches!(side, "w" | "r" | "s") {
        return None;
    }
    Some(KeyParts {
        name: decode(name)?,
        side: side.chars().next()?,
        holder: decode(holder)?,
    })
}

/// What a contender's value holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stored {
    /// Its lease, from its latest write.
    pub(crate) lease: Duration,
    /// Its fencing token; 0 until the key is first rewritten (then the revision of
    /// its first write).
    pub(crate) token: u64,
    /// Permits taken (0 for locks).
    pub(crate) permits: u32,
    /// The semaphore's total (0 for locks).
    pub(crate) total: u32,
    /// The holder's context.
    pub(crate) context: Bytes,
}

impl Stored {
    /// The value's bytes.
    pub(crate) fn encode(&self) -> Bytes {
        let head = format!(
            "{} {} {} {}\n",
            self.lease.as_millis(),
            self.token,
            self.permits,
            self.total
        );
        let mut out = BytesMut::with_capacity(head.len() + self.context.len());
        out.extend_from_slice(head.as_bytes());
        out.extend_from_slice(&self.context);
        out.freeze()
    }

    /// Reads a value [`Stored::encode`] wrote; `None` for anything else.
    pub(crate) fn decode(value: &Bytes) -> Option<Stored> {
        let end = value.iter().position(|&b| b == b'\n')?;
        let head = std::str::from_utf8(&value[..end]).ok()?;
        let mut fields = head.split(' ');
        let mut next = || fields.next().and_then(|f| f.parse::<u64>().ok());
        let (lease, token, permits, total) = (next()?, next()?, next()?, next()?);
        Some(Stored {
            lease: Duration::from_millis(lease),
            token,
            permits: u32::try_from(permits).ok()?,
            total: u32::try_from(total).ok()?,
            context: value.slice(end + 1..),
        })
    }
}

/// `d` in nanoseconds.
pub(crate) fn nanos(d: Duration) -> i128 {
    i128::try_from(d.as_nanos()).unwrap_or(i128::MAX / 4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_holders_round_trip_through_one_token_each() {
        for text in ["orders", "a.b", "=3D", "ü / x-y_z", "a b\tc"] {
            let token = encode(text);
            assert!(!token.contains('.') && !token.contains(' '), "{token}");
            assert_eq!(decode(&token).as_deref(), Some(text));
        }
        let key = contender_key("a.b", LockMode::Shared, "owner#7");
        assert_eq!(key, "a=2Eb.r.owner=237");
        let parts = parse_key(&key).unwrap();
        assert_eq!(
            (parts.name.as_str(), parts.side, parts.holder.as_str()),
            ("a.b", 'r', "owner#7")
        );
        assert!(key.starts_with(&lock_filter("a.b")[..lock_filter("a.b").len() - 1]));
        assert!(!contender_key("a.bc", LockMode::Shared, "o").starts_with("a=2Eb."));
        assert_eq!(decode("=4"), None);
    }

    #[test]
    fn values_round_trip() {
        let stored = Stored {
            lease: Duration::from_millis(1500),
            token: 42,
            permits: 2,
            total: 5,
            context: Bytes::from_static(b"ctx\nwith newline"),
        };
        assert_eq!(Stored::decode(&stored.encode()), Some(stored));
        assert_eq!(Stored::decode(&Bytes::from_static(b"junk")), None);
    }
}
