//! The checker: a pure function from a run's history (every process's events, the
//! nemesis's actions, the register's log and the leak check's findings) to a report of
//! violations by class.
//!
//! # Terms
//!
//! * A **hold** is one grant and its reentrant acquisitions: all `ok` events with the
//!   same hold key (handle id + the instant its remote acquire was sent). The first
//!   `ok` is the grant, later ones are reentries.
//! * A hold's **interval** is `[ok, end]`, `end` = the earliest of: the release-invoke
//!   of its last guard, the instant its lost signal fired, the SIGKILL of its
//!   process (or the process's end when none of these was recorded). A hold handed
//!   out already lost ends at its `ok`.
//! * Holds **conflict** when they are of the same lock, different holds, and not
//!   both shared.
//! * A process is **paused** during `[a, b]` if a SIGSTOP..SIGCONT window of it
//!   intersects `[a, b]`; **faulted** likewise for its proxy fault windows.
//!
//! # Rules
//!
//! 1. **overlap** — conflicting holds A, B with `A.ok ≤ B.ok < A.end`: B was let in
//!    while A had not released and had not been told of its loss. Excused (counted
//!    apart) if A's process was paused in `[A.ok, B.ok]` (it could not be told), or
//!    B's between B's invoke and `B.ok` (B may be the earlier grant).
//! 2. **stale-write** — the register accepted a write whose token is below one it had
//!    accepted for the lock (its own invariant), or accepted a write from hold A after
//!    accepting one from a later grant B of the same lock (B's token is greater, or
//!    equal with a later `ok`).
//! 3. **token-order** — per lock, by `ok` time: an exclusive grant whose token is not
//!    above every earlier grant's, a shared grant whose token is not above every earlier
//!    exclusive grant's, or two holds with the same token. Grants whose process was
//!    paused between invoke and `ok` are excused (their `ok` time is not their grant
//!    time).
//! 4. **late-loss** — a hold A lost (before it released; not by closing its manager)
//!    at L, and the first conflicting grant B after `A.ok` came at `B.ok < L`: the
//!    store let B in before A was told. The margin `B.ok − L` is reported (min and
//!    median; it includes B's reply time, so it over-states the true margin). Excused
//!    as overlaps are.
//! 5. **leak** — a lock name that still had holder or waiter state after every worker
//!    had exited and the coordinator had waited out the longest lease (recorded by the
//!    coordinator as `leak` events).
//! 6. **starvation** — conservative on purpose. Occupancy of a lock is the union of:
//!    every hold's `[ok, max(last release-invoke, register EXIT) + hidden]`, every
//!    cancelled or failed-with-error acquire's `[invoke, result + hidden]`, and every
//!    acquire of a paused process `[invoke, result + hidden]`, where `hidden` is how long
//!    the store may keep a hold nobody reports (the longest lease; the session timeout
//!    for ZooKeeper). An exclusive acquire that gave up (`none` or `timeout`, not
//!    cancelled) is starved if, within the wait it asked for, the lock was unoccupied
//!    for longer than `starvation_slack` (2 s) without interruption. Waiters whose
//!    process was paused or faulted while waiting are skipped.
//! 7. **fair-order** — conservative as well. For a fair lock: waiters A and B (first
//!    grants, not reentries, not cancellable), both invoked while one hold C held the
//!    lock (`C.ok < invoke < min(C.end, the next grant to another hold)`), A invoked
//!    at least `fair_margin` (250 ms) before B, yet B granted before A. Excused if A's
//!    or B's process was paused or faulted between A's invoke and A's grant.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;

use super::history::{Event, Kind, Mode, RegOp, COORDINATOR};

/// The checker's tunable bounds.
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    /// Starvation: how long a lock may stay unoccupied while a waiter waits (ns).
    pub starvation_slack_ns: u64,
    /// How long the store may keep a hold no history shows (ns).
    pub hidden_hold_ns: u64,
    /// Fair order: how much earlier A must have arrived than B (ns).
    pub fair_margin_ns: u64,
}

impl Default for Rules {
    fn default() -> Self {
        Rules {
            starvation_slack_ns: 2_000_000_000,
            hidden_hold_ns: 3_000_000_000,
            fair_margin_ns: 250_000_000,
        }
    }
}

