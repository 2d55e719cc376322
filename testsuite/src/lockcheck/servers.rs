//! This repository's servers under the lock-history checker: which nemesis applies
//! to which label, and the server-side faults (restart, promote, failover,
//! freeze) injected through `scripts/server-fault`, which knows how scripts/test
//! runs the servers — the kit's [`ServerFaults`] hook.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use dlock_tck::lockcheck::nemesis::WorkerCommand;
use dlock_tck::lockcheck::workload::MAX_LEASE_MS;
use dlock_tck::lockcheck::{
    in_process_not_applicable, FaultRun, Nemesis, ServerFaults, SERVER_FAULT_BOUND,
};

use crate::proxy::{split_url, Fault};

use super::broken::in_process;

/// Leeway a restart needs past its down time (the server starting again).
const RESTART_LEEWAY: Duration = Duration::from_secs(5);
/// How long a server that keeps no state stays down: past the longest lease, so
/// every hold it forgets has expired (plus a second for clocks and timers).
const STATELESS_DOWN: Duration = Duration::from_millis(MAX_LEASE_MS + 1000);

/// Why nemesis `kind` cannot be used with this repository's `label`, if it cannot.
pub fn not_applicable(kind: Nemesis, label: &str) -> Option<String> {
    if in_process(label) {
        return Some(in_process_not_applicable(kind).to_owned());
    }
    match kind {
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
pub struct Servers {
    label: String,
    redis: Option<RedisPair>,
}

impl Servers {
    /// For a run on `label` at `url`. The replica of `redis`/`redis-polling` is on
    /// `DLOCK_REDIS_REPLICA_PORT` (default 6380, where scripts/test starts it).
    pub fn new(label: &str, url: &str) -> Result<Self, String> {
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
            redis,
        })
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

    /// [`server_fault`], logged as `down` (with its arguments) and `up`.
    async fn logged(run: &FaultRun<'_>, args: &[String]) -> Result<(), String> {
        run.down(args.join(" "));
        let done = server_fault(args).await;
        run.up();
        done
    }

    /// The Redis failover without replica acknowledgement: every worker cut off
    /// from the master, its replica promoted at once, the workers' proxies (and
    /// the workers started later) pointed at the new master.
    async fn promote(&mut self, run: &mut FaultRun<'_>) -> Result<bool, String> {
        let Some(pair) = self.redis.as_mut() else {
            return Ok(false);
        };
        if Instant::now() + RESTART_LEEWAY >= run.until {
            return Ok(false);
        }
        run.down(format!("promote {}", pair.replica));
        let live = run.procs.live();
        // The master fails: every worker is cut off from it…
        for &w in &live {
            let _ = run.procs.command(w, Fault::Reset).await;
        }
        // …its replica is promoted, and the workers follow (their proxies), as they
        // would follow a Sentinel's announcement.
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
        run.procs.follow(master)?;
        for &w in &live {
            let _ = run.procs.command(w, WorkerCommand::Upstream(master)).await;
            let _ = run.procs.command(w, Fault::Pass).await;
        }
        run.up();
        promoted.map(|()| true)
    }
}

#[async_trait]
impl ServerFaults for Servers {
    fn not_applicable(&self, kind: Nemesis) -> Option<String> {
        not_applicable(kind, &self.label)
    }

    async fn inject(&mut self, kind: Nemesis, run: &mut FaultRun<'_>) -> Result<bool, String> {
        match kind {
            Nemesis::Restart => {
                let (down, member) = self.restart_plan(run.rng);
                // After the first restart, a further one only with a leeway to spare
                // past its own: a run must also show the holds moving on after its
                // last restart (seen: a second etcd restart ending 2 s before the
                // deadline left a 12 s run with 3 election terms).
                let after = RESTART_LEEWAY * (1 + u32::from(run.before > 0));
                if Instant::now() + down + after >= run.until {
                    return Ok(false);
                }
                let mut args = vec![
                    "restart".to_owned(),
                    self.label.clone(),
                    down.as_millis().to_string(),
                ];
                args.extend(member);
                Self::logged(run, &args).await.map(|()| true)
            }
            Nemesis::Promote => self.promote(run).await,
            Nemesis::Failover => {
                if Instant::now() + RESTART_LEEWAY >= run.until {
                    return Ok(false);
                }
                let args = ["failover".to_owned(), self.label.clone()];
                Self::logged(run, &args).await.map(|()| true)
            }
            Nemesis::Freeze => {
                let lease_ms = u64::try_from(run.lease.as_millis()).unwrap_or(u64::MAX);
                let frozen = Duration::from_millis(run.rng.u64(lease_ms / 2..=lease_ms * 2));
                // Cut to the time left before the leeway, rather than skipped: a
                // short run whose draws all came out long injected nothing (seen:
                // seed 6602057, 10 s).
                let room = run
                    .until
                    .saturating_duration_since(Instant::now())
                    .saturating_sub(RESTART_LEEWAY);
                let frozen = frozen.min(room);
                if frozen < run.lease / 2 {
                    return Ok(false);
                }
                let args = [
                    "freeze".to_owned(),
                    self.label.clone(),
                    frozen.as_millis().to_string(),
                    run.rng.u32(0..3).to_string(),
                ];
                Self::logged(run, &args).await.map(|()| true)
            }
            other => Err(format!("{} is not a server-side fault", other.name())),
        }
    }

    /// Gives the original master its role back after promotions (when the run is
    /// over: the next run, and the other tests, expect it there).
    async fn restore(&mut self) -> Result<(), String> {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_side_kinds_apply_where_their_server_is() {
        let applies = |n: Nemesis, label: &str| not_applicable(n, label).is_none();
        assert!(applies(Nemesis::Restart, "mysql") && !applies(Nemesis::Restart, "sqlite"));
        assert!(!applies(Nemesis::Restart, "memory"));
        assert!(applies(Nemesis::Promote, "redis") && applies(Nemesis::Promote, "redis-polling"));
        assert!(!applies(Nemesis::Promote, "redis-cluster") && !applies(Nemesis::Promote, "zk"));
        assert!(applies(Nemesis::Expire, "zk-ensemble") && !applies(Nemesis::Expire, "postgres"));
        assert!(Nemesis::Promote.needs_proxy() && !Nemesis::Restart.needs_proxy());
    }
}
