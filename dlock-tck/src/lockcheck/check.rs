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
//!   process (the instant it was sent: a store may end a dead client's session at
//!   once), or the process's end when none of these was recorded. A hold handed
//!   out already lost ends at its `ok`.
//! * A hold's **proofs** are the send times of its granting acquire and of its
//!   successful watchdog renewals: the store had it then, and keeps it at least its
//!   **life** past each — the lease the hold was asked with (explicit or the
//!   watchdog's), or the session timeout on ZooKeeper, where holds live as long as
//!   the session. **valid-until(t)** = the last proof before `t` + the life: the
//!   earliest instant the store may let the hold go, as known at `t`.
//! * Holds **conflict** when they are of the same lock, different holds of
//!   different owners (one owner's read and write sides do not: a writer reading, a
//!   downgrade, an upgrade), and not both shared.
//! * A process is **paused** during `[a, b]` if a SIGSTOP..SIGCONT window of it
//!   intersects `[a, b]`; **faulted** likewise for its proxy fault windows and for
//!   every server-side fault window (restart, promotion: `down`..`up`). A grant's
//!   `ok` is **unreliable** when its process was paused between invoke and `ok`.
//!
//! # Rules
//!
//! 1. **overlap** — conflicting holds A, B with `A.ok ≤ B.ok < A.end`, and B granted
//!    while the store still had to keep A: `B.ok < A.valid-until(B.ok)`, or A
//!    renewed successfully after B's grant. Excused (counted apart) only when B's
//!    `ok` is unreliable and B's token is below A's (B may be the earlier grant),
//!    or, where a server outage ends every hold (`Rules::outage_ends_holds`: the
//!    SQL session modes), when A was alive in an outage that began by B's grant,
//!    or A's connections were reset by then, and A was told within half the
//!    session after the outage ended (or the reset). A
//!    grant after A's valid-until is not an overlap: if A's process was paused since
//!    `A.ok` it is excused (A could not be told), otherwise A was not told in time
//!    and that is A's late loss (rule 4).
//! 2. **stale-write** — the register accepted a write of hold A at `t` after a
//!    conflicting hold B of another owner with a greater token had been granted
//!    after A (`A.ok ≤ B.ok < t`, or from A's send time when A's `ok` is
//!    unreliable: a grant before A's leaves A's writes current). Excused
//!    only if A's process was paused between `A.ok` and `t` and B's grant came after
//!    A's valid-until, or as rule 1 excuses an outage's overlap (with `t` for the
//!    instant A was told). Each write counts at most once.
//! 3. **token-order** — per lock: two holds of different owners with the same token
//!    (every backend gives each grant its own token, shared ones included; a read
//!    beside its owner's write may go on with the write's token), whatever the
//!    timing; and, by `ok` time, an exclusive grant whose token is not above every
//!    earlier grant's of other owners, or a shared grant (or an upgrade, which goes
//!    on with its owner's read) whose token is not above every earlier exclusive
//!    grant's of other owners —
//!    excused when the later grant's `ok` is unreliable (its process was paused, or
//!    it is a multi-lock member, whose `ok` is when the whole multi-lock returned,
//!    or — where an outage ends every hold — it was asked for before an outage and
//!    answered in it: made before the outage ended its session, its answer may
//!    reach its client after a later grant's).
//! 4. **late-loss** — a hold lost while held (not by closing its manager, not
//!    handed out lost) whose lost signal fired after its valid-until (excused if its
//!    process was paused between the last proof and the signal), or a hold whose
//!    store could let it go before another hold's grant (rule 1) and that was not
//!    told before that grant. Counted once per hold. A late signal is excused
//!    too when the process **stalled** while it was due (from a third of the
//!    hold's life before valid-until to the signal): a worker logs a stall when a
//!    5 ms timer fires more than 10 ms late — the process got no CPU, as if paused,
//!    and the lost signal's guarantee assumes timers within 10 ms. The loss margin — the lead of
//!    the lost signal before the next conflicting grant — is reported as min and
//!    median.
//! 5. **leak** — a lock name that still had holder or waiter state after every worker
//!    had exited and the coordinator had waited out the longest lease (recorded by the
//!    coordinator as `leak` events).
//! 6. **starvation** — conservative on purpose. Occupancy of a lock is the union of:
//!    every hold's `[ok, until]`, where `until` is the store's confirmation of its
//!    release when every guard was released by an `unlock()` that answered ok, and
//!    otherwise (dropped, unlock cancelled or failed, lost, killed) the later of its
//!    end, last release-invoke and register EXIT plus `hidden` (how long the store
//!    may keep a hold nobody reports: the longest lease, the session timeout on
//!    ZooKeeper, 200 ms for an in-process store, which hears of every release at
//!    once);
//!    every cancelled or failed-with-error acquire's `[invoke, result + hidden]`; and
//!    every acquire of a paused process, likewise. An exclusive acquire that gave up
//!    (`none` or `timeout`, not cancelled) is starved if, within the wait it asked
//!    for, the lock was unoccupied for longer than `starvation_slack` (2 s) without
//!    interruption (a lock nobody occupied was free all the wait). Waiters whose
//!    process was paused or faulted while waiting are skipped; one whose process
//!    stalled so much in the free stretch that it ran for no more than the slack
//!    of it is excused (seen: a proxy run on a loaded machine at a sixteenth of its
//!    usual pace, 203 stalls, a waiter timed out beside a lock free for 2.2 s).
//! 7. **fair-order** — conservative as well. For a fair lock: waiters A and B (first
//!    grants, not reentries, not cancellable), both invoked while one hold C held the
//!    lock (`C.ok < invoke < min(C.end, the next grant to another hold)`), A invoked
//!    at least `fair_margin` (250 ms) before B, yet B granted before A. For a lock's
//!    exclusive grants the answers' order is the grants' (B's grant ends only after
//!    its release); permit grants do not exclude each other, and two that one
//!    release admitted may answer in either order (a semaphore's head, granted,
//!    tells the next waiter, whose grant may answer first), so among permits B's
//!    answer must come more than `permit_answer_margin` (50 ms) before A's. Excused if A's
//!    or B's process was paused or faulted between A's invoke and A's grant (A's also
//!    in the `fault_recovery` (1 s) before A's invoke: the connections a fault broke,
//!    or the keepalives and leases a pause let lapse, are renewed when next used —
//!    seen: etcd-tls, A invoked 63 ms after its process was continued from a 3 s
//!    stop), or if A's process stalled (its timers late)
//!    between A's invoke and B's for so long that A's lead less the stall is within
//!    the margin (seen: MySQL over TLS, A 371 ms ahead of B in one process whose
//!    timers ran up to 180 ms late while the machine was loaded), or any
//!    process between A's invoke and B's: a process paused (or whose connection is
//!    held up) inside a transaction keeps the rows it locked, so A's first statement
//!    — or the statement holding the pooled connection A waits for — may reach the
//!    store only after B's.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::history::{Event, Mode, Op, Outcome, Reason, Why};
use super::workload::MAX_LEASE_MS;

