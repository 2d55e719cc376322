//! A TCP proxy on loopback that injects network faults between a client and a server:
//! pass, delay, black-hole (accept and swallow, never answer) and reset (drop every
//! connection and refuse new ones). Only loopback upstreams are accepted.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
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

/// A running proxy; stops when dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    fault: watch::Sender<Fault>,
    task: JoinHandle<()>,
}

impl FaultProxy {
    /// Listens on 127.0.0.1 (a free port) and forwards to `upstream`, which must be
    /// a loopback address.
    pub async fn start(upstream: SocketAddr) -> io::Result<Self> {
        if !upstream.ip().is_loopback() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the fault proxy only forwards to loopback addresses",
            ));
        }
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (fault, watcher) = watch::channel(Fault::Pass);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let watcher = watcher.clone();
                if *watcher.borrow() == Fault::Reset {
                    let _ = client.set_zero_linger();
                    drop(client);
                    continue;
                }
                tokio::spawn(serve(client, upstream, watcher));
            }
        });
        Ok(FaultProxy { addr, fault, task })
    }

    /// The address clients should connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Changes the fault for existing and new connections.
    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.fault.send_replace(Fault::Reset);
        self.task.abort();
    }
}

async fn serve(client: TcpStream, upstream: SocketAddr, watcher: watch::Receiver<Fault>) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    let up = pump(cr, sw, watcher.clone());
    let down = pump(sr, cw, watcher);
    // Either direction ending (EOF, error or reset) ends the connection.
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
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
    }
}
