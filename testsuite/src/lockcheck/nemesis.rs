//! Nemeses: faults injected into a run's workers while they work.
//!
//! Each kind is an enum variant with its own applicability rule and its own step in
//! `run`. Faults of a worker's connections go through its own fault proxy (commands
//! on its stdin); faults of the servers through `scripts/server-fault`, which knows
//! how scripts/test runs them. Every loop here is bounded by the run's deadline and
//! by a step count.

use std::io::BufRead;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::AsyncWriteExt as _;
use tokio::process::{Child, ChildStdin, Command};

use crate::proxy::{split_url, Fault, FaultProxy};

use super::broken::in_process;
use super::history::{now_ns, Event, EventLog, Kind, COORDINATOR};
use super::workload::{Plan, MAX_LEASE_MS};

/// The environment variable that gives a worker process the backend URL (not argv:
/// a password in it would show in `ps`).
pub const WORKER_URL_VAR: &str = "DLOCK_LOCKCHECK_URL";

/// Bound on telling a worker process a command (a line on its stdin).
const COMMAND_BOUND: Duration = Duration::from_secs(5);

/// What `--nemesis` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// No faults.
    None,
    /// One kind only.
    One(Nemesis),
    /// Every applicable kind, in rotation.
    All,
}

impl std::str::FromStr for Choice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Choice::None),
            "all" => Ok(Choice::All),
            other => Nemesis::ALL
                .iter()
                .find(|n| n.name() == other)
                .map(|n| Choice::One(*n))
                .ok_or_else(|| {
                    format!("unknown nemesis {other:?}; use none, proxy, stop, kill, restart, promote, failover, freeze, expire or all")
                }),
        }
    }
}

impl std::fmt::Display for Choice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Choice::None => f.write_str("none"),
            Choice::One(n) => f.write_str(n.name()),
            Choice::All => f.write_str("all"),
        }
    }
}

impl Choice {
    /// The kinds this choice names, in rotation order.
    pub fn kinds(self) -> Vec<Nemesis> {
        match self {
            Choice::None => Vec::new(),
            Choice::One(n) => vec![n],
            Choice::All => Nemesis::ALL.to_vec(),
        }
    }
}

/// A kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nemesis {
    /// Per worker, through its own fault proxy: delay (50–300 ms), black hole
    /// (0.5–2× lease, ended by a reset: the proxy drops the bytes it swallows, so a
    /// connection that lived through it would be out of step) or reset windows.
    Proxy,
    /// SIGSTOP a worker for 1.5× the lease, then SIGCONT.
    Stop,
    /// SIGKILL a worker and start a replacement with a new process number.
    Kill,
    /// Restart the backend's server (one node of a Cluster or an ensemble) with
    /// `scripts/server-fault`: down 0.2–1.5 s where the server keeps its state
    /// (MariaDB, PostgreSQL, ZooKeeper), and past the longest lease where it keeps
    /// none (these Redis servers run without persistence: a hold the store forgot
    /// must have expired anyway — Redis's "delayed restart").
    Restart,
    /// Redis (the single server and its replica): a failover as it happens without
    /// replica acknowledgement — every worker cut off from the master, the replica
    /// promoted at once (whatever it had not received yet is lost), the old master
    /// made its replica, the workers' proxies pointed at the new master.
    Promote,
    /// ZooKeeper: a worker's session expires on the server — its connections
    /// black-holed for longer than the session timeout it asked for, then reset.
    Expire,
    /// Redis Sentinel: a forced failover (`SENTINEL FAILOVER`): a replica is
    /// promoted at once, the old master reconfigured as its replica (its clients
    /// disconnected); the workers follow through the sentinels.
    Failover,
    /// Redlock: one node hangs (SIGSTOP for 0.5–2× the lease, then SIGCONT), its
    /// connections open: calls to it time out while the others answer.
    Freeze,
}