mod fair;
mod gather;
mod late;
mod overlap;
mod stale;
mod starvation;
mod tokens;

use gather::Facts;

/// The checker's tunable bounds.
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    /// Starvation: how long a lock may stay unoccupied while a waiter waits (ns).
    pub starvation_slack_ns: u64,
    /// How long the store may keep a hold no history shows (ns).
    pub hidden_hold_ns: u64,
    /// Fair order: how much earlier A must have arrived than B (ns).
    pub fair_margin_ns: u64,
    /// Fair order: how long after one of its fault windows ends a process's
    /// requests may still reach the store late (ns). The connections the fault
    /// broke are found broken and replaced when next used — a pooled connection
    /// idle for 0.5 s is checked before use, and a new one takes its round trips
    /// and handshake — so a waiter invoked just after the window (seen: 5 ms after
    /// a black hole on PostgreSQL) reaches the store behind one invoked hundreds of
    /// ms later.
    pub fault_recovery_ns: u64,
    /// Fair order among permit grants: how much earlier B's grant must have
    /// answered than A's (ns) — grants one release admitted answer in any order.
    pub permit_answer_margin_ns: u64,
    /// Holds live as long as the client's session, which the store ends this long
    /// after it last heard from the client (ZooKeeper); `None`: holds live by lease.
    pub session_ns: Option<u64>,
    /// How long a silent waiter's state may outlive it (Redis: its queue lapses
    /// twice the waiter liveness after the last refresh).
    pub waiter_lapse_ns: u64,
    /// A server outage (a restart: `down`..`up`) ends every session, and every
    /// hold with it, with no notice to a client before its next ask, and so does
    /// a reset of the holder's own connections (the SQL session modes, SAFETY.md):
    /// a conflicting grant after the outage began (or the reset), or a write after
    /// such a grant, beside a hold alive then whose holder was told within half
    /// the session after the server came back (or the reset), is excused (counted
    /// apart) — no margin is possible there. Token order stays strict.
    pub outage_ends_holds: bool,
}

