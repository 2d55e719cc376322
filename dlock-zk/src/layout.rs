//! Where a lock lives in the ZooKeeper tree, and how its contender nodes are named.
//!
//! The layout is Apache Curator's, so Curator recipes on the same path see dlock's
//! nodes as contenders and the other way round:
//!
//! ```text
//! <root>/<escaped lock name>/_c_<protection id>-lock-0000000042      exclusive (InterProcessMutex)
//! <root>/<escaped lock name>/_c_<protection id>-__WRIT__0000000043   exclusive (read-write lock's writer)
//! <root>/<escaped lock name>/_c_<protection id>-__READ__0000000044   shared (read-write lock's reader)
//! <root>/<escaped election>/_c_<protection id>-latch-0000000045      leadership (LeaderLatch)
//! ```
//!
//! A read-write lock's writer may also take the read side (dlock's cross-mode
//! holds, which Curator does not make across processes):
//!
//! ```text
//! …/_c_<id of the write>-__WRIT__0000000050     a writer ...
//! …/_c_<id of its read>-__READ__0000000050      ... and its read, placed (not
//!                                               sequential) at the write's sequence
//! ```
//!
//! The placed read node sorts ahead of every writer queued behind the write (it
//! takes the write's sequence), so when the write goes — a downgrade — no writer,
//! Curator's or dlock's, gets in while the read lasts. It is placed only while the
//! write node is there (else it queues at the back, as any read), and carries the
//! write's token.
//!
//! An upgradeable read is two holds: an exclusive lock on the name with
//! `::upgradeable` appended (one upgradeable reader at a time) and a read node of
//! the lock. Its upgrade is a write node named after a reader's key, so that it
//! sorts right behind that reader (Curator compares these digits as strings):
//!
//! ```text
//! <root>/<escaped name>::upgradeable/_c_<id>-lock-0000000003   the upgradeable hold
//! …/_c_<id of its read>-__READ__0000000042                     its read
//! …/_c_<id>-__READ__0000000044                                 a reader beside it
//! …/_c_<id of the upgrade>-__WRIT__00000000440000000047        the upgrade: the last
//!                                                               reader's key, then
//!                                                               its own sequence
//! …/_c_<id>-__WRIT__0000000045                                 a writer queued before
//!                                                               the upgrade: still out
//! ```
//!
//! (The `upgrade` module tells how the place is chosen and why it is safe.)
//!
//! The lock's node is a container (the server removes it once it is empty); the
//! contender nodes are ephemeral and sequential. The protection id is derived from the
//! owner, so an owner finds its node again after a connection loss (no orphans) and a
//! retried acquire does not queue twice.

use std::fmt::Write as _;

use dlock_spi::{Error, ErrorKind, HoldPurpose, HolderKey, LockMode, LockName, Result};

/// Curator's prefix for "protected" nodes: `_c_<uuid>-`.
const PROTECTED_PREFIX: &str = "_c_";
/// `InterProcessMutex`'s lock name.
pub(crate) const MUTEX_MARKER: &str = "lock-";
/// `InterProcessReadWriteLock`'s write-lock name.
pub(crate) const WRITE_MARKER: &str = "__WRIT__";
/// `InterProcessReadWriteLock`'s read-lock name.
pub(crate) const READ_MARKER: &str = "__READ__";
/// `LeaderLatch`'s participant name: leadership terms.
pub(crate) const LATCH_MARKER: &str = "latch-";
/// The digits ZooKeeper appends to a sequential node's name.
pub(crate) const SEQUENCE_DIGITS: usize = 10;

/// Which Curator recipe dlock's exclusive holds look like to Curator clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ExclusiveNode {
    /// `…-lock-<seq>`, as Curator's `InterProcessMutex` (default).
    #[default]
    Mutex,
    /// `…-__WRIT__<seq>`, as the writer of Curator's `InterProcessReadWriteLock`; use it
    /// when Java services take the same locks with the read-write recipe.
    ReadWrite,
}

