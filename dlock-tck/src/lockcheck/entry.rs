//! The checker's entry points for a backend's own test: [`trial`] (one run under
//! one nemesis, as a test trial) and [`as_worker`] (the worker processes a run
//! starts are the test's own binary, re-executed with hidden arguments).

use std::process::ExitCode;
use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use libtest_mimic::{Failed, Trial};

use super::coordinator::{run, run_bound, worker_process, RunOptions, RunOutcome, WorkerArgs};
use super::deployment::Deployment;
use super::nemesis::{Choice, Nemesis};
use super::procs::WORKER_URL_VAR;
use super::workload::WorkerSpec;

/// The environment variable that fixes a run's seed (to replay a failure); a
/// random one otherwise, printed by every run.
pub const SEED_VAR: &str = "DLOCK_LOCKCHECK_SEED";

/// If this process was started as a run's worker (the first argument is
/// `--worker`), runs the workload on the deployment `deployment_for` gives for
/// the worker's label and returns its exit status; `None` otherwise. A backend's
/// test calls it first in `main`, before its trials (the [module's
/// example](super)).
pub fn as_worker(
    deployment_for: impl FnOnce(&str) -> Result<Arc<dyn Deployment>, String>,
) -> Option<ExitCode> {
    if std::env::args_os()
        .nth(1)
        .is_none_or(|first| first != "--worker")
    {
        return None;
    }
    let run = || -> Result<(), String> {
        let argv = std::env::args_os()
            .skip(1)
            .map(|a| {
                a.into_string()
                    .map_err(|a| format!("a worker argument is not UTF-8: {a:?}"))
            })
            .collect::<Result<Vec<_>, String>>()?;
        let url = std::env::var(WORKER_URL_VAR).map_err(|_| format!("missing {WORKER_URL_VAR}"));
        let args = worker_args(argv.into_iter(), url)?;
        let deployment = deployment_for(&args.label)?;
        runtime()?.block_on(worker_process(deployment.as_ref(), args))
    };
    Some(match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lockcheck worker: {e}");
            ExitCode::from(2)
        }
    })
}

/// Parses a worker's hidden arguments (`--worker N --backend L --register A
/// --seed S --seconds F --events P --namespace NS [--proxy]`, as the coordinator
/// starts it), with its URL (read from [`WORKER_URL_VAR`]).
fn worker_args(
    argv: impl Iterator<Item = String>,
    url: Result<String, String>,
) -> Result<WorkerArgs, String> {
    fn value<T: FromStr>(flag: &str, raw: Option<String>) -> Result<T, String> {
        let raw = raw.ok_or_else(|| format!("{flag} needs a value"))?;
        raw.parse()
            .map_err(|_| format!("{flag}: cannot use {raw:?}"))
    }
    let (mut id, mut label, mut register, mut seed, mut seconds) = (None, None, None, None, None);
    let (mut events, mut namespace, mut proxy) = (None, None, false);
    let mut argv = argv;
    while let Some(flag) = argv.next() {
        match flag.as_str() {
            "--worker" => id = Some(value::<u32>(&flag, argv.next())?),
            "--backend" => label = Some(value::<String>(&flag, argv.next())?),
            "--register" => register = Some(value(&flag, argv.next())?),
            "--seed" => seed = Some(value(&flag, argv.next())?),
            "--seconds" => seconds = Some(value::<f64>(&flag, argv.next())?),
            "--events" => events = Some(value(&flag, argv.next())?),
            "--namespace" => namespace = Some(value(&flag, argv.next())?),
            "--proxy" => proxy = true,
            other => return Err(format!("unknown worker argument {other:?}")),
        }
    }
    let missing = |what: &str| format!("missing {what}");
    let seconds = seconds.ok_or_else(|| missing("--seconds"))?;
    Ok(WorkerArgs {
        label: label.ok_or_else(|| missing("--backend"))?,
        url: url?,
        proxy,
        events: events.ok_or_else(|| missing("--events"))?,
        spec: WorkerSpec {
            proc_: id.ok_or_else(|| missing("--worker"))?,
            seed: seed.ok_or_else(|| missing("--seed"))?,
            duration: Duration::try_from_secs_f64(seconds)
                .map_err(|_| format!("--seconds {seconds} is not a duration"))?,
            namespace: namespace.ok_or_else(|| missing("--namespace"))?,
            register: register.ok_or_else(|| missing("--register"))?,
        },
    })
}

/// The runtime a run (or a worker) runs on: two threads, as on the CI machine's
/// two cores.
fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the tokio runtime: {e}"))
}

/// [`run`] on a runtime of its own (two threads, as on the CI machine's two
/// cores), for a caller that is not async: a test trial, a command's `main`.
pub fn run_blocking(deployment: &dyn Deployment, opts: &RunOptions) -> Result<RunOutcome, String> {
    runtime()?.block_on(run(deployment, opts))
}

/// Live runs one at a time in a process (libtest-mimic runs trials on threads
/// side by side; three coordinators and their workers on two cores would starve
/// each other's timers).
static ONE_RUN_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Added to a run's own bound ([`run_bound`]): a process's start and the
/// checker's own work. Past it the run hung.
const HARNESS_SLACK: Duration = Duration::from_secs(60);

