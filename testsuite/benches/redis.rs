//! Redis, one run, one server: dlock against the floor (raw `SET NX PX` + `EVAL`
//! compare-and-delete on one connection) and against the peers rslock and
//! distributed-lock-redis.
//!
//! Scenarios: 1 task uncontended; 64 tasks on 64 locks; 1 task's time per acquire
//! and per release (where a cycle's time goes); 8 separate clients on one
//! lock (cycles/s, per-client min and max, longest single wait, timeouts); 10 000
//! locks held by one manager while its watchdog renews them (process CPU).
//!
//! Every scenario but the last runs the implementations in interleaved, rotating
//! rounds and reports each one's median round (see `testsuite::bench::interleaved`):
//! on this 2-core VM a loopback round trip sometimes takes half as long for a second
//! or so, and a total — or one implementation after another — would let such spells
//! decide the comparison.
//!
//! Run: `cargo bench -p testsuite --bench redis` (DLOCK_REDIS_URL, default
//! redis://127.0.0.1:6379; DLOCK_BENCH_SECS per implementation and scenario, default
//! 8, split into 24 rounds for the uncontended ones and 6 for the contended one;
//! DLOCK_BENCH_ONLY=one,many,latency,
//! contended,held picks scenarios, DLOCK_BENCH_IMPL=floor,dlock implementations;
//! DLOCK_BENCH_HOLD_MS the contended scenario's hold, default 1, 0 for none).
//! Under `cargo test` it runs a short smoke pass.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use distributed_lock_core::{DistributedLock, LockHandle, LockProvider};
use dlock_api::spi::Backoff;
use dlock_api::{DistributeLockManager, LockRemoteResource};
use dlock_redis::{RedisBackend, RedisOptions};
use futures_util::StreamExt;
use testsuite::bench::{
    api_contestant, backend_selected, cpu_seconds, cycles, interleaved, is_bench, spi_contestant,
    Contestant, OneByOne, RenewCounter, Renewals,
};

/// Connections of the pooled floor (a control).
const FLOOR_POOL: usize = 4;

const RELEASE_LUA: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

struct Cfg {
    url: String,
    /// Per implementation and scenario (split into rounds).
    secs: Duration,
    rounds: u32,
    smoke: bool,
}

fn rate(n: u64, t: Duration) -> f64 {
    n as f64 / t.as_secs_f64()
}

async fn floor_conn(url: &str) -> redis::aio::ConnectionManager {
    redis::Client::open(url)
        .unwrap()
        .get_connection_manager_with_config(
            redis::aio::ConnectionManagerConfig::new()
                .set_connection_timeout(None)
                .set_response_timeout(None),
        )
        .await
        .unwrap()
}

/// One multiplexed connection without a `ConnectionManager` around it: no
/// reconnection, no reply timer, no lock per call — less client work per call than
/// any peer's (rslock's takes a tokio `Mutex` and arms a 500 ms reply timer per call,
/// and reconnects after an unrecoverable error).
async fn bare_conn(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection_with_config(
            &redis::AsyncConnectionConfig::new().set_response_timeout(None),
        )
        .await
        .unwrap()
}

/// The floor's acquire: SET NX PX.
async fn floor_acquire(conn: &mut impl redis::aio::ConnectionLike, key: &str, token: &str) -> bool {
    let set: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg(token)
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .query_async(conn)
        .await
        .unwrap();
    set.is_some()
}

/// The floor's release: EVAL compare-and-delete.
async fn floor_release(conn: &mut impl redis::aio::ConnectionLike, key: &str, token: &str) {
    let _: i64 = redis::cmd("EVAL")
        .arg(RELEASE_LUA)
        .arg(1)
        .arg(key)
        .arg(token)
        .query_async(conn)
        .await
        .unwrap();
}

/// The scripted floor's acquire script: the floor's `SET NX PX`, inside a script.
const SCRIPTED_SET_LUA: &str = "return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', 30000)";

/// The fenced floor's acquire script: the least a lock with fencing tokens can do in
/// one round trip (set the holder, advance the lock's counter only on a grant).
const FENCED_LUA: &str =
    "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', 30000) then return redis.call('INCR', KEYS[2]) end return 0";

/// The clock-fenced floor's acquire script: the fenced floor with dlock's token —
/// the server's clock in µs, or one above the last token if that is not less (as
/// dlock's `ACQUIRE_EXCLUSIVE`) — which keeps tokens increasing when the counter is
/// lost (a failover to a replica that missed the last grants, a restart without
/// persistence), where `INCR` starts again from what the new master has.
const CLOCK_FENCED_LUA: &str = r#"
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', 30000) then return 0 end
return next_token(KEYS[2])
"#;

/// The clock-floored token of the controls that keep one (as dlock's): put in front
/// of their scripts ([`with_token`]); `t`, the server's `TIME` if the script read it.
const NEXT_TOKEN_LUA: &str = r#"
local function next_token(fence, t)
  t = t or redis.call('TIME')
  local us = t[1] .. string.sub('00000' .. t[2], -6)
  local tok = tonumber(us)
  local last = tonumber(redis.call('SET', fence, us, 'GET'))
  if last and last >= tok then
    tok = last + 1
    redis.call('SET', fence, string.format('%.0f', tok))
  end
  return tok