impl Nemesis {
    /// Every kind, in rotation order.
    pub const ALL: [Nemesis; 8] = [
        Nemesis::Proxy,
        Nemesis::Stop,
        Nemesis::Kill,
        Nemesis::Restart,
        Nemesis::Promote,
        Nemesis::Expire,
        Nemesis::Failover,
        Nemesis::Freeze,
    ];

    /// The `--nemesis` word.
    pub fn name(self) -> &'static str {
        match self {
            Nemesis::Proxy => "proxy",
            Nemesis::Stop => "stop",
            Nemesis::Kill => "kill",
            Nemesis::Restart => "restart",
            Nemesis::Promote => "promote",
            Nemesis::Expire => "expire",
            Nemesis::Failover => "failover",
            Nemesis::Freeze => "freeze",
        }
    }

    /// Whether the workers must talk to the backend through their fault proxies.
    pub fn needs_proxy(self) -> bool {
        matches!(self, Nemesis::Proxy | Nemesis::Promote | Nemesis::Expire)
    }

    /// Why this kind cannot be used with `label`, if it cannot.
    pub fn not_applicable(self, label: &str) -> Option<String> {
        if in_process(label) {
            let why = match self {
                Nemesis::Proxy | Nemesis::Expire => "in-process backend, no connection to fault",
                Nemesis::Restart | Nemesis::Promote | Nemesis::Failover | Nemesis::Freeze => {
                    "in-process backend, no server"
                }
                Nemesis::Stop | Nemesis::Kill => "its workers are tasks of one process",
            };
            return Some(why.to_owned());
        }
        match self {
            Nemesis::Proxy => match label {
                "sqlite" => Some("a local file, no connection to fault"),
                "redis-cluster" | "redis-cluster-tls" => {
                    Some("cluster redirects name the nodes' own addresses and bypass a proxy")
                }
                "redis-sentinel" | "redis-sentinel-ack" | "redis-sentinel-tls" => {
                    Some("the sentinels name the servers' own addresses, which bypass a proxy")
                }
                _ => None,
            },
            Nemesis::Stop | Nemesis::Kill => None,
            Nemesis::Restart => match label {
                "sqlite" => Some("a local file, no server"),
                "mysql-tls" | "postgres-tls" => Some(
                    "scripts/server-fault restarts the plain servers only (the same engine: see the mysql and postgres runs)",
                ),
                _ => None,
            },
            Nemesis::Promote => (!matches!(label, "redis" | "redis-polling")).then_some(
                "no replica to promote (only the single Redis server of `redis` and \
                 `redis-polling` runs with one)",
            ),
            Nemesis::Expire => {
                (!label.starts_with("zk")).then_some("holds live by lease, not by a session")
            }
            Nemesis::Failover => (!label.starts_with("redis-sentinel"))
                .then_some("no Sentinel deployment (only the redis-sentinel labels)"),
            Nemesis::Freeze => (!label.starts_with("redlock"))
                .then_some("scripts/server-fault freezes Redlock's nodes only"),
        }
        .map(str::to_owned)
    }
}

/// A command on a worker's stdin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerCommand {
    /// `fault <Fault>`: apply the fault to every proxy of the worker.
    Fault(Fault),
    /// `upstream <addr>`: every proxy of the worker forwards new connections there
    /// (a client following a failover; the URL has one host where this is sent).
    Upstream(SocketAddr),
}

impl From<Fault> for WorkerCommand {
    fn from(fault: Fault) -> Self {
        WorkerCommand::Fault(fault)
    }
}

impl std::fmt::Display for WorkerCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WorkerCommand::Fault(fault) => write!(f, "fault {fault}"),
            WorkerCommand::Upstream(addr) => write!(f, "upstream {addr}"),
        }
    }
}

impl std::str::FromStr for WorkerCommand {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(fault) = s.strip_prefix("fault ") {
            return fault.parse().map(WorkerCommand::Fault);
        }
        if let Some(addr) = s.strip_prefix("upstream ") {
            return addr
                .parse()
                .map(WorkerCommand::Upstream)
                .map_err(|_| format!("bad upstream address {addr:?}"));
        }
        Err(format!(
            "unknown worker command {s:?}; use fault <fault> or upstream <addr>"
        ))
    }
}

