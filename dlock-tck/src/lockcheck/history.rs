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

use dlock_api::LostReason;

use crate::proxy::Fault;

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

/// A unit enum written as one word in the history.
macro_rules! words {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $variant:ident = $word:literal,)+ }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vm])* $variant,)+
        }

        impl $name {
            /// The history's word.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $word,)+
                }
            }

            /// Parses the history's word.
            pub fn parse(s: &str) -> Option<Self> {
                match s {
                    $($word => Some($name::$variant),)+
                    _ => None,
                }
            }
        }
    };
}

words! {
    /// Exclusive, shared, or permits of a semaphore, as the history records it.
    Mode {
        /// One holder.
        Exclusive = "x",
        /// Many holders together, none exclusive.
        Shared = "s",
        /// One permit of a semaphore.
        Permit1 = "p1",
        /// Two permits of a semaphore.
        Permit2 = "p2",
    }
}

impl Mode {
    /// Whether holds in `self` and `other` exclude each other (permit holds never
    /// do pairwise: they are judged by the permits in use together).
    pub fn conflicts(self, other: Mode) -> bool {
        match (self.permits(), other.permits()) {
            (Some(_), Some(_)) => false,
            (Some(_), None) | (None, Some(_)) => true,
            (None, None) => self == Mode::Exclusive || other == Mode::Exclusive,
        }
    }

    /// The permits a hold in this mode takes.
    pub fn permits(self) -> Option<u32> {
        match self {
            Mode::Permit1 => Some(1),
            Mode::Permit2 => Some(2),
            Mode::Exclusive | Mode::Shared => None,
        }
    }
}

words! {
    /// What the fenced register was asked (also its protocol word).
    RegOp {
        /// A critical section begins.
        Enter = "ENTER",
        /// A write fenced by the token: accepted iff the token is ≥ every accepted one.
        Write = "WRITE",
        /// A read (shared holders); never refused.
        Read = "READ",
        /// A critical section ends.
        Exit = "EXIT",
    }
}

words! {
    /// How an acquire was asked.
    Op {
        /// `try_lock(wait)`.
        Try = "try",
        /// `try_lock_with(wait, &LockOptions::new().lease(lease))`.
        Lease = "lease",
        /// `lock()` bounded by a timeout.
        Lock = "lock",
        /// `lock_with(&LockOptions::new().lease(lease))` bounded by a timeout.
        LockLease = "lock-lease",
        /// `try_lock(wait)` of a multi-lock, logged for each member (a member's
        /// refusal may be another member's).
        Multi = "multi",
        /// `try_lock(0)` on the handle of a hold it has (a reentry).
        Reenter = "reenter",
        /// `downgrade()` of a read-write lock's write guard: its read side.
        Downgrade = "downgrade",
        /// `try_lock(wait)` of a read-write lock's upgradeable side, logged for each
        /// of its two holds (its own lock's, and the read of the lock).
        Upgradeable = "upgradeable",
        /// `try_upgrade(wait)` of an upgradeable read: the write side beside it.
        Upgrade = "upgrade",
    }
}

words! {
    /// How a guard was released.
    How {
        /// `unlock()`, awaited.
        Unlock = "unlock",
        /// `unlock()`, dropped after 0–2 ms.
        UnlockCancel = "unlock-cancel",
        /// The guard dropped.
        Drop = "drop",
    }
}

words! {
    /// Why a hold was lost (`LostReason`).
    Reason {
        /// A renewal was refused.
        NotOwner = "not_owner",
        /// The lease passed without a renewal.
        LeaseExpired = "lease_expired",
        /// The session ended.
        SessionExpired = "session_expired",
        /// The manager was closed while the hold was held.
        ManagerClosed = "manager_closed",
        /// The hold reached its `max_hold` bound.
        MaxHold = "max_hold",
        /// A reason this history does not know.
        Other = "other",
    }
}

impl From<LostReason> for Reason {
    fn from(reason: LostReason) -> Self {
        Reason::parse(reason.as_str()).unwrap_or(Reason::Other)
    }
}

/// Why an acquire did not grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Why {
    /// It answered: not acquired.
    None,
    /// The workload's timeout around `lock()` ran out.
    Timeout,
    /// Dropped on purpose after a short timeout.
    Cancel,
    /// A `try_lock` that did not answer within its wait and a bound.
    Hung,
    /// It failed with an error of this kind.
    Error(String),
}

/// How an `unlock()` ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Released (the store confirmed, or another guard of the hold remains).
    Ok,
    /// Dropped before it answered.
    Cancelled,
    /// Failed with an error of this kind.
    Error(String),
}