end
"#;

/// `script` with [`NEXT_TOKEN_LUA`] in front.
fn with_token(script: &str) -> redis::Script {
    redis::Script::new(&format!("{NEXT_TOKEN_LUA}{script}"))
}

/// An `EVALSHA` of `script` with `keys` and the one argument `arg`, built once and
/// sent as it is every cycle (no per-call encoding at all).
fn evalsha(script: &redis::Script, keys: &[&str], arg: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash())
        .arg(keys.len())
        .arg(keys)
        .arg(arg);
    cmd
}

/// A fenced control's task body on `conn`: task `i` takes `<prefix>:{i}` with
/// `acquire` (KEYS: the lock, its counter; ARGV: the holder; a positive token when
/// granted) and gives it back with the floor's compare-and-delete — both by `EVALSHA`
/// commands built once (the scripts are loaded first).
async fn fenced_tasks(
    conn: redis::aio::MultiplexedConnection,
    prefix: String,
    acquire: redis::Script,
) -> impl Fn(usize, Instant) -> Pin<Box<dyn Future<Output = u64> + Send>> {
    let release = redis::Script::new(RELEASE_LUA);
    for script in [&acquire, &release] {
        script
            .prepare_invoke()
            .load_async(&mut conn.clone())
            .await
            .unwrap();
    }
    move |i: usize, end: Instant| {
        let key = format!("{prefix}:{{{i}}}");
        let take = evalsha(&acquire, &[&key, &format!("{key}:c")], "owner");
        let give = evalsha(&release, &[&key], "owner");
        let state = (conn.clone(), take, give);
        Box::pin(cycles(state, end, |(mut conn, take, give)| async move {
            let token: i64 = take.query_async(&mut conn).await.unwrap();
            assert!(token > 0);
            let released: i64 = give.query_async(&mut conn).await.unwrap();
            assert_eq!(released, 1);
            (conn, take, give)
        }))
    }
}

/// The hand-over floor's acquire: takes the free lock (`KEYS[1]`) for client
/// `ARGV[1]`, or queues the client (`KEYS[2]`); 1 when taken.
const HANDOVER_TAKE_LUA: &str = "if redis.call('SET', KEYS[1], ARGV[1], 'NX') then return 1 end \
     redis.call('RPUSH', KEYS[2], ARGV[1]) return 0";

/// The hand-over floor's release: gives the lock to the queue's head and publishes on
/// its channel (`<lock>:<client>`), or frees it when nobody waits.
const HANDOVER_RELEASE_LUA: &str = "local next = redis.call('LPOP', KEYS[2]) \
     if next then redis.call('SET', KEYS[1], next) redis.call('PUBLISH', KEYS[1] .. ':' .. next, '') return 1 end \
     redis.call('DEL', KEYS[1]) return 0";

/// A hand-over floor's lock (a control of the contended scenario): its keys (lock
/// and queue; the guarded one's: lock, fence, queue and queue data) and its two
/// scripts.
struct HandOverFloor {
    keys: Vec<String>,
    take_or_queue: redis::Script,
    hand_over: redis::Script,
    /// The guarded floor: its scripts take a holder value, a lease and a liveness.
    guarded: bool,
}

impl HandOverFloor {
    /// Client `i`'s cycle: takes the lock, or queues and waits for its notice; holds
    /// it HOLD; hands it over. A floor that waits past MAX_WAIT, or whose notices
    /// stop, is broken: it stops the bench rather than count a cycle it did not have.
    async fn cycle(
        &self,
        i: usize,
        conn: &mut redis::aio::ConnectionManager,
        notices: &mut redis::aio::PubSubStream,
    ) {
        let holder = format!("16|{i:016x}");
        let mut take = self.take_or_queue.prepare_invoke();
        let mut give = self.hand_over.prepare_invoke();
        for k in &self.keys {
            take.key(k);
            give.key(k);
        }
        if self.guarded {
            take.arg(&holder).arg(30_000).arg(i).arg(3_000);
            give.arg(&holder);
        } else {
            take.arg(i);
        }
        let taken: i64 = take.invoke_async(conn).await.unwrap();
        if taken == 0 {
            match tokio::time::timeout(MAX_WAIT, notices.next()).await {
                Ok(Some(_)) => {}
                Ok(None) => panic!("a hand-over floor's notices ended"),
                Err(_) => panic!("a hand-over floor waited past {MAX_WAIT:?}"),
            }
        }
        hold_it().await;
        let released: i64 = give.invoke_async(conn).await.unwrap();
        assert!(released >= 0, "the guarded hand-over floor lost its lock");
    }
}

/// The guarded hand-over floor's acquire (a control): the hand-over floor with what
/// dlock's queue must keep, in the fewest server calls — a lease on the grant, a
/// fencing token (the clock-floored counter, as dlock's), and for a refused caller
/// its liveness deadline and holder value beside its place in the queue, the keys
/// lapsing if nobody is left to refresh them. KEYS: lock, fence, queue, queue data.
/// ARGV: holder value, lease ms, client, liveness ms. The token when taken, else 0.
const GUARDED_TAKE_LUA: &str = r#"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return next_token(KEYS[2])
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live = tonumber(ARGV[4])
redis.call('RPUSH', KEYS[3], ARGV[3])
redis.call('HSET', KEYS[4], ARGV[3], (now + live) .. '|' .. ARGV[1])
redis.call('PEXPIRE', KEYS[3], 2 * live)
redis.call('PEXPIRE', KEYS[4], 2 * live)
return 0
"#;

