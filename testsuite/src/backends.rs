//! The test backends the runner can open, by label.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use std::sync::Mutex;

use dlock_etcd::EtcdBackend;
use dlock_jdbc::{JdbcBackend, JdbcOptions};
use dlock_redis::{RedisBackend, RedisOptions, RedlockBackend};
use dlock_spi::{
    Error, ErrorKind, InMemoryBackend, LockAdmin, LockName, LockRemoteResource, Result,
};
use dlock_zk::ZkBackend;

use crate::lockcheck::broken::{BrokenBackend, Flaw};
use crate::TestBackend;

/// The session timeout of the session-mode labels (`postgres-session`,
/// `mysql-session`): a vanished client's locks come free within it (the
/// lock-history checker's hold life there).
pub const SESSION_MODE_TIMEOUT: Duration = Duration::from_secs(4);

/// Whether `label` runs a SQL backend in its session mode (a hold lives as long as
/// its server session).
pub fn is_session_mode(label: &str) -> bool {
    matches!(label, "postgres-session" | "mysql-session")
}

/// Replicas of the Sentinel deployment's master (scripts/lib/services.sh).
pub const SENTINEL_REPLICAS: u32 = 2;

/// Every label the conformance runner understands (`DLOCK_TEST_BACKENDS`).
pub const KNOWN: &[&str] = &[
    "memory",
    "sqlite",
    "mysql",
    "postgres",
    "mysql-tls",
    "postgres-tls",
    "postgres-session",
    "mysql-session",
    "postgres-pgbouncer",
    "redis",
    "redis-polling",
    "redis-cluster",
    "redis-tls",
    "redis-cluster-tls",
    "redis-sentinel",
    "redis-sentinel-ack",
    "redis-sentinel-tls",
    "redlock",
    "redlock-tls",
    "zk",
    "zk-ensemble",
    "zk-tls",
    "etcd",
    "etcd-tls",
    "nats",
];

/// A test server's URL. For SQLite it names a file in a fresh temporary directory
/// (made by `tempfile`, with an unpredictable name) that is removed — with the file
/// and its `-wal`/`-shm` companions — when the last clone of this URL is dropped: keep
/// it alive as long as anything uses the file.
#[derive(Clone, Debug)]
pub struct TestUrl {
    url: String,
    scratch: Option<Arc<tempfile::TempDir>>,
}

impl TestUrl {
    /// A URL that owns no files.
    pub fn fixed(url: impl Into<String>) -> Self {
        TestUrl {
            url: url.into(),
            scratch: None,
        }
    }

    /// A SQLite database file in a new temporary directory, removed when the last
    /// clone of the returned URL is dropped.
    pub fn sqlite_scratch() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("dlock-test-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot make a temporary directory for SQLite: {e}"));
        TestUrl {
            url: format!("sqlite://{}", dir.path().join("dlock.db").display()),
            scratch: Some(Arc::new(dir)),
        }
    }

    /// The URL.
    pub fn as_str(&self) -> &str {
        &self.url
    }

    /// The same URL with `suffix` appended (query parameters), sharing its files.
    pub fn with_suffix(&self, suffix: &str) -> Self {
        TestUrl {
            url: format!("{}{suffix}", self.url),
            scratch: self.scratch.clone(),
        }
    }
}

impl std::ops::Deref for TestUrl {
    type Target = str;
    fn deref(&self) -> &str {
        &self.url
    }
}

impl std::fmt::Display for TestUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.url)
    }
}

/// The URL a server-backed label uses: `DLOCK_<LABEL>_URL`, or the local default
/// (MariaDB root with no password and PostgreSQL trust auth, database `test`, on
/// 127.0.0.1; SQLite in a fresh temporary directory, removed when the returned
/// [`TestUrl`] and its clones are dropped).
///
/// For the TLS labels it first installs ring's rustls crypto provider as the
/// process default, as an application does in `main` ([`install_crypto_provider`]):
/// the redis crate needs one and dlock installs none. [`url_of`] is the same URL
/// without that.
pub fn server_url(label: &str) -> Option<TestUrl> {
    if label.ends_with("-tls") {
        install_crypto_provider();
    }
    url_of(label)
}

