//! The lock-history checker: its rules on hand-made histories (violating, clean and
//! excused histories per class, with exact counts), its self-test (the broken
//! backend is caught, memory is clean), and bounded live runs on every backend
//! `DLOCK_TEST_BACKENDS` selects, one trial per (backend, nemesis).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Stdio;
use std::time::{Duration, Instant};

use testsuite::lockcheck::check::{check, Report, Rules};
use testsuite::lockcheck::coordinator::{check_dir, run_bound};
use testsuite::lockcheck::history::{
    Event, How, Kind, Mode, Op, Outcome, Reason, RegOp, Why, COORDINATOR,
};
use testsuite::lockcheck::nemesis::{Choice, Nemesis};
use testsuite::lockcheck::servers::not_applicable;
use testsuite::lockcheck::workload::LEASE;
use testsuite::lockcheck::{rules_for, run, LabelDeployment, RunOptions, RunOutcome};
use testsuite::proxy::Fault;

/// The live runs share two cores: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const MS: u64 = 1_000_000;

fn ms(ns: u64) -> u64 {
    ns / MS
}

/// The watchdog's lease, which hand-made holds are asked with (ms).
fn lease() -> u64 {
    u64::try_from(LEASE.as_millis()).expect("a lease in ms fits u64")
}

/// How long the checker lets a store keep a hold nobody reports (ms).
fn hidden() -> u64 {
    ms(Rules::default().hidden_hold_ns)
}

/// How long a lock may stay free while a waiter waits (ms).
fn slack() -> u64 {
    ms(Rules::default().starvation_slack_ns)
}