/// Checks a root path (`/dlock`, `/apps/x/locks`): absolute, no empty, `.` or `..`
/// segment, no trailing slash, no control characters.
pub(crate) fn validate_root(root: &str) -> Result<()> {
    let bad = |why: &str| {
        Err(Error::new(
            ErrorKind::Config,
            format!(
                "ZooKeeper root path {root:?} {why}; write it like /dlock or /apps/orders/locks"
            ),
        ))
    };
    if !root.starts_with('/') || root.len() < 2 {
        return bad("must be absolute and not `/` itself");
    }
    if root[1..]
        .split('/')
        .any(|seg| seg.is_empty() || seg == "." || seg == "..")
    {
        return bad("has an empty, `.` or `..` segment (or a trailing slash)");
    }
    if root
        .chars()
        .any(|c| c != '/' && c != '%' && needs_escape(c))
    {
        return bad("contains characters ZooKeeper does not allow in paths");
    }
    if root == "/zookeeper" || root.starts_with("/zookeeper/") {
        return bad("is inside ZooKeeper's own /zookeeper tree");
    }
    Ok(())
}

/// Characters ZooKeeper refuses in a path segment (besides `/`), per its
/// `PathUtils.validatePath`, plus `%`, our escape character. ZooKeeper checks UTF-16
/// units and refuses surrogates, so every character beyond U+FFFF is escaped too.
fn needs_escape(c: char) -> bool {
    matches!(c,
        '/' | '%'
        | '\u{0}'..='\u{1f}'
        | '\u{7f}'..='\u{9f}'
        | '\u{e000}'..='\u{f8ff}'
        | '\u{fff0}'..='\u{10ffff}')
}

/// The lock's node: `<root>/<escaped name>`. `/` and `%` are percent-encoded, so a
/// name is always exactly one segment under the root; `.`, `..` and `zookeeper`
/// (names ZooKeeper reserves) are encoded too. Distinct names give distinct paths.
pub(crate) fn lock_path(root: &str, name: &LockName) -> String {
    let name = name.as_str();
    let mut path = String::with_capacity(root.len() + 1 + name.len());
    path.push_str(root);
    path.push('/');
    match name {
        "." => path.push_str("%2E"),
        ".." => path.push_str("%2E%2E"),
        "zookeeper" => path.push_str("%7Aookeeper"),
        _ => {
            for c in name.chars() {
                if needs_escape(c) {
                    let mut buf = [0u8; 4];
                    for b in c.encode_utf8(&mut buf).bytes() {
                        let _ = write!(path, "%{b:02X}");
                    }
                } else {
                    path.push(c);
                }
            }
        }
    }
    path
}

/// The inverse of the segment encoding of [`lock_path`]; `None` for segments dlock
/// did not write.
pub(crate) fn decode_segment(segment: &str) -> Option<String> {
    dlock_spi::percent_decode(segment)
}

/// The protection id of a grant's node: a name-based UUID of the grant's
/// [`HolderKey`], so the grant recognises its node among the children after a
/// connection loss, and no other grant — not even one of the same owner — has it.
pub(crate) fn protection_id(holder: &HolderKey) -> String {
    const NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x6a1f_3c52_9d0e_4b7a_8c21_5e4f_d10c_b3a9);
    uuid::Uuid::new_v5(&NAMESPACE, holder.as_str().as_bytes())
        .hyphenated()
        .to_string()
}

/// The prefix of a grant's contender node in `mode` for `purpose` (before
/// ZooKeeper's sequence).
pub(crate) fn node_prefix(
    holder: &HolderKey,
    mode: LockMode,
    exclusive: ExclusiveNode,
    purpose: HoldPurpose,
) -> String {
    let marker = match (mode, purpose, exclusive) {
        (LockMode::Shared, _, _) => READ_MARKER,
        (LockMode::Exclusive, HoldPurpose::Leadership, _) => LATCH_MARKER,
        // (Permits are refused before a node is made.)
        (LockMode::Exclusive | LockMode::Permits(_), _, ExclusiveNode::Mutex) => MUTEX_MARKER,
        (LockMode::Exclusive | LockMode::Permits(_), _, ExclusiveNode::ReadWrite) => WRITE_MARKER,
    };
    format!("{}{marker}", protected_prefix(holder))
}

/// The start of every node of a grant, whatever its marker: `_c_<protection id>-`.
pub(crate) fn protected_prefix(holder: &HolderKey) -> String {
    format!("{PROTECTED_PREFIX}{}-", protection_id(holder))
}