/// The URL of [`server_url`], and nothing else done (no crypto provider installed).
pub fn url_of(label: &str) -> Option<TestUrl> {
    let var = format!("DLOCK_{}_URL", label.to_ascii_uppercase().replace('-', "_"));
    if let Ok(url) = std::env::var(&var) {
        if label == "nats" {
            return Some(TestUrl::fixed(nats_bucket_url(&url)));
        }
        return Some(TestUrl::fixed(url));
    }
    match label {
        "sqlite" => return Some(TestUrl::sqlite_scratch()),
        // The TLS-only servers, their certificates verified against the CA the
        // script made.
        "mysql-tls" => return sql_tls_url("mysql", "ca.crt").map(TestUrl::fixed),
        "postgres-tls" => return sql_tls_url("postgres", "ca.crt").map(TestUrl::fixed),
        _ => {}
    }
    let url = match label {
        "mysql" => Some("mysql://root@127.0.0.1:3306/test".to_owned()),
        "postgres" => Some("postgres://postgres@127.0.0.1:5432/test".to_owned()),
        // The session mode (advisory locks), with a session timeout short enough
        // for the checker's black holes and kills to see locks come free.
        "postgres-session" => Some(format!(
            "postgres://postgres@127.0.0.1:5432/test?dlock_mode=session&dlock_session_timeout={}ms",
            SESSION_MODE_TIMEOUT.as_millis()
        )),
        // The row mode through PgBouncer in transaction pooling (scripts/lib/services.sh).
        "postgres-pgbouncer" => {
            Some("postgres://postgres@127.0.0.1:6432/test?dlock_pooler=transaction".to_owned())
        }
        // MariaDB's session mode (named locks), likewise.
        "mysql-session" => Some(format!(
            "mysql://root@127.0.0.1:3306/test?dlock_mode=session&dlock_session_timeout={}ms",
            SESSION_MODE_TIMEOUT.as_millis()
        )),
        "redis" | "redis-polling" => std::env::var("DLOCK_REDIS_URL")
            .ok()
            .or_else(|| Some("redis://127.0.0.1:6379".to_owned())),
        "redis-cluster" => {
            Some("redis+cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002".to_owned())
        }
        // The TLS-only server scripts/test starts, with the CA and client certificate
        // it made (DLOCK_REDIS_TLS_DIR).
        "redis-tls" => Some(format!("rediss://127.0.0.1:6390/?{}", redis_tls_params())),
        // The deployment scripts/lib/services.sh starts: 3 sentinels, a master and 2 replicas.
        // Three independent masters (scripts/lib/services.sh).
        "redlock" => Some("redlock://127.0.0.1:6410,127.0.0.1:6411,127.0.0.1:6412".to_owned()),
        // The same over TLS: three TLS-only masters on the redis-tls certificates.
        "redlock-tls" => Some(format!(
            "redlocks://127.0.0.1:6420,127.0.0.1:6421,127.0.0.1:6422/?{}",
            redis_tls_params()
        )),
        "redis-sentinel" | "redis-sentinel-ack" => Some(
            "redis+sentinel://127.0.0.1:26400,127.0.0.1:26401,127.0.0.1:26402/dlock-master"
                .to_owned(),
        ),
        // The same over TLS (sentinels, replication, clients), on the redis-tls
        // certificates.
        "redis-sentinel-tls" => Some(format!(
            "rediss+sentinel://127.0.0.1:26500,127.0.0.1:26501,127.0.0.1:26502/dlock-tls-master?{}",
            redis_tls_params()
        )),
        // The TLS-only Cluster on the same certificates.
        "redis-cluster-tls" => Some(format!(
            "rediss+cluster://127.0.0.1:7100,127.0.0.1:7101,127.0.0.1:7102/?{}",
            redis_tls_params()
        )),
        "zk" => Some("zk://127.0.0.1:2181/dlock-test".to_owned()),
        "zk-ensemble" => {
            Some("zk://127.0.0.1:2191,127.0.0.1:2192,127.0.0.1:2193/dlock-test".to_owned())
        }
        // The TLS-only server scripts/lib/services.sh starts (client certificates
        // required), with the CA and client certificate it made.
        "zk-tls" => Some(format!(
            "zks://127.0.0.1:2281/dlock-test?{}",
            zk_tls_params("ca.crt")
        )),
        // The 3-member cluster scripts/test starts.
        "etcd" => {
            Some("etcd://127.0.0.1:2379,127.0.0.1:12379,127.0.0.1:22379/dlock-test".to_owned())
        }
        // The TLS member with authentication: the user whose role may use the
        // dlock-test prefix only, the CA and client certificate the script made.
        "etcd-tls" => Some(format!(
            "etcds://dlock:{ETCD_TLS_DLOCK_PASSWORD}@127.0.0.1:2479/dlock-test?{}",
            etcd_tls_params("ca.crt")
        )),
        // The machine's NATS with JetStream, or the project's own
        // (scripts/lib/services.sh, ensure_nats); a bucket of the tests' own.
        "nats" => Some(nats_bucket_url("nats://127.0.0.1:4222")),
        _ => None,
    };
    url.map(TestUrl::fixed)
}

