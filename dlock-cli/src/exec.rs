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

/// How a supervised command ended.
pub(crate) enum Outcome {
    /// It exited on its own.
    Exited(std::process::ExitStatus),
    /// The lock (or leadership) was lost; the command was stopped.
    Lost(dlock_api::LostReason),
    /// dlock was asked to stop; the command got the same signal.
    Signalled(Signal),
}

impl Outcome {
    /// The exit code for `Lost` and `Signalled`; `None` for `Exited`.
    pub(crate) fn stop_code(&self) -> Option<u8> {
        match self {
            Outcome::Exited(_) => None,
            Outcome::Lost(_) => Some(LOCK_LOST),
            Outcome::Signalled(sig) => Some(u8::try_from(128 + *sig as i32).unwrap_or(1)),
        }
    }
}

/// Runs `command` with `env` until it exits, `lost` completes (the command gets
/// SIGTERM, then SIGKILL after 5 s) or dlock gets SIGTERM/SIGINT (passed on; SIGKILL
/// after 10 s). A command that cannot be started fails with exit 127.
pub(crate) async fn supervise(
    what: &str,
    command: &[String],
    env: &[(&str, String)],
    lost: impl std::future::Future<Output = dlock_api::LostReason>,
) -> Result<Outcome, Failure> {
    let (program, rest) = command
        .split_first()
        .ok_or_else(|| Failure::new(SOFTWARE, "no command"))?;
    // Handlers first: a signal right after the spawn must reach the command too.
    let mut term =
        signal(SignalKind::terminate()).map_err(|e| Failure::new(SOFTWARE, e.to_string()))?;
    let mut int =
        signal(SignalKind::interrupt()).map_err(|e| Failure::new(SOFTWARE, e.to_string()))?;
    let mut child = Command::new(program)
        .args(rest)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .spawn()
        .map_err(|e| Failure::new(127, format!("cannot run {program:?}: {e}")))?;
    let outcome = tokio::select! {
        status = child.wait() => match status {
            Ok(status) => Outcome::Exited(status),
            Err(e) => return Err(Failure::new(SOFTWARE, format!("waiting for {program:?}: {e}"))),
        },
        reason = lost => Outcome::Lost(reason),
        _ = term.recv() => Outcome::Signalled(Signal::SIGTERM),
        _ = int.recv() => Outcome::Signalled(Signal::SIGINT),
    };
    match &outcome {
        Outcome::Exited(_) => {}
        Outcome::Lost(reason) => {
            eprintln!("dlock: {what} lost ({reason}); stopping the command");
            stop(&mut child, Signal::SIGTERM, Duration::from_secs(5)).await;
        }
        Outcome::Signalled(sig) => stop(&mut child, *sig, Duration::from_secs(10)).await,
    }
    Ok(outcome)
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

pub(crate) fn code_of(status: std::process::ExitStatus) -> u8 {
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
    let token = guard.fencing_token().to_string();
    let env = [("DLOCK_FENCING_TOKEN", token)];
    let what = format!("{}: lock", args.name);
    let outcome = match supervise(&what, &args.command, &env, guard.lost()).await {
        Ok(outcome) => outcome,
        Err(failure) => {
            let _ = guard.unlock().await;
            manager.close().await;
            return Err(failure);
        }
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
        Outcome::Lost(_) => {
            drop(guard);
            LOCK_LOST
        }
        Outcome::Signalled(_) => {
            let _ = guard.unlock().await;
            outcome.stop_code().unwrap_or(1)
        }
    };
    manager.close().await;
    Ok(ExitCode::from(code))
}
