//! The fenced register: a resource outside the lock store that every critical section
//! writes to with its fencing token, as an application's database would.
//!
//! One line per request, one line per answer, on a TCP connection to 127.0.0.1:
//!
//! | request                            | answer                            |
//! |------------------------------------|-----------------------------------|
//! | `ENTER <lock> <token> <hold>`      | `OK`                              |
//! | `WRITE <lock> <token> <hold>`      | `ACCEPT` or `REJECT <highest>`    |
//! | `READ <lock> <token> <hold>`       | `VALUE <highest>` (`-` if none)   |
//! | `EXIT <lock> <token> <hold>`       | `OK`                              |
//!
//! A write is accepted iff its token is ≥ the highest token accepted for that lock
//! (which it then becomes). Every request is logged with the register's own receive
//! time, in the order it was served.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use super::history::{now_ns, Event, Kind, RegOp, COORDINATOR};

/// How many connections the register serves at once (workers open one per task).
const MAX_CONNECTIONS: usize = 4096;
/// Connections accepted over the register's life (workers open one per task).
const MAX_ACCEPTS: usize = 1_000_000;
/// Requests served on one connection.
const MAX_REQUESTS: usize = 100_000_000;
/// Longest request line.
const MAX_LINE: usize = 1024;
/// How long a client waits for an answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Default)]
struct State {
    /// Per lock, the highest token accepted.
    highest: HashMap<String, u64>,
    log: Vec<Event>,
}

/// A running register; stops when dropped.
pub struct Register {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    task: JoinHandle<()>,
}

impl Register {
    /// Listens on 127.0.0.1 (a free port).
    pub async fn start() -> io::Result<Register> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State::default()));
        let shared = Arc::clone(&state);
        let task = tokio::spawn(async move {
            // Dropped with the accept loop: aborts every connection task.
            let mut connections = JoinSet::new();
            for _ in 0..MAX_ACCEPTS {
                let Ok((stream, _)) = listener.accept().await else {
                    break;
                };
                while connections.try_join_next().is_some() {}
                if connections.len() >= MAX_CONNECTIONS {
                    drop(stream);
                    continue;
                }
                connections.spawn(serve(stream, Arc::clone(&shared)));
            }
        });
        Ok(Register { addr, state, task })
    }

    /// Where workers connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every request served so far, in serving order.
    pub fn log(&self) -> Vec<Event> {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .log
            .clone()
    }
}