/// The tests' bucket on the NATS server `server` (`DLOCK_NATS_URL` names a server,
/// as for dlock-nats's own tests: scripts/lib/services.sh exports the one it found
/// or started): `dlock_checks`, whose release markers go after 10 min (a test's
/// leases are seconds; under the default 24 h they piled up run after run and
/// slowed every watch of a lock's keys). A URL that names a bucket already is
/// kept as it is.
fn nats_bucket_url(server: &str) -> String {
    let authority = server.split_once("://").map_or(server, |(_, rest)| rest);
    if authority.contains('/') {
        server.to_owned()
    } else {
        format!("{server}/dlock_checks?max_age=10m")
    }
}

/// The password of the etcd-tls member's `dlock` user (scripts/lib/services.sh).
pub const ETCD_TLS_DLOCK_PASSWORD: &str = "dlock-etcd-pass";

/// The password of the etcd-tls member's `root` user (scripts/lib/services.sh).
const ETCD_TLS_ROOT_PASSWORD: &str = "dlock-etcd-root";

/// The URL parameters naming the CA file `ca` (`ca.crt`, or `other-ca.crt` that did
/// not sign the server's certificate) and the client certificate scripts/test made
/// for the TLS etcd member (DLOCK_ETCD_TLS_DIR).
pub fn etcd_tls_params(ca: &str) -> String {
    let dir = etcd_tls_dir();
    format!("tls_ca={dir}/{ca}&tls_cert={dir}/client.crt&tls_key={dir}/client.key")
}

