//! The statements dlock runs, in the SQL each dialect speaks, with the table prefix
//! filled in.
//!
//! Templates are written with `$N` placeholders. PostgreSQL takes them as they are,
//! SQLite as `?N`, and MariaDB/MySQL as bare `?` bound in order of appearance (see
//! [`Stmt`]). Every timestamp is the database's clock in epoch milliseconds (`NOW`).

use dlock_spi::{Error, ErrorKind, Result};

use crate::dialect::Dialect;
use crate::permits;

/// A statement ready to run: its text in the dialect's placeholder style and the
/// order in which the logical parameters `$1…$n` are bound.
#[derive(Debug, Clone)]
pub(crate) struct Stmt {
    pub(crate) sql: std::sync::Arc<str>,
    pub(crate) order: Vec<usize>,
    /// PostgreSQL behind a transaction pooler: the statement runs with its
    /// parameters written into its text, in the simple protocol ([`crate::inline`]).
    pub(crate) inline: bool,
}

impl Stmt {
    /// The text to run in the simple protocol, with `params` written in, when the
    /// statement runs so ([`Self::inline`]); `None` when it is bound.
    pub(crate) fn inlined(&self, params: &[crate::param::Param<'_>]) -> Option<String> {
        self.inline
            .then(|| crate::inline::render(&self.sql, params))
    }

    fn new(dialect: Dialect, template: &str, prefix: &str, inline: bool) -> Self {
        let template = template
            .replace("EXCLUSIVE_ROW", EXCLUSIVE_ROW)
            .replace("EXCLUSIVE_GATE", EXCLUSIVE_GATE)
            .replace("SHARED_GATE", SHARED_GATE)
            .replace("PERMIT_ROOM", &permits::room(dialect, PERMIT_ROOM))
            .replace("PERMIT_GATE", PERMIT_GATE)
            .replace("PAYLOAD_IF_WAITED", PAYLOAD_IF_WAITED)
            .replace("RELEASE_PAYLOAD", RELEASE_PAYLOAD)
            .replace("NEXT_PAYLOAD", NEXT_PAYLOAD)
            .replace("NAME_BYTES", dialect.name_bytes())
            .replace("NOT_THE_HOLDER", NOT_THE_HOLDER)
            .replace("COMMIT_QUICKLY", COMMIT_QUICKLY)
            .replace("PERMITS_USED", &permits::used_by_others(dialect))
            .replace("{locks}", &format!("{prefix}locks"))
            .replace("{readers}", &format!("{prefix}readers"))
            .replace("{waiters}", &format!("{prefix}waiters"))
            .replace("{schema}", &format!("{prefix}schema_version"))
            .replace("{channel}", &format!("{prefix}release"))
            .replace("{change_channel}", &format!("{prefix}change"))
            .replace("{owner}", dialect.owner_text())
            .replace("INT64", dialect.int64())
            .replace("GREATEST(", &format!("{}(", dialect.greatest()))
            .replace("CLOCK_US", dialect.clock_us())
            .replace("NOW", dialect.now_ms());
        let mut sql = String::with_capacity(template.len());
        let mut order = Vec::new();
        let mut highest = 0;
        let mut chars = template.char_indices().peekable();
        while let Some((_, c)) = chars.next() {
            if c != '$' || !chars.peek().is_some_and(|(_, d)| d.is_ascii_digit()) {
                sql.push(c);
                continue;
            }
            let mut n = 0usize;
            while let Some(&(_, d)) = chars.peek() {
                let Some(v) = d.to_digit(10) else { break };
                n = n * 10 + v as usize;
                chars.next();
            }
            highest = highest.max(n);
            match dialect {
                Dialect::Postgres => sql.push_str(&format!("${n}")),
                Dialect::Sqlite => sql.push_str(&format!("?{n}")),
                Dialect::MySql => {
                    sql.push('?');
                    order.push(n - 1);
                }
            }
        }
        if dialect != Dialect::MySql {
            order = (0..highest).collect();
        }
        Stmt {
            sql: sql.into(),
            order,
            inline: inline && dialect == Dialect::Postgres,
        }
    }
}

/// Checks a table prefix: it is pasted into SQL, so only identifier characters pass.
pub(crate) fn validate_prefix(prefix: &str) -> Result<()> {
    let ok = !prefix.is_empty()
        && prefix.len() <= 40
        && prefix
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !prefix.starts_with(|c: char| c.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(Error::new(
            ErrorKind::Config,
            format!(
                "table prefix {prefix:?} is not allowed; use 1–40 ASCII letters, digits or '_', not starting with a digit (e.g. \"dlock_\")"
            ),
        ))
    }
}

/// What [`Exclusive::acquire_unqueued`] answers for a free lock whose queue
/// may hold live waiters (a token is a clock reading in microseconds, never 1).
pub(crate) const ASK_THE_QUEUE: i64 = 1;

/// PostgreSQL: a condition, always true, that makes the statement's own transaction
/// commit asynchronously (`synchronous_commit = off` for that transaction alone, as
/// `SET LOCAL` would: the statement runs in a transaction of its own). For the
/// writes whose loss in a database crash is safe — a lock release (the lock stays
/// held until its lease ends, and nobody uses it), a queue entry or its removal (a
/// waiter's place, written again at its next refresh, or one that lapses with its
/// liveness) — so that they do not wait for the WAL flush, nor queue the grants'
/// flushes behind theirs. Grants and renewals stay synchronous: a grant or a lease
/// the database forgot would let the lock be granted twice. Any later synchronous
/// commit flushes the WAL up to its own record, so a grant that read a release
/// makes that release durable with it.
pub(crate) const COMMIT_QUICKLY: &str = "set_config('synchronous_commit', 'off', true) = 'off'";

/// The row an exclusive grant proposes (SQLite, PostgreSQL): `$2` holds `$1` for
/// `$3` ms (its own lease `$6`), with context `$4` and a clock-floored token.
const EXCLUSIVE_ROW: &str = "$1, $2, CLOCK_US, $4, NOW, NOW + $3, 0, 0, NOW + $6";

/// Whether the lock's row `row` lets `owner` take it exclusively (SQLite,
/// PostgreSQL): held by `owner` itself (a re-entrant grant) or free — no live holder
/// — with the queue letting `owner` in, and either way past the readers' horizon:
/// the exclusive upsert's `DO UPDATE` condition. PostgreSQL also reads it on the
/// statement's snapshot before it proposes its row (see
/// [`Exclusive::acquire`]).
fn exclusive_grantable(row: &str, owner: &str) -> String {
    format!(
        "(({row}.owner = {owner} AND {row}.expires_at > NOW) \
           OR (({row}.owner IS NULL OR {row}.expires_at <= NOW) AND EXCLUSIVE_GATE)) \
         AND {row}.shared_until <= NOW"
    )
}

/// Whether waiters queued ahead let `$2` take a free lock exclusively: no live waiter
/// other than `$2` that arrived before it (a caller not queued arrived after
/// everyone) and has waited at least `$5` ms — every such waiter in fair mode
/// (`$5` < 0), only the starving ones in non-fair mode. Arrival ties are broken by the
/// waiter's identity, so of two waiters exactly one is ahead.
const EXCLUSIVE_GATE: &str = "NOT EXISTS (SELECT 1 FROM {waiters} w \
     WHERE w.name = $1 AND w.alive_until > NOW AND w.waiter <> $2 \
       AND ($5 < 0 OR w.arrived <= NOW - $5) \
       AND NOT EXISTS (SELECT 1 FROM {waiters} me WHERE me.name = $1 AND me.waiter = $2 \
         AND (me.arrived < w.arrived OR (me.arrived = w.arrived AND me.waiter < w.waiter))))";

/// Whether queue entry `w` is not the live exclusive holder's own (evaluated on the
/// lock's row): a granted writer's entry is removed beside its hold, and until then
/// it is no waiter (see `crate::queue`).
const NOT_THE_HOLDER: &str =
    "({locks}.owner IS NULL OR {locks}.expires_at <= NOW OR w.waiter <> {locks}.owner)";

/// Whether waiters queued ahead let reader `$3` in: no live waiting *writer* that
/// arrived before it (fair or not, new readers stand back for a waiting writer, so
/// writers are not starved; readers never wait for readers).
const SHARED_GATE: &str = "NOT EXISTS (SELECT 1 FROM {waiters} w \
     WHERE w.name = $1 AND w.alive_until > NOW AND w.waiter <> $3 AND w.mode = 'x' \
       AND NOT EXISTS (SELECT 1 FROM {waiters} me WHERE me.name = $1 AND me.waiter = $3 \
         AND (me.arrived < w.arrived OR (me.arrived = w.arrived AND me.waiter < w.waiter))))";

/// Whether the only live reader of `$1` is the hold `$7` (so the readers' horizon
/// may stand for an upgrade beside it), and no permits are held.
fn only_reader(dialect: Dialect) -> String {
    format!(
        "(EXISTS (SELECT 1 FROM {{readers}} r WHERE r.name = $1 AND r.owner = $7 AND r.expires_at > NOW) \
         AND NOT EXISTS (SELECT 1 FROM {{readers}} r WHERE r.name = $1 AND r.owner <> $7 AND r.expires_at > NOW) \
         AND NOT {})",
        permits::any_live(dialect)
    )
}

/// Whether permit requester `$2` is first in the semaphore's queue: no live waiter
/// other than `$2` arrived before it (a caller not queued arrived after everyone).
/// Permits are served in arrival order whatever the fairness, so a request for many
/// is not starved by requests for few.
const PERMIT_GATE: &str = "NOT EXISTS (SELECT 1 FROM {waiters} w \
     WHERE w.name = $1 AND w.alive_until > NOW AND w.waiter <> $2 \
       AND NOT EXISTS (SELECT 1 FROM {waiters} me WHERE me.name = $1 AND me.waiter = $2 \
         AND (me.arrived < w.arrived OR (me.arrived = w.arrived AND me.waiter < w.waiter))))";

/// PostgreSQL and SQLite: the payload of a release notice of lock `$1` — the name's length in
/// bytes, `:`, the name, then the live waiter first in the lock's queue (arrival
/// order, as the gates read it), if one waits, as its mode and key (`x<owner>#<grant>`).
/// The listener wakes that waiter alone when it is a writer (nobody else can take
/// the lock before it in fair mode, and waking more costs every other process an
/// attempt), and one local waiter otherwise (see [`crate::wakeups::ReleaseNotice`]).
pub(crate) const RELEASE_PAYLOAD: &str = "NAME_BYTES || ':' || $1 || \
     COALESCE((SELECT w.mode || w.waiter FROM {waiters} w \
       WHERE w.name = $1 AND w.alive_until > NOW ORDER BY w.arrived, w.waiter LIMIT 1), '')";

/// SQLite: [`RELEASE_PAYLOAD`] when a live waiter is queued for lock `$1`, NULL
/// otherwise (nobody to tell).
pub(crate) const PAYLOAD_IF_WAITED: &str = "CASE WHEN EXISTS (SELECT 1 FROM {waiters} w \
       WHERE w.name = $1 AND w.alive_until > NOW) THEN RELEASE_PAYLOAD END";

/// [`RELEASE_PAYLOAD`] naming the first live waiter other than `$2` (one leaving
/// the queue in the same statement).
const NEXT_PAYLOAD: &str = "NAME_BYTES || ':' || $1 || \
     COALESCE((SELECT w.mode || w.waiter FROM {waiters} w \
       WHERE w.name = $1 AND w.alive_until > NOW AND w.waiter <> $2 \
       ORDER BY w.arrived, w.waiter LIMIT 1), '')";

/// Whether `$2` may take `$4` of the `$5` permits of semaphore `$1` (evaluated on its
/// `locks` row): no live exclusive holder nor `readers` row (a read lock, or a permit
/// holder of schema version 4), first in the queue, the same total (or an idle
/// semaphore, whose total then changes), and room (`PERMITS_USED`: the permits of the
/// row's live holders other than `$2`, see [`permits`]).
const PERMIT_ROOM: &str = "(owner IS NULL OR expires_at <= NOW) AND PERMIT_GATE \
     AND NOT EXISTS (SELECT 1 FROM {readers} r WHERE r.name = $1 AND r.expires_at > NOW) \
     AND (capacity = $5 OR (PERMITS_USED = 0 AND NOT EXISTS (SELECT 1 FROM {waiters} o \
       WHERE o.name = $1 AND o.alive_until > NOW AND o.waiter <> $2))) \
     AND PERMITS_USED + $4 <= $5";

/// Every statement the backend runs, built once per connection pool, by what it
/// works on.
#[derive(Debug, Clone)]
pub(crate) struct Statements {
    /// An exclusive hold's statements: grant, release, renew.
    pub(crate) exclusive: Exclusive,
    /// A read hold's statements: the lock row's readers' horizon and the readers' rows.
    pub(crate) shared: Shared,
    /// The waiters' queue: joining, leaving, reading one's place.
    pub(crate) queue: Queue,
    /// A semaphore's statements (see [`crate::permits`]).
    pub(crate) permits: Permits,
    /// Reading and clearing a lock's state, for operators ([`dlock_spi::LockAdmin`]).
    pub(crate) admin: Admin,
    /// Release and change notices sent on their own.
    pub(crate) notices: Notices,
}

/// An exclusive hold's statements: grant, release, renew.
#[derive(Debug, Clone)]
pub(crate) struct Exclusive {
    /// `$1` name, `$2` owner, `$3` lease ms, `$4` context, `$5` how long a queued
    /// waiter must have waited to go first (< 0: every waiter ahead goes first, fair
    /// mode), `$6` the holder's own lease ms (the lease less a transition window) → token (RETURNING, or LAST_INSERT_ID on MySQL; 0 = not granted).
    /// On PostgreSQL a grant also removes `$2`'s queue entry (a data-modifying
    /// `WITH`; elsewhere the waiter leaves with a statement of its own), and a refusal the statement's snapshot
    /// already shows proposes no row: it locks nothing, so its transaction needs no
    /// WAL flush and blocks no grant or release of the lock. It answers one row
    /// either way: the token (NULL = not granted), then the lock's owner, remaining
    /// ms and readers' horizon remaining ms as the snapshot shows them (NULL, 0, 0
    /// without a row) — what [`Queue::contention`] reads, so a refused caller that
    /// needs no queue position (see `JdbcBackend::attempt`) does not read it again.
    pub(crate) acquire: Stmt,
    /// MariaDB/MySQL: as `acquire` for a caller not queued, judging the
    /// queue by its mark (`writer_wait_until`, see [`Queue::mark`]) instead of
    /// reading it: granted (the token) while the mark is in the past — no live
    /// waiter — and refused with 0 while the lock is held; a free lock with a live
    /// mark answers [`ASK_THE_QUEUE`], and `acquire` decides. Reading the
    /// waiters' table costs an uncontended cycle about a fifth of its time.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) acquire_unqueued: Option<Stmt>,
    /// As `acquire`, beside the same owner's live read hold `$7` (an
    /// upgrade): passes the queue, and is granted once every live reader is that
    /// hold (and no permits are held). It never leaves the queue itself: a waiting
    /// upgrade leaves with a statement of its own.
    pub(crate) acquire_beside: Stmt,
    /// `$1` name, `$2` owner → rows affected (or a row on PostgreSQL, which sends the
    /// release notice only when a live waiter is queued: nobody else needs it, and
    /// every listening connection of every process wakes for each notice, and
    /// commits asynchronously: [`COMMIT_QUICKLY`]; on SQLite a row with the notice's
    /// payload, NULL when nobody waits).
    pub(crate) release: Stmt,
    /// As `release`, for a term of leadership: the notice goes out whoever
    /// waits, as the election's observers learn of a resignation from it.
    pub(crate) release_announced: Stmt,
    /// `$1` name, `$2` owner, `$3` lease ms, `$4` own lease ms (the lease less a
    /// transition window) → rows affected.
    pub(crate) renew: Stmt,
    /// As `renew`, also storing `$5` as the holder's context (a leader
    /// proclaiming a new value).
    pub(crate) renew_context: Stmt,
    /// Renewing many holds in one statement ([`crate::renew_batch`]): the statement
    /// for up to `2 << i` holds at index `i` — `$1` lease ms, `$2` own lease ms, then
    /// each hold's name and owner (`$3`, `$4`, …) → rows affected.
    pub(crate) renew_many: Vec<Stmt>,
}

/// The most holds one [`Exclusive::renew_many`] statement renews (a power of two):
/// its condition has one term per hold.
pub(crate) const RENEW_MANY_MAX: usize = 128;

/// [`Exclusive::renew_many`]'s text for `n` holds: as `renew`, with one
/// name-and-owner term per hold (the primary key's equality, which every dialect
/// looks up by index, where a row-value `IN` list is not everywhere).
fn renew_many_text(n: usize) -> String {
    let holds: Vec<String> = (0..n)
        .map(|i| format!("(name = ${} AND owner = ${})", 3 + 2 * i, 4 + 2 * i))
        .collect();
    format!(
        "UPDATE {{locks}} SET expires_at = NOW + $1, ttl_at = NOW + $2 \
         WHERE expires_at > NOW AND ({})",
        holds.join(" OR ")
    )
}

/// A read hold's statements: the lock row's readers' horizon and the readers' rows.
#[derive(Debug, Clone)]
pub(crate) struct Shared {
    /// `$1` name, `$2` lease ms, `$3` reader → token (0 / no row = not granted).
    pub(crate) acquire_row: Stmt,
    /// As `acquire_row`, beside the same owner's live write hold `$4` (a
    /// writer reading): granted whatever the queue.
    pub(crate) acquire_row_beside: Stmt,
    /// `$1` name, `$2` owner, `$3` token, `$4` lease ms, `$5` context → token.
    pub(crate) acquire_reader: Stmt,
    /// `$1` name: locks the lock row first, so shared operations take row locks in
    /// one order (locks → readers) and never deadlock each other.
    pub(crate) lock_row: Stmt,
    /// `$1` name, `$2` owner → rows affected.
    pub(crate) release_reader: Stmt,
    /// `$1` name: drops expired readers and recomputes the readers' horizon.
    pub(crate) purge_readers: Stmt,
    pub(crate) recompute: Stmt,
    /// `$1` name, `$2` owner, `$3` lease ms.
    pub(crate) renew_row: Stmt,
    pub(crate) renew_reader: Stmt,
    /// As `renew_reader`, also storing `$4` as the reader's context.
    pub(crate) renew_reader_context: Stmt,
}

/// The waiters' queue: joining, leaving, reading one's place.
#[derive(Debug, Clone)]
pub(crate) struct Queue {
    /// `$1` name, `$2` waiter → owner, remaining lease ms, shared remaining ms, live
    /// waiters queued ahead of `$2` (0 when it is not queued).
    pub(crate) contention: Stmt,
    /// `$1` name, `$2` waiter, `$3` mode (`x` | `s` | `p`), `$4` liveness ms: queues the
    /// waiter (keeping an earlier arrival) or refreshes its liveness.
    pub(crate) enqueue: Stmt,
    /// `$1` name: forgets waiters whose liveness lapsed (crashed processes).
    pub(crate) purge: Stmt,
    /// As `enqueue`, forgetting the waiters whose liveness lapsed in the same
    /// statement (PostgreSQL only; elsewhere `purge` runs first). Answers
    /// whether a live writer other than `$2` and the lock's live holder was queued
    /// ahead of the entry (arrival order): that writer's turn comes first, and its
    /// release names the next one.
    pub(crate) purge_and_enqueue: Option<Stmt>,
    /// `$1` name, `$2` waiter: leaves the queue (on PostgreSQL passing the release
    /// notice on, on SQLite answering the payload of the one to pass on, if any).
    pub(crate) dequeue: Stmt,
    /// MariaDB/MySQL: `$1` name, `$2` how long the mark lasts (ms), `$3` how long it
    /// must still last to be left alone (ms): marks the lock's queue as possibly
    /// holding live waiters, before a waiter queues or refreshes its entry (see
    /// [`Exclusive::acquire_unqueued`]).
    pub(crate) mark: Option<Stmt>,
}

/// A semaphore's statements (see [`crate::permits`]).
#[derive(Debug, Clone)]
pub(crate) struct Permits {
    /// `$1` name: creates a semaphore's row if it has none (its first use).
    pub(crate) ensure_row: Stmt,
    /// `$1` name, `$2` owner, `$3` lease ms, `$4` permits, `$5` the total, `$6`
    /// context (hex), `$7` the owner's search pattern (MySQL) → token (no row / 0 =
    /// not granted): one `UPDATE` of the
    /// semaphore's row, see [`permits::grant`]. A refusal that [`Self::state`]
    /// shows had room is tried again.
    pub(crate) grant: Stmt,
    /// `$1` name, `$2` owner → the semaphore's total, permits used by others, live
    /// waiters other than `$2`, whether an exclusive holder or a `readers` row is
    /// live (0/1: no room whatever the permits), whether `$2` is first in the queue
    /// (0/1).
    pub(crate) state: Stmt,
    /// `$1` name, `$2` owner → rows affected (or a notify row on PostgreSQL): gives
    /// permits back (the readers' horizon is left to lapse; only exclusive requests
    /// on the name wait for it).
    pub(crate) release: Stmt,
    /// `$1` name, `$2` owner, `$3` lease ms → rows affected.
    pub(crate) renew: Stmt,
    /// As `renew`, also storing `$4` (hex) as the holder's context.
    pub(crate) renew_context: Stmt,
    /// `$1` name → owner, token, context (hex), remaining ms, permits per live
    /// permit holder.
    pub(crate) inspect: Stmt,
    /// `$1` name → how many permit holders are live.
    pub(crate) count_holders: Stmt,
}

/// Reading and clearing a lock's state, for operators ([`dlock_spi::LockAdmin`]).
#[derive(Debug, Clone)]
pub(crate) struct Admin {
    /// `$1` name → owner, token, context, remaining ms, live waiters, remaining ms
    /// of the holder's own lease (`ttl_at`).
    pub(crate) inspect_lock: Stmt,
    /// `$1` name → owner, token, context, remaining ms, permits (0 for a read lock;
    /// more for a permit holder of schema version 4) per live reader.
    pub(crate) inspect_readers: Stmt,
    /// `$1` name: force-release.
    pub(crate) force_exclusive: Stmt,
    pub(crate) force_clear: Stmt,
    pub(crate) force_readers: Stmt,
    /// `$1` prefix → count of names with live state.
    pub(crate) live_locks: Stmt,
}

/// Release and change notices sent on their own.
#[derive(Debug, Clone)]
pub(crate) struct Notices {
    /// `$1` name → pg_notify (PostgreSQL), or the release notice's payload for the
    /// backend to send (SQLite, [`crate::local_bus`]); `None` on MySQL.
    pub(crate) release: Option<Stmt>,
    /// `$1` name → pg_notify on the change channel (PostgreSQL only): a leadership
    /// granted or proclaimed, for observers.
    pub(crate) change: Option<Stmt>,
}

impl Statements {
    /// The statements of `dialect` on the tables of `prefix`; `inline`: written
    /// with their parameters, for PostgreSQL behind a transaction pooler
    /// ([`Stmt::inline`]).
    pub(crate) fn new(dialect: Dialect, prefix: &str, inline: bool) -> Self {
        let s = |t: &str| Stmt::new(dialect, t, prefix, inline);
        Statements {
            exclusive: Exclusive::new(dialect, &s),
            shared: Shared::new(dialect, &s),
            queue: Queue::new(dialect, &s),
            permits: Permits::new(dialect, &s),
            admin: Admin::new(&s, dialect),
            notices: Notices::new(dialect, &s),
        }
    }
}

/// Builds one statement from its template ([`Stmt::new`] with the dialect, prefix
/// and pooler mode filled in).
type Build<'a> = &'a dyn Fn(&str) -> Stmt;

/// The exclusive upsert, in `dialect`: grants `$2` the lock when the row lets it
/// (see [`Exclusive::acquire`]).
fn acquire_exclusive_text(dialect: Dialect) -> String {
    match dialect {
        Dialect::MySql => {
            // LAST_INSERT_ID(expr) carries the granted token (or 0) back in the OK
            // packet: one round trip. @dlock_grant is computed by the first
            // assignment, before any column it reads is changed.
            "INSERT INTO {locks} (name, owner, token, context, acquired_at, expires_at, shared_until, writer_wait_until, ttl_at) \
             VALUES ($1, $2, LAST_INSERT_ID(CLOCK_US), $4, NOW, NOW + $3, 0, 0, NOW + $6) \
             ON DUPLICATE KEY UPDATE \
               token = IF(@dlock_grant := (((owner <=> VALUES(owner) AND expires_at > NOW) \
                             OR ((owner IS NULL OR expires_at <= NOW) AND EXCLUSIVE_GATE)) \
                            AND shared_until <= NOW), \
                          LAST_INSERT_ID(IF(owner <=> VALUES(owner) AND expires_at > NOW, token, GREATEST(token + 1, CLOCK_US))), \
                          token + LAST_INSERT_ID(0)), \
               acquired_at = IF(@dlock_grant, IF(owner <=> VALUES(owner) AND expires_at > NOW, acquired_at, NOW), acquired_at), \
               context = IF(@dlock_grant, VALUES(context), context), \
               ttl_at = IF(@dlock_grant, NOW + $6, ttl_at), \
               expires_at = IF(@dlock_grant, NOW + $3, expires_at), \
               owner = IF(@dlock_grant, VALUES(owner), owner)"
                .to_owned()
        }
        Dialect::Sqlite | Dialect::Postgres => {
            "INSERT INTO {locks} (name, owner, token, context, acquired_at, expires_at, shared_until, writer_wait_until, ttl_at) \
             VALUES (EXCLUSIVE_ROW) \
             ON CONFLICT (name) DO UPDATE SET \
               token = CASE WHEN {locks}.owner = excluded.owner AND {locks}.expires_at > NOW \
                            THEN {locks}.token ELSE GREATEST({locks}.token + 1, excluded.token) END, \
               acquired_at = CASE WHEN {locks}.owner = excluded.owner AND {locks}.expires_at > NOW \
                            THEN {locks}.acquired_at ELSE excluded.acquired_at END, \
               owner = excluded.owner, context = excluded.context, \
               expires_at = excluded.expires_at, ttl_at = excluded.ttl_at \
             WHERE EXCLUSIVE_GRANTABLE \
             RETURNING token"
                .replace(
                    "EXCLUSIVE_GRANTABLE",
                    &exclusive_grantable("{locks}", "excluded.owner"),
                )
        }
    }
}

impl Exclusive {
    fn new(dialect: Dialect, s: Build<'_>) -> Self {
        let acquire_exclusive_text = acquire_exclusive_text(dialect);
        let acquire_exclusive_unqueued = (dialect == Dialect::MySql).then(|| {
            s(&acquire_exclusive_text
                .replace("EXCLUSIVE_GATE", "writer_wait_until <= NOW")
                .replace(
                    "token + LAST_INSERT_ID(0)",
                    &format!(
                        "token + 0 * LAST_INSERT_ID(IF((owner IS NULL OR expires_at <= NOW) \
                           AND shared_until <= NOW, {ASK_THE_QUEUE}, 0))"
                    ),
                ))
        });
        // PostgreSQL: a grant also takes the waiter out of the queue, in the same
        // statement (a data-modifying `WITH`; one round trip and one commit fewer per
        // hand-over). Elsewhere the waiter leaves with a statement of its own.
        // It also proposes its row only when the lock's row, as the statement's
        // snapshot shows it, would let the upsert grant it: a refused upsert locks
        // the row all the same, and the lock costs a WAL flush at commit, which the
        // next grant or release of the lock waits for. (A release committing while
        // the statement runs is not waited for: the caller is refused, as if it had
        // asked a moment earlier.)
        let acquire_exclusive = match dialect {
            Dialect::Postgres => s(&format!(
                    "WITH seen AS (SELECT l.owner, l.expires_at, l.shared_until, \
                         COALESCE(({}), FALSE) AS grantable FROM {{locks}} l WHERE l.name = $1), \
                       granted AS ({}), \
                       left_queue AS (DELETE FROM {{waiters}} WHERE name = $1 AND waiter = $2 \
                         AND EXISTS (SELECT 1 FROM granted)) \
                     SELECT (SELECT token FROM granted), seen.owner, \
                       COALESCE(seen.expires_at - NOW, 0), COALESCE(seen.shared_until - NOW, 0) \
                     FROM (SELECT 1) AS one LEFT JOIN seen ON TRUE",
                    exclusive_grantable("l", "$2"),
                    acquire_exclusive_text.replace(
                        "VALUES (EXCLUSIVE_ROW)",
                        "SELECT EXCLUSIVE_ROW WHERE NOT EXISTS (SELECT 1 FROM seen WHERE NOT seen.grantable)"
                    )
                )),
            Dialect::Sqlite | Dialect::MySql => s(&acquire_exclusive_text),
        };
        // Beside the owner's live read hold `$7`: no queue gate, and the readers'
        // horizon may stand if every live reader is that hold.
        let acquire_exclusive_beside = s(&acquire_exclusive_text
            .replace("EXCLUSIVE_GATE", "1 = 1")
            .replace(
                "{locks}.shared_until <= NOW",
                "({locks}.shared_until <= NOW OR ONLY_READER)",
            )
            .replace(
                "AND shared_until <= NOW",
                "AND (shared_until <= NOW OR ONLY_READER)",
            )
            .replace("ONLY_READER", &only_reader(dialect)));
        let (release_exclusive, release_exclusive_announced) = match dialect {
            Dialect::Postgres => {
                // The notice is the update's `RETURNING` expression, evaluated for the
                // released row only (no row: not released, no notice): one plain
                // `UPDATE`, cheaper to run than the same in a data-modifying `WITH`.
                let released = |quickly: &str, notice: &str| {
                    format!(
                        "UPDATE {{locks}} SET owner = NULL, context = NULL, acquired_at = 0, expires_at = 0 \
                         WHERE name = $1 AND owner = $2 AND expires_at > NOW{quickly} RETURNING {notice}"
                    )
                };
                // A lock's release commits asynchronously (`COMMIT_QUICKLY`); the
                // end of a term of leadership, which observers act on, does not.
                (
                    s(&released(
                        &format!(" AND {COMMIT_QUICKLY}"),
                        "CASE WHEN EXISTS (SELECT 1 FROM {waiters} w \
                           WHERE w.name = $1 AND w.alive_until > NOW) \
                         THEN pg_notify('{channel}', RELEASE_PAYLOAD) END",
                    )),
                    s(&released("", "pg_notify('{channel}', RELEASE_PAYLOAD)")),
                )
            }
            Dialect::Sqlite => {
                // As on PostgreSQL, the notice (here its payload, which the backend
                // sends itself: [`crate::local_bus`]) for the released row only;
                // NULL when nobody waits.
                // No observer follows a SQLite lock (they poll `inspect`), so a
                // term's end is a release as any other.
                let text = format!(
                    "UPDATE {{locks}} SET owner = NULL, context = NULL, acquired_at = 0, expires_at = 0 \
                     WHERE name = $1 AND owner = $2 AND expires_at > NOW RETURNING {PAYLOAD_IF_WAITED}"
                );
                (s(&text), s(&text))
            }
            Dialect::MySql => {
                let text = "UPDATE {locks} SET owner = NULL, context = NULL, acquired_at = 0, expires_at = 0 \
                 WHERE name = $1 AND owner = $2 AND expires_at > NOW";
                (s(text), s(text))
            }
        };
        Exclusive {
            acquire: acquire_exclusive,
            acquire_unqueued: acquire_exclusive_unqueued,
            acquire_beside: acquire_exclusive_beside,
            release: release_exclusive,
            release_announced: release_exclusive_announced,
            renew: s(
                "UPDATE {locks} SET expires_at = NOW + $3, ttl_at = NOW + $4 \
                 WHERE name = $1 AND owner = $2 AND expires_at > NOW",
            ),
            renew_context: s(
                "UPDATE {locks} SET expires_at = NOW + $3, ttl_at = NOW + $4, context = $5 \
                 WHERE name = $1 AND owner = $2 AND expires_at > NOW",
            ),
            renew_many: std::iter::successors(Some(2), |n| Some(n * 2))
                .take_while(|&n| n <= RENEW_MANY_MAX)
                .map(|n| s(&renew_many_text(n)))
                .collect(),
        }
    }
}

impl Shared {
    fn new(dialect: Dialect, s: Build<'_>) -> Self {
        let acquire_shared_row_text = match dialect {
            Dialect::MySql => {
                "INSERT INTO {locks} (name, owner, token, context, acquired_at, expires_at, shared_until, writer_wait_until) \
                 VALUES ($1, NULL, LAST_INSERT_ID(CLOCK_US), NULL, 0, 0, NOW + $2, 0) \
                 ON DUPLICATE KEY UPDATE \
                   token = IF(@dlock_grant := ((owner IS NULL OR expires_at <= NOW) AND SHARED_GATE), \
                              LAST_INSERT_ID(GREATEST(token + 1, CLOCK_US)), token + LAST_INSERT_ID(0)), \
                   shared_until = IF(@dlock_grant, GREATEST(shared_until, NOW + $2), shared_until)"
            }
            Dialect::Sqlite | Dialect::Postgres => {
                "INSERT INTO {locks} (name, owner, token, context, acquired_at, expires_at, shared_until, writer_wait_until) \
                 VALUES ($1, NULL, CLOCK_US, NULL, 0, 0, NOW + $2, 0) \
                 ON CONFLICT (name) DO UPDATE SET \
                   token = GREATEST({locks}.token + 1, excluded.token), \
                   shared_until = GREATEST({locks}.shared_until, excluded.shared_until) \
                 WHERE ({locks}.owner IS NULL OR {locks}.expires_at <= NOW) AND SHARED_GATE \
                 RETURNING token"
            }
        };
        let acquire_shared_row = s(acquire_shared_row_text);
        // Beside the owner's live write hold `$4`: granted whatever the queue (that
        // hold gone, judged as any other).
        let acquire_shared_row_beside = s(&acquire_shared_row_text
            .replace(
                "({locks}.owner IS NULL OR {locks}.expires_at <= NOW) AND SHARED_GATE",
                "(({locks}.owner = $4 AND {locks}.expires_at > NOW) \
                   OR (({locks}.owner IS NULL OR {locks}.expires_at <= NOW) AND SHARED_GATE))",
            )
            .replace(
                "(owner IS NULL OR expires_at <= NOW) AND SHARED_GATE",
                "((owner = $4 AND expires_at > NOW) \
                   OR ((owner IS NULL OR expires_at <= NOW) AND SHARED_GATE))",
            ));
        let acquire_shared_reader = match dialect {
            Dialect::MySql => s(
                "INSERT INTO {readers} (name, owner, token, context, acquired_at, expires_at) \
                 VALUES ($1, $2, LAST_INSERT_ID($3), $5, NOW, NOW + $4) \
                 ON DUPLICATE KEY UPDATE \
                   token = LAST_INSERT_ID(IF(expires_at > NOW, token, VALUES(token))), \
                   acquired_at = IF(expires_at > NOW, acquired_at, NOW), \
                   context = VALUES(context), expires_at = NOW + $4",
            ),
            Dialect::Sqlite | Dialect::Postgres => s(
                "INSERT INTO {readers} (name, owner, token, context, acquired_at, expires_at) \
                 VALUES ($1, $2, $3, $5, NOW, NOW + $4) \
                 ON CONFLICT (name, owner) DO UPDATE SET \
                   token = CASE WHEN {readers}.expires_at > NOW THEN {readers}.token ELSE excluded.token END, \
                   acquired_at = CASE WHEN {readers}.expires_at > NOW THEN {readers}.acquired_at ELSE excluded.acquired_at END, \
                   context = excluded.context, expires_at = excluded.expires_at \
                 RETURNING token",
            ),
        };
        Shared {
            acquire_row: acquire_shared_row,
            acquire_row_beside: acquire_shared_row_beside,
            acquire_reader: acquire_shared_reader,
            lock_row: s("UPDATE {locks} SET shared_until = shared_until + 0 WHERE name = $1"),
            release_reader: s(
                "DELETE FROM {readers} WHERE name = $1 AND owner = $2 AND expires_at > NOW",
            ),
            purge_readers: s("DELETE FROM {readers} WHERE name = $1 AND expires_at <= NOW"),
            recompute: s(
                "UPDATE {locks} SET shared_until = COALESCE((SELECT MAX(expires_at) FROM {readers} WHERE name = $1), 0) \
                 WHERE name = $1",
            ),
            renew_row: s(
                "UPDATE {locks} SET shared_until = GREATEST(shared_until, NOW + $3) WHERE name = $1 AND $2 IS NOT NULL",
            ),
            renew_reader: s(
                "UPDATE {readers} SET expires_at = NOW + $3 WHERE name = $1 AND owner = $2 AND expires_at > NOW",
            ),
            renew_reader_context: s(
                "UPDATE {readers} SET expires_at = NOW + $3, context = $4 WHERE name = $1 AND owner = $2 AND expires_at > NOW",
            ),
        }
    }
}

impl Permits {
    fn new(dialect: Dialect, s: Build<'_>) -> Self {
        Permits {
            ensure_row: s(match dialect {
            Dialect::MySql => {
                "INSERT INTO {locks} (name, owner, token, context, acquired_at, expires_at, shared_until, writer_wait_until) \
                 VALUES ($1, NULL, CLOCK_US, NULL, 0, 0, 0, 0) \
                 ON DUPLICATE KEY UPDATE shared_until = shared_until"
            }
            Dialect::Sqlite | Dialect::Postgres => {
                "INSERT INTO {locks} (name, owner, token, context, acquired_at, expires_at, shared_until, writer_wait_until) \
                 VALUES ($1, NULL, CLOCK_US, NULL, 0, 0, 0, 0) \
                 ON CONFLICT (name) DO UPDATE SET shared_until = {locks}.shared_until"
            }
        }),
            grant: s(&permits::grant(dialect)),
            state: s(
                "SELECT capacity, PERMITS_USED, \
                   (SELECT COUNT(*) FROM {waiters} o WHERE o.name = $1 AND o.alive_until > NOW AND o.waiter <> $2), \
                   CAST(CASE WHEN (owner IS NOT NULL AND expires_at > NOW) \
                     OR EXISTS (SELECT 1 FROM {readers} r WHERE r.name = $1 AND r.expires_at > NOW) \
                     THEN 1 ELSE 0 END AS INT64), \
                   CAST(CASE WHEN PERMIT_GATE THEN 1 ELSE 0 END AS INT64) \
                 FROM {locks} WHERE name = $1",
            ),
            release: s(&permits::release(dialect)),
            renew: s(&permits::renew(dialect, false)),
            renew_context: s(&permits::renew(dialect, true)),
            inspect: s(&permits::inspect(dialect)),
            count_holders: s(&permits::count_live(dialect)),
        }
    }
}

impl Queue {
    fn new(dialect: Dialect, s: Build<'_>) -> Self {
        Queue {
            // The waiter just ahead names the bell a MariaDB/MySQL waiter blocks on;
            // elsewhere nothing reads it, so nothing looks it up.
            contention: s(&format!(
                "SELECT {{owner}}, expires_at - NOW, shared_until - NOW, \
                   (SELECT COUNT(*) FROM {{waiters}} w WHERE w.name = $1 AND w.alive_until > NOW \
                      AND NOT_THE_HOLDER AND EXISTS (SELECT 1 FROM {{waiters}} me WHERE me.name = $1 AND me.waiter = $2 \
                        AND (w.arrived < me.arrived OR (w.arrived = me.arrived AND w.waiter < me.waiter)))), \
                   {predecessor} \
                 FROM {{locks}} WHERE name = $1",
                predecessor = match dialect {
                    Dialect::MySql => {
                        "(SELECT CONVERT(w.waiter USING utf8mb4) FROM {waiters} w JOIN {waiters} me ON me.name = $1 AND me.waiter = $2 \
                           WHERE w.name = $1 AND w.alive_until > NOW \
                             AND (w.arrived < me.arrived OR (w.arrived = me.arrived AND w.waiter < me.waiter)) \
                           ORDER BY w.arrived DESC, w.waiter DESC LIMIT 1)"
                    }
                    Dialect::Sqlite | Dialect::Postgres => "CAST(NULL AS TEXT)",
                }
            )),
            enqueue: s(match dialect {
                // The entry's liveness never passes the queue's mark (`mark_queue`
                // runs first; a late statement gets a shorter liveness).
                Dialect::MySql => {
                    "INSERT INTO {waiters} (name, waiter, mode, arrived, alive_until) \
                     VALUES ($1, $2, $3, NOW, LEAST(NOW + $4, COALESCE( \
                       (SELECT l.writer_wait_until FROM {locks} l WHERE l.name = $1), NOW + $4))) \
                     ON DUPLICATE KEY UPDATE alive_until = VALUES(alive_until)"
                }
                Dialect::Sqlite => {
                    "INSERT INTO {waiters} (name, waiter, mode, arrived, alive_until) \
                     VALUES ($1, $2, $3, NOW, NOW + $4) \
                     ON CONFLICT (name, waiter) DO UPDATE SET alive_until = excluded.alive_until"
                }
                Dialect::Postgres => {
                    "INSERT INTO {waiters} (name, waiter, mode, arrived, alive_until) \
                     SELECT $1, $2, $3, NOW, NOW + $4 WHERE COMMIT_QUICKLY \
                     ON CONFLICT (name, waiter) DO UPDATE SET alive_until = excluded.alive_until"
                }
            }),
            purge: s("DELETE FROM {waiters} WHERE name = $1 AND alive_until <= NOW"),
            // (The `DELETE` runs after the `INSERT`, and skips a row it changed: a
            // lapsed entry under `$2`'s own key — a caller reusing a grant id — is
            // revived by the upsert, with a new arrival as a purge would have given.
            // The writers ahead are read on the statement's snapshot.)
            purge_and_enqueue: (dialect == Dialect::Postgres).then(|| {
                s("WITH purged AS (DELETE FROM {waiters} WHERE name = $1 AND alive_until <= NOW) \
                   INSERT INTO {waiters} (name, waiter, mode, arrived, alive_until) \
                   SELECT $1, $2, $3, NOW, NOW + $4 WHERE COMMIT_QUICKLY \
                   ON CONFLICT (name, waiter) DO UPDATE SET alive_until = excluded.alive_until, \
                     arrived = CASE WHEN {waiters}.alive_until <= NOW THEN excluded.arrived \
                                    ELSE {waiters}.arrived END \
                   RETURNING EXISTS (SELECT 1 FROM {waiters} w WHERE w.name = $1 AND w.mode = 'x' \
                     AND w.alive_until > NOW AND w.waiter <> $2 \
                     AND NOT EXISTS (SELECT 1 FROM {locks} l WHERE l.name = $1 \
                       AND l.owner = w.waiter AND l.expires_at > NOW) \
                     AND (w.arrived < {waiters}.arrived \
                       OR (w.arrived = {waiters}.arrived AND w.waiter < $2)))")
            }),
            dequeue: s(dequeue_text(dialect)),
            // Written only when it would lapse soon: waiters refreshing their
            // entries leave the lock's row alone.
            mark: (dialect == Dialect::MySql).then(|| {
                s("UPDATE {locks} SET writer_wait_until = NOW + $2 \
                   WHERE name = $1 AND writer_wait_until < NOW + $3")
            }),
        }
    }
}

/// The statement with which `$2` leaves the queue of `$1`. PostgreSQL: a waiter
/// first in the queue that leaves while the lock is free (it gave up, or was
/// cancelled, after the release notice named it) passes the notice on to the next
/// one, which would otherwise wait for its next look. (The statement's own
/// `DELETE` is not visible to its reads: the next waiter is found by skipping `$2`.
/// A release committing while it runs may still name the leaver, and it still see
/// the lock held: that writer then waits for its next look.)
fn dequeue_text(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Postgres => {
            "WITH gone AS (DELETE FROM {waiters} WHERE name = $1 AND waiter = $2 \
               AND COMMIT_QUICKLY RETURNING arrived, alive_until) \
             SELECT pg_notify('{channel}', NEXT_PAYLOAD) FROM gone \
             WHERE gone.alive_until > NOW \
               AND EXISTS (SELECT 1 FROM {locks} l WHERE l.name = $1 \
                 AND (l.owner IS NULL OR l.expires_at <= NOW) AND l.shared_until <= NOW) \
               AND NOT EXISTS (SELECT 1 FROM {waiters} w WHERE w.name = $1 \
                 AND w.alive_until > NOW AND w.waiter <> $2 \
                 AND (w.arrived < gone.arrived OR (w.arrived = gone.arrived AND w.waiter < $2))) \
               AND EXISTS (SELECT 1 FROM {waiters} w WHERE w.name = $1 \
                 AND w.alive_until > NOW AND w.waiter <> $2)"
        }
        // The same test, its payload returned for the backend to send
        // ([`crate::local_bus`]; NULL: no notice).
        Dialect::Sqlite => {
            "DELETE FROM {waiters} WHERE name = $1 AND waiter = $2 \
             RETURNING CASE WHEN {waiters}.alive_until > NOW \
               AND EXISTS (SELECT 1 FROM {locks} l WHERE l.name = $1 \
                 AND (l.owner IS NULL OR l.expires_at <= NOW) AND l.shared_until <= NOW) \
               AND NOT EXISTS (SELECT 1 FROM {waiters} w WHERE w.name = $1 \
                 AND w.alive_until > NOW AND w.waiter <> $2 \
                 AND (w.arrived < {waiters}.arrived OR (w.arrived = {waiters}.arrived AND w.waiter < $2))) \
               AND EXISTS (SELECT 1 FROM {waiters} w WHERE w.name = $1 \
                 AND w.alive_until > NOW AND w.waiter <> $2) \
             THEN NEXT_PAYLOAD END"
        }
        Dialect::MySql => "DELETE FROM {waiters} WHERE name = $1 AND waiter = $2",
    }
}