/// One thing that happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A worker process started.
    Start,
    /// A worker process finished its workload and closed its managers.
    Exit,
    /// An acquire was invoked.
    Invoke {
        /// Attempt number, unique within the process.
        att: u64,
        /// Lock name (without namespace).
        lock: String,
        /// Requested mode.
        mode: Mode,
        /// Fair lock.
        fair: bool,
        /// The operation.
        op: Op,
        /// How long it may wait (ms).
        wait_ms: u64,
        /// Wrapped in a short timeout that drops it.
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
        /// Fencing token.
        token: u64,
        /// The hold (a grant and its reentrant guards share it): handle id `@` the
        /// hold's acquire time.
        hold: String,
        /// Whose hold it is: holds of one owner never conflict (a read-write lock's
        /// read and write sides).
        owner: String,
        /// The lease the hold was asked with (ms).
        lease_ms: u64,
        /// When the granting attempt was sent (CLOCK_MONOTONIC ns): the store counts
        /// the lease from no earlier than this.
        sent: u64,
        /// The guard was already lost when it was handed out.
        lost: bool,
    },
    /// The acquire did not grant.
    Fail {
        /// Attempt number.
        att: u64,
        /// Lock name.
        lock: String,
        /// Why.
        why: Why,
    },
    /// The lost signal of the hold of `lock` with `token` fired (time: when the
    /// manager set it, as its handlers are told).
    Lost {
        /// Lock name.
        lock: String,
        /// The hold's fencing token.
        token: u64,
        /// Why.
        reason: Reason,
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
    /// A guard is about to be released.
    Release {
        /// The hold.
        hold: String,
        /// Lock name.
        lock: String,
        /// How.
        how: How,
    },
    /// An `unlock()` returned.
    Released {
        /// The hold.
        hold: String,
        /// Lock name.
        lock: String,
        /// How it ended.
        outcome: Outcome,
    },
    /// A worker applied a proxy fault to its own connections (`pass` ends a window).
    Fault {
        /// The fault.
        fault: Fault,
    },
    /// The coordinator sent SIGSTOP to process `proc`.
    Stop,
    /// The coordinator sent SIGCONT to process `proc`.
    Cont,
    /// The coordinator SIGKILLed process `proc` (time: once it was reaped).
    Kill,
    /// The process's timers fired late: a timer due at `from` fired at this event's
    /// time, more than [`STALL_LATE_NS`](super::workload::STALL_LATE_NS) late (the
    /// process got no CPU, as if paused).
    Stall {
        /// When the timer was due (CLOCK_MONOTONIC ns).
        from: u64,
    },
    /// A server-side fault began, for every process (time: just before it was
    /// injected): a server restart or a replica promotion.
    Down {
        /// What was done (`restart mysql`, `promote 6380`, …).
        what: String,
    },
    /// The server-side fault that began last is over: the server serves again.
    Up,
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
                op,
                wait_ms,
                cancel,
            } => {
                kv("att", &att.to_string());
                kv("lock", lock);
                kv("mode", mode.as_str());
                kv("fair", b(*fair));
                kv("op", op.as_str());
                kv("wait", &wait_ms.to_string());
                kv("cancel", b(*cancel));
                "invoke"
            }
            Kind::Ok {
                att,
                lock,
                mode,
                token,
                hold,
                owner,
                lease_ms,
                sent,
                lost,
            } => {
                kv("att", &att.to_string());
                kv("lock", lock);
                kv("mode", mode.as_str());
                kv("token", &token.to_string());
                kv("hold", hold);
                kv("owner", owner);
                kv("lease", &lease_ms.to_string());
                kv("sent", &sent.to_string());
                kv("lost", b(*lost));
                "ok"
            }
            Kind::Fail { att, lock, why } => {
                kv("att", &att.to_string());
                kv("lock", lock);
                match why {
                    Why::None => kv("why", "none"),
                    Why::Timeout => kv("why", "timeout"),
                    Why::Cancel => kv("why", "cancel"),
                    Why::Hung => kv("why", "hung"),
                    Why::Error(kind) => kv("why", &format!("error:{kind}")),
                }
                "fail"
            }
            Kind::Lost {
                lock,
                token,
                reason,
            } => {
                kv("lock", lock);
                kv("token", &token.to_string());
                kv("reason", reason.as_str());
                "lost"
            }
            Kind::Renewed { lock, token } => {
                kv("lock", lock);
                kv("token", &token.to_string());
                "renewed"
            }
            Kind::Release { hold, lock, how } => {
                kv("hold", hold);
                kv("lock", lock);
                kv("how", how.as_str());
                "release"
            }
            Kind::Released {
                hold,
                lock,
                outcome,
            } => {
                kv("hold", hold);
                kv("lock", lock);
                match outcome {
                    Outcome::Ok => kv("result", "ok"),
                    Outcome::Cancelled => kv("result", "cancelled"),
                    Outcome::Error(kind) => kv("result", &format!("error:{kind}")),
                }
                "released"
            }
            Kind::Fault { fault } => {
                kv("fault", &fault.to_string());
                "fault"
            }
            Kind::Stop => "stop",
            Kind::Cont => "cont",
            Kind::Kill => "kill",
            Kind::Stall { from } => {
                kv("from", &from.to_string());
                "stall"
            }
            Kind::Down { what } => {
                kv("what", what);
                "down"
            }
            Kind::Up => "up",
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
        let field = |k: &str| fields.get(k).copied().ok_or_else(|| bad(k));
        let s = |k: &str| field(k).map(str::to_owned);
        let n = |k: &str| -> Result<u64, String> { field(k)?.parse().map_err(|_| bad(k)) };
        let flag = |k: &str| -> Result<bool, String> {
            match field(k)? {
                "1" => Ok(true),
                "0" => Ok(false),
                _ => Err(bad(k)),
            }
        };
        let kind = match name {
            "start" => Kind::Start,
            "exit" => Kind::Exit,
            "invoke" => Kind::Invoke {
                att: n("att")?,
                lock: s("lock")?,
                mode: Mode::parse(field("mode")?).ok_or_else(|| bad("mode"))?,
                fair: flag("fair")?,
                op: Op::parse(field("op")?).ok_or_else(|| bad("op"))?,
                wait_ms: n("wait")?,
                cancel: flag("cancel")?,
            },
            "ok" => Kind::Ok {
                att: n("att")?,
                lock: s("lock")?,
                mode: Mode::parse(field("mode")?).ok_or_else(|| bad("mode"))?,
                token: n("token")?,
                hold: s("hold")?,
                owner: s("owner")?,
                lease_ms: n("lease")?,
                sent: n("sent")?,
                lost: flag("lost")?,
            },
            "fail" => Kind::Fail {
                att: n("att")?,
                lock: s("lock")?,
                why: match field("why")? {
                    "none" => Why::None,
                    "timeout" => Why::Timeout,
                    "cancel" => Why::Cancel,
                    "hung" => Why::Hung,
                    other => Why::Error(
                        other
                            .strip_prefix("error:")
                            .ok_or_else(|| bad("why"))?
                            .to_owned(),
                    ),
                },
            },
            "lost" => Kind::Lost {
                lock: s("lock")?,
                token: n("token")?,
                reason: Reason::parse(field("reason")?).ok_or_else(|| bad("reason"))?,
            },
            "renewed" => Kind::Renewed {
                lock: s("lock")?,
                token: n("token")?,
            },
            "release" => Kind::Release {
                hold: s("hold")?,
                lock: s("lock")?,
                how: How::parse(field("how")?).ok_or_else(|| bad("how"))?,
            },
            "released" => Kind::Released {
                hold: s("hold")?,
                lock: s("lock")?,
                outcome: match field("result")? {
                    "ok" => Outcome::Ok,
                    "cancelled" => Outcome::Cancelled,
                    other => Outcome::Error(
                        other
                            .strip_prefix("error:")
                            .ok_or_else(|| bad("result"))?
                            .to_owned(),
                    ),
                },
            },
            "fault" => Kind::Fault {
                fault: field("fault")?.parse().map_err(|_| bad("fault"))?,
            },
            "stop" => Kind::Stop,
            "cont" => Kind::Cont,
            "kill" => Kind::Kill,
            "stall" => Kind::Stall { from: n("from")? },
            "down" => Kind::Down { what: s("what")? },
            "up" => Kind::Up,
            "reg" => Kind::Reg {
                op: RegOp::parse(field("op")?).ok_or_else(|| bad("op"))?,
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
    use std::time::Duration;

    use super::*;

    #[test]
    fn lines_round_trip() {
        let kinds = [
            Kind::Start,
            Kind::Invoke {
                att: 3,
                lock: "x0".into(),
                mode: Mode::Exclusive,
                fair: true,
                op: Op::LockLease,
                wait_ms: 200,
                cancel: true,
            },
            Kind::Ok {
                att: 3,
                lock: "x0".into(),
                mode: Mode::Shared,
                token: 9,
                hold: "p2.m0.t1.x0@77".into(),
                owner: "p2.m0.t1.x0".into(),
                lease_ms: 2000,
                sent: 4,
                lost: false,
            },
            Kind::Fail {
                att: 1,
                lock: "x1".into(),
                why: Why::Error("backend".into()),
            },
            Kind::Fail {
                att: 2,
                lock: "x1".into(),
                why: Why::Hung,
            },
            Kind::Lost {
                lock: "x1".into(),
                token: 5,
                reason: Reason::from(LostReason::SessionExpired),
            },
            Kind::Renewed {
                lock: "x1".into(),
                token: 5,
            },
            Kind::Release {
                hold: "h".into(),
                lock: "x1".into(),
                how: How::UnlockCancel,
            },
            Kind::Released {
                hold: "h".into(),
                lock: "x1".into(),
                outcome: Outcome::Error("lock_lost".into()),
            },
            Kind::Fault {
                fault: Fault::Delay(Duration::from_millis(120)),
            },
            Kind::Kill,
            Kind::Reg {
                op: RegOp::Write,
                lock: "x1".into(),
                token: 5,
                hold: "h".into(),
                accepted: false,
            },
            Kind::Leak {
                lock: "x1".into(),
                state: "holders\t1".into(),
            },
        ];
        for kind in kinds {
            let e = Event {
                t: 5,
                proc_: 2,
                kind,
            };
            let back = Event::parse(&e.to_line()).unwrap();
            if let Kind::Leak { state, .. } = &back.kind {
                assert_eq!(state, "holders 1");
            } else {
                assert_eq!(back, e);
            }
        }
        assert!(Event::parse("5\t2\tok\tatt=1").is_err());
    }
}
