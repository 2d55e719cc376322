//! SQL's same-run control: raw statements on the backend's own pool, the least each
//! design's cycle writes, without dlock's queue, total and reentry checks.
//!
//! * `lock row`: one row per lock, granted and released by one `UPDATE` each — the
//!   lock's floor.
//! * `holder rows`: dlock's semaphore design — a grant bumps the semaphore's row
//!   (the point concurrent grants serialize on; on MySQL locked first, as dlock's
//!   transaction must) where the live holders' permits leave room, and inserts the
//!   holder's row; a release deletes it. One statement on PostgreSQL (a CTE), a
//!   transaction elsewhere.
//! * `holders in the row`: the holders kept as JSON in the semaphore's own row, so a
//!   grant and a release are one `UPDATE` of one row each, as the lock's are.

use dlock_jdbc::{sqlx, SqlPool};

/// `NOW` in milliseconds, `$1` the name, `$2` the owner (SQLite's and PostgreSQL's
/// text; MySQL's statements are written apart, with `?` in bind order).
fn text(pool: &SqlPool, template: &str) -> String {
    match pool {
        SqlPool::Sqlite(_) => template
            .replace(
                "NOW",
                "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
            )
            .replace("$1", "?1")
            .replace("$2", "?2"),
        _ => template.replace(
            "NOW",
            "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT",
        ),
    }
}

