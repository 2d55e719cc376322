//! What a lock-history run needs to know of the store under test beyond the SPI:
//! where it is, how to open it in a worker process, what the checker may allow
//! it ([`Rules`]), which faults apply, and — if the backend's test can do it —
//! how to fault its servers ([`ServerFaults`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::check::Rules;
use super::history::{now_ns, Event, EventLog, Kind, COORDINATOR};
use super::nemesis::Nemesis;
use super::procs::Procs;
use crate::TestBackend;

/// Bound on one server-side fault, restore included (a hook's own waits are
/// bounded too): what [`run_bound`](super::coordinator::run_bound) allows for a
/// fault in progress at the deadline.
pub const SERVER_FAULT_BOUND: Duration = Duration::from_secs(180);

/// The store under test, as a lock-history run sees it. A backend's own test
/// implements it (a URL and its connect function are most of it); the run
/// re-executes the test's binary as its worker processes, each of which opens
/// the same URL through [`Deployment::open`] (see
/// [`as_worker`](super::as_worker)).
#[async_trait]
pub trait Deployment: Send + Sync {
    /// The name the reports use (e.g. `nats`).
    fn label(&self) -> String;

    /// The URL every worker opens; `None` for an in-process store (its workers
    /// are then tasks of the coordinator sharing the backend it opened).
    fn url(&self) -> Option<String>;

    /// Opens the store at `url` (the coordinator's own, once, to probe it and to
    /// check for leaks; each worker's, through its fault proxies when the proxy
    /// nemesis runs). An error fails the run: a store that cannot be reached is
    /// never skipped.
    ///
    /// # Cancel safety
    ///
    /// Must be cancel safe: the run bounds it with a timeout.
    async fn open(&self, url: &str) -> Result<Arc<dyn TestBackend>, String>;

    /// What the checker allows this store (how long a hold nobody reports may
    /// last, sessions, …). The default: a lease-based store.
    fn rules(&self) -> Rules {
        Rules::default()
    }

    /// Why the nemesis `kind` cannot be used on this store, if it cannot. The
    /// default: worker-side kinds need worker processes (not an in-process
    /// store); `expire` needs sessions ([`Rules::session_ns`]); server-side kinds
    /// need a [`ServerFaults`] hook that offers them.
    fn not_applicable(&self, kind: Nemesis) -> Option<String> {
        default_not_applicable(self, kind)
    }

    /// Whether a reset connection ends the client's session — and its holds — at
    /// once on the server (then the proxy nemesis draws no resets: no loss margin
    /// is possible there).
    fn resets_end_sessions(&self) -> bool {
        false
    }

    /// Whether a killed worker's holds outlive it until the server expires its
    /// session (kills are then spaced further apart).
    fn kills_linger(&self) -> bool {
        false
    }

    /// The hook that injects the server-side faults, if this test can fault the
    /// servers (restart, promote, failover, freeze): a fresh one per run.
    fn servers(&self) -> Result<Option<Box<dyn ServerFaults>>, String> {
        Ok(None)
    }
}

/// [`Deployment::not_applicable`]'s default rules (a deployment that overrides it
/// may fall back on them).
pub fn default_not_applicable<D: Deployment + ?Sized>(
    deployment: &D,
    kind: Nemesis,
) -> Option<String> {
    if deployment.url().is_none() {
        return Some(in_process_not_applicable(kind).to_owned());
    }
    if kind == Nemesis::Expire && deployment.rules().session_ns.is_none() {
        return Some("holds live by lease, not by a session".to_owned());
    }
    if kind.server_side() {
        return match deployment.servers() {
            Ok(Some(servers)) => servers.not_applicable(kind),
            Ok(None) => Some("this test offers no server-side faults".to_owned()),
            Err(e) => Some(e),
        };
    }
    None
}

/// Why nemesis `kind` cannot be used on an in-process store (every kind: no
/// connection, no server, no processes).
pub fn in_process_not_applicable(kind: Nemesis) -> &'static str {
    if kind.server_side() {
        "in-process backend, no server"
    } else if matches!(kind, Nemesis::Proxy | Nemesis::Expire) {
        "in-process backend, no connection to fault"
    } else {
        "its workers are tasks of one process"
    }
}

/// Server-side faults, injected by the backend's own test (it knows how its
/// servers run): the run calls [`ServerFaults::inject`] in its nemesis rotation
/// and [`ServerFaults::restore`] once the workers are done.
#[async_trait]
pub trait ServerFaults: Send {
    /// Why the server-side `kind` cannot be injected here, if it cannot.
    fn not_applicable(&self, kind: Nemesis) -> Option<String>;

    /// Injects one fault of `kind` and waits until it is over, logging it with
    /// [`FaultRun::down`] and [`FaultRun::up`]. `Ok(false)`: skipped (too little
    /// time left before the deadline); `Err`: the fault could not be injected or
    /// undone, which fails the run.
    ///
    /// # Cancel safety
    ///
    /// The run bounds it by [`SERVER_FAULT_BOUND`]
    /// and fails if it runs longer; what a dropped call left half done is
    /// [`restore`](Self::restore)'s to undo.
    async fn inject(&mut self, kind: Nemesis, run: &mut FaultRun<'_>) -> Result<bool, String>;

    /// Undoes what the faults left changed (a promoted replica given its role
    /// back) before the leak check reads the store.
    ///
    /// # Cancel safety
    ///
    /// Bounded like [`inject`](Self::inject); not cancelled otherwise.
    async fn restore(&mut self) -> Result<(), String> {
        Ok(())
    }
}

/// What a [`ServerFaults`] hook is handed to inject one fault: the run's workers
/// (to cut them off, or point them at a new server), its coordinator log, its
/// random numbers, deadline and lease.
pub struct FaultRun<'a> {
    /// The run's worker processes.
    pub procs: &'a mut Procs,
    /// The coordinator's log: server-side faults are logged there as
    /// [`Kind::Down`] and [`Kind::Up`] (see [`FaultRun::down`]).
    pub log: &'a EventLog,
    /// The run's seeded random numbers.
    pub rng: &'a mut fastrand::Rng,
    /// The run's deadline: a fault must leave the holds time to move on after it.
    pub until: Instant,
    /// The workers' lease (windows scale with it).
    pub lease: Duration,
    /// How many faults of this kind were injected before.
    pub before: u32,
}

impl FaultRun<'_> {
    /// Logs a server-side fault beginning (`what` names it), now.
    pub fn down(&self, what: impl Into<String>) {
        log_at(
            self.log,
            now_ns(),
            COORDINATOR,
            Kind::Down { what: what.into() },
        );
    }

    /// Logs the server-side fault begun last as over, now.
    pub fn up(&self) {
        log_at(self.log, now_ns(), COORDINATOR, Kind::Up);
    }
}

/// Logs `kind` on process `target` at `t`.
pub(crate) fn log_at(log: &EventLog, t: u64, target: u32, kind: Kind) {
    log.log_event(&Event {
        t,
        proc_: target,
        kind,
    });
}
