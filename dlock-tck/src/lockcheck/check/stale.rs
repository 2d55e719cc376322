//! Rule 2, **stale-write**: the register accepted a write of a hold after a newer
//! conflicting grant of another owner.

use std::collections::HashMap;

use super::gather::Facts;
use super::{at, ClassResult, Rules};

/// Judges each accepted write against the grants made before it.
pub(super) fn judge(f: &Facts<'_>, rules: &Rules, stale: &mut ClassResult) {
    let (holds, t0) = (&f.holds, f.t0);
    // Per lock, the highest token granted so far (by ok time).
    let mut max_token: HashMap<&str, Vec<u64>> = HashMap::new();
    for lock in &f.locks {
        let mut m = 0;
        let maxes = f.by_lock[lock]
            .iter()
            .map(|&i| {
                m = m.max(holds[i].token);
                m
            })
            .collect();
        max_token.insert(lock, maxes);
    }
    for &(t, lock, ai) in &f.writes {
        let a = &holds[ai];
        let list = &f.by_lock[lock];
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
        if (a.pause_from_ok <= t && b.ok >= a.valid_until(b.ok))
            || f.ended_by_outage(rules, a, b.ok, t)
        {
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
}