/// Bound on one `scripts/server-fault` call (its own waits are bounded too).
pub const SERVER_FAULT_BOUND: Duration = Duration::from_secs(180);
/// Leeway a restart needs past its down time (the server starting again).
const RESTART_LEEWAY: Duration = Duration::from_secs(5);
/// How long a server that keeps no state stays down: past the longest lease, so
/// every hold it forgets has expired (plus a second for clocks and timers).
const STATELESS_DOWN: Duration = Duration::from_millis(MAX_LEASE_MS + 1000);

/// Runs `scripts/server-fault ARGS…` (the servers scripts/test starts), bounded;
/// `Err` says what failed.
pub async fn server_fault(args: &[String]) -> Result<(), String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/server-fault");
    let run = tokio::process::Command::new(&script)
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let shown = format!("scripts/server-fault {}", args.join(" "));
    let out = tokio::time::timeout(SERVER_FAULT_BOUND, run)
        .await
        .map_err(|_| format!("{shown} did not finish within {SERVER_FAULT_BOUND:?}"))?
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{shown} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The single Redis server and its replica, as the promotions left them.
#[derive(Debug, Clone, Copy)]
struct RedisPair {
    master: u16,
    replica: u16,
    original_master: u16,
}

/// The servers the server-side nemeses act on, and what they changed.
pub(crate) struct Servers {
    label: String,
    /// The session timeout a ZooKeeper worker asks for.
    session: Option<Duration>,
    redis: Option<RedisPair>,
}

impl Servers {
    /// For a run on `label` at `url`; `session`: the ZooKeeper session timeout the
    /// workers ask for. The replica of `redis`/`redis-polling` is on
    /// `DLOCK_REDIS_REPLICA_PORT` (default 6380, where scripts/test starts it).
    pub(crate) fn new(label: &str, url: &str, session: Option<Duration>) -> Result<Self, String> {
        let redis = if matches!(label, "redis" | "redis-polling") {
            let master = split_url(url)?
                .hosts
                .first()
                .map(SocketAddr::port)
                .ok_or_else(|| format!("no host in the {label} URL"))?;
            let replica = match std::env::var("DLOCK_REDIS_REPLICA_PORT") {
                Ok(port) => port
                    .parse()
                    .map_err(|_| format!("DLOCK_REDIS_REPLICA_PORT={port:?} is not a port"))?,
                Err(_) => 6380,
            };
            Some(RedisPair {
                master,
                replica,
                original_master: master,
            })
        } else {
            None
        };
        Ok(Servers {
            label: label.to_owned(),
            session,
            redis,
        })
    }

    /// Gives the original master its role back after promotions (when the run is
    /// over: the next run, and the other tests, expect it there).
    pub(crate) async fn restore(&mut self) -> Result<(), String> {
        let Some(pair) = self.redis.as_mut() else {
            return Ok(());
        };
        if pair.master != pair.original_master {
            server_fault(&[
                "promote".to_owned(),
                pair.original_master.to_string(),
                pair.master.to_string(),
                "--synced".to_owned(),
            ])
            .await?;
            pair.replica = pair.master;
            pair.master = pair.original_master;
        }
        Ok(())
    }

    /// How long to keep the server down, and which node (`scripts/server-fault
    /// restart` arguments after the label).
    fn restart_plan(&self, rng: &mut fastrand::Rng) -> (Duration, Option<String>) {
        let down = if self.label.starts_with("redis") || self.label.starts_with("redlock") {
            STATELESS_DOWN
        } else {
            Duration::from_millis(rng.u64(200..=1500))
        };
        let member = match (&self.redis, self.label.as_str()) {
            (Some(pair), _) => Some(pair.master.to_string()),
            (None, "redis-cluster" | "redis-cluster-tls" | "zk-ensemble") => {
                Some(rng.u32(0..3).to_string())
            }
            // etcd: the member that leads at the time (a leader kill); Sentinel: the
            // master the sentinels name (a master kill, and their failover).
            (None, "etcd") => Some("leader".to_owned()),
            (None, "redis-sentinel" | "redis-sentinel-ack" | "redis-sentinel-tls") => {
                Some("master".to_owned())
            }
            (None, "redlock" | "redlock-tls") => Some(rng.u32(0..3).to_string()),
            _ => None,
        };
        (down, member)
    }
}