/// Makes (or resets) the etcd user `dlock-secrets` with `password` on the TLS member
/// (as root, with the etcdctl scripts/test installs), with the `dlock` role (the
/// dlock-test prefix).
async fn etcd_user(password: &str) -> std::result::Result<(), String> {
    let dir = etcd_tls_dir();
    let ctl = |args: &[&str]| {
        let mut cmd = tokio::process::Command::new("etcdctl");
        cmd.env("ETCDCTL_API", "3")
            .arg("--endpoints=https://127.0.0.1:2479")
            .arg("--command-timeout=5s")
            .arg(format!("--cacert={dir}/ca.crt"))
            .arg(format!("--cert={dir}/client.crt"))
            .arg(format!("--key={dir}/client.key"))
            .arg(format!("--user=root:{ETCD_TLS_ROOT_PASSWORD}"))
            .args(args)
            .kill_on_drop(true);
        cmd
    };
    // Gone first, if an earlier run made it (a missing user is fine).
    let _ = ctl(&["user", "delete", "dlock-secrets"]).output().await;
    for args in [
        &["user", "add", "dlock-secrets", "--interactive=false"][..],
        &["user", "grant-role", "dlock-secrets", "dlock"][..],
    ] {
        let mut cmd = ctl(args);
        cmd.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| format!("etcdctl: {e}"))?;
        if let Some(mut stdin) = child.stdin.take() {
            use tokio::io::AsyncWriteExt;
            stdin
                .write_all(format!("{password}\n").as_bytes())
                .await
                .map_err(|e| format!("etcdctl: {e}"))?;
        }
        let out = child
            .wait_with_output()
            .await
            .map_err(|e| format!("etcdctl: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "etcdctl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    Ok(())
}

/// Makes (or resets) the user `dlock-secrets` with `password` and every right on the
/// Redis node at `host` (`ip:port`; over TLS with the test certificates when `tls`).
async fn redis_acl_user(host: &str, tls: bool, password: &str) -> redis::RedisResult<()> {
    let client = if tls {
        let dir = redis_tls_dir();
        let read =
            |file: &str| std::fs::read(format!("{dir}/{file}")).map_err(redis::RedisError::from);
        redis::Client::build_with_tls(
            format!("rediss://{host}"),
            redis::TlsCertificates {
                client_tls: Some(redis::ClientTlsConfig {
                    client_cert: read("client.crt")?,
                    client_key: read("client.key")?,
                }),
                root_cert: Some(read("ca.crt")?),
            },
        )?
    } else {
        redis::Client::open(format!("redis://{host}"))?
    };
    let mut c = client.get_multiplexed_async_connection().await?;
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg("dlock-secrets")
        .arg("reset")
        .arg("on")
        .arg(format!(">{password}"))
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .query_async::<()>(&mut c)
        .await
}

/// Installs ring's rustls crypto provider as the process default unless one is
/// installed already — what an application using Redis over TLS does early in
/// `main` (the test binaries and tools of this crate are that application).
pub fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Another thread may have installed one meanwhile: either is ring's.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// The URL parameters naming the CA and client certificate `scripts/test` made for
/// its TLS servers (in DLOCK_REDIS_TLS_DIR).
fn redis_tls_params() -> String {
    let dir = redis_tls_dir();
    format!("tls_ca={dir}/ca.crt&tls_cert={dir}/client.crt&tls_key={dir}/client.key")
}

/// Where `scripts/test` keeps the CA and client certificate of its Redis TLS
/// servers (DLOCK_REDIS_TLS_DIR).
fn redis_tls_dir() -> String {
    tls_dir("DLOCK_REDIS_TLS_DIR", "dlock-redis-tls")
}

/// The URL parameters naming a CA (`ca`: `ca.crt`, or `other-ca.crt`, which did not
/// sign the server's certificate) and the client certificate of the TLS ZooKeeper
/// server (in DLOCK_ZK_TLS_DIR).
pub fn zk_tls_params(ca: &str) -> String {
    let dir = zk_tls_dir();
    format!("tls_ca={dir}/{ca}&tls_cert={dir}/client.crt&tls_key={dir}/client.key")
}

/// Checks, through `raw`, that the lock at `path` is held by one node, named as
/// Curator's protected `InterProcessMutex` node (`_c_<36-char uuid>-lock-<10
/// digits>`), whose creation zxid is the holder's fencing token `token`.
pub async fn assert_held_by_a_curator_node(raw: &zookeeper_client::Client, path: &str, token: u64) {
    let children = raw.list_children(path).await.expect("list the lock's node");
    assert_eq!(children.len(), 1, "{children:?}");
    let node = &children[0];
    assert!(
        node.starts_with("_c_") && node.len() == 3 + 36 + 1 + 5 + 10,
        "{node}"
    );
    assert_eq!(&node[39..45], "-lock-", "{node}");
    assert!(node[45..].bytes().all(|b| b.is_ascii_digit()), "{node}");
    let (_, stat) = raw
        .get_data(&format!("{path}/{node}"))
        .await
        .expect("read the holder's node");
    assert_eq!(
        u64::try_from(stat.czxid).ok(),
        Some(token),
        "the token is not the node's czxid"
    );
}

/// Where `scripts/test` keeps the CA and client certificate of its TLS ZooKeeper
/// server (DLOCK_ZK_TLS_DIR).
pub fn zk_tls_dir() -> String {
    tls_dir("DLOCK_ZK_TLS_DIR", "dlock-zookeeper-tls/certs")
}

/// Where `scripts/test` keeps the CA and client certificate of its TLS etcd member
/// (DLOCK_ETCD_TLS_DIR).
fn etcd_tls_dir() -> String {
    tls_dir("DLOCK_ETCD_TLS_DIR", "dlock-etcd-tls")
}

/// The directory the environment variable `var` names, else `name` in the
/// temporary directory (where scripts/lib/services.sh makes it by default).
fn tls_dir(var: &str, name: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| std::env::temp_dir().join(name).display().to_string())
}

/// `url` with PostgreSQL's `synchronous_commit = off` for its sessions (the opt-in
/// the dlock-jdbc docs describe: sqlx passes `options[…]` on as session parameters).
pub fn async_commit_url(url: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}options[synchronous_commit]=off")
}

