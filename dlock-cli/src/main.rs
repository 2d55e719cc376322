//! `dlock` — distributed locks from the shell.
//!
//! The backend comes from `--backend URL` or `DLOCK_URL`, defaulting to the SQLite
//! file `dlock.db` in the working directory.

mod demo;
mod elect;
mod exec;
mod exit;
mod sem;
mod status;
mod supervise;

use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, Parser, Subcommand};
use dlock_api::DistributeLockManager;

use crate::exit::Failure;

/// The one-line description `--help` starts with: every backend the command reaches.
const ABOUT: &str = "Distributed locks, leader election and semaphores from the shell, on SQLite, MariaDB/MySQL, PostgreSQL, Redis (single, Cluster, Sentinel or Redlock, over TLS too), ZooKeeper, etcd (over TLS too; built with the etcd feature), NATS JetStream or in memory";

/// The environment variable that holds the backend URL when `--backend` is not
/// given. The commands `exec`, `elect` and `sem` run do not get it (it may hold the
/// store's password; pass a command what it needs itself).
pub(crate) const BACKEND_ENV: &str = "DLOCK_URL";

/// The command line.
#[derive(Parser, Debug)]
#[command(name = "dlock", version, about = ABOUT, long_about = None)]
struct Cli {
    /// Backend URL: sqlite://FILE, mysql://USER@HOST/DB, postgres://USER@HOST/DB, redis://HOST:6379, redis+cluster://H1,H2 (rediss://, rediss+cluster:// for TLS), zk://H1:2181,H2:2181/ROOT, memory://
    #[arg(
        long,
        env = BACKEND_ENV,
        // Its value may hold a password: --help names the variable, not its value.
        hide_env_values = true,
        default_value = "sqlite://dlock.db",
        global = true
    )]
    backend: String,

    /// Prefix put in front of every lock name.
    #[arg(long, default_value = "", global = true)]
    namespace: String,

    /// Log every acquire and release (spans and the `dlock::access` line) to stderr.
    /// RUST_LOG, when set, refines what is shown.
    #[arg(long, global = true)]
    log: bool,

    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9187).
    #[arg(long, value_name = "ADDR", global = true)]
    metrics_addr: Option<std::net::SocketAddr>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Worker processes increment a shared counter under one lock; the final counter
    /// must equal the number of successful acquisitions.
    Demo(demo::DemoArgs),
    /// Runs a command while holding a lock (a distributed flock(1)).
    Exec(exec::ExecArgs),
    /// Runs a command while this process leads an election (stopped if the
    /// leadership is lost; exit codes as for exec).
    Elect(elect::ElectArgs),
    /// Runs a command while holding permits of a semaphore (exit codes as for exec).
    Sem(sem::SemArgs),
    /// Shows who holds a lock (or leads the election, or holds the semaphore's
    /// permits, of that name). Exit status 0 when held, 1 when free.
    Status(status::StatusArgs),
    /// Removes a lock behind its holders' backs.
    Unlock {
        /// The lock name.
        name: String,
        /// Confirms that you mean to break another process's lock.
        #[arg(long)]
        force: bool,
    },
    /// Prints a completion script for a shell, e.g. `dlock completions bash >
    /// ~/.local/share/bash-completion/completions/dlock`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// One demo worker (started by `dlock demo`).
    #[command(hide = true)]
    Worker(demo::WorkerArgs),
}

/// The global flags a worker process inherits (logging only: metrics stay with the
/// parent, which serves them).
pub(crate) fn worker_flags() -> Vec<&'static str> {
    match PLUGINS.get() {
        Some(p) if p.log => vec!["--log"],
        _ => Vec::new(),
    }
}

/// Parses durations such as `500ms`, `10s`, `2m`.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e}; write durations like 500ms, 10s or 2m"))
}

/// Parses a lease: a duration within the range every manager accepts, so that a
/// lease out of it is a usage error (64) found before anything connects.
pub(crate) fn parse_lease(s: &str) -> Result<Duration, String> {
    let lease = parse_duration(s)?;
    match dlock_api::spi::lease_out_of_range(lease) {
        Some(why) => Err(format!("a lease of {why} (30s is usual)")),
        None => Ok(lease),
    }
}

/// Which plugins the global flags turned on.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Plugins {
    pub(crate) log: bool,
    pub(crate) metrics: bool,
}

static PLUGINS: std::sync::OnceLock<Plugins> = std::sync::OnceLock::new();

pub(crate) async fn connect(
    cli_backend: &str,
    namespace: &str,
    lease: Option<Duration>,
) -> Result<DistributeLockManager, Failure> {
    let resource = dlock_api::open_backend(cli_backend)
        .await
        .map_err(Failure::from)?;
    manager_on(resource, namespace, lease)
}

