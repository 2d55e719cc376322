//! `dlock exec`: run a command while holding a lock (a distributed flock(1)).

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use crate::exit::Failure;
use crate::parse_duration;
use crate::supervise::{not_acquired, run_holding, HoldArgs, RunArgs};

#[derive(Args, Debug)]
pub(crate) struct ExecArgs {
    /// The lock's name.
    name: String,
    /// How long to wait for the lock before giving up (exit 75).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    wait: Duration,
    #[command(flatten)]
    hold: HoldArgs,
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
    let acquired = lock.try_lock_with(args.wait, &args.hold.options()).await;
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
