//! Rule 3, **token-order**: one token per grant, and each grant's above the
//! earlier conflicting ones.

use std::collections::HashMap;

use super::super::history::Mode;
use super::gather::Facts;
use super::{at, ClassResult, Op, TopByOwner};

/// Tokens are unique per grant on every backend (shared grants included), whatever
/// the timing — but for one owner's read beside its write, which may go on with the
/// write's token (ZooKeeper's placed read); the order is judged on `ok` times,
/// against the other owners' grants.
pub(super) fn judge(f: &Facts<'_>, token_order: &mut ClassResult) {
    for lock in &f.locks {
        let mut top_all = TopByOwner::default();
        let mut top_exclusive = TopByOwner::default();
        let mut seen: HashMap<u64, (&str, &str)> = HashMap::new();
        for &i in &f.by_lock[lock] {
            let h = &f.holds[i];
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
            let upgrade = f
                .invokes
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
                            at(h.ok, f.t0)
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
}
