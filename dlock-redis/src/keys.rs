//! Key layout. Every key of one lock shares the hash tag `{<encoded name>}`, so they
//! live in one Cluster slot and one script can touch them all.
//!
//! The name is percent-encoded for `%`, `{` and `}`: the tag can neither end early
//! nor be empty, and no two names encode alike, so no name reaches another's keys.
//!
//! Keys are written straight into the command being built ([`Key`]), so an operation
//! allocates no string per key.

use bytes::BufMut;

use dlock_spi::LockName;
use redis::{RedisWrite, ToRedisArgs};

/// Exclusive holder (expires with the lease), "R" while readers hold, or
/// "@<waiter>" while a release has set a free lock aside for a reader or permit waiter
/// that has waited 20 ms at the head of the queue.
pub(crate) const EXCLUSIVE: &str = ":x";
/// Fencing counter: never expires; a grant sets it to max(counter + 1, clock µs).
pub(crate) const FENCE: &str = ":f";
/// Shared holders and permit holders: sorted set owner → expiry (server ms).
pub(crate) const READERS: &str = ":r";
/// Shared holders' and permit holders' tokens (owner → token), contexts
/// (`c:<owner>`) and permits (`p:<owner>`), and a semaphore's total (`#total`): hash.
pub(crate) const READER_DATA: &str = ":rd";
/// Waiters' queue (fair and non-fair): sorted set owner → arrival (server µs).
pub(crate) const QUEUE: &str = ":q";
/// Queue liveness: sorted set owner → liveness deadline (server ms).
pub(crate) const QUEUE_ALIVE: &str = ":ql";
/// Queued waiters' modes, notice channels and holder values: hash owner → "x" | "s" |
/// "p", followed by the channel of the waiter's backend (empty when it polls), a
/// newline and the holder value a release hands the lock over with (writers only).
pub(crate) const QUEUE_MODE: &str = ":qm";

/// Observers of an election (change feeds): sorted set "<observer id> <notice
/// channel>" → liveness deadline (server ms); expires when no observer refreshes it.
pub(crate) const OBSERVERS: &str = ":o";
/// Redlock's waiters (sorted set by liveness deadline): shown by `inspect`, never
/// served from (Redlock does not queue).
pub(crate) const REDLOCK_WAITERS: &str = ":w";

/// The general scripts' keys, in order (KEYS[1..8]).
pub(crate) const ALL: [&str; 8] = [
    EXCLUSIVE,
    READERS,
    READER_DATA,
    FENCE,
    QUEUE,
    QUEUE_ALIVE,
    QUEUE_MODE,
    OBSERVERS,
];
/// The lean permits-acquire script's keys: the general scripts' first five.
pub(crate) const LEAN_KEYS: [&str; 5] = [EXCLUSIVE, READERS, READER_DATA, FENCE, QUEUE];
/// The non-fair exclusive acquire script's keys.
pub(crate) const ACQUIRE_EXCLUSIVE_KEYS: [&str; 5] =
    [EXCLUSIVE, FENCE, QUEUE, QUEUE_ALIVE, QUEUE_MODE];
/// The exclusive-release script's keys (the fence for a hand-over's token).
pub(crate) const RELEASE_EXCLUSIVE_KEYS: [&str; 8] = [
    EXCLUSIVE,
    QUEUE,
    QUEUE_ALIVE,
    QUEUE_MODE,
    OBSERVERS,
    READERS,
    READER_DATA,
    FENCE,
];
/// The exclusive-renewal script's keys.
pub(crate) const RENEW_EXCLUSIVE_KEYS: [&str; 4] = [EXCLUSIVE, OBSERVERS, READERS, READER_DATA];

/// The keys of one lock: `<prefix>{<encoded name>}` plus a suffix each.
#[derive(Debug, Clone)]
pub(crate) struct LockKeys {
    base: String,
}

/// One key (or the channel), written into a command without an intermediate string.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Key<'a> {
    base: &'a str,
    suffix: &'static str,
}

impl ToRedisArgs for Key<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut w = out.bufmut_for_next_arg(self.base.len() + self.suffix.len());
        w.put_slice(self.base.as_bytes());
        w.put_slice(self.suffix.as_bytes());
    }
}

impl std::fmt::Display for Key<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.base)?;
        f.write_str(self.suffix)
    }
}

impl Key<'_> {
    /// The key as a string (for release-notice addresses).
    pub(crate) fn to_string_lossy(self) -> String {
        let mut s = String::with_capacity(self.base.len() + self.suffix.len());
        s.push_str(self.base);
        s.push_str(self.suffix);
        s
    }
}

pub(crate) fn encode_into(out: &mut String, name: &str) {
    // (A byte scan: the three are ASCII, and a char-set `contains` cost more than
    // the rest of the key building.)
    if !name.bytes().any(|b| matches!(b, b'%' | b'{' | b'}')) {
        out.push_str(name);
        return;
    }
    for c in name.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
}

impl LockKeys {
    pub(crate) fn new(prefix: &str, name: &LockName) -> Self {
        let mut base = String::with_capacity(prefix.len() + name.len() + 2);
        base.push_str(prefix);
        base.push('{');
        encode_into(&mut base, name.as_str());
        base.push('}');
        LockKeys { base }
    }