/// One statement with the indices of its binds (0 the name, 1 the owner).
type Stmt = (String, &'static [usize]);

/// One floor: its acquire's statements (in a transaction when there are several)
/// and its release.
pub(crate) struct Floor {
    pool: SqlPool,
    acquire: Vec<Stmt>,
    release: Stmt,
    name: String,
}

const BOTH: &[usize] = &[0, 1];
const NAME_FIRST: &[usize] = &[0];

impl Floor {
    /// The three floors on `pool`, each on its own row named after `tag`.
    pub(crate) async fn all(pool: &SqlPool, tag: &str) -> [Floor; 3] {
        let mysql = matches!(pool, SqlPool::MySql(_));
        let setup: Vec<String> = if mysql {
            vec![
                "CREATE TABLE IF NOT EXISTS bench_sem_rows (name VARCHAR(191) PRIMARY KEY, owner VARCHAR(191), token BIGINT NOT NULL, expires_at BIGINT NOT NULL, holders JSON NOT NULL)".into(),
                "CREATE TABLE IF NOT EXISTS bench_sem_holders (name VARCHAR(191) NOT NULL, owner VARCHAR(191) NOT NULL, token BIGINT NOT NULL, expires_at BIGINT NOT NULL, permits INT NOT NULL, PRIMARY KEY (name, owner))".into(),
            ]
        } else {
            let json = if matches!(pool, SqlPool::Postgres(_)) {
                "JSONB"
            } else {
                "TEXT"
            };
            vec![
                text(pool, &format!("CREATE TABLE IF NOT EXISTS bench_sem_rows (name TEXT PRIMARY KEY, owner TEXT, token BIGINT NOT NULL, expires_at BIGINT NOT NULL, holders {json} NOT NULL)")),
                text(pool, "CREATE TABLE IF NOT EXISTS bench_sem_holders (name TEXT NOT NULL, owner TEXT NOT NULL, token BIGINT NOT NULL, expires_at BIGINT NOT NULL, permits INT NOT NULL, PRIMARY KEY (name, owner))"),
            ]
        };
        for s in &setup {
            run(pool, s, &[], &[]).await;
        }
        let names = ["lock", "holder-rows", "json-row"].map(|k| format!("{tag}-{k}"));
        for name in &names {
            let row = if mysql {
                "INSERT IGNORE INTO bench_sem_rows VALUES (?, NULL, 0, 0, '{}')".to_owned()
            } else {
                text(pool, "INSERT INTO bench_sem_rows VALUES ($1, NULL, 0, 0, '{}') ON CONFLICT (name) DO NOTHING")
            };
            run(pool, &row, NAME_FIRST, &[name.as_str()]).await;
        }
        let [lock, rows, json] = names;
        let floor = |name: String, acquire: Vec<Stmt>, release: Stmt| Floor {
            pool: pool.clone(),
            acquire,
            release,
            name,
        };
        match pool {
            SqlPool::MySql(_) => {
                const NOW: &str = "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)";
                let m = |s: &str| s.replace("NOW", NOW);
                [
                    floor(lock, vec![(m("UPDATE bench_sem_rows SET owner = ?, token = token + 1, expires_at = NOW + 30000 WHERE name = ? AND (owner IS NULL OR expires_at <= NOW)"), &[1, 0])],
                        (m("UPDATE bench_sem_rows SET owner = NULL, expires_at = 0 WHERE name = ? AND owner = ?"), BOTH)),
                    floor(rows, vec![
                        (m("SELECT token FROM bench_sem_rows WHERE name = ? FOR UPDATE"), NAME_FIRST),
                        (m("UPDATE bench_sem_rows SET token = token + 1 WHERE name = ? AND (SELECT COALESCE(SUM(permits), 0) FROM bench_sem_holders WHERE name = ? AND expires_at > NOW) + 1 <= 3"), &[0, 0]),
                        (m("INSERT INTO bench_sem_holders SELECT name, ?, token, NOW + 30000, 1 FROM bench_sem_rows WHERE name = ?"), &[1, 0]),
                    ], (m("DELETE FROM bench_sem_holders WHERE name = ? AND owner = ?"), BOTH)),
                    floor(json, vec![(m("UPDATE bench_sem_rows SET token = token + 1, holders = JSON_SET(holders, CONCAT('$.', ?), JSON_ARRAY(token, NOW + 30000, 1)) \
                        WHERE name = ? AND (SELECT COALESCE(SUM(h.p), 0) FROM JSON_TABLE(bench_sem_rows.holders, '$.*' COLUMNS (e BIGINT PATH '$[1]', p INT PATH '$[2]')) h WHERE h.e > NOW) + 1 <= 3"), &[1, 0])],
                        (m("UPDATE bench_sem_rows SET holders = JSON_REMOVE(holders, CONCAT('$.', ?)) WHERE name = ? AND JSON_CONTAINS_PATH(holders, 'one', CONCAT('$.', ?))"), &[1, 0, 1])),
                ]
            }
            SqlPool::Postgres(_) => [
                floor(lock, vec![(text(pool, "UPDATE bench_sem_rows SET owner = $2, token = token + 1, expires_at = NOW + 30000 WHERE name = $1 AND (owner IS NULL OR expires_at <= NOW)"), BOTH)],
                    (text(pool, "UPDATE bench_sem_rows SET owner = NULL, expires_at = 0 WHERE name = $1 AND owner = $2"), BOTH)),
                floor(rows, vec![(text(pool, "WITH g AS (UPDATE bench_sem_rows SET token = token + 1 WHERE name = $1 \
                        AND (SELECT COALESCE(SUM(permits), 0) FROM bench_sem_holders WHERE name = $1 AND expires_at > NOW) + 1 <= 3 RETURNING token) \
                        INSERT INTO bench_sem_holders SELECT $1, $2, token, NOW + 30000, 1 FROM g"), BOTH)],
                    (text(pool, "DELETE FROM bench_sem_holders WHERE name = $1 AND owner = $2"), BOTH)),
                floor(json, vec![(text(pool, "UPDATE bench_sem_rows SET token = token + 1, holders = holders || jsonb_build_object($2::text, jsonb_build_array(token, NOW + 30000, 1)) \
                        WHERE name = $1 AND (SELECT COALESCE(SUM((v->>2)::int), 0) FROM jsonb_each(holders) AS h(k, v) WHERE (v->>1)::bigint > NOW) + 1 <= 3"), BOTH)],
                    (text(pool, "UPDATE bench_sem_rows SET holders = holders - $2::text WHERE name = $1 AND jsonb_exists(holders, $2)"), BOTH)),
            ],
            _ => [
                floor(lock, vec![(text(pool, "UPDATE bench_sem_rows SET owner = $2, token = token + 1, expires_at = NOW + 30000 WHERE name = $1 AND (owner IS NULL OR expires_at <= NOW)"), BOTH)],
                    (text(pool, "UPDATE bench_sem_rows SET owner = NULL, expires_at = 0 WHERE name = $1 AND owner = $2"), BOTH)),
                floor(rows, vec![
                    (text(pool, "UPDATE bench_sem_rows SET token = token + 1 WHERE name = $1 AND (SELECT COALESCE(SUM(permits), 0) FROM bench_sem_holders WHERE name = $1 AND expires_at > NOW) + 1 <= 3"), NAME_FIRST),
                    (text(pool, "INSERT INTO bench_sem_holders SELECT name, $2, token, NOW + 30000, 1 FROM bench_sem_rows WHERE name = $1"), BOTH),
                ], (text(pool, "DELETE FROM bench_sem_holders WHERE name = $1 AND owner = $2"), BOTH)),
                floor(json, vec![(text(pool, "UPDATE bench_sem_rows SET token = token + 1, holders = json_set(holders, '$.' || $2, json_array(token, NOW + 30000, 1)) \
                        WHERE name = $1 AND (SELECT COALESCE(SUM(json_extract(value, '$[2]')), 0) FROM json_each(bench_sem_rows.holders) WHERE json_extract(value, '$[1]') > NOW) + 1 <= 3"), BOTH)],
                    (text(pool, "UPDATE bench_sem_rows SET holders = json_remove(holders, '$.' || $2) WHERE name = $1 AND json_type(holders, '$.' || $2) IS NOT NULL"), BOTH)),
            ],
        }
    }

    /// One acquire + release; each statement but a locking read must change exactly
    /// one row.
    pub(crate) async fn cycle(&self) {
        let binds = [self.name.as_str(), "owner"];
        macro_rules! cycle {
            ($p:expr) => {{
                let mut tx = if self.acquire.len() > 1 {
                    Some($p.begin().await.unwrap())
                } else {
                    None
                };
                for (sql, order) in &self.acquire {
                    let mut q = sqlx::query(sqlx::AssertSqlSafe(sql.as_str()));
                    for i in *order {
                        q = q.bind(binds[*i]);
                    }
                    let done = match tx.as_mut() {
                        Some(tx) => q.execute(&mut **tx).await.unwrap().rows_affected(),
                        None => q.execute($p).await.unwrap().rows_affected(),
                    };
                    // (A locking read changes no row.)
                    assert!(
                        done == 1 || sql.starts_with("SELECT"),
                        "floor acquire refused: {sql}"
                    );
                }
                if let Some(tx) = tx {
                    tx.commit().await.unwrap();
                }
            }};
        }
        match &self.pool {
            SqlPool::Sqlite(p) => cycle!(p),
            SqlPool::MySql(p) => cycle!(p),
            SqlPool::Postgres(p) => cycle!(p),
            _ => unreachable!("all drivers are enabled in the testsuite"),
        }
        let (sql, order) = &self.release;
        let gone = run(&self.pool, sql, order, &binds).await;
        assert_eq!(gone, 1, "floor release missed: {sql}");
    }
}

/// Runs one statement outside a transaction; the rows it changed.
async fn run(pool: &SqlPool, sql: &str, order: &[usize], binds: &[&str]) -> u64 {
    macro_rules! exec {
        ($p:expr) => {{
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
            for i in order {
                q = q.bind(binds[*i]);
            }
            q.execute($p).await.unwrap().rows_affected()
        }};
    }
    match pool {
        SqlPool::Sqlite(p) => exec!(p),
        SqlPool::MySql(p) => exec!(p),
        SqlPool::Postgres(p) => exec!(p),
        _ => unreachable!("all drivers are enabled in the testsuite"),
    }
}
