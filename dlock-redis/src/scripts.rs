//! The Lua scripts. Each runs atomically on the server, judges time by the server's
//! `TIME`, and touches only the keys of one lock (one Cluster slot).
//!
//! The hot paths — a non-fair exclusive acquire, an exclusive release, an exclusive
//! renewal, a permit's grant in the plain case — have lean scripts of their own,
//! written inline (no helper closures, no string building: a server call inside a
//! script costs about as much as the whole rest of the script) and declaring only
//! the keys they touch (each key and argument sent costs the server and client
//! too); fair and shared modes go through the general scripts, and so do a permit's
//! other cases (its lean script answers nil, having written nothing, and the client
//! sends the general one). The shared release's plain case is a fast part in front
//! of its general script instead: a release is sent once, whatever its case.
//!
//! The exclusive key is one string, `<owner length>|<owner><context>` (built by the
//! client), with `PX` = the lease so the server expires it; while readers hold the
//! lock it is `R` (expiring with the last reader). The fencing counter is a separate
//! key that never expires and advances only on a grant — so while a writer holds the
//! lock, the counter *is* the writer's token and the holder value need not carry it.
//!
//! Waiters — fair or not, told or polling — queue (a sorted set by the server's
//! clock, with a liveness deadline each that their re-checks refresh), so a release
//! deals with one waiter, the queue's live head, and with nobody when the queue is
//! empty. **A release hands the lock over**: when the head is a writer and the lock
//! is free, the release grants it to the head in the same script (its holder value,
//! stored with its queue entry, a provisional lease of the head's remaining liveness,
//! the next fencing token) and tells it the token; the head holds from that notice
//! on, and its first renewal extends the lease. A head that died meanwhile holds the
//! lock for at most its liveness. A reader (or permit) head is only told. Fair mode
//! also makes everyone else wait for the head; non-fair mode lets whoever asks first
//! take a free lock (barging) — with writers queued, a release leaves it free only
//! for a reader head. In both modes new readers stand back for a writer queued before
//! them.

/// Helper fragments for the general scripts; each includes only the ones it uses
/// (Lua re-creates every local function on each call).
const H_CLOCK: &str = include_str!("scripts/h_clock.lua");
const H_HOLDER: &str = include_str!("scripts/h_holder.lua");
const H_NEXT_TOKEN: &str = include_str!("scripts/h_next_token.lua");
const H_PURGE_READERS: &str = include_str!("scripts/h_purge_readers.lua");
/// The readers' horizon, set and cleared: ahead of every script that has readers
/// (and of the shared release's fast path, ahead of its other helpers).
const H_HORIZON: &str = include_str!("scripts/h_horizon.lua");
const H_READER_HORIZON: &str = include_str!("scripts/h_reader_horizon.lua");
const H_PURGE_QUEUE: &str = include_str!("scripts/h_purge_queue.lua");
const H_QUEUE: &str = include_str!("scripts/h_queue.lua");
const H_NOTIFY: &str = include_str!("scripts/h_notify.lua");
const H_ANNOUNCE: &str = include_str!("scripts/h_announce.lua");
const H_RESERVED: &str = include_str!("scripts/h_reserved.lua");
const H_TIME_LEFT: &str = include_str!("scripts/h_time_left.lua");

/// Non-fair exclusive acquire. KEYS: exclusive, fence, and — unless waiting is 0,
/// when they are not declared — queue, queue liveness, queue modes. ARGV: holder
/// value (`<owner length>|<owner><context>`), lease ms, and — unless waiting is 0,
/// when they are not sent — waiting (1 queue if refused, 3 already queued), liveness
/// ms, notice channel (empty when polling). Returns the bare token (a free lock
/// granted at once), {1, token} (a queued waiter's grant, reentry) or {0, ms left,
/// queued, waiters ahead, the fencing counter} (a waiter told of a hand-over with a
/// token no greater than the counter its last refusal saw knows that hand-over
/// lapsed before that refusal).
///
/// A free lock is granted in three server calls (`SET NX PX`, then `TIME` and `SET
/// GET` for the token), answered with the bare token, and returns before the helpers
/// of [`ACQUIRE_EXCLUSIVE_TAIL`] are even created.
const ACQUIRE_EXCLUSIVE: &str = include_str!("scripts/acquire_exclusive.lua");
/// The non-fair exclusive acquire's tail, after its helpers: a queued waiter's grant,
/// reentry (which also confirms a lock a release handed over to this waiter), or a
/// refusal.
const ACQUIRE_EXCLUSIVE_TAIL: &str = include_str!("scripts/acquire_exclusive_tail.lua");

