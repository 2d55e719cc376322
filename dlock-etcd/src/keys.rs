//! Where a lock's contenders live in etcd's key space.
//!
//! `<prefix>\0<name>\0w/<holder key>` for a writer (an exclusive contender),
//! `<prefix>\0<name>\0r/<holder key>` for a reader and
//! `<prefix>\0<name>\0s/<permits>/<holder key>` for permits of a semaphore, whose
//! value starts with `<total>\n` (then the context). Everything a look needs is in
//! the keys (a look reads no values); a placement reads the total from the oldest
//! permit key's value. The tags sort `r/` < `s/` < `w/`, so what a reader waits for
//! (writers and permits) is one range. Lock names contain no control characters, so
//! the NUL ends the name: no name's keys fall in another name's range, whatever `/`
//! or other characters the names hold. The holder key is the grant's [`HolderKey`]:
//! a retried acquire finds its own key, and a release or renewal names exactly one
//! grant.

use dlock_spi::{HolderKey, LockMode, LockName};

/// Which side of a lock a contender queues for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    /// Exclusive: waits for every contender made before it.
    Write,
    /// Shared: waits for the writers and permits made before it.
    Read,
    /// Permits of a semaphore: hold while every contender before it holds permits
    /// and theirs with its own add up to at most the total.
    Permits,
}

impl Side {
    /// The side a request's mode queues on.
    pub(crate) fn of(mode: LockMode) -> Side {
        match mode {
            LockMode::Exclusive => Side::Write,
            LockMode::Shared => Side::Read,
            LockMode::Permits(_) => Side::Permits,
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Side::Write => "w/",
            Side::Read => "r/",
            Side::Permits => "s/",
        }
    }
}

/// A contender as its key names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Contender<'k> {
    /// The lock's name.
    pub(crate) name: &'k str,
    /// The mode it holds or waits for.
    pub(crate) mode: LockMode,
    /// The stored holder key.
    pub(crate) holder: &'k str,
}

/// The value stored under a contender's key: the context, after `<total>\n` for
/// permits.
pub(crate) fn stored_value(mode: LockMode, total: u32, context: &[u8]) -> Vec<u8> {
    match mode {
        LockMode::Permits(_) => {
            let mut value = format!("{total}\n").into_bytes();
            value.extend_from_slice(context);
            value
        }
        LockMode::Exclusive | LockMode::Shared => context.to_vec(),
    }
}

/// The total at the head of a permit key's stored value (`<total>\n`) and the
/// context after it, or `None` if the value has no well-formed head.
pub(crate) fn permit_total(value: &[u8]) -> Option<(u32, &[u8])> {
    let end = value.iter().position(|b| *b == b'\n')?;
    let total = std::str::from_utf8(&value[..end]).ok()?.parse().ok()?;
    Some((total, &value[end + 1..]))
}

