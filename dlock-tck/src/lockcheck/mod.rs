//! The lock-history checker's backend-neutral parts (DESIGN.md §9): the workload
//! worker processes run on a backend ([`workload`]), the fenced register they write
//! through ([`register`]), the histories they record ([`history`]), and the checker
//! that judges the histories ([`check`]) — overlap, stale writes, token order, late
//! losses, leaks, starvation and fair order. The processes' orchestration and the
//! server-side nemeses stay with the repository that runs the servers.

pub mod check;
pub mod history;
pub mod register;
pub mod workload;