/// One contender node among a lock's children.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Contender {
    /// The child's name (not the full path).
    pub(crate) node: String,
    /// The digits after the marker, compared as strings (as Curator sorts): the
    /// queue order. Ten digits (ZooKeeper's sequence) for a plain contender; an
    /// upgrade's write node has its anchor's digits followed by its own sequence.
    pub(crate) key: String,
    /// Shared (`__READ__`) or exclusive (anything else: `lock-`, `__WRIT__`, `latch-`).
    pub(crate) mode: LockMode,
}

impl Contender {
    /// Parses a child name; `None` when it does not end in a sequence number after
    /// one of the known markers (not a lock contender).
    pub(crate) fn parse(node: &str) -> Option<Contender> {
        let (at, marker) = [READ_MARKER, WRITE_MARKER, MUTEX_MARKER, LATCH_MARKER]
            .into_iter()
            .filter_map(|m| node.rfind(m).map(|at| (at, m)))
            .max_by_key(|(at, _)| *at)?;
        let digits = &node[at + marker.len()..];
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let mode = if marker == READ_MARKER {
            LockMode::Shared
        } else {
            LockMode::Exclusive
        };
        Some(Contender {
            node: node.to_owned(),
            key: digits.to_owned(),
            mode,
        })
    }

    /// ZooKeeper's sequence number of the node's creation: its last ten digits (the
    /// whole key for a plain contender). For a node dlock placed at another node's
    /// key (a writer's read), that node's.
    pub(crate) fn created(&self) -> i64 {
        let tail = self.key.len().saturating_sub(SEQUENCE_DIGITS);
        self.key[tail..].parse().unwrap_or(i64::MAX)
    }

    /// Whether this is an upgrade's write node: its key is another node's key with
    /// its own sequence after it.
    pub(crate) fn is_anchored(&self) -> bool {
        self.key.len() > SEQUENCE_DIGITS
    }
}

/// A lock's contenders in queue order: by key, compared as strings, as Curator's
/// `InterProcessReadWriteLock` sorts them (so a key that extends another sorts
/// right after it).
pub(crate) fn contenders(children: &[String]) -> Vec<Contender> {
    let mut all: Vec<Contender> = children
        .iter()
        .filter_map(|c| Contender::parse(c))
        .collect();
    all.sort_by(|a, b| a.key.cmp(&b.key));
    all
}

/// Whether the contender at `index` holds the lock, and if not, which node to watch
/// (Curator's rules): an exclusive contender holds when it is first and watches the
/// one just before it; a shared contender holds when no exclusive contender is ahead
/// of it and watches the first exclusive one.
///
/// A shared contender `beside` its owner's own write node (a writer reading, placed
/// at that node's sequence) is never blocked by that node: it holds when no *other*
/// exclusive contender is ahead — while that node is in the queue (gone, the plain
/// rules apply). A write beside its owner's read (an upgrade) is judged by the
/// `upgrade` module, not here.
pub(crate) fn standing<'q>(
    queue: &'q [Contender],
    index: usize,
    beside: Option<&str>,
) -> Result<Option<&'q Contender>, ()> {
    let me = queue.get(index).ok_or(())?;
    let beside = beside
        .filter(|_| me.mode == LockMode::Shared)
        .filter(|own| queue.iter().any(|c| c.node == *own));
    Ok(match (me.mode, beside) {
        (LockMode::Exclusive | LockMode::Permits(_), _) => {
            index.checked_sub(1).and_then(|i| queue.get(i))
        }
        (LockMode::Shared, None) => queue[..index]
            .iter()
            .find(|c| c.mode == LockMode::Exclusive),
        (LockMode::Shared, Some(own)) => queue[..index]
            .iter()
            .find(|c| c.node != own && c.mode == LockMode::Exclusive),
    })
}