/// Exclusive release. KEYS: exclusive, queue, queue liveness, queue modes,
/// observers, readers, reader data, fence. ARGV: owner part of the holder value, and
/// `1` for a leadership (its observers are told). Returns 1 if released, 0 if not
/// the owner.
/// With nobody waiting (the common case) it is `GET`, `DEL`, `EXISTS` and returns
/// before the helpers of [`RELEASE_EXCLUSIVE_NOTIFY`] are even created.
const RELEASE_EXCLUSIVE: &str = include_str!("scripts/release_exclusive.lua");
/// The exclusive release's tail, after its helpers: the owner's own readers stay
/// (a downgrade: their horizon keeps writers out), or someone waits: a writer at the
/// head is handed the lock, anyone else is told (see `notify`). A leadership's
/// observers hear of it after the hand-over, so they see the new leader.
const RELEASE_EXCLUSIVE_NOTIFY: &str = include_str!("scripts/release_exclusive_notify.lua");

/// Exclusive renewal. KEYS: exclusive, observers, readers, reader data. ARGV: owner part of the holder
/// value, lease ms, and optionally a new holder value (same owner part, new context:
/// a leader proclaiming). A plain renewal (the watchdog's) is `GET` and `PEXPIRE`
/// and returns before the helpers of [`RENEW_EXCLUSIVE_PROCLAIM`] are created.
const RENEW_EXCLUSIVE: &str = include_str!("scripts/renew_exclusive.lua");
/// The exclusive renewal's tail, after its helpers: a proclaimed value, stored with
/// the renewed lease and announced to the observers; the owner's own readers beside
/// the writer keep it at least as long as they last (their horizon).
const RENEW_EXCLUSIVE_PROCLAIM: &str = include_str!("scripts/renew_exclusive_proclaim.lua");

/// The permits' fast path, a lean script of its own (the client sends it first,
/// and the general [`ACQUIRE`] only when it answers nil): with nobody queued, the
/// name free or held by permit holders only, all of them live, of the same total
/// and leaving room, and this owner not among them (a retried grant), it grants as
/// [`ACQUIRE`] would, and answers the bare token. It declares 5 keys and sends 5
/// arguments (the general script: 8 and 12), writes nothing unless it grants, and
/// builds no helper function.
/// One `EXISTS` of the queue and the name together tells an idle semaphore (both
/// absent: no live holder either, as the horizon lasts through the last holder's
/// last ms; the holders' keys, a ms longer, may still hold lapsed entries, which
/// the next general path purges), which takes 8 server calls (`EXISTS`, `TIME`, the
/// horizon's `SET PXAT`, the token's `SET … GET`, `ZADD`, `HSET` and two
/// `PEXPIREAT`); beside other holders, 11 (the name and the holders read, their
/// counts read, the horizon moved) — instead of [`ACQUIRE`]'s 14.
/// KEYS: exclusive, readers, reader data, fence, queue (the first 5 of
/// [`ACQUIRE`]'s). ARGV: owner, lease ms, context, how many, the semaphore's total.
const ACQUIRE_PERMITS_FAST: &str = include_str!("scripts/acquire_permits_fast.lua");

/// The general acquire: fair mode (exclusive or shared), non-fair shared (a
/// non-fair exclusive acquire always goes through [`ACQUIRE_EXCLUSIVE`]) and
/// permits (a queued waiter's, or one [`ACQUIRE_PERMITS_FAST`] did not grant). KEYS: exclusive, readers, reader data, fence, queue, queue liveness,
/// queue modes, observers. ARGV: owner, mode (x|s|p), lease ms, holder value, fair
/// (1|0), waiting (as [`ACQUIRE_EXCLUSIVE`]), liveness ms, notice channel, context,
/// `1` for a leadership (a grant is announced to its observers), and for permits
/// how many and the semaphore's total — for the other modes, optionally the holder
/// key of the owner's own hold in the other mode that this request goes beside
/// (a writer reading, an upgrade): it never blocks the request, which queues first. Returns {1, token}, {0, ms left, queued,
/// waiters ahead, the fencing counter}, or {-1, the semaphore's total} when the total asked for differs
/// from the one of its holders.
///
/// Permit holders are readers (same sorted set and data hash, so the exclusive key
/// is `R` while they hold) with their count in `p:<owner>` and the total in
/// `#total` of the data hash (gone with the last holder: a semaphore's total can
/// change once nobody holds it). They are served in arrival order, fair or not: a
/// request for many is not starved by requests for few.
const ACQUIRE: &str = include_str!("scripts/acquire.lua");

