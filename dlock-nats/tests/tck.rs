//! The dlock compatibility kit on this backend, as any backend's own test runs it:
//! one trial per conformance case (`cargo test -p dlock-nats --test tck`), on the
//! NATS server at `DLOCK_NATS_URL` (default `nats://127.0.0.1:4222`, JetStream on).

use std::sync::Arc;

mod common;

use dlock_nats::NatsBackend;
use dlock_tck::{AdminTestBackend, TestBackend};

fn main() -> std::process::ExitCode {
    // A run that selects backends and leaves this one out runs none of its trials
    // (`DLOCK_TEST_BACKENDS`, as the workspace's test scripts set it); one that
    // selects it, or sets nothing, needs the server.
    if !dlock_tck::runner::selected("nats") {
        let args = dlock_tck::libtest_mimic::Arguments::from_args();
        return dlock_tck::libtest_mimic::run(&args, Vec::new()).exit_code();
    }
    // Release markers kept 10 min (the cases' leases are seconds): under the
    // default 24 h they piled up run after run and slowed every watch.
    let url = common::bucket_url("dlock_kit?max_age=10m");
    dlock_tck::run("nats", move || {
        let url = url.clone();
        async move {
            let backend = AdminTestBackend::open("nats", move || {
                let url = url.clone();
                async move { NatsBackend::connect(&url).await }
            })
            .await?;
            Ok(Arc::new(backend) as Arc<dyn TestBackend>)
        }
    })
}