/// The URL of the TLS-only server `scripts/test` starts for `label` (`mysql`: MariaDB
/// on 127.0.0.1:3307; `postgres`: PostgreSQL on 127.0.0.1:5433), verifying its
/// certificate against `ca` — a file in the directory the script made its
/// certificates in (DLOCK_MYSQL_TLS_DIR, DLOCK_POSTGRES_TLS_DIR).
pub fn sql_tls_url(label: &str, ca: &str) -> Option<String> {
    let (var, default_dir) = match label {
        "mysql" => ("DLOCK_MYSQL_TLS_DIR", "dlock-mysql-tls"),
        "postgres" => ("DLOCK_POSTGRES_TLS_DIR", "dlock-pg-tls"),
        _ => return None,
    };
    let dir = std::env::var(var).unwrap_or_else(|_| {
        let tmp = std::env::var("TMPDIR").unwrap_or_else(|_| "/tmp".to_owned());
        format!("{tmp}/{default_dir}")
    });
    Some(match label {
        "mysql" => {
            format!("mysql://root@127.0.0.1:3307/test?ssl-mode=VERIFY_IDENTITY&ssl-ca={dir}/{ca}")
        }
        _ => format!(
            "postgres://postgres@127.0.0.1:5433/postgres?sslmode=verify-full&sslrootcert={dir}/{ca}"
        ),
    })
}

/// The label as the suite knows it, or a configuration error naming the known ones:
/// the one place a label is checked, so a misspelt or missing label can never fall
/// back to another backend's behaviour.
fn known(label: &str) -> Result<&'static str> {
    KNOWN.iter().copied().find(|k| *k == label).ok_or_else(|| {
        Error::new(
            ErrorKind::Config,
            format!(
                "unknown test backend {label:?}; known: {}",
                KNOWN.join(", ")
            ),
        )
    })
}

/// Opens a fresh test backend for one conformance case, at the label's
/// [`server_url`]. Only [`KNOWN`] labels; unknown labels and unreachable backends are
/// errors (the runner turns them into failures).
pub async fn open(label: &str) -> Result<Arc<dyn TestBackend>> {
    let label = known(label)?;
    open_at(
        label,
        server_url(label).unwrap_or_else(|| TestUrl::fixed("")),
    )
    .await
}

/// Opens a test backend for `label` at `url` (ignored by the in-process backends):
/// a [`KNOWN`] label or one of the lock-history checker's deliberately broken
/// backends ([`Flaw::ALL`]), which are never conformance backends. Connects once —
/// and makes one round trip — so an unreachable server fails here.
pub async fn open_at(label: &str, url: TestUrl) -> Result<Arc<dyn TestBackend>> {
    if let Some(flaw) = Flaw::of(label) {
        return Ok(Arc::new(MemoryTestBackend::broken(flaw)));
    }
    let label = known(label)?;
    Ok(match label {
        "memory" => Arc::new(MemoryTestBackend::default()),
        "sqlite" | "mysql" | "postgres" | "mysql-tls" | "postgres-tls" | "postgres-session"
        | "mysql-session" | "postgres-pgbouncer" => {
            Arc::new(SqlTestBackend::open(label, url).await?)
        }
        "redis" | "redis-polling" | "redis-cluster" | "redis-tls" | "redis-cluster-tls"
        | "redis-sentinel" | "redis-sentinel-ack" | "redis-sentinel-tls" => {
            Arc::new(RedisTestBackend::open(label, url).await?)
        }
        "redlock" | "redlock-tls" => Arc::new(RedlockTestBackend::open(label, url).await?),
        "zk" | "zk-ensemble" | "zk-tls" => Arc::new(ZkTestBackend::open(label, url).await?),
        "etcd" | "etcd-tls" => Arc::new(EtcdTestBackend::open(label, url).await?),
        "nats" => Arc::new(open_nats(url).await?),
        other => {
            return Err(Error::new(
                ErrorKind::Config,
                format!("test backend {other:?} is known but has no opener in backends::open_at"),
            ))
        }
    })
}

