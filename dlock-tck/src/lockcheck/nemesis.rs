//! The kinds of fault a run injects ([`Nemesis`]), what a run asks for
//! ([`Choice`]), and the commands a worker process reads on its stdin
//! ([`WorkerCommand`]). The worker-side kinds are the kit's own (the run loop in
//! `inject.rs`): faults of a worker's connections through its fault proxy,
//! SIGSTOP/SIGCONT and SIGKILL of worker processes, a black hole past the session
//! timeout; the server-side kinds (restart, promote, failover, freeze) are
//! injected by the [`ServerFaults`](super::ServerFaults) hook of the
//! [`Deployment`](super::Deployment) that offers them.

use std::net::SocketAddr;

use crate::proxy::Fault;

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

    /// Whether a [`ServerFaults`](super::ServerFaults) hook injects this kind (the kit injects the
    /// others itself).
    pub fn server_side(self) -> bool {
        matches!(
            self,
            Nemesis::Restart | Nemesis::Promote | Nemesis::Failover | Nemesis::Freeze
        )
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

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
}
