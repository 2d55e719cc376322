//! The history: what every process, the nemesis and the fenced register saw, one event
//! per line, with CLOCK_MONOTONIC timestamps comparable across the processes of one
//! machine.
//!
//! Line format (tab-separated): `<t_ns> <proc> <kind> <key=value>…`. Values never
//! contain tabs or newlines (they are replaced by spaces when written).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::fs::File;
use std::io::Write as _;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// The process number of the coordinator (nemesis, register and leak check events).
pub const COORDINATOR: u32 = 0;

/// Nanoseconds on CLOCK_MONOTONIC (comparable between processes of one machine).
pub fn now_ns() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
        Ok(ts) => {
            let secs = u64::try_from(ts.tv_sec()).unwrap_or(0);
            let nanos = u64::try_from(ts.tv_nsec()).unwrap_or(0);
            secs.saturating_mul(1_000_000_000).saturating_add(nanos)
        }
        // CLOCK_MONOTONIC cannot fail on Linux; 0 sorts such an event first and the
        // checker treats it like any other.
        Err(_) => 0,
    }
}

/// An `Instant` of this process on the history's clock.
pub fn instant_ns(at: std::time::Instant) -> u64 {
    let ago = std::time::Instant::now().saturating_duration_since(at);
    now_ns().saturating_sub(u64::try_from(ago.as_nanos()).unwrap_or(u64::MAX))
}

/// Exclusive or shared, as the history records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// One holder.
    Exclusive,
    /// Many holders together, none exclusive.
    Shared,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Mode::Exclusive => "x",
            Mode::Shared => "s",
        }
    }

    fn parse(s: &str) -> Option<Mode> {
        match s {
            "x" => Some(Mode::Exclusive),
            "s" => Some(Mode::Shared),
            _ => None,
        }
    }

    /// Whether holds in `self` and `other` exclude each other.
    pub fn conflicts(self, other: Mode) -> bool {
        self == Mode::Exclusive || other == Mode::Exclusive
    }
}

/// What the fenced register was asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegOp {
    /// A critical section begins.
    Enter,
    /// A write fenced by the token: accepted iff the token is ≥ every accepted one.
    Write,
    /// A read (shared holders); never refused.
    Read,
    /// A critical section ends.
    Exit,
}

impl RegOp {
    /// The protocol word.
    pub fn as_str(self) -> &'static str {
        match self {
            RegOp::Enter => "ENTER",
            RegOp::Write => "WRITE",
            RegOp::Read => "READ",
            RegOp::Exit => "EXIT",
        }
    }

    /// Parses a protocol word.
    pub fn parse(s: &str) -> Option<RegOp> {
        match s {
            "ENTER" => Some(RegOp::Enter),
            "WRITE" => Some(RegOp::Write),
            "READ" => Some(RegOp::Read),
            "EXIT" => Some(RegOp::Exit),
            _ => None,
        }
    }
}

