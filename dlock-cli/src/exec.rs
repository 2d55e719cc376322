//! `dlock exec`: run a command while holding a lock (a distributed flock(1)).

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use dlock_api::LockOptions;

use crate::exit::Failure;
use crate::parse_duration;
use crate::supervise::{not_acquired, run_holding, RunArgs};

#[derive(Args, Debug)]
pub(crate) struct ExecArgs {
    /// The lock's name.
    name: String,
    /// How long to wait for the lock before giving up (exit 75).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    wait: Duration,
    /// What to store with the hold, shown by `dlock status` (default: `pid=PID`).
    #[arg(long, value_name = "TEXT")]
    context: Option<String>,
    /// The longest the command may hold the lock: then the lock is given back and
    /// the command stopped, as when the lock is lost (exit 76).
    #[arg(long, value_parser = parse_duration)]
    max_hold: Option<Duration>,
    #[command(flatten)]
    run: RunArgs,
}

pub(crate) async fn run(
    backend: &str,
    namespace: &str,
    args: ExecArgs,
) -> Result<ExitCode, Failure> {
    let manager = crate::connect(backend, namespace, Some(args.run.lease)).await?;
    let lock = manager.lock(&args.name);
    let mut options = LockOptions::new();
    if let Some(context) = args.context {
        options = options.context(context);
    }
    if let Some(max_hold) = args.max_hold {
        options = options.max_hold(max_hold);
    }
    let acquired = lock.try_lock_with(args.wait, &options).await;
    let Some(guard) = acquired.map_err(Failure::from)? else {
        manager.close().await;
        return Err(not_acquired(&args.name, "lock", args.wait));
    };
    let held = (guard.fencing_token(), guard.lost_signal());
    let command = &args.run.command;
    run_holding(
        manager,
        &args.name,
        "lock",
        command,
        Vec::new(),
        held,
        guard.unlock(),
    )
    .await
}
