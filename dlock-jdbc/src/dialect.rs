//! The SQL dialects dlock speaks, and what differs between them in a statement's
//! text (the statements themselves: [`crate::statements`]).

/// The SQL dialects dlock speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// SQLite 3.35+ (bundled).
    Sqlite,
    /// MariaDB 10.6+ and MySQL 8 (`JSON_TABLE`).
    MySql,
    /// PostgreSQL 12+.
    Postgres,
}

impl Dialect {
    /// The database clock in epoch milliseconds, constant within a statement.
    pub(crate) fn now_ms(self) -> &'static str {
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
    pub(crate) fn clock_us(self) -> &'static str {
        match self {
            Dialect::Sqlite => "(NOW * 1000)",
            Dialect::MySql => "CAST(UNIX_TIMESTAMP(CURRENT_TIMESTAMP(6)) * 1000000 AS SIGNED)",
            Dialect::Postgres => "(EXTRACT(EPOCH FROM statement_timestamp()) * 1000000)::BIGINT",
        }
    }

    pub(crate) fn greatest(self) -> &'static str {
        match self {
            Dialect::Sqlite => "MAX",
            Dialect::MySql | Dialect::Postgres => "GREATEST",
        }
    }

    /// The owner column as text: MariaDB marks `_bin`-collated columns binary, and
    /// the driver then refuses to read them as strings.
    pub(crate) fn owner_text(self) -> &'static str {
        match self {
            Dialect::MySql => "CONVERT(owner USING utf8mb4)",
            Dialect::Sqlite | Dialect::Postgres => "owner",
        }
    }

    /// The length in bytes of the name `$1`, as text (a release notice's first
    /// field, [`crate::statements::RELEASE_PAYLOAD`]).
    pub(crate) fn name_bytes(self) -> &'static str {
        match self {
            Dialect::Sqlite => "CAST(LENGTH(CAST($1 AS BLOB)) AS TEXT)",
            Dialect::MySql => "CAST(LENGTH($1) AS CHAR)",
            Dialect::Postgres => "octet_length($1)::text",
        }
    }

    /// The 64-bit integer type in `CAST(… AS …)` (sums are decimals otherwise).
    pub(crate) fn int64(self) -> &'static str {
        match self {
            Dialect::Sqlite => "INTEGER",
            Dialect::MySql => "SIGNED",
            Dialect::Postgres => "BIGINT",
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