/// Whether `label`'s sessions are its connections, so that a reset connection
/// ends the session on the server at once (the SQL session modes).
pub(crate) fn resets_end_sessions(label: &str) -> bool {
    crate::backends::is_session_mode(label)
}

/// Whether a killed worker's holds outlive it on `label`'s server until the server
/// expires its session (ZooKeeper: up to the test servers' 5 s session bound): a
/// kill there takes its permits and its place in every queue out of use that long.
fn kills_linger(label: &str) -> bool {
    label.starts_with("zk")
}

/// The pause before the next fault: 0.3–1.5 s; before a kill on a store where a
/// killed worker's holds linger ([`kills_linger`]), 1.5–3 s, so that the
/// semaphore's permits are not all held by dead sessions for the whole run (seen:
/// 7 kills in 8 s on `zk-tls`, on the loaded CI machine, left no permit granted).
fn gap_before(kind: Nemesis, label: &str, rng: &mut fastrand::Rng) -> Duration {
    let ms = if kind == Nemesis::Kill && kills_linger(label) {
        rng.u64(1500..=3000)
    } else {
        rng.u64(300..=1500)
    };
    Duration::from_millis(ms)
}

/// Injects `kinds` in rotation into random live workers (or the servers) until
/// `until`, logging SIGSTOP, SIGCONT and SIGKILL in `log` (on the target's process
/// number; proxy faults are logged by the worker that applies them) and server-side
/// faults as `down`/`up` on the coordinator. `lease` scales the windows. Returns how
/// many faults of each kind were injected.
pub(crate) async fn run(
    kinds: &[Nemesis],
    procs: &mut Procs,
    servers: &mut Servers,
    log: &EventLog,
    seed: u64,
    until: Instant,
    lease: Duration,
) -> Result<Vec<(Nemesis, u32)>, String> {
    let mut injected: Vec<(Nemesis, u32)> = kinds.iter().map(|k| (*k, 0)).collect();
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x6e65_6d65_7369_7321);
    if kinds.is_empty() {
        return Ok(injected);
    }
    for step in 0..10_000usize {
        let slot = step % kinds.len();
        let gap = gap_before(kinds[slot], &servers.label, &mut rng);
        if Instant::now() + gap + Duration::from_millis(500) >= until {
            break;
        }
        tokio::time::sleep(gap).await;
        let live = procs.live();
        if live.is_empty() {
            continue;
        }
        let target = live[rng.usize(..live.len())];
        let done = match kinds[slot] {
            Nemesis::Proxy => {
                let lease_ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
                // Where the session is the connection, a reset ends the session —
                // and frees its locks — at once on the server, as an operator's
                // kill does: no margin is possible there (fencing is the defence,
                // SAFETY.md), so no reset is drawn; delays and black holes are.
                let draws = if resets_end_sessions(&servers.label) {
                    2
                } else {
                    3
                };
                let (fault, window) = match rng.u32(0..draws) {
                    0 => (
                        Fault::Delay(Duration::from_millis(rng.u64(50..=300))),
                        rng.u64(500..=2000),
                    ),
                    1 => (Fault::Blackhole, rng.u64(lease_ms / 2..=lease_ms * 2)),
                    _ => (Fault::Reset, rng.u64(200..=1000)),
                };
                let window = Duration::from_millis(window)
                    .min(until.saturating_duration_since(Instant::now()));
                fault_window(procs, target, fault, window).await
            }
            Nemesis::Expire => {
                // Past the session timeout the worker asked for (the server may
                // have granted less, never more).
                let Some(session) = servers.session else {
                    continue;
                };
                let window = session + Duration::from_secs(1);
                if Instant::now() + window + Duration::from_secs(1) >= until {
                    continue;
                }
                fault_window(procs, target, Fault::Blackhole, window).await
            }
            Nemesis::Stop => {
                let pause = lease.mul_f64(1.5);
                if Instant::now() + pause >= until {
                    continue;
                }
                // The window is logged from just before SIGSTOP to just after SIGCONT.
                let stopping = now_ns();
                if procs.pause(target, true).is_err() {
                    continue;
                }
                log_at(log, stopping, target, Kind::Stop);
                tokio::time::sleep(pause).await;
                let resumed = procs.pause(target, false);
                log_at(log, now_ns(), target, Kind::Cont);
                resumed?;
                true
            }
            Nemesis::Kill => {
                // Not within a lease of the end: the last victim's holds lapse (and
                // the locks are seen moving on after it) before the run is over.
                if Instant::now() + lease >= until {
                    continue;
                }
                procs.kill_and_replace(target).await?;
                true
            }
            Nemesis::Restart => {
                let (down, member) = servers.restart_plan(&mut rng);
                // After the first restart, a further one only with a leeway to spare
                // past its own: a run must also show the holds moving on after its
                // last restart (seen: a second etcd restart ending 2 s before the
                // deadline left a 12 s run with 3 election terms).
                let after = RESTART_LEEWAY * (1 + u32::from(injected[slot].1 > 0));
                if Instant::now() + down + after >= until {
                    continue;
                }
                let mut args = vec![
                    "restart".to_owned(),
                    servers.label.clone(),
                    down.as_millis().to_string(),
                ];
                args.extend(member);
                logged_server_fault(log, &args).await?;
                true
            }
            Nemesis::Promote => {
                let Some(pair) = servers.redis.as_mut() else {
                    continue;
                };
                if Instant::now() + RESTART_LEEWAY >= until {
                    continue;
                }
                log_at(
                    log,
                    now_ns(),
                    COORDINATOR,
                    Kind::Down {
                        what: format!("promote {}", pair.replica),
                    },
                );
                // The master fails: every worker is cut off from it…
                for &w in &live {
                    let _ = procs.command(w, Fault::Reset).await;
                }
                // …its replica is promoted, and the workers follow (their proxies),
                // as they would follow a Sentinel's announcement.
                let promoted = server_fault(&[
                    "promote".to_owned(),
                    pair.replica.to_string(),
                    pair.master.to_string(),
                ])
                .await;
                if promoted.is_ok() {
                    std::mem::swap(&mut pair.master, &mut pair.replica);
                }
                let master = SocketAddr::from(([127, 0, 0, 1], pair.master));
                procs.follow(master)?;
                for &w in &live {
                    let _ = procs.command(w, WorkerCommand::Upstream(master)).await;
                    let _ = procs.command(w, Fault::Pass).await;
                }
                log_at(log, now_ns(), COORDINATOR, Kind::Up);
                promoted?;
                true
            }
            Nemesis::Failover => {
                if Instant::now() + RESTART_LEEWAY >= until {
                    continue;
                }
                logged_server_fault(log, &["failover".to_owned(), servers.label.clone()]).await?;
                true
            }
            Nemesis::Freeze => {
                let lease_ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
                let frozen = Duration::from_millis(rng.u64(lease_ms / 2..=lease_ms * 2));
                // Cut to the time left before the leeway, rather than skipped: a
                // short run whose draws all came out long injected nothing (seen:
                // seed 6602057, 10 s).
                let room = until
                    .saturating_duration_since(Instant::now())
                    .saturating_sub(RESTART_LEEWAY);
                let frozen = frozen.min(room);
                if frozen < lease / 2 {
                    continue;
                }
                let args = [
                    "freeze".to_owned(),
                    servers.label.clone(),
                    frozen.as_millis().to_string(),
                    rng.u32(0..3).to_string(),
                ];
                logged_server_fault(log, &args).await?;
                true
            }
        };
        if done {
            injected[slot].1 += 1;
        }
    }
    Ok(injected)
}

