//! What only the Redis backend promises, when `redis` is in `DLOCK_TEST_BACKENDS`:
//! replica acknowledgement, skipping dead fair waiters, and behaviour through an
//! outage (via the project's loopback fault proxy).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod clients;
mod faults;
mod fencing;
mod fixtures;
mod handover;
mod notices;
mod queue;
mod readers;
mod renewal;
