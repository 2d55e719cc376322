//! One lease keep-alive stream per backend, shared by every hold and waiter.
//!
//! etcd's `LeaseKeepAlive` is a bidirectional stream that accepts any lease id in
//! each message and answers each with the lease's remaining TTL (0: the lease is
//! gone). `etcd-client`'s keeper is tied to one lease, so each hold would need a
//! stream of its own; this module speaks the RPC itself on the backend's channel and
//! sends every lease's refresh on one stream, matching answers to callers by lease
//! id (etcd answers a stream's messages in order).
//!
//! A backend on an application's client ([`crate::EtcdBackend::from_client`]) has no
//! channel of its own to speak the RPC on: there each refresh opens a keeper stream
//! of its own through the client (its interceptors, token and TLS), refreshes twice
//! on it — `etcd-client` keeps the first answer's TTL to itself — and closes it.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use dlock_spi::{Error, ErrorKind, Result};
use etcd_client::LeaseClient;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;

use crate::error::map_etcd;
use crate::resend::{resending, Repeat};

/// etcd's `LeaseKeepAliveRequest`.
#[derive(Clone, PartialEq, prost::Message)]
struct KeepAliveRequest {
    #[prost(int64, tag = "1")]
    id: i64,
}

/// etcd's `LeaseKeepAliveResponse` (its header is not read).
#[derive(Clone, PartialEq, prost::Message)]
struct KeepAliveResponse {
    #[prost(int64, tag = "2")]
    id: i64,
    #[prost(int64, tag = "3")]
    ttl: i64,
}

const PATH: &str = "/etcdserverpb.Lease/LeaseKeepAlive";

/// Refresh this lease; answer its TTL in seconds (0: gone).
pub(crate) struct Refresh(i64, oneshot::Sender<Result<i64>>);

/// The handle every lease refresh goes through; cheap to clone.
#[derive(Clone)]
pub(crate) enum KeepAlives {
    /// Every refresh on one stream, run by a task on the backend's own channel.
    Shared(mpsc::UnboundedSender<Refresh>),
    /// Each refresh on a keeper stream of its own, through an application's client,
    /// answered within the request timeout.
    Alone(Box<LeaseClient>, Duration),
}

impl KeepAlives {
    /// Starts the stream's task on `channel` (it opens the stream on first use and
    /// again after a failure, or when an answer is `timeout` late, sending it again
    /// up to `resends` times after transport failures; it ends when the last handle
    /// is dropped).
    pub(crate) fn start(channel: Channel, timeout: Duration, resends: u32) -> Self {
        let (commands, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(channel, rx, timeout, resends));
        KeepAlives::Shared(commands)
    }

    /// Refreshes through `leases`, an application's client, each on a stream of
    /// its own, each answered within `timeout`.
    pub(crate) fn through(leases: LeaseClient, timeout: Duration) -> Self {
        KeepAlives::Alone(Box::new(leases), timeout)
    }

    /// Refreshes `lease` to its full TTL; answers the TTL it now has in seconds, 0
    /// when the lease is gone (expired or revoked). Fails when the stream fails or
    /// its answer is later than the request timeout.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call leaves at most one refresh on the stream, which
    /// only keeps the lease alive as a completed call would have.
    pub(crate) async fn refresh(&self, lease: i64) -> Result<i64> {
        match self {
            KeepAlives::Shared(commands) => {
                let (tx, rx) = oneshot::channel();
                commands.send(Refresh(lease, tx)).map_err(|_| closed())?;
                rx.await.map_err(|_| closed())?
            }
            KeepAlives::Alone(leases, timeout) => {
                tokio::time::timeout(*timeout, refresh_alone((**leases).clone(), lease))
                    .await
                    .unwrap_or_else(|_| Err(crate::error::timed_out("renew")))
            }
        }
    }
}

/// What `etcd-client` answers when a keeper's first refresh finds the lease gone.
const LEASE_GONE: &str = "lease not found";

/// Refreshes `lease` on a keeper stream of its own; answers its TTL (0: gone).
async fn refresh_alone(mut leases: LeaseClient, lease: i64) -> Result<i64> {
    let (mut keeper, mut answers) = match leases.keep_alive(lease).await {
        Ok(opened) => opened,
        Err(etcd_client::Error::LeaseKeepAliveError(why)) if why == LEASE_GONE => return Ok(0),
        Err(err) => return Err(map_etcd(err, "renew")),
    };
    // The keeper read the first answer (the refresh) and keeps its TTL: the second
    // refresh's answer says it.
    keeper
        .keep_alive()
        .await
        .map_err(|e| map_etcd(e, "renew"))?;
    match answers.message().await {
        Ok(Some(answer)) => Ok(answer.ttl()),
        Ok(None) => Err(stream_failed("ended by the server")),
        Err(err) => Err(map_etcd(err, "renew")),
    }
}

fn closed() -> Error {
    Error::new(ErrorKind::Closed, "the etcd backend was closed").set_retryable(false)
}

fn stream_failed(what: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorKind::Backend,
        format!("etcd's lease keep-alive stream failed ({what}); the next refresh opens a new one — retry"),
    )
}

