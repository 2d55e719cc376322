//! Leader election: at most one leader (checked through a fenced register), the
//! leadership moving on (resigned, dropped, lost, lapsed), observers seeing every
//! change in order, and contenders handing over without their work overlapping.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use dlock_api::{Contender, DistributeLockManager, Election, Leader, Leadership, Term, TermEnd};
use dlock_spi::Bytes;
use dlock_spi::{ErrorKind, FencingToken, LostReason};

use super::Env;
use crate::TestBackend;

/// How long a waiting candidate may take to lead once the leadership is given up:
/// one wake-up (push, or the polling backends' backoff), far below any lease.
pub const HANDOVER_BOUND: Duration = Duration::from_secs(2);

/// A store that refuses writes with a token not above the highest it has accepted,
/// as a resource guarded by fencing tokens does.
#[derive(Default)]
pub struct FencedRegister {
    state: Mutex<(u64, usize, usize)>,
}

impl FencedRegister {
    /// Writes under `token`; false (and counted) when the token is stale.
    pub fn write(&self, token: FencingToken) -> bool {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if token.get() <= s.0 {
            s.2 += 1;
            return false;
        }
        s.0 = token.get();
        s.1 += 1;
        true
    }

    /// (accepted, rejected) writes.
    pub fn counts(&self) -> (usize, usize) {
        let s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        (s.1, s.2)
    }
}

async fn lead(election: &Election, value: &str, within: Duration) -> Leadership {
    election
        .try_campaign(value.to_owned(), within)
        .await
        .expect("campaign without error")
        .unwrap_or_else(|| panic!("{value} did not lead within {within:?}"))
}

