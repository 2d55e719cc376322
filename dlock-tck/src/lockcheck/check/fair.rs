//! Rule 7, **fair-order**: on a fair lock, a waiter that arrived a margin after
//! another, while a third held the lock, granted a margin before it.

use std::collections::{HashMap, HashSet};

use super::gather::Facts;
use super::{at, ClassResult, Hold, Op, Rules};

/// A fair lock's grant, by the attempt that waited for it.
struct Wait<'a> {
    inv: u64,
    ok: u64,
    /// A permit grant (which does not exclude the others).
    permits: bool,
    proc_: u32,
    key: &'a str,
}

/// Judges, for each hold C of a fair lock, the order in which the waits that
/// arrived while C surely held it were granted.
pub(super) fn judge(f: &Facts<'_>, rules: &Rules, fair: &mut ClassResult) {
    let mut fair_waits = waits(f);
    let mut seen: HashSet<(&str, &str)> = HashSet::new();
    let mut fair_locks: Vec<&str> = fair_waits.keys().copied().collect();
    fair_locks.sort_unstable();
    for lock in fair_locks {
        let mut waits = fair_waits.remove(lock).unwrap_or_default();
        waits.sort_by_key(|w| (w.inv, w.key));
        let holds_of_lock: &[usize] = f.by_lock.get(lock).map_or(&[], Vec::as_slice);
        for (pos, &ci) in holds_of_lock.iter().enumerate() {
            let c = &f.holds[ci];
            // C surely held the lock until its end or the next grant to someone
            // else, whichever came first (after an overlap the history's idea of C's
            // hold is not to be trusted further).
            let next = holds_of_lock[pos + 1..]
                .iter()
                .map(|&i| &f.holds[i])
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
                    // Two permit grants one release admitted answer in either order:
                    // among them B's grant came first only if it answered a margin
                    // before A's.
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
                    if disturbed(f, rules, a, b) {
                        fair.excused += 1;
                        continue;
                    }
                    fair.violation(lock, || example(f, lock, a, b, c));
                }
            }
        }
    }
}

/// The grants, not reentries, of fair locks, by attempts not cut short.
fn waits<'a>(f: &Facts<'a>) -> HashMap<&'a str, Vec<Wait<'a>>> {
    let mut fair_waits: HashMap<&str, Vec<Wait<'_>>> = HashMap::new();
    for &(key, i) in &f.ok_of_attempt {
        let (Some(inv), h) = (f.invokes.get(&key), &f.holds[i]) else {
            continue;
        };
        if !inv.fair || inv.cancel || inv.op == Op::Reenter || h.att != key.1 || h.proc_ != key.0 {
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
    fair_waits
}

/// Whether A's wait was disturbed, or A's arrival at the store: a process paused or
/// cut off mid-transaction keeps the rows its statements locked, and every
/// statement that needs them (A's first, or one holding the pooled connection A
/// waits for) waits with it, however early A was invoked. A's own connections
/// broken by a fault that ended just before A's invoke are replaced when A first
/// uses them: A's arrival may be late by that.
fn disturbed(f: &Facts<'_>, rules: &Rules, a: &Wait<'_>, b: &Wait<'_>) -> bool {
    let own = f.proc_of(a.proc_);
    // A's process stalled after A's invoke long enough that, without the stall, A
    // would have been invoked within the margin of B: A's requests reached the
    // store that late.
    let lead = b.inv - a.inv;
    // A pause of A's own process ending just before A's invoke likewise: the
    // connections, keepalives and leases it let lapse are renewed when A first uses
    // them.
    let recovered_from = a.inv.saturating_sub(rules.fault_recovery_ns);
    own.paused(recovered_from, a.ok)
        || own.faulted(recovered_from, a.ok)
        || own.stalled_for(a.inv, b.inv) + rules.fair_margin_ns >= lead
        || {
            let rec = f.proc_of(b.proc_);
            rec.paused(a.inv, a.ok) || rec.faulted(a.inv, a.ok)
        }
        || f.procs
            .values()
            .any(|rec| rec.paused(a.inv, b.inv) || rec.faulted(a.inv, b.inv))
}

/// A violation's example: what each process went through from 2 s before A's
/// invoke to A's grant, so that it says whether a cut-off connection was being
/// reopened when A arrived.
fn example(f: &Facts<'_>, lock: &str, a: &Wait<'_>, b: &Wait<'_>, c: &Hold<'_>) -> String {
    let t0 = f.t0;
    let mut near: Vec<(u32, String)> = f
        .procs
        .iter()
        .map(|(p, rec)| (*p, rec.disturbances(a.inv, a.ok, 2_000_000_000, t0)))
        .collect();
    near.sort_unstable();
    let near: Vec<String> = near.iter().map(|(p, d)| format!("p{p}: {d}")).collect();
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
}