/// The guarded hand-over floor's release: checks the holder value, then hands the
/// lock to the first queued client still live — its holder value, a provisional
/// lease of its remaining liveness, the next token — and publishes "<token> <lease>"
/// on its channel (`<lock>:<client>`); frees the lock when nobody live waits.
/// KEYS as [`GUARDED_TAKE_LUA`]; ARGV: holder value. -1 if not the holder.
const GUARDED_RELEASE_LUA: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
while true do
  local o = redis.call('LPOP', KEYS[3])
  if not o then
    redis.call('DEL', KEYS[1])
    return 0
  end
  local e = redis.call('HGET', KEYS[4], o)
  redis.call('HDEL', KEYS[4], o)
  if e then
    local bar = string.find(e, '|', 1, true)
    local left = tonumber(string.sub(e, 1, bar - 1)) - now
    if left > 0 then
      redis.call('SET', KEYS[1], string.sub(e, bar + 1), 'PX', left)
      local tok = next_token(KEYS[2], t)
      redis.call('PUBLISH', KEYS[1] .. ':' .. o, string.format('%.0f', tok) .. ' ' .. left)
      return 1
    end
  end
end
"#;

/// A hand-over floor's contestant: its clients, each a connection and its notices
/// (channel `<lock>:<client>`).
async fn hand_over_imp(floor: Arc<HandOverFloor>, cfg: &Cfg) -> Clients {
    let mut clients = Vec::new();
    for i in 0..CLIENTS {
        let client = redis::Client::open(cfg.url.as_str()).unwrap();
        let mut pubsub = client.get_async_pubsub().await.unwrap();
        pubsub
            .subscribe(format!("{}:{i}", floor.keys[0]))
            .await
            .unwrap();
        let conn = floor_conn(&cfg.url).await;
        clients.push(Arc::new(tokio::sync::Mutex::new((
            conn,
            pubsub.into_on_message(),
        ))));
    }
    Box::new(move |i| {
        let (floor, me) = (Arc::clone(&floor), Arc::clone(&clients[i]));
        Box::new(move || {
            let (floor, me) = (Arc::clone(&floor), Arc::clone(&me));
            Box::pin(async move {
                let (conn, notices) = &mut *me.lock().await;
                floor.cycle(i, conn, notices).await;
                true
            })
        })
    })
}

/// The fenced floor's acquire (its release is the floor's): true when granted.
async fn fenced_acquire(
    conn: &mut redis::aio::ConnectionManager,
    script: &redis::Script,
    key: &str,
    counter: &str,
    token: &str,
) -> bool {
    let fence: i64 = script
        .key(key)
        .key(counter)
        .arg(token)
        .invoke_async(conn)
        .await
        .unwrap();
    fence > 0
}

/// One floor cycle.
async fn floor_cycle(conn: &mut impl redis::aio::ConnectionLike, key: &str, token: &str) -> bool {
    if !floor_acquire(conn, key, token).await {
        return false;
    }
    floor_release(conn, key, token).await;
    true
}

async fn dlock_manager(url: &str) -> DistributeLockManager {
    dlock_manager_with(url, RedisOptions::default()).await
}

async fn dlock_manager_with(url: &str, options: RedisOptions) -> DistributeLockManager {
    DistributeLockManager::builder(RedisBackend::connect_with(url, options).await.unwrap())
        .build()
        .unwrap()
}

async fn dlr_provider(url: &str) -> distributed_lock_redis::RedisLockProvider {
    distributed_lock_redis::RedisLockProvider::new(url.to_owned())
        .await
        .unwrap()
}

/// The floor's task body on `conns`: task `i` cycles `<prefix>:<i>` on connection
/// `i` mod their number.
fn floor_tasks<C>(
    conns: Vec<C>,
    prefix: String,
) -> impl Fn(usize, Instant) -> Pin<Box<dyn Future<Output = u64> + Send>>
where
    C: redis::aio::ConnectionLike + Clone + Send + 'static,
{
    move |i: usize, end: Instant| {
        let state = (conns[i % conns.len()].clone(), format!("{prefix}:{i}"));
        Box::pin(cycles(state, end, |(mut conn, key)| async move {
            assert!(floor_cycle(&mut conn, &key, "owner").await);
            (conn, key)
        }))
    }
}

