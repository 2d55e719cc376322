//! The checker's entry points for a backend's own test: [`trial`] (one run under
//! one nemesis, as a test trial) and [`as_worker`] (the worker processes a run
//! starts are the test's own binary, re-executed with hidden arguments).

use std::process::ExitCode;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use libtest_mimic::{Failed, Trial};

use super::coordinator::{run, worker_process, RunOptions, RunOutcome, WorkerArgs, WORKER_URL_VAR};
use super::deployment::Deployment;
use super::nemesis::{Choice, Nemesis};
use super::workload::WorkerSpec;

/// The environment variable that fixes a run's seed (to replay a failure); a
/// random one otherwise, printed by every run.
pub const SEED_VAR: &str = "DLOCK_LOCKCHECK_SEED";

/// If this process was started as a run's worker (the first argument is
/// `--worker`), runs the workload on the deployment `deployment_for` gives for
/// the worker's label and returns its exit status; `None` otherwise. A backend's
/// test calls it first in `main`:
///
/// ```no_run
/// # use std::sync::Arc;
/// # fn deployment() -> Arc<dyn dlock_tck::lockcheck::Deployment> { unimplemented!() }
/// fn main() -> std::process::ExitCode {
///     if let Some(exit) = dlock_tck::lockcheck::as_worker(|_label| Ok(deployment())) {
///         return exit;
///     }
///     // … the test's trials, e.g. dlock_tck::lockcheck::trial(deployment(), …)
/// #   std::process::ExitCode::SUCCESS
/// }
/// ```
pub fn as_worker(
    deployment_for: impl FnOnce(&str) -> Result<Arc<dyn Deployment>, String>,
) -> Option<ExitCode> {
    let mut argv = std::env::args().skip(1);
    if argv.next().as_deref() != Some("--worker") {
        return None;
    }
    let run = || -> Result<(), String> {
        let args = worker_args(std::env::args().skip(1))?;
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
/// starts it) and reads its URL from [`WORKER_URL_VAR`].
fn worker_args(argv: impl Iterator<Item = String>) -> Result<WorkerArgs, String> {
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
        url: std::env::var(WORKER_URL_VAR).map_err(|_| missing(WORKER_URL_VAR))?,
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

/// One checker run on `deployment` as a test trial named
/// `lockcheck::<label>::<nemesis>`: `duration` long, 3 worker processes (this
/// binary re-executed: `main` must call [`as_worker`] first), the faults of
/// `nemesis`, the seed from [`SEED_VAR`] or random. It fails on any violation
/// (the report printed) or when the run itself fails; a nemesis the deployment
/// cannot apply fails it too (a run asked for is never skipped).
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
        let opts = RunOptions::new(duration, seed, Choice::One(nemesis));
        let outcome = run_blocking(deployment.as_ref(), &opts)
            .map_err(|e| format!("seed {seed}: the run failed: {e}"))?;
        let report = &outcome.report;
        let told = format!(
            "seed {seed} ({SEED_VAR}={seed} replays it)\n{}\n{}{}",
            outcome.notes.join("\n"),
            report.table(),
            report.summary_line()
        );
        if report.violations() > 0 {
            return Err(Failed::from(told));
        }
        if nemesis_injected_nothing(&outcome.notes, nemesis) {
            return Err(Failed::from(format!(
                "no {} fault was injected: {told}",
                nemesis.name()
            )));
        }
        println!("{told}");
        Ok(())
    })
}

/// Whether the run's notes say that no fault of `nemesis` was injected.
fn nemesis_injected_nothing(notes: &[String], nemesis: Nemesis) -> bool {
    let said = format!("{} ", nemesis.name());
    !notes.iter().any(|n| {
        n.strip_prefix("faults injected: ").is_some_and(|counts| {
            counts
                .split(", ")
                .any(|c| c.strip_prefix(&said).is_some_and(|n| n != "0"))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_arguments_parse_as_the_coordinator_writes_them() {
        std::env::set_var(WORKER_URL_VAR, "nats://127.0.0.1:4222/b");
        let argv = "--worker 3 --backend nats --register 127.0.0.1:9 --seed 7 --seconds 1.500 --events /tmp/p3.events --namespace lc7: --proxy";
        let args = worker_args(argv.split(' ').map(str::to_owned)).unwrap();
        assert_eq!((args.spec.proc_, args.label.as_str()), (3, "nats"));
        assert_eq!(args.spec.duration, Duration::from_millis(1500));
        assert!(args.proxy);
        assert_eq!(args.url, "nats://127.0.0.1:4222/b");
        let err = worker_args(["--worker", "1"].map(str::to_owned).into_iter()).unwrap_err();
        assert!(err.contains("--seconds"), "{err}");
    }

    #[test]
    fn a_run_that_injected_nothing_is_told_apart() {
        let notes = |s: &str| vec!["workers done".to_owned(), s.to_owned()];
        assert!(!nemesis_injected_nothing(
            &notes("faults injected: stop 2"),
            Nemesis::Stop
        ));
        assert!(nemesis_injected_nothing(
            &notes("faults injected: stop 0"),
            Nemesis::Stop
        ));
        assert!(nemesis_injected_nothing(&notes("x"), Nemesis::Kill));
    }
}