/// [`server_fault`], logged as `down` (with its arguments) and `up` on the coordinator.
async fn logged_server_fault(log: &EventLog, args: &[String]) -> Result<(), String> {
    log_at(
        log,
        now_ns(),
        COORDINATOR,
        Kind::Down {
            what: args.join(" "),
        },
    );
    let done = server_fault(args).await;
    log_at(log, now_ns(), COORDINATOR, Kind::Up);
    done
}

/// Applies `fault` to `target`'s proxies for `window`, then heals them. A black
/// hole ends with a reset: the proxy swallowed bytes mid-stream, and a connection
/// that lived through that is out of step with its server (a real partition delays
/// bytes, it does not drop some) — it ends like a partition that outlived the
/// connection. A worker that exited meanwhile is skipped (`false`).
async fn fault_window(procs: &mut Procs, target: u32, fault: Fault, window: Duration) -> bool {
    if procs.command(target, fault).await.is_err() {
        return false;
    }
    tokio::time::sleep(window).await;
    if fault == Fault::Blackhole {
        let _ = procs.command(target, Fault::Reset).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Heal even if the worker is gone (the error is then harmless).
    let _ = procs.command(target, Fault::Pass).await;
    true
}

fn log_at(log: &EventLog, t: u64, target: u32, kind: Kind) {
    log.log_event(&Event {
        t,
        proc_: target,
        kind,
    });
}

/// Worker side: applies the coordinator's commands from stdin to this worker's
/// proxies, logging each fault as applied. Runs on its own thread until stdin closes.
pub fn follow_commands(proxies: Arc<Vec<FaultProxy>>, log: EventLog) {
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        for line in stdin.lock().lines().take(1_000_000) {
            let Ok(line) = line else { return };
            match line.parse::<WorkerCommand>() {
                Ok(WorkerCommand::Fault(fault)) => {
                    // A fault is logged from just before it applies (a reset's
                    // server may end the session at once), healing once done.
                    let before = now_ns();
                    for proxy in proxies.iter() {
                        proxy.set(fault);
                    }
                    let t = if fault == Fault::Pass {
                        now_ns()
                    } else {
                        before
                    };
                    log.log_at(t, Kind::Fault { fault });
                }
                Ok(WorkerCommand::Upstream(addr)) => {
                    for proxy in proxies.iter() {
                        let _ = proxy.retarget(addr);
                    }
                }
                Err(_) => {}
            }
        }
    });
}