/// One thing that happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A worker process started.
    Start,
    /// A worker process finished its workload and closed its managers.
    Exit,
    /// An acquire was invoked (`op`: try, lease, lock, lock-lease, reenter; `cancel`:
    /// wrapped in a short timeout that drops it).
    Invoke {
        /// Attempt number, unique within the process.
        att: u64,
        /// Lock name (without namespace).
        lock: String,
        /// Requested mode.
        mode: Mode,
        /// Fair lock.
        fair: bool,
        /// The task (`p<proc>.m<manager>.t<task>`).
        client: String,
        /// The operation.
        op: String,
        /// How long it may wait (ms).
        wait_ms: u64,
        /// Dropped after a short timeout on purpose.
        cancel: bool,
    },
    /// The acquire returned a guard (time: right after it returned).
    Ok {
        /// Attempt number.
        att: u64,
        /// Lock name.
        lock: String,
        /// Mode.
        mode: Mode,
        /// Fair lock.
        fair: bool,
        /// Fencing token.
        token: u64,
        /// The hold (a grant and its reentrant guards share it): handle id `@` the
        /// hold's acquire time.
        hold: String,
        /// The task.
        client: String,
        /// The lease the hold was asked with (ms).
        lease_ms: u64,
        /// When the granting attempt was sent (CLOCK_MONOTONIC ns): the store counts
        /// the lease from no earlier than this.
        sent: u64,
        /// The guard was already lost when it was handed out.
        lost: bool,
    },
    /// The acquire did not grant (`why`: `none`, `timeout`, `cancel`, `error:<kind>`).
    Fail {
        /// Attempt number.
        att: u64,
        /// Lock name.
        lock: String,
        /// Why.
        why: String,
    },
    /// The hold's lost signal fired (time: when `lost()` completed).
    Lost {
        /// The hold.
        hold: String,
        /// Lock name.
        lock: String,
        /// `LostReason` as a string.
        reason: String,
    },
    /// A watchdog renewal of the hold of `lock` with `token` succeeded; the event's
    /// time is when the renewal was sent (the store keeps the hold at least a lease,
    /// or a session timeout, from then).
    Renewed {
        /// Lock name.
        lock: String,
        /// The hold's fencing token.
        token: u64,
    },
    /// The worker's view of a register write.
    Write {
        /// The hold.
        hold: String,
        /// Lock name.
        lock: String,
        /// Token written.
        token: u64,
        /// The register's answer.
        accepted: bool,
    },
    /// A guard is about to be released (`how`: unlock, unlock-cancel, drop).
    Release {
        /// The hold.
        hold: String,
        /// Lock name.
        lock: String,
        /// How.
        how: String,
    },
    /// An `unlock()` returned.
    Released {
        /// The hold.
        hold: String,
        /// Lock name.
        lock: String,
        /// `ok`, `cancelled` or the error kind.
        result: String,
    },
    /// A worker applied a proxy fault to its own connections (`pass` ends one).
    Fault {
        /// `delay:<ms>`, `blackhole`, `reset` or `pass`.
        fault: String,
    },
    /// The coordinator sent SIGSTOP to process `proc`.
    Stop,
    /// The coordinator sent SIGCONT to process `proc`.
    Cont,
    /// The coordinator SIGKILLed process `proc` (time: once it was reaped).
    Kill,
    /// The coordinator told process `proc` to apply a proxy fault.
    ProxyCmd {
        /// As in [`Kind::Fault`].
        fault: String,
    },
    /// The fenced register served a request (time: when it received it).
    Reg {
        /// The request.
        op: RegOp,
        /// Lock name.
        lock: String,
        /// Token.
        token: u64,
        /// The hold.
        hold: String,
        /// For writes: accepted. Otherwise true.
        accepted: bool,
    },
    /// After quiescence, the lock still had holder or waiter state.
    Leak {
        /// Lock name.
        lock: String,
        /// What was left.
        state: String,
    },
}

/// One event of the history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// CLOCK_MONOTONIC nanoseconds.
    pub t: u64,
    /// The process it concerns (`0`: the coordinator; for nemesis events, the target).
    pub proc_: u32,
    /// What happened.
    pub kind: Kind,
}

fn clean(s: &str) -> String {
    s.replace(['\t', '\n', '\r'], " ")
}

fn b(v: bool) -> &'static str {
    if v {
        "1"
    } else {
        "0"
    }
}

