//! Behind a transaction pooler (PgBouncer): what the session mode refuses, what the row mode keeps, migrations.

use dlock_jdbc::JdbcBackend;
use dlock_spi::{
    AcquireRequest, AcquireResult, GrantId, LockMode, LockName, LockRemoteResource, OwnerId,
    ReleaseRequest, ReleaseResult,
};
use sqlx::Connection;
use testsuite::backends::server_url;
use testsuite::runner::selected;

use super::fixtures::*;

/// PostgreSQL's session mode behind a transaction pooler (PgBouncer in transaction
/// mode, which `scripts/test` starts with the `postgres-session` label) is refused
/// with a `Config` error that names the pooler, before any lock is granted: each
/// statement may reach another server session, so an advisory lock would outlive
/// or miss its hold. (It granted a lock there before: `dlock exec` ran its
/// command.) Other clients keep PgBouncer busy meanwhile, as other tests do in a
/// full run: a check of one round let the backend open there in 5 runs of 5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_session_refuses_a_transaction_pooler() {
    if !selected().iter().any(|l| l == "postgres-session") {
        return;
    }
    let pooler = std::env::var("DLOCK_PGBOUNCER_URL")
        .expect("DLOCK_PGBOUNCER_URL: scripts/test starts PgBouncer for postgres-session");
    // Other clients, each a statement at a time on the pooler until the rounds end.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut busy = Vec::new();
    for _ in 0..4 {
        let mut conn = sqlx::PgConnection::connect(&pooler).await.unwrap();
        let stop = std::sync::Arc::clone(&stop);
        busy.push(tokio::spawn(async move {
            let mut statements = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && statements < 200_000 {
                sqlx::raw_sql("SELECT 1").execute(&mut conn).await.unwrap();
                statements += 1;
            }
            statements
        }));
    }
    for round in 0..5 {
        let url = format!("{pooler}?dlock_mode=session&dlock_session_timeout=4s");
        let err = match JdbcBackend::connect(&url).await {
            Ok(backend) => {
                backend.close().await;
                panic!("round {round}: the session mode opened behind a transaction pooler");
            }
            Err(err) => err,
        };
        assert_eq!(
            err.kind(),
            dlock_spi::ErrorKind::Config,
            "round {round}: {err}"
        );
        assert!(err.message().contains("pooler"), "round {round}: {err}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for task in busy {
        assert!(
            task.await.unwrap() > 0,
            "the other clients ran no statement"
        );
    }
}

/// The row mode behind PgBouncer (transaction pooling) with `dlock_pooler=transaction`:
/// its statements carry their parameters as literals, so names, owners and contexts
/// that look like SQL (quotes, backslashes, `$1`, `E'`, a comment, non-ASCII) reach
/// the database as they were given and touch nothing else: each lock is taken and
/// inspected with its own name, owner and context (every byte value), a lock whose
/// name is a prefix of theirs stays free, and each release frees its own lock only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_pooler_mode_keeps_names_owners_and_contexts_as_given() {
    if !selected().iter().any(|l| l == "postgres-pgbouncer") {
        return;
    }
    let url = server_url("postgres-pgbouncer").unwrap();
    let backend = JdbcBackend::connect(&url).await.unwrap();
    let run = format!("{:x}", fastrand::u64(..));
    let plain = LockName::new(format!("lit-{run}")).unwrap();
    let context: Vec<u8> = (0..=255u8).collect();
    let tricky = [
        "'",
        "''; DELETE FROM dlock_locks; --",
        "\\'",
        "\\",
        "$1 $2 E'x'",
        "é ü \u{1F512} \\x41",
        "') OR ('1'='1",
    ];
    for (i, suffix) in tricky.iter().enumerate() {
        let name = LockName::new(format!("lit-{run}{suffix}")).unwrap();
        let owner = OwnerId::new(format!("owner{suffix}"));
        let req = AcquireRequest::new(name.clone(), owner.clone(), GrantId::new(i as u64 + 1))
            .with_context(dlock_spi::Bytes::from(context.clone()));
        let AcquireResult::Acquired { token, .. } = backend.try_acquire(&req).await.unwrap() else {
            panic!("{suffix:?}: an uncontended grant was refused");
        };
        let state = backend
            .inspect(&name)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{suffix:?}: the held lock is not found by its name"));
        assert_eq!(state.holders.len(), 1, "{suffix:?}: {state:?}");
        let holder = &state.holders[0];
        assert_eq!(holder.owner, owner, "{suffix:?}");
        assert_eq!(holder.token, token, "{suffix:?}");
        assert_eq!(
            &holder.context[..],
            &context[..],
            "{suffix:?}: the context changed"
        );
        let free = backend.inspect(&plain).await.unwrap();
        assert!(
            free.as_ref().is_none_or(|s| s.holders.is_empty()),
            "{suffix:?}: the lock named by the prefix is held: {free:?}"
        );
        let release =
            ReleaseRequest::new(name.clone(), owner, req.grant, LockMode::Exclusive, token);
        assert_eq!(
            backend.release(&release).await.unwrap(),
            ReleaseResult::Released,
            "{suffix:?}"
        );
        let after = backend.inspect(&name).await.unwrap();
        assert!(
            after.as_ref().is_none_or(|s| s.holders.is_empty()),
            "{suffix:?}: still held after its release: {after:?}"
        );
    }
    backend.close().await;
}

