//! One test trial per conformance case ([`dlock_tck`]) and backend named in
//! `DLOCK_TEST_BACKENDS` (default `memory`), named `LABEL::CASE`: a failure names
//! its backend and hides no other. `cargo test -p testsuite --test conformance --
//! redis-tls::` runs one backend's cases; `-- mutual_exclusion` one case on every
//! backend. Each label runs through the kit as a third party's backend would.

use std::process::ExitCode;

use libtest_mimic::Arguments;
use testsuite::backends;
use testsuite::runner::selected;

fn main() -> ExitCode {
    let args = Arguments::from_args();
    let trials = selected()
        .into_iter()
        // dlock-nats runs the kit from its own tests/tck.rs, as a third party's
        // crate does.
        .filter(|label| label != "nats")
        .flat_map(|label| {
            let named = label.clone();
            dlock_tck::runner::trials(&label, move || {
                let label = named.clone();
                async move { backends::open(&label).await }
            })
        })
        .collect();
    libtest_mimic::run(&args, trials).exit_code()
}
