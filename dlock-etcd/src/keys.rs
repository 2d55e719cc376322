//! Where a lock's contenders live in etcd's key space.
//!
//! `<prefix>\0<name>\0w/<holder key>` for a writer (an exclusive contender) and
//! `<prefix>\0<name>\0r/<holder key>` for a reader. Lock names contain no control
//! characters, so the NUL ends the name: no name's keys fall in another name's
//! range, whatever `/` or other characters the names hold. The holder key is the
//! grant's [`HolderKey`]: a retried acquire finds its own key, and a release or
//! renewal names exactly one grant.

use dlock_spi::{HolderKey, LockMode, LockName};

/// Which side of a lock a contender queues for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    /// Exclusive: waits for every contender made before it.
    Write,
    /// Shared: waits for the writers made before it.
    Read,
}

impl Side {
    /// The side a request's mode queues on (`None` for permits: no semaphores here).
    pub(crate) fn of(mode: LockMode) -> Option<Side> {
        match mode {
            LockMode::Exclusive => Some(Side::Write),
            LockMode::Shared => Some(Side::Read),
            LockMode::Permits(_) => None,
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Side::Write => "w/",
            Side::Read => "r/",
        }
    }

    /// The mode a holder on this side holds.
    pub(crate) fn mode(self) -> LockMode {
        match self {
            Side::Write => LockMode::Exclusive,
            Side::Read => LockMode::Shared,
        }
    }
}

/// The key layout under one prefix.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    /// `<prefix>\0`: prefixes hold no control characters, so no prefix's keys
    /// fall under another's (`a` and `a/b` included).
    root: String,
}

impl Keys {
    /// The layout under `prefix` (no trailing `/`).
    pub(crate) fn new(prefix: &str) -> Self {
        Keys {
            root: format!("{}\0", prefix.trim_end_matches('/')),
        }
    }

    /// Every key of lock `name` starts with this.
    pub(crate) fn lock(&self, name: &LockName) -> Vec<u8> {
        let mut key = Vec::with_capacity(self.root.len() + name.as_str().len() + 1);
        key.extend_from_slice(self.root.as_bytes());
        key.extend_from_slice(name.as_str().as_bytes());
        key.push(0);
        key
    }

    /// Every writer of lock `name` starts with this.
    pub(crate) fn writers(&self, name: &LockName) -> Vec<u8> {
        let mut key = self.lock(name);
        key.extend_from_slice(Side::Write.tag().as_bytes());
        key
    }

    /// The key of one grant's contender.
    pub(crate) fn contender(&self, name: &LockName, side: Side, holder: &HolderKey) -> Vec<u8> {
        let mut key = self.lock(name);
        key.extend_from_slice(side.tag().as_bytes());
        key.extend_from_slice(holder.as_str().as_bytes());
        key
    }

    /// Every key of every lock whose name starts with `prefix` starts with this.
    pub(crate) fn names_starting(&self, prefix: &str) -> Vec<u8> {
        format!("{}{prefix}", self.root).into_bytes()
    }

    /// Lock name, side and stored holder key of a contender's key under this root.
    pub(crate) fn parse<'k>(&self, key: &'k [u8]) -> Option<(&'k str, Side, &'k str)> {
        let rest = key.strip_prefix(self.root.as_bytes())?;
        let rest = std::str::from_utf8(rest).ok()?;
        let (name, contender) = rest.split_once('\0')?;
        let (side, holder) = if let Some(h) = contender.strip_prefix(Side::Write.tag()) {
            (Side::Write, h)
        } else {
            (Side::Read, contender.strip_prefix(Side::Read.tag())?)
        };
        Some((name, side, holder))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_spi::{GrantId, OwnerId};

    #[test]
    fn keys_round_trip_and_never_share_a_range() {
        let keys = Keys::new("dlock/");
        let holder = HolderKey::new(&OwnerId::new("m:1"), GrantId::new(7));
        for name in ["a", "a/w", "a\u{1}", "ü/..", "a b"] {
            let Ok(lock) = LockName::new(name) else {
                continue;
            };
            let key = keys.contender(&lock, Side::Read, &holder);
            assert_eq!(keys.parse(&key), Some((name, Side::Read, holder.as_str())));
            assert!(key.starts_with(&keys.lock(&lock)));
            assert!(!keys
                .contender(&lock, Side::Read, &holder)
                .starts_with(&keys.writers(&lock)));
        }
        let nested = Keys::new("dlock/x");
        if let Ok(foo) = LockName::new("foo") {
            if let Ok(xfoo) = LockName::new("x/foo") {
                assert!(!nested.lock(&foo).starts_with(&keys.lock(&xfoo)));
                assert!(!keys.lock(&xfoo).starts_with(&nested.lock(&foo)));
            }
        }
        let a = LockName::new("a").ok();
        let aw = LockName::new("a/w").ok();
        if let (Some(a), Some(aw)) = (a, aw) {
            assert!(!keys.lock(&aw).starts_with(&keys.lock(&a)));
        }
    }
}