/// Scenario A (tasks = 1) and B (tasks = 64): each task cycles its own lock; the
/// implementations run in interleaved rounds against the same server.
async fn uncontended(cfg: &Cfg, tasks: usize) -> Vec<(&'static str, f64)> {
    let tag = format!("bench{:x}", fastrand::u32(..));

    let floor = floor_tasks(vec![floor_conn(&cfg.url).await], format!("{tag}:floor"));
    // Controls on one multiplexed connection without a `ConnectionManager` (the least
    // client work per call): the floor; the least a lock whose tokens survive a lost
    // counter can do (dlock's token rule in the acquire, a compare-and-delete
    // release: a design whose waiters mark the holder's value needs no other read in
    // an uncontended release); and the same with `INCR` for a token (what dropping
    // that guarantee would buy).
    let bare_floor = floor_tasks(vec![bare_conn(&cfg.url).await], format!("{tag}:bfloor"));
    let clock_fenced_floor = fenced_tasks(
        bare_conn(&cfg.url).await,
        format!("{tag}:cfloor"),
        with_token(CLOCK_FENCED_LUA),
    )
    .await;
    let incr_fenced_floor = fenced_tasks(
        bare_conn(&cfg.url).await,
        format!("{tag}:ifloor"),
        redis::Script::new(FENCED_LUA),
    )
    .await;

    // A control: the floor on a few multiplexed connections (task i on connection
    // i mod n) — what a pool of connections would give over one.
    let pooled_floor = {
        let mut conns = Vec::new();
        for _ in 0..FLOOR_POOL {
            conns.push(floor_conn(&cfg.url).await);
        }
        floor_tasks(conns, format!("{tag}:pfloor"))
    };

    let scripted_floor = {
        let conn = floor_conn(&cfg.url).await;
        let script = Arc::new(redis::Script::new(SCRIPTED_SET_LUA));
        let t = tag.clone();
        move |i: usize, end: Instant| {
            let state = (conn.clone(), Arc::clone(&script), format!("{t}:sfloor:{i}"));
            cycles(state, end, |(mut conn, script, key)| async move {
                let set: Option<String> = script
                    .key(&key)
                    .arg("owner")
                    .invoke_async(&mut conn)
                    .await
                    .unwrap();
                assert!(set.is_some());
                floor_release(&mut conn, &key, "owner").await;
                (conn, script, key)
            })
        }
    };

    let fenced_floor = {
        let conn = floor_conn(&cfg.url).await;
        let script = Arc::new(redis::Script::new(FENCED_LUA));
        let t = tag.clone();
        move |i: usize, end: Instant| {
            let key = format!("{t}:ffloor:{i}");
            let state = (conn.clone(), Arc::clone(&script), format!("{key}:c"), key);
            cycles(state, end, |(mut conn, script, counter, key)| async move {
                assert!(fenced_acquire(&mut conn, &script, &key, &counter, "owner").await);
                floor_release(&mut conn, &key, "owner").await;
                (conn, script, counter, key)
            })
        }
    };

    let manager = dlock_manager(&cfg.url).await;
    let backend: Arc<dyn LockRemoteResource> =
        Arc::new(RedisBackend::connect(&cfg.url).await.unwrap());

    let rslock = {
        let rl = Arc::new(rslock::LockManager::new(vec![cfg.url.clone()]));
        let t = tag.clone();
        move |i: usize, end: Instant| {
            let state = (Arc::clone(&rl), format!("{t}:rslock:{i}"));
            cycles(state, end, |(rl, key)| async move {
                let l = rl
                    .lock(key.as_bytes(), Duration::from_secs(30))
                    .await
                    .expect("uncontended");
                rl.unlock(&l).await;
                (rl, key)
            })
        }
    };

    let dlr = {
        let p = Arc::new(dlr_provider(&cfg.url).await);
        let t = tag.clone();
        move |i: usize, end: Instant| {
            let lock = p.create_lock(&format!("{t}:dlr:{i}"));
            cycles(lock, end, |lock| async move {
                let h = lock.try_acquire().await.unwrap().expect("uncontended");
                h.release().await.unwrap();
                lock
            })
        }
    };

    let contestants = vec![
        Contestant::tasks("floor (SET NX PX + EVAL)", tasks, floor),
        Contestant::tasks("floor on a bare connection (control)", tasks, bare_floor),
        Contestant::tasks("floor on 4 connections (control)", tasks, pooled_floor),
        Contestant::tasks(
            "floor with a scripted acquire (EVALSHA SET NX PX + EVAL)",
            tasks,
            scripted_floor,
        ),
        Contestant::tasks(
            "fenced floor (EVALSHA SET NX PX + INCR, EVAL release)",
            tasks,
            fenced_floor,
        ),
        Contestant::tasks(
            "INCR-fenced floor, bare connection (control)",
            tasks,
            incr_fenced_floor,
        ),
        Contestant::tasks(
            "clock-fenced floor: a TIME token, bare connection (control)",
            tasks,
            clock_fenced_floor,
        ),
        api_contestant(tasks, manager, {
            let t = tag.clone();
            move |i| format!("{t}:dlock:{i}")
        }),
        spi_contestant(tasks, backend, {
            let t = tag.clone();
            move |i| format!("{t}:spi:{i}")
        }),
        Contestant::tasks("rslock", tasks, rslock),
        Contestant::tasks("distributed-lock-redis", tasks, dlr),
    ];
    interleaved(contestants, cfg.rounds, cfg.secs / cfg.rounds).await
}

#[derive(Default, Debug, Clone, Copy)]
struct Client {
    cycles: u64,
    /// Cycles that ended within the round's time (the rate counts only these).
    in_time: u64,
    longest_wait: Duration,
    timeouts: u64,
}