/// A worker process of a run.
struct Worker {
    id: u32,
    child: Child,
    stdin: Option<ChildStdin>,
    stderr: PathBuf,
    killed: bool,
    status: Option<ExitStatus>,
}

/// The worker processes of a run; the nemesis acts on them.
pub(crate) struct Procs {
    exe: PathBuf,
    label: String,
    pub(crate) url: String,
    proxy: bool,
    dir: PathBuf,
    log: EventLog,
    until: Instant,
    workers: Vec<Worker>,
    next: u32,
    plan: Plan,
}

impl Procs {
    /// No worker yet: `exe` runs each (`--worker`) on `label` at `url` (through a
    /// fault proxy of its own when `proxy`), writing its files into `dir` until
    /// `until`; `log` records what the nemesis does to them.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        exe: PathBuf,
        label: String,
        url: String,
        proxy: bool,
        dir: PathBuf,
        log: EventLog,
        until: Instant,
        plan: Plan,
    ) -> Self {
        Procs {
            exe,
            label,
            url,
            proxy,
            dir,
            log,
            until,
            workers: Vec::new(),
            next: 1,
            plan,
        }
    }

    pub(crate) fn spawn_next(&mut self, duration: Duration) -> Result<u32, String> {
        let id = self.next;
        self.next += 1;
        let spec = self.plan.spec(id, duration);
        let events = self.dir.join(format!("p{id}.events"));
        let stderr_path = self.dir.join(format!("p{id}.stderr"));
        let stderr = std::fs::File::create(&stderr_path)
            .map_err(|e| format!("cannot create {}: {e}", stderr_path.display()))?;
        let mut command = Command::new(&self.exe);
        command
            .arg("--worker")
            .arg(id.to_string())
            .arg("--backend")
            .arg(&self.label)
            .arg("--register")
            .arg(spec.register.to_string())
            .arg("--seed")
            .arg(spec.seed.to_string())
            .arg("--seconds")
            .arg(format!("{:.3}", spec.duration.as_secs_f64()))
            .arg("--events")
            .arg(&events)
            .arg("--namespace")
            .arg(&spec.namespace)
            .env(WORKER_URL_VAR, &self.url)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true);
        if self.proxy {
            command.arg("--proxy");
        }
        let mut child = command
            .spawn()
            .map_err(|e| format!("cannot start worker {id} ({}): {e}", self.exe.display()))?;
        let stdin = child.stdin.take();
        self.workers.push(Worker {
            id,
            child,
            stdin,
            stderr: stderr_path,
            killed: false,
            status: None,
        });
        Ok(id)
    }

    fn worker(&mut self, id: u32) -> Result<&mut Worker, String> {
        self.workers
            .iter_mut()
            .find(|w| w.id == id)
            .ok_or_else(|| format!("no worker {id}"))
    }

    /// Process numbers of the workers alive now.
    pub(crate) fn live(&mut self) -> Vec<u32> {
        for w in self.workers.iter_mut().filter(|w| w.status.is_none()) {
            if let Ok(Some(status)) = w.child.try_wait() {
                w.status = Some(status);
                w.stdin = None;
            }
        }
        self.workers
            .iter()
            .filter(|w| w.status.is_none())
            .map(|w| w.id)
            .collect()
    }

    /// Sends a worker a command for its proxies.
    pub(crate) async fn command(
        &mut self,
        proc_: u32,
        command: impl Into<WorkerCommand>,
    ) -> Result<(), String> {
        let w = self.worker(proc_)?;
        let stdin = w
            .stdin
            .as_mut()
            .ok_or_else(|| format!("worker p{proc_} has exited"))?;
        let line = format!("{}\n", command.into());
        let sent = async {
            stdin.write_all(line.as_bytes()).await?;
            stdin.flush().await
        };
        tokio::time::timeout(COMMAND_BOUND, sent)
            .await
            .map_err(|_| format!("worker p{proc_} does not read its commands"))?
            .map_err(|e| format!("cannot tell worker p{proc_} {line:?}: {e}"))
    }

    /// Workers started from now on reach the backend at `host` (the URL has one
    /// host: a client following a failover).
    pub(crate) fn follow(&mut self, host: SocketAddr) -> Result<(), String> {
        let split = split_url(&self.url)?;
        if split.hosts.len() != 1 {
            return Err(format!(
                "cannot follow a failover on a URL with {} hosts",
                split.hosts.len()
            ));
        }
        self.url = split.with_hosts(&[host]);
        Ok(())
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`).
    pub(crate) fn pause(&mut self, proc_: u32, stop: bool) -> Result<(), String> {
        let w = self.worker(proc_)?;
        let signal = if stop {
            Signal::SIGSTOP
        } else {
            Signal::SIGCONT
        };
        let pid = w
            .child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .ok_or_else(|| format!("worker p{proc_} has exited"))?;
        kill(Pid::from_raw(pid), signal).map_err(|e| format!("{signal} to worker p{proc_}: {e}"))
    }

    /// SIGKILLs a worker, waits for it, and starts a replacement; returns the new
    /// worker's number, if one was started.
    pub(crate) async fn kill_and_replace(&mut self, proc_: u32) -> Result<Option<u32>, String> {
        let log = self.log.clone();
        let w = self.worker(proc_)?;
        w.killed = true;
        // Logged at the time taken just before the signal, not once the worker is
        // reaped: its holds end when it dies, and a store that ends a dead client's
        // session at once (PostgreSQL's session mode: the socket closes with the
        // process) grants the lock on before the reaping is done (seen: another
        // process granted 6.7 ms before a SIGKILL logged after the wait).
        let signalled = now_ns();
        w.child
            .kill()
            .await
            .map_err(|e| format!("cannot SIGKILL worker p{proc_}: {e}"))?;
        w.status = w.child.try_wait().ok().flatten();
        w.stdin = None;
        log.log_event(&Event {
            t: signalled,
            proc_,
            kind: Kind::Kill,
        });
        let left = self.until.saturating_duration_since(Instant::now());
        if left < Duration::from_secs(1) {
            return Ok(None);
        }
        self.spawn_next(left).map(Some)
    }

    /// Waits for every worker until `bound`, kills those still running, and returns
    /// what went wrong (workers that failed or had to be killed).
    pub(crate) async fn wait_all(&mut self, bound: Instant) -> Vec<String> {
        let mut problems = Vec::new();
        for w in &mut self.workers {
            w.stdin = None;
            if w.status.is_none() {
                match tokio::time::timeout_at(bound.into(), w.child.wait()).await {
                    Ok(status) => w.status = status.ok(),
                    Err(_) => {
                        let _ = w.child.kill().await;
                        problems.push(format!(
                            "worker p{} did not exit in time and was killed",
                            w.id
                        ));
                        continue;
                    }
                }
            }
            if w.killed {
                continue;
            }
            match w.status {
                Some(status) if status.success() => {}
                status => problems.push(format!(
                    "worker p{} failed ({}): {}",
                    w.id,
                    status.map_or_else(|| "no status".to_owned(), |s| s.to_string()),
                    tail(&w.stderr)
                )),
            }
        }
        problems
    }
}

/// The last lines of a worker's stderr.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(5);
    let shown = lines[from..].join(" | ");
    if shown.is_empty() {
        "(no output)".to_owned()
    } else {
        shown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_parse() {
        assert_eq!("all".parse::<Choice>().unwrap().kinds().len(), 8);
        assert_eq!(
            "promote".parse::<Choice>().unwrap().kinds(),
            [Nemesis::Promote]
        );
        assert_eq!("stop".parse::<Choice>().unwrap().kinds(), [Nemesis::Stop]);
        assert!("none".parse::<Choice>().unwrap().kinds().is_empty());
        assert!("x".parse::<Choice>().is_err());
    }

    #[test]
    fn commands_print_and_parse() {
        for c in [
            WorkerCommand::Fault(Fault::Reset),
            WorkerCommand::Fault(Fault::Delay(Duration::from_millis(70))),
            WorkerCommand::Upstream("127.0.0.1:6380".parse().unwrap()),
        ] {
            assert_eq!(c.to_string().parse::<WorkerCommand>(), Ok(c));
        }
        assert!("upstream nowhere".parse::<WorkerCommand>().is_err());
        assert!("reboot".parse::<WorkerCommand>().is_err());
    }

    #[test]
    fn server_side_kinds_apply_where_their_server_is() {
        let applies = |n: Nemesis, label: &str| n.not_applicable(label).is_none();
        assert!(applies(Nemesis::Restart, "mysql") && !applies(Nemesis::Restart, "sqlite"));
        assert!(!applies(Nemesis::Restart, "memory"));
        assert!(applies(Nemesis::Promote, "redis") && applies(Nemesis::Promote, "redis-polling"));
        assert!(!applies(Nemesis::Promote, "redis-cluster") && !applies(Nemesis::Promote, "zk"));
        assert!(applies(Nemesis::Expire, "zk-ensemble") && !applies(Nemesis::Expire, "postgres"));
        assert!(Nemesis::Promote.needs_proxy() && !Nemesis::Restart.needs_proxy());
    }
}
