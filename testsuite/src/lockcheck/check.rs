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
//!    it is a multi-lock member, whose `ok` is when the whole multi-lock returned).
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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;

use crate::proxy::Fault;

use super::history::{Event, Kind, Mode, Op, Outcome, Reason, RegOp, Why, COORDINATOR};
use super::workload::{ELECTION_NAME, MAX_LEASE_MS, SEMAPHORE_PERMITS};

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

/// How long an in-process store may keep a hold no history shows.
const IN_PROCESS_RELEASE_NS: u64 = 200_000_000;

fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Rules {
    /// The rules for a backend label, from the backends' own defaults: an in-process
    /// store hears of every release at once; ZooKeeper holds live as long as the
    /// session (its default session timeout), the others by lease; a Redis queue lapses twice the waiter liveness after its last refresh
    /// (`dlock-redis` scripts). (A URL that sets another `session_timeout` is not
    /// looked at.)
    pub fn for_label(label: &str) -> Rules {
        let mut rules = Rules::default();
        if super::broken::in_process(label) {
            // No network: the background release of a dropped guard, a cancelled
            // unlock or a cancelled acquire's grant reaches the store at once.
            rules.hidden_hold_ns = IN_PROCESS_RELEASE_NS;
        }
        if label.starts_with("zk") {
            let session = nanos(dlock_zk::ZkOptions::default().session_timeout);
            rules.session_ns = Some(session);
            rules.hidden_hold_ns = session;
        }
        if crate::backends::is_session_mode(label) {
            // Held as long as the session, which the server ends this long after
            // the last statement it received.
            let session = nanos(crate::backends::SESSION_MODE_TIMEOUT);
            rules.session_ns = Some(session);
            rules.hidden_hold_ns = session;
            rules.outage_ends_holds = true;
        }
        if label.starts_with("etcd") {
            // etcd holds a lease for whole seconds, and a new leader gives every
            // lease its full TTL again: a hold or a waiter's key nobody reports may
            // stay that much longer.
            rules.hidden_hold_ns += 2_000_000_000;
            rules.waiter_lapse_ns = rules.hidden_hold_ns;
        }
        // Redlock shows its waiters for the same liveness.
        if label.starts_with("redis") || label.starts_with("redlock") {
            let liveness = dlock_redis::RedisOptions::default().waiter_liveness;
            rules.waiter_lapse_ns = nanos(liveness * 2);
        }
        rules
    }

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
    let mut ev: Vec<&Event> = events.iter().collect();
    ev.sort_by_key(|e| e.t);
    let t0 = ev.first().map_or(0, |e| e.t);

    let mut procs: HashMap<u32, ProcRec> = HashMap::new();
    let mut invokes: HashMap<(u32, u64), Invoke<'_>> = HashMap::new();
    // Each attempt's answer: `None` granted, or why not.
    let mut results: HashMap<(u32, u64), (u64, Option<&Why>)> = HashMap::new();
    let mut holds: Vec<Hold<'_>> = Vec::new();
    let mut hold_of: HashMap<&str, usize> = HashMap::new();
    // The holds of a process, lock and token, in grant order (a token is one grant's
    // on every backend; a broken one may repeat it).
    let mut grant_of: HashMap<(u32, &str, u64), Vec<usize>> = HashMap::new();
    let mut renewals: Vec<(u32, &str, u64, u64)> = Vec::new();
    let mut losses: Vec<(u32, &str, u64, u64, Reason)> = Vec::new();
    let mut writes: Vec<(u64, &str, usize)> = Vec::new();
    let mut leaks: Vec<(&str, &str)> = Vec::new();
    let mut totals = Totals::default();
    let mut ok_of_attempt: Vec<((u32, u64), usize)> = Vec::new();
    // Server-side fault windows (restart, promotion): they fault every process.
    let mut outages: Vec<(u64, u64)> = Vec::new();
    let mut outage_open: Option<u64> = None;

    for e in &ev {
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
                        lock,
                        mode: *mode,
                        fair: *fair,
                        op: *op,
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
                owner,
                lease_ms,
                sent,
                lost,
                ..
            } => {
                results.insert((p, *att), (e.t, None));
                let i = match hold_of.get(hold.as_str()) {
                    Some(&i) => {
                        holds[i].guards += 1;
                        totals.reentries += 1;
                        i
                    }
                    None => {
                        totals.grants += 1;
                        totals.terms += usize::from(lock == ELECTION_NAME);
                        totals.permit_grants += usize::from(mode.permits().is_some());
                        let i = holds.len();
                        hold_of.insert(hold, i);
                        grant_of.entry((p, lock, *token)).or_default().push(i);
                        holds.push(Hold {
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
                        i
                    }
                };
                ok_of_attempt.push(((p, *att), i));
            }
            Kind::Fail { att, why, .. } => {
                match why {
                    Why::Cancel => totals.cancels += 1,
                    Why::Error(_) | Why::Hung => totals.errors += 1,
                    Why::None | Why::Timeout => {}
                }
                results.insert((p, *att), (e.t, Some(why)));
            }
            Kind::Lost {
                lock,
                token,
                reason,
            } => losses.push((p, lock, *token, e.t, *reason)),
            Kind::Renewed { lock, token } => renewals.push((p, lock, *token, e.t)),
            Kind::Release { hold, .. } => {
                totals.releases += 1;
                if let Some(&i) = hold_of.get(hold.as_str()) {
                    let h = &mut holds[i];
                    h.releases += 1;
                    h.last_release = Some(h.last_release.map_or(e.t, |r| r.max(e.t)));
                }
            }
            Kind::Released { hold, outcome, .. } => {
                if let Some(&i) = hold_of.get(hold.as_str()) {
                    if *outcome == Outcome::Ok {
                        let h = &mut holds[i];
                        h.releases_ok += 1;
                        h.last_release_ok = Some(h.last_release_ok.map_or(e.t, |r| r.max(e.t)));
                    }
                }
            }
            Kind::Fault { fault } => {
                let rec = procs.entry(p).or_default();
                if *fault == Fault::Reset {
                    rec.resets.push(e.t);
                }
                if *fault == Fault::Pass {
                    if let Some(s) = rec.fault_open.take() {
                        rec.faults.push((s, e.t));
                    }
                } else if rec.fault_open.is_none() {
                    // One fault per window (a black hole ends with a reset).
                    totals.faults += 1;
                    rec.fault_open = Some(e.t);
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
            Kind::Stall { from } => {
                totals.stalls += 1;
                let ms = e.t.saturating_sub(*from) as f64 / 1e6;
                totals.longest_stall_ms = totals.longest_stall_ms.max(ms);
                procs.entry(p).or_default().stalls.push((*from, e.t));
            }
            Kind::Down { .. } => {
                totals.faults += 1;
                outage_open = outage_open.or(Some(e.t));
            }
            Kind::Up => {
                if let Some(s) = outage_open.take() {
                    outages.push((s, e.t));
                }
            }
            Kind::Reg {
                op, hold, accepted, ..
            } => {
                let i = hold_of.get(hold.as_str()).copied();
                match op {
                    RegOp::Enter => {
                        if let Some(h) = i.map(|i| &mut holds[i]) {
                            h.enter = Some(h.enter.map_or(e.t, |x| x.min(e.t)));
                        }
                    }
                    RegOp::Exit => {
                        if let Some(h) = i.map(|i| &mut holds[i]) {
                            h.exit = Some(h.exit.map_or(e.t, |x| x.max(e.t)));
                        }
                    }
                    RegOp::Write if *accepted => {
                        totals.writes_accepted += 1;
                        if let Some(i) = i {
                            writes.push((e.t, holds[i].lock, i));
                        }
                    }
                    RegOp::Write => totals.writes_rejected += 1,
                    RegOp::Read => {}
                }
            }
            Kind::Leak { lock, state } => leaks.push((lock.as_str(), state.as_str())),
        }
    }
    if let Some(s) = outage_open.take() {
        outages.push((s, u64::MAX));
    }
    for rec in procs.values_mut() {
        if let Some(s) = rec.stop_open.take() {
            rec.stops.push((s, u64::MAX));
        }
        if let Some(s) = rec.fault_open.take() {
            rec.faults.push((s, u64::MAX));
        }
        // A server-side fault faults every process's connections.
        rec.faults = merge_windows(rec.faults.iter().chain(&outages).copied());
    }
    // A renewal or a loss belongs to the last hold of its token granted (sent)
    // before it.
    let hold_at = |p: u32, lock: &str, token: u64, t: u64| -> Option<usize> {
        let list = grant_of.get(&(p, lock, token))?;
        let before = list.partition_point(|&i| holds[i].sent <= t);
        list.get(before.checked_sub(1)?).copied()
    };
    let renewals: Vec<(usize, u64)> = renewals
        .into_iter()
        .filter_map(|(p, lock, token, t)| Some((hold_at(p, lock, token, t)?, t)))
        .collect();
    let losses: Vec<(usize, u64, Reason)> = losses
        .into_iter()
        .filter_map(|(p, lock, token, t, r)| Some((hold_at(p, lock, token, t)?, t, r)))
        .collect();
    for (i, t) in renewals {
        holds[i].proofs.push(t);
    }
    for (i, t, reason) in losses {
        let h = &mut holds[i];
        if h.lost.is_none_or(|(l, _)| t < l) {
            h.lost = Some((t, reason));
        }
    }
    totals.processes = procs.keys().filter(|p| **p != COORDINATOR).count();
    let empty = ProcRec::default();
    let proc_of = |p: u32| procs.get(&p).unwrap_or(&empty);

    for h in &mut holds {
        let rec = proc_of(h.proc_);
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
        // A grant whose process was paused between invoke and `ok`, or a member of
        // a multi-lock or an upgradeable read (its `ok` is when the whole returned):
        // its `ok` time says little about when it was granted.
        let invoke = invokes.get(&(h.proc_, h.att));
        let invoked = invoke.map_or(h.ok, |i| i.t);
        let multi = invoke.is_some_and(|i| matches!(i.op, Op::Multi | Op::Upgradeable));
        h.ok_unreliable = multi || rec.paused(invoked, h.ok);
        h.pause_from_ok = rec.first_pause_from(h.ok);
        if h.lost_while_held().is_some() {
            totals.losses += 1;
        }
    }
    let holds = holds;

    // Holds per lock, by ok time.
    let mut by_lock: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, h) in holds.iter().enumerate() {
        by_lock.entry(h.lock).or_default().push(i);
    }
    for list in by_lock.values_mut() {
        list.sort_by(|&a, &b| (holds[a].ok, holds[a].key).cmp(&(holds[b].ok, holds[b].key)));
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

    // A's hold ended with its session in an outage that began by `after` (a grant
    // or a write then), and A was told within half the session of the server's
    // return: no margin is possible (`Rules::outage_ends_holds`).
    let notice = rules.session_ns.unwrap_or(0) / 2;
    let ended_by_outage = |a: &Hold, after: u64, told_by: u64| {
        let resets = procs.get(&a.proc_).map_or(&[][..], |r| &r.resets[..]);
        rules.outage_ends_holds
            && outages
                .iter()
                .copied()
                .chain(resets.iter().map(|&r| (r, r)))
                .any(|(d, u)| a.ok <= u && after >= d && told_by <= u.saturating_add(notice))
    };

    // 1. overlap. A hold the store could have let go before B's grant, held by a
    // process that was not paused and not told, is a late loss (rule 4), not an
    // overlap: `granted_over` keeps the first such B per A.
    let mut granted_over: Vec<Option<usize>> = vec![None; holds.len()];
    for lock in &locks {
        let mut active: Vec<usize> = Vec::new();
        for &bi in &by_lock[lock] {
            let b = &holds[bi];
            active.retain(|&ai| holds[ai].end > b.ok);
            // Permits of a semaphore: those still held when B was granted (by the
            // rules a conflicting hold is judged by) add up to at most the total.
            let mut in_use = b.mode.permits().unwrap_or(0);
            let mut sharing: Vec<&str> = Vec::new();
            for &ai in &active {
                let a = &holds[ai];
                if !a.conflicts(b) {
                    if let (Some(n), Some(_)) = (a.mode.permits(), b.mode.permits()) {
                        let earlier_grant = b.ok_unreliable && b.token < a.token;
                        let held =
                            b.ok < a.valid_until(b.ok) || a.renewed_within(b.ok, a.end.min(b.end));
                        if held && !earlier_grant {
                            in_use += n;
                            sharing.push(a.key);
                        }
                    }
                    continue;
                }
                // B may have been granted before A (its ok came late, and its token
                // says it was the earlier grant).
                if b.ok_unreliable && b.token < a.token {
                    overlap.excused += 1;
                    continue;
                }
                if ended_by_outage(a, b.ok, a.end) {
                    overlap.excused += 1;
                    continue;
                }
                let valid_until = a.valid_until(b.ok);
                let renewed_after = a.renewed_within(b.ok, a.end.min(b.end));
                if b.ok >= valid_until && !renewed_after {
                    if a.pause_from_ok <= b.ok {
                        overlap.excused += 1;
                    } else if granted_over[ai].is_none() {
                        granted_over[ai] = Some(bi);
                    }
                    continue;
                }
                overlap.violation(lock, || {
                    format!(
                        "{lock}: {} (token {}, ok {}, store may let go at {}{}, end {}) still held when {} (token {}) was granted at {}",
                        a.key,
                        a.token,
                        at(a.ok, t0),
                        at(valid_until, t0),
                        if renewed_after { ", renewed after that grant" } else { "" },
                        at(a.end, t0),
                        b.key,
                        b.token,
                        at(b.ok, t0)
                    )
                });
            }
            if in_use > SEMAPHORE_PERMITS {
                overlap.violation(lock, || {
                    format!(
                        "{lock}: {} (token {}) granted at {} with {in_use} of {SEMAPHORE_PERMITS} permits in use, also by {}",
                        b.key,
                        b.token,
                        at(b.ok, t0),
                        sharing.join(", ")
                    )
                });
            }
            active.push(bi);
        }
    }

    // 2. stale writes: per lock, the highest token granted so far (by ok time).
    let mut max_token: HashMap<&str, Vec<u64>> = HashMap::new();
    for lock in &locks {
        let mut m = 0;
        let maxes = by_lock[lock]
            .iter()
            .map(|&i| {
                m = m.max(holds[i].token);
                m
            })
            .collect();
        max_token.insert(lock, maxes);
    }
    for &(t, lock, ai) in &writes {
        let a = &holds[ai];
        let list = &by_lock[lock];
        let granted_before = list.partition_point(|&i| holds[i].ok < t);
        let first_above = max_token[lock][..granted_before].partition_point(|&m| m <= a.token);
        // The first such grant of another owner (one owner's own later grant — its
        // read beside its write — does not make its writes stale), made after A's
        // (a grant before A's leaves A's writes current: ZooKeeper's upgrade goes on
        // with its read's token, below those of the readers beside that read). A's
        // `ok` when it is reliable, else the send time of its granting attempt.
        let after = if a.ok_unreliable { a.sent } else { a.ok };
        let Some(b) = list[first_above..granted_before]
            .iter()
            .map(|&i| &holds[i])
            .find(|b| b.token > a.token && b.owner != a.owner && b.ok >= after)
        else {
            continue;
        };
        if (a.pause_from_ok <= t && b.ok >= a.valid_until(b.ok)) || ended_by_outage(a, b.ok, t) {
            stale.excused += 1;
            continue;
        }
        stale.violation(lock, || {
            format!(
                "{lock}: write of {} (token {}) accepted at {}, after {} (token {}) was granted at {}",
                a.key,
                a.token,
                at(t, t0),
                b.key,
                b.token,
                at(b.ok, t0)
            )
        });
    }

    // 3. token order: tokens are unique per grant on every backend (shared grants
    // included), whatever the timing — but for one owner's read beside its write,
    // which may go on with the write's token (ZooKeeper's placed read); the order is
    // judged on `ok` times, against the other owners' grants.
    for lock in &locks {
        let mut top_all = TopByOwner::default();
        let mut top_exclusive = TopByOwner::default();
        let mut seen: HashMap<u64, (&str, &str)> = HashMap::new();
        for &i in &by_lock[lock] {
            let h = &holds[i];
            if let Some(&(other, owner)) = seen.get(&h.token) {
                if owner != h.owner {
                    token_order.violation(lock, || {
                        format!(
                            "{lock}: {} and {other} were both granted token {}",
                            h.key, h.token
                        )
                    });
                    continue;
                }
            } else {
                seen.insert(h.token, (h.key, h.owner));
            }
            // An upgrade goes on with its owner's read (ZooKeeper gives it the
            // read's token): readers beside that read may hold newer ones; it is
            // judged as a read is, against earlier writers.
            let upgrade = invokes
                .get(&(h.proc_, h.att))
                .is_some_and(|i| i.op == Op::Upgrade);
            let floor = match h.mode {
                Mode::Exclusive if !upgrade => top_all.floor(h.owner),
                Mode::Exclusive | Mode::Shared | Mode::Permit1 | Mode::Permit2 => {
                    top_exclusive.floor(h.owner)
                }
            };
            if h.token <= floor {
                if h.ok_unreliable {
                    token_order.excused += 1;
                } else {
                    token_order.violation(lock, || {
                        format!(
                            "{lock}: {} granted token {} at {}, not above the earlier token {floor}",
                            h.key,
                            h.token,
                            at(h.ok, t0)
                        )
                    });
                }
            }
            top_all.update(h.token, h.owner);
            if h.mode == Mode::Exclusive {
                top_exclusive.update(h.token, h.owner);
            }
        }
    }

    // 4. late loss, and the loss margins.
    let mut margins: Vec<f64> = Vec::new();
    for lock in &locks {
        let list = &by_lock[lock];
        for (pos, &ai) in list.iter().enumerate() {
            let a = &holds[ai];
            let lost = a.lost_while_held().filter(|_| !a.lost_at_ok);
            // The lead of the lost signal before the next conflicting grant.
            if let Some(l) = lost {
                let next = list[pos + 1..]
                    .iter()
                    .map(|&i| &holds[i])
                    .find(|b| b.ok > a.ok && a.conflicts(b));
                if let Some(b) = next {
                    margins.push(b.ok as f64 / 1e6 - l as f64 / 1e6);
                }
            }
            let told = lost.unwrap_or(a.end);
            let valid_until = a.valid_until(told);
            let late_signal = lost.is_some_and(|l| l > valid_until);
            if !late_signal && granted_over[ai].is_none() {
                continue;
            }
            if late_signal && proc_of(a.proc_).paused(a.proof_before(told), told) {
                late.excused += 1;
                continue;
            }
            // A process whose timers fired late when the signal was due (from a third
            // of the hold's life before valid-until, the margin's cap, to the signal)
            // was as good as paused: it could not be told in time.
            let due_from = valid_until.saturating_sub(a.life / 3);
            if late_signal && proc_of(a.proc_).stalled(due_from, told) {
                totals.late_losses_in_stalls += 1;
                late.excused += 1;
                continue;
            }
            late.violation(lock, || match granted_over[ai].map(|bi| &holds[bi]) {
                Some(b) => format!(
                    "{lock}: {} (token {}) could be let go at {}; {} (token {}) was granted at {}, and {} was not told before {}",
                    a.key,
                    a.token,
                    at(a.valid_until(b.ok), t0),
                    b.key,
                    b.token,
                    at(b.ok, t0),
                    a.key,
                    at(told, t0)
                ),
                None => format!(
                    "{lock}: {} (token {}) was told of its loss at {}, after the store could let it go ({})",
                    a.key,
                    a.token,
                    at(told, t0),
                    at(valid_until, t0)
                ),
            });
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
        for h in &holds {
            let rec = proc_of(h.proc_);
            let end = match h.confirmed_free_at() {
                // The store said it was released: free from then on.
                Some(freed) => freed.max(h.end),
                // Dropped, unlock cancelled or failed, lost, killed: the store may keep
                // it until its lease or session runs out.
                None => {
                    let released = h.released_at().unwrap_or_else(|| rec.end());
                    let exited = h.exit.unwrap_or_else(|| rec.end());
                    released.max(exited).max(h.end).saturating_add(hidden)
                }
            };
            occupied
                .entry(h.lock)
                .or_default()
                .push((h.ok.min(h.enter.unwrap_or(h.ok)), end));
        }
        for (key, inv) in &invokes {
            let rec = proc_of(key.0);
            let result = results.get(key);
            let until = result.map_or_else(|| rec.end(), |r| r.0);
            // A grant the history may not show: cancelled, failed, or no answer.
            let hidden_grant = match result {
                Some((_, Some(why))) => matches!(why, Why::Cancel | Why::Error(_) | Why::Hung),
                Some((_, None)) => false,
                None => true,
            };
            if hidden_grant || rec.paused(inv.t, until) {
                occupied
                    .entry(inv.lock)
                    .or_default()
                    .push((inv.t, until.saturating_add(hidden)));
            }
        }
        // Free stretches longer than the slack, per lock, in time order.
        let mut long_gaps: HashMap<&str, Vec<(u64, u64)>> = HashMap::new();
        for (lock, mut spans) in occupied {
            spans.sort_unstable();
            let mut gaps = Vec::new();
            let mut cursor = 0u64;
            for (s, e) in spans {
                if s > cursor.saturating_add(rules.starvation_slack_ns) {
                    gaps.push((cursor, s));
                }
                cursor = cursor.max(e);
            }
            gaps.push((cursor, u64::MAX));
            long_gaps.insert(lock, gaps);
        }
        let unoccupied = [(0, u64::MAX)];
        let mut waits: Vec<(&(u32, u64), &Invoke<'_>)> = invokes.iter().collect();
        waits.sort_by_key(|(k, i)| (i.t, **k));
        for (key, inv) in waits {
            // A multi-lock's or an upgradeable read's member may be refused for
            // another member's sake.
            if inv.mode != Mode::Exclusive
                || inv.cancel
                || matches!(inv.op, Op::Reenter | Op::Multi | Op::Upgradeable)
            {
                continue;
            }
            let Some(&(done, Some(why @ (Why::None | Why::Timeout)))) = results.get(key) else {
                continue;
            };
            let rec = proc_of(key.0);
            if rec.paused(inv.t, done) || rec.faulted(inv.t, done) {
                starvation.excused += 1;
                continue;
            }
            // Only the wait it asked for counts (a slow answer is not starvation).
            let until = done.min(inv.t.saturating_add(inv.wait_ns));
            // A lock nobody ever occupied was free the whole wait.
            let gaps = long_gaps
                .get(inv.lock)
                .map_or(&unoccupied[..], Vec::as_slice);
            // Only the first two and the last gap overlapping the wait can be cut by
            // it; any between lie wholly inside (and are long).
            let from = gaps.partition_point(|g| g.1 <= inv.t);
            let to = gaps.partition_point(|g| g.0 < until);
            let clipped = |g: &(u64, u64)| g.1.min(until).saturating_sub(g.0.max(inv.t));
            // The part of it the waiter's process ran (its stalls taken out).
            let running = |g: &(u64, u64)| {
                let (a, b) = (g.0.max(inv.t), g.1.min(until));
                b.saturating_sub(a).saturating_sub(rec.stalled_for(a, b))
            };
            let candidates = || {
                gaps[from..to.max(from)]
                    .iter()
                    .take(2)
                    .chain(gaps[from..to.max(from)].last())
            };
            let longest = candidates().map(clipped).max().unwrap_or(0);
            if longest > rules.starvation_slack_ns
                && candidates().map(running).max().unwrap_or(0) <= rules.starvation_slack_ns
            {
                starvation.excused += 1;
                continue;
            }
            if longest > rules.starvation_slack_ns {
                starvation.violation(inv.lock, || {
                    format!(
                        "{}: p{} attempt {} waited {} – {} ({why:?}) while the lock was free for {:.1} ms",
                        inv.lock,
                        key.0,
                        key.1,
                        at(inv.t, t0),
                        at(done, t0),
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
            /// A permit grant (which does not exclude the others).
            permits: bool,
            proc_: u32,
            key: &'a str,
        }
        let mut fair_waits: HashMap<&str, Vec<Wait<'_>>> = HashMap::new();
        for &(key, i) in &ok_of_attempt {
            let (Some(inv), h) = (invokes.get(&key), &holds[i]) else {
                continue;
            };
            // A grant, not a reentry, of a fair lock, by an attempt not cut short.
            if !inv.fair
                || inv.cancel
                || inv.op == Op::Reenter
                || h.att != key.1
                || h.proc_ != key.0
            {
                continue;
            }
            fair_waits.entry(h.lock).or_default().push(Wait {
                inv: inv.t,
                ok: h.ok,
                permits: h.mode.permits().is_some(),
                proc_: key.0,
                key: h.key,
            });
        }
        let mut seen: HashSet<(&str, &str)> = HashSet::new();
        let mut fair_locks: Vec<&str> = fair_waits.keys().copied().collect();
        fair_locks.sort_unstable();
        for lock in fair_locks {
            let mut waits = fair_waits.remove(lock).unwrap_or_default();
            waits.sort_by_key(|w| (w.inv, w.key));
            let holds_of_lock: &[usize] = by_lock.get(lock).map_or(&[], Vec::as_slice);
            for (pos, &ci) in holds_of_lock.iter().enumerate() {
                let c = &holds[ci];
                // C surely held the lock until its end or the next grant to someone
                // else, whichever came first (after an overlap the history's idea of
                // C's hold is not to be trusted further).
                let next = holds_of_lock[pos + 1..]
                    .iter()
                    .map(|&i| &holds[i])
                    .find(|b| b.ok > c.ok)
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
                        // Two permit grants one release admitted answer in either
                        // order: among them B's grant came first only if it answered
                        // a margin before A's.
                        let answer_margin = if a.permits && b.permits {
                            rules.permit_answer_margin_ns
                        } else {
                            0
                        };
                        if a.inv + rules.fair_margin_ns >= b.inv || b.ok + answer_margin >= a.ok {
                            continue;
                        }
                        if !seen.insert((a.key, b.key)) {
                            continue;
                        }
                        // A's own wait disturbed, or A's arrival at the store: a
                        // process paused or cut off mid-transaction keeps the rows
                        // its statements locked, and every statement that needs
                        // them (A's first, or one holding the pooled connection A
                        // waits for) waits with it, however early A was invoked.
                        // A's own connections broken by a fault that ended just
                        // before A's invoke are replaced when A first uses them:
                        // A's arrival may be late by that.
                        let own = proc_of(a.proc_);
                        // A's process stalled after A's invoke long enough that,
                        // without the stall, A would have been invoked within the
                        // margin of B: A's requests reached the store that late.
                        let lead = b.inv - a.inv;
                        // A pause of A's own process ending just before A's invoke
                        // likewise: the connections, keepalives and leases it let
                        // lapse are renewed when A first uses them.
                        let recovered_from = a.inv.saturating_sub(rules.fault_recovery_ns);
                        let disturbed = own.paused(recovered_from, a.ok)
                            || own.faulted(recovered_from, a.ok)
                            || own.stalled_for(a.inv, b.inv) + rules.fair_margin_ns >= lead
                            || {
                                let rec = proc_of(b.proc_);
                                rec.paused(a.inv, a.ok) || rec.faulted(a.inv, a.ok)
                            }
                            || procs
                                .values()
                                .any(|rec| rec.paused(a.inv, b.inv) || rec.faulted(a.inv, b.inv));
                        if disturbed {
                            fair.excused += 1;
                            continue;
                        }
                        fair.violation(lock, || {
                            // What each process went through from 2 s before A's
                            // invoke to A's grant, so that an example says whether
                            // a cut-off connection was being reopened when A
                            // arrived.
                            let mut near: Vec<(u32, String)> = procs
                                .iter()
                                .map(|(p, rec)| {
                                    (*p, rec.disturbances(a.inv, a.ok, 2_000_000_000, t0))
                                })
                                .collect();
                            near.sort_unstable();
                            let near: Vec<String> =
                                near.iter().map(|(p, d)| format!("p{p}: {d}")).collect();
                            format!(
                                "{lock}: {} arrived at {} and {} at {} while {} held it, but {} was granted first ({} vs {}); {}",
                                a.key,
                                at(a.inv, t0),
                                b.key,
                                at(b.inv, t0),
                                c.key,
                                b.key,
                                at(b.ok, t0),
                                at(a.ok, t0),
                                near.join("; ")
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
