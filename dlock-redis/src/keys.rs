//! Key layout. Every key of one lock shares the hash tag `{<encoded name>}`, so they
//! live in one Cluster slot and one script can touch them all.
//!
//! The name is percent-encoded for `%`, `{` and `}`: the tag can neither end early
//! nor be empty, and no two names encode alike, so no name reaches another's keys.

use dlock_spi::LockName;

/// The keys of one lock, in the order the scripts take them.
#[derive(Debug, Clone)]
pub(crate) struct LockKeys {
    /// Exclusive holder (expires with the lease), then the last token for a minute.
    pub(crate) exclusive: String,
    /// Shared holders: sorted set owner → expiry (server ms).
    pub(crate) readers: String,
    /// Shared holders' tokens and contexts: hash.
    pub(crate) reader_data: String,
    /// Fair queue: sorted set owner → arrival (server µs).
    pub(crate) queue: String,
    /// Fair queue liveness: sorted set owner → liveness deadline (server ms).
    pub(crate) queue_alive: String,
    /// Fair queue modes: hash owner → "x" | "s".
    pub(crate) queue_mode: String,
    /// A waiting writer's mark (non-fair read-write locks): readers stand back.
    pub(crate) writer_waiting: String,
    /// The channel release notices go to.
    pub(crate) channel: String,
}

pub(crate) fn encode(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for c in name.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
    out
}

impl LockKeys {
    pub(crate) fn new(prefix: &str, name: &LockName) -> Self {
        let base = format!("{prefix}{{{}}}", encode(name.as_str()));
        LockKeys {
            exclusive: format!("{base}:x"),
            readers: format!("{base}:r"),
            reader_data: format!("{base}:rd"),
            queue: format!("{base}:q"),
            queue_alive: format!("{base}:ql"),
            queue_mode: format!("{base}:qm"),
            writer_waiting: format!("{base}:ww"),
            channel: format!("{base}:c"),
        }
    }

    /// The keys in script order (KEYS[1..8]; the fourth slot is unused).
    pub(crate) fn all(&self) -> [&str; 8] {
        [
            &self.exclusive,
            &self.readers,
            &self.reader_data,
            &self.exclusive,
            &self.queue,
            &self.queue_alive,
            &self.queue_mode,
            &self.writer_waiting,
        ]
    }
}

/// A glob pattern matching the exclusive/reader/queue keys of every name that starts
/// with `name_prefix` (for counting live locks).
pub(crate) fn scan_pattern(prefix: &str, name_prefix: &str) -> String {
    let mut glob = String::new();
    for c in format!("{prefix}{{{}", encode(name_prefix)).chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            glob.push('\\');
        }
        glob.push(c);
    }
    glob.push('*');
    glob
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn braces_cannot_break_the_hash_tag() {
        let k = LockKeys::new("dlock:", &LockName::new("}x{").unwrap());
        assert_eq!(k.exclusive, "dlock:{%7Dx%7B}:x");
        let a = LockKeys::new("p:", &LockName::new("%7D").unwrap());
        let b = LockKeys::new("p:", &LockName::new("}").unwrap());
        assert_ne!(a.exclusive, b.exclusive);
    }

    #[test]
    fn scan_patterns_escape_glob_characters() {
        assert_eq!(scan_pattern("d:", "a*[b]"), "d:{a\\*\\[b\\]*");
    }
}
