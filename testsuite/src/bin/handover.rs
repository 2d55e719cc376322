//! `handover` — the starvation bound on one backend (see `testsuite::handover`):
//! client processes hand one non-fair lock over to each other; no process may starve.
//!
//! ```text
//! handover --backend <label> [--processes 8] [--seconds 8] [--hold-ms 1] [--wait-ms 5000]
//! ```
//!
//! Prints one summary line. Exit status: 0 within the bound (no timeouts, no
//! errors, busiest/least busy ≤ 3), 1 outside it, 2 the run itself failed.

use std::process::ExitCode;
use std::time::Duration;

use testsuite::handover::{run, worker_process, Options, WORKER_URL_VAR};

const USAGE: &str =
    "usage: handover --backend <label> [--processes N] [--seconds S] [--hold-ms MS] [--wait-ms MS]";

struct Args {
    opts: Options,
    worker: bool,
    namespace: String,
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let mut label = None;
    let (mut processes, mut seconds, mut hold, mut wait) = (None, None, None, None);
    let (mut worker, mut namespace) = (false, String::new());
    fn value<T: std::str::FromStr>(flag: &str, raw: Option<String>) -> Result<T, String> {
        let raw = raw.ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        raw.parse()
            .map_err(|_| format!("{flag}: cannot use {raw:?}\n{USAGE}"))
    }
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--backend" => label = Some(value::<String>(&flag, it.next())?),
            "--processes" => processes = Some(value::<u32>(&flag, it.next())?),
            "--seconds" => seconds = Some(value::<f64>(&flag, it.next())?),
            "--hold-ms" => hold = Some(value::<u64>(&flag, it.next())?),
            "--wait-ms" => wait = Some(value::<u64>(&flag, it.next())?),
            "--worker" => worker = true,
            "--namespace" => namespace = value(&flag, it.next())?,
            _ => return Err(format!("unknown argument {flag:?}\n{USAGE}")),
        }
    }
    let label = label.ok_or_else(|| format!("--backend is required\n{USAGE}"))?;
    let mut opts = Options::standard(&label);
    if let Some(p) = processes.filter(|p| *p > 0) {
        opts.processes = p;
    }
    if let Some(s) = seconds.filter(|s| s.is_finite() && *s > 0.0 && *s < 86_400.0) {
        opts.duration = Duration::from_secs_f64(s);
    }
    if let Some(h) = hold {
        opts.hold = Duration::from_millis(h);
    }
    if let Some(w) = wait {
        opts.wait = Duration::from_millis(w);
    }
    Ok(Args {
        opts,
        worker,
        namespace,
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    testsuite::backends::install_crypto_provider();
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    if args.worker {
        let url = std::env::var(WORKER_URL_VAR).unwrap_or_default();
        return match worker_process(&args.opts, url, args.namespace).await {
            Ok(f) => {
                println!("{}", f.line());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::from(2)
            }
        };
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("cannot find this binary to start workers: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&args.opts, &exe).await {
        Ok(summary) => {
            println!("{}", summary.line(&args.opts.label));
            if summary.within_bound() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("handover on {}: {e}", args.opts.label);
            ExitCode::from(2)
        }
    }
}
