//! The lock-history checker on this backend, as any backend's own test runs it
//! (`dlock_tck::lockcheck`): one 6 s run per worker-side nemesis — stopped,
//! killed and network-faulted worker processes (this binary, re-executed) — each
//! a trial failing on any violation, on the NATS server at `DLOCK_NATS_URL`
//! (default `nats://127.0.0.1:4222`, JetStream on). A server restart is this
//! repository's run (`testsuite`, `server_nemesis::nats::restart`): it needs the
//! scripts that started the server.

use std::sync::Arc;

mod common;
use std::time::Duration;

use dlock_nats::NatsBackend;
use dlock_tck::lockcheck::{as_worker, trial, Deployment, Nemesis};
use dlock_tck::{AdminTestBackend, TestBackend};

/// The server's bucket for these runs: release markers kept 10 min (the runs'
/// leases are seconds; under the default 24 h they piled up and slowed every
/// watch — 5× fewer operations with 100 000 of them).
struct Nats {
    url: String,
}

#[dlock_spi::async_trait]
impl Deployment for Nats {
    fn label(&self) -> String {
        "nats".to_owned()
    }

    fn url(&self) -> Option<String> {
        Some(self.url.clone())
    }

    async fn open(&self, url: &str) -> Result<Arc<dyn TestBackend>, String> {
        let url = url.to_owned();
        let backend = AdminTestBackend::open("nats", move || {
            let url = url.clone();
            async move { NatsBackend::connect(&url).await }
        })
        .await
        .map_err(|e| e.to_string())?;
        Ok(Arc::new(backend))
    }
}

fn nats() -> Arc<dyn Deployment> {
    Arc::new(Nats {
        url: common::bucket_url("dlock_lockcheck?max_age=10m"),
    })
}

fn main() -> std::process::ExitCode {
    if let Some(exit) = as_worker(|_| Ok(nats())) {
        return exit;
    }
    let args = dlock_tck::libtest_mimic::Arguments::from_args();
    // A run that selects backends and leaves this one out runs none of its trials.
    if !dlock_tck::runner::selected("nats") {
        return dlock_tck::libtest_mimic::run(&args, Vec::new()).exit_code();
    }
    let trials = [Nemesis::Stop, Nemesis::Kill, Nemesis::Proxy]
        .map(|nemesis| trial(nats(), nemesis, Duration::from_secs(6)))
        .into();
    dlock_tck::libtest_mimic::run(&args, trials).exit_code()
}
