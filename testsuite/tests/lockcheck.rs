//! The lock-history checker: its rules on hand-made histories (one violating and one
//! clean history per class), its self-test (the broken backend is caught, memory is
//! clean), and a bounded pass on every backend `DLOCK_TEST_BACKENDS` selects.

use std::io::Read as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use testsuite::lockcheck::check::{check, Report, Rules};
use testsuite::lockcheck::history::{Event, Kind, Mode, RegOp, COORDINATOR};
use testsuite::lockcheck::nemesis::Choice;
use testsuite::lockcheck::{run, RunOptions};

/// The live runs share two cores: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const MS: u64 = 1_000_000;

/// A hand-made history; times in ms.
#[derive(Default)]
struct H {
    events: Vec<Event>,
    att: u64,
}

impl H {
    fn push(&mut self, t_ms: u64, proc_: u32, kind: Kind) {
        self.events.push(Event {
            t: 1_000 * MS + t_ms * MS,
            proc_,
            kind,
        });
    }

    fn invoke(&mut self, t: u64, p: u32, lock: &str, mode: Mode, fair: bool, wait_ms: u64) -> u64 {
        self.att += 1;
        let att = self.att;
        self.push(
            t,
            p,
            Kind::Invoke {
                att,
                lock: lock.into(),
                mode,
                fair,
                client: format!("p{p}.m0.t0"),
                op: "lock".into(),
                wait_ms,
                cancel: false,
            },
        );
        att
    }

    #[allow(clippy::too_many_arguments)]
    fn ok(&mut self, t: u64, p: u32, att: u64, lock: &str, mode: Mode, token: u64, hold: &str) {
        self.push(
            t,
            p,
            Kind::Ok {
                att,
                lock: lock.into(),
                mode,
                fair: false,
                token,
                hold: hold.into(),
                client: format!("p{p}.m0.t0"),
                lease_ms: 2000,
                lost: false,
            },
        );
    }

    fn release(&mut self, t: u64, p: u32, hold: &str, lock: &str) {
        self.push(
            t,
            p,
            Kind::Release {
                hold: hold.into(),
                lock: lock.into(),
                how: "unlock".into(),
            },
        );
    }

    fn lost(&mut self, t: u64, p: u32, hold: &str, lock: &str) {
        self.push(
            t,
            p,
            Kind::Lost {
                hold: hold.into(),
                lock: lock.into(),
                reason: "lease_expired".into(),
            },
        );
    }

    fn reg(&mut self, t: u64, op: RegOp, lock: &str, token: u64, hold: &str, accepted: bool) {
        self.push(
            t,
            COORDINATOR,
            Kind::Reg {
                op,
                lock: lock.into(),
                token,
                hold: hold.into(),
                accepted,
            },
        );
    }

    /// A whole exclusive hold: invoke at `t_ok - 1`, ok, ENTER + WRITE, EXIT, release.
    fn hold(&mut self, t_ok: u64, t_rel: u64, p: u32, lock: &str, token: u64, hold: &str) {
        let att = self.invoke(
            t_ok.saturating_sub(1),
            p,
            lock,
            Mode::Exclusive,
            false,
            1000,
        );
        self.ok(t_ok, p, att, lock, Mode::Exclusive, token, hold);
        self.reg(t_ok, RegOp::Enter, lock, token, hold, true);
        self.reg(t_ok, RegOp::Write, lock, token, hold, true);
        self.reg(t_rel, RegOp::Exit, lock, token, hold, true);
        self.release(t_rel, p, hold, lock);
    }

    fn exit_all(&mut self, t: u64, procs: &[u32]) {
        for p in procs {
            self.push(t, *p, Kind::Exit);
        }
    }

    fn check(&self) -> Report {
        check("hand-made", &self.events, &Rules::default())
    }
}

fn only(report: &Report, class: &str) {
    for c in &report.classes {
        if c.name != class {
            assert_eq!(c.count, 0, "unexpected {} in\n{}", c.name, report.table());
        }
    }
}

