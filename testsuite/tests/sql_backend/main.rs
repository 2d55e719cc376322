//! What only the SQL backend promises, on every SQL database in `DLOCK_TEST_BACKENDS`:
//! fencing across a deleted row, the name-length limit, semaphores across the
//! schema's upgrade, PostgreSQL's push wake-up, and behaviour while the database is
//! unreachable (through the fault proxy).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod commit;
mod faults;
mod fixtures;
mod leases;
mod notices;
mod permits;
mod pooler;
mod queue;
mod session;
mod tls;