impl Event {
    /// The event as one line (no trailing newline).
    pub fn to_line(&self) -> String {
        let mut fields = String::new();
        let mut kv = |k: &str, v: &str| {
            let _ = write!(fields, "\t{k}={}", clean(v));
        };
        let name = match &self.kind {
            Kind::Start => "start",
            Kind::Exit => "exit",
            Kind::Invoke {
                att,
                lock,
                mode,
                fair,
                client,
                op,
                wait_ms,
                cancel,
            } => {
                kv("att", &att.to_string());
                kv("lock", lock);
                kv("mode", mode.as_str());
                kv("fair", b(*fair));
                kv("client", client);
                kv("op", op);
                kv("wait", &wait_ms.to_string());
                kv("cancel", b(*cancel));
                "invoke"
            }
            Kind::Ok {
                att,
                lock,
                mode,
                fair,
                token,
                hold,
                client,
                lease_ms,
                sent,
                lost,
            } => {
                kv("att", &att.to_string());
                kv("lock", lock);
                kv("mode", mode.as_str());
                kv("fair", b(*fair));
                kv("token", &token.to_string());
                kv("hold", hold);
                kv("client", client);
                kv("lease", &lease_ms.to_string());
                kv("sent", &sent.to_string());
                kv("lost", b(*lost));
                "ok"
            }
            Kind::Fail { att, lock, why } => {
                kv("att", &att.to_string());
                kv("lock", lock);
                kv("why", why);
                "fail"
            }
            Kind::Lost { hold, lock, reason } => {
                kv("hold", hold);
                kv("lock", lock);
                kv("reason", reason);
                "lost"
            }
            Kind::Write {
                hold,
                lock,
                token,
                accepted,
            } => {
                kv("hold", hold);
                kv("lock", lock);
                kv("token", &token.to_string());
                kv("accepted", b(*accepted));
                "write"
            }
            Kind::Renewed { lock, token } => {
                kv("lock", lock);
                kv("token", &token.to_string());
                "renewed"
            }
            Kind::Release { hold, lock, how } => {
                kv("hold", hold);
                kv("lock", lock);
                kv("how", how);
                "release"
            }
            Kind::Released { hold, lock, result } => {
                kv("hold", hold);
                kv("lock", lock);
                kv("result", result);
                "released"
            }
            Kind::Fault { fault } => {
                kv("fault", fault);
                "fault"
            }
            Kind::Stop => "stop",
            Kind::Cont => "cont",
            Kind::Kill => "kill",
            Kind::ProxyCmd { fault } => {
                kv("fault", fault);
                "proxy"
            }
            Kind::Reg {
                op,
                lock,
                token,
                hold,
                accepted,
            } => {
                kv("op", op.as_str());
                kv("lock", lock);
                kv("token", &token.to_string());
                kv("hold", hold);
                kv("accepted", b(*accepted));
                "reg"
            }
            Kind::Leak { lock, state } => {
                kv("lock", lock);
                kv("state", state);
                "leak"
            }
        };
        format!("{}\t{}\t{name}{fields}", self.t, self.proc_)
    }

    /// Parses a line written by [`to_line`](Self::to_line).
    pub fn parse(line: &str) -> Result<Event, String> {
        let mut parts = line.split('\t');
        let bad = |what: &str| format!("bad history line ({what}): {line:?}");
        let t = parts
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("time"))?;
        let proc_ = parts
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("process"))?;
        let name = parts.next().ok_or_else(|| bad("kind"))?;
        let fields: HashMap<&str, &str> = parts.filter_map(|p| p.split_once('=')).collect();
        let s = |k: &str| -> Result<String, String> {
            fields.get(k).map(|v| (*v).to_owned()).ok_or_else(|| bad(k))
        };
        let n = |k: &str| -> Result<u64, String> {
            fields
                .get(k)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| bad(k))
        };
        let flag = |k: &str| -> Result<bool, String> {
            match fields.get(k) {
                Some(&"1") => Ok(true),
                Some(&"0") => Ok(false),
                _ => Err(bad(k)),
            }
        };
        let mode = || -> Result<Mode, String> {
            fields
                .get("mode")
                .and_then(|v| Mode::parse(v))
                .ok_or_else(|| bad("mode"))
        };
        let kind = match name {
            "start" => Kind::Start,
            "exit" => Kind::Exit,
            "invoke" => Kind::Invoke {
                att: n("att")?,
                lock: s("lock")?,
                mode: mode()?,
                fair: flag("fair")?,
                client: s("client")?,
                op: s("op")?,
                wait_ms: n("wait")?,
                cancel: flag("cancel")?,
            },
            "ok" => Kind::Ok {
                att: n("att")?,
                lock: s("lock")?,
                mode: mode()?,
                fair: flag("fair")?,
                token: n("token")?,
                hold: s("hold")?,
                client: s("client")?,
                lease_ms: n("lease")?,
                sent: n("sent")?,
                lost: flag("lost")?,
            },
            "fail" => Kind::Fail {
                att: n("att")?,
                lock: s("lock")?,
                why: s("why")?,
            },
            "lost" => Kind::Lost {
                hold: s("hold")?,
                lock: s("lock")?,
                reason: s("reason")?,
            },
            "write" => Kind::Write {
                hold: s("hold")?,
                lock: s("lock")?,
                token: n("token")?,
                accepted: flag("accepted")?,
            },
            "renewed" => Kind::Renewed {
                lock: s("lock")?,
                token: n("token")?,
            },
            "release" => Kind::Release {
                hold: s("hold")?,
                lock: s("lock")?,
                how: s("how")?,
            },
            "released" => Kind::Released {
                hold: s("hold")?,
                lock: s("lock")?,
                result: s("result")?,
            },
            "fault" => Kind::Fault { fault: s("fault")? },
            "stop" => Kind::Stop,
            "cont" => Kind::Cont,
            "kill" => Kind::Kill,
            "proxy" => Kind::ProxyCmd { fault: s("fault")? },
            "reg" => Kind::Reg {
                op: fields
                    .get("op")
                    .and_then(|v| RegOp::parse(v))
                    .ok_or_else(|| bad("op"))?,
                lock: s("lock")?,
                token: n("token")?,
                hold: s("hold")?,
                accepted: flag("accepted")?,
            },
            "leak" => Kind::Leak {
                lock: s("lock")?,
                state: s("state")?,
            },
            _ => return Err(bad("unknown kind")),
        };
        Ok(Event { t, proc_, kind })
    }
}

