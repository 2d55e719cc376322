//! One task, uncontended: acquire+release cycles per second on each SQL backend,
//! through dlock's user API and through the SPI, against the floor — a raw
//! single-statement set-if-absent and a single-statement owner-guarded delete on the
//! same connection pool — in the same run, interleaved in rounds.
//!
//! Run: `cargo bench -p testsuite --bench sql` (backends from DLOCK_TEST_BACKENDS,
//! default sqlite,mysql,postgres; seconds per measurement from DLOCK_BENCH_SECS).
//! Under `cargo test` it runs a short smoke pass instead.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_api::DistributeLockManager;
use dlock_jdbc::{sqlx, JdbcBackend, SqlPool};
use dlock_spi::{AcquireRequest, LockName, LockRemoteResource, OwnerId};

/// The SQL labels among `labels`, each with the suite's URL (SQLite: a temporary
/// file, removed when its URL is dropped).
fn urls(labels: &str) -> Vec<(String, testsuite::backends::TestUrl)> {
    labels
        .split(',')
        .map(str::trim)
        .filter(|l| matches!(*l, "sqlite" | "mysql" | "postgres"))
        .filter_map(|l| Some((l.to_owned(), testsuite::backends::server_url(l)?)))
        .collect()
}

/// The floor: the minimum a lease lock needs, one statement each way.
struct Floor {
    pool: SqlPool,
    acquire: &'static str,
    release: &'static str,
}

impl Floor {
    async fn new(pool: SqlPool) -> Self {
        let (create, acquire, release) = match &pool {
            SqlPool::Sqlite(_) => (
                "CREATE TABLE IF NOT EXISTS bench_floor (name TEXT PRIMARY KEY, owner TEXT NOT NULL, expires_at INTEGER NOT NULL)",
                "INSERT INTO bench_floor (name, owner, expires_at) VALUES (?1, ?2, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) + 30000) ON CONFLICT (name) DO NOTHING",
                "DELETE FROM bench_floor WHERE name = ?1 AND owner = ?2",
            ),
            SqlPool::MySql(_) => (
                "CREATE TABLE IF NOT EXISTS bench_floor (name VARBINARY(512) PRIMARY KEY, owner VARCHAR(255) NOT NULL, expires_at BIGINT NOT NULL)",
                "INSERT IGNORE INTO bench_floor (name, owner, expires_at) VALUES (?, ?, CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) + 30000)",
                "DELETE FROM bench_floor WHERE name = ? AND owner = ?",
            ),
            SqlPool::Postgres(_) => (
                "CREATE TABLE IF NOT EXISTS bench_floor (name TEXT PRIMARY KEY, owner TEXT NOT NULL, expires_at BIGINT NOT NULL)",
                "INSERT INTO bench_floor (name, owner, expires_at) VALUES ($1, $2, (EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::BIGINT + 30000) ON CONFLICT (name) DO NOTHING",
                "DELETE FROM bench_floor WHERE name = $1 AND owner = $2",
            ),
            _ => unreachable!("all drivers are enabled in the testsuite"),
        };
        match &pool {
            SqlPool::Sqlite(p) => drop(sqlx::query(create).execute(p).await.unwrap()),
            SqlPool::MySql(p) => drop(sqlx::query(create).execute(p).await.unwrap()),
            SqlPool::Postgres(p) => drop(sqlx::query(create).execute(p).await.unwrap()),
            _ => {}
        }
        Floor {
            pool,
            acquire,
            release,
        }
    }

    async fn cycle(&self, name: &str, owner: &str) {
        macro_rules! run {
            ($p:expr) => {{
                let got = sqlx::query(self.acquire)
                    .bind(name)
                    .bind(owner)
                    .execute($p)
                    .await
                    .unwrap();
                assert_eq!(
                    got.rows_affected(),
                    1,
                    "floor acquire failed: the row exists"
                );
                let gone = sqlx::query(self.release)
                    .bind(name)
                    .bind(owner)
                    .execute($p)
                    .await
                    .unwrap();
                assert_eq!(gone.rows_affected(), 1);
            }};
        }
        match &self.pool {
            SqlPool::Sqlite(p) => run!(p),
            SqlPool::MySql(p) => run!(p),
            SqlPool::Postgres(p) => run!(p),
            _ => {}
        }
    }
}

/// Runs `cycle` for `secs`, returning cycles per second.
async fn measure<F, Fut>(secs: Duration, mut cycle: F) -> (u64, Duration)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < secs {
        cycle().await;
        n += 1;
    }
    (n, start.elapsed())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let bench = testsuite::bench::is_bench();
    let labels =
        std::env::var("DLOCK_TEST_BACKENDS").unwrap_or_else(|_| "sqlite,mysql,postgres".into());
    let secs = if bench {
        Duration::from_secs_f64(
            std::env::var("DLOCK_BENCH_SECS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(2.0),
        )
    } else {
        Duration::from_millis(100) // smoke pass under `cargo test`
    };
    let rounds = if bench { 3 } else { 1 };
    println!("| backend | floor (raw 1+1 statements) | dlock SPI | dlock API (manager, guard, watchdog) | API / floor |");
    println!("|---|---|---|---|---|");
    for (label, url) in urls(&labels) {
        let backend = JdbcBackend::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("{label}: {e}"));
        let floor = Floor::new(backend.sqlx_pool().clone()).await;
        let resource: Arc<dyn LockRemoteResource> = Arc::new(backend.clone());
        let manager = DistributeLockManager::builder(backend.clone())
            .build()
            .unwrap();
        let tag = format!("bench{:x}", std::process::id());
        let lock = manager.lock(&format!("{tag}:api"));
        let spi_name = LockName::new(format!("{tag}:spi")).unwrap();
        let owner = OwnerId::new(format!("{tag}-owner"));
        let acquire =
            AcquireRequest::new(spi_name.clone(), owner.clone(), dlock_spi::GrantId::new(1));
        let floor_name = format!("{tag}:floor");

        // Warm the pool and the statement caches.
        for _ in 0..20 {
            floor.cycle(&floor_name, "w").await;
        }
        let (mut f, mut s, mut a) = (
            (0, Duration::ZERO),
            (0, Duration::ZERO),
            (0, Duration::ZERO),
        );
        for _ in 0..rounds {
            let r = measure(secs, || floor.cycle(&floor_name, "owner")).await;
            f = (f.0 + r.0, f.1 + r.1);
            let r = measure(secs, || testsuite::bench::spi_cycle(&*resource, &acquire)).await;
            s = (s.0 + r.0, s.1 + r.1);
            let r = measure(secs, || async {
                testsuite::bench::api_cycle(&lock).await;
            })
            .await;
            a = (a.0 + r.0, a.1 + r.1);
        }
        let rate = |(n, t): (u64, Duration)| n as f64 / t.as_secs_f64();
        println!(
            "| {label} | {:.0}/s | {:.0}/s | {:.0}/s | **{:.2}×** |",
            rate(f),
            rate(s),
            rate(a),
            rate(a) / rate(f)
        );
        manager.close().await;
        backend.close().await;
        // (A SQLite file of the suite's goes with its URL, here.)
        drop(url);
    }
}