/// At most one leader at any time: 4 candidates on 4 clients take 24 terms between
/// them. Inside each term the leader checks that nobody else is inside, that
/// `leader()` names its own term and value, and writes its token to a fenced
/// register, which must accept every write (tokens grow from term to term).
pub async fn one_leader_at_a_time(backend: Arc<dyn TestBackend>) {
    const CANDIDATES: usize = 4;
    const TERMS: usize = 24;
    let env = Env::new(backend);
    let mut managers = Vec::new();
    for _ in 0..CANDIDATES {
        managers.push(env.manager().await);
    }
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let terms = Arc::new(AtomicUsize::new(0));
    let register = Arc::new(FencedRegister::default());
    let mut tasks = Vec::new();
    for (i, m) in managers.iter().enumerate() {
        let election = m.election("leader");
        let (inside, overlaps, terms, register) = (
            Arc::clone(&inside),
            Arc::clone(&overlaps),
            Arc::clone(&terms),
            Arc::clone(&register),
        );
        tasks.push(tokio::spawn(async move {
            let value = format!("candidate-{i}");
            while terms.fetch_add(1, Ordering::SeqCst) < TERMS {
                let term = lead(&election, &value, Duration::from_secs(30)).await;
                if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                let seen = election.leader().await.expect("leader()");
                let seen = seen.expect("a leader while leading");
                assert_eq!(
                    seen.token,
                    term.fencing_token(),
                    "leader() names another term"
                );
                assert_eq!(seen.value, Bytes::from(value.clone()));
                assert_eq!(&seen.owner, term.owner());
                register.write(term.fencing_token());
                tokio::time::sleep(Duration::from_millis(5)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                term.resign().await.expect("resign");
            }
        }));
    }
    for t in tasks {
        t.await.expect("candidate task");
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two leaders at once");
    assert_eq!(
        register.counts(),
        (TERMS, 0),
        "the fenced register refused a leader's write"
    );
    assert!(managers[0]
        .election("leader")
        .leader()
        .await
        .expect("leader()")
        .is_none());
    let refs: Vec<&DistributeLockManager> = managers.iter().collect();
    env.finish(&refs).await;
}

/// The leadership moves on at once when the leader resigns or drops its term, and
/// when the term is lost (removed behind its back, or — lease backends — its lease
/// lapses unrenewed: the old leader's lost signal fires before the new one leads).
/// An invalid election name is refused.
pub async fn leadership_moves_on(backend: Arc<dyn TestBackend>) {
    let env = Env::new(backend);
    let lease = Duration::from_secs(3);
    let a = env.manager_with(|b| b.lease(lease)).await;
    let b = env.manager_with(|b| b.lease(lease)).await;
    let (ea, eb) = (a.election("moves"), b.election("moves"));

    // Resigned: the waiting candidate leads within one wake-up.
    let first = lead(&ea, "a", Duration::ZERO).await;
    let waiting = tokio::spawn(async move {
        let l = eb.campaign("b").await.expect("campaign");
        (l, Instant::now())
    });
    let queued = super::eventually(Duration::from_secs(5), || async {
        ea.leader().await.ok().flatten().is_some() && super::waiters(&a, "moves").await > 0
    })
    .await;
    assert!(queued, "the second candidate never showed as waiting");
    let resigned_at = Instant::now();
    let first_token = first.fencing_token();
    first.resign().await.expect("resign");
    let (second, led_at) = tokio::time::timeout(HANDOVER_BOUND * 2, waiting)
        .await
        .expect("the waiting candidate leads after a resignation")
        .expect("task");
    assert!(
        led_at.duration_since(resigned_at) < HANDOVER_BOUND,
        "handover took {:?}",
        led_at.duration_since(resigned_at)
    );
    assert!(second.fencing_token() > first_token);

    // Dropped: given back in the background, the next candidate leads.
    let second_token = second.fencing_token();
    drop(second);
    let third = lead(&ea, "a", HANDOVER_BOUND).await;
    assert!(third.fencing_token() > second_token);

    // Lost behind its back: the lost signal fires, the leadership is free again.
    env.backend()
        .steal(&env.full("moves"))
        .await
        .expect("steal");
    let reason = tokio::time::timeout(lease, third.lost())
        .await
        .expect("the lost signal fires after the term was removed");
    assert!(
        matches!(reason, LostReason::NotOwner | LostReason::SessionExpired),
        "{reason}"
    );
    let err = third
        .proclaim("late")
        .await
        .expect_err("proclaim after the loss");
    assert_eq!(err.kind(), ErrorKind::LockLost);
    let fourth = lead(&b.election("moves"), "b", HANDOVER_BOUND).await;
    fourth.resign().await.expect("resign");
    drop(third);

    // Lapsed: a leader whose lease is not renewed (a frozen process, as the store
    // sees it) loses its term; its lost signal fires before anyone else leads.
    if a.capabilities().lease {
        let frozen = env
            .manager_with(|b| b.lease(Duration::from_millis(600)).watchdog(false))
            .await;
        let term = lead(&frozen.election("moves"), "frozen", Duration::ZERO).await;
        let signal = term.lost_signal();
        let lost_at = tokio::spawn(async move {
            signal.lost().await;
            Instant::now()
        });
        let next = lead(&b.election("moves"), "b", Duration::from_secs(5)).await;
        let next_at = Instant::now();
        let lost_at = lost_at.await.expect("task");
        assert!(
            lost_at <= next_at,
            "the lapsed leader learned of its loss {:?} after the next one led",
            lost_at - next_at
        );
        assert!(next.fencing_token() > term.fencing_token());
        next.resign().await.expect("resign");
        drop(term);
        frozen.close().await;
    }

    let err = a
        .election("")
        .campaign("x")
        .await
        .expect_err("an empty election name");
    assert_eq!(err.kind(), ErrorKind::InvalidName);
    env.finish(&[&a, &b]).await;
}

/// An observer sees every change in order: nobody, a leader, the value it
/// proclaims, nobody, the next leader, nobody — each answered once, terms growing;
/// on a backend with change feeds, without polling.
pub async fn observers_see_every_change_in_order(backend: Arc<dyn TestBackend>) {
    let env = Env::new(backend);
    let (a, b) = env.two_managers().await;
    let follower = env.manager().await;
    // A backend that pushes changes must not need polling: its observer's interval
    // is an hour, and every change must still arrive within the step's bound.
    let pushes = env
        .backend()
        .client()
        .await
        .expect("client")
        .events()
        .is_some();
    let interval = if pushes {
        Duration::from_secs(3600)
    } else {
        Duration::from_millis(20)
    };
    let election = follower.election("observed").observe_interval(interval);
    let mut observer = election.observe();
    // The observer runs on its own, as a follower would: a change made while it
    // waits must wake it (a change made between two of its reads would be caught by
    // the next read anyway). Each change below is made once it has had time to park.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let follow = tokio::spawn(async move {
        loop {
            let change = observer.changed().await.expect("observe without error");
            if tx.send(change).is_err() {
                return;
            }
        }
    });
    let summary = |l: &Option<Leader>| l.as_ref().map(|l| (l.token, l.value.clone()));

    assert_eq!(summary(&next(&mut rx).await), None);
    let first = lead(&a.election("observed"), "a1", Duration::ZERO).await;
    let t1 = first.fencing_token();
    assert_eq!(summary(&next(&mut rx).await), Some((t1, Bytes::from("a1"))));
    first.proclaim("a2").await.expect("proclaim");
    assert_eq!(first.value(), Bytes::from("a2"));
    assert_eq!(summary(&next(&mut rx).await), Some((t1, Bytes::from("a2"))));
    first.resign().await.expect("resign");
    assert_eq!(summary(&next(&mut rx).await), None);
    let second = lead(&b.election("observed"), "b1", Duration::ZERO).await;
    let t2 = second.fencing_token();
    assert!(t2 > t1);
    let seen = next(&mut rx).await.expect("a leader");
    assert_eq!((seen.token, seen.value.clone()), (t2, Bytes::from("b1")));
    assert_eq!(&seen.owner, second.owner());
    second.resign().await.expect("resign");
    assert_eq!(summary(&next(&mut rx).await), None);
    follow.abort();
    env.finish(&[&a, &b, &follower]).await;
}

