//! A TCP proxy on loopback that reads ZooKeeper's wire protocol and cuts a
//! connection at one chosen moment: just before the answer to a chosen kind of
//! request reaches the client. The request has reached the server and been carried
//! out; its answer is lost with the connection — the blip a client must ride out
//! without knowing what happened. Connections opened afterwards pass (the client
//! reconnects, its session living on).
//!
//! ZooKeeper frames every message with a 4-byte big-endian length. After the
//! connect handshake (the first frame each way), a request starts with its xid and
//! operation code, and a reply with the xid it answers.

use std::collections::HashSet;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::proxy::{loopback_only, relay};

/// ZooKeeper's operation code of `getChildren` (the children's names).
pub const GET_CHILDREN: i32 = 8;
/// ZooKeeper's operation code of `getChildren2` (children and the parent's stat).
pub const GET_CHILDREN2: i32 = 12;
/// ZooKeeper's operation code of `create2` (create, answering the node's stat).
pub const CREATE2: i32 = 15;

/// The largest frame passed on (ZooKeeper's own default `jute.maxbuffer` is 1 MiB).
const MAX_FRAME: usize = 4 << 20;

#[derive(Default)]
struct Plan {
    /// The operation whose next request's answer is to be cut.
    armed: Option<i32>,
    /// That request, once seen: (connection, xid).
    target: Option<(u64, i32)>,
    /// Requests passed on whose answers have not been: (connection, xid).
    unanswered: HashSet<(u64, i32)>,
}

/// The proxy. Dropping it stops accepting; open connections end with their peers.
pub struct ZkReplyCut {
    addr: SocketAddr,
    plan: Arc<Mutex<Plan>>,
    cuts: watch::Receiver<u32>,
    task: JoinHandle<()>,
}

impl ZkReplyCut {
    /// Listens on 127.0.0.1 (a free port) and forwards to `upstream`, a loopback
    /// ZooKeeper server (plain TCP).
    pub async fn start(upstream: SocketAddr) -> io::Result<Self> {
        loopback_only(upstream)?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let plan = Arc::new(Mutex::new(Plan::default()));
        let (cut, cuts) = watch::channel(0u32);
        let shared = Arc::clone(&plan);
        let task = tokio::spawn(async move {
            let cut = Arc::new(cut);
            let mut next_id = 0u64;
            while let Ok((client, _)) = listener.accept().await {
                next_id += 1;
                let (plan, cut) = (Arc::clone(&shared), Arc::clone(&cut));
                tokio::spawn(serve(next_id, client, upstream, plan, cut));
            }
        });
        Ok(ZkReplyCut {
            addr,
            plan,
            cuts,
            task,
        })
    }

    /// The address clients should connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Cuts the connection that carries the next request of operation `op`, just
    /// before its answer would be passed on.
    pub fn cut_before_answer_to(&self, op: i32) {
        let mut plan = self.plan.lock().unwrap();
        plan.armed = Some(op);
        plan.target = None;
    }

    /// Whether every request passed on has had its answer passed back (the clients
    /// wait for nothing from the server but watch events).
    pub fn idle(&self) -> bool {
        self.plan.lock().unwrap().unanswered.is_empty()
    }

    /// Waits until a connection has been cut (the `n`th cut since the start).
    pub async fn cut(&self, n: u32) {
        let mut cuts = self.cuts.clone();
        let _ = cuts.wait_for(|c| *c >= n).await;
    }
}

impl Drop for ZkReplyCut {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(
    id: u64,
    client: TcpStream,
    upstream: SocketAddr,
    plan: Arc<Mutex<Plan>>,
    cut: Arc<watch::Sender<u32>>,
) {
    let up_plan = Arc::clone(&plan);
    let down_plan = Arc::clone(&plan);
    relay(
        client,
        upstream,
        |from, to| pass_requests(id, from, to, up_plan),
        |from, to| pass_answers(id, from, to, down_plan, cut),
    )
    .await;
    // Nothing sent on the connection will be answered now.
    plan.lock()
        .unwrap()
        .unanswered
        .retain(|(conn, _)| *conn != id);
}

/// One frame: its length prefix and body.
async fn read_frame(from: &mut OwnedReadHalf) -> Option<Vec<u8>> {
    let mut len = [0u8; 4];
    from.read_exact(&mut len).await.ok()?;
    let n = usize::try_from(u32::from_be_bytes(len)).ok()?;
    if n > MAX_FRAME {
        return None;
    }
    let mut frame = vec![0u8; 4 + n];
    frame[..4].copy_from_slice(&len);
    from.read_exact(&mut frame[4..]).await.ok()?;
    Some(frame)
}

fn int_at(frame: &[u8], at: usize) -> Option<i32> {
    let bytes: [u8; 4] = frame.get(at..at + 4)?.try_into().ok()?;
    Some(i32::from_be_bytes(bytes))
}

async fn pass_requests(
    id: u64,
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    plan: Arc<Mutex<Plan>>,
) {
    let mut first = true;
    while let Some(frame) = read_frame(&mut from).await {
        if !std::mem::take(&mut first) {
            if let (Some(xid), Some(op)) = (int_at(&frame, 4), int_at(&frame, 8)) {
                let mut plan = plan.lock().unwrap();
                plan.unanswered.insert((id, xid));
                if plan.armed == Some(op) {
                    plan.armed = None;
                    plan.target = Some((id, xid));
                }
            }
        }
        if to.write_all(&frame).await.is_err() {
            return;
        }
    }
}

async fn pass_answers(
    id: u64,
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    plan: Arc<Mutex<Plan>>,
    cut: Arc<watch::Sender<u32>>,
) {
    let mut first = true;
    while let Some(frame) = read_frame(&mut from).await {
        if !std::mem::take(&mut first) {
            let xid = int_at(&frame, 4);
            let mut plan = plan.lock().unwrap();
            if plan.target.is_some() && plan.target == xid.map(|x| (id, x)) {
                plan.target = None;
                cut.send_modify(|c| *c += 1);
                return;
            }
            if let Some(xid) = xid {
                plan.unanswered.remove(&(id, xid));
            }
        }
        if to.write_all(&frame).await.is_err() {
            return;
        }
    }
}
