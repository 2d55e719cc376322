//! A TCP proxy on loopback that injects network faults between a client and a server:
//! pass, delay, black-hole (accept and swallow, never answer) and reset (drop every
//! connection and refuse new ones). Only loopback upstreams are accepted.
//!
//! [`split_url`] finds a backend URL's hosts, so a proxy can be put in front of each
//! ([`SplitUrl::with_hosts`]).

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the proxy does to traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward everything.
    Pass,
    /// Forward every chunk after this delay.
    Delay(Duration),
    /// Keep connections open but forward nothing (a partition or a dead host).
    Blackhole,
    /// Close every connection and refuse new ones (a crashed server).
    Reset,
}

/// `pass`, `delay <ms>`, `blackhole`, `reset`.
impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Pass => f.write_str("pass"),
            Fault::Delay(d) => write!(f, "delay {}", d.as_millis()),
            Fault::Blackhole => f.write_str("blackhole"),
            Fault::Reset => f.write_str("reset"),
        }
    }
}

/// Parses what [`Display`](fmt::Display) writes.
impl FromStr for Fault {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let words: Vec<&str> = s.split_whitespace().collect();
        match words.as_slice() {
            ["pass"] => Ok(Fault::Pass),
            ["blackhole"] => Ok(Fault::Blackhole),
            ["reset"] => Ok(Fault::Reset),
            ["delay", ms] => ms
                .parse()
                .map(|ms| Fault::Delay(Duration::from_millis(ms)))
                .map_err(|_| format!("bad delay {ms:?}")),
            _ => Err(format!(
                "unknown fault {s:?}; use pass, delay <ms>, blackhole or reset"
            )),
        }
    }
}

/// A URL split around its host list: `scheme://[user@]` + hosts + `[/path][?query]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitUrl {
    /// Everything before the first host.
    pub head: String,
    /// The hosts, all on loopback.
    pub hosts: Vec<SocketAddr>,
    /// Everything after the last host.
    pub tail: String,
}

/// Splits `url` around its comma-separated `host:port` list. Only loopback hosts
/// (`127.0.0.1`, `localhost`, `[::1]`) with explicit ports are accepted.
pub fn split_url(url: &str) -> Result<SplitUrl, String> {
    let scheme_end = url
        .find("://")
        .ok_or_else(|| "the URL has no scheme://".to_owned())?
        + 3;
    let rest = &url[scheme_end..];
    let authority_len = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..authority_len];
    let hosts_start = authority.rfind('@').map_or(0, |i| i + 1);
    let mut hosts = Vec::new();
    for host in authority[hosts_start..].split(',') {
        let host = host.replace("localhost", "127.0.0.1");
        let addr: SocketAddr = host
            .parse()
            .map_err(|_| format!("{host:?} is not a loopback host:port"))?;
        if !addr.ip().is_loopback() {
            return Err(format!("{host} is not on loopback"));
        }
        hosts.push(addr);
    }
    Ok(SplitUrl {
        head: url[..scheme_end + hosts_start].to_owned(),
        hosts,
        tail: rest[authority_len..].to_owned(),
    })
}

impl SplitUrl {
    /// The URL with its hosts replaced by `hosts`.
    pub fn with_hosts(&self, hosts: &[SocketAddr]) -> String {
        format!("{}{}{}", self.head, join_hosts(hosts), self.tail)
    }
}

/// `url` with every host reached through a fault proxy of its own, and the
/// proxies (in the URL's host order).
pub async fn proxy_every_host(url: &str) -> Result<(String, Vec<FaultProxy>), String> {
    let split = split_url(url)?;
    let mut proxies = Vec::with_capacity(split.hosts.len());
    for host in &split.hosts {
        proxies.push(
            FaultProxy::start(*host)
                .await
                .map_err(|e| format!("start a fault proxy for {host}: {e}"))?,
        );
    }
    let addrs: Vec<SocketAddr> = proxies.iter().map(FaultProxy::addr).collect();
    Ok((split.with_hosts(&addrs), proxies))
}

/// `host:port,host:port…`.
pub fn join_hosts(hosts: &[SocketAddr]) -> String {
    let list: Vec<String> = hosts.iter().map(ToString::to_string).collect();
    list.join(",")
}

/// A running proxy; stops when dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    fault: watch::Sender<Fault>,
    upstream: watch::Sender<SocketAddr>,
    /// Connections open through the proxy.
    open: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

/// Refuses an upstream outside 127.0.0.0/8 (faults are injected on loopback only).
pub fn loopback_only(upstream: SocketAddr) -> io::Result<()> {
    if upstream.ip().is_loopback() {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the fault proxy only forwards to loopback addresses",
        ))
    }
}

impl FaultProxy {
    /// Listens on 127.0.0.1 (a free port) and forwards to `upstream`, which must be
    /// a loopback address.
    pub async fn start(upstream: SocketAddr) -> io::Result<Self> {
        loopback_only(upstream)?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (fault, watcher) = watch::channel(Fault::Pass);
        let (upstream, target) = watch::channel(upstream);
        let open = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&open);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let watcher = watcher.clone();
                if *watcher.borrow() == Fault::Reset {
                    let _ = client.set_zero_linger();
                    drop(client);
                    continue;
                }
                let upstream = *target.borrow();
                let counted = Arc::clone(&counted);
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    serve(client, upstream, watcher).await;
                    counted.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        Ok(FaultProxy {
            addr,
            fault,
            upstream,
            open,
            task,
        })
    }

    /// Forwards new connections to `upstream` (a loopback address) from now on, as
    /// a client follows a failover; connections already open stay where they are
    /// (reset them to move them).
    pub fn retarget(&self, upstream: SocketAddr) -> io::Result<()> {
        loopback_only(upstream)?;
        self.upstream.send_replace(upstream);
        Ok(())
    }

    /// The address clients should connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Changes the fault for existing and new connections.
    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }

    /// How many connections are open through the proxy.
    pub fn open_connections(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// Closes every open connection (as a server restart or an operator's kill
    /// would), waiting (5 s at most) until they are gone, then lets new ones pass.
    /// False if some stayed open.
    pub async fn end_connections(&self) -> bool {
        self.set(Fault::Reset);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while self.open_connections() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let ended = self.open_connections() == 0;
        self.set(Fault::Pass);
        ended
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.fault.send_replace(Fault::Reset);
        self.task.abort();
    }
}

