//! The test backends the runner can open, by label.

use std::sync::Arc;

use async_trait::async_trait;
use std::sync::Mutex;

use dlock_jdbc::JdbcBackend;
use dlock_redis::{RedisBackend, RedisOptions};
use dlock_spi::{
    Error, ErrorKind, InMemoryBackend, LockAdmin, LockName, LockRemoteResource, Result,
};

use crate::TestBackend;

/// Every label the runner understands.
pub const KNOWN: &[&str] = &[
    "memory",
    "sqlite",
    "mysql",
    "postgres",
    "redis",
    "redis-cluster",
];

/// The URL a server-backed label uses: `DLOCK_<LABEL>_URL`, or the local default
/// (MariaDB root with no password and PostgreSQL trust auth, database `test`, on
/// 127.0.0.1; SQLite in a fresh temporary file).
pub fn sql_url(label: &str) -> Option<String> {
    let var = format!("DLOCK_{}_URL", label.to_ascii_uppercase().replace('-', "_"));
    if let Ok(url) = std::env::var(&var) {
        return Some(url);
    }
    match label {
        "sqlite" => {
            let file =
                std::env::temp_dir().join(format!("dlock-test-{:016x}.db", fastrand::u64(..)));
            Some(format!("sqlite://{}", file.display()))
        }
        "mysql" => Some("mysql://root@127.0.0.1:3306/test".to_owned()),
        "postgres" => Some("postgres://postgres@127.0.0.1:5432/test".to_owned()),
        "redis" | "redis-polling" => std::env::var("DLOCK_REDIS_URL")
            .ok()
            .or_else(|| Some("redis://127.0.0.1:6379".to_owned())),
        "redis-cluster" => {
            Some("redis+cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002".to_owned())
        }
        _ => None,
    }
}

/// Opens a fresh test backend for one case. Unknown labels and unreachable backends
/// are errors (the runner turns them into failures).
pub async fn open(label: &str) -> Result<Arc<dyn TestBackend>> {
    match label {
        "memory" => Ok(Arc::new(MemoryTestBackend::default())),
        "sqlite" | "mysql" | "postgres" => {
            let url = sql_url(label).unwrap_or_default();
            Ok(Arc::new(SqlTestBackend::open(label, url).await?))
        }
        "redis" | "redis-polling" | "redis-cluster" => {
            let url = sql_url(label).unwrap_or_default();
            Ok(Arc::new(RedisTestBackend::open(label, url).await?))
        }
        other => Err(Error::new(
            ErrorKind::Config,
            format!(
                "unknown test backend {other:?} in DLOCK_TEST_BACKENDS; known: {}",
                KNOWN.join(", ")
            ),
        )),
    }
}

/// The in-memory backend; one instance per case, shared by all its clients.
#[derive(Default)]
pub struct MemoryTestBackend {
    backend: InMemoryBackend,
}

#[async_trait]
impl TestBackend for MemoryTestBackend {
    fn label(&self) -> &'static str {
        "memory"
    }

    async fn client(&self) -> Result<Arc<dyn LockRemoteResource>> {
        Ok(Arc::new(self.backend.clone()))
    }

    async fn steal(&self, name: &LockName) -> Result<()> {
        self.backend.force_release(name);
        Ok(())
    }

    async fn live_state(&self, _prefix: &str) -> Result<usize> {
        // One instance per case: everything in it belongs to the case.
        Ok(self.backend.active_locks())
    }

    fn acquire_attempts(&self) -> Option<u64> {
        Some(self.backend.acquire_attempts())
    }
}

/// A SQL database; every client is a new connection pool, as another process would have.
pub struct SqlTestBackend {
    label: &'static str,
    url: String,
    admin: JdbcBackend,
    clients: Mutex<Vec<JdbcBackend>>,
}

impl SqlTestBackend {
    /// Connects (and migrates) once, so an unreachable database fails here.
    pub async fn open(label: &str, url: String) -> Result<Self> {
        let label = match label {
            "sqlite" => "sqlite",
            "mysql" => "mysql",
            _ => "postgres",
        };
        let admin = JdbcBackend::connect(&url).await?;
        Ok(SqlTestBackend {
            label,
            url,
            admin,
            clients: Mutex::new(Vec::new()),
        })
    }
}

#[async_trait]
impl TestBackend for SqlTestBackend {
    fn label(&self) -> &'static str {
        self.label
    }

    async fn client(&self) -> Result<Arc<dyn LockRemoteResource>> {
        let client = JdbcBackend::connect(&self.url).await?;
        self.clients.lock().expect("clients").push(client.clone());
        Ok(Arc::new(client))
    }

    async fn steal(&self, name: &LockName) -> Result<()> {
        self.admin.force_release(name).await.map(drop)
    }

    async fn live_state(&self, prefix: &str) -> Result<usize> {
        self.admin.live_locks(prefix).await
    }

    fn acquire_attempts(&self) -> Option<u64> {
        let clients = self.clients.lock().expect("clients");
        Some(clients.iter().map(JdbcBackend::acquire_attempts).sum())
    }
}

impl Drop for SqlTestBackend {
    fn drop(&mut self) {
        if let Some(path) = self.url.strip_prefix("sqlite://") {
            if path.contains("dlock-test-") {
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{path}{suffix}"));
                }
            }
        }
    }
}

/// Redis (single node or Cluster); every client is a new connection, as another
/// process would have.
pub struct RedisTestBackend {
    label: &'static str,
    url: String,
    admin: RedisBackend,
    clients: Mutex<Vec<RedisBackend>>,
}

impl RedisTestBackend {
    /// Connects once, so an unreachable server fails here.
    pub async fn open(label: &str, url: String) -> Result<Self> {
        let label = if label == "redis" {
            "redis"
        } else {
            "redis-cluster"
        };
        let admin = RedisBackend::connect(&url).await?;
        admin.live_locks("").await?; // a round trip: reachable, not just configured
        Ok(RedisTestBackend {
            label,
            url,
            admin,
            clients: Mutex::new(Vec::new()),
        })
    }
}

#[async_trait]
impl TestBackend for RedisTestBackend {
    fn label(&self) -> &'static str {
        self.label
    }

    async fn client(&self) -> Result<Arc<dyn LockRemoteResource>> {
        let options = if self.label == "redis-polling" {
            RedisOptions::default().polling(dlock_spi::Backoff::default())
        } else {
            RedisOptions::default()
        };
        let client = RedisBackend::connect_with(&self.url, options).await?;
        self.clients.lock().expect("clients").push(client.clone());
        Ok(Arc::new(client))
    }

    async fn steal(&self, name: &LockName) -> Result<()> {
        self.admin.force_release(name).await.map(drop)
    }

    async fn live_state(&self, prefix: &str) -> Result<usize> {
        self.admin.live_locks(prefix).await
    }

    fn acquire_attempts(&self) -> Option<u64> {
        let clients = self.clients.lock().expect("clients");
        Some(clients.iter().map(RedisBackend::acquire_attempts).sum())
    }
}