/// A hand-made history; times in ms (from an origin 1 s after 0, so `t - 1` is fine).
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
        self.invoke_op(t, p, lock, mode, fair, wait_ms, Op::Lock)
    }

    /// An acquire invoked as `op`.
    #[allow(clippy::too_many_arguments)]
    fn invoke_op(
        &mut self,
        t: u64,
        p: u32,
        lock: &str,
        mode: Mode,
        fair: bool,
        wait_ms: u64,
        op: Op,
    ) -> u64 {
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
                op,
                wait_ms,
                cancel: false,
            },
        );
        att
    }

    /// An `ok` whose acquire was sent 1 ms before, for `lease_ms`.
    #[allow(clippy::too_many_arguments)]
    fn ok_lease(
        &mut self,
        t: u64,
        p: u32,
        att: u64,
        lock: &str,
        mode: Mode,
        token: u64,
        hold: &str,
        lease_ms: u64,
    ) {
        self.push(
            t,
            p,
            Kind::Ok {
                att,
                lock: lock.into(),
                mode,
                token,
                hold: hold.into(),
                // "o/w" and "o/r" are holds of one owner, "o"; else each its own.
                owner: hold.split('/').next().unwrap_or(hold).into(),
                lease_ms,
                sent: 1_000 * MS + t * MS - MS,
                lost: false,
            },
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn ok(&mut self, t: u64, p: u32, att: u64, lock: &str, mode: Mode, token: u64, hold: &str) {
        self.ok_lease(t, p, att, lock, mode, token, hold, lease());
    }

    fn release(&mut self, t: u64, p: u32, hold: &str, lock: &str) {
        self.push(
            t,
            p,
            Kind::Release {
                hold: hold.into(),
                lock: lock.into(),
                how: How::Unlock,
            },
        );
    }

    fn released(&mut self, t: u64, p: u32, hold: &str, lock: &str, outcome: Outcome) {
        self.push(
            t,
            p,
            Kind::Released {
                hold: hold.into(),
                lock: lock.into(),
                outcome,
            },
        );
    }

    /// The lost signal of `p`'s hold of `lock` with `token`.
    fn lost(&mut self, t: u64, p: u32, lock: &str, token: u64) {
        self.push(
            t,
            p,
            Kind::Lost {
                lock: lock.into(),
                token,
                reason: Reason::LeaseExpired,
            },
        );
    }

    fn renewed(&mut self, t: u64, p: u32, lock: &str, token: u64) {
        self.push(
            t,
            p,
            Kind::Renewed {
                lock: lock.into(),
                token,
            },
        );
    }

    /// Process `p`'s timers ran late from `from` to `to` (ms).
    fn stalled(&mut self, from: u64, to: u64, p: u32) {
        self.push(
            to,
            p,
            Kind::Stall {
                from: 1_000 * MS + from * MS,
            },
        );
    }

    fn stopped(&mut self, from: u64, to: u64, p: u32) {
        self.push(from, p, Kind::Stop);
        self.push(to, p, Kind::Cont);
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

    /// An exclusive grant without register traffic: invoke 1 ms before `t_ok`, ok,
    /// release-invoke at `t_rel`.
    fn grant(&mut self, t_ok: u64, t_rel: u64, p: u32, lock: &str, token: u64, hold: &str) {
        self.grant_in(Mode::Exclusive, t_ok, t_rel, p, lock, token, hold);
    }

    /// [`grant`](Self::grant) in `mode`.
    #[allow(clippy::too_many_arguments)]
    fn grant_in(
        &mut self,
        mode: Mode,
        t_ok: u64,
        t_rel: u64,
        p: u32,
        lock: &str,
        token: u64,
        hold: &str,
    ) {
        let att = self.invoke(t_ok.saturating_sub(1), p, lock, mode, false, 1000);
        self.ok(t_ok, p, att, lock, mode, token, hold);
        self.release(t_rel, p, hold, lock);
    }

    /// A whole exclusive hold: [`grant`](Self::grant) with ENTER + WRITE at the `ok`
    /// and EXIT at the release.
    fn hold(&mut self, t_ok: u64, t_rel: u64, p: u32, lock: &str, token: u64, hold: &str) {
        self.grant(t_ok, t_rel, p, lock, token, hold);
        self.reg(t_ok, RegOp::Enter, lock, token, hold, true);
        self.reg(t_ok, RegOp::Write, lock, token, hold, true);
        self.reg(t_rel, RegOp::Exit, lock, token, hold, true);
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

/// Asserts the report has exactly `count` violations of `class` and none of any
/// other class, and returns it.
fn only(report: Report, class: &str, count: usize) -> Report {
    assert_eq!(report.count(class), count, "{class} in\n{}", report.table());
    for c in &report.classes {
        if c.name != class {
            assert_eq!(c.count, 0, "unexpected {} in\n{}", c.name, report.table());
        }
    }
    report
}

/// Asserts the report has no violation and `excused` excused cases of `class`.
fn clean(report: Report, class: &str, excused: usize) -> Report {
    let report = only(report, class, 0);
    let c = report
        .classes
        .iter()
        .find(|c| c.name == class)
        .expect("every class is reported");
    assert_eq!(c.excused, excused, "excused {class} in\n{}", report.table());
    report
}

fn overlap_is_a_grant_within_the_holders_valid_lease() {
    let mut h = H::default();
    h.hold(0, 100, 1, "x0", 1, "a");
    h.hold(50, 150, 2, "x0", 2, "b");
    h.exit_all(200, &[1, 2]);
    only(h.check(), "overlap", 1);

    let mut h = H::default();
    h.hold(0, 100, 1, "x0", 1, "a");
    h.hold(101, 150, 2, "x0", 2, "b");
    h.hold(200, 250, 1, "x1", 3, "c");
    h.hold(210, 260, 2, "x2", 4, "d");
    h.exit_all(300, &[1, 2]);
    clean(h.check(), "overlap", 0);

    // Told of the loss before the next grant: no overlap.
    let mut h = H::default();
    h.hold(0, 100, 1, "x0", 1, "a");
    h.lost(40, 1, "x0", 1);
    h.hold(50, 150, 2, "x0", 2, "b");
    h.exit_all(200, &[1, 2]);
    clean(h.check(), "overlap", 0);

    // Paused while holding, but B was let in well within A's lease: a violation
    // (the pause does not make the store's grant right).
    let mut h = H::default();
    h.hold(0, 3 * lease(), 1, "x0", 1, "a");
    h.stopped(10, 2 * lease(), 1);
    h.hold(50, 150, 2, "x0", 2, "b");
    h.exit_all(4 * lease(), &[1, 2]);
    only(h.check(), "overlap", 1);

    // Paused while holding, B let in after A's lease could have run out: excused.
    // A resumes and writes before it notices; that write is excused as well.
    let mut h = H::default();
    h.hold(0, 2 * lease(), 1, "x0", 1, "a");
    h.stopped(10, 2 * lease() - 100, 1);
    h.hold(lease() + 10, lease() + 20, 2, "x0", 2, "b");
    h.reg(2 * lease() - 50, RegOp::Write, "x0", 1, "a", true);
    h.exit_all(3 * lease(), &[1, 2]);
    let r = clean(h.check(), "overlap", 1);
    clean(r, "stale-write", 1);

    // Renewals extend what the store must keep: B within the renewed lease is an
    // overlap even though A was paused; B after it is excused.
    let last = 2 * lease() / 3 + 300;
    for (b_at, overlaps, excused) in [(last + lease() - 100, 1, 0), (last + lease() + 100, 0, 1)] {
        let mut h = H::default();
        h.grant(0, 3 * lease(), 1, "x0", 1, "a");
        h.renewed(lease() / 3, 1, "x0", 1);
        h.renewed(last, 1, "x0", 1);
        h.stopped(last + 100, 3 * lease() - 10, 1);
        h.grant(b_at, b_at + 10, 2, "x0", 2, "b");
        h.exit_all(4 * lease(), &[1, 2]);
        let r = only(h.check(), "overlap", overlaps);
        assert_eq!(r.classes[0].excused, excused, "{}", r.table());
    }

    // A renewal of A that succeeded after B's grant: the store held both.
    let mut h = H::default();
    h.grant(0, 3 * lease(), 1, "x0", 1, "a");
    h.stopped(10, lease() + 100, 1);
    h.grant(lease() + 50, lease() + 500, 2, "x0", 2, "b");
    h.renewed(lease() + 200, 1, "x0", 1);
    h.exit_all(4 * lease(), &[1, 2]);
    only(h.check(), "overlap", 1);

    // B's ok came late (paused between invoke and ok): excused only when B's token
    // says it was the earlier grant.
    for (b_token, overlaps, excused) in [(1, 0, 1), (3, 1, 0)] {
        let mut h = H::default();
        let b = h.invoke(0, 2, "x0", Mode::Exclusive, false, 1000);
        h.stopped(10, 150, 2);
        h.grant(100, 500, 1, "x0", 2, "a");
        h.ok(200, 2, b, "x0", Mode::Exclusive, b_token, "b");
        h.release(600, 2, "b", "x0");
        h.exit_all(1000, &[1, 2]);
        let r = only(h.check(), "overlap", overlaps);
        assert_eq!(r.classes[0].excused, excused, "{}", r.table());
    }

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
        let t = 10 * i as u64 + 10;
        let att = h.invoke(t, p, "rw0", mode, false, 100);
        h.ok(t + 1, p, att, "rw0", mode, 10 + i as u64, hold);
        h.release(t + 50, p, hold, "rw0");
    }
    h.exit_all(200, &[1, 2, 3]);
    only(h.check(), "overlap", 2);
}

/// One owner's read and write holds do not conflict (a writer reading, a
/// downgrade, an upgrade), and may share a token; another owner's do, and may not.
/// An upgrade goes on with its read's token: judged against earlier writers only,
/// and its writes are not stale for a reader granted before it.
fn one_owners_holds_do_not_conflict() {
    // A writer reads beside its write, then lets the write go (a downgrade): the
    // read shares the write's token.
    let mut h = H::default();
    h.grant_in(Mode::Exclusive, 10, 100, 1, "rw0", 10, "o/w");
    h.grant_in(Mode::Shared, 20, 150, 1, "rw0", 10, "o/r");
    h.exit_all(300, &[1]);
    clean(h.check(), "overlap", 0);

    // Another owner's read beside that write, or with its token, is a violation.
    let mut h = H::default();
    h.grant_in(Mode::Exclusive, 10, 100, 1, "rw0", 10, "o/w");
    h.grant_in(Mode::Shared, 20, 150, 2, "rw0", 10, "q/r");
    h.exit_all(300, &[1, 2]);
    let r = h.check();
    assert_eq!(r.count("overlap"), 1, "{}", r.table());
    assert_eq!(r.count("token-order"), 1, "{}", r.table());

    // An upgrade with its read's token (5), after another owner's reader (8) that
    // read beside that read and left: no violation; the same grant made as a plain
    // write is not above that reader's token.
    for (op, violations) in [(Op::Upgrade, 0), (Op::Lock, 1)] {
        let mut h = H::default();
        h.grant_in(Mode::Shared, 10, 200, 1, "rw0", 5, "o/r");
        h.grant_in(Mode::Shared, 20, 50, 2, "rw0", 8, "q/r");
        let att = h.invoke_op(55, 1, "rw0", Mode::Exclusive, false, 100, op);
        h.ok(60, 1, att, "rw0", Mode::Exclusive, 5, "o/w");
        h.reg(70, RegOp::Write, "rw0", 5, "o/w", true);
        h.release(100, 1, "o/w", "rw0");
        h.exit_all(300, &[1, 2]);
        let r = h.check();
        assert_eq!(r.count("token-order"), violations, "{op:?}: {}", r.table());
        assert_eq!(r.count("stale-write"), 0, "{op:?}: {}", r.table());
        assert_eq!(r.count("overlap"), 0, "{op:?}: {}", r.table());
    }
}

/// Semaphore permits held together add up to at most the total (3): holds that
/// overlap are fine while they fit, a grant past the total is an overlap, and a
/// holder told of its loss no longer counts.
fn permits_in_use_never_exceed_the_total() {
    let mut h = H::default();
    h.grant_in(Mode::Permit2, 0, 100, 1, "s0", 1, "a");
    h.grant_in(Mode::Permit1, 10, 100, 2, "s0", 2, "b");
    h.grant_in(Mode::Permit2, 101, 150, 3, "s0", 3, "c");
    h.exit_all(200, &[1, 2, 3]);
    clean(h.check(), "overlap", 0);

    let mut h = H::default();
    h.grant_in(Mode::Permit2, 0, 100, 1, "s0", 1, "a");
    h.grant_in(Mode::Permit1, 10, 100, 2, "s0", 2, "b");
    h.grant_in(Mode::Permit1, 20, 30, 3, "s0", 3, "c");
    h.exit_all(200, &[1, 2, 3]);
    only(h.check(), "overlap", 1);

    let mut h = H::default();
    h.grant_in(Mode::Permit2, 0, 100, 1, "s0", 1, "a");
    h.lost(15, 1, "s0", 1);
    h.grant_in(Mode::Permit2, 20, 30, 2, "s0", 2, "b");
    h.exit_all(200, &[1, 2]);
    clean(h.check(), "overlap", 0);

    // An exclusive hold of the name excludes permit holders.
    let mut h = H::default();
    h.grant_in(Mode::Permit1, 0, 100, 1, "s0", 1, "a");
    h.grant(10, 20, 2, "s0", 2, "b");
    h.exit_all(200, &[1, 2]);
    only(h.check(), "overlap", 1);
}

/// A server outage ends every hold of a session-mode store with no notice: a grant
/// after it began beside a hold alive in it, and that hold's write after the grant,
/// are excused if the holder was told within half the session after the server
/// came back — and only then (no outage, an ordinary store, told late, or a grant
/// before the outage began: violations).
/// Where an outage ends every hold (the SQL session modes), a grant asked for
/// before an outage and answered in it may have been made before a grant answered
/// earlier — the server granted it, ended its session on the way down, granted the
/// lock to another session, and the first answer reached its client last (seen on
/// `mysql-session` under the restart nemesis: tokens 28820, then 28818, 70 ms
/// apart, just after the server went down) — so its token's order is not judged
/// (fencing keeps its writes out: its token is the lower). Without the outage, or
/// on a store whose holds outlive one, the same history is a violation.
fn a_grant_answered_in_an_outage_is_not_ordered_where_outages_end_holds() {
    let session = rules_for("mysql-session");
    assert!(session.outage_ends_holds);
    let history = |outage: bool| {
        let mut h = H::default();
        if outage {
            let what = "restart mysql-session".to_owned();
            h.push(1000, COORDINATOR, Kind::Down { what });
            h.push(1300, COORDINATOR, Kind::Up);
        }
        // A: asked at 990, answered at 1020 with token 7, released at 1030.
        let a = h.invoke(990, 1, "x0", Mode::Exclusive, false, 1000);
        h.ok(1020, 1, a, "x0", Mode::Exclusive, 7, "a");
        h.release(1030, 1, "a", "x0");
        // B: asked at 950, before the outage, answered at 1070 with token 5.
        let b = h.invoke(950, 2, "x0", Mode::Exclusive, false, 1000);
        h.ok(1070, 2, b, "x0", Mode::Exclusive, 5, "b");
        h.release(1080, 2, "b", "x0");
        h.exit_all(1500, &[1, 2]);
        h
    };
    clean(
        check("hand-made", &history(true).events, &session),
        "token-order",
        1,
    );
    let r = check("hand-made", &history(false).events, &session);
    assert_eq!(r.count("token-order"), 1, "{}", r.table());
    let mut lease_store = session;
    lease_store.outage_ends_holds = false;
    let r = check("hand-made", &history(true).events, &lease_store);
    assert_eq!(r.count("token-order"), 1, "{}", r.table());
}

fn an_outage_ends_session_holds_without_notice() {
    let session = rules_for("postgres-session");
    assert!(session.outage_ends_holds);
    let notice = ms(session.session_ns.expect("a session store")) / 2;
    // A holds from 0 until it is told at `told`; the server is down 1000..1300;
    // B is granted at `b_at`, A writes at 1250 (accepted).
    let history = |outage: bool, told: u64, b_at: u64| {
        let mut h = H::default();
        h.hold(0, told, 1, "x0", 1, "a");
        if outage {
            h.push(
                1000,
                COORDINATOR,
                Kind::Down {
                    what: "restart postgres".to_owned(),
                },
            );
            h.push(1300, COORDINATOR, Kind::Up);
        }
        h.hold(b_at, b_at + 10, 2, "x0", 2, "b");
        h.reg(1250, RegOp::Write, "x0", 1, "a", true);
        h.exit_all(told + 100, &[1, 2]);
        h
    };
    let excused = |r: &Report, class: usize| r.classes[class].excused;

    let r = check("hand-made", &history(true, 1400, 1200).events, &session);
    let r = clean(r, "overlap", 1);
    assert_eq!(excused(&r, 1), 1, "the write: {}", r.table());

    // Told at the last instant the rule allows, and just after it.
    let r = check(
        "hand-made",
        &history(true, 1300 + notice, 1200).events,
        &session,
    );
    clean(r, "overlap", 1);
    let r = check(
        "hand-made",
        &history(true, 1301 + notice, 1200).events,
        &session,
    );
    assert_eq!(r.count("overlap"), 1, "{}", r.table());

    // No outage: the same grant is an overlap and the write a stale one.
    let r = check("hand-made", &history(false, 1400, 1200).events, &session);
    assert_eq!(r.count("overlap"), 1, "{}", r.table());
    assert_eq!(r.count("stale-write"), 1, "{}", r.table());

    // A store whose holds outlive an outage (its leases are stored): no excuse.
    let mut lease_store = session;
    lease_store.outage_ends_holds = false;
    let r = check("hand-made", &history(true, 1400, 1200).events, &lease_store);
    assert_eq!(r.count("overlap"), 1, "{}", r.table());

    // B granted before the outage began: nothing excuses it.
    let r = check("hand-made", &history(true, 1400, 900).events, &session);
    assert_eq!(r.count("overlap"), 1, "{}", r.table());

    // A reset of the holder's own connections ends its session as an outage does:
    // a grant after it is excused if the holder was told in time, not otherwise,
    // and not a grant before it.
    for (told, b_at, overlaps) in [(1200, 1150, 0), (1101 + notice, 1150, 1), (1200, 1050, 1)] {
        let mut h = history(false, told, b_at);
        h.push(
            1080,
            1,
            Kind::Fault {
                fault: Fault::Blackhole,
            },
        );
        h.push(
            1100,
            1,
            Kind::Fault {
                fault: Fault::Reset,
            },
        );
        h.push(1110, 1, Kind::Fault { fault: Fault::Pass });
        let r = check("hand-made", &h.events, &session);
        assert_eq!(
            r.count("overlap"),
            overlaps,
            "told {told}, B at {b_at}: {}",
            r.table()
        );
    }
}

fn stale_writes_are_writes_after_a_greater_token_was_granted() {
    // A writes after B (greater token) was granted; A had released already, so it is
    // not an overlap — only the write is wrong. Two writes count twice; one write
    // after two later grants counts once.
    let mut h = H::default();
    h.grant(0, 10, 1, "x0", 1, "a");
    h.grant(20, 30, 2, "x0", 2, "b");
    h.grant(40, 45, 2, "x0", 3, "c");
    h.reg(25, RegOp::Write, "x0", 1, "a", true);
    h.reg(50, RegOp::Write, "x0", 1, "a", true);
    h.exit_all(100, &[1, 2]);
    only(h.check(), "stale-write", 2);

    // Writes before the greater grant, and a later grant's writes: clean.
    let mut h = H::default();
    h.grant(0, 10, 1, "x0", 1, "a");
    h.reg(5, RegOp::Write, "x0", 1, "a", true);
    h.grant(20, 30, 2, "x0", 2, "b");
    h.reg(25, RegOp::Write, "x0", 2, "b", true);
    h.exit_all(100, &[1, 2]);
    clean(h.check(), "stale-write", 0);

    // Stale writes that the register rejects are the fencing working.
    let mut h = H::default();
    h.hold(0, 10, 1, "x0", 1, "a");
    h.hold(20, 30, 2, "x0", 2, "b");
    h.reg(40, RegOp::Write, "x0", 1, "a", false);
    h.exit_all(100, &[1, 2]);
    let r = clean(h.check(), "stale-write", 0);
    assert_eq!(r.totals.writes_rejected, 1);

    // A paused, and B granted within A's lease: the write is not excused (and the
    // grant is an overlap).
    let mut h = H::default();
    h.grant(0, lease() / 2, 1, "x0", 1, "a");
    h.stopped(10, 300, 1);
    h.grant(100, 200, 2, "x0", 2, "b");
    h.reg(350, RegOp::Write, "x0", 1, "a", true);
    h.exit_all(lease(), &[1, 2]);
    let r = h.check();
    assert_eq!(
        (r.count("stale-write"), r.count("overlap"), r.violations()),
        (1, 1, 2),
        "{}",
        r.table()
    );
}

fn token_order_checks_duplicates_always_and_order_unless_the_ok_came_late() {
    let mut h = H::default();
    h.grant(0, 10, 1, "x0", 5, "a");
    h.grant(20, 30, 2, "x0", 5, "b");
    h.grant(40, 50, 1, "x0", 4, "c");
    h.exit_all(100, &[1, 2]);
    only(h.check(), "token-order", 2);

    // B's ok came late: its lower token is excused, a duplicate is not.
    for (b_token, violations, excused) in [(4, 0, 1), (5, 1, 0)] {
        let mut h = H::default();
        let b = h.invoke(0, 2, "x0", Mode::Exclusive, false, 1000);
        h.stopped(5, 30, 2);
        h.grant(10, 15, 1, "x0", 5, "a");
        h.ok(40, 2, b, "x0", Mode::Exclusive, b_token, "b");
        h.release(50, 2, "b", "x0");
        h.exit_all(100, &[1, 2]);
        let r = only(h.check(), "token-order", violations);
        assert_eq!(r.classes[2].excused, excused, "{}", r.table());
    }

    // Shared grants: each its own token, above the last exclusive one.
    let mut h = H::default();
    h.grant(0, 10, 1, "rw0", 5, "w");
    for (p, token, hold) in [(2, 6, "r1"), (3, 6, "r2"), (1, 5, "r3")] {
        let att = h.invoke(20, p, "rw0", Mode::Shared, false, 100);
        h.ok(21, p, att, "rw0", Mode::Shared, token, hold);
        h.release(30, p, hold, "rw0");
    }
    h.exit_all(100, &[1, 2, 3]);
    only(h.check(), "token-order", 2);

    let mut h = H::default();
    h.grant(0, 30, 1, "x0", 5, "a");
    let again = h.invoke(10, 1, "x0", Mode::Exclusive, false, 0);
    h.ok(11, 1, again, "x0", Mode::Exclusive, 5, "a");
    h.release(12, 1, "a", "x0");
    h.grant(40, 50, 2, "x0", 6, "b");
    h.exit_all(100, &[1, 2]);
    let r = clean(h.check(), "token-order", 0);
    assert_eq!((r.totals.grants, r.totals.reentries), (2, 1));
}

fn late_loss_is_a_signal_after_the_lease_could_end() {
    // Lost after the lease (from the acquire's send) could end: late.
    let mut h = H::default();
    h.grant(0, lease() + 300, 1, "x0", 1, "a");
    h.lost(lease() + 100, 1, "x0", 1);
    h.exit_all(2 * lease(), &[1]);
    only(h.check(), "late-loss", 1);

    // Before it: on time.
    let mut h = H::default();
    h.grant(0, lease() + 300, 1, "x0", 1, "a");
    h.lost(lease() - 100, 1, "x0", 1);
    h.exit_all(2 * lease(), &[1]);
    clean(h.check(), "late-loss", 0);

    // A renewal moves the end: the same signal is on time.
    let mut h = H::default();
    h.grant(0, lease() + 300, 1, "x0", 1, "a");
    h.renewed(lease() / 3, 1, "x0", 1);
    h.lost(lease() + 100, 1, "x0", 1);
    h.exit_all(2 * lease(), &[1]);
    clean(h.check(), "late-loss", 0);

    // An explicit lease counts from its own length.
    for (lost_at, late) in [(1100, 1), (950, 0)] {
        let mut h = H::default();
        let a = h.invoke(0, 1, "x0", Mode::Exclusive, false, 0);
        h.ok_lease(1, 1, a, "x0", Mode::Exclusive, 1, "a", 1000);
        h.lost(lost_at, 1, "x0", 1);
        h.release(1200, 1, "a", "x0");
        h.exit_all(2000, &[1]);
        only(h.check(), "late-loss", late);
    }

    // The process stalled (its timers late) while the signal was due: excused, as a
    // pause; a stall long before it (here before the last renewal) excuses nothing.
    let mut h = H::default();
    h.grant(0, lease() + 600, 1, "x0", 1, "a");
    h.push(
        lease() + 400,
        1,
        Kind::Stall {
            from: (1_000 + lease() - 200) * MS,
        },
    );
    h.lost(lease() + 500, 1, "x0", 1);
    h.exit_all(2 * lease(), &[1]);
    let r = clean(h.check(), "late-loss", 1);
    assert_eq!(r.totals.late_losses_in_stalls, 1);
    assert_eq!(r.totals.stalls, 1);
    assert!(
        (r.totals.longest_stall_ms - 600.0).abs() < 0.01,
        "{:?}",
        r.totals
    );
    let mut h = H::default();
    h.grant(0, lease() + lease() / 3 + 300, 1, "x0", 1, "a");
    h.renewed(lease() / 3, 1, "x0", 1);
    h.push(
        lease() / 4,
        1,
        Kind::Stall {
            from: (1_000 + lease() / 4 - 20) * MS,
        },
    );
    h.lost(lease() + lease() / 3 + 100, 1, "x0", 1);
    h.exit_all(3 * lease(), &[1]);
    let r = only(h.check(), "late-loss", 1);
    assert_eq!(
        r.totals.late_losses_in_stalls, 0,
        "a stall before the last proof"
    );

    // Paused from before the lease could end until the signal: excused.
    let mut h = H::default();
    h.grant(0, lease() + 600, 1, "x0", 1, "a");
    h.stopped(lease() - 500, lease() + 400, 1);
    h.lost(lease() + 500, 1, "x0", 1);
    h.exit_all(2 * lease(), &[1]);
    clean(h.check(), "late-loss", 1);

    // Never told, and B let in after A's lease could end: one late loss, no overlap.
    let mut h = H::default();
    h.grant(0, lease() + 500, 1, "x0", 1, "a");
    h.grant(lease() + 100, lease() + 200, 2, "x0", 2, "b");
    h.exit_all(2 * lease(), &[1, 2]);
    only(h.check(), "late-loss", 1);

    // Told late, after B and C were let in: still one incident.
    let mut h = H::default();
    h.grant(0, lease() + 500, 1, "x0", 1, "a");
    h.grant(lease() + 100, lease() + 150, 2, "x0", 2, "b");
    h.grant(lease() + 200, lease() + 250, 3, "x0", 3, "c");
    h.lost(lease() + 300, 1, "x0", 1);
    h.exit_all(2 * lease(), &[1, 2, 3]);
    only(h.check(), "late-loss", 1);

    // Margins: the lead of the signal before the next conflicting grant.
    let mut h = H::default();
    h.grant(0, 1000, 1, "x0", 1, "a");
    h.lost(900, 1, "x0", 1);
    h.grant(1000, 1100, 2, "x0", 2, "b");
    h.grant(1200, 1300, 1, "x1", 3, "c");
    h.lost(1250, 1, "x1", 3);
    h.grant(1270, 1300, 2, "x1", 4, "d");
    h.exit_all(2000, &[1, 2]);
    let r = clean(h.check(), "late-loss", 0);
    let (min, median, n) = r.margins_ms.expect("two margins");
    assert!(
        (min - 20.0).abs() < 0.01 && (median - 100.0).abs() < 0.01 && n == 2,
        "{:?}",
        r.margins_ms
    );
}

fn leaks_are_reported() {
    let mut h = H::default();
    h.hold(0, 10, 1, "x0", 1, "a");
    h.exit_all(20, &[1]);
    clean(h.check(), "leak", 0);
    h.push(
        30,
        COORDINATOR,
        Kind::Leak {
            lock: "x0".into(),
            state: "holders=1".into(),
        },
    );
    only(h.check(), "leak", 1);
}

fn starvation_needs_a_long_free_stretch_within_the_wait() {
    let waiter = |h: &mut H, lock: &str, t: u64, wait: u64| {
        let att = h.invoke(t, 2, lock, Mode::Exclusive, false, wait);
        h.push(
            t + wait,
            2,
            Kind::Fail {
                att,
                lock: lock.into(),
                why: Why::Timeout,
            },
        );
    };
    // Held until 500 ms, released without a confirmation: the store may keep it
    // `hidden` longer. The waiter waits 1 s – (hidden + slack + 2 s): free for more
    // than the slack.
    let end = 500 + hidden() + slack() + 1000;
    let mut h = H::default();
    h.hold(0, 500, 1, "x0", 1, "a");
    waiter(&mut h, "x0", 1000, end - 1000);
    h.exit_all(end + 1000, &[1, 2]);
    only(h.check(), "starvation", 1);

    // The waiter's process stalled (got no CPU) for most of the free stretch: it
    // ran for less than the slack of it, excused; stalled for a little: starved.
    let free_from = 500 + hidden();
    for (stalled, starved) in [(end - free_from - 500, 0), (300, 1)] {
        let mut h = H::default();
        h.hold(0, 500, 1, "x0", 1, "a");
        waiter(&mut h, "x0", 1000, end - 1000);
        h.stalled(free_from + 100, free_from + 100 + stalled, 2);
        h.exit_all(end + 1000, &[1, 2]);
        let r = only(h.check(), "starvation", starved);
        assert_eq!(r.classes[5].excused, 1 - starved, "{}", r.table());
    }

    // The release confirmed: free at once. A waiter within `hidden` of the release
    // is starved only with the confirmation.
    for (confirmed, starved) in [(true, 1), (false, 0)] {
        let mut h = H::default();
        h.hold(0, 500, 1, "x0", 1, "a");
        let outcome = if confirmed {
            Outcome::Ok
        } else {
            Outcome::Cancelled
        };
        h.released(505, 1, "a", "x0", outcome);
        waiter(&mut h, "x0", 600, slack() + 200);
        h.exit_all(hidden() + slack() + 2000, &[1, 2]);
        only(h.check(), "starvation", starved);
    }

    // A lock nobody ever held is free for the whole wait.
    let mut h = H::default();
    h.hold(0, 500, 1, "x0", 1, "a");
    waiter(&mut h, "x1", 600, slack() + 200);
    h.exit_all(slack() + 2000, &[1, 2]);
    only(h.check(), "starvation", 1);

    // Occupied with short gaps only: not starved; with many long gaps within one
    // wait: starved once.
    for (gap, starved) in [(slack() / 2, 0), (slack() + 100, 1)] {
        let mut h = H::default();
        let mut t = 0;
        for i in 0..6 {
            h.hold(t, t + 100, 1, "x0", i + 1, &format!("h{i}"));
            h.released(t + 101, 1, &format!("h{i}"), "x0", Outcome::Ok);
            t += 100 + gap;
        }
        waiter(&mut h, "x0", 50, t);
        h.exit_all(2 * t + 1000, &[1, 2]);
        only(h.check(), "starvation", starved);
    }

    // Held until `hidden` + 1 s and then unconfirmed: not enough free time.
    let mut h = H::default();
    h.hold(0, 1000, 1, "x0", 1, "a");
    waiter(&mut h, "x0", 1000, hidden() + slack());
    h.exit_all(2 * hidden() + slack() + 1000, &[1, 2]);
    clean(h.check(), "starvation", 0);

    // The waiter's process was stopped: not judged.
    let mut h = H::default();
    h.hold(0, 500, 1, "x0", 1, "a");
    waiter(&mut h, "x0", 1000, end - 1000);
    h.stopped(2000, 2500, 2);
    h.exit_all(end + 1000, &[1, 2]);
    clean(h.check(), "starvation", 1);
}

fn fair_order_is_checked_among_waiters_of_one_hold() {
    let fair_wait =
        |h: &mut H, t_inv: u64, t_ok: u64, t_rel: u64, p: u32, token: u64, hold: &str| {
            let att = h.invoke(t_inv, p, "f0", Mode::Exclusive, true, 5000);
            h.ok(t_ok, p, att, "f0", Mode::Exclusive, token, hold);
            h.release(t_rel, p, hold, "f0");
        };
    let margin = ms(Rules::default().fair_margin_ns);
    // C (process 1) holds 0–1000; A (2) arrives at 100, B (3) at `b_arrives`; B is
    // granted first; process `p` is paused over `window`, if given.
    let b_first = |b_arrives: u64, pause: Option<(u64, u64, u32)>| {
        let mut h = H::default();
        fair_wait(&mut h, 0, 1, 1000, 1, 1, "c");
        fair_wait(&mut h, 100, 1100, 1200, 2, 3, "a");
        fair_wait(&mut h, b_arrives, 1001, 1090, 3, 2, "b");
        if let Some((from, to, p)) = pause {
            h.stopped(from, to, p);
        }
        h.exit_all(2000, &[1, 2, 3]);
        h.check()
    };
    // B arrived a margin after A: a violation.
    only(b_first(101 + margin, None), "fair-order", 1);

    // In arrival order: clean.
    let mut h = H::default();
    fair_wait(&mut h, 0, 1, 1000, 1, 1, "c");
    fair_wait(&mut h, 100, 1001, 1090, 2, 2, "a");
    fair_wait(&mut h, 101 + margin, 1100, 1200, 3, 3, "b");
    h.exit_all(2000, &[1, 2, 3]);
    clean(h.check(), "fair-order", 0);

    // Arrivals closer than the margin are not judged.
    clean(b_first(100 + margin, None), "fair-order", 0);

    // A's process paused while it waited: excused.
    clean(b_first(101 + margin, Some((500, 600, 2))), "fair-order", 1);

    // A third process (C's) paused between A's arrival and B's: it may have held
    // rows A's first statement waited for, so A reached the store late. Excused.
    clean(b_first(101 + margin, Some((90, 150, 1))), "fair-order", 1);

    // A's own connections faulted until just before A arrived (seen: postgres,
    // proxy nemesis, a black hole ending 5 ms before A's invoke): the connections
    // the fault broke are found broken and replaced when A first uses them, so A's
    // first statement reaches the store late. Excused within the recovery after a
    // window's end ...
    let faulted_until = |end: u64| {
        let mut h = H::default();
        fair_wait(&mut h, 0, 1, 3000, 1, 1, "c");
        h.push(
            0,
            2,
            Kind::Fault {
                fault: Fault::Blackhole,
            },
        );
        h.push(end, 2, Kind::Fault { fault: Fault::Pass });
        fair_wait(&mut h, 1500, 3100, 3200, 2, 3, "a");
        fair_wait(&mut h, 1501 + margin, 3001, 3090, 3, 2, "b");
        h.exit_all(4000, &[1, 2, 3]);
        h.check()
    };
    let recovery = ms(Rules::default().fault_recovery_ns);
    clean(faulted_until(1495), "fair-order", 1);
    // ... and judged when the window ended longer ago than that.
    assert!(
        recovery < 1400,
        "the case below needs a recovery under 1.4 s"
    );
    only(faulted_until(1499 - recovery), "fair-order", 1);

    // A's own process paused (SIGSTOP) until just before A arrived, as a fault would
    // cut it off (seen: etcd-tls, stop nemesis, A invoked 63 ms after its process
    // was continued from a 3 s stop, granted after B of the same process): the
    // connections, keepalives and leases the pause let lapse are renewed when A
    // first uses them. Excused within the recovery after the pause's end, judged
    // when it ended longer ago than that.
    let paused_until = |end: u64| {
        let mut h = H::default();
        fair_wait(&mut h, 0, 1, 3000, 1, 1, "c");
        h.stopped(10, end, 2);
        fair_wait(&mut h, 1500, 3100, 3200, 2, 3, "a");
        fair_wait(&mut h, 1501 + margin, 3001, 3090, 3, 2, "b");
        h.exit_all(4000, &[1, 2, 3]);
        h.check()
    };
    clean(paused_until(1437), "fair-order", 1);
    only(paused_until(1499 - recovery), "fair-order", 1);

    // A's process stalled (its timers late, the machine loaded) between A's invoke
    // and B's: A's requests went out that much later (seen: MySQL over TLS, A 371 ms
    // ahead of B, A's process up to 180 ms late). Excused when A's lead less the
    // stall is within the margin; judged when it is not, or when another process
    // stalled.
    let stalled = |p: u32, from: u64, to: u64| {
        let mut h = H::default();
        fair_wait(&mut h, 0, 1, 1000, 1, 1, "c");
        fair_wait(&mut h, 100, 1100, 1200, 2, 3, "a");
        fair_wait(&mut h, 471, 1001, 1090, 3, 2, "b");
        h.stalled(from, to, p);
        h.exit_all(2000, &[1, 2, 3]);
        h.check()
    };
    assert_eq!(
        margin, 250,
        "the stall cases below are written for a 250 ms margin"
    );
    clean(stalled(2, 150, 300), "fair-order", 1);
    // Two windows that overlap count once: 150–230 and 200–270 are 120 ms.
    let mut h = H::default();
    fair_wait(&mut h, 0, 1, 1000, 1, 1, "c");
    fair_wait(&mut h, 100, 1100, 1200, 2, 3, "a");
    fair_wait(&mut h, 471, 1001, 1090, 3, 2, "b");
    h.stalled(150, 230, 2);
    h.stalled(200, 270, 2);
    h.exit_all(2000, &[1, 2, 3]);
    only(h.check(), "fair-order", 1);
    only(stalled(2, 150, 250), "fair-order", 1);
    only(stalled(3, 150, 300), "fair-order", 1);
    // A stall after B's invoke does not count.
    only(stalled(2, 480, 600), "fair-order", 1);

    // ... but not one paused only after B arrived: judged. The example says what
    // each process went through around A's wait.
    let report = only(
        b_first(101 + margin, Some((102 + margin, 900, 1))),
        "fair-order",
        1,
    );
    let example = &report
        .classes
        .iter()
        .find(|c| c.name == "fair-order")
        .expect("every class is reported")
        .examples[0];
    assert!(
        example.contains(&format!(
            "p1: faults none, pauses {}.0ms–900.0ms, longest stall 0.0ms; p2: faults none, pauses none"
        , 102 + margin)),
        "{example}"
    );

    // Exclusive grants answer in the order they were granted: B's answer 2 ms
    // before A's (B released in between) is judged.
    let mut h = H::default();
    fair_wait(&mut h, 0, 1, 1000, 1, 1, "c");
    fair_wait(&mut h, 100, 1003, 1200, 2, 3, "a");
    fair_wait(&mut h, 101 + margin, 1001, 1002, 3, 2, "b");
    h.exit_all(2000, &[1, 2, 3]);
    only(h.check(), "fair-order", 1);

    // Permits: two grants one release admitted answer in either order (a
    // semaphore's head, granted, tells the next in line, whose answer may come
    // first). B's answer the margin before A's: not judged; more than that: judged.
    let answer_margin = ms(Rules::default().permit_answer_margin_ns);
    for (a_after_b, violations) in [(answer_margin, 0), (answer_margin + 1, 1)] {
        let mut h = H::default();
        let permit = |h: &mut H, t_inv: u64, t_ok: u64, p: u32, token: u64, hold: &str| {
            let att = h.invoke(t_inv, p, "s0", Mode::Permit1, true, 5000);
            h.ok(t_ok, p, att, "s0", Mode::Permit1, token, hold);
        };
        permit(&mut h, 0, 1, 1, 1, "c");
        h.release(1000, 1, "c", "s0");
        permit(&mut h, 100, 1001 + a_after_b, 2, 2, "a");
        permit(&mut h, 101 + margin, 1001, 3, 3, "b");
        h.release(1100 + a_after_b, 3, "b", "s0");
        h.release(1200 + a_after_b, 2, "a", "s0");
        h.exit_all(2000, &[1, 2, 3]);
        let r = h.check();
        if violations == 0 {
            clean(r, "fair-order", 0);
        } else {
            only(r, "fair-order", violations);
        }
    }
}

/// The parts of a `lockcheck` summary line the tests look at.
#[derive(Debug, PartialEq, Eq)]
struct Summary {
    label: String,
    ops: u64,
    grants: u64,
    terms: u64,
    permits: u64,
    faults: u64,
    violations: u64,
}

/// Parses `lockcheck: <label> ops=… grants=… terms=… permits=… faults=…
/// violations=… (…)`.
fn parse_summary(line: &str) -> Option<Summary> {
    let rest = line.strip_prefix("lockcheck: ")?;
    let (label, rest) = rest.split_once(' ')?;
    let words: Vec<&str> = rest.split_whitespace().collect();
    let field = |name: &str| -> Option<u64> {
        words.iter().find_map(|w| {
            w.strip_prefix(name)?
                .strip_prefix('=')?
                .trim_end_matches(')')
                .parse()
                .ok()
        })
    };
    Some(Summary {
        label: label.to_owned(),
        ops: field("ops")?,
        grants: field("grants")?,
        terms: field("terms")?,
        permits: field("permits")?,
        faults: field("faults")?,
        violations: field("violations")?,
    })
}

/// Asserts a summary line says what its report says.
fn summary_matches(report: &Report) {
    let summary = parse_summary(&report.summary_line()).expect("a summary line");
    let t = &report.totals;
    assert_eq!(
        summary,
        Summary {
            label: report.label.clone(),
            ops: t.ops as u64,
            grants: t.grants as u64,
            terms: t.terms as u64,
            permits: t.permit_grants as u64,
            faults: t.faults as u64,
            violations: report.violations() as u64,
        }
    );
}

/// Seeds a broken backend is run with until its flaw is caught.
const SEEDS: u64 = 4;

/// In-process runs are short: a few leases are enough for every rule to have work.
fn in_process(seed: u64) -> RunOptions {
    RunOptions {
        duration: LEASE * 2,
        seed,
        processes: 3,
        nemesis: Choice::None,
        keep: false,
        worker_exe: None,
    }
}

/// Runs the checker on this repository's `label`.
async fn run_label(label: &str, opts: &RunOptions) -> Result<RunOutcome, String> {
    run(&LabelDeployment::new(label)?, opts).await
}

/// Runs the broken backend `label` with seeds 1, 2, … (at most [`SEEDS`]) until a
/// run reports every class of `required`, and checks that no class outside
/// `required` and `possible` (what the flaw may also cause, timing permitting) fired. A flaw that shows only when the timing lets it (starvation,
/// about three runs in four) still fails the self-test only if every seed misses it.
async fn caught(label: &str, required: &[&str], possible: &[&str]) -> Report {
    for seed in 1..=SEEDS {
        let opts = in_process(seed);
        let outcome = run_label(label, &opts).await.expect("the run works");
        let report = outcome.report;
        println!("seed {seed}: {}", report.summary_line());
        for c in report
            .classes
            .iter()
            .filter(|c| !required.contains(&c.name) && !possible.contains(&c.name))
        {
            assert_eq!(
                c.count,
                0,
                "{label} seed {seed}: {}\n{}",
                c.name,
                report.table()
            );
        }
        if required.iter().all(|class| report.count(class) > 0) {
            return report;
        }
    }
    panic!("{label}: {required:?} not all reported with seeds 1–{SEEDS}");
}

async fn the_broken_backends_are_caught() {
    let _serial = SERIAL.lock().await;
    // A release that ignores its owner: grants over live holds, and writes accepted
    // after a greater token was granted. It may also free a grant whose answer is
    // still on its way to its caller, and the next grant (a greater token) may be
    // answered first: a lower token after a greater one, by `ok` time — seen in a
    // full run under load, a true violation of the flaw's making.
    let report = caught(
        "broken-memory",
        &["overlap", "stale-write"],
        &["token-order"],
    )
    .await;
    summary_matches(&report);
    // Every grant carries the same token. A loss signal names its lock and token,
    // and belongs to the last hold of that token its process was granted: with one
    // token for all, a loss of one hold may be pinned on the process's later hold
    // of the same lock, and the earlier one then judged not told (late-loss, seen in
    // a full run).
    caught("broken-tokens", &["token-order"], &["late-loss"]).await;
    // Names nobody holds are never granted.
    let report = caught("broken-starve", &["starvation"], &[]).await;
    assert!(
        report.classes[5]
            .by_lock
            .keys()
            .all(|l| testsuite::lockcheck::broken::NEVER_GRANTED.contains(&l.as_str())),
        "{}",
        report.table()
    );
}

async fn memory_has_no_violations_and_kept_histories_check_again() {
    let _serial = SERIAL.lock().await;
    let seed = fastrand::u64(..10_000_000);
    let mut opts = in_process(seed);
    opts.keep = true;
    let outcome = run_label("memory", &opts).await.expect("the run works");
    let report = &outcome.report;
    println!("{}\n{}", report.table(), report.summary_line());
    let dir = outcome.kept.expect("a kept run has its directory");
    let again = check_dir("memory", &dir, &rules_for("memory"));
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        again.expect("the kept histories read").summary_line(),
        report.summary_line()
    );
    summary_matches(report);
    assert!(report.totals.grants > 0 && report.totals.writes_accepted > 0);
    assert_eq!(report.violations(), 0, "seed {seed}:\n{}", report.table());
}

/// Runs the `lockcheck` binary once (3 processes), bounded, and says what is wrong
/// with the run, if anything: it must exit 0 with a summary of `label`, grants,
/// injected faults and no violation.
/// Whether `label` under `nemesis` is a deployment dlock documents as unsafe: Redis
/// Sentinel without replica acknowledgement loses the writes its promoted replica
/// had not received (and clients may write to the old master until it is demoted),
/// so a failover can grant a held lock again; with `replica_ack(1)` of two replicas
/// a *forced* failover still can (the acknowledging replica need not be the one
/// promoted, and the old master takes writes until it is demoted: SAFETY.md, "2
/// overlaps in 10 failovers"). Those runs are measured (SAFETY.md), not judged: they
/// must still run, grant and inject the fault.
fn unsafe_by_design(label: &str, nemesis: &str) -> bool {
    match label {
        "redis-sentinel" | "redis-sentinel-tls" => matches!(nemesis, "failover" | "restart"),
        "redis-sentinel-ack" => nemesis == "failover",
        _ => false,
    }
}

async fn bounded_run(label: &str, seconds: u64, nemesis: &str, seed: u64) -> Option<String> {
    // The run ends by its own bounds (each of which it reports); this one, past all
    // of them, only catches a hung binary.
    let server_faults = Nemesis::ALL
        .iter()
        .find(|k| k.name() == nemesis)
        .is_some_and(|k| SERVER_SIDE.iter().any(|(s, _)| s == k));
    let limit = run_bound(
        &rules_for(label),
        Duration::from_secs(seconds),
        server_faults,
    ) + HARNESS_SLACK;
    let started = Instant::now();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_lockcheck"))
        .args(["--backend", label, "--seconds", &seconds.to_string()])
        .args(["--processes", "3", "--nemesis", nemesis])
        .args(["--seed", &seed.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start lockcheck");
    // Both pipes are drained while it runs, so that what it said is there to show
    // even if it has to be killed.
    let drain = |pipe: Option<Box<dyn tokio::io::AsyncRead + Unpin + Send>>| {
        tokio::spawn(async move {
            let mut text = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = tokio::io::AsyncReadExt::read_to_end(&mut pipe, &mut text).await;
            }
            text
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let status = tokio::time::timeout(limit, child.wait()).await;
    if status.is_err() {
        let _ = child.kill().await;
    }
    let output = std::process::Output {
        status: match status {
            Ok(status) => status.expect("wait for lockcheck"),
            Err(_) => child.wait().await.expect("wait for the killed lockcheck"),
        },
        stdout: stdout.await.unwrap_or_default(),
        stderr: stderr.await.unwrap_or_default(),
    };
    if started.elapsed() >= limit {
        return Some(format!(
            "{label} {nemesis} (seed {seed}): ran over {limit:?}, past its own bounds; it said:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let out = String::from_utf8_lossy(&output.stdout);
    let err = String::from_utf8_lossy(&output.stderr);
    let last = out.lines().last().unwrap_or("");
    println!(
        "{label} {nemesis} ({:.1} s): {last}",
        started.elapsed().as_secs_f64()
    );
    // `note: faults injected: stop 3, …`: the kind asked for, injected at least once.
    let injected = out
        .lines()
        .find_map(|l| l.strip_prefix("note: faults injected: "))
        .and_then(|counts| {
            counts
                .split(", ")
                .find_map(|c| c.strip_prefix(nemesis)?.trim().parse::<u32>().ok())
        })
        .unwrap_or(0);
    let problem = match parse_summary(last) {
        // Exit 1: violations found (judged below); anything else failed the run.
        _ if !(output.status.success()
            || (output.status.code() == Some(1) && unsafe_by_design(label, nemesis))) =>
        {
            format!("exited with {}", output.status)
        }
        None => "no summary line".to_owned(),
        Some(s) if s.label != label => format!("summary of {}", s.label),
        Some(s) if s.grants == 0 => "no grant".to_owned(),
        // Elections and semaphores run under every nemesis too, not just locks.
        Some(s) if s.terms == 0 => "no term of the election".to_owned(),
        Some(s) if s.permits == 0 && has_semaphores(label).await => {
            "no permit of the semaphore".to_owned()
        }
        Some(s) if s.faults == 0 || injected == 0 => {
            format!("the {nemesis} nemesis injected nothing")
        }
        Some(s) if s.violations > 0 && !unsafe_by_design(label, nemesis) => "violations".to_owned(),
        Some(_) => return None,
    };
    // Said on its own line too: a CI log that keeps only the head and the tail of
    // the output still shows which run failed and why.
    println!("FAILED: {label} {nemesis} (seed {seed}): {problem}");
    Some(format!(
        "{label} {nemesis} (seed {seed}): {problem}\n{out}{err}"
    ))
}

/// A process's start, the checker's own work, and scheduling on a loaded machine,
/// past the run's own bounds ([`run_bound`]).
const HARNESS_SLACK: Duration = Duration::from_secs(30);

/// Whether `label`'s backend has semaphores (Redlock refuses them). Asked right
/// after a run, whose workers' sessions the server may still be closing: a server
/// out of connections (a retryable error) is asked again, for at most 10 s (seen
/// in CI on postgres-session after the proxy run: "the database dropped the
/// statement … op=connect", the run itself clean).
async fn has_semaphores(label: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let opened = match testsuite::backends::open(label).await {
            Ok(backend) => backend.client().await,
            Err(e) => Err(e),
        };
        match opened {
            Ok(client) => return client.capabilities().semaphore,
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("{label}: {e}"),
        }
    }
}

/// The `stop` nemesis's bounded pass (6 s, 3 processes) on each server backend.
const BOUNDED: (Nemesis, u64) = (Nemesis::Stop, 6);

/// The worker-side nemeses, with each run's length in seconds: `kill` (SIGKILLed
/// workers — holders, leaders, permit holders and queued waiters that die without a
/// word — replaced by new processes) and `proxy` (a worker's connections delayed,
/// black-holed past its leases, reset).
const WORKER_SIDE: [(Nemesis, u64); 2] = [(Nemesis::Kill, 8), (Nemesis::Proxy, 8)];

/// The server-side nemeses, with each run's length in seconds (they restart, fail
/// over or expire the shared test servers, so scripts/test runs them apart, at most
/// one per server at a time): `restart` (12 s: a Redis server stays down past the
/// longest lease), `promote` (8 s), `expire` (15 s: past the 10 s session timeout),
/// `failover` (10 s), `freeze` (10 s).
const SERVER_SIDE: [(Nemesis, u64); 5] = [
    (Nemesis::Restart, 12),
    (Nemesis::Promote, 8),
    (Nemesis::Expire, 15),
    (Nemesis::Failover, 10),
    (Nemesis::Freeze, 10),
];

/// Every server-side run of every label is in exactly one test group of the
/// `servers` phase (`.config/nextest.toml`), one that runs one test at a time, the
/// same for every label that talks to the same server (an address in common): two
/// runs disturbing one server at once spoil each other's checks (a `zk-tls`
/// restart, run beside a `zk-tls` expire run, revived the sessions whose ephemeral
/// nodes that run's leak check waited to see gone).
fn every_server_run_has_a_group_of_its_own_server() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../.config/nextest.toml");
    let config = std::fs::read_to_string(path).unwrap();
    // Each `servers` override: the regexes of its `test(/…/)` filters, its group.
    let mut overrides: Vec<(Vec<regex::Regex>, String)> = Vec::new();
    let mut limits: Vec<(String, String)> = Vec::new();
    let mut section = String::new();
    for line in config.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.to_owned();
            if section == "[[profile.servers.overrides]]" {
                overrides.push((Vec::new(), String::new()));
            }
            continue;
        }
        let Some((key, value)) = line.split_once(" = ") else {
            continue;
        };
        match (section.as_str(), key) {
            ("[[profile.servers.overrides]]", "filter") => {
                let current = &mut overrides.last_mut().unwrap().0;
                for part in value.split("test(/").skip(1) {
                    let pattern = part.split("/)").next().unwrap();
                    current.push(regex::Regex::new(pattern).unwrap());
                }
            }
            ("[[profile.servers.overrides]]", "test-group") => {
                overrides.last_mut().unwrap().1 = value.trim_matches('"').to_owned();
            }
            ("[test-groups]", group) => limits.push((group.to_owned(), value.to_owned())),
            _ => {}
        }
    }
    let mut checked = 0;
    // Each label with server-side runs: its group, and the addresses it talks to.
    let mut label_groups: Vec<(&str, String, Vec<String>)> = Vec::new();
    for label in testsuite::backends::KNOWN {
        for (kind, _) in SERVER_SIDE {
            if not_applicable(kind, label).is_some() {
                continue;
            }
            let trial = format!("server_nemesis::{label}::{}", kind.name());
            let groups: Vec<&str> = overrides
                .iter()
                .filter(|(patterns, _)| patterns.iter().any(|p| p.is_match(&trial)))
                .map(|(_, group)| group.as_str())
                .collect();
            assert_eq!(
                groups.len(),
                1,
                "{trial} is in the groups {groups:?}, not one"
            );
            let limit = limits.iter().find(|(g, _)| g == groups[0]);
            assert_eq!(
                limit.map(|(_, l)| l.as_str()),
                Some("{ max-threads = 1 }"),
                "{trial}: group {} must run one test at a time",
                groups[0]
            );
            match label_groups.iter().find(|(l, _, _)| l == label) {
                Some((_, group, _)) => {
                    assert_eq!(
                        group, groups[0],
                        "{label}'s server-side runs are in two groups"
                    )
                }
                None => {
                    let url = testsuite::backends::server_url(label).unwrap().to_string();
                    label_groups.push((label, groups[0].to_owned(), addresses(&url)));
                }
            }
            checked += 1;
        }
    }
    assert!(checked > 20, "only {checked} server-side runs found");
    // Labels that talk to one server (an address in common) disturb each other's
    // runs: one group.
    for (i, (a, group_a, addrs_a)) in label_groups.iter().enumerate() {
        for (b, group_b, addrs_b) in &label_groups[i + 1..] {
            if addrs_a.iter().any(|x| addrs_b.contains(x)) {
                assert_eq!(
                    group_a, group_b,
                    "{a} and {b} share a server ({addrs_a:?} / {addrs_b:?}) but not a group"
                );
            }
        }
    }
}

/// The `host:port`s a test URL names (after its scheme and credentials, before its
/// path or query).
fn addresses(url: &str) -> Vec<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let hosts = rest.split(['/', '?']).next().unwrap_or("");
    let hosts = hosts.rsplit_once('@').map_or(hosts, |(_, h)| h);
    hosts.split(',').map(str::to_owned).collect()
}

/// One bounded run of the `lockcheck` binary (3 processes) of `nemesis` on `label`,
/// with a seed of its own: it must inject its fault, grant locks, terms and
/// permits, and find no violation. The runs of one process take turns (they share
/// two cores and, for the server-side ones, the servers).
async fn live_run(label: String, nemesis: Nemesis, seconds: u64) {
    let _serial = SERIAL.lock().await;
    let seed = fastrand::u64(..10_000_000);
    if let Some(failure) = bounded_run(&label, seconds, nemesis.name(), seed).await {
        panic!("{failure}");
    }
}

/// `scripts/server-fault restart mysql` right after many writes: MariaDB closes its
/// port at once but writes its buffer pool out for a second or more before it exits;
/// a start before then finds the old process still running and starts nothing
/// (seen in CI: "MariaDB did not come up within 60s", and every MariaDB run after it
/// failed). The restart must come back serving, whatever the down time.
async fn a_mysql_restart_after_many_writes_serves_again() {
    let _serial = SERIAL.lock().await;
    let sql = |statement: &str| {
        let out = std::process::Command::new("mariadb")
            .args([
                "-h",
                "127.0.0.1",
                "-P",
                "3306",
                "-uroot",
                "test",
                "-e",
                statement,
            ])
            .output()
            .expect("run the mariadb client");
        assert!(
            out.status.success(),
            "{statement}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    sql("DROP TABLE IF EXISTS dlock_restart_probe");
    sql("CREATE TABLE dlock_restart_probe (id INT AUTO_INCREMENT PRIMARY KEY, pad CHAR(200))");
    sql("INSERT INTO dlock_restart_probe (pad) SELECT REPEAT('x', 200) FROM seq_1_to_300000");
    let restarted = testsuite::lockcheck::servers::server_fault(&[
        "restart".into(),
        "mysql".into(),
        "50".into(),
    ])
    .await;
    if restarted.is_err() {
        // Leave MariaDB serving for the runs after this one.
        let services = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/lib/services.sh");
        let _ = std::process::Command::new("bash")
            .args(["-c", &format!("source {services} && ensure_mysql")])
            .status();
    }
    restarted.expect("restart MariaDB 50 ms after many writes");
    sql("DROP TABLE dlock_restart_probe");
}

/// The trials of this binary: the rules on hand-made histories, the self-tests, and
/// one live run per (server backend selected, nemesis that applies to it), named
/// `bounded_run::LABEL::stop`, `worker_nemesis::LABEL::KIND` and
/// `server_nemesis::LABEL::KIND`. The in-process labels are the runs above; a
/// nemesis that does not apply to a backend (`servers::not_applicable` says why)
/// has no trial. NATS, a backend built as a third party would build one, runs its
/// worker-side nemeses from its own test (`dlock-nats/tests/lockcheck.rs`, the
/// kit's entry); only its server restart, which needs this repository's scripts,
/// runs here.
fn main() -> std::process::ExitCode {
    let args = libtest_mimic::Arguments::from_args();
    let mut trials = testsuite::trials![
        sync overlap_is_a_grant_within_the_holders_valid_lease,
        sync one_owners_holds_do_not_conflict,
        sync permits_in_use_never_exceed_the_total,
        sync stale_writes_are_writes_after_a_greater_token_was_granted,
        sync an_outage_ends_session_holds_without_notice,
        sync a_grant_answered_in_an_outage_is_not_ordered_where_outages_end_holds,
        sync token_order_checks_duplicates_always_and_order_unless_the_ok_came_late,
        sync late_loss_is_a_signal_after_the_lease_could_end,
        sync leaks_are_reported,
        sync starvation_needs_a_long_free_stretch_within_the_wait,
        sync fair_order_is_checked_among_waiters_of_one_hold,
        sync every_server_run_has_a_group_of_its_own_server,
        tokio the_broken_backends_are_caught,
        tokio memory_has_no_violations_and_kept_histories_check_again,
    ];
    for label in testsuite::runner::selected() {
        if testsuite::lockcheck::broken::in_process(&label) {
            continue;
        }
        let runs = std::iter::once(("bounded_run", BOUNDED))
            .chain(WORKER_SIDE.map(|kind| ("worker_nemesis", kind)))
            .chain(SERVER_SIDE.map(|kind| ("server_nemesis", kind)));
        for (group, (kind, seconds)) in runs {
            if not_applicable(kind, &label).is_some() || (label == "nats" && !kind.server_side()) {
                continue;
            }
            let l = label.clone();
            trials.push(testsuite::runner::tokio_trial(
                format!("{group}::{label}::{}", kind.name()),
                move || live_run(l, kind, seconds),
            ));
        }
    }
    if testsuite::runner::selected().iter().any(|l| l == "mysql") {
        trials.push(testsuite::runner::tokio_trial(
            "server_nemesis::mysql::restart_after_many_writes",
            a_mysql_restart_after_many_writes_serves_again,
        ));
    }
    libtest_mimic::run(&args, trials).exit_code()
}
