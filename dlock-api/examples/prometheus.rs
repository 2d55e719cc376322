//! Serves dlock's metrics for Prometheus at http://127.0.0.1:9187/metrics while a demo
//! workload runs: workers contending on a few locks in two groups, some with timeouts.
//! Point Prometheus at it and import `dashboards/dlock-grafana.json` into Grafana.
//!
//! Run: `cargo run -p dlock-api --features metrics --example prometheus -- [ADDR] [SECONDS]`
//! (defaults 127.0.0.1:9187 and 60).

use std::time::{Duration, Instant};

use dlock_api::metrics::MetricsHandler;
use dlock_api::metrics::SECONDS_BUCKETS;
use dlock_api::{DistributeLockManager, InMemoryBackend};
use metrics_exporter_prometheus::PrometheusBuilder;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let addr: std::net::SocketAddr = args
        .next()
        .unwrap_or_else(|| "127.0.0.1:9187".into())
        .parse()?;
    let seconds: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(60);
    PrometheusBuilder::new()
        .set_buckets(SECONDS_BUCKETS)?
        .with_http_listener(addr)
        .install()?;
    println!("serving http://{addr}/metrics for {seconds}s");

    let store = InMemoryBackend::new();
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut workers = Vec::new();
    for w in 0..6 {
        let manager = DistributeLockManager::builder(store.clone())
            .with_handler(MetricsHandler::default())
            .lease(Duration::from_secs(3))
            .build()?;
        workers.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < end {
                let name = if n.is_multiple_of(3) {
                    format!("reports:{}", n % 2)
                } else {
                    format!("orders:{}", n % 4)
                };
                if let Ok(Some(guard)) = manager
                    .lock(&name)
                    .try_lock(Duration::from_millis(20))
                    .await
                {
                    tokio::time::sleep(Duration::from_millis(5 + (w * 3) as u64)).await;
                    let _ = guard.unlock().await;
                }
                n += 1;
            }
            manager.close().await;
        }));
    }
    for w in workers {
        w.await?;
    }
    Ok(())
}
