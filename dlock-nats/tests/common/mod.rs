//! What every test binary of this crate shares: the server's address.

/// The bucket `bucket_and_options` (e.g. `dlock_kit?max_age=10m`) on the NATS server
/// at `DLOCK_NATS_URL` (a server's address, as the workspace's scripts export it;
/// default `nats://127.0.0.1:4222`, JetStream on).
pub(crate) fn bucket_url(bucket_and_options: &str) -> String {
    let server =
        std::env::var("DLOCK_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned());
    format!("{}/{bucket_and_options}", server.trim_end_matches('/'))
}