struct Contended {
    name: &'static str,
    /// The median round's cycles/s.
    rate: f64,
    min: u64,
    max: u64,
    longest_wait: Duration,
    timeouts: u64,
}

const CLIENTS: usize = 8;
const MAX_WAIT: Duration = Duration::from_secs(5);
/// The contended scenario's hold: `DLOCK_BENCH_HOLD_MS` (default 1; 0 holds not at
/// all: release right after the grant).
fn hold() -> Duration {
    static HOLD: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *HOLD.get_or_init(|| {
        let ms = std::env::var("DLOCK_BENCH_HOLD_MS")
            .ok()
            .map(|v| v.parse::<u64>().expect("DLOCK_BENCH_HOLD_MS: milliseconds"))
            .unwrap_or(1);
        Duration::from_millis(ms)
    })
}

/// Holds for [`hold`] (not at all when it is zero).
async fn hold_it() {
    let hold = hold();
    if !hold.is_zero() {
        tokio::time::sleep(hold).await;
    }
}
/// Rounds per implementation in the contended scenario (each `secs / ROUNDS`).
const CONTENDED_ROUNDS: u32 = 6;

/// One client's loop body: acquires (waiting up to MAX_WAIT), holds HOLD, releases;
/// false on a timeout.
type Cycle = Box<dyn FnMut() -> Pin<Box<dyn Future<Output = bool> + Send>> + Send>;

/// Client `i`'s cycle of one implementation (the clients persist across rounds).
type Clients = Box<dyn Fn(usize) -> Cycle>;

/// Runs `CLIENTS` clients for `secs`, adding their counts to `totals`; returns the
/// cycles that ended within `secs` (stragglers — waiters still waiting when time is
/// up — do not stretch the round).
async fn contend_round(clients: &Clients, totals: &RefCell<Vec<Client>>, secs: Duration) -> u64 {
    let end = Instant::now() + secs;
    let handles: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let mut cycle = clients(i);
            tokio::spawn(async move {
                let mut c = Client::default();
                while Instant::now() < end {
                    let t = Instant::now();
                    if cycle().await {
                        c.cycles += 1;
                        c.in_time += u64::from(Instant::now() <= end);
                        c.longest_wait = c.longest_wait.max(t.elapsed().saturating_sub(hold()));
                    } else {
                        c.timeouts += 1;
                    }
                }
                c
            })
        })
        .collect();
    let mut in_time = 0;
    for (i, h) in handles.into_iter().enumerate() {
        let c = h.await.unwrap();
        in_time += c.in_time;
        let total = &mut totals.borrow_mut()[i];
        total.cycles += c.cycles;
        total.longest_wait = total.longest_wait.max(c.longest_wait);
        total.timeouts += c.timeouts;
    }
    in_time
}

fn contended_rounds(cfg: &Cfg) -> u32 {
    if cfg.smoke {
        1
    } else {
        CONTENDED_ROUNDS
    }
}