impl Rules {
    /// The rules for a backend label (ZooKeeper holds live as long as the session).
    pub fn for_label(label: &str) -> Rules {
        let mut rules = Rules::default();
        if label.starts_with("zk") {
            rules.hidden_hold_ns = 12_000_000_000;
        }
        rules
    }
}

/// Violation class names, in report order.
pub const CLASSES: [&str; 7] = [
    "overlap",
    "stale-write",
    "token-order",
    "late-loss",
    "leak",
    "starvation",
    "fair-order",
];

const EXAMPLES: usize = 5;

/// One class's findings.
#[derive(Debug, Clone, Default)]
pub struct ClassResult {
    /// The class (one of [`CLASSES`]).
    pub name: &'static str,
    /// Violations.
    pub count: usize,
    /// Cases the rule excused (paused or faulted processes).
    pub excused: usize,
    /// Violations per lock name.
    pub by_lock: BTreeMap<String, usize>,
    /// The first few violations (at most two per lock), described.
    pub examples: Vec<String>,
}

impl ClassResult {
    fn violation(&mut self, lock: &str, describe: impl FnOnce() -> String) {
        self.count += 1;
        let of_lock = self.by_lock.entry(lock.to_owned()).or_insert(0);
        *of_lock += 1;
        if self.examples.len() < EXAMPLES && *of_lock <= 2 {
            self.examples.push(describe());
        }
    }
}

/// Run totals.
#[derive(Debug, Clone, Default)]
pub struct Totals {
    /// Worker processes seen.
    pub processes: usize,
    /// Acquire invocations.
    pub ops: usize,
    /// Holds granted (first `ok` of each hold).
    pub grants: usize,
    /// Reentrant acquisitions (further `ok`s of a hold).
    pub reentries: usize,
    /// Release invocations.
    pub releases: usize,
    /// Holds lost before they were released (manager close excluded).
    pub losses: usize,
    /// Acquires dropped on purpose.
    pub cancels: usize,
    /// Acquires that failed with an error.
    pub errors: usize,
    /// Register writes accepted.
    pub writes_accepted: usize,
    /// Register writes rejected (stale tokens fenced off).
    pub writes_rejected: usize,
    /// Faults injected (proxy windows, SIGSTOPs, SIGKILLs).
    pub faults: usize,
}

/// The checker's answer.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The backend label.
    pub label: String,
    /// Totals.
    pub totals: Totals,
    /// One entry per class of [`CLASSES`].
    pub classes: Vec<ClassResult>,
    /// Late-loss margins (ms): minimum, median, how many.
    pub margins_ms: Option<(f64, f64, usize)>,
}

impl Report {
    /// Violations of every class.
    pub fn violations(&self) -> usize {
        self.classes.iter().map(|c| c.count).sum()
    }

    /// Violations of one class.
    pub fn count(&self, class: &str) -> usize {
        self.classes
            .iter()
            .find(|c| c.name == class)
            .map_or(0, |c| c.count)
    }

    /// `lockcheck: <label> ops=… grants=… faults=… violations=… (overlap=… …)`.
    pub fn summary_line(&self) -> String {
        let t = &self.totals;
        let by_class: Vec<String> = self
            .classes
            .iter()
            .map(|c| format!("{}={}", c.name, c.count))
            .collect();
        format!(
            "lockcheck: {} ops={} grants={} faults={} violations={} ({})",
            self.label,
            t.ops,
            t.grants,
            t.faults,
            self.violations(),
            by_class.join(" ")
        )
    }

    /// The report as a table, examples included.
    pub fn table(&self) -> String {
        let t = &self.totals;
        let mut out = String::new();
        let _ = writeln!(out, "lockcheck report — backend {}", self.label);
        let _ = writeln!(
            out,
            "  processes {}  ops {}  grants {}  reentries {}  releases {}  losses {}",
            t.processes, t.ops, t.grants, t.reentries, t.releases, t.losses
        );
        let _ = writeln!(
            out,
            "  cancels {}  errors {}  register writes accepted {} rejected {}  faults {}",
            t.cancels, t.errors, t.writes_accepted, t.writes_rejected, t.faults
        );
        match self.margins_ms {
            Some((min, median, n)) => {
                let _ = writeln!(
                    out,
                    "  loss margin (next grant − lost signal): min {min:.1} ms, median {median:.1} ms over {n} losses"
                );
            }
            None => {
                let _ = writeln!(out, "  loss margin: no loss followed by another grant");
            }
        }
        let _ = writeln!(
            out,
            "  {:<12} {:>10} {:>10}",
            "class", "violations", "excused"
        );
        for c in &self.classes {
            let _ = writeln!(out, "  {:<12} {:>10} {:>10}", c.name, c.count, c.excused);
        }
        for c in self.classes.iter().filter(|c| c.count > 0) {
            let by_lock: Vec<String> = c.by_lock.iter().map(|(l, n)| format!("{l}={n}")).collect();
            let _ = writeln!(
                out,
                "  {} by lock: {}; examples:",
                c.name,
                by_lock.join(" ")
            );
            for e in &c.examples {
                let _ = writeln!(out, "    - {e}");
            }
        }
        out
    }
}

