//! `cycles` — a fixed number of uncontended acquire + release cycles, for counting
//! the client's instructions per cycle under `valgrind --tool=callgrind`
//! (`scripts/instructions` runs it twice per case and takes the difference, so the
//! start, the connections and the warm-up cancel out).
//!
//! ```text
//! cycles --url <backend URL> --mode floor|spi|api [--cycles 2000] [--tasks 1]
//! ```
//!
//! * `floor` (Redis URLs only): `SET NX PX` and an `EVAL` compare-and-delete on one
//!   multiplexed connection — the least a client does for a lock;
//! * `spi`: the backend alone (`dlock_api::open_backend`), as `testsuite::bench`'s
//!   SPI contestant;
//! * `api`: the user API (`DistributeLockManager::connect`, `try_lock` + `unlock`).
//!
//! Each of `--tasks` tasks cycles its own lock `--cycles` times after 100 uncounted
//! warm-up cycles, on the benchmarks' runtime (2 worker threads). Exit status 0, or
//! 2 with a message when the arguments or the run fail.

use std::process::ExitCode;
use std::sync::Arc;

use dlock_api::DistributeLockManager;
use dlock_spi::{AcquireRequest, GrantId, LockName, LockRemoteResource, OwnerId};

const USAGE: &str =
    "usage: cycles --url <backend URL> --mode floor|spi|api [--cycles N] [--tasks T]";

/// Uncounted cycles before the counted ones.
const WARMUP: u64 = 100;

/// The floor's release: compare-and-delete.
const RELEASE_LUA: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Floor,
    Spi,
    Api,
}

struct Args {
    url: String,
    mode: Mode,
    cycles: u64,
    tasks: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let (mut url, mut mode, mut cycles, mut tasks) = (None, None, 2000u64, 1usize);
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value; {USAGE}"))?;
        match flag.as_str() {
            "--url" => url = Some(value),
            "--mode" => {
                mode = Some(match value.as_str() {
                    "floor" => Mode::Floor,
                    "spi" => Mode::Spi,
                    "api" => Mode::Api,
                    _ => return Err(format!("--mode {value}: expected floor, spi or api")),
                })
            }
            "--cycles" => {
                cycles = value
                    .parse()
                    .map_err(|_| format!("--cycles {value}: expected a number"))?
            }
            "--tasks" => {
                tasks = value
                    .parse()
                    .ok()
                    .filter(|t| *t > 0)
                    .ok_or_else(|| format!("--tasks {value}: expected a positive number"))?
            }
            _ => return Err(format!("unknown flag {flag}; {USAGE}")),
        }
    }
    Ok(Args {
        url: url.ok_or_else(|| format!("--url is required; {USAGE}"))?,
        mode: mode.ok_or_else(|| format!("--mode is required; {USAGE}"))?,
        cycles,
        tasks,
    })
}

/// One floor cycle on `conn`: true when both commands answered as an uncontended
/// lock's do.
async fn floor_cycle(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> bool {
    let set: redis::RedisResult<Option<String>> = redis::cmd("SET")
        .arg(key)
        .arg("t")
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .query_async(conn)
        .await;
    let released: redis::RedisResult<i64> = redis::cmd("EVAL")
        .arg(RELEASE_LUA)
        .arg(1)
        .arg(key)
        .arg("t")
        .query_async(conn)
        .await;
    matches!((set, released), (Ok(Some(_)), Ok(1)))
}

/// What the tasks cycle on.
enum Target {
    Floor(redis::aio::MultiplexedConnection),
    Spi(Arc<dyn LockRemoteResource>),
    Api(DistributeLockManager),
}

async fn run(args: Args) -> Result<(), String> {
    let target = match args.mode {
        Mode::Floor => {
            let client = redis::Client::open(args.url.as_str()).map_err(|e| e.to_string())?;
            Target::Floor(
                client
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(|e| e.to_string())?,
            )
        }
        Mode::Spi => Target::Spi(
            dlock_api::open_backend(&args.url)
                .await
                .map_err(|e| e.to_string())?,
        ),
        Mode::Api => Target::Api(
            DistributeLockManager::connect(&args.url)
                .await
                .map_err(|e| e.to_string())?,
        ),
    };
    let tag = format!("cycles{:x}", fastrand::u32(..));
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..args.tasks {
        let name = format!("{tag}:{t}");
        let total = WARMUP + args.cycles;
        match &target {
            Target::Floor(conn) => {
                let mut conn = conn.clone();
                tasks.spawn(async move {
                    for _ in 0..total {
                        if !floor_cycle(&mut conn, &name).await {
                            return Err("a floor cycle was refused".to_owned());
                        }
                    }
                    Ok(())
                });
            }
            Target::Spi(backend) => {
                let backend = Arc::clone(backend);
                let req = AcquireRequest::new(
                    LockName::new(name).map_err(|e| e.to_string())?,
                    OwnerId::new(format!("{tag}-{t}")),
                    GrantId::new(1),
                );
                tasks.spawn(async move {
                    for _ in 0..total {
                        testsuite::bench::spi_cycle(backend.as_ref(), &req).await;
                    }
                    Ok(())
                });
            }
            Target::Api(manager) => {
                let lock = manager.lock(&name);
                tasks.spawn(async move {
                    for _ in 0..total {
                        testsuite::bench::api_cycle(&lock).await;
                    }
                    Ok(())
                });
            }
        }
    }
    while let Some(done) = tasks.join_next().await {
        done.map_err(|e| e.to_string())??;
    }
    if let Target::Api(manager) = target {
        manager.close().await;
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("cycles: {e}");
            return ExitCode::from(2);
        }
    };
    match testsuite::bench::runtime().block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cycles: {e}");
            ExitCode::from(2)
        }
    }
}