/// Reads a history file. A last line cut short (a SIGKILLed writer) is ignored; any
/// other unreadable line is an error.
pub fn read_file(path: &Path) -> Result<Vec<Event>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read history {}: {e}", path.display()))?;
    let complete = text.ends_with('\n');
    let lines: Vec<&str> = text.lines().collect();
    let mut events = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        if line.is_empty() {
            continue;
        }
        match Event::parse(line) {
            Ok(e) => events.push(e),
            Err(_) if i + 1 == lines.len() && !complete => {}
            Err(e) => return Err(format!("{}: {e}", path.display())),
        }
    }
    Ok(events)
}

/// A process's event log: every event is written to the file at once (one `write`
/// call per line, no user-space buffer), so a SIGKILL loses nothing already logged.
#[derive(Clone)]
pub struct EventLog {
    proc_: u32,
    file: Arc<Mutex<File>>,
    error: Arc<OnceLock<String>>,
}

impl EventLog {
    /// Creates (truncates) the log file of process `proc_`.
    pub fn create(path: &Path, proc_: u32) -> Result<EventLog, String> {
        let file = File::create(path)
            .map_err(|e| format!("cannot create event log {}: {e}", path.display()))?;
        Ok(EventLog {
            proc_,
            file: Arc::new(Mutex::new(file)),
            error: Arc::new(OnceLock::new()),
        })
    }

    /// The process this log belongs to.
    pub fn proc_(&self) -> u32 {
        self.proc_
    }

    /// Logs `kind` now.
    pub fn log(&self, kind: Kind) {
        self.log_at(now_ns(), kind);
    }

    /// Logs `kind` at time `t` (taken by the caller when it happened).
    pub fn log_at(&self, t: u64, kind: Kind) {
        self.log_event(&Event {
            t,
            proc_: self.proc_,
            kind,
        });
    }

    /// Logs an event for another process (the coordinator's nemesis log).
    pub fn log_event(&self, event: &Event) {
        let mut line = event.to_line();
        line.push('\n');
        let mut file = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        if let Err(e) = file.write_all(line.as_bytes()) {
            let _ = self.error.set(format!("writing the event log failed: {e}"));
        }
    }

    /// The first write error, if any (the history is then incomplete).
    pub fn error(&self) -> Option<String> {
        self.error.get().cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip() {
        let events = [
            Event {
                t: 5,
                proc_: 2,
                kind: Kind::Ok {
                    att: 3,
                    lock: "x0".into(),
                    mode: Mode::Shared,
                    fair: true,
                    token: 9,
                    hold: "p2.m0.t1.x0@77".into(),
                    client: "p2.m0.t1".into(),
                    lease_ms: 2000,
                    sent: 4,
                    lost: false,
                },
            },
            Event {
                t: 6,
                proc_: 0,
                kind: Kind::Stop,
            },
            Event {
                t: 7,
                proc_: 0,
                kind: Kind::Fail {
                    att: 1,
                    lock: "x1".into(),
                    why: "error:backend\tx".into(),
                },
            },
        ];
        for e in &events {
            let back = Event::parse(&e.to_line()).unwrap();
            if let Kind::Fail { why, .. } = &back.kind {
                assert_eq!(why, "error:backend x");
            } else {
                assert_eq!(&back, e);
            }
        }
    }
}