/// The shared release's fast path, ahead of [`RELEASE_SHARED`]'s helpers (one
/// script, so a release the plain case cannot take costs no second round trip):
/// with nobody queued (nobody to tell) and every holder live, the holder leaves and
/// the horizon follows the others — 9 server calls instead of 12. The last holder's
/// release is 4 (`EXISTS`, `ZRANGE`, `GET`, one `DEL` of the name and the holders'
/// keys): a sole holder found under the horizon (`R`) is live, since the horizon
/// ends with the last holder's last ms (`set_horizon`), so it needs no clock.
/// Anything else (a lapsed holder to purge, a queue, a holder not found, a writer's
/// value beside its owner's own sole reader) falls through, having written nothing.
/// KEYS and ARGV: as [`RELEASE_SHARED`].
const RELEASE_SHARED_FAST: &str = include_str!("scripts/release_shared_fast.lua");

/// Shared (or permits) release, after [`RELEASE_SHARED_FAST`]. KEYS: as ACQUIRE.
/// ARGV: owner. The queue's head is told when the last reader leaves,
/// and whenever permits come back.
const RELEASE_SHARED: &str = include_str!("scripts/release_shared.lua");

/// Shared (or permits) renewal. KEYS: as ACQUIRE. ARGV: owner, lease ms, optionally a new context.
const RENEW_SHARED: &str = include_str!("scripts/renew_shared.lua");

/// Leaves the queue (a waiter that gave up or was cancelled). KEYS: as ACQUIRE.
/// ARGV: owner. A lock a release handed over to it (which it never took up: it is
/// leaving) is freed; if it was the head or held the lock so, and the lock is free or
/// held by readers, the new head is dealt with (handed the lock, or told: a reader
/// behind a writer that left may join the readers), and an election's observers
/// hear of a change of holder.
const LEAVE: &str = include_str!("scripts/leave.lua");

/// Returns {x owner, x token, x context, x ms left, waiters, then per reader or
/// permit holder: owner, token, context, ms left, permits (0 for a reader)}.
/// KEYS: as ACQUIRE.
const INSPECT: &str = include_str!("scripts/inspect.lua");

/// Removes every hold (not the fence) and deals with the queue's head as a release
/// does; returns the number of holds removed. KEYS: as ACQUIRE.
const FORCE_RELEASE: &str = include_str!("scripts/force_release.lua");

/// Registers (or refreshes) an observer of an election. KEYS: observers. ARGV:
/// "<observer id> <notice channel>", liveness ms.
const OBSERVE: &str = include_str!("scripts/observe.lua");

/// Compiled scripts (loaded once per server, then run by SHA).
pub(crate) struct Scripts {
    pub(crate) acquire_exclusive: redis::Script,
    pub(crate) release_exclusive: redis::Script,
    pub(crate) renew_exclusive: redis::Script,
    pub(crate) acquire: redis::Script,
    pub(crate) acquire_permits_fast: redis::Script,
    pub(crate) release_shared: redis::Script,
    pub(crate) renew_shared: redis::Script,
    pub(crate) leave: redis::Script,
    pub(crate) inspect: redis::Script,
    pub(crate) force_release: redis::Script,
    pub(crate) observe: redis::Script,
    /// [`RENEW_BATCH`].
    pub(crate) renew_batch: redis::Script,
    /// The Cluster's batch script ([`RENEW_BATCH_CLUSTER`]).
    pub(crate) renew_batch_cluster: redis::Script,
}