/// The observer task's next report, within 3 s (less than a change feed's
/// safety-net re-read: a pushed change must arrive by itself); then a pause for the
/// observer to park again before the test changes anything.
async fn next(rx: &mut tokio::sync::mpsc::UnboundedReceiver<Option<Leader>>) -> Option<Leader> {
    let change = tokio::time::timeout(Duration::from_secs(3), rx.recv())
        .await
        .expect("the observer sees the change within 3 s")
        .expect("observer alive");
    tokio::time::sleep(Duration::from_millis(100)).await;
    change
}

/// Simba's transition window: a leader whose renewals stop is suspended once its
/// own lease passed (and, where the store records it, shown in transition), may
/// still renew in the window and keep its term, and when it stops renewing for good
/// its lost signal fires before anyone else leads, which nobody does before the
/// window is over. (Lease backends; a session-bound term has no window.)
pub async fn a_leader_in_transition_keeps_its_term(backend: Arc<dyn TestBackend>) {
    let env = Env::new(backend);
    let own = Duration::from_millis(600);
    let window = Duration::from_millis(900);
    let other = env.manager().await;
    if !other.capabilities().lease {
        env.finish(&[&other]).await;
        return;
    }
    let frozen = env.manager_with(|b| b.lease(own).watchdog(false)).await;
    let election = frozen.election("window").transition(window);
    let term = lead(&election, "a", Duration::ZERO).await;
    let granted = Instant::now();
    assert!(!term.is_suspended());
    let rival = other.election("window");
    let waiting = tokio::spawn(async move {
        let l = rival.campaign("b").await.expect("campaign");
        (l, Instant::now())
    });
    // Suspended once its own lease passed (no renewals), not lost.
    let suspended = super::eventually(own + Duration::from_millis(300), || async {
        term.is_suspended()
    })
    .await;
    assert!(suspended, "not suspended after its own lease");
    assert!(granted.elapsed() >= own / 2, "suspended too early");
    assert!(!term.is_lost(), "lost at the start of the window");
    let seen = election
        .leader()
        .await
        .expect("leader()")
        .expect("a leader");
    assert_eq!(seen.token, term.fencing_token());
    if seen.remaining_ttl.is_some() {
        // The local suspension comes a margin early; the store's clock follows.
        let shown = super::eventually(Duration::from_millis(300), || async {
            election
                .leader()
                .await
                .ok()
                .flatten()
                .is_some_and(|l| l.in_transition())
        })
        .await;
        assert!(shown, "the store does not show the window: {seen:?}");
    }
    // Renewing in the window keeps the term.
    let renewed_at = Instant::now();
    term.proclaim("a2").await.expect("a renewal in the window");
    assert!(!term.is_suspended(), "still suspended after renewing");
    let seen = election
        .leader()
        .await
        .expect("leader()")
        .expect("a leader");
    assert_eq!(
        (seen.token, seen.value.clone()),
        (term.fencing_token(), Bytes::from("a2"))
    );
    assert!(
        !seen.in_transition(),
        "the store still shows the window after the renewal: {seen:?}"
    );
    assert!(!waiting.is_finished(), "someone else led during the window");
    // Then no more renewals: the loss fires before the rival leads, which is not
    // before the window after the renewal is over.
    let signal = term.lost_signal();
    let lost_at = tokio::spawn(async move {
        signal.lost().await;
        Instant::now()
    });
    let (next, led_at) = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the rival leads after the window")
        .expect("task");
    let lost_at = lost_at.await.expect("task");
    assert!(
        lost_at <= led_at,
        "the old leader learned of its loss after the next one led"
    );
    assert!(
        led_at.duration_since(renewed_at) >= own + window - Duration::from_millis(50),
        "the rival led {:?} after the renewal, inside the window",
        led_at.duration_since(renewed_at)
    );
    assert!(next.fencing_token() > term.fencing_token());
    next.resign().await.expect("resign");
    drop(term);
    env.finish(&[&frozen, &other]).await;
}