/// Behind PgBouncer without `dlock_pooler=transaction`, the row mode's prepared
/// statements meet other clients' on the pooler's shared server sessions: the first
/// such failure is a `Config` error that names the option, not an opaque driver
/// message or a retryable one. Two backends take turns (the pooler hands the second
/// the server session the first just prepared its statements on); the failure comes
/// within a few rounds. (On a PgBouncer of its own: these backends LISTEN, and a
/// server session left listening would break the other tests' pooled clients.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_row_mode_behind_a_pooler_without_the_option_says_what_to_set() {
    if !selected().iter().any(|l| l == "postgres-pgbouncer") {
        return;
    }
    let pooler = std::env::var("DLOCK_PGBOUNCER_SCRATCH_URL")
        .expect("DLOCK_PGBOUNCER_SCRATCH_URL: scripts/test starts a third PgBouncer");
    let opened = [
        JdbcBackend::connect(&pooler).await,
        JdbcBackend::connect(&pooler).await,
    ];
    let mut failure = None;
    let mut backends = Vec::new();
    for b in opened {
        match b {
            Ok(b) => backends.push(b),
            Err(e) => failure = failure.or(Some(e)),
        }
    }
    let name = LockName::new(format!("no-option-{:x}", fastrand::u64(..))).unwrap();
    'rounds: for _ in 0..10 {
        if failure.is_some() {
            break;
        }
        for b in &backends {
            if let Err(e) = b.inspect(&name).await {
                failure = Some(e);
                break 'rounds;
            }
        }
    }
    for b in &backends {
        b.close().await;
    }
    let err =
        failure.expect("the row mode's prepared statements ran behind the pooler for 10 rounds");
    assert_eq!(err.kind(), dlock_spi::ErrorKind::Config, "{err}");
    assert!(!err.is_retryable(), "{err}");
    assert!(err.message().contains("dlock_pooler=transaction"), "{err}");
}

/// A PgBouncer as it ships refuses a startup parameter sqlx sends
/// (`extra_float_digits`): connecting through it is a `Config` error that names the
/// pooler's setting to add, not "refused for now" (retryable: a caller would retry
/// a configuration forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooler_refusing_sqlx_startup_is_a_configuration_error() {
    if !selected().iter().any(|l| l == "postgres-pgbouncer") {
        return;
    }
    let strict = std::env::var("DLOCK_PGBOUNCER_STRICT_URL")
        .expect("DLOCK_PGBOUNCER_STRICT_URL: scripts/test starts a second PgBouncer");
    let err = JdbcBackend::connect(&format!("{strict}?dlock_pooler=transaction"))
        .await
        .expect_err("sqlx's startup went through a PgBouncer that refuses it");
    assert_eq!(err.kind(), dlock_spi::ErrorKind::Config, "{err}");
    assert!(!err.is_retryable(), "{err}");
    assert!(err.message().contains("ignore_startup_parameters"), "{err}");
}

