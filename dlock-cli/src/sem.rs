//! `dlock sem`: run a command while holding permits of a semaphore.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use crate::exit::Failure;
use crate::parse_duration;
use crate::supervise::{run_holding, Asked, HoldArgs, RunArgs};

#[derive(Args, Debug)]
pub(crate) struct SemArgs {
    /// The semaphore's name (`dlock status NAME` shows the permit holders).
    name: String,
    /// The semaphore's total permits (every user of the name must give the same).
    #[arg(long)]
    permits: u32,
    /// How many permits this command takes.
    #[arg(long, default_value_t = 1)]
    take: u32,
    /// How long to wait for the permits before giving up (exit 75).
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
    args: SemArgs,
) -> Result<ExitCode, Failure> {
    let manager = crate::connect(backend, namespace, Some(args.run.lease)).await?;
    let acquired = manager
        .semaphore(&args.name, args.permits)
        .try_acquire_with(args.take, args.wait, &args.hold.options())
        .await;
    let asked = Asked {
        name: &args.name,
        what: "permits",
        wait: args.wait,
    };
    run_holding(manager, asked, &args.run.command, Vec::new(), acquired).await
}
