//! The run loop of the nemeses: faults injected in rotation into random live
//! workers — or, through the deployment's [`ServerFaults`] hook, the servers —
//! until the run's deadline. Every loop here is bounded by the deadline and by a
//! step count.

use std::time::{Duration, Instant};

use crate::proxy::Fault;

use super::deployment::{log_at, Deployment, FaultRun, ServerFaults, SERVER_FAULT_BOUND};
use super::history::{now_ns, EventLog, Kind};
use super::nemesis::Nemesis;
use super::procs::Procs;

/// The pause before the next fault: 0.3–1.5 s; before a kill on a store where a
/// killed worker's holds linger ([`Deployment::kills_linger`]), 1.5–3 s, so that
/// the semaphore's permits are not all held by dead sessions for the whole run
/// (seen: 7 kills in 8 s on ZooKeeper over TLS, on a loaded CI machine, left no
/// permit granted).
fn gap_before(kind: Nemesis, kills_linger: bool, rng: &mut fastrand::Rng) -> Duration {
    let ms = if kind == Nemesis::Kill && kills_linger {
        rng.u64(1500..=3000)
    } else {
        rng.u64(300..=1500)
    };
    Duration::from_millis(ms)
}

/// Injects `kinds` in rotation into random live workers (or, through `servers`,
/// the servers) until `until`, logging SIGSTOP, SIGCONT and SIGKILL in `log` (on
/// the target's process number; proxy faults are logged by the worker that
/// applies them; server-side faults by the hook, as `down`/`up` on the
/// coordinator). `lease` scales the windows. Returns how many faults of each
/// kind were injected.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run(
    kinds: &[Nemesis],
    deployment: &dyn Deployment,
    procs: &mut Procs,
    mut servers: Option<&mut (dyn ServerFaults + '_)>,
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
    let session = deployment.rules().session_ns.map(Duration::from_nanos);
    for step in 0..10_000usize {
        let slot = step % kinds.len();
        let gap = gap_before(kinds[slot], deployment.kills_linger(), &mut rng);
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
                let draws = if deployment.resets_end_sessions() {
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
                let Some(session) = session else {
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
            kind => {
                let Some(servers) = servers.as_deref_mut() else {
                    continue;
                };
                let mut fault = FaultRun {
                    procs: &mut *procs,
                    log,
                    rng: &mut rng,
                    until,
                    lease,
                    before: injected[slot].1,
                };
                tokio::time::timeout(SERVER_FAULT_BOUND, servers.inject(kind, &mut fault))
                    .await
                    .map_err(|_| {
                        format!(
                            "the {} fault did not end within {SERVER_FAULT_BOUND:?}",
                            kind.name()
                        )
                    })??
            }
        };
        if done {
            injected[slot].1 += 1;
        }
    }
    Ok(injected)
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
