//! The `dlock` binary as a user runs it, on the backends in `DLOCK_TEST_BACKENDS`
//! (`sqlite` always runs: it needs no server).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use dlock_api::DistributeLockManager;
use testsuite::backends::TestUrl;

const DLOCK: &str = env!("CARGO_BIN_EXE_dlock");

/// A SQLite file in a temporary directory, removed when the URL is dropped.
fn sqlite_url() -> TestUrl {
    TestUrl::sqlite_scratch()
}

/// The labels `dlock demo` runs on: SQLite always, and the selected server backends
/// (memory has no server; redis-polling is redis' URL with an option the command
/// does not take).
fn demo_labels() -> Vec<String> {
    let selected = std::env::var("DLOCK_TEST_BACKENDS").unwrap_or_else(|_| "memory".to_owned());
    let mut labels = vec!["sqlite".to_owned()];
    labels.extend(
        selected
            .split(',')
            .map(str::trim)
            // (Redlock over TLS: the CLI's Redlock path is the plain label's, and
            // each load run is ~3 minutes of polled hand-overs; TLS Redlock has its
            // conformance, checker and hand-over runs.)
            .filter(|label| {
                !matches!(
                    *label,
                    "" | "memory" | "sqlite" | "redis-polling" | "redlock-tls"
                )
            })
            .map(str::to_owned),
    );
    labels
}

/// The selected backends' URLs (the test suite's), SQLite always.
fn sql_urls() -> Vec<(String, TestUrl)> {
    demo_labels()
        .into_iter()
        .map(|label| {
            let url = demo_url(&label);
            (label, url)
        })
        .collect()
}

/// The test suite's URL of `label` (a fresh SQLite file for `sqlite`).
fn demo_url(label: &str) -> TestUrl {
    if label == "sqlite" {
        return sqlite_url();
    }
    testsuite::backends::server_url(label)
        .unwrap_or_else(|| panic!("{label} was selected but has no URL"))
}

fn command(url: &str, namespace: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(DLOCK);
    cmd.arg("--backend")
        .arg(url)
        .arg("--namespace")
        .arg(namespace)
        .args(args)
        .stdin(Stdio::null());
    cmd
}

/// Runs `dlock` to completion.
fn dlock(url: &str, namespace: &str, args: &[&str]) -> Output {
    command(url, namespace, args).output().expect("run dlock")
}

/// Starts `dlock` in the background, its stderr captured.
fn spawn_dlock(url: &str, namespace: &str, args: &[&str]) -> Child {
    command(url, namespace, args)
        .stderr(Stdio::piped())
        .spawn()
        .expect("run dlock")
}

/// Waits for a background `dlock` to end.
async fn finished(child: Child) -> Output {
    tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .expect("waiter")
        .expect("dlock output")
}

/// A manager of the test's own (another client than the command) in `ns`.
async fn holder_on(url: &str, ns: &str) -> DistributeLockManager {
    DistributeLockManager::builder(dlock_api::open_backend(url).await.unwrap())
        .namespace(ns.to_owned())
        .build()
        .unwrap()
}

fn namespace() -> String {
    format!("cli{:08x}:", fastrand::u32(..))
}