/// The first key after every key that starts with `prefix`.
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
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

    /// The range `[start, end)` of the contenders on `side` of lock `name`.
    pub(crate) fn side(&self, name: &LockName, side: Side) -> (Vec<u8>, Vec<u8>) {
        let mut start = self.lock(name);
        start.extend_from_slice(side.tag().as_bytes());
        let end = prefix_end(&start);
        (start, end)
    }

    /// The range `[start, end)` of the contenders one on `side` waits for: every
    /// key of the lock for a writer or permits, its permits and writers for a
    /// reader.
    pub(crate) fn ahead(&self, name: &LockName, side: Side) -> (Vec<u8>, Vec<u8>) {
        let lock = self.lock(name);
        let end = prefix_end(&lock);
        match side {
            Side::Write | Side::Permits => (lock, end),
            Side::Read => (self.side(name, Side::Permits).0, end),
        }
    }

    /// The key of one grant's contender in `mode`.
    pub(crate) fn contender(&self, name: &LockName, mode: LockMode, holder: &HolderKey) -> Vec<u8> {
        let mut key = self.lock(name);
        key.extend_from_slice(Side::of(mode).tag().as_bytes());
        if let LockMode::Permits(n) = mode {
            key.extend_from_slice(format!("{n}/").as_bytes());
        }
        key.extend_from_slice(holder.as_str().as_bytes());
        key
    }

    /// Every key of every lock whose name starts with `prefix` starts with this.
    pub(crate) fn names_starting(&self, prefix: &str) -> Vec<u8> {
        format!("{}{prefix}", self.root).into_bytes()
    }

    /// The contender a key under this root names (`None` for a key that is not
    /// one).
    pub(crate) fn parse<'k>(&self, key: &'k [u8]) -> Option<Contender<'k>> {
        let rest = key.strip_prefix(self.root.as_bytes())?;
        let rest = std::str::from_utf8(rest).ok()?;
        let (name, contender) = rest.split_once('\0')?;
        let (mode, holder) = if let Some(h) = contender.strip_prefix(Side::Write.tag()) {
            (LockMode::Exclusive, h)
        } else if let Some(h) = contender.strip_prefix(Side::Read.tag()) {
            (LockMode::Shared, h)
        } else {
            let (n, h) = contender
                .strip_prefix(Side::Permits.tag())?
                .split_once('/')?;
            (LockMode::Permits(n.parse().ok()?), h)
        };
        Some(Contender { name, mode, holder })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_spi::{GrantId, OwnerId};

    #[test]
    fn permit_values_carry_the_total_before_the_context() {
        let value = stored_value(LockMode::Permits(2), 5, b"who\nelse");
        assert_eq!(permit_total(&value), Some((5, &b"who\nelse"[..])));
        assert_eq!(stored_value(LockMode::Shared, 5, b"ctx"), b"ctx".to_vec());
        for bad in [&b""[..], b"5", b"x\n", b"-1\n", b"5 2\n"] {
            assert_eq!(permit_total(bad), None, "{bad:?}");
        }
        assert_eq!(prefix_end(b"a\0"), b"a\x01".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
    }

    #[test]
    fn keys_round_trip_and_never_share_a_range() {
        let keys = Keys::new("dlock/");
        let holder = HolderKey::new(&OwnerId::new("m:1"), GrantId::new(7));
        // (Names with control characters are refused; the rest must be valid.)
        assert!(LockName::new("a\u{1}").is_err());
        for name in ["a", "a/w", "ü/..", "a b"] {
            let lock = LockName::new(name).expect("a valid name");
            for mode in [LockMode::Exclusive, LockMode::Shared, LockMode::Permits(12)] {
                let key = keys.contender(&lock, mode, &holder);
                let parsed = Contender {
                    name,
                    mode,
                    holder: holder.as_str(),
                };
                assert_eq!(keys.parse(&key), Some(parsed));
                assert!(key.starts_with(&keys.lock(&lock)));
                let (start, end) = keys.side(&lock, Side::of(mode));
                assert!(start.as_slice() <= key.as_slice() && key.as_slice() < end.as_slice());
            }
            let key = keys.contender(&lock, LockMode::Shared, &holder);
            let (start, end) = keys.ahead(&lock, Side::Read);
            let inside = |k: &[u8]| start.as_slice() <= k && k < end.as_slice();
            assert!(!inside(&key), "a reader waits for readers");
            assert!(inside(&keys.contender(&lock, LockMode::Exclusive, &holder)));
            assert!(inside(&keys.contender(
                &lock,
                LockMode::Permits(3),
                &holder
            )));
            let (start, end) = keys.ahead(&lock, Side::Permits);
            assert!(start.as_slice() <= key.as_slice() && key.as_slice() < end.as_slice());
        }
        let nested = Keys::new("dlock/x");
        let foo = LockName::new("foo").expect("a valid name");
        let xfoo = LockName::new("x/foo").expect("a valid name");
        assert!(!nested.lock(&foo).starts_with(&keys.lock(&xfoo)));
        assert!(!keys.lock(&xfoo).starts_with(&nested.lock(&foo)));
        let a = LockName::new("a").expect("a valid name");
        let aw = LockName::new("a/w").expect("a valid name");
        assert!(!keys.lock(&aw).starts_with(&keys.lock(&a)));
    }
}