#[test]
fn overlap_is_reported_unless_released_lost_or_paused() {
    let mut h = H::default();
    h.hold(0, 100, 1, "x0", 1, "a");
    h.hold(50, 150, 2, "x0", 2, "b");
    h.exit_all(200, &[1, 2]);
    let r = h.check();
    assert_eq!(r.count("overlap"), 1, "{}", r.table());
    only(&r, "overlap");

    let mut h = H::default();
    h.hold(0, 100, 1, "x0", 1, "a");
    h.hold(101, 150, 2, "x0", 2, "b");
    h.hold(200, 250, 1, "x1", 3, "c");
    h.hold(210, 260, 2, "x2", 4, "d");
    h.exit_all(300, &[1, 2]);
    assert_eq!(h.check().violations(), 0, "{}", h.check().table());

    // Told of the loss before the next grant: no overlap.
    let mut h = H::default();
    h.hold(0, 100, 1, "x0", 1, "a");
    h.lost(40, 1, "a", "x0");
    h.hold(50, 150, 2, "x0", 2, "b");
    h.exit_all(200, &[1, 2]);
    assert_eq!(h.check().violations(), 0, "{}", h.check().table());

    // Paused while holding: excused, counted apart.
    let mut h = H::default();
    h.hold(0, 100, 1, "x0", 1, "a");
    h.push(10, 1, Kind::Stop);
    h.push(90, 1, Kind::Cont);
    h.hold(50, 150, 2, "x0", 2, "b");
    h.exit_all(200, &[1, 2]);
    let r = h.check();
    assert_eq!(r.violations(), 0, "{}", r.table());
    assert_eq!(r.classes[0].excused, 1);

    // Shared holds may overlap each other, not an exclusive one.
    let mut h = H::default();
    for (i, (p, mode, hold)) in [
        (1, Mode::Shared, "r1"),
        (2, Mode::Shared, "r2"),
        (3, Mode::Exclusive, "w"),
    ]
    .into_iter()
    .enumerate()
    {
        let t = 10 * i as u64;
        let att = h.invoke(t, p, "rw0", mode, false, 100);
        h.ok(t + 1, p, att, "rw0", mode, 10 + i as u64, hold);
        h.release(t + 50, p, hold, "rw0");
    }
    h.exit_all(200, &[1, 2, 3]);
    let r = h.check();
    assert_eq!(r.count("overlap"), 2, "{}", r.table());
}

#[test]
fn stale_writes_accepted_are_reported() {
    // The register's own invariant.
    let mut h = H::default();
    h.hold(0, 10, 1, "x0", 2, "a");
    h.hold(20, 30, 2, "x0", 1, "b");
    h.exit_all(100, &[1, 2]);
    let r = h.check();
    assert!(r.count("stale-write") >= 1, "{}", r.table());

    // A write of the earlier grant accepted after the later grant's (same token).
    let mut h = H::default();
    let a = h.invoke(0, 1, "x0", Mode::Exclusive, false, 0);
    h.ok(1, 1, a, "x0", Mode::Exclusive, 5, "a");
    h.release(10, 1, "a", "x0");
    let b = h.invoke(11, 2, "x0", Mode::Exclusive, false, 0);
    h.ok(12, 2, b, "x0", Mode::Exclusive, 6, "b");
    h.reg(13, RegOp::Write, "x0", 6, "b", true);
    h.release(20, 2, "b", "x0");
    let c = h.invoke(21, 1, "x0", Mode::Exclusive, false, 0);
    h.ok(22, 1, c, "x0", Mode::Exclusive, 6, "c");
    h.reg(23, RegOp::Write, "x0", 6, "c", true);
    h.reg(24, RegOp::Write, "x0", 6, "b", true);
    h.release(30, 1, "c", "x0");
    h.exit_all(100, &[1, 2]);
    let r = h.check();
    assert_eq!(r.count("stale-write"), 1, "{}", r.table());

    // Stale writes that the register rejects are the fencing working.
    let mut h = H::default();
    h.hold(0, 10, 1, "x0", 1, "a");
    h.hold(20, 30, 2, "x0", 2, "b");
    h.reg(40, RegOp::Write, "x0", 1, "a", false);
    h.exit_all(100, &[1, 2]);
    let r = h.check();
    assert_eq!(r.violations(), 0, "{}", r.table());
    assert_eq!(r.totals.writes_rejected, 1);
}

