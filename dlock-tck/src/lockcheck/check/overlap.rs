//! Rule 1, **overlap**: conflicting holds held at once, and a semaphore's permits
//! over its total.

use super::super::workload::SEMAPHORE_PERMITS;
use super::gather::Facts;
use super::{at, ClassResult, Rules};

/// Judges every lock's holds in ok order. A hold the store could have let go
/// before B's grant, held by a process that was not paused and not told, is a late
/// loss (rule 4), not an overlap: the result keeps the first such B per hold.
pub(super) fn judge(f: &Facts<'_>, rules: &Rules, overlap: &mut ClassResult) -> Vec<Option<usize>> {
    let (holds, t0) = (&f.holds, f.t0);
    let mut granted_over: Vec<Option<usize>> = vec![None; holds.len()];
    for lock in &f.locks {
        let mut active: Vec<usize> = Vec::new();
        for &bi in &f.by_lock[lock] {
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
                if f.ended_by_outage(rules, a, b.ok, a.end) {
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
    granted_over
}
