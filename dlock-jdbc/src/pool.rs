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

/// A statement ready to run on an executor: bound (the extended protocol, prepared
/// once per connection), or with its parameters written into its text (the simple
/// protocol; PostgreSQL behind a transaction pooler, [`crate::inline`]).
pub(crate) enum Query<'q, DB: sqlx::Database> {
    /// `sqlx::query` with its parameters bound.
    Bound(sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments>),
    /// `sqlx::raw_sql` of the statement with its parameters written in.
    Inline(sqlx::RawSql),
}

impl<'q, DB> Query<'q, DB>
where
    DB: sqlx::Database,
    <DB as sqlx::Database>::Arguments: sqlx::IntoArguments<DB> + Send,
{
    /// Runs it, for the rows it changed.
    pub(crate) async fn execute<'e, 'c: 'e, E>(self, e: E) -> Result<DB::QueryResult, sqlx::Error>
    where
        'q: 'e,
        E: sqlx::Executor<'c, Database = DB>,
    {
        match self {
            Query::Bound(q) => q.execute(e).await,
            Query::Inline(q) => q.execute(e).await,
        }
    }

    /// Runs it, for its first row if it has one.
    pub(crate) async fn fetch_optional<'e, 'c: 'e, E>(
        self,
        e: E,
    ) -> Result<Option<DB::Row>, sqlx::Error>
    where
        'q: 'e,
        E: sqlx::Executor<'c, Database = DB>,
    {
        match self {
            Query::Bound(q) => q.fetch_optional(e).await,
            Query::Inline(q) => q.fetch_optional(e).await,
        }
    }

    /// Runs it, for its one row (an error if it has none).
    pub(crate) async fn fetch_one<'e, 'c: 'e, E>(self, e: E) -> Result<DB::Row, sqlx::Error>
    where
        'q: 'e,
        E: sqlx::Executor<'c, Database = DB>,
    {
        match self {
            Query::Bound(q) => q.fetch_one(e).await,
            Query::Inline(q) => q.fetch_one(e).await,
        }
    }

    /// Runs it, for all its rows.
    pub(crate) async fn fetch_all<'e, 'c: 'e, E>(self, e: E) -> Result<Vec<DB::Row>, sqlx::Error>
    where
        'q: 'e,
        E: sqlx::Executor<'c, Database = DB>,
    {
        match self {
            Query::Bound(q) => q.fetch_all(e).await,
            Query::Inline(q) => q.fetch_all(e).await,
        }
    }
}

/// The statement `stmt` with `params`, as a [`Query`]: bound in the statement's
/// order, or written into its text where the statement says so ([`Stmt::inline`]).
///
/// [`Stmt::inline`]: crate::statements::Stmt::inline
macro_rules! query {
    ($stmt:expr, $params:expr) => {{
        let stmt: &$crate::statements::Stmt = $stmt;
        let params: &[$crate::param::Param<'_>] = $params;
        match stmt.inlined(params) {
            Some(text) => $crate::pool::Query::Inline(sqlx::raw_sql(sqlx::AssertSqlSafe(text))),
            None => {
                // The text is the statement's own, built once (an `Arc`: nothing copied).
                let mut q = sqlx::query(sqlx::AssertSqlSafe(std::sync::Arc::clone(&stmt.sql)));
                for &i in &stmt.order {
                    // A missing parameter (a bug) reaches the database as a bind error, not a panic.
                    q = match params.get(i) {
                        Some($crate::param::Param::Text(v)) => q.bind(*v),
                        Some($crate::param::Param::Int(v)) => q.bind(*v),
                        Some($crate::param::Param::Bytes(v)) => q.bind(*v),
                        None => q,
                    };
                }
                $crate::pool::Query::Bound(q)
            }
        }
    }};
}
pub(crate) use query;
