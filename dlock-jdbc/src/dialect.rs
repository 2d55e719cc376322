//! The SQL each dialect speaks, with the table prefix filled in.
//!
//! Templates are written with `$N` placeholders. PostgreSQL takes them as they are,
//! SQLite as `?N`, and MariaDB/MySQL as bare `?` bound in order of appearance (see
//! [`Stmt`]). Every timestamp is the database's clock in epoch milliseconds (`NOW`).

use dlock_spi::{Error, ErrorKind, Result};

/// The SQL dialects dlock speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// SQLite 3.35+ (bundled).
    Sqlite,
    /// MariaDB 10.5+ and MySQL 8.
    MySql,
    /// PostgreSQL 12+.
    Postgres,
}

impl Dialect {
    /// The database clock in epoch milliseconds, constant within a statement.
    fn now_ms(self) -> &'static str {
        match self {
            Dialect::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
            // Connections run with time_zone = '+00:00', so this is exact.
            Dialect::MySql => "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)",
            Dialect::Postgres => "(EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::BIGINT",
        }
    }

    /// A fencing-token seed: the database clock in epoch microseconds, at the finest
    /// resolution the database has (SQLite: milliseconds × 1000). A lock row created
    /// anew (first use, or after someone deleted it) starts its tokens here.
    fn clock_us(self) -> &'static str {
        match self {
            Dialect::Sqlite => "(NOW * 1000)",
            Dialect::MySql => "CAST(UNIX_TIMESTAMP(CURRENT_TIMESTAMP(6)) * 1000000 AS SIGNED)",
            Dialect::Postgres => "(EXTRACT(EPOCH FROM statement_timestamp()) * 1000000)::BIGINT",
        }
    }

    fn greatest(self) -> &'static str {
        match self {
            Dialect::Sqlite => "MAX",
            Dialect::MySql | Dialect::Postgres => "GREATEST",
        }
    }

    /// The owner column as text: MariaDB marks `_bin`-collated columns binary, and
    /// the driver then refuses to read them as strings.
    fn owner_text(self) -> &'static str {
        match self {
            Dialect::MySql => "CONVERT(owner USING utf8mb4)",
            Dialect::Sqlite | Dialect::Postgres => "owner",
        }
    }

    /// The label of the backend in logs and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Dialect::Sqlite => "sqlite",
            Dialect::MySql => "mysql",
            Dialect::Postgres => "postgres",
        }
    }
}

/// A statement ready to run: its text in the dialect's placeholder style and the
/// order in which the logical parameters `$1…$n` are bound.
#[derive(Debug, Clone)]
pub(crate) struct Stmt {
    pub(crate) sql: String,
    pub(crate) order: Vec<usize>,
}

