//! An axum service where requests with the same `Idempotency-Key` header run one at a
//! time across every replica (they share the lock backend); a concurrent duplicate gets
//! 409 Conflict instead of running twice.
//!
//! Run: `cargo run -p dlock-api --features tower --example axum_idempotency -- [ADDR] [SECONDS]`
//! then e.g. `curl -X POST -H 'Idempotency-Key: abc' http://127.0.0.1:3000/pay`.

use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use dlock_api::tower::{LockLayer, LockedError};
use dlock_api::DistributeLockManager;
use tower::ServiceBuilder;

async fn pay() -> &'static str {
    tokio::time::sleep(Duration::from_millis(300)).await; // the work being protected
    "paid\n"
}

async fn busy(err: LockedError<std::convert::Infallible>) -> (StatusCode, String) {
    match err {
        LockedError::Busy { .. } => (
            StatusCode::CONFLICT,
            "a request with this key is in progress\n".into(),
        ),
        other => (StatusCode::SERVICE_UNAVAILABLE, format!("{other}\n")),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:3000".into());
    let seconds: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(60);
    // Use a shared backend in production, e.g. DistributeLockManager::connect("redis://…").
    let manager = DistributeLockManager::connect("memory://").await?;
    let idempotency = LockLayer::new(manager, |req: &Request| {
        req.headers()
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .map(|k| format!("pay:{k}"))
    });
    let app = Router::new().route(
        "/pay",
        post(pay).layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(busy))
                .layer(idempotency),
        ),
    );
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on http://{addr} for {seconds}s");
    tokio::select! {
        served = axum::serve(listener, app) => served?,
        _ = tokio::time::sleep(Duration::from_secs(seconds)) => {}
    }
    Ok(())
}
