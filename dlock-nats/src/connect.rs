//! Connecting to the servers, and the bucket the locks live in — bound if it
//! exists, made if not.
//!
//! The bucket is made with JetStream's own stream API rather than the client's
//! `create_key_value`, whose answer some server versions (2.9) word so that newer
//! clients cannot read it; binding to a bucket works on every version.

use std::time::Duration;

use async_nats::jetstream::{self, kv::Store};
use async_nats::{Client, ConnectOptions};
use dlock_spi::{Error, ErrorKind, Result};

use crate::config::{NatsAuth, NatsOptions};
use crate::error::map_nats;

/// Connects to `servers` (`host:port`) as `options` say.
pub(crate) async fn connect(servers: &[String], options: &NatsOptions) -> Result<Client> {
    let scheme = if options.tls { "tls" } else { "nats" };
    let mut addrs = Vec::with_capacity(servers.len());
    for server in servers {
        let addr: async_nats::ServerAddr = format!("{scheme}://{server}").parse().map_err(|e| {
            Error::new(
                ErrorKind::Config,
                format!("NATS server address {server:?}: {e}"),
            )
        })?;
        addrs.push(addr);
    }
    let mut connect = ConnectOptions::new()
        .name("dlock")
        .connection_timeout(options.connect_timeout)
        .request_timeout(Some(options.timeout))
        .require_tls(options.tls);
    match &options.auth {
        Some(NatsAuth::UserPassword { user, password }) => {
            connect = connect.user_and_password(user.clone(), password.clone());
        }
        Some(NatsAuth::Token(token)) => connect = connect.token(token.clone()),
        None => {}
    }
    if let Some(ca) = &options.tls_ca {
        connect = connect.add_root_certificates(ca.clone());
    }
    if let Some((cert, key)) = &options.tls_client {
        connect = connect.add_client_certificate(cert.clone(), key.clone());
    }
    connect.connect(addrs).await.map_err(|e| {
        Error::new(
            ErrorKind::Backend,
            format!(
                "cannot connect to NATS at {}: {e}; check that the server runs with JetStream (-js) and the URL is right",
                servers.join(",")
            ),
        )
    })
}

/// The bucket `options.bucket` on `client`'s servers, made (file storage, one
/// value per key, keys dropped after `options.max_age`) if it does not exist.
pub(crate) async fn bucket(client: &Client, options: &NatsOptions) -> Result<Store> {
    let js = jetstream::new(client.clone());
    if let Ok(store) = js.get_key_value(options.bucket.as_str()).await {
        return Ok(store);
    }
    make_bucket(client, &options.bucket, options.max_age).await?;
    js.get_key_value(options.bucket.as_str())
        .await
        .map_err(|e| map_nats(e, "bind the key-value bucket"))
}

/// Makes bucket `bucket` with JetStream's stream API; one that exists already (a
/// client that made it first) is fine.
async fn make_bucket(client: &Client, bucket: &str, max_age: Duration) -> Result<()> {
    let nanos = i64::try_from(max_age.as_nanos()).unwrap_or(i64::MAX);
    let window = nanos.min(120_000_000_000);
    let config = serde_json::json!({
        "name": format!("KV_{bucket}"),
        "subjects": [format!("$KV.{bucket}.>")],
        "retention": "limits",
        "max_consumers": -1,
        "max_msgs_per_subject": 1,
        "max_msgs": -1,
        "max_bytes": -1,
        "max_age": nanos,
        "max_msg_size": -1,
        "storage": "file",
        "discard": "new",
        "num_replicas": 1,
        "duplicate_window": window,
        "allow_rollup_hdrs": true,
        "deny_delete": true,
        "deny_purge": false,
        "allow_direct": true,
    });
    let answer = client
        .request(
            format!("$JS.API.STREAM.CREATE.KV_{bucket}"),
            config.to_string().into(),
        )
        .await
        .map_err(|e| map_nats(e, "make the key-value bucket"))?;
    let answer: serde_json::Value = serde_json::from_slice(&answer.payload).map_err(|e| {
        Error::new(
            ErrorKind::Backend,
            format!("NATS answered the bucket's creation with {e}"),
        )
    })?;
    match answer.get("error") {
        // 10058: a stream of that name exists (made meanwhile).
        Some(err) if err.get("err_code").and_then(|c| c.as_u64()) != Some(10058) => Err(Error::new(
            ErrorKind::Backend,
            format!("NATS refused to make bucket {bucket:?}: {err}; is JetStream enabled (nats-server -js)?"),
        )),
        _ => Ok(()),
    }
}
