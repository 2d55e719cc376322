//! Running a command while a hold lasts — a lock (`exec`), a leadership (`elect`),
//! permits (`sem`) — and the exit code it ends with.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use dlock_api::{DistributeLockManager, Hold, LockOptions};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};

use crate::exit::{Failure, LOCK_LOST, NOT_ACQUIRED, SOFTWARE};
use crate::{parse_duration, parse_lease};

/// The arguments every hold-and-run command takes.
#[derive(Args, Debug)]
pub(crate) struct RunArgs {
    /// The lease, renewed every lease/3 while the command runs.
    #[arg(long, default_value = "30s", value_parser = parse_lease)]
    pub(crate) lease: Duration,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true)]
    pub(crate) command: Vec<String>,
}

/// What a hold-and-run command stores with its hold and how long it may keep it.
#[derive(Args, Debug)]
pub(crate) struct HoldArgs {
    /// What to store with the hold, shown by `dlock status` (default: `pid=PID`).
    #[arg(long, value_name = "TEXT")]
    context: Option<String>,
    /// The longest the command may hold: then the hold is given back and the
    /// command stopped, as when the hold is lost (exit 76).
    #[arg(long, value_parser = parse_duration)]
    max_hold: Option<Duration>,
}

impl HoldArgs {
    /// The acquisition's options.
    pub(crate) fn options(&self) -> LockOptions {
        let mut options = LockOptions::new();
        if let Some(context) = &self.context {
            options = options.context(context.clone());
        }
        if let Some(max_hold) = self.max_hold {
            options = options.max_hold(max_hold);
        }
        options
    }
}

/// What a hold-and-run command asked for: the hold's name, what kind of hold
/// (in messages: "lock", "permits", "leadership"), and how long it waited.
pub(crate) struct Asked<'a> {
    pub(crate) name: &'a str,
    pub(crate) what: &'a str,
    pub(crate) wait: Duration,
}

/// Runs `command` while the hold `acquired` lasts — its fencing token in
/// `DLOCK_FENCING_TOKEN` (plus `env`), stopped when the hold is lost — then gives
/// the hold back (unless lost), closes the manager, and answers the exit code (see
/// [`conclude`]). A hold not taken within the wait fails with exit 75, an error
/// as [`Failure::from`] says; the manager is closed either way.
pub(crate) async fn run_holding(
    manager: DistributeLockManager,
    asked: Asked<'_>,
    command: &[String],
    mut env: Vec<(&str, String)>,
    acquired: dlock_api::Result<Option<impl Hold>>,
) -> Result<ExitCode, Failure> {
    let Asked { name, what, wait } = asked;
    let hold = match acquired {
        Ok(Some(hold)) => hold,
        Ok(None) => {
            manager.close().await;
            return Err(Failure::new(
                NOT_ACQUIRED,
                format!(
                    "{name}: {what} not acquired within {}",
                    humantime::format_duration(wait)
                ),
            ));
        }
        Err(e) => {
            manager.close().await;
            return Err(Failure::from(e));
        }
    };
    env.push(("DLOCK_FENCING_TOKEN", hold.fencing_token().to_string()));
    let lost = hold.lost_signal();
    let outcome = supervise(&format!("{name}: {what}"), command, &env, lost.lost()).await;
    let code = match outcome {
        Ok(outcome) => Ok(conclude(name, what, outcome, hold.release()).await),
        Err(failure) => {
            let _ = hold.release().await;
            Err(failure)
        }
    };
    manager.close().await;
    code.map(ExitCode::from)
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

/// Runs `command` with `env` (and without [`crate::BACKEND_ENV`]) until it exits, `lost` completes (the command gets
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
    // Without the backend URL: it may hold the lock store's password, which the
    // command has no need of (it gets its token and the lock's name in `env`).
    let mut child = Command::new(program)
        .args(rest)
        .env_remove(crate::BACKEND_ENV)
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

/// The exit code once a supervised command ended, giving the hold back by
/// `release` (a lost hold is dropped instead: nothing to give back but its grant):
/// the command's own code, 76 if the hold did not last to the end, or 128 + the
/// signal dlock passed on. `what` names the hold in messages ("lock").
pub(crate) async fn conclude(
    name: &str,
    what: &str,
    outcome: Outcome,
    release: impl std::future::Future<Output = dlock_api::Result<()>>,
) -> u8 {
    match outcome {
        Outcome::Exited(status) => match release.await {
            Ok(()) => code_of(status),
            Err(e) => {
                eprintln!(
                    "dlock: {name}: the command finished but the {what} was not held to the end: {e:#}"
                );
                LOCK_LOST
            }
        },
        Outcome::Lost(_) => {
            drop(release);
            LOCK_LOST
        }
        Outcome::Signalled(_) => {
            let _ = release.await;
            outcome.stop_code().unwrap_or(1)
        }
    }
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