/// Relays between `client` and a connection opened for it to `upstream` (Nagle off
/// on both): `up` carries the client's half to the server, `down` the server's to
/// the client; either ending (EOF, error or a fault) ends the connection. Returns
/// at once if the server cannot be reached.
pub async fn relay<U, D>(
    client: TcpStream,
    upstream: SocketAddr,
    up: impl FnOnce(OwnedReadHalf, OwnedWriteHalf) -> U,
    down: impl FnOnce(OwnedReadHalf, OwnedWriteHalf) -> D,
) where
    U: std::future::Future<Output = ()>,
    D: std::future::Future<Output = ()>,
{
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    tokio::select! {
        () = up(cr, sw) => {}
        () = down(sr, cw) => {}
    }
}

async fn serve(client: TcpStream, upstream: SocketAddr, watcher: watch::Receiver<Fault>) {
    let down_watcher = watcher.clone();
    relay(
        client,
        upstream,
        |from, to| pump(from, to, watcher),
        |from, to| pump(from, to, down_watcher),
    )
    .await;
}

async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut watcher: watch::Receiver<Fault>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            changed = watcher.changed() => {
                if changed.is_err() || *watcher.borrow() == Fault::Reset {
                    return;
                }
                continue;
            }
        };
        let fault = *watcher.borrow();
        match fault {
            Fault::Pass => {}
            Fault::Delay(d) => tokio::time::sleep(d).await,
            Fault::Blackhole => continue,
            Fault::Reset => return,
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_print_and_parse() {
        for f in [
            Fault::Pass,
            Fault::Delay(Duration::from_millis(120)),
            Fault::Blackhole,
            Fault::Reset,
        ] {
            assert_eq!(f.to_string().parse::<Fault>(), Ok(f));
        }
        assert_eq!(
            Fault::Delay(Duration::from_millis(120)).to_string(),
            "delay 120"
        );
        assert!("bogus".parse::<Fault>().is_err());
        assert!("delay x".parse::<Fault>().is_err());
    }

    #[test]
    fn urls_split_and_rewrite() {
        let u = split_url("mysql://root@127.0.0.1:3306/test").unwrap();
        assert_eq!(u.head, "mysql://root@");
        assert_eq!(u.tail, "/test");
        let p: SocketAddr = "127.0.0.1:9".parse().unwrap();
        assert_eq!(u.with_hosts(&[p]), "mysql://root@127.0.0.1:9/test");
        let z = split_url("zk://127.0.0.1:2191,localhost:2192/dlock-test").unwrap();
        assert_eq!(z.hosts.len(), 2);
        assert_eq!(join_hosts(&z.hosts), "127.0.0.1:2191,127.0.0.1:2192");
        let r = split_url("rediss://127.0.0.1:6390/?tls_ca=/x/ca.crt").unwrap();
        assert_eq!(r.tail, "/?tls_ca=/x/ca.crt");
        assert!(split_url("redis://10.0.0.1:6379").is_err());
        let plain = split_url("redis://127.0.0.1:6379").unwrap();
        assert_eq!(plain.with_hosts(&[p]), "redis://127.0.0.1:9");
    }

    #[tokio::test]
    async fn forwards_swallows_and_resets() {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let echo_addr = echo.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let mut b = [0u8; 64];
                    while let Ok(n) = s.read(&mut b).await {
                        if n == 0 || s.write_all(&b[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        let proxy = FaultProxy::start(echo_addr).await.unwrap();
        let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
        let mut b = [0u8; 4];
        c.write_all(b"ping").await.unwrap();
        c.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"ping");

        proxy.set(Fault::Blackhole);
        c.write_all(b"lost").await.unwrap();
        let silent = tokio::time::timeout(Duration::from_millis(200), c.read(&mut b)).await;
        assert!(silent.is_err(), "black-holed data came back");

        proxy.set(Fault::Reset);
        let closed = tokio::time::timeout(Duration::from_secs(2), c.read(&mut b))
            .await
            .unwrap();
        assert!(
            matches!(closed, Ok(0) | Err(_)),
            "connection survived a reset"
        );
        assert!(FaultProxy::start("10.0.0.1:1".parse().unwrap())
            .await
            .is_err());
        assert!(proxy.retarget("10.0.0.1:1".parse().unwrap()).is_err());
    }

    /// A retargeted proxy sends new connections to the new upstream.
    #[tokio::test]
    async fn retargets_new_connections() {
        async fn greeter(word: &'static [u8]) -> SocketAddr {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            tokio::spawn(async move {
                while let Ok((mut s, _)) = listener.accept().await {
                    let _ = s.write_all(word).await;
                }
            });
            addr
        }
        let (old, new) = (greeter(b"old").await, greeter(b"new").await);
        let proxy = FaultProxy::start(old).await.unwrap();
        let mut b = [0u8; 3];
        let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
        c.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"old");
        proxy.retarget(new).unwrap();
        let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
        c.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"new");
    }
}
