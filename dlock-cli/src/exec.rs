//! `dlock exec`: run a command while holding a lock (a distributed flock(1)).

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};

use crate::exit::{Failure, LOCK_LOST, NOT_ACQUIRED, SOFTWARE};
use crate::parse_duration;

#[derive(Args, Debug)]
pub(crate) struct ExecArgs {
    /// The lock's name.
    name: String,
    /// How long to wait for the lock before giving up (exit 75).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    wait: Duration,
    /// The lease, renewed every lease/3 while the command runs.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    lease: Duration,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

enum Outcome {
    Exited(std::process::ExitStatus),
    Lost(dlock_api::LostReason),
    Signalled(Signal),
}

/// Sends `sig` to the child, waits up to `grace`, then kills it.
async fn stop(child: &mut Child, sig: Signal, grace: Duration) {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let _ = kill(Pid::from_raw(pid), sig);
    }
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        let _ = child.kill().await;
    }
}

fn code_of(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(1),
        _ => 1,
    }
}

pub(crate) async fn run(
    backend: &str,
    namespace: &str,
    args: ExecArgs,
) -> Result<ExitCode, Failure> {
    let manager = crate::connect(backend, namespace, Some(args.lease)).await?;
    let lock = manager.lock(&args.name);
    let Some(guard) = lock.try_lock(args.wait).await.map_err(Failure::from)? else {
        manager.close().await;
        return Err(Failure::new(
            NOT_ACQUIRED,
            format!(
                "{}: not acquired within {}",
                args.name,
                humantime::format_duration(args.wait)
            ),
        ));
    };
    let (program, rest) = args
        .command
        .split_first()
        .ok_or_else(|| Failure::new(SOFTWARE, "no command"))?;
    let mut child = match Command::new(program)
        .args(rest)
        .env("DLOCK_FENCING_TOKEN", guard.fencing_token().to_string())
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            let _ = guard.unlock().await;
            manager.close().await;
            return Err(Failure::new(127, format!("cannot run {program:?}: {e}")));
        }
    };
    let mut term =
        signal(SignalKind::terminate()).map_err(|e| Failure::new(SOFTWARE, e.to_string()))?;
    let mut int =
        signal(SignalKind::interrupt()).map_err(|e| Failure::new(SOFTWARE, e.to_string()))?;
    let outcome = tokio::select! {
        status = child.wait() => match status {
            Ok(status) => Outcome::Exited(status),
            Err(e) => return Err(Failure::new(SOFTWARE, format!("waiting for {program:?}: {e}"))),
        },
        reason = guard.lost() => Outcome::Lost(reason),
        _ = term.recv() => Outcome::Signalled(Signal::SIGTERM),
        _ = int.recv() => Outcome::Signalled(Signal::SIGINT),
    };
    let code = match outcome {
        Outcome::Exited(status) => match guard.unlock().await {
            Ok(()) => code_of(status),
            Err(e) => {
                eprintln!(
                    "dlock: {}: the command finished but the lock was not held to the end: {e}",
                    args.name
                );
                LOCK_LOST
            }
        },
        Outcome::Lost(reason) => {
            eprintln!(
                "dlock: {}: lock lost ({reason}); stopping the command",
                args.name
            );
            stop(&mut child, Signal::SIGTERM, Duration::from_secs(5)).await;
            drop(guard);
            LOCK_LOST
        }
        Outcome::Signalled(sig) => {
            stop(&mut child, sig, Duration::from_secs(10)).await;
            let _ = guard.unlock().await;
            u8::try_from(128 + sig as i32).unwrap_or(1)
        }
    };
    manager.close().await;
    Ok(ExitCode::from(code))
}
