//! Rule 4, **late-loss**: a hold told of its loss after the store could let it go;
//! and the loss margins.

use super::at;
use super::gather::Facts;
use super::ClassResult;

/// What the late-loss rule found beside its violations.
pub(super) struct Margins {
    /// The loss margins (ms): min, median and count.
    pub(super) margins_ms: Option<(f64, f64, usize)>,
    /// Late signals excused because the process stalled while they were due.
    pub(super) in_stalls: usize,
}

/// Judges each hold lost while held, and each hold `granted_over` (from rule 1)
/// names a grant over.
pub(super) fn judge(
    f: &Facts<'_>,
    granted_over: &[Option<usize>],
    late: &mut ClassResult,
) -> Margins {
    let (holds, t0) = (&f.holds, f.t0);
    let mut margins: Vec<f64> = Vec::new();
    let mut in_stalls = 0;
    for lock in &f.locks {
        let list = &f.by_lock[lock];
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
            let rec = f.proc_of(a.proc_);
            if late_signal && rec.paused(a.proof_before(told), told) {
                late.excused += 1;
                continue;
            }
            // A process whose timers fired late when the signal was due (from a third
            // of the hold's life before valid-until, the margin's cap, to the signal)
            // was as good as paused: it could not be told in time.
            let due_from = valid_until.saturating_sub(a.life / 3);
            if late_signal && rec.stalled(due_from, told) {
                in_stalls += 1;
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
    Margins {
        margins_ms: (!margins.is_empty())
            .then(|| (margins[0], margins[margins.len() / 2], margins.len())),
        in_stalls,
    }
}
