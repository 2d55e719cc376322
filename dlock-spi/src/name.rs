//! Validated lock names.

use std::fmt;
use std::sync::Arc;

use crate::error::{Error, ErrorKind, Result};

/// A lock's name, validated once at the edge so every backend can trust it.
///
/// Rules: non-empty, at most [`LockName::MAX_LEN`] bytes of UTF-8, and no control
/// characters (NUL, newlines, tabs, DEL, C1 controls). Everything else — `/`, `..`,
/// `{}`, quotes, `;`, `%`, spaces, any Unicode — is a legal, distinct name; each
/// backend encodes it so that no name can reach another lock's state (Redis escapes
/// hash-tag braces, ZooKeeper escapes path separators, SQL binds it as a parameter).
/// Names are case-sensitive: `A` and `a` are two locks.
///
/// Cloning is cheap (a shared pointer).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockName(Arc<str>);

impl LockName {
    /// The longest accepted name, in bytes. Backends may accept less (a SQL column's
    /// width) and say so with [`ErrorKind::InvalidName`].
    pub const MAX_LEN: usize = 1024;

    /// Validates `name`.
    pub fn new(name: impl AsRef<str>) -> Result<Self> {
        let name = name.as_ref();
        Self::validate(name)?;
        Ok(LockName(Arc::from(name)))
    }

    /// Validates `namespace` + `separator` + `name` as one name; used by managers and
    /// groups that prefix names.
    pub fn with_prefix(prefix: &str, name: &str) -> Result<Self> {
        if prefix.is_empty() {
            return Self::new(name);
        }
        Self::validate(name)?;
        Self::new(format!("{prefix}{name}"))
    }

    fn validate(name: &str) -> Result<()> {
        if name.is_empty() {
            return Err(Error::new(
                ErrorKind::InvalidName,
                "lock name is empty; give every lock a non-empty name such as \"orders:42\"",
            ));
        }
        if name.len() > Self::MAX_LEN {
            return Err(Error::new(
                ErrorKind::InvalidName,
                format!(
                    "lock name is {} bytes long; the limit is {} bytes — hash long keys before using them as names",
                    name.len(),
                    Self::MAX_LEN
                ),
            ));
        }
        if let Some((at, c)) = name.char_indices().find(|(_, c)| c.is_control()) {
            return Err(Error::new(
                ErrorKind::InvalidName,
                format!(
                    "lock name contains the control character U+{:04X} at byte {at}; remove control characters (NUL, newlines, tabs) from names",
                    c as u32
                ),
            ));
        }
        Ok(())
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The name's group: the part before the first `separator` (`orders:42` → `orders`
    /// with `:`), or `-` when there is none. Plugins label metrics and apply limits per
    /// group, so they all use this one definition.
    pub fn group(&self, separator: char) -> &str {
        match self.0.split_once(separator) {
            Some((group, _)) if !group.is_empty() => group,
            _ => "-",
        }
    }

    /// Always false: a `LockName` is never empty. Present for API symmetry with `str`.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl AsRef<str> for LockName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl TryFrom<&str> for LockName {
    type Error = Error;
    fn try_from(value: &str) -> Result<Self> {
        LockName::new(value)
    }
}

impl TryFrom<String> for LockName {
    type Error = Error;
    fn try_from(value: String) -> Result<Self> {
        LockName::new(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ordinary_and_odd_but_harmless_names() {
        for ok in [
            "a",
            "orders:42",
            "/",
            "..",
            "{x}",
            "a'b\"c;",
            "ключ",
            "🔒",
            " ",
        ] {
            assert_eq!(
                LockName::new(ok).map(|n| n.to_string()).ok(),
                Some(ok.to_string())
            );
        }
    }

    #[test]
    fn rejects_empty_long_and_control_characters_with_a_typed_error() {
        let long = "x".repeat(LockName::MAX_LEN + 1);
        for bad in [
            "",
            long.as_str(),
            "a\0b",
            "line\nbreak",
            "tab\t",
            "\u{7f}",
            "\u{85}",
        ] {
            let err = LockName::new(bad).err().map(|e| e.kind());
            assert_eq!(err, Some(ErrorKind::InvalidName), "{bad:?}");
        }
        assert!(LockName::new("x".repeat(LockName::MAX_LEN)).is_ok());
    }

    #[test]
    fn group_is_the_prefix_up_to_the_separator() {
        let n = |s: &str| LockName::new(s).unwrap();
        assert_eq!(n("user:7:cart").group(':'), "user");
        assert_eq!(n("plain").group(':'), "-");
        assert_eq!(n(":x").group(':'), "-");
        assert_eq!(n("a/b").group('/'), "a");
    }

    #[test]
    fn prefix_validates_both_parts() {
        assert_eq!(
            LockName::with_prefix("app:", "a")
                .map(|n| n.to_string())
                .ok(),
            Some("app:a".to_string())
        );
        assert!(LockName::with_prefix("app:", "").is_err());
        assert!(LockName::with_prefix("app:", "\n").is_err());
    }
}
