//! `dlock exec`: run a command while holding a lock (a distributed flock(1)).

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use crate::exit::Failure;
use crate::parse_duration;
use crate::supervise::{run_holding, Asked, HoldArgs, RunArgs};

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
    let acquired = manager
        .lock(&args.name)
        .try_lock_with(args.wait, &args.hold.options())
        .await;
    let asked = Asked {
        name: &args.name,
        what: "lock",
        wait: args.wait,
    };
    run_holding(manager, asked, &args.run.command, Vec::new(), acquired).await
}