impl Drop for Register {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(stream: TcpStream, state: Arc<Mutex<State>>) {
    let _ = stream.set_nodelay(true);
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read);
    let mut line = String::new();
    for _ in 0..MAX_REQUESTS {
        line.clear();
        match (&mut lines)
            .take(MAX_LINE as u64)
            .read_line(&mut line)
            .await
        {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if !line.ends_with('\n') {
            let _ = write.write_all(b"ERR line too long\n").await;
            return;
        }
        let answer = answer(line.trim_end(), &state);
        if write.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// Serves one request line (under the state mutex, so the log order is the serving order).
fn answer(line: &str, state: &Mutex<State>) -> String {
    let mut words = line.split(' ');
    let (Some(op), Some(lock), Some(token), Some(hold), None) = (
        words.next().and_then(RegOp::parse),
        words.next(),
        words.next().and_then(|t| t.parse::<u64>().ok()),
        words.next(),
        words.next(),
    ) else {
        return "ERR expected: ENTER|WRITE|READ|EXIT <lock> <token> <hold>\n".to_owned();
    };
    let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
    let t = now_ns();
    let highest = state.highest.get(lock).copied();
    let (accepted, reply) = match op {
        RegOp::Enter | RegOp::Exit => (true, "OK\n".to_owned()),
        RegOp::Read => (
            true,
            match highest {
                Some(h) => format!("VALUE {h}\n"),
                None => "VALUE -\n".to_owned(),
            },
        ),
        RegOp::Write => match highest {
            Some(h) if token < h => (false, format!("REJECT {h}\n")),
            _ => {
                state.highest.insert(lock.to_owned(), token);
                (true, "ACCEPT\n".to_owned())
            }
        },
    };
    state.log.push(Event {
        t,
        proc_: COORDINATOR,
        kind: Kind::Reg {
            op,
            lock: lock.to_owned(),
            token,
            hold: hold.to_owned(),
            accepted,
        },
    });
    reply
}

/// One connection to the register (one per worker task).
pub struct RegisterClient {
    stream: BufReader<TcpStream>,
    line: String,
}

impl RegisterClient {
    /// Connects to the register at `addr` (loopback only).
    pub async fn connect(addr: SocketAddr) -> io::Result<RegisterClient> {
        if !addr.ip().is_loopback() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the register is only reached on loopback",
            ));
        }
        let stream = tokio::time::timeout(CLIENT_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connecting to the register"))??;
        stream.set_nodelay(true)?;
        Ok(RegisterClient {
            stream: BufReader::new(stream),
            line: String::new(),
        })
    }

    async fn call(&mut self, op: RegOp, lock: &str, token: u64, hold: &str) -> io::Result<String> {
        let request = format!("{} {lock} {token} {hold}\n", op.as_str());
        let exchange = async {
            self.stream.get_mut().write_all(request.as_bytes()).await?;
            self.line.clear();
            if self.stream.read_line(&mut self.line).await? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the register closed the connection",
                ));
            }
            Ok(self.line.trim_end().to_owned())
        };
        tokio::time::timeout(CLIENT_TIMEOUT, exchange)
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "the register did not answer"))?
    }

    /// Marks the start of a critical section.
    pub async fn enter(&mut self, lock: &str, token: u64, hold: &str) -> io::Result<()> {
        self.expect_ok(RegOp::Enter, lock, token, hold).await
    }

    /// Marks the end of a critical section.
    pub async fn exit(&mut self, lock: &str, token: u64, hold: &str) -> io::Result<()> {
        self.expect_ok(RegOp::Exit, lock, token, hold).await
    }

    async fn expect_ok(&mut self, op: RegOp, lock: &str, token: u64, hold: &str) -> io::Result<()> {
        let answer = self.call(op, lock, token, hold).await?;
        if answer == "OK" {
            Ok(())
        } else {
            Err(io::Error::other(format!("register answered {answer:?}")))
        }
    }

    /// A fenced write; true if the register accepted it.
    pub async fn write(&mut self, lock: &str, token: u64, hold: &str) -> io::Result<bool> {
        let answer = self.call(RegOp::Write, lock, token, hold).await?;
        match answer.split(' ').next() {
            Some("ACCEPT") => Ok(true),
            Some("REJECT") => Ok(false),
            _ => Err(io::Error::other(format!("register answered {answer:?}"))),
        }
    }

    /// A read (shared holders): the highest token written so far.
    pub async fn read(&mut self, lock: &str, token: u64, hold: &str) -> io::Result<Option<u64>> {
        let answer = self.call(RegOp::Read, lock, token, hold).await?;
        match answer.strip_prefix("VALUE ") {
            Some("-") => Ok(None),
            Some(v) => v
                .parse()
                .map(Some)
                .map_err(|_| io::Error::other(format!("register answered {answer:?}"))),
            None => Err(io::Error::other(format!("register answered {answer:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn accepts_only_non_decreasing_tokens() {
        let register = Register::start().await.unwrap();
        let mut c = RegisterClient::connect(register.addr()).await.unwrap();
        c.enter("x", 5, "a").await.unwrap();
        assert!(c.write("x", 5, "a").await.unwrap());
        assert!(c.write("x", 7, "b").await.unwrap());
        assert!(!c.write("x", 6, "a").await.unwrap());
        assert!(c.write("x", 7, "b").await.unwrap());
        assert!(c.write("y", 1, "c").await.unwrap());
        assert_eq!(c.read("x", 7, "r").await.unwrap(), Some(7));
        c.exit("x", 5, "a").await.unwrap();
        let log = register.log();
        assert_eq!(log.len(), 8);
        assert!(log.windows(2).all(|w| w[0].t <= w[1].t));
    }
}