/// Each script's full source: its helpers, then its body.
fn sources() -> [String; 11] {
    let all: &[&str] = &[
        H_CLOCK,
        H_HOLDER,
        H_NEXT_TOKEN,
        H_PURGE_READERS,
        H_READER_HORIZON,
        H_PURGE_QUEUE,
        H_QUEUE,
        H_NOTIFY,
        H_RESERVED,
        H_TIME_LEFT,
        H_ANNOUNCE,
    ];
    // The scripts with readers: the horizon's helpers first, for a fast part too.
    let with = |body: &str| format!("{H_HORIZON}{}\n{body}", all.concat());
    let shared_lean = |fast: &str, body: &str| format!("{H_HORIZON}{fast}{}\n{body}", all.concat());
    // A lean script: its fast part, then the helpers only its slow part uses.
    let lean =
        |fast: &str, helpers: &[&str], tail: &str| format!("{fast}{}{tail}", helpers.concat());
    [
        lean(
            ACQUIRE_EXCLUSIVE,
            &[H_CLOCK, H_NEXT_TOKEN, H_QUEUE, H_TIME_LEFT],
            ACQUIRE_EXCLUSIVE_TAIL,
        ),
        lean(
            RELEASE_EXCLUSIVE,
            &[
                H_HORIZON,
                H_CLOCK,
                H_NEXT_TOKEN,
                H_PURGE_READERS,
                H_READER_HORIZON,
                H_PURGE_QUEUE,
                H_QUEUE,
                H_NOTIFY,
                H_ANNOUNCE,
            ],
            RELEASE_EXCLUSIVE_NOTIFY,
        ),
        lean(
            RENEW_EXCLUSIVE,
            &[
                H_HORIZON,
                H_CLOCK,
                H_PURGE_READERS,
                H_READER_HORIZON,
                H_ANNOUNCE,
            ],
            RENEW_EXCLUSIVE_PROCLAIM,
        ),
        with(ACQUIRE),
        ACQUIRE_PERMITS_FAST.to_owned(),
        shared_lean(RELEASE_SHARED_FAST, RELEASE_SHARED),
        with(RENEW_SHARED),
        with(LEAVE),
        with(INSPECT),
        with(FORCE_RELEASE),
        OBSERVE.to_owned(),
    ]
}

impl Scripts {
    pub(crate) fn new() -> Self {
        let [ax, rx, nx, a, ap, rs, ns, l, i, f, o] = sources().map(|src| redis::Script::new(&src));
        Scripts {
            acquire_exclusive: ax,
            release_exclusive: rx,
            renew_exclusive: nx,
            acquire: a,
            acquire_permits_fast: ap,
            release_shared: rs,
            renew_shared: ns,
            leave: l,
            inspect: i,
            force_release: f,
            observe: o,
            renew_batch: redis::Script::new(RENEW_BATCH),
            renew_batch_cluster: redis::Script::new(RENEW_BATCH_CLUSTER),
        }
    }
}

/// The most holds one script call renews: a script runs alone on the server, so a
/// batch of thousands is sent as several calls (pipelined) rather than one that
/// holds every other client up for milliseconds.
pub(crate) const MAX_PER_CALL: usize = 200;

/// The batch script. KEYS: per hold, its exclusive key and its readers key. ARGV: per
/// hold, the owner part of its holder value and the lease in ms (so hold *i* has
/// `KEYS[2i-1], KEYS[2i]` and `ARGV[2i-1], ARGV[2i]`). Answers per hold: 0 — not the
/// holder; 1 — renewed; 2 — readers are beside the writer (its owner's own: a writer
/// reading, an upgrade), whose horizon the single renewal keeps in the same step, so
/// nothing is written here and the client sends that renewal. Only a renewal writes.
/// (Kept beside the other scripts; `crate::renew_batch` sends it.)
pub(crate) const RENEW_BATCH: &str = include_str!("scripts/renew_batch.lua");

/// The Cluster's batch script (Redis 7 and later: it is flagged to reach keys of
/// many slots). ARGV: per hold, its exclusive key, its readers key, the owner part
/// of its holder value and the lease in ms; no key declared. Answers per hold as
/// [`RENEW_BATCH`] does, or 3 — this node does not serve the hold's keys, nothing
/// done. (`crate::cluster_batch` sends it.)
pub(crate) const RENEW_BATCH_CLUSTER: &str = include_str!("scripts/renew_batch_cluster.lua");

#[cfg(test)]
mod tests {
    use super::*;

    /// Redis reports an undefined helper only when the line runs, so check up front
    /// that every helper a script calls is defined in that script.
    #[test]
    fn every_script_defines_the_helpers_it_calls() {
        let helpers = [
            "clock",
            "holder",
            "next_token",
            "holder_token",
            "enqueue",
            "dequeue",
            "purge_readers",
            "reader_horizon",
            "set_horizon",
            "clear_horizon",
            "purge_queue",
            "notify",
            "queued_as",
            "tell",
            "reserved_for_other",
            "time_left",
            "announce",
        ];
        for (n, src) in sources().iter().enumerate() {
            for h in helpers {
                let defined = src.contains(&format!("local function {h}("));
                let calls = src.matches(&format!("{h}(")).count();
                let used = calls > usize::from(defined);
                assert!(
                    !used || defined,
                    "script #{n} calls {h} without defining it"
                );
            }
        }
    }
}