/// The in-memory backend; one instance per case (or lock-history run), shared by
/// all its clients. [`broken`](Self::broken) hands out clients with a flaw.
#[derive(Default)]
pub struct MemoryTestBackend {
    backend: InMemoryBackend,
    flaw: Option<Flaw>,
}

impl MemoryTestBackend {
    /// A broken backend: [`BrokenBackend`] clients with `flaw` over one store.
    pub fn broken(flaw: Flaw) -> Self {
        MemoryTestBackend {
            backend: InMemoryBackend::default(),
            flaw: Some(flaw),
        }
    }
}

#[async_trait]
impl TestBackend for MemoryTestBackend {
    fn label(&self) -> &'static str {
        self.flaw.map_or("memory", Flaw::label)
    }

    async fn client(&self) -> Result<Arc<dyn LockRemoteResource>> {
        Ok(match self.flaw {
            Some(flaw) => Arc::new(BrokenBackend::over(self.backend.clone(), flaw)),
            None => Arc::new(self.backend.clone()),
        })
    }

    async fn steal(&self, name: &LockName) -> Result<()> {
        LockAdmin::force_release(&self.backend, name)
            .await
            .map(drop)
    }

    async fn live_state(&self, prefix: &str) -> Result<usize> {
        self.backend.live_locks(prefix).await
    }

    fn acquire_attempts(&self) -> Option<u64> {
        Some(self.backend.acquire_attempts())
    }
}

/// A backend client type the suite can open again (a new connection or pool, as
/// another process would have) and count acquire attempts on.
#[async_trait]
pub trait ServerClient: LockRemoteResource + LockAdmin + Clone {
    /// Opens a new client for `label` at `url`.
    async fn open(label: &str, url: &str) -> Result<Self>;
    /// Backend-side acquire attempts this client has made.
    fn attempts(&self) -> u64;
    /// Opens a new client whose waiters are told of releases and look on their own
    /// only seconds apart ([`TestBackend::told_client`]; asked only for labels
    /// whose waiters are told, see [`waiters_only_poll`]). The default: [`Self::open`].
    async fn open_told(label: &str, url: &str) -> Result<Self> {
        Self::open(label, url).await
    }
}

/// The SQL waiters' own looks in the herd checks: polls 2–4 s apart (equal
/// jitter) and liveness re-checks every 20 s, so that within a check's window (the
/// 200 ms after a release, a second or so after the waiters' first looks even on
/// a loaded machine) only a release's notice (PostgreSQL `NOTIFY`, SQLite's
/// host-local notices) or bell (MariaDB `GET_LOCK`) makes a waiter look.
fn told_sql_options() -> JdbcOptions {
    JdbcOptions::default()
        .backoff(dlock_spi::Backoff::constant(Duration::from_secs(4)))
        .waiter_liveness(Duration::from_secs(60))
}

/// The clients whose label adds nothing to the URL: `connect(url)`.
macro_rules! url_clients {
    ($($client:ty),+) => {$(
        #[async_trait]
        impl ServerClient for $client {
            async fn open(_label: &str, url: &str) -> Result<Self> {
                <$client>::connect(url).await
            }
            fn attempts(&self) -> u64 {
                self.acquire_attempts()
            }
        }
    )+};
}

url_clients!(ZkBackend, EtcdBackend, RedlockBackend);

/// Whether waiters on `label` learn of releases only by polling — nothing for the
/// herd checks to count: Redis with `polling`, Redlock (its waiters poll every
/// node), PostgreSQL behind a transaction pooler (no `LISTEN` session); nor in the
/// SQL session modes, where a waiter blocks inside the server (`pg_advisory_lock`,
/// `GET_LOCK`) and the database's own queue hands the lock to one of them.
pub fn waiters_only_poll(label: &str) -> bool {
    matches!(
        label,
        "redis-polling" | "redlock" | "redlock-tls" | "postgres-pgbouncer"
    ) || is_session_mode(label)
}