struct Stream {
    requests: mpsc::Sender<KeepAliveRequest>,
    answers: tonic::Streaming<KeepAliveResponse>,
}

/// Opens a stream whose first message refreshes `first`, by `deadline`; opened
/// again at once after a transport failure, as any request ([`crate::resend`]: a
/// refresh is safe to send twice), within `resends`.
async fn open(channel: &Channel, first: i64, deadline: Instant, resends: u32) -> Result<Stream> {
    let failure = |o: &Opening| match o {
        Opening::Status(status) => crate::error::status_failure(status),
        Opening::Failed(_) => None,
    };
    let send = || open_once(channel, first);
    resending(deadline.into(), resends, Repeat::Safe, failure, send)
        .await
        .map(|sent| sent.answer)
        .map_err(|u| {
            u.into_error(
                |o| match o {
                    Opening::Status(status) => stream_failed(status),
                    Opening::Failed(err) => err,
                },
                || stream_failed("no connection in time"),
            )
        })
}

/// Why a stream did not open.
enum Opening {
    /// The stream's call failed (in the transport, or at a member).
    Status(tonic::Status),
    Failed(Error),
}

/// Opens a stream whose first message refreshes `first` (the server answers the
/// stream's headers only with its first answer, so the first request goes before).
async fn open_once(channel: &Channel, first: i64) -> std::result::Result<Stream, Opening> {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready()
        .await
        .map_err(|e| Opening::Failed(stream_failed(e)))?;
    let (requests, rx) = mpsc::channel(1024);
    requests
        .send(KeepAliveRequest { id: first })
        .await
        .map_err(|e| Opening::Failed(stream_failed(e)))?;
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    // Like etcd's own clients: refuse to talk to a member cut off from its leader.
    request.metadata_mut().insert(
        "hasleader",
        tonic::metadata::MetadataValue::from_static("true"),
    );
    let codec = tonic_prost::ProstCodec::<KeepAliveRequest, KeepAliveResponse>::default();
    let answers = grpc
        .streaming(request, PathAndQuery::from_static(PATH), codec)
        .await
        .map_err(Opening::Status)?
        .into_inner();
    Ok(Stream { requests, answers })
}

/// The stream's next answer; never resolves while no stream is open.
async fn next_answer(
    stream: &mut Option<Stream>,
) -> std::result::Result<Option<KeepAliveResponse>, tonic::Status> {
    match stream {
        Some(s) => s.answers.message().await,
        None => std::future::pending().await,
    }
}

/// Callers waiting for an answer, per lease, oldest first, with their send time.
type Waiting = HashMap<i64, VecDeque<(Instant, oneshot::Sender<Result<i64>>)>>;

/// Drops the stream (if any) and fails every caller waiting on it. No caller waits
/// while no stream is open.
fn close(stream: &mut Option<Stream>, waiting: &mut Waiting, why: &str) {
    *stream = None;
    for (_, callers) in waiting.drain() {
        for (_, caller) in callers {
            let _ = caller.send(Err(stream_failed(why)));
        }
    }
}

async fn run(
    channel: Channel,
    mut commands: mpsc::UnboundedReceiver<Refresh>,
    timeout: Duration,
    resends: u32,
) {
    let mut stream: Option<Stream> = None;
    let mut waiting = Waiting::new();
    loop {
        // The oldest unanswered refresh bounds how long the stream may stay silent.
        let overdue = waiting
            .values()
            .filter_map(|callers| callers.front().map(|(sent, _)| *sent + timeout))
            .min();
        tokio::select! {
            command = commands.recv() => match command {
                None => return,
                // Its caller gave up already: nothing to send.
                Some(Refresh(_, caller)) if caller.is_closed() => {}
                Some(Refresh(lease, caller)) => {
                    let sent = Instant::now();
                    let delivered = if let Some(s) = &stream {
                        s.requests
                            .send(KeepAliveRequest { id: lease })
                            .await
                            .map_err(|_| stream_failed("closed"))
                    } else {
                        // A new stream carries the refresh as its first message.
                        open(&channel, lease, sent + timeout, resends)
                            .await
                            .map(|opened| stream = Some(opened))
                    };
                    match delivered {
                        Ok(()) => waiting.entry(lease).or_default().push_back((sent, caller)),
                        Err(err) => {
                            close(&mut stream, &mut waiting, "closed");
                            let _ = caller.send(Err(err));
                        }
                    }
                }
            },
            _ = sleep_until_some(overdue) => close(&mut stream, &mut waiting, "no answer in time"),
            answer = next_answer(&mut stream) => match answer {
                Ok(Some(KeepAliveResponse { id, ttl })) => {
                    if let Some(callers) = waiting.get_mut(&id) {
                        if let Some((_, caller)) = callers.pop_front() {
                            let _ = caller.send(Ok(ttl));
                        }
                        if callers.is_empty() {
                            waiting.remove(&id);
                        }
                    }
                }
                Ok(None) => close(&mut stream, &mut waiting, "ended by the server"),
                Err(status) => close(&mut stream, &mut waiting, status.message()),
            },
        }
    }
}

/// Sleeps until `at`; never resolves for `None`.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}
