//! SQLite: release notices between the processes of one host that share a
//! database file — what `LISTEN/NOTIFY` carries on PostgreSQL. Without them a
//! waiter learns of a release only when its next poll comes round (8 processes
//! handing one lock over did 23 cycles a second, their median wait 430 ms).
//!
//! How it goes:
//!
//! * Every backend on a database file binds a Unix datagram socket of its own,
//!   under a random name, in one directory beside the file (`<file>-dlock-wake/`),
//!   and a thread of its own wakes its waiters on what arrives
//!   ([`crate::wakeups::Wakeups::wake`]; a thread, not a task, so that a runtime
//!   without tokio's I/O driver, which SQLite never needed, still works). Where the
//!   file's path is too long for a socket address there is no bus: waiters poll.
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
//! the next sender (the kernel refuses datagrams to it); only sockets are ever
//! removed. Processes that cannot reach the directory — on another host (a
//! database file on a network share, which SQLite itself warns against), or
//! without the right to write there — neither send nor receive notices: waiters
//! among them poll with their backoff alone, as before; but their releases send
//! no notice either, so a told waiter elsewhere learns of them only at its own
//! next look (the backoff's longest delay, 250 ms by default). Turn notices off
//! in every process sharing a file, or in none.

use std::io;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::wakeups::{ReleaseNotice, Wakeups};

/// The longest socket path a Unix socket address takes on every Unix (`sun_path`
/// is 104 bytes on the BSDs and macOS, 108 on Linux, with its terminating NUL).
const MAX_SOCKET_PATH: usize = 103;

/// A notice's first byte: a release notice (the only kind so far).
const RELEASE: u8 = b'r';

/// The largest notice: a name of [`crate::MAX_NAME_LEN`] bytes, a waiter key, the
/// table prefix and framing fit well within it.
const MAX_NOTICE: usize = 8 * 1024;

/// How often the receiving thread looks whether its backend is gone, when
/// nothing arrives (its backend's drop also wakes it at once).
const RECEIVE_TIMEOUT: Duration = Duration::from_secs(1);

/// The sending side of one backend's notices.
pub(crate) struct LocalBus {
    /// Where the sockets of every backend on the database file are.
    dir: PathBuf,
    /// The backend's table prefix, which every notice carries: backends with other
    /// tables in the same file ignore it.
    prefix: String,
    /// An unbound socket, for sending.
    sender: UnixDatagram,
    /// This backend's own socket, while its receiving thread runs.
    own: Option<PathBuf>,
    /// Set when the backend is dropped: the receiving thread ends.
    stop: Arc<AtomicBool>,
}

impl Drop for LocalBus {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(own) = &self.own {
            // Wakes the receiving thread, which ends and removes its socket.
            let _ = self.sender.send_to(&[], own);
        }
    }
}

