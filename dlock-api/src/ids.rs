//! Maps keyed by the manager's own ids ([`crate::DistributeLockManager`]'s counter:
//! holds, watchdog entries), hashed by one multiplication instead of SipHash.
//!
//! The keys are numbers the manager hands out itself, never input an attacker
//! chooses, so a keyed hash's resistance to collision floods buys nothing here; on
//! the hot path every acquire and release inserts or removes in two such maps. The
//! multiplier (Fibonacci hashing, as FxHash) spreads sequential ids over the high
//! bits, which the map's probing reads first.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A map from a manager id to `V`.
pub(crate) type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// A new, empty [`IdMap`].
pub(crate) fn id_map<V>() -> IdMap<V> {
    HashMap::with_hasher(BuildHasherDefault::default())
}

/// The hasher of [`IdMap`]: the id times an odd constant (2^64 / φ).
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `u64` keys are hashed here; any other input is folded in a byte at
        // a time (correct, if slow).
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, id: u64) {
        self.0 = (self.0.rotate_left(5) ^ id).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_ids_spread_over_the_high_bits() {
        let tops: std::collections::HashSet<u64> = (0..128u64)
            .map(|id| {
                let mut h = IdHasher::default();
                h.write_u64(id);
                h.finish() >> 57
            })
            .collect();
        // 128 sequential ids land on most of the 128 top-7-bit values (the map's
        // control bytes), not on a few.
        assert!(tops.len() > 64, "{}", tops.len());
    }

    #[test]
    fn a_map_keeps_what_it_is_given() {
        let mut map = id_map();
        for id in 0..1000u64 {
            map.insert(id, id * 2);
        }
        assert!((0..1000u64).all(|id| map.get(&id) == Some(&(id * 2))));
        assert_eq!(map.remove(&7), Some(14));
        assert_eq!(map.len(), 999);
    }
}
