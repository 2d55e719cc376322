//! `dlock elect`: run a command while this process leads an election.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use crate::exit::Failure;
use crate::parse_duration;
use crate::supervise::{run_holding, Asked, RunArgs};

#[derive(Args, Debug)]
pub(crate) struct ElectArgs {
    /// The election's name (`dlock status NAME` shows who leads).
    name: String,
    /// The leader's value, shown to everyone who asks who leads (default: `pid=<pid>`).
    #[arg(long)]
    value: Option<String>,
    /// Give up if not leading within this long (exit 75); default: wait as long as it takes.
    #[arg(long, value_parser = parse_duration)]
    wait: Option<Duration>,
    #[command(flatten)]
    run: RunArgs,
}

pub(crate) async fn run(
    backend: &str,
    namespace: &str,
    args: ElectArgs,
) -> Result<ExitCode, Failure> {
    let manager = crate::connect(backend, namespace, Some(args.run.lease)).await?;
    let election = manager.election(&args.name);
    let value = args
        .value
        .unwrap_or_else(|| format!("pid={}", std::process::id()));
    let campaign = match args.wait {
        Some(wait) => election.try_campaign(value.clone(), wait).await,
        None => election.campaign(value.clone()).await.map(Some),
    };
    let env = vec![("DLOCK_LEADER_VALUE", value)];
    let asked = Asked {
        name: &args.name,
        what: "leadership",
        wait: args.wait.unwrap_or_default(),
    };
    run_holding(manager, asked, &args.run.command, env, campaign).await
}
