//! Rule 6, **starvation**: an exclusive wait refused while the lock was free for
//! longer than the slack — conservative on purpose (see the rule in the module docs
//! of the checker).

use std::collections::HashMap;

use super::gather::Facts;
use super::{at, ClassResult, Invoke, Mode, Op, Rules, Why};

/// Judges each exclusive wait that ended without the lock against the free
/// stretches of its lock.
pub(super) fn judge(f: &Facts<'_>, rules: &Rules, starvation: &mut ClassResult) {
    let long_gaps = free_stretches(f, rules);
    let unoccupied = [(0, u64::MAX)];
    let mut waits: Vec<(&(u32, u64), &Invoke<'_>)> = f.invokes.iter().collect();
    waits.sort_by_key(|(k, i)| (i.t, **k));
    for (key, inv) in waits {
        // A multi-lock's or an upgradeable read's member may be refused for another
        // member's sake.
        if inv.mode != Mode::Exclusive
            || inv.cancel
            || matches!(inv.op, Op::Reenter | Op::Multi | Op::Upgradeable)
        {
            continue;
        }
        let Some(&(done, Some(why @ (Why::None | Why::Timeout)))) = f.results.get(key) else {
            continue;
        };
        let rec = f.proc_of(key.0);
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
        // Only the first two and the last gap overlapping the wait can be cut by it;
        // any between lie wholly inside (and are long).
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
                    at(inv.t, f.t0),
                    at(done, f.t0),
                    longest as f64 / 1e6
                )
            });
        }
    }
}

/// Per lock, in time order, the stretches longer than the slack in which nothing
/// occupied it: no hold (until the store confirmed its release, or else what the
/// store may keep hidden), no attempt that may have been granted unseen.
fn free_stretches<'a>(f: &Facts<'a>, rules: &Rules) -> HashMap<&'a str, Vec<(u64, u64)>> {
    let hidden = rules.hidden_hold_ns;
    let mut occupied: HashMap<&str, Vec<(u64, u64)>> = HashMap::new();
    for h in &f.holds {
        let rec = f.proc_of(h.proc_);
        let end = match h.confirmed_free_at() {
            // The store said it was released: free from then on.
            Some(freed) => freed.max(h.end),
            // Dropped, unlock cancelled or failed, lost, killed: the store may keep it
            // until its lease or session runs out.
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
    for (key, inv) in &f.invokes {
        let rec = f.proc_of(key.0);
        let result = f.results.get(key);
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
    long_gaps
}
