//! Nemeses: faults injected into a run's workers while they work.
//!
//! Each kind is an enum variant with its own applicability rule and its own step in
//! [`run`]; server restart, replica promotion and ZooKeeper session expiry are meant
//! to be added as further variants. Every loop here is bounded by the run's deadline
//! and by a step count.

use std::io::BufRead;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::proxy::{Fault, FaultProxy};

use super::clients::{in_process, proxy_not_applicable};
use super::history::{EventLog, Kind};

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
            Nemesis::Proxy => proxy_not_applicable(label).map(str::to_owned),
            Nemesis::Stop | Nemesis::Kill if in_process(label) => {
                Some("its workers are tasks of one process".to_owned())
            }
            Nemesis::Stop | Nemesis::Kill => None,
        }
    }
}

/// What the nemesis can do to the workers (the coordinator's process table).
pub trait Cluster: Send {
    /// Process numbers of the workers alive now.
    fn live(&mut self) -> Vec<u32>;
    /// Sends a control line to a worker (proxy faults).
    fn command(&mut self, proc_: u32, line: &str) -> Result<(), String>;
    /// SIGSTOP (`true`) or SIGCONT (`false`).
    fn pause(&mut self, proc_: u32, stop: bool) -> Result<(), String>;
    /// SIGKILLs a worker, waits for it, and starts a replacement; returns the new
    /// worker's number, if one was started.
    fn kill_and_replace(&mut self, proc_: u32) -> Result<Option<u32>, String>;
}

/// How many faults of each kind were injected.
#[derive(Debug, Default, Clone, Copy)]
pub struct Injected {
    /// Proxy fault windows.
    pub proxy: u32,
    /// SIGSTOP/SIGCONT pairs.
    pub stop: u32,
    /// SIGKILLs.
    pub kill: u32,
}

/// Injects `kinds` in rotation into random live workers until `until`, logging every
/// action in `log` (on the target's process number). `lease` scales the windows.
pub async fn run(
    kinds: &[Nemesis],
    cluster: &mut dyn Cluster,
    log: &EventLog,
    seed: u64,
    until: Instant,
    lease: Duration,
) -> Result<Injected, String> {
    let mut injected = Injected::default();
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x6e65_6d65_7369_7321);
    if kinds.is_empty() {
        tokio::time::sleep_until(until.into()).await;
        return Ok(injected);
    }
    for step in 0..10_000usize {
        let gap = Duration::from_millis(rng.u64(300..=1500));
        if Instant::now() + gap + Duration::from_millis(500) >= until {
            break;
        }
        tokio::time::sleep(gap).await;
        let live = cluster.live();
        if live.is_empty() {
            continue;
        }
        let target = live[rng.usize(..live.len())];
        match kinds[step % kinds.len()] {
            Nemesis::Proxy => {
                let (line, window) = match rng.u32(0..3) {
                    0 => {
                        let ms = rng.u64(50..=300);
                        (format!("fault delay {ms}"), rng.u64(500..=2000))
                    }
                    1 => {
                        let lease_ms = u64::try_from(lease.as_millis()).unwrap_or(2000);
                        (
                            "fault blackhole".to_owned(),
                            rng.u64(lease_ms / 2..=lease_ms * 2),
                        )
                    }
                    _ => ("fault reset".to_owned(), rng.u64(200..=1000)),
                };
                let window = Duration::from_millis(window)
                    .min(until.saturating_duration_since(Instant::now()));
                // A worker that exited just now cannot be faulted: skip it.
                if cluster.command(target, &line).is_err() {
                    continue;
                }
                log_on(
                    log,
                    target,
                    Kind::ProxyCmd {
                        fault: fault_word(&line),
                    },
                );
                injected.proxy += 1;
                tokio::time::sleep(window).await;
                if line == "fault blackhole" {
                    // The proxy swallowed bytes mid-stream; a connection that lived
                    // through that is out of step with its server (a real partition
                    // delays bytes, it does not drop some). End it like a partition
                    // that outlived the connection: reset, then let traffic through.
                    let _ = cluster.command(target, "fault reset");
                    log_on(
                        log,
                        target,
                        Kind::ProxyCmd {
                            fault: "reset".to_owned(),
                        },
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                // Heal even if the worker is gone (the error is then harmless).
                let _ = cluster.command(target, "fault pass");
                log_on(
                    log,
                    target,
                    Kind::ProxyCmd {
                        fault: "pass".to_owned(),
                    },
                );
            }
            Nemesis::Stop => {
                let pause = lease.mul_f64(1.5);
                if Instant::now() + pause >= until {
                    continue;
                }
                // The window is logged from just before SIGSTOP to just after SIGCONT.
                let stopping = super::history::now_ns();
                if cluster.pause(target, true).is_err() {
                    continue;
                }
                log.log_event(&super::history::Event {
                    t: stopping,
                    proc_: target,
                    kind: Kind::Stop,
                });
                injected.stop += 1;
                tokio::time::sleep(pause).await;
                let resumed = cluster.pause(target, false);
                log_on(log, target, Kind::Cont);
                resumed?;
            }
            Nemesis::Kill => {
                cluster.kill_and_replace(target)?;
                injected.kill += 1;
            }
        }
    }
    Ok(injected)
}

fn log_on(log: &EventLog, target: u32, kind: Kind) {
    log.log_event(&super::history::Event {
        t: super::history::now_ns(),
        proc_: target,
        kind,
    });
}

/// `fault delay 120` → `delay:120`; `fault blackhole` → `blackhole`.
fn fault_word(line: &str) -> String {
    let words: Vec<&str> = line.split(' ').skip(1).collect();
    words.join(":")
}

/// Parses a control line (`fault pass|delay <ms>|blackhole|reset`).
pub fn parse_command(line: &str) -> Option<Fault> {
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.as_slice() {
        ["fault", "pass"] => Some(Fault::Pass),
        ["fault", "blackhole"] => Some(Fault::Blackhole),
        ["fault", "reset"] => Some(Fault::Reset),
        ["fault", "delay", ms] => ms
            .parse()
            .ok()
            .map(|ms| Fault::Delay(Duration::from_millis(ms))),
        _ => None,
    }
}

/// Worker side: applies the coordinator's control lines from stdin to this worker's
/// proxies, logging each fault as applied. Runs on its own thread until stdin closes.
pub fn follow_commands(proxies: Arc<Vec<FaultProxy>>, log: EventLog) {
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        for line in stdin.lock().lines().take(1_000_000) {
            let Ok(line) = line else { return };
            let Some(fault) = parse_command(&line) else {
                continue;
            };
            for proxy in proxies.iter() {
                proxy.set(fault);
            }
            log.log(Kind::Fault {
                fault: fault_word(line.trim()),
            });
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_parse() {
        assert_eq!(parse_command("fault pass"), Some(Fault::Pass));
        assert_eq!(
            parse_command("fault delay 120"),
            Some(Fault::Delay(Duration::from_millis(120)))
        );
        assert_eq!(parse_command("fault bogus"), None);
        assert_eq!(fault_word("fault delay 120"), "delay:120");
        assert_eq!("all".parse::<Choice>().unwrap().kinds().len(), 3);
        assert!("x".parse::<Choice>().is_err());
    }
}