/// The implementations run in interleaved rounds (`interleaved`, as the
/// uncontended scenarios), so a slow spell of the VM does not fall on one of them;
/// each keeps its clients and lock across rounds. Per-client counts, the longest wait
/// and timeouts are over all rounds (the warm-up included).
async fn contended(cfg: &Cfg) -> Vec<Contended> {
    let tag = format!("bench{:x}", fastrand::u32(..));
    let mut imps: Vec<(&'static str, Clients)> = Vec::new();
    // The third dlock variant is a control: it waits as rslock does (a retry every
    // 200 ms, nobody woken), so the gap between it and rslock is the lock path itself
    // and the gap between it and the first is what waking a waiter costs here.
    let polling = RedisOptions::default().polling(Backoff::constant(Duration::from_millis(200)));
    for (label, fair, options) in [
        ("dlock non-fair", false, RedisOptions::default()),
        ("dlock fair", true, RedisOptions::default()),
        (
            "dlock non-fair, polling every 200 ms (control)",
            false,
            polling,
        ),
    ] {
        let mut locks = Vec::new();
        let name = format!("{tag}:{label}");
        for _ in 0..CLIENTS {
            let m = dlock_manager_with(&cfg.url, options.clone()).await;
            locks.push(if fair {
                m.fair_lock(&name)
            } else {
                m.lock(&name)
            });
        }
        imps.push((
            label,
            Box::new(move |i| {
                let lock = locks[i].clone();
                Box::new(move || {
                    let lock = lock.clone();
                    Box::pin(async move {
                        match lock.try_lock(MAX_WAIT).await.unwrap() {
                            Some(g) => {
                                hold_it().await;
                                g.unlock().await.unwrap();
                                true
                            }
                            None => false,
                        }
                    })
                })
            }),
        ));
    }

    // The ceiling (a control): an in-process FIFO mutex with the same hold — no
    // network, no store; what any lock can reach with this hold on this machine.
    let mutex = Arc::new(tokio::sync::Mutex::new(()));
    imps.push((
        "ceiling: in-process tokio Mutex, same hold (control)",
        Box::new(move |_| {
            let mutex = Arc::clone(&mutex);
            Box::new(move || {
                let mutex = Arc::clone(&mutex);
                Box::pin(async move {
                    let g = mutex.lock().await;
                    hold_it().await;
                    drop(g);
                    true
                })
            })
        }),
    ));

    // The hand-over floor (a control): the least a Redis lock whose release hands the
    // lock to the next waiter and wakes it with a notice can do — one script that
    // takes the lock or queues the caller, one that gives it to the queue's head and
    // publishes on the head's channel. No lease, no fencing token, no liveness, no
    // client-side bookkeeping: dlock's contended path does this and more. It serves in
    // queue order (a floor for the fair path; a non-fair lock may barge past it).
    let floor = Arc::new(HandOverFloor {
        keys: vec![
            format!("{tag}:{{handover}}"),
            format!("{tag}:{{handover}}:queue"),
        ],
        take_or_queue: redis::Script::new(HANDOVER_TAKE_LUA),
        hand_over: redis::Script::new(HANDOVER_RELEASE_LUA),
        guarded: false,
    });
    imps.push((
        "hand-over floor: a script takes or queues, the release hands over and publishes (control)",
        hand_over_imp(floor, cfg).await,
    ));

    // The guarded hand-over floor (a control): the same with a lease, a fencing
    // token and a liveness deadline per waiter — what dlock's hand-over must keep —
    // in the fewest server calls (a refusal: 7, a hand-over: 9).
    let key = format!("{tag}:{{guarded}}");
    let guarded = Arc::new(HandOverFloor {
        keys: ["", ":fence", ":queue", ":data"]
            .map(|k| format!("{key}{k}"))
            .to_vec(),
        take_or_queue: with_token(GUARDED_TAKE_LUA),
        hand_over: with_token(GUARDED_RELEASE_LUA),
        guarded: true,
    });
    imps.push((
        "guarded hand-over floor: the same with a lease, a fencing token and a liveness per waiter (control)",
        hand_over_imp(guarded, cfg).await,
    ));

    let name = Arc::new(format!("{tag}:rslock"));
    let managers: Vec<_> = (0..CLIENTS)
        .map(|_| Arc::new(rslock::LockManager::new(vec![cfg.url.clone()])))
        .collect();
    imps.push((
        "rslock",
        Box::new(move |i| {
            let rl = Arc::clone(&managers[i]);
            let name = Arc::clone(&name);
            Box::new(move || {
                let rl = Arc::clone(&rl);
                let name = Arc::clone(&name);
                Box::pin(async move {
                    // rslock retries internally (3 × 200 ms); keep asking until MAX_WAIT.
                    let until = Instant::now() + MAX_WAIT;
                    while Instant::now() < until {
                        if let Ok(l) = rl.lock(name.as_bytes(), Duration::from_secs(30)).await {
                            hold_it().await;
                            rl.unlock(&l).await;
                            return true;
                        }
                    }
                    false
                })
            })
        }),
    ));

    let mut locks = Vec::new();
    let name = format!("{tag}:dlr");
    for _ in 0..CLIENTS {
        locks.push(Arc::new(dlr_provider(&cfg.url).await.create_lock(&name)));
    }
    imps.push((
        "distributed-lock-redis",
        Box::new(move |i| {
            let lock = Arc::clone(&locks[i]);
            Box::new(move || {
                let lock = Arc::clone(&lock);
                Box::pin(async move {
                    match lock.acquire(Some(MAX_WAIT)).await {
                        Ok(h) => {
                            hold_it().await;
                            h.release().await.unwrap();
                            true
                        }
                        Err(_) => false,
                    }
                })
            })
        }),
    ));

    // Each implementation's per-client totals, kept by name: `interleaved` drops the
    // ones DLOCK_BENCH_IMPL leaves out.
    let mut totals = Vec::new();
    let mut contestants = Vec::new();
    for (name, clients) in imps {
        let mine = Rc::new(RefCell::new(vec![Client::default(); CLIENTS]));
        totals.push((name, Rc::clone(&mine)));
        let clients = Rc::new(clients);
        contestants.push(Contestant::new(
            name,
            Box::new(move |d| {
                let (clients, mine) = (Rc::clone(&clients), Rc::clone(&mine));
                Box::pin(async move { (contend_round(&clients, &mine, d).await, d) })
            }),
        ));
    }
    let rounds = contended_rounds(cfg);
    let rates = interleaved(contestants, rounds, cfg.secs / rounds).await;
    rates
        .into_iter()
        .filter_map(|(name, rate)| {
            let (_, mine) = totals.iter().find(|(n, _)| *n == name)?;
            let clients = mine.borrow();
            Some(Contended {
                name,
                rate,
                min: clients.iter().map(|c| c.cycles).min().unwrap_or(0),
                max: clients.iter().map(|c| c.cycles).max().unwrap_or(0),
                longest_wait: clients
                    .iter()
                    .map(|c| c.longest_wait)
                    .max()
                    .unwrap_or_default(),
                timeouts: clients.iter().map(|c| c.timeouts).sum(),
            })
        })
        .collect()
}

/// The latency scenario's implementations, one task, cycle after cycle.
const LATENCY_IMPLS: [&str; 5] = [
    "floor (SET NX PX / EVAL GET+DEL)",
    "floor with a scripted acquire (EVALSHA: SET NX PX)",
    "fenced floor (EVALSHA: SET NX PX, INCR)",
    "dlock (SPI, backend only)",
    "dlock (user API)",
];

/// One task: the median and 90th percentile time of each acquire and each release,
/// per implementation, in interleaved rounds. It shows where a cycle's time goes:
/// the script call itself, the fencing counter, and dlock's own client-side work.
async fn latency(cfg: &Cfg) -> Vec<(&'static str, [Duration; 4])> {
    let tag = format!("bench{:x}", fastrand::u32(..));
    let mut conn = floor_conn(&cfg.url).await;
    let set = redis::Script::new(SCRIPTED_SET_LUA);
    let fenced = redis::Script::new(FENCED_LUA);
    let backend = RedisBackend::connect(&cfg.url).await.unwrap();
    let manager = dlock_manager(&cfg.url).await;
    let lock = manager.lock(format!("{tag}:api"));
    let spi_req = dlock_api::spi::AcquireRequest::new(
        dlock_api::spi::LockName::new(format!("{tag}:spi")).unwrap(),
        dlock_api::spi::OwnerId::new("bench:latency"),
        dlock_api::spi::GrantId::new(1),
    );
    let spi_release = dlock_api::spi::ReleaseRequest::new(
        spi_req.name.clone(),
        spi_req.owner.clone(),
        spi_req.grant,
        dlock_api::LockMode::Exclusive,
        dlock_api::spi::FencingToken::new(0),
    );
    let key = format!("{tag}:floor");
    let fenced_keys = [format!("{tag}:{{f}}"), format!("{tag}:{{f}}:c")];
    let (rounds, per_round) = if cfg.smoke { (1, 20) } else { (10, 500) };
    let n = LATENCY_IMPLS.len();
    let mut acquires: Vec<Vec<Duration>> = vec![Vec::new(); n];
    let mut releases: Vec<Vec<Duration>> = vec![Vec::new(); n];
    for round in 0..rounds {
        for k in 0..n {
            let imp = (k + round) % n;
            for _ in 0..per_round {
                let t0 = Instant::now();
                let t1;
                match imp {
                    0..=2 => {
                        let key = if imp == 2 { &fenced_keys[0] } else { &key };
                        let granted = match imp {
                            0 => floor_acquire(&mut conn, key, "owner").await,
                            1 => set
                                .key(key)
                                .arg("owner")
                                .invoke_async::<Option<String>>(&mut conn)
                                .await
                                .unwrap()
                                .is_some(),
                            _ => {
                                fenced_acquire(&mut conn, &fenced, key, &fenced_keys[1], "owner")
                                    .await
                            }
                        };
                        assert!(granted);
                        t1 = Instant::now();
                        floor_release(&mut conn, key, "owner").await;
                    }
                    3 => {
                        assert!(backend.try_acquire(&spi_req).await.unwrap().is_acquired());
                        t1 = Instant::now();
                        backend.release(&spi_release).await.unwrap();
                    }
                    _ => {
                        let g = lock.try_lock(Duration::ZERO).await.unwrap().unwrap();
                        t1 = Instant::now();
                        g.unlock().await.unwrap();
                    }
                }
                acquires[imp].push(t1 - t0);
                releases[imp].push(t1.elapsed());
            }
        }
    }
    let pct = |v: &mut Vec<Duration>, p: usize| {
        v.sort();
        v[(v.len() * p / 100).min(v.len() - 1)]
    };
    let mut out = Vec::new();
    for (imp, name) in LATENCY_IMPLS.iter().enumerate() {
        let (a, r) = (&mut acquires[imp], &mut releases[imp]);
        out.push((*name, [pct(a, 50), pct(a, 90), pct(r, 50), pct(r, 90)]));
    }
    manager.close().await;
    out
}

/// CPU seconds (user + system) the Redis server has used, from `INFO cpu` (the
/// server this bench talks to alone, unlike `testsuite::bench::server_cpu_seconds`,
/// which sums every `redis-server` process on the machine).
async fn redis_cpu_seconds(c: &mut redis::aio::MultiplexedConnection) -> f64 {
    let info: String = redis::cmd("INFO").arg("cpu").query_async(c).await.unwrap();
    info.lines()
        .filter(|l| l.starts_with("used_cpu_sys:") || l.starts_with("used_cpu_user:"))
        .filter_map(|l| {
            l.split_once(':')
                .and_then(|(_, v)| v.trim().parse::<f64>().ok())
        })
        .sum()
}

/// Locks held by one manager while its watchdog renews them: renewals in batches
/// (the default) and, as a control in the same run, one call per renewal.
async fn many_held(cfg: &Cfg) {
    let runs = if cfg.smoke {
        vec![(300, Duration::from_millis(1500), Duration::from_secs(1))]
    } else {
        vec![
            (10_000, Duration::from_secs(30), Duration::from_secs(21)),
            (10_000, Duration::from_secs(3), Duration::from_secs(6)),
        ]
    };
    for (locks, lease, window) in runs {
        held_for(cfg, locks, lease, window).await;
    }
}

async fn held_for(cfg: &Cfg, locks: usize, lease: Duration, window: Duration) {
    let mut raw = redis::Client::open(cfg.url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    println!(
        "\n**{locks} locks held by one manager** (lease {lease:?}, renewed every {:?}), over {window:?}:\n",
        lease / 3
    );
    println!("| renewals | acquired in | renewals/s | calls to Redis | lost | process CPU (% of a core) | Redis CPU (% of a core) |");
    println!("|---|---|---|---|---|---|---|");
    for batched in [true, false] {
        let backend = RedisBackend::connect(&cfg.url).await.unwrap();
        let counter = Arc::new(RenewCounter::default());
        let builder = if batched {
            DistributeLockManager::builder(backend.clone())
        } else {
            DistributeLockManager::builder(OneByOne::new(backend.clone()))
        };
        let m = builder
            .lease(lease)
            .with_handler(Renewals(Arc::clone(&counter)))
            .build()
            .unwrap();
        let tag = format!("bench{:x}", fastrand::u32(..));
        let started = Instant::now();
        let mut guards = Vec::with_capacity(locks);
        for chunk in (0..locks).collect::<Vec<_>>().chunks(500) {
            let batch: Vec<_> = chunk
                .iter()
                .map(|i| {
                    let lock = m.lock(format!("{tag}:held:{i}"));
                    tokio::spawn(async move {
                        lock.try_lock(Duration::ZERO).await.unwrap().expect("free")
                    })
                })
                .collect();
            for h in batch {
                guards.push(h.await.unwrap());
            }
        }
        let took = started.elapsed();
        let (cpu0, server0, calls0, renew0, t0) = (
            cpu_seconds(),
            redis_cpu_seconds(&mut raw).await,
            backend.renewal_calls(),
            counter.get(),
            Instant::now(),
        );
        tokio::time::sleep(window).await;
        let (cpu1, server1, calls1, renew1, t1) = (
            cpu_seconds(),
            redis_cpu_seconds(&mut raw).await,
            backend.renewal_calls(),
            counter.get(),
            t0.elapsed(),
        );
        let lost = guards.iter().filter(|g| g.is_lost()).count();
        println!(
            "| {} | {:.2} s | {:.0} | {} | {lost} | {:.1} | {:.1} |",
            if batched {
                "**in batches** (default)"
            } else {
                "one call each (control)"
            },
            took.as_secs_f64(),
            rate(renew1 - renew0, t1),
            calls1 - calls0,
            100.0 * (cpu1 - cpu0) / t1.as_secs_f64(),
            100.0 * (server1 - server0) / t1.as_secs_f64(),
        );
        assert_eq!(lost, 0, "locks were lost while held");
        drop(guards);
        m.close().await;
    }
}

fn main() {
    let bench = is_bench();
    if !backend_selected("redis", "Redis") {
        return;
    }
    let cfg = Cfg {
        url: std::env::var("DLOCK_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into()),
        secs: if bench {
            Duration::from_secs_f64(
                std::env::var("DLOCK_BENCH_SECS")
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(8.0),
            )
        } else {
            Duration::from_millis(150)
        },
        rounds: if bench { 24 } else { 1 },
        smoke: !bench,
    };
    let rt = testsuite::bench::runtime();
    let only = std::env::var("DLOCK_BENCH_ONLY").unwrap_or_default();
    let want = |s: &str| only.is_empty() || only.split(',').any(|o| o == s);
    rt.block_on(async {
        for (tasks, title, key) in [(1usize, "1 task, uncontended", "one"), (64, "64 tasks on 64 locks", "many")] {
            if !want(key) {
                continue;
            }
            let rows = uncontended(&cfg, tasks).await;
            let floor = rows.first().map_or(1.0, |r| r.1);
            println!("\n**{title}** (acquire+release cycles/s)\n\n| implementation | cycles/s | × floor |\n|---|---|---|");
            for (name, r) in rows {
                println!("| {name} | {r:.0} | {:.2} |", r / floor);
            }
        }
        if want("latency") {
            println!("\n**1 task, time per call** (median / 90th percentile, µs)\n\n| implementation | acquire p50 | p90 | release p50 | p90 |\n|---|---|---|---|---|");
            for (name, [a50, a90, r50, r90]) in latency(&cfg).await {
                let us = |d: Duration| d.as_secs_f64() * 1e6;
                println!("| {name} | {:.1} | {:.1} | {:.1} | {:.1} |", us(a50), us(a90), us(r50), us(r90));
            }
        }
        if want("contended") {
        let rows = contended(&cfg).await;
        println!(
            "\n**{CLIENTS} clients on one lock** (hold {:?}, wait ≤ {MAX_WAIT:?}; cycles/s of the median of {} rounds, the rest over all rounds)\n\n| implementation | cycles/s | per-client min | per-client max | max/min | longest wait | timeouts |\n|---|---|---|---|---|---|---|",
            hold(),
            contended_rounds(&cfg)
        );
        for c in rows {
            println!(
                "| {} | {:.0} | {} | {} | {:.2} | {:.0} ms | {} |",
                c.name,
                c.rate,
                c.min,
                c.max,
                c.max as f64 / c.min.max(1) as f64,
                c.longest_wait.as_secs_f64() * 1000.0,
                c.timeouts
            );
        }
        }
        if want("held") {
            many_held(&cfg).await;
        }
    });
}
