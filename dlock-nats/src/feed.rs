//! A lock's contenders as the stream tells them: an ordered consumer on the lock's
//! contender keys, delivering each key's value (the snapshot) and then every change
//! as it is stored (the consumer starts over from where it was if one goes
//! missing). Contender keys are written once and deleted once, so after the
//! snapshot the view holds every contender that exists, and stays so.
//!
//! Every message carries the server's timestamp of its write, so the feed also
//! knows a lower bound of the server's clock: the latest timestamp read, plus the
//! time this process counted since it read it. Leases are judged against it —
//! never against this machine's wall clock.

use std::collections::BTreeMap;
use std::time::Instant;

use async_nats::jetstream::consumer::push::{Ordered, OrderedConfig};
use async_nats::jetstream::consumer::{DeliverPolicy, ReplayPolicy};
use async_nats::jetstream::kv::Store;
use async_nats::Client;
use dlock_spi::Result;
use futures_util::StreamExt;

use crate::error::map_nats;
use crate::keys::{parse_key, KeyParts, Stored};

/// One live contender.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    /// What its key says.
    pub(crate) parts: KeyParts,
    /// The stream sequence of its latest write.
    pub(crate) revision: u64,
    /// The server's timestamp of its latest write (ns since the epoch).
    pub(crate) written_ns: i128,
    /// Its value.
    pub(crate) stored: Stored,
}

impl Seen {
    /// Its fencing token: the revision of its key's first write.
    pub(crate) fn token(&self) -> u64 {
        if self.stored.token == 0 {
            self.revision
        } else {
            self.stored.token
        }
    }

    /// When its lease ends on the server's clock (ns since the epoch).
    pub(crate) fn expires_ns(&self) -> i128 {
        self.written_ns + i128::try_from(self.stored.lease.as_nanos()).unwrap_or(i128::MAX / 2)
    }
}

/// The latest server timestamp read, and when.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stamp {
    server_ns: i128,
    read_at: Instant,
}

impl Stamp {
    /// A lower bound of the server's clock now (ns since the epoch).
    pub(crate) fn now_ns(&self) -> i128 {
        self.server_ns + i128::try_from(self.read_at.elapsed().as_nanos()).unwrap_or(0)
    }
}

/// The contenders of one lock, kept current from the stream.
pub(crate) struct Feed {
    messages: Ordered,
    /// Live contenders by key.
    pub(crate) entries: BTreeMap<String, Seen>,
    /// The latest server timestamp read; `None` before any message.
    pub(crate) stamp: Option<Stamp>,
    prefix: String,
}

impl Feed {
    /// Opens the feed of the keys under `filter` (after the bucket's prefix) and
    /// reads the snapshot: every key's latest value.
    pub(crate) async fn open(client: &Client, store: &Store, filter: &str) -> Result<Feed> {
        let consumer = store
            .stream
            .create_consumer(OrderedConfig {
                deliver_subject: client.new_inbox(),
                filter_subject: format!("{}{filter}", store.prefix),
                deliver_policy: DeliverPolicy::LastPerSubject,
                replay_policy: ReplayPolicy::Instant,
                ..Default::default()
            })
            .await
            .map_err(|e| map_nats(e, "watch the lock's keys"))?;
        let pending = consumer.cached_info().num_pending;
        let messages = consumer
            .messages()
            .await
            .map_err(|e| map_nats(e, "watch the lock's keys"))?;
        let mut feed = Feed {
            messages,
            entries: BTreeMap::new(),
            stamp: None,
            prefix: store.prefix.clone(),
        };
        // The snapshot: the `pending` keys there were, oldest first. A contender's
        // key is written once, so one of them missing from the stream when its
        // turn comes was deleted — and its delete marker follows. After `pending`
        // messages every key made before the feed opened that still exists has
        // been read; later keys (and deletions) follow in order.
        for _ in 0..pending {
            feed.next().await?;
        }
        Ok(feed)
    }

    /// Reads the next change and applies it; answers how many more the server has
    /// ready (as the server counts). Cancel safe: a change is applied once read, or stays to be read.
    pub(crate) async fn next(&mut self) -> Result<u64> {
        let message = match self.messages.next().await {
            Some(Ok(message)) => message,
            Some(Err(e)) => return Err(map_nats(e, "watch the lock's keys")),
            None => return Err(map_nats("the watch ended", "watch the lock's keys")),
        };
        let info = message
            .info()
            .map_err(|e| map_nats(e, "read a watched change"))?;
        let (revision, pending) = (info.stream_sequence, info.pending);
        let written_ns = info.published.unix_timestamp_nanos();
        if self.stamp.is_none_or(|s| s.server_ns < written_ns) {
            self.stamp = Some(Stamp {
                server_ns: written_ns,
                read_at: Instant::now(),
            });
        }
        let Some(key) = message.subject.as_str().strip_prefix(&self.prefix) else {
            return Ok(pending);
        };
        let removed = message.headers.as_ref().is_some_and(|h| {
            h.get("KV-Operation")
                .is_some_and(|op| matches!(op.as_str(), "DEL" | "PURGE"))
                || h.get("Nats-Marker-Reason").is_some()
        });
        let parsed = parse_key(key).zip(Stored::decode(&message.payload));
        match parsed {
            Some((parts, stored)) if !removed => {
                self.entries.insert(
                    key.to_owned(),
                    Seen {
                        parts,
                        revision,
                        written_ns,
                        stored,
                    },
                );
            }
            _ => {
                self.entries.remove(key);
            }
        }
        Ok(pending)
    }
}