/// `dlock_pooler=transaction` is for PostgreSQL's row mode only: with the session
/// mode, and on SQLite, it is refused with a `Config` error that says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pooler_option_is_refused_where_it_cannot_hold() {
    let mut checked = 0;
    if selected().iter().any(|l| l == "postgres-pgbouncer") {
        let pooler = std::env::var("DLOCK_PGBOUNCER_URL").unwrap();
        let url = format!("{pooler}?dlock_mode=session&dlock_pooler=transaction");
        let err = JdbcBackend::connect(&url)
            .await
            .expect_err("session mode behind a pooler opened");
        assert_eq!(err.kind(), dlock_spi::ErrorKind::Config, "{err}");
        assert!(err.message().contains("row mode"), "{err}");
        checked += 1;
    }
    if let Some(url) = sql_url("sqlite") {
        let err = JdbcBackend::connect(&format!("{}?dlock_pooler=transaction", &*url))
            .await
            .expect_err("SQLite with a pooler option opened");
        assert_eq!(err.kind(), dlock_spi::ErrorKind::Config, "{err}");
        assert!(err.message().contains("PostgreSQL"), "{err}");
        checked += 1;
    }
    if checked == 0 {
        eprintln!("neither postgres-pgbouncer nor sqlite is selected; nothing to check here");
    }
}

/// The migration through PgBouncer runs in one transaction under a
/// transaction-scoped advisory lock: a fresh table prefix, migrated by several
/// backends at once through the pooler, ends with its tables at the newest version
/// and no advisory lock left on any server session (a session-level lock taken on
/// one of the pooler's server sessions and "released" on another would stay).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_migrations_through_a_pooler_leave_no_lock_behind() {
    if !selected().iter().any(|l| l == "postgres-pgbouncer") {
        return;
    }
    let url = server_url("postgres-pgbouncer").unwrap();
    let prefix = format!("mig{:x}_", fastrand::u32(..));
    let opens = (0..4).map(|_| {
        let url = format!("{}&dlock_table_prefix={prefix}", &*url);
        async move { JdbcBackend::connect(&url).await }
    });
    let backends: Vec<JdbcBackend> = futures_util::future::join_all(opens)
        .await
        .into_iter()
        .map(|b| b.expect("migrate through the pooler"))
        .collect();
    let mut direct = sqlx::PgConnection::connect("postgres://postgres@127.0.0.1:5432/test")
        .await
        .unwrap();
    let version: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT MAX(version) FROM {prefix}schema_version"
    )))
    .fetch_one(&mut direct)
    .await
    .unwrap();
    assert_eq!(version, dlock_jdbc::SCHEMA_VERSION);
    let held: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = (hashtext($1)::bigint & 4294967295)::oid",
    )
    .bind(format!("{prefix}migrate"))
    .fetch_one(&mut direct)
    .await
    .unwrap();
    assert_eq!(held, 0, "the migration's advisory lock is still held");
    for b in &backends {
        b.close().await;
    }
    drop_row_tables(&mut direct, &prefix).await;
}

/// PostgreSQL's migration reads what an earlier migrator committed whatever the
/// server's default isolation: four backends migrating a fresh table prefix at once,
/// their sessions `SERIALIZABLE` by default (`default_transaction_isolation`), all
/// open. (The migration's transaction took its snapshot at its lock statement,
/// before the wait: a migrator that waited read the versions as not applied and
/// failed recording them again — `could not serialize access`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_migrations_see_each_other_under_serializable_defaults() {
    let Some(url) = sql_url("postgres") else {
        return;
    };
    let prefix = format!("ser{:x}_", fastrand::u32(..));
    let sep = if url.contains('?') { '&' } else { '?' };
    let url = format!(
        "{}{sep}options=-c%20default_transaction_isolation%3Dserializable&dlock_table_prefix={prefix}",
        &*url
    );
    let opens = (0..4).map(|_| JdbcBackend::connect(&url));
    let opened = futures_util::future::join_all(opens).await;
    let mut direct = sqlx::PgConnection::connect("postgres://postgres@127.0.0.1:5432/test")
        .await
        .unwrap();
    let failures: Vec<String> = opened
        .iter()
        .filter_map(|b| b.as_ref().err().map(ToString::to_string))
        .collect();
    for b in opened.into_iter().flatten() {
        b.close().await;
    }
    drop_row_tables(&mut direct, &prefix).await;
    assert!(failures.is_empty(), "migrations failed: {failures:?}");
}