impl LocalBus {
    /// The bus of the database file `file` (as the pool opens it) for tables named
    /// with `prefix`, with a thread receiving notices for `wakeups` (it ends, and
    /// removes its socket, when the bus is dropped); whether that thread runs
    /// (`false`: this backend cannot receive, it still sends). An error when it can
    /// do neither.
    pub(crate) fn open(
        file: &Path,
        prefix: &str,
        wakeups: Arc<Wakeups>,
    ) -> io::Result<(LocalBus, bool)> {
        let dir = socket_dir(&file.canonicalize()?).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "the database file's path is too long for a socket address beside it",
            )
        })?;
        match std::fs::create_dir(&dir) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
        let sender = UnixDatagram::unbound()?;
        sender.set_nonblocking(true)?;
        let mut bus = LocalBus {
            dir,
            prefix: prefix.to_owned(),
            sender,
            own: None,
            stop: Arc::new(AtomicBool::new(false)),
        };
        match bus.bind() {
            Ok((socket, path)) => {
                let (prefix, stop, unlink) = (
                    bus.prefix.clone(),
                    Arc::clone(&bus.stop),
                    Unlink(path.clone()),
                );
                let spawned = std::thread::Builder::new()
                    .name("dlock-sqlite-notices".into())
                    .spawn(move || receive(&socket, unlink, &prefix, &stop, &wakeups));
                match spawned {
                    Ok(_) => bus.own = Some(path),
                    Err(e) => {
                        tracing::debug!(error = %e, "dlock-jdbc: no thread to receive release notices; this backend's waiters poll");
                    }
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, dir = %bus.dir.display(), "dlock-jdbc: no release notices reach this backend; its waiters poll");
            }
        }
        let receiving = bus.own.is_some();
        Ok((bus, receiving))
    }

    /// Binds this backend's own socket in the directory under a random name
    /// (`<pid>-<random>.sock`: process ids repeat across containers sharing the
    /// file), another one if that is taken — never replacing a file.
    fn bind(&self) -> io::Result<(UnixDatagram, PathBuf)> {
        let mut tries = 0;
        loop {
            let path = self.dir.join(format!(
                "{}-{:016x}.sock",
                std::process::id(),
                fastrand::u64(..)
            ));
            match UnixDatagram::bind(&path) {
                Err(e) if e.kind() == io::ErrorKind::AddrInUse && tries < 3 => tries += 1,
                Err(e) => return Err(e),
                Ok(socket) => {
                    socket.set_read_timeout(Some(RECEIVE_TIMEOUT))?;
                    return Ok((socket, path));
                }
            }
        }
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
            let socket = entry.file_type().is_ok_and(|t| t.is_socket());
            if !socket || path.extension().is_none_or(|e| e != "sock") {
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

/// The directory of the sockets for the database file at the canonical path `db`,
/// beside it; `None` when that path is too long for a socket address (no shared
/// place elsewhere is safe: another user could make it first).
fn socket_dir(db: &Path) -> Option<PathBuf> {
    let mut beside = db.as_os_str().to_owned();
    beside.push("-dlock-wake");
    let beside = PathBuf::from(beside);
    // `<pid>-<random>.sock`: at most 10 + 1 + 16 + 5 bytes, and the separator.
    (beside.as_os_str().len() + 33 <= MAX_SOCKET_PATH).then_some(beside)
}

/// Removes a socket's file when dropped (the receiving thread ends).
struct Unlink(PathBuf);

impl Drop for Unlink {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Receives notices on `socket` until `stop` is set, waking the waiters of
/// `wakeups` that the notices for tables `prefix` name.
fn receive(
    socket: &UnixDatagram,
    unlink: Unlink,
    prefix: &str,
    stop: &AtomicBool,
    wakeups: &Wakeups,
) {
    let _unlink = unlink;
    let mut buf = vec![0u8; MAX_NOTICE];
    while !stop.load(Ordering::Relaxed) {
        match socket.recv(&mut buf) {
            Ok(n) => {
                if let Some(payload) = buf.get(..n).and_then(|b| parse(b, prefix)) {
                    wakeups.wake(&ReleaseNotice::parse(payload));
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) => {
                // Not expected of a bound datagram socket; waiters poll meanwhile.
                tracing::debug!(error = %e, "dlock-jdbc: receiving release notices failed");
                std::thread::sleep(Duration::from_millis(100));
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

    /// A bus on a fresh database file in the temp directory, and that file.
    fn bus_beside_a_new_file(tag: &str) -> (LocalBus, PathBuf) {
        let file = std::env::temp_dir().join(format!("lb-{tag}-{:x}.db", fastrand::u32(..)));
        std::fs::write(&file, b"").unwrap();
        let (bus, receiving) = LocalBus::open(&file, "dlock_", Arc::default()).unwrap();
        assert!(receiving);
        (bus, file)
    }

    #[test]
    fn a_sender_removes_only_sockets_nobody_is_bound_to() {
        let (bus, file) = bus_beside_a_new_file("rm");
        // A file that is not a socket (anyone who may write to the directory can
        // put one there), and a socket whose process is gone.
        let plain = bus.dir.join("1-plain.sock");
        std::fs::write(&plain, b"not a socket").unwrap();
        let dead = bus.dir.join("2-dead.sock");
        drop(UnixDatagram::bind(&dead).unwrap());
        let own = bus.own.clone().unwrap();
        bus.send("5:orderxk#1");
        assert!(plain.exists(), "a file that is not a socket was removed");
        assert!(!dead.exists(), "a socket nobody is bound to was kept");
        assert!(own.exists(), "the backend's own socket was removed");
        drop(bus);
        let _ = std::fs::remove_file(&plain);
        let _ = std::fs::remove_file(&file);
    }

    #[test]
    fn two_buses_on_one_file_keep_their_own_sockets() {
        let (a, file) = bus_beside_a_new_file("two");
        let (b, _) = LocalBus::open(&file, "dlock_", Arc::default()).unwrap();
        let (a_own, b_own) = (a.own.clone().unwrap(), b.own.clone().unwrap());
        assert_ne!(a_own, b_own);
        drop(a);
        // The first bus's thread ends and removes its socket; the second's stays.
        let gone = (0..200).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            !a_own.exists()
        });
        assert!(gone, "a dropped bus kept its socket");
        assert!(b_own.exists());
        drop(b);
        let _ = std::fs::remove_file(&file);
    }

    #[test]
    fn the_directory_is_beside_the_file_unless_the_path_is_too_long() {
        let short = socket_dir(Path::new("/srv/app/locks.db"));
        assert_eq!(short, Some(PathBuf::from("/srv/app/locks.db-dlock-wake")));
        let long = format!("/srv/{}/locks.db", "d".repeat(80));
        assert_eq!(socket_dir(Path::new(&long)), None);
    }
}