/// One checker run on `deployment` as a test trial named
/// `lockcheck::<label>::<nemesis>`: `duration` long, 3 worker processes (this
/// binary re-executed: `main` must call [`as_worker`] first), the faults of
/// `nemesis`, the seed from [`SEED_VAR`] or random (printed first). It fails on
/// any violation (the report printed), when the run itself fails or outlives its
/// own bounds, when the nemesis cannot apply or injected nothing, and when the
/// election had no term or the semaphore (where the store offers one) no permit.
pub fn trial(deployment: Arc<dyn Deployment>, nemesis: Nemesis, duration: Duration) -> Trial {
    let name = format!("lockcheck::{}::{}", deployment.label(), nemesis.name());
    Trial::test(name, move || {
        if let Some(why) = deployment.not_applicable(nemesis) {
            return Err(Failed::from(format!(
                "nemesis {} cannot run here: {why}",
                nemesis.name()
            )));
        }
        let seed = match std::env::var(SEED_VAR) {
            Ok(raw) => raw
                .parse()
                .map_err(|_| Failed::from(format!("{SEED_VAR}={raw:?} is not a number")))?,
            Err(_) => fastrand::u64(1..10_000_000),
        };
        println!("seed {seed} ({SEED_VAR}={seed} replays it)");
        let _one = ONE_RUN_AT_A_TIME
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let opts = RunOptions::new(duration, seed, Choice::One(nemesis));
        let limit = run_bound(&deployment.rules(), duration, nemesis.server_side()) + HARNESS_SLACK;
        let outcome = runtime()?
            .block_on(async {
                tokio::time::timeout(limit, run(deployment.as_ref(), &opts))
                    .await
                    .map_err(|_| format!("ran over {limit:?}, past its own bounds"))?
            })
            .map_err(|e| format!("seed {seed}: the run failed: {e}"))?;
        let told = format!(
            "{}\n{}{}",
            outcome.notes.join("\n"),
            outcome.report.table(),
            outcome.report.summary_line()
        );
        match judge(&outcome, nemesis) {
            Some(problem) => Err(Failed::from(format!("seed {seed}: {problem}\n{told}"))),
            None => {
                println!("{told}");
                Ok(())
            }
        }
    })
}

/// What is wrong with a finished run under `nemesis`, if anything.
fn judge(outcome: &RunOutcome, nemesis: Nemesis) -> Option<String> {
    let totals = &outcome.report.totals;
    let injected = outcome
        .injected
        .iter()
        .find(|(kind, _)| *kind == nemesis)
        .map_or(0, |(_, n)| *n);
    if outcome.report.violations() > 0 {
        Some(format!("{} violations", outcome.report.violations()))
    } else if injected == 0 {
        Some(format!("the {} nemesis injected nothing", nemesis.name()))
    } else if totals.terms == 0 {
        Some("no term of the election".to_owned())
    } else if outcome.semaphores && totals.permit_grants == 0 {
        Some("no permit of the semaphore".to_owned())
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_arguments_parse_as_the_coordinator_writes_them() {
        let argv = "--worker 3 --backend nats --register 127.0.0.1:9 --seed 7 --seconds 1.500 --events /tmp/p3.events --namespace lc7: --proxy";
        let url = Ok("nats://127.0.0.1:4222/b".to_owned());
        let args = worker_args(argv.split(' ').map(str::to_owned), url).unwrap();
        assert_eq!((args.spec.proc_, args.label.as_str()), (3, "nats"));
        assert_eq!(args.spec.duration, Duration::from_millis(1500));
        assert!(args.proxy);
        assert_eq!(args.url, "nats://127.0.0.1:4222/b");
        let url = Ok(String::new());
        let err = worker_args(["--worker", "1"].map(str::to_owned).into_iter(), url).unwrap_err();
        assert!(err.contains("--seconds"), "{err}");
        let err = worker_args(argv.split(' ').map(str::to_owned), Err("no URL".into()));
        assert_eq!(err.unwrap_err(), "no URL");
    }

    /// A run that injected nothing, had no term or no permit is not a pass.
    #[test]
    fn a_run_that_did_not_exercise_the_store_fails_its_trial() {
        let empty = super::super::check::check("x", &[], &super::super::check::Rules::default());
        let mut outcome = RunOutcome {
            report: empty,
            notes: Vec::new(),
            kept: None,
            injected: vec![(Nemesis::Stop, 0)],
            semaphores: true,
        };
        let said = |o: &RunOutcome| judge(o, Nemesis::Stop).unwrap_or_default();
        assert!(said(&outcome).contains("injected nothing"));
        outcome.injected = vec![(Nemesis::Stop, 2)];
        assert!(said(&outcome).contains("no term"));
        outcome.report.totals.terms = 3;
        assert!(said(&outcome).contains("no permit"));
        outcome.semaphores = false;
        assert_eq!(judge(&outcome, Nemesis::Stop), None);
    }
}