#[async_trait]
impl ServerClient for JdbcBackend {
    async fn open(_label: &str, url: &str) -> Result<Self> {
        JdbcBackend::connect(url).await
    }
    fn attempts(&self) -> u64 {
        self.acquire_attempts()
    }
    async fn open_told(_label: &str, url: &str) -> Result<Self> {
        JdbcBackend::connect_with(url, told_sql_options()).await
    }
}

#[async_trait]
impl ServerClient for RedisBackend {
    async fn open(label: &str, url: &str) -> Result<Self> {
        let options = match label {
            "redis-polling" => RedisOptions::default().polling(dlock_spi::Backoff::default()),
            // A replica acknowledges each acquire and renewal: with the master, a
            // majority of the deployment's three copies has it.
            "redis-sentinel-ack" => {
                RedisOptions::default().replica_ack(1, Duration::from_millis(500))
            }
            _ => RedisOptions::default(),
        };
        RedisBackend::connect_with(url, options).await
    }
    fn attempts(&self) -> u64 {
        self.acquire_attempts()
    }
}

/// A backend behind a server (or a SQLite file): one admin client for the hooks, and a
/// new client per `client()` call. It keeps its [`TestUrl`], and with it a SQLite
/// file, until dropped.
pub struct ServerTestBackend<C> {
    label: &'static str,
    url: TestUrl,
    admin: C,
    clients: Mutex<Vec<C>>,
}

/// The SQL backends' test backend.
pub type SqlTestBackend = ServerTestBackend<JdbcBackend>;
/// The Redis backends' test backend.
pub type RedisTestBackend = ServerTestBackend<RedisBackend>;
/// The Redlock backend's test backend.
pub type RedlockTestBackend = ServerTestBackend<RedlockBackend>;
/// The ZooKeeper backends' test backend.
pub type ZkTestBackend = ServerTestBackend<ZkBackend>;
/// The etcd backend's test backend.
pub type EtcdTestBackend = ServerTestBackend<EtcdBackend>;

/// The NATS backend's test backend (for the lock-history checker's workers; its
/// conformance run is dlock-nats's own `tests/tck.rs`, as a third party's crate
/// runs the kit): the kit's own, from the connect function.
pub type NatsTestBackend = dlock_tck::AdminTestBackend<dlock_nats::NatsBackend>;

/// Opens [`NatsTestBackend`] at `url` (one round trip: an unreachable server fails
/// here).
async fn open_nats(url: TestUrl) -> Result<NatsTestBackend> {
    NatsTestBackend::open("nats", move || {
        let url = url.clone();
        async move { dlock_nats::NatsBackend::connect(&url).await }
    })
    .await
}

impl<C: ServerClient> ServerTestBackend<C> {
    /// Keeps `client` (its attempts count) and hands it out.
    fn keep(&self, client: C) -> Arc<dyn LockRemoteResource> {
        self.clients.lock().expect("clients").push(client.clone());
        Arc::new(client)
    }

    /// Connects once — and makes one round trip — so an unreachable server fails here.
    pub async fn open(label: &str, url: TestUrl) -> Result<Self> {
        let label = known(label)?;
        let admin = C::open(label, &url).await?;
        admin.live_locks("").await?;
        Ok(ServerTestBackend {
            label,
            url,
            admin,
            clients: Mutex::new(Vec::new()),
        })
    }
}

#[async_trait]
impl<C: ServerClient> TestBackend for ServerTestBackend<C> {
    fn label(&self) -> &'static str {
        self.label
    }

    async fn client(&self) -> Result<Arc<dyn LockRemoteResource>> {
        Ok(self.keep(C::open(self.label, &self.url).await?))
    }

    async fn steal(&self, name: &LockName) -> Result<()> {
        self.admin.force_release(name).await.map(drop)
    }

    async fn live_state(&self, prefix: &str) -> Result<usize> {
        self.admin.live_locks(prefix).await
    }

    fn acquire_attempts(&self) -> Option<u64> {
        let clients = self.clients.lock().expect("clients");
        Some(clients.iter().map(ServerClient::attempts).sum())
    }

    async fn told_client(&self) -> Option<Result<Arc<dyn LockRemoteResource>>> {
        if waiters_only_poll(self.label) {
            return None;
        }
        Some(
            C::open_told(self.label, &self.url)
                .await
                .map(|c| self.keep(c)),
        )
    }
}

