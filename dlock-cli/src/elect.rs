//! `dlock elect`: run a command while this process leads an election.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use crate::exec::{code_of, supervise, Outcome};
use crate::exit::{Failure, LOCK_LOST, NOT_ACQUIRED};
use crate::parse_duration;

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
    /// The term's lease, renewed every lease/3 while the command runs.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    lease: Duration,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

pub(crate) async fn run(
    backend: &str,
    namespace: &str,
    args: ElectArgs,
) -> Result<ExitCode, Failure> {
    let manager = crate::connect(backend, namespace, Some(args.lease)).await?;
    let election = manager.election(&args.name);
    let value = args
        .value
        .unwrap_or_else(|| format!("pid={}", std::process::id()));
    let campaign = match args.wait {
        Some(wait) => election.try_campaign(value.clone(), wait).await,
        None => election.campaign(value.clone()).await.map(Some),
    };
    let Some(leadership) = campaign.map_err(Failure::from)? else {
        manager.close().await;
        return Err(Failure::new(
            NOT_ACQUIRED,
            format!(
                "{}: not leading within {}",
                args.name,
                humantime::format_duration(args.wait.unwrap_or_default())
            ),
        ));
    };
    let env = [
        (
            "DLOCK_FENCING_TOKEN",
            leadership.fencing_token().to_string(),
        ),
        ("DLOCK_LEADER_VALUE", value),
    ];
    let what = format!("{}: leadership", args.name);
    let outcome = match supervise(&what, &args.command, &env, leadership.lost()).await {
        Ok(outcome) => outcome,
        Err(failure) => {
            let _ = leadership.resign().await;
            manager.close().await;
            return Err(failure);
        }
    };
    let code = match outcome {
        Outcome::Exited(status) => match leadership.resign().await {
            Ok(()) => code_of(status),
            Err(e) => {
                eprintln!(
                    "dlock: {}: the command finished but the leadership was not held to the end: {e}",
                    args.name
                );
                LOCK_LOST
            }
        },
        Outcome::Lost(_) => {
            drop(leadership);
            LOCK_LOST
        }
        Outcome::Signalled(_) => {
            let _ = leadership.resign().await;
            outcome.stop_code().unwrap_or(1)
        }
    };
    manager.close().await;
    Ok(ExitCode::from(code))
}
