//! SQLite: release notices between the processes of one host that share a
//! database file — what `LISTEN/NOTIFY` carries on PostgreSQL. Without them a
//! waiter learns of a release only when its next poll comes round (8 processes
//! handing one lock over did 23 cycles a second, their median wait 430 ms).
//!
//! How it goes:
//!
//! * Every backend on a database file binds a Unix datagram socket of its own in
//!   one directory beside the file (`<file>-dlock-wake/`; in the temp directory,
//!   named by a hash of the file's path, when that path is too long for a socket
//!   address), and wakes its own waiters on what arrives
//!   ([`crate::backend::Wakeups::wake`]).
//! * A release that leaves a waiter behind (and a waiter first in line that
//!   leaves a free lock, a force-release) sends a notice — the payload
//!   PostgreSQL's would carry: the lock's name and the writer first in its queue —
//!   to every socket in the directory, its own included. The backend whose waiter
//!   the notice names wakes that waiter alone; a notice that names no writer wakes
//!   one local waiter of the lock in each backend. So a hand-over wakes one
//!   waiter, not the herd.
//! * The notice is sent after the release committed: the waiter it wakes finds the
//!   row free.
//!
//! A notice only decides *when* a waiter looks at the lock again; its row decides
//! the grant. A notice lost (a receiver's queue full, a socket not yet bound), late,
//! or forged (anyone who may write to the directory can send one) costs waiting
//! time, never safety: a told waiter still looks on its own at the backoff's
//! longest delay. A socket whose process died without removing it is removed by
//! the next sender (the kernel refuses datagrams to it). Processes that cannot
//! reach the directory — on another host (a database file on a network share,
//! which SQLite itself warns against), or without the right to write there —
//! neither send nor receive notices: waiters among them poll with their backoff
//! alone, as before.

use std::io;
use std::os::unix::net::UnixDatagram as StdDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixDatagram;
use tokio::task::JoinHandle;

use crate::backend::{ReleaseNotice, Wakeups};

/// The longest socket path a Unix socket address takes on every Unix (`sun_path`
/// is 104 bytes on the BSDs and macOS, 108 on Linux, with its terminating NUL).
const MAX_SOCKET_PATH: usize = 103;

/// A notice's first byte: a release notice (the only kind so far).
const RELEASE: u8 = b'r';

/// The largest notice: a name of [`crate::MAX_NAME_LEN`] bytes, a waiter key, the
/// table prefix and framing fit well within it.
const MAX_NOTICE: usize = 8 * 1024;

/// Tells apart the sockets of several backends of one process.
static NEXT_SOCKET: AtomicU64 = AtomicU64::new(0);

/// The sending side of one backend's notices.
pub(crate) struct LocalBus {
    /// Where the sockets of every backend on the database file are.
    dir: PathBuf,
    /// The backend's table prefix, which every notice carries: backends with other
    /// tables in the same file ignore it.
    prefix: String,
    /// An unbound socket, for sending.
    sender: StdDatagram,
}

impl LocalBus {
    /// The bus of the database file `file` (as the pool opens it) for tables named
    /// with `prefix`, and the task receiving notices for `wakeups` (it removes its
    /// socket when it ends, or is aborted). `None` for the task when this backend
    /// cannot receive (it still sends); an error when it can do neither.
    pub(crate) fn open(
        file: &Path,
        prefix: &str,
        wakeups: Arc<Wakeups>,
    ) -> io::Result<(LocalBus, Option<JoinHandle<()>>)> {
        let dir = socket_dir(&file.canonicalize()?);
        match std::fs::create_dir(&dir) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
        let sender = StdDatagram::unbound()?;
        sender.set_nonblocking(true)?;
        let bus = LocalBus {
            dir,
            prefix: prefix.to_owned(),
            sender,
        };
        let task = match bus.bind() {
            Ok((socket, path)) => Some(tokio::spawn(receive(
                socket,
                Unlink(path),
                bus.prefix.clone(),
                wakeups,
            ))),
            Err(e) => {
                tracing::debug!(error = %e, dir = %bus.dir.display(), "dlock-jdbc: no release notices reach this backend; its waiters poll");
                None
            }
        };
        Ok((bus, task))
    }