impl Default for Rules {
    /// The rules of a lease-based store.
    fn default() -> Self {
        Rules {
            starvation_slack_ns: 2_000_000_000,
            hidden_hold_ns: MAX_LEASE_MS * 1_000_000,
            fair_margin_ns: 250_000_000,
            permit_answer_margin_ns: 50_000_000,
            fault_recovery_ns: 1_000_000_000,
            session_ns: None,
            waiter_lapse_ns: 0,
            outage_ends_holds: false,
        }
    }
}

impl Rules {
    /// How long after the last worker is gone the store may still show its state:
    /// a hold nobody reports, or a silent waiter's queue entry.
    pub fn quiescence(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.hidden_hold_ns.max(self.waiter_lapse_ns))
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
    /// Of those, terms of the election (`ELECTION_NAME`).
    pub terms: usize,
    /// Of those, permits of the semaphore.
    pub permit_grants: usize,
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
    /// Stalls: a process's timer fired more than 10 ms late.
    pub stalls: usize,
    /// The longest stall (ms).
    pub longest_stall_ms: f64,
    /// Late losses excused because the process stalled when the signal was due
    /// (its timers did not keep the time the margin assumes).
    pub late_losses_in_stalls: usize,
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

    /// `lockcheck: <label> ops=… grants=… terms=… permits=… faults=… violations=…
    /// (overlap=… …)`.
    pub fn summary_line(&self) -> String {
        let t = &self.totals;
        let by_class: Vec<String> = self
            .classes
            .iter()
            .map(|c| format!("{}={}", c.name, c.count))
            .collect();
        format!(
            "lockcheck: {} ops={} grants={} terms={} permits={} faults={} violations={} ({})",
            self.label,
            t.ops,
            t.grants,
            t.terms,
            t.permit_grants,
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
            "  processes {}  ops {}  grants {} (terms {}, permits {})  reentries {}  releases {}  losses {}",
            t.processes, t.ops, t.grants, t.terms, t.permit_grants, t.reentries, t.releases, t.losses
        );
        let _ = writeln!(
            out,
            "  cancels {}  errors {}  register writes accepted {} rejected {}  faults {}",
            t.cancels, t.errors, t.writes_accepted, t.writes_rejected, t.faults
        );
        let _ = writeln!(
            out,
            "  stalls (a timer > 10 ms late) {}, longest {:.1} ms; late losses excused for a stall {}",
            t.stalls, t.longest_stall_ms, t.late_losses_in_stalls
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
    /// SIGSTOP..SIGCONT windows, in time order, disjoint.
    stops: Vec<(u64, u64)>,
    stop_open: Option<u64>,
    /// Stall windows (a timer due at the start fired at the end), in time order.
    stalls: Vec<(u64, u64)>,
    /// Proxy fault windows, in time order, disjoint.
    faults: Vec<(u64, u64)>,
    /// When its connections were reset (a reset, or the end of a black hole).
    resets: Vec<u64>,
    fault_open: Option<u64>,
    kill: Option<u64>,
    exit: Option<u64>,
    last: u64,
}

/// `windows` sorted by start, overlapping ones joined: disjoint, as
/// [`any_within`] needs them.
fn merge_windows(windows: impl Iterator<Item = (u64, u64)>) -> Vec<(u64, u64)> {
    let mut all: Vec<(u64, u64)> = windows.collect();
    all.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(all.len());
    for (a, b) in all {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    merged
}

/// Whether one of `windows` (sorted by start, disjoint) intersects `[a, b]`.
fn any_within(windows: &[(u64, u64)], a: u64, b: u64) -> bool {
    let i = windows.partition_point(|w| w.1 < a);
    windows.get(i).is_some_and(|w| w.0 <= b)
}

impl ProcRec {
    fn paused(&self, a: u64, b: u64) -> bool {
        any_within(&self.stops, a, b)
    }
    fn faulted(&self, a: u64, b: u64) -> bool {
        any_within(&self.faults, a, b)
    }
    fn stalled(&self, a: u64, b: u64) -> bool {
        any_within(&self.stalls, a, b)
    }
    /// How long, in all, this process's timers ran late between `a` and `b` (the
    /// union of its stall windows there): time in which none of its requests went
    /// out.
    fn stalled_for(&self, a: u64, b: u64) -> u64 {
        let mut within: Vec<(u64, u64)> = self
            .stalls
            .iter()
            .filter(|w| w.1 >= a && w.0 <= b)
            .map(|w| (w.0.max(a), w.1.min(b)))
            .collect();
        within.sort_unstable();
        let (mut total, mut reach) = (0u64, a);
        for (from, to) in within {
            let from = from.max(reach);
            if to > from {
                total += to - from;
                reach = to;
            }
        }
        total
    }
    /// The start of the first pause that ends at or after `t` (`u64::MAX`: none).
    fn first_pause_from(&self, t: u64) -> u64 {
        let i = self.stops.partition_point(|w| w.1 < t);
        self.stops.get(i).map_or(u64::MAX, |w| w.0)
    }
    /// What disturbed this process from `lead` before `a` until `b`, for a
    /// violation's example: its fault and pause windows that reach into that span
    /// (a connection cut off just before `a` is reopened after it) and its longest
    /// stall within `a..b`.
    fn disturbances(&self, a: u64, b: u64, lead: u64, t0: u64) -> String {
        let from = a.saturating_sub(lead);
        let windows = |list: &[(u64, u64)]| {
            let near: Vec<String> = list
                .iter()
                .filter(|w| w.1 >= from && w.0 <= b)
                .map(|w| format!("{}–{}", at(w.0, t0), at(w.1, t0)))
                .collect();
            if near.is_empty() {
                "none".to_owned()
            } else {
                near.join(" ")
            }
        };
        let stall = self
            .stalls
            .iter()
            .filter(|w| w.1 >= a && w.0 <= b)
            .map(|w| w.1 - w.0)
            .max()
            .unwrap_or(0);
        format!(
            "faults {}, pauses {}, longest stall {:.1}ms",
            windows(&self.faults),
            windows(&self.stops),
            stall as f64 / 1e6
        )
    }
    fn end(&self) -> u64 {
        self.kill
            .or(self.exit)
            .unwrap_or(if self.last == 0 { u64::MAX } else { self.last })
    }
}

#[derive(Debug, Clone)]
struct Invoke<'a> {
    t: u64,
    lock: &'a str,
    mode: Mode,
    fair: bool,
    op: Op,
    cancel: bool,
    wait_ns: u64,
}

#[derive(Debug, Clone)]
struct Hold<'a> {
    key: &'a str,
    /// Whose hold it is (one owner's holds never conflict).
    owner: &'a str,
    lock: &'a str,
    mode: Mode,
    token: u64,
    proc_: u32,
    att: u64,
    ok: u64,
    /// When the granting attempt was sent.
    sent: u64,
    /// How long the store keeps the hold past a proof that it is alive (the lease, or
    /// the session timeout).
    life: u64,
    /// Send times of the successful renewals, in order.
    proofs: Vec<u64>,
    guards: usize,
    releases: usize,
    /// Releases whose `unlock()` answered ok.
    releases_ok: usize,
    last_release: Option<u64>,
    last_release_ok: Option<u64>,
    lost: Option<(u64, Reason)>,
    lost_at_ok: bool,
    enter: Option<u64>,
    exit: Option<u64>,
    // Derived once every event is read.
    end: u64,
    /// Its process was paused between the invoke and the `ok`.
    ok_unreliable: bool,
    /// The start of the first pause of its process that ends at or after `ok`.
    pause_from_ok: u64,
}

impl Hold<'_> {
    /// Whether this hold and `other` exclude each other.
    fn conflicts(&self, other: &Hold<'_>) -> bool {
        self.owner != other.owner && self.mode.conflicts(other.mode)
    }