/// What the contenders of one test did, in order.
#[derive(Default)]
struct Log {
    events: Mutex<Vec<(usize, &'static str, FencingToken)>>,
    working: AtomicUsize,
    overlaps: AtomicUsize,
}

impl Log {
    fn push(&self, who: usize, what: &'static str, token: FencingToken) {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((who, what, token));
    }

    fn events(&self) -> Vec<(usize, &'static str, FencingToken)> {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

struct Worker {
    who: usize,
    log: Arc<Log>,
    register: Arc<FencedRegister>,
}

#[async_trait]
impl Contender for Worker {
    async fn on_acquired(&self, term: Term) {
        if self.log.working.fetch_add(1, Ordering::SeqCst) != 0 {
            self.log.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        self.log.push(self.who, "start", term.fencing_token());
        self.register.write(term.fencing_token());
        tokio::select! {
            () = term.stepping_down() => {}
            () = tokio::time::sleep(Duration::from_millis(150)) => {}
        }
        // Winding down takes a while: a leadership given back before the work ended
        // would let the other contender start meanwhile.
        tokio::time::sleep(Duration::from_millis(60)).await;
        self.log.push(self.who, "end", term.fencing_token());
        self.log.working.fetch_sub(1, Ordering::SeqCst);
    }

    async fn on_released(&self, term: Term, end: TermEnd) {
        let what = match end {
            TermEnd::Stopped => "released:stopped",
            TermEnd::WorkDone => "released:done",
            _ => "released:lost",
        };
        self.log.push(self.who, what, term.fencing_token());
    }
}

/// Two contenders in one process take turns (work that returns ends the term and
/// requeues the contender); stopping the leader mid-term lets its work wind down
/// first: the other contender starts only after the stopped one's work ended and
/// `on_released` ran. Terms never overlap and their tokens grow.
pub async fn contenders_hand_over_without_overlap(backend: Arc<dyn TestBackend>) {
    let env = Env::new(backend);
    let (a, b) = env.two_managers().await;
    let log = Arc::new(Log::default());
    let register = Arc::new(FencedRegister::default());
    let worker = |who| Worker {
        who,
        log: Arc::clone(&log),
        register: Arc::clone(&register),
    };
    let first = a
        .election("contended")
        .contend("a", worker(0))
        .expect("contend");
    let second = b
        .election("contended")
        .contend("b", worker(1))
        .expect("contend");
    // Turns: at least two terms each.
    let turns = super::eventually(Duration::from_secs(20), || async {
        let ev = log.events();
        (0..2).all(|w| ev.iter().filter(|e| e.0 == w && e.1 == "start").count() >= 2)
    })
    .await;
    assert!(
        turns,
        "the contenders did not take turns: {:?}",
        log.events()
    );
    // Stop whichever leads, mid-term.
    // Stop it right after a term of its starts, well before the work would end.
    let mut leading = first.leading();
    tokio::time::timeout(Duration::from_secs(10), async {
        leading.wait_for(|t| t.is_none()).await.map(|_| ())?;
        leading.wait_for(|t| t.is_some()).await.map(|_| ())
    })
    .await
    .expect("the first contender leads again")
    .expect("contention alive");
    first.stop().await;
    let stopped_at = log.events().len();
    let resumed = super::eventually(Duration::from_secs(10), || async {
        log.events()[stopped_at..]
            .iter()
            .any(|e| e.0 == 1 && e.1 == "start")
    })
    .await;
    assert!(
        resumed,
        "the other contender did not take over: {:?}",
        log.events()
    );
    second.stop().await;

    let events = log.events();
    assert_eq!(
        log.overlaps.load(Ordering::SeqCst),
        0,
        "work overlapped: {events:?}"
    );
    // Every term: start, end, released — in that order, and never interleaved.
    let mut last: Option<FencingToken> = None;
    for term in events.chunks(3) {
        let [(w0, s, t0), (w1, e, t1), (w2, r, t2)] = term else {
            panic!("an unfinished term: {events:?}");
        };
        assert!(
            *s == "start" && *e == "end" && r.starts_with("released:"),
            "{events:?}"
        );
        assert!(w0 == w1 && w1 == w2 && t0 == t1 && t1 == t2, "{events:?}");
        assert!(
            last.is_none_or(|l| *t0 > l),
            "tokens did not grow: {events:?}"
        );
        last = Some(*t0);
    }
    assert!(
        events.iter().any(|e| e.0 == 0 && e.1 == "released:stopped"),
        "the first contender was stopped while leading: {events:?}"
    );
    let (accepted, rejected) = register.counts();
    assert_eq!((accepted, rejected), (events.len() / 3, 0));
    env.finish(&[&a, &b]).await;
}
