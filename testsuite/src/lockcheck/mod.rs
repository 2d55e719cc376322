//! `lockcheck` — the lock-history checker (DESIGN.md §9, proof of safety).
//!
//! Client processes run a seeded random mix of lock operations against one backend
//! while a nemesis injects faults; every critical section writes to a fenced register
//! outside the lock store; afterwards a pure checker reads every history and reports
//! violations by class. It is proven able to fail: against the `broken-memory`
//! backend (a release that ignores its owner) it reports overlapping holds and stale
//! writes, against `broken-tokens` token-order violations, against `broken-starve`
//! starvation ([`broken::Flaw`]).
//!
//! # Running it
//!
//! ```text
//! cargo run -p testsuite --bin lockcheck -- --backend redis --seconds 20 --seed 7 \
//!     [--processes 3] [--nemesis none|proxy|stop|kill|restart|promote|expire|all] [--soak] [--keep]
//! cargo run -p testsuite --bin lockcheck -- --backend redis --check <kept dir>
//! ```
//!
//! * `--backend`: a conformance label ([`crate::backends::KNOWN`]) or a broken
//!   backend (`broken-memory`, `broken-tokens`, `broken-starve`), opened by [`crate::backends::open_at`] at the conformance
//!   suite's URL ([`crate::backends::server_url`]); a backend that cannot be reached
//!   fails the run (exit 2), it is never skipped.
//! * `--seconds` (default 10), `--seed` (default: random, printed), `--processes`
//!   (default 3), `--nemesis` (default `none`; `all` rotates every applicable kind).
//! * `--soak`: a long run — 600 s with every nemesis unless given otherwise.
//! * `--keep`: keep the history files (their directory is printed); `--check <dir>`
//!   runs the checker on them again.
//!
//! Exit status: 0 no violation, 1 violations, 2 the run itself failed. The last line
//! printed is `lockcheck: <label> ops=… grants=… faults=… violations=… (…)`.
//!
//! The integration test `testsuite/tests/lockcheck.rs` runs the checker's rules on
//! hand-made histories (exact counts), the self-tests (each broken backend caught by
//! its rule within a few seeds, memory clean, a kept run checked again), and a
//! bounded pass (6 s, 3 processes, the `stop` nemesis; grants and faults required)
//! on every server label of `DLOCK_TEST_BACKENDS`, and one run of each server-side
//! nemesis (`restart`, `promote`, `expire`) on every server label it applies to.
//!
//! # Processes
//!
//! The runs are the kit's ([`dlock_tck::lockcheck`]: coordinator, workers,
//! nemeses); this module gives them this repository's labels as a
//! [`LabelDeployment`]. The coordinator opens the backend once at its URL (for
//! SQLite a fresh file, which the deployment removes at the end), starts the
//! [fenced register](register), and re-executes its own binary as K worker
//! processes (`--worker …`, hidden flags, handled by
//! [`dlock_tck::lockcheck::as_worker`]; the URL in the environment, not in `ps`)
//! that all open the same URL and use one namespace `lc<seed>-<nonce>:`. Workers
//! take their clients from a [`TestBackend`](crate::TestBackend), as conformance
//! cases do. The in-process backends (`memory`, the broken ones) cannot be shared
//! between processes: their workers are tasks of the coordinator sharing its test
//! backend's store, with the same logging and checker.
//!
//! # Workload ([`workload`])
//!
//! Per worker 2–3 managers (each on its own client, lease 2 s renewed by the
//! watchdog), 3–4 tasks per manager, over 3 exclusive names, a fair name (when the
//! backend has fair locks) and a read-write name (when it has shared locks). Each
//! task loops until the deadline choosing at random: `try_lock(0–300 ms)`,
//! `try_lock_with(…)` with a fixed lease of 1–3 s, `lock()` / `lock_with(…)` bounded by a timeout
//! (0.2–8 s) — half of them with an explicit lease where the backend takes one (not
//! ZooKeeper, which ties holds to the session); 12 % of acquires are cancelled by a
//! 0–50 ms timeout. The tasks of a
//! manager share (clone) one handle of `x2`, so clones re-enter each other's holds;
//! 15 % of holds also re-enter on their own handle and release that. A critical
//! section logs `ok`, ENTERs the register, writes with its fencing token (shared
//! holds read), holds 0–20 ms (sometimes up to 600 ms, or 0.5–1.5× an explicit lease
//! so that leases run out), stops at once when the lost signal fires, maybe writes
//! again unless lost, EXITs,
//! logs the release and releases by `unlock()`, by an `unlock()` cancelled after
//! 0–2 ms, or by `drop`; then often locks again at once with the same handle (the
//! ordinary loop). A handler on every manager logs each lost signal at the instant
//! the manager sets it, and each successful watchdog renewal with its send time (the
//! checker's proof that the store still had the hold).
//!
//! # Nemeses ([`nemesis`]; this repository's servers: [`servers`])
//!
//! * `proxy` — every worker talks to the backend through its own `FaultProxy`; the
//!   coordinator sends it delay (50–300 ms), black hole (0.5–2× lease, ended by a
//!   reset because the proxy drops the bytes it swallows) and reset windows on its
//!   stdin. Not applicable (and said so) to SQLite, the in-process backends, and
//!   Redis Cluster (redirects bypass a proxy); the other nemeses still run.
//! * `stop` — SIGSTOP a worker for 1.5× the lease, then SIGCONT.
//! * `kill` — SIGKILL a worker and start a replacement with a new process number.
//! * `restart` — restart the backend's server with `scripts/server-fault` (one node
//!   of a Redis Cluster or ZooKeeper ensemble, chosen at random): down 0.2–1.5 s for
//!   MariaDB, PostgreSQL and ZooKeeper, which keep their state; for Redis, whose test
//!   servers keep nothing, down past the longest lease (Redis's "delayed restart":
//!   every hold the restarted server forgets has expired by then). Not SQLite (no
//!   server).
//! * `promote` — `redis`, `redis-polling`: a failover as it happens without replica
//!   acknowledgement. Every worker is cut off from the master (proxy reset), its
//!   replica (`DLOCK_REDIS_REPLICA_PORT`, 6380) is promoted at once, the old master
//!   becomes the new one's replica, and the workers' proxies forward to the new
//!   master (new workers get its address). After the run the original master is
//!   given its role back.
//! * `expire` — ZooKeeper: a worker's connections are black-holed for its session
//!   timeout + 1 s, so the server expires its sessions, then reset.
//!
//! `stop` and `kill` do not apply to the in-process backends. Server-side faults
//! (`restart`, `promote`) are logged by the coordinator as `down`/`up` and count as
//! fault windows of every process. Every nemesis loop ends with the run's
//! `--seconds`.
//!
//! # After the run
//!
//! The coordinator waits for the workers (at most `--seconds` +
//! [`workload::EXIT_GRACE`]; one still running is killed and the run fails), then
//! polls its test backend's `live_state` of the run's namespace until nothing is
//! left, for at most [`Rules::quiescence`] (the longest lease, the session timeout on
//! ZooKeeper, a lapsing Redis queue) + 2 s: a SIGKILLed worker's holds legitimately
//! live until their lease ends. What survives is inspected name by name and
//! reported as a leak.
//!
//! # Rules
//!
//! See [`mod@check`] for the exact rules: overlap, stale-write, token-order, late-loss,
//! leak, starvation, fair-order; holds of SIGSTOPped processes are excused from the
//! rules that need the holder to be told in time, and counted apart.
//!
//! # Histories ([`history`])
//!
//! One tab-separated line per event, CLOCK_MONOTONIC nanoseconds, one file per
//! process written with one `write` per line (a SIGKILL loses nothing logged), plus
//! the coordinator's nemesis and leak events and the register's own log
//! (`register.events`), all in the run directory.

pub mod broken;
mod deployment;
mod rules;
pub mod servers;

pub use deployment::LabelDeployment;
pub use dlock_tck::lockcheck::{check, coordinator, history, nemesis, register, workload};
pub use dlock_tck::lockcheck::{Deployment, Nemesis};
pub use rules::rules_for;

pub use check::{check, Report, Rules};
pub use coordinator::{run, RunOptions, RunOutcome};