#[test]
fn token_order_is_checked_and_reentries_are_not_grants() {
    let mut h = H::default();
    h.push(0, 1, Kind::Start);
    h.hold(0, 10, 1, "x0", 5, "a");
    h.hold(20, 30, 2, "x0", 5, "b");
    h.hold(40, 50, 1, "x0", 4, "c");
    h.exit_all(100, &[1, 2]);
    let r = h.check();
    assert_eq!(r.count("token-order"), 2, "{}", r.table());

    let mut h = H::default();
    h.hold(0, 30, 1, "x0", 5, "a");
    let again = h.invoke(10, 1, "x0", Mode::Exclusive, false, 0);
    h.ok(11, 1, again, "x0", Mode::Exclusive, 5, "a");
    h.release(12, 1, "a", "x0");
    h.hold(40, 50, 2, "x0", 6, "b");
    h.exit_all(100, &[1, 2]);
    let r = h.check();
    assert_eq!(r.violations(), 0, "{}", r.table());
    assert_eq!((r.totals.grants, r.totals.reentries), (2, 1));
}

#[test]
fn late_losses_are_reported_with_margins() {
    let mut h = H::default();
    h.hold(0, 130, 1, "x0", 1, "a");
    h.lost(120, 1, "a", "x0");
    h.hold(100, 200, 2, "x0", 2, "b");
    h.exit_all(300, &[1, 2]);
    let r = h.check();
    assert_eq!(r.count("late-loss"), 1, "{}", r.table());
    let (min, _, n) = r.margins_ms.unwrap();
    assert!((min + 20.0).abs() < 0.01 && n == 1, "{:?}", r.margins_ms);

    let mut h = H::default();
    h.hold(0, 130, 1, "x0", 1, "a");
    h.lost(90, 1, "a", "x0");
    h.hold(100, 200, 2, "x0", 2, "b");
    h.exit_all(300, &[1, 2]);
    let r = h.check();
    assert_eq!(r.violations(), 0, "{}", r.table());
    let (min, median, _) = r.margins_ms.unwrap();
    assert!((min - 10.0).abs() < 0.01 && (median - 10.0).abs() < 0.01);
}

#[test]
fn leaks_are_reported() {
    let mut h = H::default();
    h.hold(0, 10, 1, "x0", 1, "a");
    h.exit_all(20, &[1]);
    assert_eq!(h.check().violations(), 0);
    h.push(
        30,
        COORDINATOR,
        Kind::Leak {
            lock: "x0".into(),
            state: "holders=1".into(),
        },
    );
    let r = h.check();
    assert_eq!(r.count("leak"), 1, "{}", r.table());
    only(&r, "leak");
}

#[test]
fn starvation_needs_a_long_free_stretch_within_the_wait() {
    let waiter = |h: &mut H, t: u64, wait: u64| {
        let att = h.invoke(t, 2, "x0", Mode::Exclusive, false, wait);
        h.push(
            t + wait,
            2,
            Kind::Fail {
                att,
                lock: "x0".into(),
                why: "timeout".into(),
            },
        );
    };
    // Held until 500 ms; hidden holds may last 3 s more; free from 3.5 s; the waiter
    // waits 1 s – 7 s: 3.5 s unoccupied.
    let mut h = H::default();
    h.hold(0, 500, 1, "x0", 1, "a");
    waiter(&mut h, 1000, 6000);
    h.exit_all(8000, &[1, 2]);
    let r = h.check();
    assert_eq!(r.count("starvation"), 1, "{}", r.table());
    only(&r, "starvation");

    // Held until 3 s: only 1 s free.
    let mut h = H::default();
    h.hold(0, 3000, 1, "x0", 1, "a");
    waiter(&mut h, 1000, 6000);
    h.exit_all(8000, &[1, 2]);
    assert_eq!(h.check().violations(), 0, "{}", h.check().table());

    // The waiter's process was stopped: not judged.
    let mut h = H::default();
    h.hold(0, 500, 1, "x0", 1, "a");
    waiter(&mut h, 1000, 6000);
    h.push(2000, 2, Kind::Stop);
    h.push(2500, 2, Kind::Cont);
    h.exit_all(8000, &[1, 2]);
    assert_eq!(h.check().violations(), 0, "{}", h.check().table());
}