/// A URL of `label`'s test server that carries `password` and works: for the
/// secret-leak checks, which need every surface (logs, metrics, status) produced by
/// a client that really holds that password. MariaDB: a user `dlock_secrets` (re)made
/// with it, allowed on `test`; PostgreSQL: the password in the URL (the test server
/// trusts loopback, so it is sent and ignored); Redis: an ACL user `dlock-secrets`
/// (re)made with it; ZooKeeper: a digest identity `dlock-secrets:<password>` on a
/// root of its own.
/// `None` for labels without credentials (memory, SQLite) or not set up here.
pub async fn url_with_password(label: &str, password: &str) -> Result<Option<String>> {
    use dlock_jdbc::sqlx::{self, Connection};
    let err = |e: &dyn std::fmt::Display| {
        Error::new(
            ErrorKind::Backend,
            format!("setting up the secrets test user on {label}: {e}"),
        )
    };
    match label {
        "mysql" => {
            let mut c = sqlx::MySqlConnection::connect("mysql://root@127.0.0.1:3306/test")
                .await
                .map_err(|e| err(&e))?;
            // CREATE USER takes no placeholder: the password is pasted, so it may
            // hold only letters, digits and '-'.
            if !password
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || ch == '-')
            {
                return Err(err(&"the password may hold only letters, digits and '-'"));
            }
            for sql in [
                format!(
                    "CREATE OR REPLACE USER 'dlock_secrets'@'127.0.0.1' IDENTIFIED BY '{password}'"
                ),
                "GRANT ALL PRIVILEGES ON test.* TO 'dlock_secrets'@'127.0.0.1'".to_owned(),
            ] {
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                    .execute(&mut c)
                    .await
                    .map_err(|e| err(&e))?;
            }
            Ok(Some(format!(
                "mysql://dlock_secrets:{password}@127.0.0.1:3306/test"
            )))
        }
        "postgres" => Ok(Some(format!(
            "postgres://postgres:{password}@127.0.0.1:5432/test"
        ))),
        "redis" | "redis-cluster" | "redis-tls" | "redis-cluster-tls" => {
            // The suite's URL for the label, with the user's credentials in it.
            let url = server_url(label).ok_or_else(|| err(&"no URL for the label"))?;
            let (scheme, rest) = url
                .split_once("://")
                .ok_or_else(|| err(&"a URL without a scheme"))?;
            let hosts = rest.split(['/', '?']).next().unwrap_or_default();
            // ACLs are per node: the user is made on each of them.
            for host in hosts.split(',') {
                redis_acl_user(host, label.ends_with("-tls"), password)
                    .await
                    .map_err(|e| err(&e))?;
            }
            Ok(Some(format!("{scheme}://dlock-secrets:{password}@{rest}")))
        }
        "etcd-tls" => {
            etcd_user(password).await.map_err(|e| err(&e))?;
            Ok(Some(format!(
                "etcds://dlock-secrets:{password}@127.0.0.1:2479/dlock-test?{}",
                etcd_tls_params("ca.crt")
            )))
        }
        // A root of its own: nodes made under a digest identity are that identity's
        // (an earlier run's password could not use them).
        "zk" => Ok(Some(format!(
            "zk://dlock-secrets:{password}@127.0.0.1:2181/dlock-test-secrets-{:016x}",
            fastrand::u64(..)
        ))),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::nats_bucket_url;

    /// `DLOCK_NATS_URL` as scripts/lib/services.sh exports it names a server: the
    /// tests' bucket is added (without it every run used the default `dlock`
    /// bucket, whose 24 h of release markers slowed each run after the last).
    #[test]
    fn the_nats_label_uses_the_tests_bucket_on_the_server_named() {
        assert_eq!(
            nats_bucket_url("nats://127.0.0.1:4322"),
            "nats://127.0.0.1:4322/dlock_checks?max_age=10m"
        );
        let named = "nats://127.0.0.1:4222/mine?max_age=1m";
        assert_eq!(nats_bucket_url(named), named);
    }
}