#[derive(Debug, Default)]
struct ProcRec {
    stops: Vec<(u64, u64)>,
    stop_open: Option<u64>,
    faults: Vec<(u64, u64)>,
    fault_cmd_open: Option<u64>,
    fault_applied_open: Option<u64>,
    kill: Option<u64>,
    exit: Option<u64>,
    last: u64,
}

impl ProcRec {
    fn paused(&self, a: u64, b: u64) -> bool {
        self.stops.iter().any(|&(s, c)| s <= b && c >= a)
    }
    fn faulted(&self, a: u64, b: u64) -> bool {
        self.faults.iter().any(|&(s, c)| s <= b && c >= a)
    }
    fn end(&self) -> u64 {
        self.kill
            .or(self.exit)
            .unwrap_or(if self.last == 0 { u64::MAX } else { self.last })
    }
}

#[derive(Debug, Clone)]
struct Invoke {
    t: u64,
    lock: String,
    mode: Mode,
    fair: bool,
    op: String,
    cancel: bool,
    wait_ns: u64,
}

#[derive(Debug, Clone)]
struct Hold {
    key: String,
    lock: String,
    mode: Mode,
    token: u64,
    proc_: u32,
    att: u64,
    ok: u64,
    guards: usize,
    releases: usize,
    last_release: Option<u64>,
    lost: Option<(u64, String)>,
    lost_at_ok: bool,
    enter: Option<u64>,
    exit: Option<u64>,
    end: u64,
}

impl Hold {
    fn released_at(&self) -> Option<u64> {
        (self.releases >= self.guards)
            .then_some(self.last_release)
            .flatten()
    }
    /// Lost before it was released, not by a manager close.
    fn lost_while_held(&self) -> Option<u64> {
        let (l, reason) = self.lost.as_ref()?;
        if reason == "manager_closed" {
            return None;
        }
        match self.released_at() {
            Some(r) if r <= *l => None,
            _ => Some(*l),
        }
    }
}

fn at(t: u64, t0: u64) -> String {
    if t == u64::MAX {
        "∞".to_owned()
    } else {
        format!("{:.1}ms", t.saturating_sub(t0) as f64 / 1e6)
    }
}

