//! # dlock-redis — Redis backend for dlock
//!
//! A [`LockRemoteResource`](dlock_spi::LockRemoteResource) on the `redis` crate, for a
//! single server, a master behind Redis Sentinel, and Redis Cluster.
//!
//! ```no_run
//! # async fn demo() -> dlock_spi::Result<()> {
//! let single = dlock_redis::RedisBackend::connect("redis://127.0.0.1:6379").await?;
//! let cluster = dlock_redis::RedisBackend::connect(
//!     "redis+cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002").await?;
//! let sentinel = dlock_redis::RedisBackend::connect(
//!     "redis+sentinel://127.0.0.1:26379,127.0.0.1:26380,127.0.0.1:26381/mymaster").await?;
//! # Ok(()) }
//! ```
//!
//! ## How it works
//!
//! * **Keys** `<prefix>{<name>}:…` — the hash tag puts every key of a lock in one
//!   Cluster slot; `%`, `{` and `}` in names are percent-encoded so no name reaches
//!   another lock's keys.
//! * **One round trip per operation**: acquire, release and renew are Lua scripts
//!   (loaded once, run by SHA). Acquire sets the holder (owner and context) with a
//!   `PX` lease and advances the fencing counter atomically; the common case
//!   (non-fair, exclusive, free) is `SET NX PX` plus the token (`TIME`, `GET`, `SET`),
//!   and a release nobody
//!   waits for is `GET`, `DEL` and one `EXISTS`. Readers occupy the same key while they
//!   hold. Expiry is judged by the server (`PX`, `TIME`), never by a client clock.
//! * **Semaphores**: permit holders share the readers' keys of the name (a sorted set
//!   by expiry, a hash of tokens, contexts and permits, and the total while held);
//!   one script decides a grant from the live holders' permits, in arrival order.
//! * **Fencing**: a per-lock counter (no expiry); a grant takes
//!   `max(counter + 1, server clock in µs)`, as the SQL backend does. Strictly
//!   increasing on one server; and after a failover to a replica whose counter lags
//!   (it missed the last grants), or after the counter was deleted, the clock still
//!   puts the next token above every earlier one — provided the new primary's clock
//!   is not behind the old one's by more than the time since those grants. It
//!   advances only on a grant, so while a writer holds the lock the counter is the
//!   writer's token (reentry returns it). It is the one key that outlives a release.
//! * **Waiting without polling storms**: one pub/sub connection per backend,
//!   subscribed once to the backend's own channel, carries release notices. A waiter
//!   that must wait queues on the server (a sorted set ordered by the server clock,
//!   with a liveness deadline per waiter that its re-checks refresh, the channel of
//!   its backend and, for a writer, the holder value it would hold with); a release
//!   deals with the queue's live head in one message on that head's channel and
//!   exactly that waiter wakes — one message and one waiter in all however many
//!   clients wait, so no herd, and none when nobody waits. **Hand-over**: when the
//!   head is a writer, the release grants it the lock in the same script (a
//!   provisional lease of the head's remaining liveness, the next fencing token, both
//!   in the notice), and the head holds from the notice on — no attempt of its own —
//!   while the manager's first renewal extends the lease; a head that died meanwhile
//!   costs at most its liveness. Dead waiters are skipped once their liveness lapses.
//!   Fair mode: only the head may take a free lock. Non-fair: whoever asks first
//!   takes a free lock (newcomers barge), but a release with a writer at the head of
//!   the queue hands the lock to it, and one with a reader or permit head that has
//!   waited 20 ms sets the free lock aside for it, so no queued waiter starves. A
//!   waiter that gives up or is dropped leaves the queue at once (giving back a lock
//!   handed to it that it never took up). A polling waiter (no notices) is handed
//!   the lock only once it has waited 20 ms — it takes it up at its next poll — so
//!   polling non-fair waiters are passed for at most that long.
//!   Every waiter also re-checks when the holder's lease runs out, so a crashed
//!   holder is noticed without a message. [`RedisOptions::polling`] replaces pub/sub
//!   with backoff polling; polling waiters queue the same way.
//! * **Read-write locks**: readers in a sorted set with per-reader expiry; new readers
//!   stand back for a writer queued before them (writers are not starved), and a
//!   writer leaving the queue tells the readers behind it.
//! * **TLS** (`rediss://`, and `rediss+cluster://` for a Cluster; feature `tls`,
//!   rustls): the server is verified against the system's roots or a given CA
//!   ([`RedisOptions::tls_root_certificate`], URL parameter `tls_ca=<pem file>`); a
//!   client certificate can be presented ([`RedisOptions::tls_identity`],
//!   `tls_cert=<file>&tls_key=<file>`). The redis crate builds its TLS configuration
//!   from the process' default rustls crypto provider and takes no other: the
//!   application installs it, early in `main` and before connecting
//!   (`rustls::crypto::ring::default_provider().install_default()`, or aws-lc-rs').
//!   dlock installs none; connecting without one is a [`dlock_spi::ErrorKind::Config`]
//!   error that says so.
//! * **Sentinel** (`redis+sentinel://s1:26379,s2:26379/<master>[/<db>]`,
//!   `rediss+sentinel://` over TLS): the master is looked up through the sentinels and
//!   confirmed with `ROLE`; a lost connection, a `READONLY`/`MASTERDOWN` answer or a
//!   sentinel's `+switch-master` announcement makes the backend look it up again, and
//!   the release-notice connection subscribes on the new master (queued waiters
//!   re-check when it does, and re-queue there if the failover lost their entry).
//!   Redis replicates asynchronously: a failover can lose grants and renewals the
//!   promoted replica had not received, and for about the failover's length clients
//!   may still write to the old master — use `replica_ack` (SAFETY.md has the
//!   figures for both).
//! * **Redlock** ([`RedlockBackend`], `redlock://h1:6379,h2:6379,h3:6379`): one lock
//!   over independent masters, held while a majority holds it; fencing tokens
//!   written back to a quorum so they increase (see the type's module docs).
//! * **Replica acknowledgement** ([`RedisOptions::replica_ack`], single node or
//!   Sentinel): after an acquire or a renewal, `WAIT n timeout`. An acquire with fewer
//!   acknowledgements is released and fails; a renewal fails (the lease stands as last
//!   acknowledged). Behind Sentinel the wait counts only on the connection the write
//!   went out on: if the master changed in between, the call fails, retryably.
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod acquire;
mod admin;
mod backend;
mod cluster_batch;
mod config;
mod connect;
mod connection;
mod error;
mod feed;
mod keys;
mod node_groups;
mod notices;
mod redlock;
mod renew_batch;
mod scripts;
mod sentinel;
mod tls;

pub use backend::RedisBackend;
pub use config::{RedisOptions, SentinelAuth};
pub use dlock_spi::TlsIdentity;
/// The `redis` crate this backend is built on: an application hands its own
/// `redis::Client` to [`RedisBackend::from_client`] (and the cluster, Sentinel and
/// Redlock constructors) from this re-export, so the versions always match.
pub use redis;
pub use redlock::RedlockBackend;

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
