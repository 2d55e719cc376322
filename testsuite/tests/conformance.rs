//! One test trial per conformance case and backend named in `DLOCK_TEST_BACKENDS`
//! (default `memory`), named `LABEL::CASE`: a failure names its backend and hides no
//! other. `cargo test -p testsuite --test conformance -- redis-tls::` runs one
//! backend's cases; `-- mutual_exclusion` one case on every backend.

use std::process::ExitCode;

use libtest_mimic::{Arguments, Failed, Trial};
use testsuite::conformance::CASES;
use testsuite::runner::{run_case, selected};

fn main() -> ExitCode {
    let args = Arguments::from_args();
    let trials = selected()
        .into_iter()
        .flat_map(|label| {
            CASES.iter().map(move |case| {
                let label = label.clone();
                Trial::test(format!("{label}::{}", case.name), move || {
                    run_case(&label, case).map_err(Failed::from)
                })
            })
        })
        .collect();
    libtest_mimic::run(&args, trials).exit_code()
}