/// Checks a history. `events` may come in any order.
pub fn check(label: &str, events: &[Event], rules: &Rules) -> Report {
    let mut ev: Vec<&Event> = events.iter().collect();
    ev.sort_by_key(|e| e.t);
    let t0 = ev.first().map_or(0, |e| e.t);

    let mut procs: HashMap<u32, ProcRec> = HashMap::new();
    let mut invokes: HashMap<(u32, u64), Invoke> = HashMap::new();
    let mut results: HashMap<(u32, u64), (u64, String)> = HashMap::new();
    let mut holds: HashMap<String, Hold> = HashMap::new();
    let mut hold_order: Vec<String> = Vec::new();
    let mut regs: Vec<(u64, RegOp, &str, u64, &str, bool)> = Vec::new();
    let mut leaks: Vec<(&str, &str)> = Vec::new();
    let mut totals = Totals::default();
    let mut ok_of_attempt: HashMap<(u32, u64), String> = HashMap::new();

    for e in &ev {
        let p = e.proc_;
        let worker_event = !matches!(
            e.kind,
            Kind::Stop
                | Kind::Cont
                | Kind::Kill
                | Kind::ProxyCmd { .. }
                | Kind::Reg { .. }
                | Kind::Leak { .. }
        );
        if worker_event && p != COORDINATOR {
            let rec = procs.entry(p).or_default();
            rec.last = rec.last.max(e.t);
        }
        match &e.kind {
            Kind::Start => {}
            Kind::Exit => procs.entry(p).or_default().exit = Some(e.t),
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
                totals.ops += 1;
                invokes.insert(
                    (p, *att),
                    Invoke {
                        t: e.t,
                        lock: lock.clone(),
                        mode: *mode,
                        fair: *fair,
                        op: op.clone(),
                        cancel: *cancel,
                        wait_ns: wait_ms.saturating_mul(1_000_000),
                    },
                );
            }
            Kind::Ok {
                att,
                lock,
                mode,
                token,
                hold,
                lost,
                ..
            } => {
                results.insert((p, *att), (e.t, "ok".to_owned()));
                ok_of_attempt.insert((p, *att), hold.clone());
                match holds.get_mut(hold) {
                    Some(h) => {
                        h.guards += 1;
                        totals.reentries += 1;
                    }
                    None => {
                        totals.grants += 1;
                        hold_order.push(hold.clone());
                        holds.insert(
                            hold.clone(),
                            Hold {
                                key: hold.clone(),
                                lock: lock.clone(),
                                mode: *mode,
                                token: *token,
                                proc_: p,
                                att: *att,
                                ok: e.t,
                                guards: 1,
                                releases: 0,
                                last_release: None,
                                lost: None,
                                lost_at_ok: *lost,
                                enter: None,
                                exit: None,
                                end: u64::MAX,
                            },
                        );
                    }
                }
            }
            Kind::Fail { att, why, .. } => {
                if why == "cancel" {
                    totals.cancels += 1;
                } else if why.starts_with("error") {
                    totals.errors += 1;
                }
                results.insert((p, *att), (e.t, why.clone()));
            }
            Kind::Lost { hold, reason, .. } => {
                if let Some(h) = holds.get_mut(hold) {
                    if h.lost.as_ref().is_none_or(|(l, _)| e.t < *l) {
                        h.lost = Some((e.t, reason.clone()));
                    }
                }
            }
            Kind::Write { .. } | Kind::Released { .. } => {}
            Kind::Release { hold, .. } => {
                totals.releases += 1;
                if let Some(h) = holds.get_mut(hold) {
                    h.releases += 1;
                    h.last_release = Some(h.last_release.map_or(e.t, |r| r.max(e.t)));
                }
            }
            Kind::Fault { fault } => {
                let rec = procs.entry(p).or_default();
                if fault == "pass" {
                    if let Some(s) = rec.fault_applied_open.take() {
                        rec.faults.push((s, e.t));
                    }
                } else if rec.fault_applied_open.is_none() {
                    rec.fault_applied_open = Some(e.t);
                }
            }
            Kind::ProxyCmd { fault } => {
                let rec = procs.entry(p).or_default();
                if fault == "pass" {
                    if let Some(s) = rec.fault_cmd_open.take() {
                        rec.faults.push((s, e.t));
                    }
                } else if rec.fault_cmd_open.is_none() {
                    // One fault per window (a black hole ends with a reset).
                    totals.faults += 1;
                    rec.fault_cmd_open = Some(e.t);
                }
            }
            Kind::Stop => {
                totals.faults += 1;
                procs.entry(p).or_default().stop_open = Some(e.t);
            }
            Kind::Cont => {
                let rec = procs.entry(p).or_default();
                let s = rec.stop_open.take().unwrap_or(e.t);
                rec.stops.push((s, e.t));
            }
            Kind::Kill => {
                totals.faults += 1;
                procs.entry(p).or_default().kill = Some(e.t);
            }
            Kind::Reg {
                op,
                lock,
                token,
                hold,
                accepted,
            } => {
                regs.push((e.t, *op, lock.as_str(), *token, hold.as_str(), *accepted));
                if let Some(h) = holds.get_mut(hold.as_str()) {
                    match op {
                        RegOp::Enter => h.enter = Some(h.enter.map_or(e.t, |x| x.min(e.t))),
                        RegOp::Exit => h.exit = Some(h.exit.map_or(e.t, |x| x.max(e.t))),
                        _ => {}
                    }
                }
                if *op == RegOp::Write {
                    if *accepted {
                        totals.writes_accepted += 1;
                    } else {
                        totals.writes_rejected += 1;
                    }
                }
            }
            Kind::Leak { lock, state } => leaks.push((lock.as_str(), state.as_str())),
        }
    }
    for rec in procs.values_mut() {
        if let Some(s) = rec.stop_open.take() {
            rec.stops.push((s, u64::MAX));
        }
        for open in [rec.fault_cmd_open.take(), rec.fault_applied_open.take()]
            .into_iter()
            .flatten()
        {
            rec.faults.push((open, u64::MAX));
        }
    }
    totals.processes = procs.keys().filter(|p| **p != COORDINATOR).count();
    let empty = ProcRec::default();
    let proc_of = |p: u32| procs.get(&p).unwrap_or(&empty);
    // A grant whose process was paused between invoke and `ok`: its `ok` time says
    // little about when it was granted.
    let ok_unreliable = |h: &Hold| {
        let invoked = invokes.get(&(h.proc_, h.att)).map_or(h.ok, |i| i.t);
        proc_of(h.proc_).paused(invoked, h.ok)
    };

    for h in holds.values_mut() {
        let rec = proc_of(h.proc_);
        let mut end = h.released_at().unwrap_or(u64::MAX);
        if let Some((l, _)) = &h.lost {
            end = end.min(*l);
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
        if h.lost_while_held().is_some() {
            totals.losses += 1;
        }
    }

    // Holds per lock, by ok time.
    let mut by_lock: HashMap<&str, Vec<&Hold>> = HashMap::new();
    for key in &hold_order {
        if let Some(h) = holds.get(key) {
            by_lock.entry(h.lock.as_str()).or_default().push(h);
        }
    }
    for list in by_lock.values_mut() {
        list.sort_by_key(|h| (h.ok, h.key.clone()));
    }
    let mut locks: Vec<&str> = by_lock.keys().copied().collect();
    locks.sort_unstable();

    let mut classes: Vec<ClassResult> = CLASSES
        .iter()
        .map(|name| ClassResult {
            name,
            ..ClassResult::default()
        })
        .collect();
    let [overlap, stale, token_order, late, leak, starvation, fair] = &mut classes[..] else {
        unreachable!("seven classes");
    };

    // 1. overlap
    for lock in &locks {
        let mut active: Vec<&Hold> = Vec::new();
        for &b in &by_lock[lock] {
            active.retain(|a| a.end > b.ok);
            for a in &active {
                if a.key == b.key || !a.mode.conflicts(b.mode) {
                    continue;
                }
                if proc_of(a.proc_).paused(a.ok, b.ok) || ok_unreliable(b) {
                    overlap.excused += 1;
                    continue;
                }
                overlap.violation(lock, || {
                    format!(
                        "{lock}: {} (token {}, ok {}, end {}) still held when {} (token {}) was granted at {}",
                        a.key,
                        a.token,
                        at(a.ok, t0),
                        at(a.end, t0),
                        b.key,
                        b.token,
                        at(b.ok, t0)
                    )
                });
            }
            active.push(b);
        }
    }

    // 2. stale writes
    {
        let mut max_accepted: HashMap<&str, u64> = HashMap::new();
        let mut latest: HashMap<&str, (u64, u64, &str)> = HashMap::new();
        for &(t, op, lock, token, hold, accepted) in &regs {
            if op != RegOp::Write || !accepted {
                continue;
            }
            if let Some(&m) = max_accepted.get(lock) {
                if token < m {
                    stale.violation(lock, || {
                        format!("{lock}: register accepted token {token} from {hold} at {} after token {m}", at(t, t0))
                    });
                }
            }
            let m = max_accepted.entry(lock).or_insert(token);
            *m = (*m).max(token);
            let ok = holds.get(hold).map(|h| h.ok);
            if let (Some(ok), Some(&(lt, lok, lhold))) = (ok, latest.get(lock)) {
                let later = lt > token || (lt == token && lok > ok);
                if lhold != hold && later {
                    stale.violation(lock, || {
                        format!(
                            "{lock}: write of {hold} (token {token}, granted {}) accepted at {} after a write of the later grant {lhold} (token {lt}, granted {})",
                            at(ok, t0),
                            at(t, t0),
                            at(lok, t0)
                        )
                    });
                }
            }
            if let Some(ok) = ok {
                let newer = latest
                    .get(lock)
                    .is_none_or(|&(lt, lok, _)| (token, ok) > (lt, lok));
                if newer {
                    latest.insert(lock, (token, ok, hold));
                }
            }
        }
    }

    // 3. token order
    for lock in &locks {
        let mut max_all = 0u64;
        let mut max_exclusive = 0u64;
        let mut seen: HashMap<u64, &str> = HashMap::new();
        for &h in &by_lock[lock] {
            if ok_unreliable(h) {
                token_order.excused += 1;
                continue;
            }
            let floor = match h.mode {
                Mode::Exclusive => max_all,
                Mode::Shared => max_exclusive,
            };
            if let Some(other) = seen.get(&h.token) {
                token_order.violation(lock, || {
                    format!(
                        "{lock}: {} and {other} were both granted token {}",
                        h.key, h.token
                    )
                });
            } else if h.token <= floor {
                token_order.violation(lock, || {
                    format!(
                        "{lock}: {} granted token {} at {}, not above the earlier token {floor}",
                        h.key,
                        h.token,
                        at(h.ok, t0)
                    )
                });
            }
            seen.insert(h.token, h.key.as_str());
            max_all = max_all.max(h.token);
            if h.mode == Mode::Exclusive {
                max_exclusive = max_exclusive.max(h.token);
            }
        }
    }

    // 4. late loss
    let mut margins: Vec<f64> = Vec::new();
    for lock in &locks {
        let list = &by_lock[lock];
        for (i, a) in list.iter().enumerate() {
            let Some(l) = a.lost_while_held() else {
                continue;
            };
            let next = list[i + 1..]
                .iter()
                .find(|b| b.key != a.key && b.ok > a.ok && a.mode.conflicts(b.mode));
            let Some(b) = next else { continue };
            let margin = b.ok as f64 / 1e6 - l as f64 / 1e6;
            if b.ok < l {
                if proc_of(a.proc_).paused(a.ok, b.ok) || ok_unreliable(b) {
                    late.excused += 1;
                    continue;
                }
                late.violation(lock, || {
                    format!(
                        "{lock}: {} (token {}) was told of its loss ({}) at {}, {:.1} ms after {} (token {}) was granted",
                        a.key,
                        a.token,
                        a.lost.as_ref().map_or("?", |(_, r)| r.as_str()),
                        at(l, t0),
                        -margin,
                        b.key,
                        b.token
                    )
                });
            }
            margins.push(margin);
        }
    }
    margins.sort_by(f64::total_cmp);
    let margins_ms =
        (!margins.is_empty()).then(|| (margins[0], margins[margins.len() / 2], margins.len()));

    // 5. leaks
    for (lock, state) in &leaks {
        leak.violation(lock, || format!("{lock}: {state}"));
    }

    // 6. starvation
    {
        let hidden = rules.hidden_hold_ns;
        let mut occupied: HashMap<&str, Vec<(u64, u64)>> = HashMap::new();
        for h in holds.values() {
            let rec = proc_of(h.proc_);
            let released = h.released_at().unwrap_or_else(|| rec.end());
            let exited = h.exit.unwrap_or_else(|| rec.end());
            let end = released.max(exited).max(h.end).saturating_add(hidden);
            occupied
                .entry(h.lock.as_str())
                .or_default()
                .push((h.ok.min(h.enter.unwrap_or(h.ok)), end));
        }
        for (key, inv) in &invokes {
            let rec = proc_of(key.0);
            let result = results.get(key);
            let until = result.map_or_else(|| rec.end(), |r| r.0);
            let hidden_grant = match result {
                Some((_, why)) => why == "cancel" || why.starts_with("error"),
                None => true,
            };
            if hidden_grant || rec.paused(inv.t, until) {
                occupied
                    .entry(inv.lock.as_str())
                    .or_default()
                    .push((inv.t, until.saturating_add(hidden)));
            }
        }
        let mut free: HashMap<&str, Vec<(u64, u64)>> = HashMap::new();
        for (lock, mut spans) in occupied {
            spans.sort_unstable();
            let mut gaps = Vec::new();
            let mut cursor = t0;
            for (s, e) in spans {
                if s > cursor {
                    gaps.push((cursor, s));
                }
                cursor = cursor.max(e);
            }
            gaps.push((cursor, u64::MAX));
            free.insert(lock, gaps);
        }
        let mut waits: Vec<(&(u32, u64), &Invoke)> = invokes.iter().collect();
        waits.sort_by_key(|(k, i)| (i.t, **k));
        for (key, inv) in waits {
            if inv.mode != Mode::Exclusive || inv.cancel || inv.op == "reenter" {
                continue;
            }
            let Some((done, why)) = results.get(key) else {
                continue;
            };
            if why != "none" && why != "timeout" {
                continue;
            }
            let rec = proc_of(key.0);
            if rec.paused(inv.t, *done) || rec.faulted(inv.t, *done) {
                starvation.excused += 1;
                continue;
            }
            // Only the wait it asked for counts (a slow answer is not starvation).
            let until = (*done).min(inv.t.saturating_add(inv.wait_ns));
            let gaps = free.get(inv.lock.as_str());
            let longest = gaps
                .into_iter()
                .flatten()
                .map(|&(s, e)| e.min(until).saturating_sub(s.max(inv.t)))
                .max()
                .unwrap_or(0);
            if longest > rules.starvation_slack_ns {
                starvation.violation(&inv.lock, || {
                    format!(
                        "{}: p{} attempt {} waited {} – {} ({why}) while the lock was free for {:.1} ms",
                        inv.lock,
                        key.0,
                        key.1,
                        at(inv.t, t0),
                        at(*done, t0),
                        longest as f64 / 1e6
                    )
                });
            }
        }
    }

    // 7. fair order
    {
        struct Wait<'a> {
            inv: u64,
            ok: u64,
            proc_: u32,
            key: &'a str,
        }
        let mut fair_waits: HashMap<&str, Vec<Wait<'_>>> = HashMap::new();
        for (key, hold) in &ok_of_attempt {
            let (Some(inv), Some(h)) = (invokes.get(key), holds.get(hold)) else {
                continue;
            };
            // A grant, not a reentry, of a fair lock, by an attempt not cut short.
            if !inv.fair || inv.cancel || inv.op == "reenter" || h.att != key.1 || h.proc_ != key.0
            {
                continue;
            }
            fair_waits.entry(h.lock.as_str()).or_default().push(Wait {
                inv: inv.t,
                ok: h.ok,
                proc_: key.0,
                key: h.key.as_str(),
            });
        }
        let mut seen: HashSet<(&str, &str)> = HashSet::new();
        let mut fair_locks: Vec<&str> = fair_waits.keys().copied().collect();
        fair_locks.sort_unstable();
        for lock in fair_locks {
            let mut waits = fair_waits.remove(lock).unwrap_or_default();
            waits.sort_by_key(|w| (w.inv, w.key));
            let holds_of_lock: &[&Hold] = by_lock.get(lock).map_or(&[], |v| v.as_slice());
            for (i, c) in holds_of_lock.iter().enumerate() {
                // C surely held the lock until its end or the next grant to someone
                // else, whichever came first (after an overlap the history's idea of
                // C's hold is not to be trusted further).
                let next = holds_of_lock[i + 1..]
                    .iter()
                    .find(|b| b.key != c.key && b.ok > c.ok)
                    .map_or(u64::MAX, |b| b.ok);
                let held_until = c.end.min(next);
                if held_until == u64::MAX {
                    continue;
                }
                let from = waits.partition_point(|w| w.inv <= c.ok);
                let to = waits.partition_point(|w| w.inv < held_until);
                let during: Vec<&Wait<'_>> = waits[from..to.max(from)]
                    .iter()
                    .filter(|w| w.key != c.key)
                    .collect();
                for (i, a) in during.iter().enumerate() {
                    for b in &during[i + 1..] {
                        if a.inv + rules.fair_margin_ns >= b.inv || b.ok >= a.ok {
                            continue;
                        }
                        if !seen.insert((a.key, b.key)) {
                            continue;
                        }
                        let disturbed = [a.proc_, b.proc_].iter().any(|p| {
                            let rec = proc_of(*p);
                            rec.paused(a.inv, a.ok) || rec.faulted(a.inv, a.ok)
                        });
                        if disturbed {
                            fair.excused += 1;
                            continue;
                        }
                        fair.violation(lock, || {
                            format!(
                                "{lock}: {} arrived at {} and {} at {} while {} held it, but {} was granted first ({} vs {})",
                                a.key,
                                at(a.inv, t0),
                                b.key,
                                at(b.inv, t0),
                                c.key,
                                b.key,
                                at(b.ok, t0),
                                at(a.ok, t0)
                            )
                        });
                    }
                }
            }
        }
    }

    Report {
        label: label.to_owned(),
        totals,
        classes,
        margins_ms,
    }
}