#[test]
fn fair_order_is_checked_among_waiters_of_one_hold() {
    let fair_wait =
        |h: &mut H, t_inv: u64, t_ok: u64, t_rel: u64, p: u32, token: u64, hold: &str| {
            let att = h.invoke(t_inv, p, "f0", Mode::Exclusive, true, 5000);
            h.ok(t_ok, p, att, "f0", Mode::Exclusive, token, hold);
            h.release(t_rel, p, hold, "f0");
        };
    // C holds 0–1000; A arrives at 100, B at 500; B is granted first.
    let mut h = H::default();
    fair_wait(&mut h, 0, 1, 1000, 1, 1, "c");
    fair_wait(&mut h, 100, 1100, 1200, 2, 3, "a");
    fair_wait(&mut h, 500, 1001, 1090, 3, 2, "b");
    h.exit_all(2000, &[1, 2, 3]);
    let r = h.check();
    assert_eq!(r.count("fair-order"), 1, "{}", r.table());
    only(&r, "fair-order");

    // In arrival order: clean.
    let mut h = H::default();
    fair_wait(&mut h, 0, 1, 1000, 1, 1, "c");
    fair_wait(&mut h, 100, 1001, 1090, 2, 2, "a");
    fair_wait(&mut h, 500, 1100, 1200, 3, 3, "b");
    h.exit_all(2000, &[1, 2, 3]);
    assert_eq!(h.check().violations(), 0, "{}", h.check().table());

    // Arrivals closer than the margin are not judged.
    let mut h = H::default();
    fair_wait(&mut h, 0, 1, 1000, 1, 1, "c");
    fair_wait(&mut h, 100, 1100, 1200, 2, 3, "a");
    fair_wait(&mut h, 200, 1001, 1090, 3, 2, "b");
    h.exit_all(2000, &[1, 2, 3]);
    assert_eq!(h.check().violations(), 0, "{}", h.check().table());
}

fn in_process(label: &str, seconds: u64) -> RunOptions {
    RunOptions {
        label: label.to_owned(),
        duration: Duration::from_secs(seconds),
        seed: fastrand::u64(..10_000_000),
        processes: 3,
        nemesis: Choice::None,
        keep: false,
        worker_exe: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broken_backend_is_caught() {
    let _serial = SERIAL.lock().await;
    let opts = in_process("broken-memory", 4);
    let outcome = run(&opts).await.expect("the run works");
    let report = &outcome.report;
    println!("{}\n{}", report.table(), report.summary_line());
    assert!(
        report.count("overlap") > 0,
        "seed {}: a release that ignores its owner went unnoticed\n{}",
        opts.seed,
        report.table()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_has_no_violations() {
    let _serial = SERIAL.lock().await;
    let opts = in_process("memory", 4);
    let outcome = run(&opts).await.expect("the run works");
    let report = &outcome.report;
    println!("{}\n{}", report.table(), report.summary_line());
    assert!(report.totals.grants > 0);
    assert_eq!(
        report.violations(),
        0,
        "seed {}:\n{}",
        opts.seed,
        report.table()
    );
}

/// A bounded pass of the `lockcheck` binary on every selected backend, one after
/// another: 6 s, 3 processes, the `stop` nemesis where it applies.
#[test]
fn every_selected_backend_passes_a_bounded_run() {
    let _serial = SERIAL.blocking_lock();
    let seed = fastrand::u64(..10_000_000);
    let mut failures = Vec::new();
    for label in testsuite::runner::selected() {
        let started = Instant::now();
        let mut child = Command::new(env!("CARGO_BIN_EXE_lockcheck"))
            .args(["--backend", &label, "--seconds", "6", "--processes", "3"])
            .args(["--nemesis", "stop", "--seed", &seed.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start lockcheck");
        let limit = Duration::from_secs(90);
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait for lockcheck") {
                break Some(status);
            }
            if started.elapsed() > limit {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let mut out = String::new();
        let mut err = String::new();
        if let Some(mut s) = child.stdout.take() {
            let _ = s.read_to_string(&mut out);
        }
        if let Some(mut s) = child.stderr.take() {
            let _ = s.read_to_string(&mut err);
        }
        let summary = out.lines().last().unwrap_or("").to_owned();
        println!(
            "{label} ({:.1} s): {summary}",
            started.elapsed().as_secs_f64()
        );
        match status {
            Some(s) if s.success() => {}
            Some(s) => failures.push(format!(
                "backend {label} (seed {seed}): lockcheck exited with {s}\n{out}{err}"
            )),
            None => failures.push(format!(
                "backend {label} (seed {seed}): lockcheck ran over {limit:?}"
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
