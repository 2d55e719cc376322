//! What a history says, read once: the holds (each grant with its reentries,
//! renewals, loss, releases and register visits, and the interval it is judged
//! by), the attempts and their answers, and what each process went through.

use std::collections::HashMap;

use crate::proxy::Fault;

use super::super::history::{Event, Kind, Reason, RegOp, Why, COORDINATOR};
use super::super::workload::ELECTION_NAME;
use super::{merge_windows, Hold, Invoke, Op, Outcome, ProcRec, Rules, Totals};

/// A history's facts, for the rules to judge.
pub(super) struct Facts<'a> {
    /// The first event's time (times in examples are shown from it).
    pub(super) t0: u64,
    /// Each process's pauses, faults, stalls, kill and end.
    pub(super) procs: HashMap<u32, ProcRec>,
    /// What a process with no record went through: nothing.
    empty: ProcRec,
    /// Each attempt's invoke, by (process, attempt).
    pub(super) invokes: HashMap<(u32, u64), Invoke<'a>>,
    /// Each attempt's answer: its time, and `None` granted, or why not.
    pub(super) results: HashMap<(u32, u64), (u64, Option<&'a Why>)>,
    /// Every hold, its interval and proofs known.
    pub(super) holds: Vec<Hold<'a>>,
    /// The holds of each lock, by ok time.
    pub(super) by_lock: HashMap<&'a str, Vec<usize>>,
    /// The locks, in name order.
    pub(super) locks: Vec<&'a str>,
    /// The register's accepted writes: time, lock, hold.
    pub(super) writes: Vec<(u64, &'a str, usize)>,
    /// The leak check's findings: lock and state left.
    pub(super) leaks: Vec<(&'a str, &'a str)>,
    /// Each `ok` answer's attempt and hold (a reentry's too).
    pub(super) ok_of_attempt: Vec<((u32, u64), usize)>,
    /// Server-side fault windows (restart, promotion): they fault every process.
    pub(super) outages: Vec<(u64, u64)>,
    /// The run's counts.
    pub(super) totals: Totals,
}

impl<'a> Facts<'a> {
    /// Reads `events` (in any order).
    pub(super) fn gather(events: &'a [Event], rules: &Rules) -> Self {
        let mut ev: Vec<&Event> = events.iter().collect();
        ev.sort_by_key(|e| e.t);
        let t0 = ev.first().map_or(0, |e| e.t);
        let mut g = Gathering::default();
        for e in ev {
            g.record(e, rules);
        }
        g.finish(t0, rules)
    }

    /// What process `p` went through.
    pub(super) fn proc_of(&self, p: u32) -> &ProcRec {
        self.procs.get(&p).unwrap_or(&self.empty)
    }

    /// A's hold ended with its session in an outage that began by `after` (a grant
    /// or a write then), and A was told within half the session of the server's
    /// return: no margin is possible (`Rules::outage_ends_holds`).
    pub(super) fn ended_by_outage(
        &self,
        rules: &Rules,
        a: &Hold<'_>,
        after: u64,
        told_by: u64,
    ) -> bool {
        let notice = rules.session_ns.unwrap_or(0) / 2;
        let resets = self.procs.get(&a.proc_).map_or(&[][..], |r| &r.resets[..]);
        rules.outage_ends_holds
            && self
                .outages
                .iter()
                .copied()
                .chain(resets.iter().map(|&r| (r, r)))
                .any(|(d, u)| a.ok <= u && after >= d && told_by <= u.saturating_add(notice))
    }
}

/// The facts as events are read, in time order.
#[derive(Default)]
struct Gathering<'a> {
    procs: HashMap<u32, ProcRec>,
    invokes: HashMap<(u32, u64), Invoke<'a>>,
    results: HashMap<(u32, u64), (u64, Option<&'a Why>)>,
    holds: Vec<Hold<'a>>,
    hold_of: HashMap<&'a str, usize>,
    /// The holds of a process, lock and token, in grant order (a token is one
    /// grant's on every backend; a broken one may repeat it).
    grant_of: HashMap<(u32, &'a str, u64), Vec<usize>>,
    renewals: Vec<(u32, &'a str, u64, u64)>,
    losses: Vec<(u32, &'a str, u64, u64, Reason)>,
    writes: Vec<(u64, &'a str, usize)>,
    leaks: Vec<(&'a str, &'a str)>,
    totals: Totals,
    ok_of_attempt: Vec<((u32, u64), usize)>,
    outages: Vec<(u64, u64)>,
    outage_open: Option<u64>,
}

impl<'a> Gathering<'a> {
    fn record(&mut self, e: &'a Event, rules: &Rules) {
        let p = e.proc_;
        let worker_event = !matches!(
            e.kind,
            Kind::Stop
                | Kind::Cont
                | Kind::Kill
                | Kind::Down { .. }
                | Kind::Up
                | Kind::Reg { .. }
                | Kind::Leak { .. }
        );
        if worker_event && p != COORDINATOR {
            let rec = self.procs.entry(p).or_default();
            rec.last = rec.last.max(e.t);
        }
        match &e.kind {
            Kind::Start => {}
            Kind::Exit => self.procs.entry(p).or_default().exit = Some(e.t),
            Kind::Invoke {
                att,
                lock,
                mode,
                fair,
                op,
                cancel,
                wait_ms,
                ..
            } => {
                self.totals.ops += 1;
                self.invokes.insert(
                    (p, *att),
                    Invoke {
                        t: e.t,
                        lock,
                        mode: *mode,
                        fair: *fair,
                        op: *op,
                        cancel: *cancel,
                        wait_ns: wait_ms.saturating_mul(1_000_000),
                    },
                );
            }
            Kind::Ok { .. } => self.ok(e, rules),
            Kind::Fail { att, why, .. } => {
                match why {
                    Why::Cancel => self.totals.cancels += 1,
                    Why::Error(_) | Why::Hung => self.totals.errors += 1,
                    Why::None | Why::Timeout => {}
                }
                self.results.insert((p, *att), (e.t, Some(why)));
            }
            Kind::Lost {
                lock,
                token,
                reason,
            } => self.losses.push((p, lock, *token, e.t, *reason)),
            Kind::Renewed { lock, token } => self.renewals.push((p, lock, *token, e.t)),
            Kind::Release { hold, .. } => {
                self.totals.releases += 1;
                if let Some(&i) = self.hold_of.get(hold.as_str()) {
                    let h = &mut self.holds[i];
                    h.releases += 1;
                    h.last_release = Some(h.last_release.map_or(e.t, |r| r.max(e.t)));
                }
            }
            Kind::Released { hold, outcome, .. } => {
                if let Some(&i) = self.hold_of.get(hold.as_str()) {
                    if *outcome == Outcome::Ok {
                        let h = &mut self.holds[i];
                        h.releases_ok += 1;
                        h.last_release_ok = Some(h.last_release_ok.map_or(e.t, |r| r.max(e.t)));
                    }
                }
            }
            Kind::Fault { fault } => self.fault(p, e.t, *fault),
            Kind::Stop => {
                self.totals.faults += 1;
                self.procs.entry(p).or_default().stop_open = Some(e.t);
            }
            Kind::Cont => {
                let rec = self.procs.entry(p).or_default();
                let s = rec.stop_open.take().unwrap_or(e.t);
                rec.stops.push((s, e.t));
            }
            Kind::Kill => {
                self.totals.faults += 1;
                self.procs.entry(p).or_default().kill = Some(e.t);
            }
            Kind::Stall { from } => {
                self.totals.stalls += 1;
                let ms = e.t.saturating_sub(*from) as f64 / 1e6;
                self.totals.longest_stall_ms = self.totals.longest_stall_ms.max(ms);
                self.procs.entry(p).or_default().stalls.push((*from, e.t));
            }
            Kind::Down { .. } => {
                self.totals.faults += 1;
                self.outage_open = self.outage_open.or(Some(e.t));
            }
            Kind::Up => {
                if let Some(s) = self.outage_open.take() {
                    self.outages.push((s, e.t));
                }
            }
            Kind::Reg {
                op, hold, accepted, ..
            } => self.register(e.t, *op, hold, *accepted),
            Kind::Leak { lock, state } => self.leaks.push((lock.as_str(), state.as_str())),
        }
    }

    /// An `ok`: a reentry of a hold seen before, or a grant — a new hold.
    fn ok(&mut self, e: &'a Event, rules: &Rules) {
        let Kind::Ok {
            att,
            lock,
            mode,
            token,
            hold,
            owner,
            lease_ms,
            sent,
            lost,
            ..
        } = &e.kind
        else {
            return;
        };
        let p = e.proc_;
        self.results.insert((p, *att), (e.t, None));
        if let Some(&i) = self.hold_of.get(hold.as_str()) {
            self.holds[i].guards += 1;
            self.totals.reentries += 1;
            self.ok_of_attempt.push(((p, *att), i));
            return;
        }
        self.totals.grants += 1;
        self.totals.terms += usize::from(lock == ELECTION_NAME);
        self.totals.permit_grants += usize::from(mode.permits().is_some());
        let i = self.holds.len();
        self.hold_of.insert(hold, i);
        self.grant_of.entry((p, lock, *token)).or_default().push(i);
        self.holds.push(Hold {
            key: hold,
            owner,
            lock,
            mode: *mode,
            token: *token,
            proc_: p,
            att: *att,
            ok: e.t,
            sent: (*sent).min(e.t),
            life: rules
                .session_ns
                .unwrap_or_else(|| lease_ms.saturating_mul(1_000_000)),
            proofs: Vec::new(),
            guards: 1,
            releases: 0,
            releases_ok: 0,
            last_release: None,
            last_release_ok: None,
            lost: None,
            lost_at_ok: *lost,
            enter: None,
            exit: None,
            end: u64::MAX,
            ok_unreliable: false,
            pause_from_ok: u64::MAX,
        });
        self.ok_of_attempt.push(((p, *att), i));
    }

    /// A proxy fault of process `p` at `t` (`Pass` ends its window).
    fn fault(&mut self, p: u32, t: u64, fault: Fault) {
        let rec = self.procs.entry(p).or_default();
        if fault == Fault::Reset {
            rec.resets.push(t);
        }
        if fault == Fault::Pass {
            if let Some(s) = rec.fault_open.take() {
                rec.faults.push((s, t));
            }
        } else if rec.fault_open.is_none() {
            // One fault per window (a black hole ends with a reset).
            self.totals.faults += 1;
            rec.fault_open = Some(t);
        }
    }

    /// The register's log: a hold entering, leaving, writing.
    fn register(&mut self, t: u64, op: RegOp, hold: &str, accepted: bool) {
        let i = self.hold_of.get(hold).copied();
        match op {
            RegOp::Enter => {
                if let Some(h) = i.map(|i| &mut self.holds[i]) {
                    h.enter = Some(h.enter.map_or(t, |x| x.min(t)));
                }
            }
            RegOp::Exit => {
                if let Some(h) = i.map(|i| &mut self.holds[i]) {
                    h.exit = Some(h.exit.map_or(t, |x| x.max(t)));
                }
            }
            RegOp::Write if accepted => {
                self.totals.writes_accepted += 1;
                if let Some(i) = i {
                    self.writes.push((t, self.holds[i].lock, i));
                }
            }
            RegOp::Write => self.totals.writes_rejected += 1,
            RegOp::Read => {}
        }
    }

    /// Closes the windows left open, gives each renewal and loss its hold, and
    /// derives each hold's interval.
    fn finish(mut self, t0: u64, rules: &Rules) -> Facts<'a> {
        if let Some(s) = self.outage_open.take() {
            self.outages.push((s, u64::MAX));
        }
        for rec in self.procs.values_mut() {
            if let Some(s) = rec.stop_open.take() {
                rec.stops.push((s, u64::MAX));
            }
            if let Some(s) = rec.fault_open.take() {
                rec.faults.push((s, u64::MAX));
            }
            // A server-side fault faults every process's connections.
            rec.faults = merge_windows(rec.faults.iter().chain(&self.outages).copied());
        }
        self.assign_renewals_and_losses();
        self.totals.processes = self.procs.keys().filter(|p| **p != COORDINATOR).count();
        let empty = ProcRec::default();
        for h in &mut self.holds {
            let rec = self.procs.get(&h.proc_).unwrap_or(&empty);
            let invoke = self.invokes.get(&(h.proc_, h.att));
            if derive_interval(h, rec, invoke) {
                self.totals.losses += 1;
            }
            // Where an outage ends every hold, a grant asked for before an outage
            // and answered in it may have been made (and ended, its session gone
            // with the server) before grants answered earlier: its `ok` time says
            // little about when it was granted.
            let invoked = invoke.map_or(h.ok, |i| i.t);
            if rules.outage_ends_holds
                && self
                    .outages
                    .iter()
                    .any(|&(down, up)| invoked <= up && h.ok >= down)
            {
                h.ok_unreliable = true;
            }
        }
        let holds = self.holds;
        let mut by_lock: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, h) in holds.iter().enumerate() {
            by_lock.entry(h.lock).or_default().push(i);
        }
        for list in by_lock.values_mut() {
            list.sort_by(|&a, &b| (holds[a].ok, holds[a].key).cmp(&(holds[b].ok, holds[b].key)));
        }
        let mut locks: Vec<&str> = by_lock.keys().copied().collect();
        locks.sort_unstable();
        Facts {
            t0,
            procs: self.procs,
            empty,
            invokes: self.invokes,
            results: self.results,
            holds,
            by_lock,
            locks,
            writes: self.writes,
            leaks: self.leaks,
            ok_of_attempt: self.ok_of_attempt,
            outages: self.outages,
            totals: self.totals,
        }
    }

    /// A renewal or a loss belongs to the last hold of its token granted (sent)
    /// before it.
    fn assign_renewals_and_losses(&mut self) {
        let (holds, grant_of) = (&self.holds, &self.grant_of);
        let hold_at = |p: u32, lock: &str, token: u64, t: u64| -> Option<usize> {
            let list = grant_of.get(&(p, lock, token))?;
            let before = list.partition_point(|&i| holds[i].sent <= t);
            list.get(before.checked_sub(1)?).copied()
        };
        let renewals: Vec<(usize, u64)> = self
            .renewals
            .iter()
            .filter_map(|&(p, lock, token, t)| Some((hold_at(p, lock, token, t)?, t)))
            .collect();
        let losses: Vec<(usize, u64, Reason)> = self
            .losses
            .iter()
            .filter_map(|&(p, lock, token, t, r)| Some((hold_at(p, lock, token, t)?, t, r)))
            .collect();
        for (i, t) in renewals {
            self.holds[i].proofs.push(t);
        }
        for (i, t, reason) in losses {
            let h = &mut self.holds[i];
            if h.lost.is_none_or(|(l, _)| t < l) {
                h.lost = Some((t, reason));
            }
        }
    }
}

/// Derives hold `h`'s end, proofs' order and how far its `ok` can be trusted, its
/// process having gone through `rec`; `true` if it was lost while held.
fn derive_interval(h: &mut Hold<'_>, rec: &ProcRec, invoke: Option<&Invoke<'_>>) -> bool {
    let mut end = h.released_at().unwrap_or(u64::MAX);
    if let Some((l, _)) = h.lost {
        end = end.min(l);
    }
    if let Some(k) = rec.kill {
        end = end.min(k);
    }
    if end == u64::MAX {
        end = rec.end();
    }
    if h.lost_at_ok {
        end = h.ok;
    }
    h.end = end.max(h.ok);
    h.proofs.sort_unstable();
    // A grant whose process was paused between invoke and `ok`, or a member of a
    // multi-lock or an upgradeable read (its `ok` is when the whole returned): its
    // `ok` time says little about when it was granted.
    let invoked = invoke.map_or(h.ok, |i| i.t);
    let multi = invoke.is_some_and(|i| matches!(i.op, Op::Multi | Op::Upgradeable));
    h.ok_unreliable = multi || rec.paused(invoked, h.ok);
    h.pause_from_ok = rec.first_pause_from(h.ok);
    h.lost_while_held().is_some()
}