impl Stmt {
    fn new(dialect: Dialect, template: &str, prefix: &str) -> Self {
        let template = template
            .replace("{locks}", &format!("{prefix}locks"))
            .replace("{readers}", &format!("{prefix}readers"))
            .replace("{schema}", &format!("{prefix}schema_version"))
            .replace("{channel}", &format!("{prefix}release"))
            .replace("{owner}", dialect.owner_text())
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
        Stmt { sql, order }
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

/// Every statement the backend runs, built once per connection pool.
#[derive(Debug, Clone)]
pub(crate) struct Statements {
    /// `$1` name, `$2` owner, `$3` lease ms, `$4` context → token (RETURNING, or
    /// LAST_INSERT_ID on MySQL; 0 = not granted).
    pub(crate) acquire_exclusive: Stmt,
    /// `$1` name → owner, remaining lease ms, shared remaining ms.
    pub(crate) contention: Stmt,
    /// `$1` name, `$2` mark ms: a waiting writer asks readers to stand back.
    pub(crate) mark_writer: Stmt,
    /// `$1` name, `$2` owner → rows affected (or a notify row on PostgreSQL).
    pub(crate) release_exclusive: Stmt,
    /// `$1` name, `$2` owner, `$3` lease ms → rows affected.
    pub(crate) renew_exclusive: Stmt,
    /// `$1` name, `$2` lease ms → token (0 / no row = not granted).
    pub(crate) acquire_shared_row: Stmt,
    /// `$1` name, `$2` owner, `$3` token, `$4` lease ms, `$5` context → token.
    pub(crate) acquire_shared_reader: Stmt,
    /// `$1` name: locks the lock row first, so shared operations take row locks in
    /// one order (locks → readers) and never deadlock each other.
    pub(crate) lock_row: Stmt,
    /// `$1` name, `$2` owner → rows affected.
    pub(crate) release_reader: Stmt,
    /// `$1` name: drops expired readers and recomputes the readers' horizon.
    pub(crate) purge_readers: Stmt,
    pub(crate) recompute_shared: Stmt,
    /// `$1` name, `$2` owner, `$3` lease ms.
    pub(crate) renew_shared_row: Stmt,
    pub(crate) renew_reader: Stmt,
    /// `$1` name → owner, token, context, remaining ms, writer mark remaining ms.
    pub(crate) inspect_lock: Stmt,
    /// `$1` name → owner, token, context, remaining ms per live reader.
    pub(crate) inspect_readers: Stmt,
    /// `$1` name: force-release.
    pub(crate) force_exclusive: Stmt,
    pub(crate) force_clear: Stmt,
    pub(crate) force_readers: Stmt,
    /// `$1` prefix → count of names with live state.
    pub(crate) live_locks: Stmt,
    /// `$1` name → pg_notify (PostgreSQL only).
    pub(crate) notify: Option<Stmt>,
}

impl Statements {
    pub(crate) fn new(dialect: Dialect, prefix: &str) -> Self {
        let s = |t: &str| Stmt::new(dialect, t, prefix);
        let acquire_exclusive = match dialect {
            Dialect::MySql => s(
                // LAST_INSERT_ID(expr) carries the granted token (or 0) back in the OK
                // packet: one round trip. @dlock_grant is computed by the first
                // assignment, before any column it reads is changed.
                "INSERT INTO {locks} (name, owner, token, context, acquired_at, expires_at, shared_until, writer_wait_until) \
                 VALUES ($1, $2, LAST_INSERT_ID(CLOCK_US), $4, NOW, NOW + $3, 0, 0) \
                 ON DUPLICATE KEY UPDATE \
                   token = IF(@dlock_grant := ((owner IS NULL OR expires_at <= NOW OR owner = VALUES(owner)) AND shared_until <= NOW), \
                              LAST_INSERT_ID(IF(owner <=> VALUES(owner) AND expires_at > NOW, token, GREATEST(token + 1, CLOCK_US))), \
                              token + LAST_INSERT_ID(0)), \
                   acquired_at = IF(@dlock_grant, IF(owner <=> VALUES(owner) AND expires_at > NOW, acquired_at, NOW), acquired_at), \
                   context = IF(@dlock_grant, VALUES(context), context), \
                   writer_wait_until = IF(@dlock_grant, 0, writer_wait_until), \
                   expires_at = IF(@dlock_grant, NOW + $3, expires_at), \
                   owner = IF(@dlock_grant, VALUES(owner), owner)",
            ),
            Dialect::Sqlite | Dialect::Postgres => s(
                "INSERT INTO {locks} (name, owner, token, context, acquired_at, expires_at, shared_until, writer_wait_until) \
                 VALUES ($1, $2, CLOCK_US, $4, NOW, NOW + $3, 0, 0) \
                 ON CONFLICT (name) DO UPDATE SET \
                   token = CASE WHEN {locks}.owner = excluded.owner AND {locks}.expires_at > NOW \
                                THEN {locks}.token ELSE GREATEST({locks}.token + 1, excluded.token) END, \
                   acquired_at = CASE WHEN {locks}.owner = excluded.owner AND {locks}.expires_at > NOW \
                                THEN {locks}.acquired_at ELSE excluded.acquired_at END, \
                   owner = excluded.owner, context = excluded.context, \
                   expires_at = excluded.expires_at, writer_wait_until = 0 \
                 WHERE ({locks}.owner IS NULL OR {locks}.expires_at <= NOW OR {locks}.owner = excluded.owner) \
                   AND {locks}.shared_until <= NOW \
                 RETURNING token",
            ),
        };
        let acquire_shared_row = match dialect {
            Dialect::MySql => s(
                "INSERT INTO {locks} (name, owner, token, context, acquired_at, expires_at, shared_until, writer_wait_until) \
                 VALUES ($1, NULL, LAST_INSERT_ID(CLOCK_US), NULL, 0, 0, NOW + $2, 0) \
                 ON DUPLICATE KEY UPDATE \
                   token = IF(@dlock_grant := ((owner IS NULL OR expires_at <= NOW) AND writer_wait_until <= NOW), \
                              LAST_INSERT_ID(GREATEST(token + 1, CLOCK_US)), token + LAST_INSERT_ID(0)), \
                   shared_until = IF(@dlock_grant, GREATEST(shared_until, NOW + $2), shared_until)",
            ),
            Dialect::Sqlite | Dialect::Postgres => s(
                "INSERT INTO {locks} (name, owner, token, context, acquired_at, expires_at, shared_until, writer_wait_until) \
                 VALUES ($1, NULL, CLOCK_US, NULL, 0, 0, NOW + $2, 0) \
                 ON CONFLICT (name) DO UPDATE SET \
                   token = GREATEST({locks}.token + 1, excluded.token), \
                   shared_until = GREATEST({locks}.shared_until, excluded.shared_until) \
                 WHERE ({locks}.owner IS NULL OR {locks}.expires_at <= NOW) AND {locks}.writer_wait_until <= NOW \
                 RETURNING token",
            ),
        };
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
        let release_exclusive = match dialect {
            Dialect::Postgres => s(
                "WITH released AS ( \
                   UPDATE {locks} SET owner = NULL, context = NULL, acquired_at = 0, expires_at = 0 \
                   WHERE name = $1 AND owner = $2 AND expires_at > NOW RETURNING name) \
                 SELECT pg_notify('{channel}', name) FROM released",
            ),
            Dialect::Sqlite | Dialect::MySql => s(
                "UPDATE {locks} SET owner = NULL, context = NULL, acquired_at = 0, expires_at = 0 \
                 WHERE name = $1 AND owner = $2 AND expires_at > NOW",
            ),
        };
        let notify = (dialect == Dialect::Postgres).then(|| s("SELECT pg_notify('{channel}', $1)"));
        Statements {
            acquire_exclusive,
            contention: s(
                "SELECT {owner}, expires_at - NOW, shared_until - NOW FROM {locks} WHERE name = $1",
            ),
            mark_writer: s(
                "UPDATE {locks} SET writer_wait_until = GREATEST(writer_wait_until, NOW + $2) WHERE name = $1",
            ),
            release_exclusive,
            renew_exclusive: s(
                "UPDATE {locks} SET expires_at = NOW + $3 WHERE name = $1 AND owner = $2 AND expires_at > NOW",
            ),
            acquire_shared_row,
            acquire_shared_reader,
            lock_row: s("UPDATE {locks} SET shared_until = shared_until + 0 WHERE name = $1"),
            release_reader: s(
                "DELETE FROM {readers} WHERE name = $1 AND owner = $2 AND expires_at > NOW",
            ),
            purge_readers: s("DELETE FROM {readers} WHERE name = $1 AND expires_at <= NOW"),
            recompute_shared: s(
                "UPDATE {locks} SET shared_until = COALESCE((SELECT MAX(expires_at) FROM {readers} WHERE name = $1), 0) \
                 WHERE name = $1",
            ),
            renew_shared_row: s(
                "UPDATE {locks} SET shared_until = GREATEST(shared_until, NOW + $3) WHERE name = $1 AND $2 IS NOT NULL",
            ),
            renew_reader: s(
                "UPDATE {readers} SET expires_at = NOW + $3 WHERE name = $1 AND owner = $2 AND expires_at > NOW",
            ),
            inspect_lock: s(
                "SELECT {owner}, token, context, expires_at - NOW, writer_wait_until - NOW FROM {locks} WHERE name = $1",
            ),
            inspect_readers: s(
                "SELECT {owner}, token, context, expires_at - NOW FROM {readers} \
                 WHERE name = $1 AND expires_at > NOW ORDER BY acquired_at, owner",
            ),
            force_exclusive: s(
                "UPDATE {locks} SET owner = NULL, context = NULL, acquired_at = 0, expires_at = 0 \
                 WHERE name = $1 AND owner IS NOT NULL AND expires_at > NOW",
            ),
            force_clear: s(
                "UPDATE {locks} SET shared_until = 0, writer_wait_until = 0 WHERE name = $1",
            ),
            force_readers: s("DELETE FROM {readers} WHERE name = $1 AND expires_at > NOW"),
            live_locks: s(
                "SELECT COUNT(*) FROM {locks} WHERE substr(name, 1, length($1)) = $1 \
                 AND ((owner IS NOT NULL AND expires_at > NOW) OR shared_until > NOW OR writer_wait_until > NOW)",
            ),
            notify,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_follow_the_dialect() {
        let t = "SELECT $2, $1, $2 FROM {locks} WHERE x < NOW";
        let pg = Stmt::new(Dialect::Postgres, t, "p_");
        assert!(pg
            .sql
            .starts_with("SELECT $2, $1, $2 FROM p_locks WHERE x < (EXTRACT"));
        assert_eq!(pg.order, [0, 1]);
        let lite = Stmt::new(Dialect::Sqlite, t, "p_");
        assert!(lite.sql.starts_with("SELECT ?2, ?1, ?2 FROM p_locks"));
        let my = Stmt::new(Dialect::MySql, t, "p_");
        assert!(my.sql.starts_with("SELECT ?, ?, ? FROM p_locks"));
        assert_eq!(my.order, [1, 0, 1]);
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