impl Admin {
    fn new(s: Build<'_>, dialect: Dialect) -> Self {
        Admin {
            inspect_lock: s(
                "SELECT {owner}, token, context, expires_at - NOW, \
                   (SELECT COUNT(*) FROM {waiters} w WHERE w.name = $1 AND w.alive_until > NOW \
                      AND NOT_THE_HOLDER), \
                   CASE WHEN ttl_at > 0 THEN ttl_at - NOW END \
                 FROM {locks} WHERE name = $1",
            ),
            inspect_readers: s(
                "SELECT {owner}, token, context, expires_at - NOW, permits FROM {readers} \
                 WHERE name = $1 AND expires_at > NOW ORDER BY acquired_at, owner",
            ),
            force_exclusive: s(
                "UPDATE {locks} SET owner = NULL, context = NULL, acquired_at = 0, expires_at = 0 \
                 WHERE name = $1 AND owner IS NOT NULL AND expires_at > NOW",
            ),
            force_clear: s("UPDATE {locks} SET shared_until = 0, holders = NULL WHERE name = $1"),
            force_readers: s("DELETE FROM {readers} WHERE name = $1 AND expires_at > NOW"),
            live_locks: s(&format!(
                "SELECT COUNT(*) FROM {{locks}} WHERE substr(name, 1, length($1)) = $1 \
                 AND ((owner IS NOT NULL AND expires_at > NOW) OR {} \
                   OR EXISTS (SELECT 1 FROM {{readers}} r WHERE r.name = {{locks}}.name AND r.expires_at > NOW) \
                   OR EXISTS (SELECT 1 FROM {{waiters}} w WHERE w.name = {{locks}}.name AND w.alive_until > NOW))",
                permits::any_live(dialect)
            )),
        }
    }
}

