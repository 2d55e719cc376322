//! `lockcheck` — runs the lock-history checker against one backend (see
//! `testsuite::lockcheck` for the workload, nemeses and rules).
//!
//! ```text
//! lockcheck --backend <label> [--seconds N] [--seed S] [--processes K]
//!           [--nemesis none|proxy|stop|kill|restart|promote|expire|all] [--soak] [--keep]
//! lockcheck --backend <label> --check <dir>     # check a kept run's histories again
//! ```
//!
//! Exit status: 0 no violation, 1 violations found, 2 the run itself failed.

use std::path::PathBuf;
use std::process::ExitCode;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use dlock_tck::lockcheck::run_blocking;
use testsuite::lockcheck::coordinator::check_dir;
use testsuite::lockcheck::nemesis::Choice;
use testsuite::lockcheck::{rules_for, LabelDeployment, RunOptions};

const USAGE: &str = "usage: lockcheck --backend <label> [--seconds N] [--seed S] [--processes K] [--nemesis none|proxy|stop|kill|restart|promote|expire|all] [--soak] [--keep]\n       lockcheck --backend <label> --check <dir>";

#[derive(Default)]
struct Args {
    backend: Option<String>,
    seconds: Option<f64>,
    seed: Option<u64>,
    processes: Option<u32>,
    nemesis: Option<Choice>,
    soak: bool,
    keep: bool,
    check: Option<PathBuf>,
}

fn value<T: FromStr>(flag: &str, raw: Option<String>) -> Result<T, String> {
    let raw = raw.ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
    raw.parse()
        .map_err(|_| format!("{flag}: cannot use {raw:?}\n{USAGE}"))
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args::default();
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--backend" => args.backend = Some(value(&flag, it.next())?),
            "--seconds" => args.seconds = Some(value(&flag, it.next())?),
            "--seed" => args.seed = Some(value(&flag, it.next())?),
            "--processes" => args.processes = Some(value(&flag, it.next())?),
            "--nemesis" => {
                let raw: String = value(&flag, it.next())?;
                args.nemesis = Some(raw.parse::<Choice>()?);
            }
            "--soak" => args.soak = true,
            "--keep" => args.keep = true,
            "--check" => args.check = Some(value(&flag, it.next())?),
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok(args)
}

fn duration(seconds: f64) -> Result<Duration, String> {
    Duration::try_from_secs_f64(seconds)
        .map_err(|_| format!("--seconds {seconds} is not a duration"))
}

fn main() -> ExitCode {
    testsuite::backends::install_crypto_provider();
    // A worker process of a run (the coordinator re-executes this binary).
    let worker = |label: &str| {
        Ok(Arc::new(LabelDeployment::worker(label)) as Arc<dyn testsuite::lockcheck::Deployment>)
    };
    if let Some(exit) = dlock_tck::lockcheck::as_worker(worker) {
        return exit;
    }
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let Some(label) = args.backend.clone() else {
        eprintln!("--backend is required\n{USAGE}");
        return ExitCode::from(2);
    };
    if let Some(dir) = &args.check {
        return match check_dir(&label, dir, &rules_for(&label)) {
            Ok(report) => {
                print!("{}", report.table());
                println!("{}", report.summary_line());
                if report.violations() > 0 {
                    ExitCode::from(1)
                } else {
                    ExitCode::SUCCESS
                }
            }
            Err(e) => {
                eprintln!("lockcheck: {e}");
                ExitCode::from(2)
            }
        };
    }
    let seconds = args.seconds.unwrap_or(if args.soak { 600.0 } else { 10.0 });
    let nemesis = args
        .nemesis
        .unwrap_or(if args.soak { Choice::All } else { Choice::None });
    let seed = args.seed.unwrap_or_else(|| fastrand::u64(..10_000_000));
    let opts = match duration(seconds) {
        Ok(duration) => RunOptions {
            duration,
            seed,
            processes: args.processes.unwrap_or(3),
            nemesis,
            keep: args.keep,
            worker_exe: None,
        },
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    println!(
        "lockcheck: backend {label}, {seconds} s, seed {seed}, {} processes, nemesis {nemesis}",
        opts.processes
    );
    let outcome =
        LabelDeployment::new(&label).and_then(|deployment| run_blocking(&deployment, &opts));
    match outcome {
        Ok(outcome) => {
            for note in &outcome.notes {
                println!("note: {note}");
            }
            print!("{}", outcome.report.table());
            println!("{}", outcome.report.summary_line());
            if outcome.report.violations() > 0 {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("lockcheck: run failed: {e}");
            println!("lockcheck: {label} run failed");
            ExitCode::from(2)
        }
    }
}
