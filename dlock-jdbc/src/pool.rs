//! One enum over sqlx's concrete pools, and macros that write a body once for all of
//! them (each arm is compiled for its own driver, so there is no `Any` indirection).

use crate::dialect::Dialect;

/// The sqlx connection pool behind a [`crate::JdbcBackend`], one variant per enabled
/// driver. Share it with your application, or run your own statements on it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Pool {
    /// SQLite.
    #[cfg(feature = "sqlite")]
    Sqlite(sqlx::SqlitePool),
    /// MariaDB / MySQL.
    #[cfg(feature = "mysql")]
    MySql(sqlx::MySqlPool),
    /// PostgreSQL.
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgPool),
}

#[cfg(feature = "sqlite")]
impl From<sqlx::SqlitePool> for Pool {
    fn from(pool: sqlx::SqlitePool) -> Self {
        Pool::Sqlite(pool)
    }
}

#[cfg(feature = "mysql")]
impl From<sqlx::MySqlPool> for Pool {
    fn from(pool: sqlx::MySqlPool) -> Self {
        Pool::MySql(pool)
    }
}

#[cfg(feature = "postgres")]
impl From<sqlx::PgPool> for Pool {
    fn from(pool: sqlx::PgPool) -> Self {
        Pool::Postgres(pool)
    }
}

impl Pool {
    /// The dialect of this pool's database.
    pub fn dialect(&self) -> Dialect {
        match self {
            #[cfg(feature = "sqlite")]
            Pool::Sqlite(_) => Dialect::Sqlite,
            #[cfg(feature = "mysql")]
            Pool::MySql(_) => Dialect::MySql,
            #[cfg(feature = "postgres")]
            Pool::Postgres(_) => Dialect::Postgres,
        }
    }

    pub(crate) async fn close(&self) {
        on_pool!(self, p => p.close().await)
    }
}

/// A bound parameter.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Param<'a> {
    Text(&'a str),
    Int(i64),
    Bytes(&'a [u8]),
}

/// Runs `$body` with `$p` bound to the concrete pool of whichever driver `$pool` holds.
macro_rules! on_pool {
    ($pool:expr, $p:ident => $body:expr) => {
        match $pool {
            #[cfg(feature = "sqlite")]
            $crate::pool::Pool::Sqlite($p) => $body,
            #[cfg(feature = "mysql")]
            $crate::pool::Pool::MySql($p) => $body,
            #[cfg(feature = "postgres")]
            $crate::pool::Pool::Postgres($p) => $body,
        }
    };
}
pub(crate) use on_pool;

/// `sqlx::query(stmt)` with `params` bound in the statement's order.
macro_rules! query {
    ($stmt:expr, $params:expr) => {{
        let stmt: &$crate::dialect::Stmt = $stmt;
        let params: &[$crate::pool::Param<'_>] = $params;
        // The text is the statement's own, built once (an `Arc`: nothing copied).
        let mut q = sqlx::query(sqlx::AssertSqlSafe(std::sync::Arc::clone(&stmt.sql)));
        for &i in &stmt.order {
            // A missing parameter (a bug) reaches the database as a bind error, not a panic.
            q = match params.get(i) {
                Some($crate::pool::Param::Text(v)) => q.bind(*v),
                Some($crate::pool::Param::Int(v)) => q.bind(*v),
                Some($crate::pool::Param::Bytes(v)) => q.bind(*v),
                None => q,
            };
        }
        q
    }};
}
pub(crate) use query;