impl Notices {
    fn new(dialect: Dialect, s: Build<'_>) -> Self {
        let notify = match dialect {
            Dialect::Postgres => Some(s("SELECT pg_notify('{channel}', RELEASE_PAYLOAD)")),
            Dialect::Sqlite => Some(s("SELECT RELEASE_PAYLOAD")),
            Dialect::MySql => None,
        };
        let notify_change =
            (dialect == Dialect::Postgres).then(|| s("SELECT pg_notify('{change_channel}', $1)"));
        Notices {
            release: notify,
            change: notify_change,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_follow_the_dialect() {
        let t = "SELECT $2, $1, $2 FROM {locks} WHERE x < NOW";
        let pg = Stmt::new(Dialect::Postgres, t, "p_", false);
        assert!(pg
            .sql
            .starts_with("SELECT $2, $1, $2 FROM p_locks WHERE x < (EXTRACT"));
        assert_eq!(pg.order, [0, 1]);
        let lite = Stmt::new(Dialect::Sqlite, t, "p_", false);
        assert!(lite.sql.starts_with("SELECT ?2, ?1, ?2 FROM p_locks"));
        let my = Stmt::new(Dialect::MySql, t, "p_", false);
        assert!(my.sql.starts_with("SELECT ?, ?, ? FROM p_locks"));
        assert_eq!(my.order, [1, 0, 1]);
    }

    #[test]
    fn the_unqueued_grant_reads_the_mark_not_the_queue() {
        let s = Statements::new(Dialect::MySql, "p_", false);
        let unqueued = s.exclusive.acquire_unqueued.expect("MySQL has one");
        assert!(!unqueued.sql.contains("p_waiters"), "{}", unqueued.sql);
        assert!(
            unqueued.sql.contains("writer_wait_until <="),
            "{}",
            unqueued.sql
        );
        assert!(
            unqueued.sql.contains(&format!("{ASK_THE_QUEUE}, 0))")),
            "{}",
            unqueued.sql
        );
        assert!(s.exclusive.acquire.sql.contains("p_waiters"));
        for dialect in [Dialect::Sqlite, Dialect::Postgres] {
            let s = Statements::new(dialect, "p_", false);
            assert!(s.exclusive.acquire_unqueued.is_none() && s.queue.mark.is_none());
        }
    }

    #[test]
    fn postgres_proposes_the_exclusive_row_only_when_its_snapshot_allows() {
        let pg = Statements::new(Dialect::Postgres, "p_", false);
        // One condition, read on the snapshot and decided by the upsert.
        for grantable in [
            "WITH seen AS (SELECT l.owner, l.expires_at, l.shared_until, \
             COALESCE((((l.owner = $2 AND l.expires_at > ",
            "FROM p_locks l WHERE l.name = $1)",
            "WHERE NOT EXISTS (SELECT 1 FROM seen WHERE NOT seen.grantable)",
            "WHERE ((p_locks.owner = excluded.owner AND p_locks.expires_at > ",
        ] {
            let grantable = grantable.split_whitespace().collect::<Vec<_>>().join(" ");
            let sql = pg
                .exclusive
                .acquire
                .sql
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            assert!(sql.contains(&grantable), "{grantable}\n{sql}");
        }
        for dialect in [Dialect::Sqlite, Dialect::MySql, Dialect::Postgres] {
            let s = Statements::new(dialect, "p_", false);
            for stmt in [&s.exclusive.acquire, &s.exclusive.acquire_beside] {
                assert!(
                    !stmt.sql.contains("EXCLUSIVE_"),
                    "{dialect:?}: {}",
                    stmt.sql
                );
            }
            if dialect != Dialect::Postgres {
                assert!(!s.exclusive.acquire.sql.contains(" seen"), "{dialect:?}");
            }
            assert!(
                !s.exclusive.acquire_beside.sql.contains(" seen"),
                "{dialect:?}"
            );
        }
    }

    #[test]
    fn postgres_commits_releases_and_queue_entries_quickly_and_grants_durably() {
        let pg = Statements::new(Dialect::Postgres, "p_", false);
        let quick = [
            &pg.exclusive.release,
            &pg.queue.enqueue,
            pg.queue
                .purge_and_enqueue
                .as_ref()
                .expect("PostgreSQL has one"),
            &pg.queue.dequeue,
        ];
        for stmt in quick {
            assert!(stmt.sql.contains(COMMIT_QUICKLY), "{}", stmt.sql);
        }
        let durable = [
            &pg.exclusive.acquire,
            &pg.exclusive.acquire_beside,
            &pg.shared.acquire_row,
            &pg.shared.acquire_reader,
            &pg.permits.grant,
            &pg.exclusive.renew,
            &pg.exclusive.renew_context,
            &pg.shared.renew_row,
            &pg.shared.renew_reader,
            &pg.permits.renew,
            &pg.exclusive.release_announced,
        ];
        for stmt in durable {
            assert!(!stmt.sql.contains("synchronous_commit"), "{}", stmt.sql);
        }
        for dialect in [Dialect::Sqlite, Dialect::MySql] {
            let s = Statements::new(dialect, "p_", false);
            for stmt in [&s.exclusive.release, &s.queue.enqueue, &s.queue.dequeue] {
                assert!(!stmt.sql.contains("set_config"), "{dialect:?}");
            }
        }
    }

    #[test]
    fn prefixes_are_identifiers_only() {
        assert!(validate_prefix("dlock_").is_ok());
        for bad in ["", "1x", "a-b", "x;drop", "a b", "ä"] {
            assert_eq!(
                validate_prefix(bad).map_err(|e| e.kind()),
                Err(ErrorKind::Config),
                "{bad}"
            );
        }
    }
}