/// The holders among `queue`: the first contender if exclusive (with its owner's
/// read node placed at the same key, if any), else the shared contenders before the
/// first exclusive one — and that one too when it is an upgrade standing right
/// behind its owner's read, the only reader left ahead of it (the upgrade holds
/// then; see the `upgrade` module).
pub(crate) fn holders(queue: &[Contender]) -> &[Contender] {
    let Some(first) = queue.first() else {
        return &[];
    };
    let with_key =
        |from: usize, key: &str| queue[from..].iter().take_while(|c| c.key == key).count();
    let front = with_key(0, &first.key);
    if queue[..front].iter().any(|c| c.mode == LockMode::Exclusive) {
        return &queue[..front];
    }
    let end = queue
        .iter()
        .position(|c| c.mode == LockMode::Exclusive)
        .unwrap_or(queue.len());
    match queue.get(end) {
        Some(upgrade) if end == 1 && upgrade.is_anchored() => {
            &queue[..end + with_key(end, &upgrade.key)]
        }
        _ => &queue[..end],
    }
}

/// Curator's semaphore (`InterProcessSemaphoreV2`) layout: its mutex node, below the
/// semaphore's node.
pub(crate) const LOCKS: &str = "locks";
/// The recipe's lease nodes' parent, below the semaphore's node.
pub(crate) const LEASES: &str = "leases";
/// `InterProcessSemaphoreV2`'s lease name.
pub(crate) const LEASE_MARKER: &str = "lease-";

/// The parent of a semaphore's lease nodes.
pub(crate) fn leases_dir(lock: &str) -> String {
    format!("{lock}/{LEASES}")
}

/// The parent of a semaphore's mutex nodes.
pub(crate) fn locks_dir(lock: &str) -> String {
    format!("{lock}/{LOCKS}")
}

/// Whether a lock node's children are a semaphore's (`locks`, `leases`).
pub(crate) fn is_semaphore(children: &[String]) -> bool {
    children.iter().any(|c| c == LOCKS || c == LEASES)
}

