//! Runs every conformance case on each backend named in `DLOCK_TEST_BACKENDS`
//! (default `memory`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use testsuite::{conformance, runner};

macro_rules! cases {
    ($($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                runner::run(stringify!($case), |b| Box::pin(conformance::$case(b))).await;
            }
        )*

        #[test]
        fn every_case_is_run() {
            let run: &[&str] = &[$(stringify!($case)),*];
            assert_eq!(run, conformance::CASES);
        }
    };
}

cases!(
    mutual_exclusion,
    try_lock_wait_is_bounded,
    explicit_lease_expires,
    watchdog_keeps_lock,
    lost_signal_when_stolen,
    fencing_tokens_increase,
    reentrancy_counts,
    only_owner_releases,
    drop_releases,
    cancelled_lock_leaves_nothing,
    fair_mode_grants_in_order,
    release_wakes_one,
    shared_mode,
    hostile_names_are_distinct_or_refused,
    bad_arguments_are_refused,
    close_releases_everything,
    drop_then_relock,
    cancel_during_unlock,
    cancel_at_random_points,
    a_long_wait_grants_a_live_hold,
    a_leaving_writer_lets_readers_in,
    one_leader_at_a_time,
    leadership_moves_on,
    observers_see_every_change_in_order,
    contenders_hand_over_without_overlap,
    a_leader_in_transition_keeps_its_term,
    semaphore_permits_never_exceed_the_total,
    semaphore_serves_in_order_and_recovers_dead_permits,
    semaphore_totals_must_agree,
    semaphore_watchdog_keeps_permits,
);
