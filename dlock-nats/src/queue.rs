//! Whose turn it is: the contenders of a lock in token order, and what a contender
//! waits for.
//!
//! A writer holds when no live contender came before it; a reader when no live
//! writer (or permits) came before it — so a waiting writer keeps later readers
//! out and is never starved; permits when only permits came before it and all of
//! them, its own included, fit in the total. Fair by construction: non-fair
//! requests get the same order.
//!
//! Every contender present counts: one whose lease ran out is claimed and deleted
//! first ([`crate::lease`]), and counts no more once its deletion is read.

use std::collections::BTreeMap;

use crate::feed::Seen;

/// What a look at a lock's contenders says about one of them.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Turn {
    /// It holds.
    Holds,
    /// It waits for `blockers` (keys of live contenders ahead, the soonest lease end
    /// first).
    Waits {
        /// The keys it waits for.
        blockers: Vec<String>,
    },
    /// Its key is not there (removed behind its back, or never placed).
    Gone,
    /// A permit request naming another total than the semaphore's oldest live
    /// contender's (that total).
    TotalDiffers(u32),
}

/// The turn of contender `me` among `entries`.
pub(crate) fn turn(entries: &BTreeMap<String, Seen>, me: &str) -> Turn {
    let Some(mine) = entries.get(me) else {
        return Turn::Gone;
    };
    let my_token = mine.token();
    let ahead: Vec<(&String, &Seen)> = entries
        .iter()
        .filter(|(k, e)| e.token() < my_token && k.as_str() != me)
        .collect();
    if mine.parts.side == 's' {
        let oldest = entries
            .values()
            .filter(|e| e.parts.side == 's')
            .min_by_key(|e| e.token());
        if let Some(oldest) = oldest {
            if oldest.stored.total != mine.stored.total {
                return Turn::TotalDiffers(oldest.stored.total);
            }
        }
    }
    let conflicts = |e: &Seen| match mine.parts.side {
        'r' => e.parts.side != 'r',
        _ => true,
    };
    let mut blockers: Vec<(&String, &Seen)> = match mine.parts.side {
        's' if ahead.iter().all(|(_, e)| e.parts.side == 's') => {
            let taken: u64 = ahead
                .iter()
                .map(|(_, e)| u64::from(e.stored.permits))
                .sum::<u64>()
                + u64::from(mine.stored.permits);
            if taken <= u64::from(mine.stored.total) {
                Vec::new()
            } else {
                ahead
            }
        }
        _ => ahead.into_iter().filter(|(_, e)| conflicts(e)).collect(),
    };
    if blockers.is_empty() {
        return Turn::Holds;
    }
    blockers.sort_by_key(|(_, e)| e.expires_ns());
    Turn::Waits {
        blockers: blockers.into_iter().map(|(k, _)| k.clone()).collect(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;

    use super::*;
    use crate::keys::{KeyParts, Stored};

    fn seen(side: char, revision: u64, written_ns: i128, permits: u32, total: u32) -> Seen {
        Seen {
            parts: KeyParts {
                name: "l".into(),
                side,
                holder: format!("o#{revision}"),
            },
            revision,
            written_ns,
            stored: Stored {
                lease: Duration::from_nanos(100),
                token: 0,
                permits,
                total,
                context: Bytes::new(),
            },
        }
    }

    fn queue(list: &[Seen]) -> BTreeMap<String, Seen> {
        list.iter()
            .map(|e| (format!("k{}", e.revision), e.clone()))
            .collect()
    }

    #[test]
    fn writers_wait_for_all_ahead_readers_for_writers_only() {
        let q = queue(&[
            seen('r', 1, 0, 0, 0),
            seen('w', 2, 0, 0, 0),
            seen('r', 3, 0, 0, 0),
        ]);
        assert_eq!(turn(&q, "k1"), Turn::Holds);
        assert_eq!(
            turn(&q, "k2"),
            Turn::Waits {
                blockers: vec!["k1".into()]
            }
        );
        assert_eq!(
            turn(&q, "k3"),
            Turn::Waits {
                blockers: vec!["k2".into()]
            }
        );
        assert_eq!(turn(&q, "k9"), Turn::Gone);
    }

    #[test]
    fn a_contender_ahead_blocks_however_old_until_its_deletion_is_read() {
        let mut q = queue(&[seen('w', 1, 0, 0, 0), seen('w', 2, 90, 0, 0)]);
        assert_eq!(
            turn(&q, "k2"),
            Turn::Waits {
                blockers: vec!["k1".into()]
            }
        );
        q.remove("k1");
        assert_eq!(turn(&q, "k2"), Turn::Holds);
    }

    #[test]
    fn permits_hold_while_they_fit_and_totals_must_agree() {
        let q = queue(&[
            seen('s', 1, 0, 2, 3),
            seen('s', 2, 0, 1, 3),
            seen('s', 3, 0, 1, 3),
        ]);
        assert_eq!(turn(&q, "k2"), Turn::Holds);
        assert_eq!(
            turn(&q, "k3"),
            Turn::Waits {
                blockers: vec!["k1".into(), "k2".into()]
            }
        );
        let q = queue(&[seen('s', 1, 0, 1, 3), seen('s', 2, 0, 1, 4)]);
        assert_eq!(turn(&q, "k2"), Turn::TotalDiffers(3));
    }
}
