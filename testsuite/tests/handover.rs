//! The starvation bound on every selected backend (`DLOCK_TEST_BACKENDS`), one trial
//! per backend (`no_process_starves_on_a_handed_over_lock::LABEL`): 8 client
//! processes hand one non-fair lock over for 8 s (hold 1 ms, waits of at most 5 s);
//! every wait ends in a grant and the busiest process gets at most three times the
//! grants of the least busy (`testsuite::handover`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use testsuite::handover::{run, Options, RATIO_BOUND};
use testsuite::runner::{selected, tokio_trial};

async fn no_process_starves_on_a_handed_over_lock(label: String) {
    let exe = Path::new(env!("CARGO_BIN_EXE_handover"));
    let summary = run(&Options::standard(&label), exe)
        .await
        .unwrap_or_else(|e| panic!("handover on {label}: {e}"));
    let line = summary.line(&label);
    println!("{line}");
    assert!(summary.grants() > 0, "{line}: nothing was granted");
    assert!(
        summary.within_bound(),
        "outside the bound (no timeouts, no errors, max/min ≤ {RATIO_BOUND}):\n{line}"
    );
}

fn main() -> std::process::ExitCode {
    let args = libtest_mimic::Arguments::from_args();
    let trials = selected()
        .into_iter()
        .map(|label| {
            tokio_trial(
                format!("no_process_starves_on_a_handed_over_lock::{label}"),
                move || no_process_starves_on_a_handed_over_lock(label),
            )
        })
        .collect();
    libtest_mimic::run(&args, trials).exit_code()
}