/// A lease node's sequence number (`…lease-<digits>`).
pub(crate) fn lease_sequence(node: &str) -> Option<i64> {
    let at = node.rfind(LEASE_MARKER)?;
    node[at + LEASE_MARKER.len()..].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_spi::GrantId;

    /// The sequence of the node the contender at `index` waits for (`standing`).
    fn ahead(queue: &[Contender], index: usize, beside: Option<&str>) -> Result<Option<i64>, ()> {
        standing(queue, index, beside).map(|w| w.map(Contender::created))
    }

    fn name(s: &str) -> LockName {
        LockName::new(s).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn names_stay_one_segment_under_the_root() {
        assert_eq!(lock_path("/dlock", &name("orders:42")), "/dlock/orders:42");
        assert_eq!(lock_path("/dlock", &name("a/b")), "/dlock/a%2Fb");
        assert_eq!(lock_path("/dlock", &name("../x")), "/dlock/..%2Fx");
        assert_eq!(lock_path("/dlock", &name("..")), "/dlock/%2E%2E");
        assert_eq!(lock_path("/dlock", &name(".")), "/dlock/%2E");
        assert_eq!(
            lock_path("/dlock", &name("zookeeper")),
            "/dlock/%7Aookeeper"
        );
        assert_eq!(lock_path("/dlock", &name("100%")), "/dlock/100%25");
        assert_eq!(lock_path("/dlock", &name("a%2Fb")), "/dlock/a%252Fb");
        assert_ne!(
            lock_path("/r", &name("a/b")),
            lock_path("/r", &name("a%2Fb"))
        );
        assert_eq!(lock_path("/r", &name("\u{e000}")), "/r/%EE%80%80");
        assert_eq!(lock_path("/r", &name("\u{1f512}")), "/r/%F0%9F%94%92");
        for n in ["a/b", "..", "100%", "zookeeper", "é/ü", "\u{e000}x"] {
            let path = lock_path("/r", &name(n));
            let segment = &path[3..];
            assert!(!segment.contains('/'));
            let decoded = decode_segment(segment);
            if n == "zookeeper" || n == ".." {
                assert!(decoded.is_some());
            } else {
                assert_eq!(decoded.as_deref(), Some(n));
            }
        }
    }

    #[test]
    fn roots_are_checked() {
        for ok in ["/dlock", "/a/b/c", "/dlock-test"] {
            assert!(validate_root(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "/",
            "dlock",
            "/a//b",
            "/a/",
            "/a/../b",
            "/zookeeper",
            "/zookeeper/x",
            "/a\u{1}",
        ] {
            let err = validate_root(bad).err().map(|e| e.kind());
            assert_eq!(err, Some(ErrorKind::Config), "{bad:?}");
        }
    }

    #[test]
    fn contenders_parse_curator_and_dlock_nodes() {
        let holder = HolderKey::new(&dlock_spi::OwnerId::new("m:1"), GrantId::new(1));
        let prefix = node_prefix(
            &holder,
            LockMode::Exclusive,
            ExclusiveNode::Mutex,
            HoldPurpose::Lock,
        );
        assert!(
            prefix.starts_with("_c_") && prefix.ends_with("-lock-") && prefix.len() == 3 + 36 + 6
        );
        assert_eq!(
            prefix,
            node_prefix(
                &holder,
                LockMode::Exclusive,
                ExclusiveNode::Mutex,
                HoldPurpose::Lock
            )
        );
        assert_ne!(
            prefix,
            node_prefix(
                &HolderKey::new(&dlock_spi::OwnerId::new("m:1"), GrantId::new(2)),
                LockMode::Exclusive,
                ExclusiveNode::Mutex,
                HoldPurpose::Lock
            )
        );
        let children: Vec<String> = [
            "_c_0b2e-__READ__0000000007",
            "_c_1234-lock-0000000003",
            "junk",
            "_c_9-__WRIT__0000000005",
            "x-lock-",
            "_c_5-latch-0000000009",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let q = contenders(&children);
        let seqs: Vec<i64> = q.iter().map(|c| c.created()).collect();
        assert_eq!(seqs, [3, 5, 7, 9]);
        assert_eq!(q[3].mode, LockMode::Exclusive);
        assert!(node_prefix(
            &holder,
            LockMode::Exclusive,
            ExclusiveNode::Mutex,
            HoldPurpose::Leadership
        )
        .ends_with("-latch-"));
        assert_eq!(q[2].mode, LockMode::Shared);
        assert_eq!(holders(&q).len(), 1);
        assert_eq!(standing(&q, 0, None), Ok(None));
        assert_eq!(ahead(&q, 1, None), Ok(Some(3)));
        assert_eq!(ahead(&q, 2, None), Ok(Some(3)));
        assert!(standing(&q, 9, None).is_err());
    }

    #[test]
    fn readers_before_the_first_writer_hold_together() {
        let children: Vec<String> = [
            "r-__READ__01",
            "r-__READ__02",
            "w-__WRIT__03",
            "r-__READ__04",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let q = contenders(&children);
        assert_eq!(holders(&q).len(), 2);
        assert_eq!(standing(&q, 1, None), Ok(None));
        assert_eq!(ahead(&q, 2, None), Ok(Some(2)));
        assert_eq!(ahead(&q, 3, None), Ok(Some(3)));
    }

    #[test]
    fn a_writers_read_stands_beside_its_write_node() {
        let q =
            |names: &[&str]| contenders(&names.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        // A writer's read, placed at its write node's sequence: held at once, and
        // shown with the write as the holders; a writer queued behind stays out.
        let placed = q(&["w-__WRIT__05", "r-__READ__05", "x-__WRIT__07"]);
        let read = placed
            .iter()
            .position(|c| c.node == "r-__READ__05")
            .unwrap_or(9);
        assert_eq!(standing(&placed, read, Some("w-__WRIT__05")), Ok(None));
        assert_eq!(holders(&placed).len(), 2);
        // Downgraded (the write gone): the queued writer still waits for the read.
        let downgraded = q(&["r-__READ__05", "x-__WRIT__07"]);
        assert_eq!(holders(&downgraded).len(), 1);
        assert_eq!(ahead(&downgraded, 1, None), Ok(Some(5)));
        // Beside a node that is not there, the plain rules: another writer ahead
        // keeps it out.
        let gone = q(&["x-__WRIT__03", "r-__READ__04"]);
        assert_eq!(ahead(&gone, 1, Some("w-__WRIT__02")), Ok(Some(3)));
        // A write never stands beside anything.
        let write = q(&["r-__READ__01", "x-__WRIT__03", "u-__WRIT__06"]);
        assert_eq!(ahead(&write, 2, Some("r-__READ__01")), Ok(Some(3)));
    }
}