/// Runs `dlock demo` with `workers` processes × `iterations` and `release`
/// (`unlock` or `drop`) on `label`'s backend: the counter equals the
/// successful acquisitions, every attempt acquired, no two processes overlapped.
fn demo_loses_no_update(label: &str, workers: u64, iterations: u64, release: &str) {
    let url = demo_url(label);
    // These runs judge lost updates, not how fast a connection opens: CI once saw
    // a connect to the TLS PostgreSQL take over the default 5 s while both load
    // tests ran on the 2-core machine, so SQL URLs allow 30 s. The bound has its own test
    // (sql_backend::a_connect_nobody_answers_times_out_in_the_urls_bound).
    let sql = ["sqlite:", "mysql:", "mariadb:", "postgres:", "postgresql:"]
        .iter()
        .any(|scheme| url.starts_with(scheme));
    let sep = if url.contains('?') { '&' } else { '?' };
    let url = if sql {
        format!("{url}{sep}dlock_acquire_timeout=30s")
    } else {
        url.to_string()
    };
    let out = dlock(
        &url,
        &namespace(),
        &[
            "demo",
            "--workers",
            &workers.to_string(),
            "--iterations",
            &iterations.to_string(),
            "--wait",
            "60s",
            "--release",
            release,
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{label}: demo failed\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let total: Vec<u64> = stdout
        .lines()
        .find(|l| l.starts_with("total"))
        .expect("total row")
        .split_whitespace()
        .skip(1)
        .map(|n| n.parse().unwrap())
        .collect();
    let (acquired, overlaps) = (total[0], total[3]);
    let counter: u64 = stdout
        .lines()
        .find(|l| l.starts_with("counter"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .expect("counter line");
    assert_eq!(
        counter, acquired,
        "{label} ({release}): lost updates\n{stdout}"
    );
    assert_eq!(
        acquired,
        workers * iterations,
        "{label} ({release}): not every attempt acquired\n{stdout}"
    );
    assert_eq!(
        overlaps, 0,
        "{label} ({release}): processes overlapped\n{stdout}"
    );
    eprintln!(
        "{label} ({release}): {}",
        stdout.lines().last().unwrap_or_default()
    );
}

/// 3 OS processes × 200 iterations of a non-atomic read–sleep–write under one lock,
/// released by `unlock()`.
fn three_processes_share_one_counter_without_losing_updates(label: &str) {
    demo_loses_no_update(label, 3, 200, "unlock");
}

/// The loop that double-granted before grants had an identity (issue "Safety
/// first", item 1: 6 processes × 100, lost updates on Redis, PostgreSQL and SQLite,
/// failed acquires on ZooKeeper): each worker drops its guard — released in the
/// background — and locks again at once with the same handle.
fn drop_then_relock_loses_no_update(label: &str) {
    demo_loses_no_update(label, 6, 100, "drop");
}

fn exec_passes_the_exit_status_and_the_fencing_token() {
    let url = sqlite_url();
    let ns = namespace();
    let out = dlock(&url, &ns, &["exec", "job", "--", "sh", "-c", "exit 3"]);
    assert_eq!(out.status.code(), Some(3));
    let out = dlock(
        &url,
        &ns,
        &[
            "exec",
            "job",
            "--",
            "sh",
            "-c",
            "test \"$DLOCK_FENCING_TOKEN\" -gt 0",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = dlock(&url, &ns, &["exec", "job", "--", "/nonexistent/program"]);
    assert_eq!(out.status.code(), Some(127));
}

async fn exec_gives_up_after_wait_and_stops_the_command_when_the_lock_is_lost() {
    let url = sqlite_url();
    let ns = namespace();
    let holder = holder_on(&url, &ns).await;
    let g = holder
        .lock("busy")
        .try_lock(Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    gives_up_after_its_wait(&url, &ns, "exec");
    g.unlock().await.unwrap();

    // The command runs under the lock; an operator breaks it; dlock stops the command.
    breaking_the_hold_stops_the_command(&url, &ns, &holder, "exec", "lock").await;
    holder.close().await;
}

/// `dlock <command> busy --wait 300ms -- true`, with `busy` held elsewhere, waits
/// its 300 ms and exits 75.
fn gives_up_after_its_wait(url: &str, ns: &str, command: &str) {
    let started = Instant::now();
    let out = dlock(url, ns, &[command, "busy", "--wait", "300ms", "--", "true"]);
    assert_eq!(
        out.status.code(),
        Some(75),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(started.elapsed() >= Duration::from_millis(300));
}

/// `dlock <command> victim --lease 600ms -- sleep 30` takes its hold; an operator
/// breaks it (`unlock --force`); dlock stops the command promptly and exits 76,
/// saying "<what> lost".
async fn breaking_the_hold_stops_the_command(
    url: &str,
    ns: &str,
    holder: &DistributeLockManager,
    command: &str,
    what: &str,
) {
    let child = spawn_dlock(
        url,
        ns,
        &[command, "victim", "--lease", "600ms", "--", "sleep", "30"],
    );
    let held =
        testsuite_eventually(|| async { holder.inspect("victim").await.unwrap().is_some() }).await;
    assert!(held, "dlock {command} never took its {what}");
    let broke = Instant::now();
    let out = dlock(url, ns, &["unlock", "victim", "--force"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("removed 1"));
    let status = finished(child).await;
    assert_eq!(
        status.status.code(),
        Some(76),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    assert!(
        broke.elapsed() < Duration::from_secs(10),
        "the command was not stopped promptly"
    );
    assert!(String::from_utf8_lossy(&status.stderr).contains(&format!("{what} lost")));
}

async fn testsuite_eventually<F, Fut>(mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

fn status_unlock_and_input_errors() {
    let url = sqlite_url();
    let ns = namespace();
    let out = dlock(&url, &ns, &["status", "nothing"]);
    assert_eq!(out.status.code(), Some(1), "a free lock's status is 1");
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing: free"));
    let out = dlock(&url, &ns, &["unlock", "nothing"]);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--force"));
    let out = dlock(&url, &ns, &["exec", "x", "--wait", "soon", "--", "true"]);
    assert_eq!(out.status.code(), Some(64), "a usage error is EX_USAGE");
    assert!(String::from_utf8_lossy(&out.stderr).contains("500ms"));
    let out = dlock("nope://x", &ns, &["status", "a"]);
    assert_eq!(out.status.code(), Some(78));
    let out = dlock(
        "mysql://root:sekret@127.0.0.1:1/test",
        &ns,
        &["status", "a"],
    );
    assert_eq!(out.status.code(), Some(69));
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("sekret"),
        "the password leaked"
    );
}

/// What `--help` of the command and of its subcommands prints with `url` in
/// `DLOCK_URL` (each must succeed).
fn help_with_dlock_url(url: &str) -> String {
    let mut shown = String::new();
    for args in [
        &["--help"][..],
        &["exec", "--help"][..],
        &["status", "--help"][..],
    ] {
        let out = Command::new(DLOCK)
            .args(args)
            .env("DLOCK_URL", url)
            .stdin(Stdio::null())
            .output()
            .expect("run dlock");
        assert!(out.status.success(), "{args:?}");
        shown.push_str(&String::from_utf8_lossy(&out.stdout));
        shown.push_str(&String::from_utf8_lossy(&out.stderr));
    }
    shown
}

/// `--help` (of the command and of a subcommand) does not print the password of the
/// `DLOCK_URL` the environment holds.
fn help_does_not_show_the_password_in_dlock_url() {
    let shown = help_with_dlock_url("postgres://app:help-s3cret@127.0.0.1/db");
    assert!(shown.contains("DLOCK_URL"), "{shown}");
    assert!(
        !shown.contains("help-s3cret"),
        "help printed the password:\n{shown}"
    );
}

/// Every usage error clap finds exits 64 (EX_USAGE) with its message on stderr;
/// `--help` and `--version` succeed on stdout.
fn usage_errors_exit_64_and_help_succeeds() {
    let url = sqlite_url();
    let ns = namespace();
    for (args, says) in [
        (&["frobnicate"][..], "frobnicate"),
        (&[][..], "Usage"),
        (&["status"][..], "NAME"),
        (&["exec", "x", "--wait", "soon", "--", "true"][..], "500ms"),
        (
            &["sem", "pool", "--permits", "many", "--", "true"][..],
            "many",
        ),
        (&["status", "x", "--colour"][..], "--colour"),
        (&["completions", "tcsh-ish"][..], "tcsh-ish"),
        // A lease no manager accepts is a usage error found before connecting, not
        // a configuration error (78) from the manager.
        (
            &["exec", "x", "--lease", "0s", "--", "true"][..],
            "out of range",
        ),
        (
            &["elect", "x", "--lease", "1ms", "--", "true"][..],
            "out of range",
        ),
    ] {
        let out = dlock(&url, &ns, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    for args in [&["--help"][..], &["--version"][..], &["help", "status"][..]] {
        let out = dlock(&url, &ns, args);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert!(!out.stdout.is_empty(), "{args:?}");
    }
}

/// `dlock completions` into a pipe its reader already closed (`… | head`) ends
/// quietly with 0, as `cat` does, not with 70 and "Broken pipe".
fn completions_into_a_closed_pipe_end_quietly() {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let out = Command::new(DLOCK)
        .args(["completions", "bash"])
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .expect("run dlock");
    assert_eq!(
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).as_ref()
        ),
        (Some(0), ""),
    );
}

/// The about text names every backend the command reaches: each URL scheme this
/// build understands (`dlock_api::SUPPORTED`) by its backend's name.
fn the_about_text_names_every_backend() {
    let out = Command::new(DLOCK).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    let about = help.lines().next().unwrap_or_default();
    for scheme in dlock_api::SUPPORTED {
        let names: &[&str] = match scheme.trim_end_matches("://") {
            "memory" | "mem" => &["memory"],
            "sqlite" => &["SQLite"],
            "mysql" | "mariadb" => &["MariaDB", "MySQL"],
            "postgres" | "postgresql" => &["PostgreSQL"],
            "redis" | "rediss" => &["Redis"],
            "redis+cluster" | "rediss+cluster" => &["Redis", "Cluster"],
            "redis+sentinel" | "rediss+sentinel" => &["Redis", "Sentinel"],
            "redlock" | "redlocks" => &["Redlock"],
            "zk" | "zks" | "zookeeper" => &["ZooKeeper"],
            "etcd" | "etcds" => &["etcd"],
            "nats" => &["NATS"],
            other => panic!("scheme {other:?} is new: name its backend in the about text and here"),
        };
        for name in names {
            assert!(
                about.contains(name),
                "{name} ({scheme}) missing from: {about}"
            );
        }
    }
}

/// `dlock status --json` said the lock is free: exit status 1, `held` false, no
/// holders.
fn assert_free_json(out: &Output, what: &str) {
    assert_eq!(out.status.code(), Some(1), "{what}: free is 1");
    let json: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{what}: not JSON ({e})"));
    assert_eq!(json["held"], false, "{what}: {json}");
    assert_eq!(
        json["holders"].as_array().map(Vec::len),
        Some(0),
        "{what}: {json}"
    );
}

/// `dlock status` on a SQLite file that does not exist says the lock is free and
/// leaves no file behind; `unlock --force` likewise.
/// A name longer than the backend stores (SQL: 512 bytes) is a usage error (64)
/// for every command — `status` and `unlock --force` as for `exec` — whether the
/// SQLite file exists yet or not; `status` once answered "free" (exit 1) for it.
fn a_name_too_long_for_the_backend_is_refused_by_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("names.db").display());
    let long = "n".repeat(600);
    let commands: [&[&str]; 3] = [
        &["status", &long],
        &["unlock", &long, "--force"],
        &["exec", &long, "--", "true"],
    ];
    // First with no database file (status and unlock do not make one), then with one.
    for file_exists in [false, true] {
        for args in commands {
            let out = dlock(&url, "", args);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(
                out.status.code(),
                Some(64),
                "{} (file exists: {file_exists}): {stderr}",
                args[0]
            );
            assert!(stderr.contains("600 bytes"), "{}: {stderr}", args[0]);
        }
        let out = dlock(&url, "", &["exec", "short", "--", "true"]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn status_creates_no_database_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("never.db");
    // dlock's own URL options are no obstacle to finding the file.
    for url in [
        format!("sqlite://{}", file.display()),
        format!("sqlite://{}?dlock_table_prefix=app_", file.display()),
    ] {
        let out = dlock(&url, "", &["status", "x"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{url}: {stderr}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("x: free"),
            "{url}"
        );
        // The user learns that no database was there (a mistyped path?).
        assert!(
            stderr.contains(&format!("no database file at {}", file.display())),
            "{url}: {stderr}"
        );
        assert_free_json(&dlock(&url, "", &["status", "x", "--json"]), &url);
        let out = dlock(&url, "", &["unlock", "x", "--force"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{url}: {stderr}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("removed 0"),
            "{url}"
        );
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(
            left.is_empty(),
            "{url}: status or unlock made files: {left:?}"
        );
    }
    // An in-memory database has no file to look for: refused, as when locking.
    for url in ["sqlite::memory:", "sqlite://x.db?mode=memory"] {
        let out = dlock(url, "", &["status", "x"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{url}: {stderr}");
    }
}

/// `dlock status NAME --json` on every selected backend: a held lock's holder
/// (owner, mode, token, context, lease left) as JSON with exit status 0; a free
/// lock as `"held": false` with exit status 1.
async fn status_json_says_who_holds_and_exits_by_held_or_free() {
    for (label, url) in sql_urls() {
        let ns = namespace();
        let holder = DistributeLockManager::builder(dlock_api::open_backend(&url).await.unwrap())
            .namespace(ns.clone())
            .context("node-a \"quoted\"")
            .build()
            .unwrap();
        let guard = testsuite::conformance::take(&holder.lock("job"), Duration::ZERO).await;

        let out = dlock(&url, &ns, &["status", "job", "--json"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{label}: held is 0: {stderr}");
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "{label}: not JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        });
        assert_eq!(json["name"], "job", "{label}: {json}");
        assert_eq!(json["held"], true, "{label}: {json}");
        let holders = json["holders"].as_array().unwrap();
        assert_eq!(holders.len(), 1, "{label}: {json}");
        let h = &holders[0];
        assert_eq!(h["mode"], "exclusive", "{label}: {json}");
        assert_eq!(h["token"], guard.fencing_token().get(), "{label}: {json}");
        assert_eq!(h["context"], "node-a \"quoted\"", "{label}: {json}");
        assert!(
            h["owner"].as_str().is_some_and(|o| !o.is_empty()),
            "{label}: {json}"
        );
        let lease = h["remaining_lease_ms"].as_u64();
        if !holder.capabilities().lease {
            assert!(
                h["remaining_lease_ms"].is_null(),
                "{label}: a session hold: {json}"
            );
        } else {
            assert!(
                lease.is_some_and(|ms| ms > 0 && ms <= 30_000),
                "{label}: {json}"
            );
        }

        guard.unlock().await.unwrap();
        assert_free_json(&dlock(&url, &ns, &["status", "job", "--json"]), &label);
        holder.close().await;
    }
}

/// `dlock completions SHELL` prints a completion script the shell accepts (bash:
/// sourced, it registers `dlock`'s completion).
fn completions_register_in_bash() {
    let out = Command::new(DLOCK)
        .args(["completions", "bash"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let script = String::from_utf8(out.stdout).unwrap();
    assert!(
        script.contains("status") && script.contains("elect"),
        "{script}"
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dlock.bash");
    std::fs::write(&file, &script).unwrap();
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!("source {} && complete -p dlock", file.display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("dlock"));
    for shell in ["zsh", "fish", "elvish", "powershell"] {
        let out = Command::new(DLOCK)
            .args(["completions", shell])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{shell}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("dlock"),
            "{shell}"
        );
    }
}

fn log_and_metrics_flags_turn_the_plugins_on() {
    let url = sqlite_url();
    let ns = namespace();
    let out = dlock(&url, &ns, &["--log", "exec", "logged", "--", "true"]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("dlock::access") && err.contains("|acquired|"),
        "{err}"
    );
    assert!(err.contains("|released|"), "{err}");

    let port = metrics_port();
    let fetch = format!(
        "exec 3<>/dev/tcp/127.0.0.1/{port}; printf 'GET /metrics HTTP/1.0\\r\\n\\r\\n' >&3; cat <&3"
    );
    let addr = format!("127.0.0.1:{port}");
    let out = Command::new(DLOCK)
        .args([
            "--backend",
            &url,
            "--metrics-addr",
            &addr,
            "exec",
            "orders:1",
            "--",
            "bash",
            "-c",
            &fetch,
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        body.lines().any(|l| l.starts_with("dlock_acquire_total{")
            && l.contains("outcome=\"acquired\"")
            && l.contains("backend=\"sqlite\"")),
        "{body}"
    );
    assert!(body.contains("group=\"orders\""), "{body}");
    assert!(body.contains("dlock_held"), "{body}");
    // The shipped dashboard's quantile panels read `_bucket` series
    // (`histogram_quantile(…, rate(dlock_acquire_wait_seconds_bucket…))`): the
    // exporter must give the histograms buckets (a summary has none).
    assert!(
        body.lines()
            .any(|l| l.starts_with("dlock_acquire_wait_seconds_bucket{")
                && l.contains("le=\"0.005\"")
                && l.contains("group=\"orders\"")),
        "no dlock_acquire_wait_seconds_bucket series: {body}"
    );
}

/// A `dlock exec` holding a ZooKeeper lock is frozen (SIGSTOP): it can send no
/// heartbeats, the server expires its session, and another client gets the lock.
/// Thawed (SIGCONT), it learns the session is gone, reports the loss and stops its
/// command (exit 76) instead of carrying on as if it still held the lock.
async fn a_frozen_zookeeper_holder_loses_the_lock_and_says_so_when_thawed() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;

    let selected = std::env::var("DLOCK_TEST_BACKENDS").unwrap_or_default();
    if !selected.split(',').any(|l| l.trim() == "zk") {
        eprintln!("zk is not selected in DLOCK_TEST_BACKENDS; nothing to check here");
        return;
    }
    let base =
        std::env::var("DLOCK_ZK_URL").unwrap_or_else(|_| "zk://127.0.0.1:2181/dlock-test".into());
    let url = format!("{base}?session_timeout=2000ms");
    let ns = namespace();
    let other =
        DistributeLockManager::builder(dlock_api::zk::ZkBackend::connect(&base).await.unwrap())
            .namespace(ns.clone())
            .build()
            .unwrap();
    // The command marks that it runs — the holder knows it holds — before it is
    // frozen: the store shows a contender's node (as a waiter, or as the holder)
    // before its client has learned it holds, and a holder frozen in between
    // thaws past its wait (exit 75, seen under load), not as a holder that lost.
    let dir = tempfile::tempdir().unwrap();
    let running = dir.path().join("running");
    let script = format!("touch {}; exec sleep 60", running.display());
    let child = spawn_dlock(&url, &ns, &["exec", "frozen", "--", "sh", "-c", &script]);
    let pid = Pid::from_raw(child.id() as i32);
    assert!(
        testsuite_eventually(|| async { running.exists() }).await,
        "dlock exec never took the lock"
    );
    kill(pid, Signal::SIGSTOP).unwrap();
    let frozen = Instant::now();
    let taken = other.lock("frozen").try_lock(Duration::from_secs(20)).await;
    let taken = taken
        .unwrap()
        .expect("the frozen holder's session expired and the lock was granted");
    let handed_over = frozen.elapsed();
    kill(pid, Signal::SIGCONT).unwrap();
    let thawed = Instant::now();
    let out = finished(child).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(76), "{stderr}");
    assert!(stderr.contains("lock lost"), "{stderr}");
    assert!(
        thawed.elapsed() < Duration::from_secs(10),
        "the thawed holder took {:?} to notice",
        thawed.elapsed()
    );
    eprintln!(
        "handed over {handed_over:?} after the freeze; the thawed holder stopped after {:?}",
        thawed.elapsed()
    );
    taken.unlock().await.unwrap();
    other.close().await;
}

/// `dlock elect` on every selected backend: two processes campaign for one election;
/// the second leads only after the first's command ended (their commands append to
/// one file: start and end of a term are never interleaved), each command gets its
/// term's fencing token and value, the exit status passes through, and `dlock
/// status` shows the leader's value. On SQLite also: `--wait` gives up with 75, and a
/// leadership broken behind the leader's back stops the command with 76.
async fn elect_runs_one_leader_at_a_time() {
    for (label, url) in sql_urls() {
        let ns = namespace();
        let scratch = tempfile::tempdir().unwrap();
        let log = scratch.path().join("terms.log");
        let go = scratch.path().join("go");
        // A leader's term lasts until the test has seen it in `dlock status` and
        // started the second contender (the file `go`; at most 20 s), then 0.5 s: a
        // fixed term could end, under load, before any `status` caught it.
        let script = format!(
            "echo start $DLOCK_LEADER_VALUE $DLOCK_FENCING_TOKEN >> {0}; i=0; \
             while [ ! -e {1} ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; \
             sleep 0.5; echo end $DLOCK_LEADER_VALUE >> {0}; exit 4",
            log.display(),
            go.display()
        );
        let first = spawn_dlock(
            &url,
            &ns,
            &["elect", "chief", "--value", "a", "--", "sh", "-c", &script],
        );
        let last = std::sync::Mutex::new(String::new());
        let leading = testsuite_eventually(|| async {
            let out = dlock(&url, &ns, &["status", "chief"]);
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            let shown = stdout.contains("context=\"a\"");
            *last.lock().unwrap() = format!(
                "{:?}: {stdout}{}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
            );
            shown
        })
        .await;
        assert!(
            leading,
            "{label}: `dlock status` never showed the leader's value; last: {}",
            last.lock().unwrap()
        );
        let second = spawn_dlock(
            &url,
            &ns,
            &["elect", "chief", "--value", "b", "--", "sh", "-c", &script],
        );
        std::fs::write(&go, b"").unwrap();
        let (a, b) = (finished(first).await, finished(second).await);
        for out in [&a, &b] {
            assert_eq!(
                out.status.code(),
                Some(4),
                "{label}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let lines = std::fs::read_to_string(&log).unwrap();
        let words: Vec<Vec<&str>> = lines.lines().map(|l| l.split(' ').collect()).collect();
        assert_eq!(words.len(), 4, "{label}: {lines}");
        assert_eq!(
            (
                words[0][..2].to_vec(),
                words[1].clone(),
                words[2][..2].to_vec(),
                words[3].clone()
            ),
            (
                vec!["start", "a"],
                vec!["end", "a"],
                vec!["start", "b"],
                vec!["end", "b"]
            ),
            "{label}: terms overlapped or came out of order: {lines}"
        );
        let (t1, t2): (u64, u64) = (words[0][2].parse().unwrap(), words[2][2].parse().unwrap());
        assert!(t2 > t1, "{label}: tokens {t1} then {t2}");
    }

    let url = sqlite_url();
    let ns = namespace();
    let holder = holder_on(&url, &ns).await;
    let term = holder
        .election("busy")
        .try_campaign("someone", Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    gives_up_after_its_wait(&url, &ns, "elect");
    term.resign().await.unwrap();

    breaking_the_hold_stops_the_command(&url, &ns, &holder, "elect", "leadership").await;
    holder.close().await;
}

/// `dlock sem` on every backend the command reaches: with 2 of 3 permits held by
/// another client, `--take 2` gives up after its wait (75), `dlock status` shows the
/// holder's permits, and `--take 1` runs the command (its exit status and the
/// fencing token pass through); a count above the total, or another total while the
/// semaphore is held, is refused (64).
async fn sem_runs_the_command_holding_permits() {
    let code = |out: &Output| {
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for (label, url) in sql_urls() {
        let ns = namespace();
        let holder = holder_on(&url, &ns).await;
        if !holder.capabilities().semaphore {
            println!("{label}: no semaphores on this backend (the chain refuses them)");
            continue;
        }
        let held = holder
            .semaphore("pool", 3)
            .try_acquire(2, Duration::ZERO)
            .await
            .unwrap()
            .expect("2 free permits");
        // `dlock sem pool ARGS…`.
        let sem = |args: &[&str]| {
            let mut all = vec!["sem", "pool"];
            all.extend(args);
            dlock(&url, &ns, &all)
        };
        let started = Instant::now();
        let out = sem(&[
            "--permits",
            "3",
            "--take",
            "2",
            "--wait",
            "300ms",
            "--",
            "true",
        ]);
        assert_eq!(code(&out).0, Some(75), "{label}: {}", code(&out).1);
        assert!(started.elapsed() >= Duration::from_millis(300), "{label}");
        let out = dlock(&url, &ns, &["status", "pool"]);
        let status = String::from_utf8_lossy(&out.stdout);
        assert!(status.contains("held permits(2) by"), "{label}: {status}");
        let out = sem(&[
            "--permits",
            "3",
            "--",
            "sh",
            "-c",
            "test -n \"$DLOCK_FENCING_TOKEN\" && exit 5",
        ]);
        assert_eq!(code(&out).0, Some(5), "{label}: {}", code(&out).1);
        for bad in [
            ["--permits", "3", "--take", "4", "--", "true"],
            ["--permits", "5", "--take", "1", "--", "true"],
        ] {
            let out = sem(&bad);
            assert_eq!(code(&out).0, Some(64), "{label} {bad:?}: {}", code(&out).1);
        }
        held.release().await.unwrap();
        holder.close().await;
    }
}

/// `url` (with credentials) with every host's port made 1, where nobody listens.
fn with_every_port_closed(url: &str) -> String {
    let (head, rest) = url.split_once('@').expect("a URL with credentials");
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let hosts: Vec<String> = rest[..end]
        .split(',')
        .map(|h| format!("{}:1", h.rsplit_once(':').map_or(h, |(host, _)| host)))
        .collect();
    format!("{head}@{}{}", hosts.join(","), &rest[end..])
}

/// Everything a user sees of a client whose URL holds a password, on every selected
/// backend with credentials (MariaDB, PostgreSQL, Redis, ZooKeeper; SQLite and memory
/// have none): `--help` with the URL in `DLOCK_URL`; `exec` with the access log
/// (tracing) and the Prometheus endpoint on, running `status` while it holds the
/// lock and fetching the metrics; `status` and `unlock` after; a connection refused,
/// with the password in its URL; with the URL in `DLOCK_URL`, the command lines of
/// `demo`'s workers (what `ps` shows every user) and the environment of the command
/// `exec` runs (no `DLOCK_URL` in it); and, for programs, `Debug` of a manager and
/// an error's `Display`/`Debug` down its source chain. The password shows nowhere —
/// and each surface is checked to have been produced.
async fn a_planted_password_shows_nowhere_a_user_looks() {
    for label in testsuite::runner::selected() {
        let password = format!("Pl4nted-{label}-{:08x}", fastrand::u32(..));
        let Some(url) = testsuite::backends::url_with_password(&label, &password)
            .await
            .unwrap()
        else {
            continue;
        };
        let ns = namespace();
        let mut seen = vec![format!("--- help\n{}", help_with_dlock_url(&url))];
        let mut record = |what: &str, out: &Output| {
            seen.push(format!(
                "--- {what}\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        };
        let port = metrics_port();
        let inner = format!(
            "{DLOCK} --backend '{url}' --namespace '{ns}' status planted:1; \
             exec 3<>/dev/tcp/127.0.0.1/{port}; printf 'GET /metrics HTTP/1.0\\r\\n\\r\\n' >&3; cat <&3"
        );
        let addr = format!("127.0.0.1:{port}");
        let held = dlock(
            &url,
            &ns,
            &[
                "--log",
                "--metrics-addr",
                &addr,
                "exec",
                "planted:1",
                "--",
                "bash",
                "-c",
                &inner,
            ],
        );
        assert!(
            held.status.success(),
            "{label}: {}",
            String::from_utf8_lossy(&held.stderr)
        );
        let shown = String::from_utf8_lossy(&held.stdout);
        assert!(
            shown.contains("planted:1: held"),
            "{label}: status while held: {shown}"
        );
        assert!(
            shown.contains("dlock_acquire_total"),
            "{label}: metrics: {shown}"
        );
        assert!(
            String::from_utf8_lossy(&held.stderr).contains("dlock::access"),
            "{label}: the access log"
        );
        record("exec --log --metrics-addr (status, metrics)", &held);
        for args in [
            &["status", "planted:1"][..],
            &["status", "planted:1", "--json"][..],
            &["unlock", "planted:1"][..],
        ] {
            let out = dlock(&url, &ns, args);
            record(args[0], &out);
        }
        // The same credentials towards a port nobody listens on: the error names the
        // place, not the password.
        let refused_url = with_every_port_closed(&url);
        let refused = dlock(&refused_url, &ns, &["--log", "status", "planted:1"]);
        assert!(!refused.status.success(), "{label}: {refused_url} answered");
        record("refused", &refused);
        // What a program embedding dlock prints: Debug of the manager, and an
        // error with its whole source chain.
        let manager = holder_on(&url, &ns).await;
        seen.push(format!("--- manager\n{manager:?}"));
        manager.close().await;
        let error = match dlock_api::open_backend(&refused_url).await {
            Ok(_) => panic!("{label}: {refused_url} answered"),
            Err(e) => e,
        };
        let mut chain = format!("--- error\n{error}\n{error:?}");
        let mut source = std::error::Error::source(&error);
        while let Some(s) = source {
            chain.push_str(&format!("\n{s}\n{s:?}"));
            source = s.source();
        }
        seen.push(chain);
        // With the URL in DLOCK_URL, as the README advises: `demo`'s workers' command
        // lines (what `ps` shows every user), and the environment of the command
        // `exec` runs.
        seen.push(format!(
            "--- demo's command lines\n{}",
            demo_command_lines(&url, &ns, &label)
        ));
        let env = command_in_env(&url, &ns, &["exec", "planted:2", "--", "env"])
            .output()
            .expect("run dlock");
        let child_env = String::from_utf8_lossy(&env.stdout);
        assert!(
            env.status.success() && child_env.contains("DLOCK_FENCING_TOKEN="),
            "{label}: exec env: {child_env}{}",
            String::from_utf8_lossy(&env.stderr)
        );
        assert!(
            !child_env.lines().any(|l| l.starts_with("DLOCK_URL=")),
            "{label}: the command exec runs got DLOCK_URL"
        );
        seen.push(format!(
            "--- exec -- env (DLOCK_URL set)\n{child_env}{}",
            String::from_utf8_lossy(&env.stderr)
        ));
        let everything = seen.concat();
        assert!(
            !everything.contains(&password),
            "{label}: the password shows:\n{everything}"
        );
    }
}

/// `dlock` with the backend URL in `DLOCK_URL` (not `--backend`).
fn command_in_env(url: &str, namespace: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(DLOCK);
    cmd.env("DLOCK_URL", url)
        .arg("--namespace")
        .arg(namespace)
        .args(args)
        .stdin(Stdio::null());
    cmd
}

/// The command lines of every process on the machine while `dlock demo` (URL in
/// `DLOCK_URL`) runs, read until both of its workers have been seen (bounded by the
/// demo's own run: it fails the test if the demo ends first).
fn demo_command_lines(url: &str, ns: &str, label: &str) -> String {
    let mut demo = command_in_env(
        url,
        ns,
        &[
            "demo",
            "--workers",
            "2",
            "--iterations",
            "30",
            "--lock",
            "planted:3",
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("run dlock demo");
    let mut lines = std::collections::BTreeSet::new();
    let mut workers = std::collections::BTreeSet::new();
    while workers.len() < 2 {
        let done = demo.try_wait().expect("the demo's status").is_some();
        for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
            let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let line = String::from_utf8_lossy(&raw).replace('\0', " ");
            if line.contains(" worker --id ") && line.contains(ns) {
                workers.insert(entry.file_name());
            }
            lines.insert(line);
        }
        assert!(
            !done || workers.len() == 2,
            "{label}: the demo ended before both its workers were seen"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let status = demo.wait().expect("the demo's status");
    assert!(status.success(), "{label}: demo failed ({status})");
    lines.into_iter().collect::<Vec<_>>().join("\n")
}

/// `dlock exec --context` stores its text with the hold (shown by `dlock status`),
/// and `--max-hold` gives the lock back and stops the command at the bound (exit
/// 76, saying why), leaving the lock free.
async fn exec_stores_its_context_and_keeps_to_max_hold() {
    holds_with_context_until_max_hold(&["exec", "ctx"], "ctx", "lock lost (max_hold)").await;
}

/// `dlock sem` does the same with its permits.
async fn sem_stores_its_context_and_keeps_to_max_hold() {
    holds_with_context_until_max_hold(&["sem", "slots", "--permits", "2"], "slots", "max_hold")
        .await;
}

/// Runs `dlock <command> --context … --max-hold 2s -- sleep 30` on `name`: the hold
/// shows the context (to `inspect` and `dlock status`), the command is stopped at
/// the bound with exit 76 and `says` on stderr, within 10 s, and the name is free.
async fn holds_with_context_until_max_hold(command: &[&str], name: &str, says: &str) {
    let url = sqlite_url();
    let ns = namespace();
    let holder = holder_on(&url, &ns).await;
    let context = "job=nightly host=web-3";
    let started = Instant::now();
    let mut args = command.to_vec();
    args.extend([
        "--context",
        context,
        "--max-hold",
        "2s",
        "--",
        "sleep",
        "30",
    ]);
    let child = spawn_dlock(&url, &ns, &args);
    let held = testsuite_eventually(|| async {
        holder
            .inspect(name)
            .await
            .unwrap()
            .is_some_and(|s| s.holders.iter().any(|h| h.context == context))
    })
    .await;
    assert!(held, "dlock {command:?} never held {name} with its context");
    let out = dlock(&url, &ns, &["status", name]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("context={context:?}")),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let status = finished(child).await;
    let stderr = String::from_utf8_lossy(&status.stderr);
    assert_eq!(status.status.code(), Some(76), "{stderr}");
    assert!(stderr.contains(says), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the command was not stopped at its max-hold"
    );
    let free = testsuite_eventually(|| async {
        holder
            .inspect(name)
            .await
            .unwrap()
            .is_none_or(|s| s.holders.is_empty())
    })
    .await;
    assert!(free, "{name} stayed held after max-hold");
    holder.close().await;
}

/// `dlock status` and `dlock unlock` on MariaDB and PostgreSQL create nothing and
/// need only what they do: on a database without dlock's tables of the URL's
/// prefix, both answer "nothing held" (saying so on stderr) and leave no table
/// behind; a user allowed `SELECT` only reads a held lock's status, and its `unlock
/// --force` is refused as a permission error (exit 78, "permission denied") that
/// leaves the lock held. (Both ran the migrations: a fresh database got the tables,
/// and the read-only user failed with exit 69 at `op=migrate`.)
async fn status_and_unlock_create_no_tables_and_need_select_only() {
    use dlock_api::jdbc::sqlx::{self, Connection};
    let chosen: Vec<String> = demo_labels()
        .into_iter()
        .filter(|l| matches!(l.as_str(), "mysql" | "postgres"))
        .collect();
    if chosen.is_empty() {
        eprintln!("neither mysql nor postgres is selected; nothing to check here");
        return;
    }
    for label in chosen {
        let run = format!("{:x}", fastrand::u32(..));
        let prefix = format!("ro{run}_");
        let user = format!("dlock_ro_{run}");
        let (admin, reader, tables_like) = match label.as_str() {
            "mysql" => (
                "mysql://root@127.0.0.1:3306/test".to_owned(),
                format!("mysql://{user}@127.0.0.1:3306/test"),
                "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = 'test' AND table_name LIKE ?",
            ),
            _ => (
                "postgres://postgres@127.0.0.1:5432/test".to_owned(),
                format!("postgres://{user}@127.0.0.1:5432/test"),
                "SELECT COUNT(*) FROM pg_tables WHERE tablename LIKE $1",
            ),
        };
        let tables = || async {
            let like = format!("{prefix}%");
            let n: i64 = match label.as_str() {
                "mysql" => {
                    let mut c = sqlx::MySqlConnection::connect(&admin).await.unwrap();
                    sqlx::query_scalar(tables_like)
                        .bind(like)
                        .fetch_one(&mut c)
                        .await
                        .unwrap()
                }
                _ => {
                    let mut c = sqlx::PgConnection::connect(&admin).await.unwrap();
                    sqlx::query_scalar(tables_like)
                        .bind(like)
                        .fetch_one(&mut c)
                        .await
                        .unwrap()
                }
            };
            n
        };
        let url = format!("{admin}?dlock_table_prefix={prefix}");
        let out = dlock(&url, "", &["status", "x"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{label}: {stderr}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("x: free"),
            "{label}"
        );
        assert!(stderr.contains("no dlock tables"), "{label}: {stderr}");
        let out = dlock(&url, "", &["unlock", "x", "--force"]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{label}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            tables().await,
            0,
            "{label}: status or unlock created tables"
        );

        // The tables, a held lock, and a user allowed SELECT only.
        let holder = holder_on(&url, "").await;
        let g = holder
            .lock("x")
            .try_lock(Duration::ZERO)
            .await
            .unwrap()
            .unwrap();
        let setup: Vec<String> = match label.as_str() {
            "mysql" => vec![
                format!("CREATE USER '{user}'@'127.0.0.1'"),
                format!("GRANT SELECT ON test.* TO '{user}'@'127.0.0.1'"),
            ],
            _ => {
                let mut v = vec![format!("CREATE ROLE {user} LOGIN")];
                for t in ["locks", "readers", "waiters", "schema_version"] {
                    v.push(format!("GRANT SELECT ON {prefix}{t} TO {user}"));
                }
                v
            }
        };
        let run_admin = |statements: Vec<String>| async {
            match label.as_str() {
                "mysql" => {
                    let mut c = sqlx::MySqlConnection::connect(&admin).await.unwrap();
                    for sql in statements {
                        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                            .execute(&mut c)
                            .await
                            .unwrap();
                    }
                }
                _ => {
                    let mut c = sqlx::PgConnection::connect(&admin).await.unwrap();
                    for sql in statements {
                        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                            .execute(&mut c)
                            .await
                            .unwrap();
                    }
                }
            }
        };
        run_admin(setup).await;
        let read_only = format!("{reader}?dlock_table_prefix={prefix}");
        let out = dlock(&read_only, "", &["status", "x"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{label}: a read-only status: {stderr}"
        );
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("x: held"),
            "{label}"
        );
        let out = dlock(&read_only, "", &["unlock", "x", "--force"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(78),
            "{label}: a read-only unlock: {stderr}"
        );
        assert!(stderr.contains("permission denied"), "{label}: {stderr}");
        assert!(!g.is_lost(), "{label}");
        let state = holder.inspect("x").await.unwrap().unwrap_or_default();
        assert_eq!(
            state.holders.len(),
            1,
            "{label}: the refused unlock freed the lock"
        );
        g.unlock().await.unwrap();
        holder.close().await;
        let teardown: Vec<String> = match label.as_str() {
            "mysql" => {
                let mut v = vec![format!("DROP USER '{user}'@'127.0.0.1'")];
                for t in ["waiters", "readers", "locks", "schema_version"] {
                    v.push(format!("DROP TABLE IF EXISTS {prefix}{t}"));
                }
                v
            }
            _ => {
                let mut v = Vec::new();
                for t in ["waiters", "readers", "locks", "schema_version"] {
                    v.push(format!("DROP TABLE IF EXISTS {prefix}{t}"));
                }
                v.push(format!("DROP ROLE {user}"));
                v
            }
        };
        run_admin(teardown).await;
    }
}

/// A loopback port for `--metrics-addr` that is free now, below the kernel's range
/// of ephemeral ports (32768 and up here), so no connection's own local port can take
/// it before the command binds it (a random port up to 40000 once did).
fn metrics_port() -> u16 {
    for _ in 0..100 {
        let port = 30_000 + fastrand::u16(..2_700);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in 30000–32699 on 127.0.0.1 after 100 tries");
}

fn main() -> std::process::ExitCode {
    let args = libtest_mimic::Arguments::from_args();
    let mut trials = testsuite::trials![
        sync exec_passes_the_exit_status_and_the_fencing_token,
        tokio exec_gives_up_after_wait_and_stops_the_command_when_the_lock_is_lost,
        sync status_unlock_and_input_errors,
        sync help_does_not_show_the_password_in_dlock_url,
        sync usage_errors_exit_64_and_help_succeeds,
        sync completions_into_a_closed_pipe_end_quietly,
        sync the_about_text_names_every_backend,
        sync status_creates_no_database_file,
        tokio status_and_unlock_create_no_tables_and_need_select_only,
        sync a_name_too_long_for_the_backend_is_refused_by_every_command,
        tokio status_json_says_who_holds_and_exits_by_held_or_free,
        sync completions_register_in_bash,
        sync log_and_metrics_flags_turn_the_plugins_on,
        tokio a_frozen_zookeeper_holder_loses_the_lock_and_says_so_when_thawed,
        tokio elect_runs_one_leader_at_a_time,
        tokio sem_runs_the_command_holding_permits,
        tokio a_planted_password_shows_nowhere_a_user_looks,
        tokio exec_stores_its_context_and_keeps_to_max_hold,
        tokio sem_stores_its_context_and_keeps_to_max_hold,
    ];
    // The load runs, one trial per backend: each is minutes of lock hand-overs on
    // its own, and none waits for another's.
    for label in demo_labels() {
        let l = label.clone();
        trials.push(testsuite::runner::plain_trial(
            format!("three_processes_share_one_counter_without_losing_updates::{label}"),
            move || three_processes_share_one_counter_without_losing_updates(&l),
        ));
        trials.push(testsuite::runner::plain_trial(
            format!("drop_then_relock_loses_no_update::{label}"),
            move || drop_then_relock_loses_no_update(&label),
        ));
    }
    libtest_mimic::run(&args, trials).exit_code()
}