/// A manager on an opened backend, with the plugins the global flags turned on.
pub(crate) fn manager_on(
    resource: std::sync::Arc<dyn dlock_api::LockRemoteResource>,
    namespace: &str,
    lease: Option<Duration>,
) -> Result<DistributeLockManager, Failure> {
    let mut builder = dlock_api::DistributeLockManager::builder(resource).namespace(namespace);
    let plugins = PLUGINS.get().copied().unwrap_or_default();
    if plugins.log {
        builder = builder.with_handler(dlock_api::logging::LoggingHandler::default());
    }
    if plugins.metrics {
        builder = builder.with_handler(dlock_api::metrics::MetricsHandler::default());
    }
    if let Some(lease) = lease {
        builder = builder.lease(lease);
    }
    builder.build().map_err(Failure::from)
}

/// Prints the completion script for `shell`, written whole. A reader that closed
/// the pipe early (`dlock completions bash | head`) took what it wanted: that ends
/// the command quietly, as it does `cat`; any other write error is a failure.
fn completions(shell: clap_complete::Shell) -> Result<ExitCode, Failure> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "dlock", &mut script);
    let mut out = std::io::stdout().lock();
    match std::io::Write::write_all(&mut out, &script)
        .and_then(|()| std::io::Write::flush(&mut out))
    {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(ExitCode::SUCCESS),
        Err(e) => Err(Failure::new(
            exit::SOFTWARE,
            format!("cannot write the completion script: {e}"),
        )),
    }
}

/// The Prometheus exporter of `--metrics-addr`: histograms with
/// [`SECONDS_BUCKETS`](dlock_api::metrics::SECONDS_BUCKETS) bounds, so the shipped
/// dashboard's `histogram_quantile(…_bucket)` panels have series to read (without
/// buckets the exporter writes summaries).
fn prometheus(
    addr: std::net::SocketAddr,
) -> Result<metrics_exporter_prometheus::PrometheusBuilder, metrics_exporter_prometheus::BuildError>
{
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets(dlock_api::metrics::SECONDS_BUCKETS)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    // The process' rustls crypto provider, which the redis crate's TLS uses (an
    // application's choice: libraries install none).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            // Help and version go to stdout and succeed; every usage error clap finds
            // is EX_USAGE, as dlock's own are.
            let code = if err.use_stderr() { exit::USAGE } else { 0 };
            let _ = err.print();
            return ExitCode::from(code);
        }
    };
    if cli.log {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init();
    }
    if let Some(addr) = cli.metrics_addr {
        if let Err(e) = prometheus(addr).and_then(|p| p.install()) {
            eprintln!("dlock: cannot serve metrics on {addr}: {e}");
            return ExitCode::from(exit::CONFIG);
        }
    }
    let _ = PLUGINS.set(Plugins {
        log: cli.log,
        metrics: cli.metrics_addr.is_some(),
    });
    let result = match cli.command {
        Command::Demo(args) => demo::run(&cli.backend, &cli.namespace, args).await,
        Command::Worker(args) => demo::worker(&cli.backend, &cli.namespace, args).await,
        Command::Exec(args) => exec::run(&cli.backend, &cli.namespace, args).await,
        Command::Elect(args) => elect::run(&cli.backend, &cli.namespace, args).await,
        Command::Sem(args) => sem::run(&cli.backend, &cli.namespace, args).await,
        Command::Status(args) => status::status(&cli.backend, &cli.namespace, args).await,
        Command::Unlock { name, force } => {
            status::unlock(&cli.backend, &cli.namespace, &name, force).await
        }
        Command::Completions { shell } => completions(shell),
    };
    match result {
        Ok(code) => code,
        Err(failure) => {
            eprintln!("dlock: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}

#[cfg(test)]
mod tests {
    /// Both histograms the dashboard reads come out of the CLI's exporter as
    /// `_bucket` series (the hold's is recorded at a release, after the CLI's own
    /// command ended, so the scrape in `tests/cli.rs` sees only the wait's).
    #[test]
    fn the_exporter_writes_buckets_for_the_dashboards_histograms() {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        let recorder = super::prometheus(addr)
            .map(|p| p.build_recorder())
            .unwrap_or_else(|e| panic!("exporter: {e}"));
        metrics::with_local_recorder(&recorder, || {
            metrics::histogram!("dlock_acquire_wait_seconds", "group" => "orders").record(0.003);
            metrics::histogram!("dlock_hold_seconds", "group" => "orders").record(0.2);
        });
        let body = recorder.handle().render();
        for name in ["dlock_acquire_wait_seconds", "dlock_hold_seconds"] {
            assert!(
                body.contains(&format!("{name}_bucket{{group=\"orders\",le=\"0.005\"}}")),
                "{name}: {body}"
            );
        }
    }
}