    fn released_at(&self) -> Option<u64> {
        (self.releases >= self.guards)
            .then_some(self.last_release)
            .flatten()
    }
    /// When the store confirmed the release: every guard released by an `unlock()`
    /// that answered ok.
    fn confirmed_free_at(&self) -> Option<u64> {
        (self.releases >= self.guards && self.releases_ok == self.releases)
            .then_some(self.last_release_ok)
            .flatten()
    }
    /// Lost before it was released, not by a manager close.
    fn lost_while_held(&self) -> Option<u64> {
        let (l, reason) = self.lost?;
        if reason == Reason::ManagerClosed {
            return None;
        }
        match self.released_at() {
            Some(r) if r <= l => None,
            _ => Some(l),
        }
    }
    /// The last proof that the store held it (grant or renewal send) before `t`.
    fn proof_before(&self, t: u64) -> u64 {
        let i = self.proofs.partition_point(|&p| p < t);
        i.checked_sub(1)
            .map_or(self.sent, |i| self.proofs[i].max(self.sent))
    }
    /// The earliest instant the store may let the hold go, as known at `t`: the last
    /// proof before `t` plus the hold's life.
    fn valid_until(&self, t: u64) -> u64 {
        self.proof_before(t).saturating_add(self.life)
    }
    /// A successful renewal sent in `[a, b)`: the store still held it then.
    fn renewed_within(&self, a: u64, b: u64) -> bool {
        let i = self.proofs.partition_point(|&p| p < a);
        self.proofs.get(i).is_some_and(|&p| p < b)
    }
}

