//! The checker's rules for one of this repository's backend labels: what each
//! store may keep after its holders are gone, and for how long (the kit's
//! [`Rules`] is backend-neutral; the labels' knowledge is here).

use dlock_tck::lockcheck::check::Rules;

fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// How long an in-process store may keep a hold no history shows.
const IN_PROCESS_RELEASE_NS: u64 = 200_000_000;

/// The rules for a backend label, from the backends' own defaults: an in-process
/// store hears of every release at once; ZooKeeper holds live as long as the
/// session (its default session timeout), the others by lease; a Redis queue lapses twice the waiter liveness after its last refresh
/// (`dlock-redis` scripts). (A URL that sets another `session_timeout` is not
/// looked at.)
pub fn rules_for(label: &str) -> Rules {
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
