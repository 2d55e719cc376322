//! What the ZooKeeper backend's tests share: the selected servers, managers and raw clients on them, contender nodes, and the fault proxy.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use dlock_api::DistributeLockManager;
use dlock_zk::ZkBackend;
use testsuite::backends::server_url;
use testsuite::conformance::eventually;
use testsuite::proxy::{join_hosts, split_url};
use testsuite::runner::selected;
use testsuite::zk_cut::ZkReplyCut;
use zookeeper_client::Client;

pub(crate) fn url_for(label: &str) -> Option<String> {
    let url = selected()
        .iter()
        .any(|l| l == label)
        .then(|| server_url(label).unwrap().to_string());
    if url.is_none() {
        eprintln!("{label} is not selected in DLOCK_TEST_BACKENDS; nothing to check here");
    }
    url
}

pub(crate) fn name(tag: &str) -> String {
    format!("{tag}-{:x}", fastrand::u64(..))
}

/// `zk://hosts/root?…` → `hosts`.
pub(crate) fn hosts_of(url: &str) -> String {
    join_hosts(&split_url(url).unwrap().hosts)
}

/// The first ZooKeeper server of `url`.
pub(crate) fn first_host(url: &str) -> SocketAddr {
    split_url(url).unwrap().hosts[0]
}

pub(crate) async fn manager(url: &str) -> DistributeLockManager {
    DistributeLockManager::builder(ZkBackend::connect(url).await.unwrap())
        .build()
        .unwrap()
}

pub(crate) async fn raw_client(url: &str) -> Client {
    Client::connect(&hosts_of(url)).await.unwrap()
}

/// An ephemeral sequential node made by `raw` at `prefix` (another client's
/// contender): its stat and sequence number.
pub(crate) async fn contender_node(
    raw: &Client,
    prefix: &str,
) -> (zookeeper_client::Stat, zookeeper_client::CreateSequence) {
    raw.create(
        prefix,
        b"",
        &zookeeper_client::CreateMode::EphemeralSequential
            .with_acls(zookeeper_client::Acls::anyone_all()),
    )
    .await
    .unwrap()
}

/// Makes the lock's node (a container), as dlock would, if it is not there.
pub(crate) async fn lock_node(raw: &Client, path: &str) {
    let _ = raw
        .create(
            path,
            &[],
            &zookeeper_client::CreateMode::Container
                .with_acls(zookeeper_client::Acls::anyone_all()),
        )
        .await;
}

/// A backend, a manager over it, and a raw client to look at the tree.
pub(crate) async fn setup(url: &str) -> (ZkBackend, DistributeLockManager, Client) {
    let backend = ZkBackend::connect(url).await.unwrap();
    let m = DistributeLockManager::builder(backend.clone())
        .build()
        .unwrap();
    (backend, m, raw_client(url).await)
}

/// Waits (5 s at most) until every request through `cutter` has been answered: its
/// clients wait on watches only.
pub(crate) async fn settled(cutter: &ZkReplyCut) {
    let idle = eventually(Duration::from_secs(5), || async { cutter.idle() }).await;
    assert!(idle, "requests through the proxy are still unanswered");
}

/// The ensemble member (1–3) whose `srvr` says it leads.
pub(crate) async fn ensemble_leader() -> Option<u16> {
    for i in 1..=3u16 {
        if zk_mode(2190 + i).await.as_deref() == Some("leader") {
            return Some(i);
        }
    }
    None
}

/// A server's mode (`leader`, `follower`, `standalone`) from the `srvr` command.
pub(crate) async fn zk_mode(port: u16) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let attempt = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        s.write_all(b"srvr").await.ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).await.ok()?;
        out.lines()
            .find_map(|l| l.strip_prefix("Mode: "))
            .map(|m| m.trim().to_owned())
    };
    tokio::time::timeout(Duration::from_secs(2), attempt)
        .await
        .ok()
        .flatten()
}

/// Restarts a stopped ensemble member (with the start.sh the script left in its
/// directory) when told to, or at the latest when dropped (also while a failed
/// assertion unwinds).
pub(crate) struct Restart {
    pub(crate) dir: Option<PathBuf>,
}

impl Restart {
    pub(crate) fn now(&mut self) {
        if let Some(dir) = self.dir.take() {
            let started = std::process::Command::new("sh")
                .arg(dir.join("start.sh"))
                .stdin(Stdio::null())
                .status();
            assert!(
                started.is_ok_and(|s| s.success()),
                "could not restart {}",
                dir.display()
            );
        }
    }
}

impl Drop for Restart {
    fn drop(&mut self) {
        self.now();
    }
}

/// The Java worker's next line within `within` (empty if none came).
pub(crate) async fn next_line(
    lines: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    within: Duration,
) -> String {
    tokio::time::timeout(within, lines.recv())
        .await
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// The semaphore's step (as the Java worker's): claim `n` of the `total` slot files
/// with exclusive creates (1 when fewer are free: more permits held than the total),
/// pause, drop them.
pub(crate) fn claim_slots(counter: &Path, n: u32, total: u32) -> u32 {
    let claimed: Vec<PathBuf> = (0..total)
        .map(|s| PathBuf::from(format!("{}.slot{s}", counter.display())))
        .filter(|slot| {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(slot)
                .is_ok()
        })
        .take(usize::try_from(n).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(5));
    let short = u32::from(claimed.len() < usize::try_from(n).unwrap());
    for slot in claimed {
        std::fs::remove_file(slot).unwrap();
    }
    short
}

/// The counter step both sides run: claim the marker file exclusively (counting an
/// overlap if someone else is inside), read, pause, write + 1, drop the marker.
/// A reader's work: 1 if the counter moved, or a writer was inside, during 2 ms.
pub(crate) fn watch_still(counter: &Path) -> u32 {
    let marker = PathBuf::from(format!("{}.held", counter.display()));
    let before = std::fs::read_to_string(counter).unwrap();
    std::thread::sleep(Duration::from_millis(2));
    let inside = marker.exists();
    let after = std::fs::read_to_string(counter).unwrap();
    u32::from(inside || before != after)
}

pub(crate) fn increment(counter: &Path) -> u32 {
    let marker = PathBuf::from(format!("{}.held", counter.display()));
    let claimed = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&marker)
        .is_ok();
    let value: u64 = std::fs::read_to_string(counter)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1));
    std::fs::write(counter, (value + 1).to_string()).unwrap();
    if claimed {
        std::fs::remove_file(&marker).unwrap();
        0
    } else {
        1
    }
}