/// The highest token seen, and the highest among the other owners' (so the
/// highest of any owner but a given one is at hand).
#[derive(Default)]
struct TopByOwner<'a> {
    best: Option<(u64, &'a str)>,
    /// The highest token of an owner other than `best`'s.
    second: u64,
}

impl<'a> TopByOwner<'a> {
    fn update(&mut self, token: u64, owner: &'a str) {
        match &mut self.best {
            None => self.best = Some((token, owner)),
            Some((top, o)) if *o == owner => *top = (*top).max(token),
            Some((top, o)) if token > *top => {
                self.second = *top;
                (*top, *o) = (token, owner);
            }
            Some(_) => self.second = self.second.max(token),
        }
    }

    /// The highest token of any owner but `owner` (0 for none).
    fn floor(&self, owner: &str) -> u64 {
        match self.best {
            Some((_, o)) if o == owner => self.second,
            Some((top, _)) => top,
            None => 0,
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
    let mut facts = Facts::gather(events, rules);
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
    let granted_over = overlap::judge(&facts, rules, overlap);
    stale::judge(&facts, rules, stale);
    tokens::judge(&facts, token_order);
    let margins = late::judge(&facts, &granted_over, late);
    for (lock, state) in &facts.leaks {
        leak.violation(lock, || format!("{lock}: {state}"));
    }
    starvation::judge(&facts, rules, starvation);
    fair::judge(&facts, rules, fair);
    facts.totals.late_losses_in_stalls += margins.in_stalls;
    Report {
        label: label.to_owned(),
        totals: facts.totals,
        classes,
        margins_ms: margins.margins_ms,
    }
}
