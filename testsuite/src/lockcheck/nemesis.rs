//! Nemeses: faults injected into a run's workers while they work.
//!
//! Each kind is an enum variant with its own applicability rule and its own step in
//! `run`; server restart, replica promotion and ZooKeeper session expiry are meant
//! to be added as further variants. Every loop here is bounded by the run's deadline
//! and by a step count.

use std::io::BufRead;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::proxy::{Fault, FaultProxy};

use super::coordinator::{in_process, Procs};
use super::history::{now_ns, Event, EventLog, Kind};

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
                    format!("unknown nemesis {other:?}; use none, proxy, stop, kill or all")
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
}

impl Nemesis {
    /// Every kind, in rotation order.
    pub const ALL: [Nemesis; 3] = [Nemesis::Proxy, Nemesis::Stop, Nemesis::Kill];

    /// The `--nemesis` word.
    pub fn name(self) -> &'static str {
        match self {
            Nemesis::Proxy => "proxy",
            Nemesis::Stop => "stop",
            Nemesis::Kill => "kill",
        }
    }

    /// Why this kind cannot be used with `label`, if it cannot.
    pub fn not_applicable(self, label: &str) -> Option<String> {
        match self {
            Nemesis::Proxy if in_process(label) => {
                Some("in-process backend, no connection to fault".to_owned())
            }
            Nemesis::Proxy => match label {
                "sqlite" => Some("a local file, no connection to fault"),
                "redis-cluster" | "redis-cluster-tls" => {
                    Some("cluster redirects name the nodes' own addresses and bypass a proxy")
                }
                _ => None,
            }
            .map(str::to_owned),
            Nemesis::Stop | Nemesis::Kill if in_process(label) => {
                Some("its workers are tasks of one process".to_owned())
            }
            Nemesis::Stop | Nemesis::Kill => None,
        }
    }
}

/// The prefix of a fault command on a worker's stdin (`fault <Fault>`).
pub const FAULT_COMMAND: &str = "fault ";

/// Injects `kinds` in rotation into random live workers until `until`, logging
/// SIGSTOP, SIGCONT and SIGKILL in `log` (on the target's process number; proxy
/// faults are logged by the worker that applies them). `lease` scales the windows.
/// Returns how many workers were SIGKILLed.
pub(crate) async fn run(
    kinds: &[Nemesis],
    procs: &mut Procs,
    log: &EventLog,
    seed: u64,
    until: Instant,
    lease: Duration,
) -> Result<u32, String> {
    let mut kills = 0;
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x6e65_6d65_7369_7321);
    if kinds.is_empty() {
        return Ok(kills);
    }
    for step in 0..10_000usize {
        let gap = Duration::from_millis(rng.u64(300..=1500));
        if Instant::now() + gap + Duration::from_millis(500) >= until {
            break;
        }
        tokio::time::sleep(gap).await;
        let live = procs.live();
        if live.is_empty() {
            continue;
        }
        let target = live[rng.usize(..live.len())];
        match kinds[step % kinds.len()] {
            Nemesis::Proxy => {
                let lease_ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
                let (fault, window) = match rng.u32(0..3) {
                    0 => (
                        Fault::Delay(Duration::from_millis(rng.u64(50..=300))),
                        rng.u64(500..=2000),
                    ),
                    1 => (Fault::Blackhole, rng.u64(lease_ms / 2..=lease_ms * 2)),
                    _ => (Fault::Reset, rng.u64(200..=1000)),
                };
                let window = Duration::from_millis(window)
                    .min(until.saturating_duration_since(Instant::now()));
                // A worker that exited just now cannot be faulted: skip it.
                if procs.command(target, fault).await.is_err() {
                    continue;
                }
                tokio::time::sleep(window).await;
                if fault == Fault::Blackhole {
                    // The proxy swallowed bytes mid-stream; a connection that lived
                    // through that is out of step with its server (a real partition
                    // delays bytes, it does not drop some). End it like a partition
                    // that outlived the connection: reset, then let traffic through.
                    let _ = procs.command(target, Fault::Reset).await;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                // Heal even if the worker is gone (the error is then harmless).
                let _ = procs.command(target, Fault::Pass).await;
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
            }
            Nemesis::Kill => {
                procs.kill_and_replace(target).await?;
                kills += 1;
            }
        }
    }
    Ok(kills)
}

fn log_at(log: &EventLog, t: u64, target: u32, kind: Kind) {
    log.log_event(&Event {
        t,
        proc_: target,
        kind,
    });
}

/// Worker side: applies the coordinator's fault commands from stdin to this worker's
/// proxies, logging each fault as applied. Runs on its own thread until stdin closes.
pub fn follow_commands(proxies: Arc<Vec<FaultProxy>>, log: EventLog) {
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        for line in stdin.lock().lines().take(1_000_000) {
            let Ok(line) = line else { return };
            let Some(Ok(fault)) = line.strip_prefix(FAULT_COMMAND).map(str::parse::<Fault>) else {
                continue;
            };
            for proxy in proxies.iter() {
                proxy.set(fault);
            }
            log.log(Kind::Fault { fault });
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_parse() {
        assert_eq!("all".parse::<Choice>().unwrap().kinds().len(), 3);
        assert_eq!("stop".parse::<Choice>().unwrap().kinds(), [Nemesis::Stop]);
        assert!("none".parse::<Choice>().unwrap().kinds().is_empty());
        assert!("x".parse::<Choice>().is_err());
    }
}