    /// A call of `script` with these keys (by suffix) declared, in order.
    pub(crate) fn invocation<'s>(
        &self,
        script: &'s redis::Script,
        suffixes: &[&'static str],
    ) -> ScriptCall<'s> {
        // Sized for the largest call (8 keys, 10 arguments) so it never regrows.
        let mut cmd = redis::Cmd::with_capacity(22, 512);
        cmd.arg("EVALSHA")
            .arg(script.get_hash())
            .arg(suffixes.len());
        for s in suffixes {
            cmd.arg(self.key(s));
        }
        ScriptCall { script, cmd }
    }

    pub(crate) fn key(&self, suffix: &'static str) -> Key<'_> {
        Key {
            base: &self.base,
            suffix,
        }
    }
}

/// An `EVALSHA` command being built: keys and arguments go straight into the
/// command's buffer (redis' own `ScriptInvocation` collects each in a vector of its
/// own first and copies them over).
pub(crate) struct ScriptCall<'s> {
    pub(crate) script: &'s redis::Script,
    pub(crate) cmd: redis::Cmd,
}

impl ScriptCall<'_> {
    /// Appends an `ARGV` argument.
    pub(crate) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        self.cmd.arg(arg);
        self
    }
}

/// The owner part of an exclusive holder value, `<owner length>|<owner>`: a prefix
/// no other owner's value has, whatever the owner strings are.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OwnerPart<'a>(pub(crate) &'a str);

impl OwnerPart<'_> {
    /// Its length in bytes as written.
    fn len(self) -> usize {
        Decimal::of(self.0.len()).digits().len() + 1 + self.0.len()
    }

    fn write(self, w: &mut impl BufMut) {
        // `<length>|<owner>`, the length written by hand (the formatting machinery
        // cost a third of the backend's own work per cycle, issue 51).
        w.put_slice(Decimal::of(self.0.len()).digits());
        w.put_slice(b"|");
        w.put_slice(self.0.as_bytes());
    }
}

/// A number's decimal digits, on the stack.
struct Decimal {
    buf: [u8; 20],
    start: usize,
}

impl Decimal {
    fn of(mut n: usize) -> Self {
        let mut buf = [0u8; 20];
        let mut start = buf.len();
        loop {
            start -= 1;
            buf[start] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                return Decimal { buf, start };
            }
        }
    }

    fn digits(&self) -> &[u8] {
        &self.buf[self.start..]
    }
}

impl ToRedisArgs for OwnerPart<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        self.write(&mut out.bufmut_for_next_arg(self.len()));
    }
}

/// An exclusive holder value: the owner part, then the owner's context.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HolderValue<'a>(pub(crate) OwnerPart<'a>, pub(crate) &'a [u8]);

impl ToRedisArgs for HolderValue<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut w = out.bufmut_for_next_arg(self.0.len() + self.1.len());
        self.0.write(&mut w);
        w.put_slice(self.1);
    }
}

/// A glob pattern matching the keys of every name that starts with `name_prefix`
/// (for counting live locks).
pub(crate) fn scan_pattern(prefix: &str, name_prefix: &str) -> String {
    let mut raw = String::new();
    raw.push_str(prefix);
    raw.push('{');
    encode_into(&mut raw, name_prefix);
    let mut glob = String::new();
    for c in raw.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            glob.push('\\');
        }
        glob.push(c);
    }
    glob.push('*');
    glob
}

/// A duration in whole milliseconds for a command (at least 1: a `PX` of 0 is an
/// error, and a lease is never shorter).
pub(crate) fn ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(k: Key<'_>) -> String {
        k.to_string_lossy()
    }

    #[test]
    fn braces_cannot_break_the_hash_tag() {
        let k = LockKeys::new("dlock:", &LockName::new("}x{").unwrap());
        assert_eq!(text(k.key(EXCLUSIVE)), "dlock:{%7Dx%7B}:x");
        let a = LockKeys::new("p:", &LockName::new("%7D").unwrap());
        let b = LockKeys::new("p:", &LockName::new("}").unwrap());
        assert_ne!(text(a.key(EXCLUSIVE)), text(b.key(EXCLUSIVE)));
    }

    #[test]
    fn keys_are_written_as_single_arguments() {
        let k = LockKeys::new("d:", &LockName::new("n").unwrap());
        assert_eq!(k.key(FENCE).to_redis_args(), vec![b"d:{n}:f".to_vec()]);
    }

    #[test]
    fn holder_values_start_with_the_owner_part() {
        let lengths = [9, 10, 99, 100, 123, 1000, 10_000];
        let long: Vec<String> = lengths.iter().map(|&n| "x".repeat(n)).collect();
        for owner in ["", "a", "owner-1234567890"]
            .into_iter()
            .chain(long.iter().map(String::as_str))
        {
            let part = OwnerPart(owner);
            let bytes = part.to_redis_args().concat();
            assert_eq!(bytes, format!("{}|{owner}", owner.len()).into_bytes());
            assert_eq!(part.len(), bytes.len());
            let value = HolderValue(part, b"ctx").to_redis_args().concat();
            assert!(value.starts_with(&bytes) && value.ends_with(b"ctx"));
        }
        // "ab" is a prefix of "abc", but their owner parts are not prefixes of each other.
        let (ab, abc) = (
            OwnerPart("ab").to_redis_args(),
            OwnerPart("abc").to_redis_args(),
        );
        assert!(!abc[0].starts_with(&ab[0]) && !ab[0].starts_with(&abc[0]));
    }

    #[test]
    fn scan_patterns_escape_glob_characters() {
        assert_eq!(scan_pattern("d:", "a*[b]"), "d:{a\\*\\[b\\]*");
    }
}