    /// Binds this backend's own socket in the directory: `<pid>-<n>.sock`. A file
    /// of that name left by a process that had this pid before is replaced.
    fn bind(&self) -> io::Result<(UnixDatagram, PathBuf)> {
        let n = NEXT_SOCKET.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.join(format!("{}-{n}.sock", std::process::id()));
        let socket = match UnixDatagram::bind(&path) {
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                std::fs::remove_file(&path)?;
                UnixDatagram::bind(&path)?
            }
            other => other?,
        };
        Ok((socket, path))
    }

    /// Sends the release notice `payload` to every backend on the database file,
    /// this one included (best effort: a receiver that cannot take it polls).
    pub(crate) fn send(&self, payload: &str) {
        let mut notice = Vec::with_capacity(2 + self.prefix.len() + payload.len());
        notice.push(RELEASE);
        notice.extend_from_slice(self.prefix.as_bytes());
        notice.push(0);
        notice.extend_from_slice(payload.as_bytes());
        if notice.len() > MAX_NOTICE {
            return;
        }
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|e| e != "sock") {
                continue;
            }
            match self.sender.send_to(&notice, &path) {
                // Nobody bound to it: its process ended without removing it.
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    let _ = std::fs::remove_file(&path);
                }
                // Sent; or the receiver's queue is full, or it just went: that
                // backend's waiters poll.
                _ => {}
            }
        }
    }
}

/// The directory of the sockets for the database file at the canonical path `db`:
/// beside it, or where that is too long for a socket address, in the temp
/// directory under a name hashed from the path (FNV-1a: every build computes it
/// alike).
fn socket_dir(db: &Path) -> PathBuf {
    let mut beside = db.as_os_str().to_owned();
    beside.push("-dlock-wake");
    let beside = PathBuf::from(beside);
    // `<pid>-<n>.sock`: at most 10 + 1 + 20 + 5 bytes, and the separator.
    if beside.as_os_str().len() + 37 <= MAX_SOCKET_PATH {
        return beside;
    }
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in db.as_os_str().as_encoded_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    std::env::temp_dir().join(format!("dlock-wake-{hash:016x}"))
}

/// Removes a socket's file when dropped (the receiving task ends or is aborted).
struct Unlink(PathBuf);

impl Drop for Unlink {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Receives notices on `socket` until aborted, waking the waiters of `wakeups`
/// that the notices for tables `prefix` name.
async fn receive(socket: UnixDatagram, unlink: Unlink, prefix: String, wakeups: Arc<Wakeups>) {
    let _unlink = unlink;
    let mut buf = vec![0u8; MAX_NOTICE];
    loop {
        match socket.recv(&mut buf).await {
            Ok(n) => {
                if let Some(payload) = buf.get(..n).and_then(|b| parse(b, &prefix)) {
                    wakeups.wake(&ReleaseNotice::parse(payload));
                }
            }
            Err(e) => {
                // Not expected of a bound datagram socket; waiters poll meanwhile.
                tracing::debug!(error = %e, "dlock-jdbc: receiving release notices failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// The payload of a release notice for tables `prefix`; `None` for anything else.
fn parse<'a>(notice: &'a [u8], prefix: &str) -> Option<&'a str> {
    let rest = notice.strip_prefix(&[RELEASE])?;
    let rest = rest.strip_prefix(prefix.as_bytes())?;
    let payload = rest.strip_prefix(&[0])?;
    std::str::from_utf8(payload).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notice_is_read_only_by_backends_of_its_tables() {
        let mut notice = vec![RELEASE];
        notice.extend_from_slice(b"dlock_\x005:orderxk#1");
        assert_eq!(parse(&notice, "dlock_"), Some("5:orderxk#1"));
        assert_eq!(parse(&notice, "other_"), None);
        assert_eq!(parse(&notice, "dlock"), None);
        assert_eq!(parse(b"x", "dlock_"), None);
        assert_eq!(parse(b"", ""), None);
    }

    #[test]
    fn the_directory_is_beside_the_file_unless_the_path_is_too_long() {
        let short = socket_dir(Path::new("/srv/app/locks.db"));
        assert_eq!(short, PathBuf::from("/srv/app/locks.db-dlock-wake"));
        let long = format!("/srv/{}/locks.db", "d".repeat(80));
        let hashed = socket_dir(Path::new(&long));
        assert!(hashed.starts_with(std::env::temp_dir()), "{hashed:?}");
        assert_eq!(hashed, socket_dir(Path::new(&long)));
        assert_ne!(hashed, socket_dir(Path::new(&format!("{long}2"))));
    }
}
