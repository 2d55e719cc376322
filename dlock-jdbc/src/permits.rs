//! A semaphore's permit holders, kept in its own `locks` row (schema version 5).
//!
//! The column `holders` is a JSON array with one entry per holder,
//! `[owner, permits, expires_at, token, acquired_at, context]` (database ms; the
//! context as lowercase hex). A grant, a release and a renewal are then each one
//! `UPDATE` of one row — the row the lock's own statements use — instead of a
//! transaction over the semaphore's row and a holder's row: the same number of
//! writes per cycle as an exclusive lock. Renewals write back only the live
//! entries, and so do grants and releases on SQLite and PostgreSQL (a MySQL grant
//! drops a lapsed oldest entry; see [`grant`]): a holder that crashed leaves the row
//! with the next renewal of any holder, or sooner.
//!
//! This module holds the layout, each dialect's JSON fragments and the statements
//! built from them; [`crate::statements::Statements`] carries the statements.

use crate::dialect::Dialect;

/// One dialect's way of reading and writing the array. `h` is the entry being
/// read, listed by [`Json::from`] from the `{locks}` row in scope.
struct Json {
    /// A `FROM` item listing the row's entries as `h`.
    from: &'static str,
    /// Whether `h` belongs to holder `$2` (byte-wise).
    mine: &'static str,
    /// `h`'s owner, as text.
    owner: &'static str,
    permits: &'static str,
    expires: &'static str,
    token: &'static str,
    acquired: &'static str,
    /// `h`'s context, as hex text.
    context: &'static str,
    /// `h`'s position in the array, from 0.
    index: &'static str,
    /// `h` itself, as JSON.
    entry: &'static str,
    /// Aggregates `h`'s kept by a query into an array (`[]` when none): `{}` is the
    /// element.
    collect: &'static str,
    /// Appends `{1}` to the array `{0}`.
    append: &'static str,
    /// A JSON array of the listed values (`{}`).
    array: &'static str,
    /// The entry `{0}` with field `{1}` set to `{2}`.
    set: &'static str,
    /// Casts for the values a new entry takes from parameters: owner, count, context.
    text_param: &'static str,
    int_param: &'static str,
}

const SQLITE: Json = Json {
    from: "json_each(COALESCE({locks}.holders, '[]')) h",
    mine: "json_extract(h.value, '$[0]') = $2",
    owner: "json_extract(h.value, '$[0]')",
    permits: "json_extract(h.value, '$[1]')",
    expires: "json_extract(h.value, '$[2]')",
    token: "json_extract(h.value, '$[3]')",
    acquired: "json_extract(h.value, '$[4]')",
    context: "json_extract(h.value, '$[5]')",
    index: "h.key",
    entry: "json(h.value)",
    collect: "json_group_array({})",
    append: "json_insert({0}, '$[#]', {1})",
    array: "json_array({})",
    set: "json_set({0}, '$[{1}]', {2})",
    text_param: "{}",
    int_param: "{}",
};

/// MariaDB 10.6+ / MySQL 8: `JSON_TABLE`, with the owner compared byte-wise as the
/// `owner` columns are (`utf8mb4_bin`).
const MYSQL: Json = Json {
    from: "JSON_TABLE(COALESCE({locks}.holders, '[]'), '$[*]' COLUMNS (\
           i FOR ORDINALITY, \
           o VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[0]', \
           p BIGINT PATH '$[1]', e BIGINT PATH '$[2]', t BIGINT PATH '$[3]', \
           a BIGINT PATH '$[4]')) h",
    mine: "h.o = $2",
    owner: "CONVERT(h.o USING utf8mb4)",
    permits: "h.p",
    expires: "h.e",
    token: "h.t",
    acquired: "h.a",
    context: "CONVERT(JSON_UNQUOTE(JSON_EXTRACT({locks}.holders, CONCAT('$[', h.i - 1, '][5]'))) USING utf8mb4)",
    index: "(h.i - 1)",
    entry: "JSON_EXTRACT({locks}.holders, CONCAT('$[', h.i - 1, ']'))",
    collect: "COALESCE(JSON_ARRAYAGG({}), JSON_ARRAY())",
    append: "JSON_ARRAY_APPEND({0}, '$', {1})",
    array: "JSON_ARRAY({})",
    set: "JSON_SET({0}, '$[{1}]', {2})",
    text_param: "{}",
    int_param: "{}",
};

const POSTGRES: Json = Json {
    from:
        "jsonb_array_elements(COALESCE({locks}.holders, '[]'::jsonb)) WITH ORDINALITY h(entry, i)",
    mine: "(h.entry->>0) = $2::text",
    owner: "(h.entry->>0)",
    permits: "(h.entry->>1)::bigint",
    expires: "(h.entry->>2)::bigint",
    token: "(h.entry->>3)::bigint",
    acquired: "(h.entry->>4)::bigint",
    context: "(h.entry->>5)",
    index: "(h.i - 1)",
    entry: "h.entry",
    collect: "COALESCE(jsonb_agg({} ORDER BY h.i), '[]'::jsonb)",
    append: "({0} || jsonb_build_array({1}))",
    array: "jsonb_build_array({})",
    set: "jsonb_set({0}, ARRAY['{1}'], to_jsonb({2}))",
    text_param: "{}::text",
    int_param: "{}::bigint",
};

fn json(dialect: Dialect) -> &'static Json {
    match dialect {
        Dialect::Sqlite => &SQLITE,
        Dialect::MySql => &MYSQL,
        Dialect::Postgres => &POSTGRES,
    }
}

/// Fills `{}` (or `{0}`, `{1}`, …) in a fragment.
fn fill(fragment: &str, args: &[&str]) -> String {
    let mut out = fragment.replace("{}", args.first().copied().unwrap_or_default());
    for (i, a) in args.iter().enumerate() {
        out = out.replace(&format!("{{{i}}}"), a);
    }
    out
}

impl Json {
    /// The live entries other than `$2`'s, as an array.
    fn others(&self) -> String {
        format!(
            "(SELECT {} FROM {} WHERE {} > NOW AND NOT ({}))",
            fill(self.collect, &[self.entry]),
            self.from,
            self.expires,
            self.mine
        )
    }

    /// The position of `$2`'s live entry (NULL when it has none).
    fn my_index(&self) -> String {
        format!(
            "(SELECT {} FROM {} WHERE {} > NOW AND {} LIMIT 1)",
            self.index, self.from, self.expires, self.mine
        )
    }

    /// Entry `h` with field `field` set to `value` where `h` is `$2`'s.
    fn set_mine(&self, entry: &str, field: u8, value: &str, otherwise: &str) -> String {
        fill(
            self.set,
            &[
                entry,
                &field.to_string(),
                &format!("CASE WHEN {} THEN {value} ELSE {otherwise} END", self.mine),
            ],
        )
    }
}

/// The permits held by live holders of the semaphore in scope other than `$2`.
pub(crate) fn used_by_others(dialect: Dialect) -> String {
    let j = json(dialect);
    format!(
        "(SELECT CAST(COALESCE(SUM({}), 0) AS INT64) FROM {} WHERE {} > NOW AND NOT ({}))",
        j.permits, j.from, j.expires, j.mine
    )
}

/// The grant's condition (`PERMIT_ROOM`, see [`crate::dialect`]) as `dialect` runs
/// it. MySQL: every `JSON_TABLE` in a statement costs a temporary table, evaluated or
/// not (MariaDB: ~0.1 ms, as much as the rest of the grant), so the grant has one:
/// it sums the permits used by others, first, into `@dlock_used`, and counts `$2`'s
/// entries, live or lapsed (a retried grant replaces its entry), into `@dlock_mine`.
pub(crate) fn room(dialect: Dialect, room: &str) -> String {
    match dialect {
        Dialect::MySql => {
            let j = json(dialect);
            let (expires, mine) = (j.expires, j.mine);
            format!(
                "(@dlock_used := (SELECT CAST(COALESCE(SUM(IF({expires} > NOW AND NOT ({mine}), {}, 0)), 0) AS SIGNED) \
                   + 0 * (@dlock_mine := COALESCE(SUM({mine}), 0)) FROM {})) IS NOT NULL AND {}",
                j.permits,
                j.from,
                room.replace("PERMITS_USED", "@dlock_used"),
            )
        }
        Dialect::Sqlite | Dialect::Postgres => room.to_owned(),
    }
}

/// MySQL: the path of `$2`'s entry (`$[i]`), found without a `JSON_TABLE`:
/// `JSON_SEARCH` (case-sensitive on a JSON column) for `pattern`, the parameter
/// holding the owner with `%`, `_` and `\` escaped (see [`search_pattern`]); NULL
/// when it has none. A row holds at most one entry per owner (a grant replaces
/// it); the release also checks the entry's owner byte-wise and its lease.
fn mysql_entry(pattern: &str) -> String {
    format!(
        "SUBSTRING_INDEX(JSON_UNQUOTE(JSON_SEARCH(holders, 'one', {pattern}, NULL, '$[*][0]')), '[', 2)"
    )
}

/// `$2` as a `JSON_SEARCH` pattern that matches it only (MySQL's release binds it
/// as `$3`, its grant as `$7`).
pub(crate) fn search_pattern(owner: &str) -> String {
    let mut out = String::with_capacity(owner.len() + 4);
    for c in owner.chars() {
        if matches!(c, '\\' | '%' | '_') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `$1` name, `$2` owner, `$3` lease ms, `$4` permits, `$5` the total, `$6` context
/// (hex), `$7` the owner's [`search_pattern`] (MySQL) → token (RETURNING, or
/// LAST_INSERT_ID on MySQL; no row / 0 = not granted).
/// One `UPDATE` of the semaphore's row: where `PERMIT_ROOM` holds, bumps the token,
/// raises the readers' horizon, records the total and writes the live holders with
/// `$2`'s new entry.
pub(crate) fn grant(dialect: Dialect) -> String {
    let j = json(dialect);
    let entry = |token: &str| {
        fill(
            j.array,
            &[&[
                fill(j.text_param, &["$2"]),
                fill(j.int_param, &["$4"]),
                "NOW + $3".into(),
                token.into(),
                "NOW".into(),
                fill(j.text_param, &["$6"]),
            ]
            .join(", ")],
        )
    };
    match dialect {
        // MySQL assigns left to right, each assignment seeing the ones before it:
        // `token` is the new token once assigned, `holders` still the old array.
        // Without a second `JSON_TABLE` the grant appends, dropping `$2`'s own entry
        // (a retried grant: `$7` is its search pattern) or else the first entry if
        // it has lapsed (the oldest grant); renewals drop every lapsed one.
        Dialect::MySql => format!(
            "UPDATE {{locks}} SET \
               token = IF(@dlock_grant := (PERMIT_ROOM), \
                          LAST_INSERT_ID(GREATEST(token + 1, CLOCK_US)), token + LAST_INSERT_ID(0)), \
               shared_until = IF(@dlock_grant, GREATEST(shared_until, NOW + $3), shared_until), \
               holders = IF(@dlock_grant, {}, holders), \
               capacity = IF(@dlock_grant, $5, capacity) \
             WHERE name = $1",
            fill(
                j.append,
                &[
                    &format!(
                        "IF(@dlock_mine > 0, JSON_REMOVE(holders, {}), \
                         IF(JSON_EXTRACT(holders, '$[0][2]') <= NOW, JSON_REMOVE(holders, '$[0]'), COALESCE(holders, '[]')))",
                        mysql_entry("$7")
                    ),
                    &entry("token")
                ]
            )
        ),
        // Every assignment sees the old row (and CLOCK_US one value per statement).
        Dialect::Sqlite | Dialect::Postgres => format!(
            "UPDATE {{locks}} SET token = GREATEST(token + 1, CLOCK_US), \
               shared_until = GREATEST(shared_until, NOW + $3), capacity = $5, \
               holders = {} \
             WHERE name = $1 AND PERMIT_ROOM RETURNING token",
            fill(j.append, &[&j.others(), &entry("GREATEST(token + 1, CLOCK_US)")])
        ),
    }
}

/// `$1` name, `$2` owner (and `$3` its [`search_pattern`], MySQL) → rows affected
/// (or a notify row on PostgreSQL, a row with the notice's payload on SQLite): removes `$2`'s live entry (and, but on MySQL,
/// the lapsed ones; there renewals do).
pub(crate) fn release(dialect: Dialect) -> String {
    let j = json(dialect);
    let rewrite = || {
        format!(
            "UPDATE {{locks}} SET holders = {} WHERE name = $1 AND {} IS NOT NULL",
            j.others(),
            j.my_index()
        )
    };
    match dialect {
        Dialect::MySql => {
            let e = mysql_entry("$3");
            format!(
                "UPDATE {{locks}} SET holders = JSON_REMOVE(holders, {e}) \
                 WHERE name = $1 AND {e} IS NOT NULL \
                   AND JSON_UNQUOTE(JSON_EXTRACT(holders, CONCAT({e}, '[0]'))) = $2 \
                   AND JSON_EXTRACT(holders, CONCAT({e}, '[2]')) > NOW"
            )
        }
        Dialect::Postgres => format!(
            "{} RETURNING pg_notify('{{channel}}', RELEASE_PAYLOAD)",
            rewrite()
        ),
        // The payload, for the backend to send ([`crate::local_bus`]), if a waiter waits.
        // (`PAYLOAD_IF_WAITED`: a template name, filled in with the statement.)
        Dialect::Sqlite => format!("{} RETURNING PAYLOAD_IF_WAITED", rewrite()),
    }
}

/// `$1` name, `$2` owner, `$3` lease ms (and `$4` context as hex, `with_context`) →
/// rows affected: writes back the live entries, `$2`'s extended (and its context
/// replaced), and raises the readers' horizon — renewals also drop lapsed holders.
pub(crate) fn renew(dialect: Dialect, with_context: bool) -> String {
    let j = json(dialect);
    let mut entry = j.set_mine(j.entry, 2, "NOW + $3", j.expires);
    if with_context {
        entry = j.set_mine(&entry, 5, &fill(j.text_param, &["$4"]), j.context);
    }
    format!(
        "UPDATE {{locks}} SET shared_until = GREATEST(shared_until, NOW + $3), \
           holders = (SELECT {} FROM {} WHERE {} > NOW) \
         WHERE name = $1 AND {} IS NOT NULL",
        fill(j.collect, &[&entry]),
        j.from,
        j.expires,
        j.my_index()
    )
}

/// `$1` name → owner, token, context (hex), remaining ms, permits per live holder,
/// in order of arrival.
pub(crate) fn inspect(dialect: Dialect) -> String {
    let j = json(dialect);
    format!(
        "SELECT {}, {}, {}, {} - NOW, {} FROM {{locks}}, {} \
         WHERE {{locks}}.name = $1 AND {} > NOW ORDER BY {}, {}",
        j.owner, j.token, j.context, j.expires, j.permits, j.from, j.expires, j.acquired, j.owner
    )
}

/// `$1` name → how many holders are live.
pub(crate) fn count_live(dialect: Dialect) -> String {
    let j = json(dialect);
    format!(
        "SELECT COUNT(*) FROM {{locks}}, {} WHERE {{locks}}.name = $1 AND {} > NOW",
        j.from, j.expires
    )
}

/// Whether the `{locks}` row in scope has a live permit holder.
pub(crate) fn any_live(dialect: Dialect) -> String {
    let j = json(dialect);
    format!(
        "EXISTS (SELECT 1 FROM {} WHERE {} > NOW)",
        j.from, j.expires
    )
}

/// A context as stored in an entry: lowercase hex.
pub(crate) fn context_hex(context: &[u8]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(context.len() * 2);
    for b in context {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// The context an entry stores (`None` when it is not hex: written by hand).
pub(crate) fn context_bytes(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| {
            hex.get(i..i + 2)
                .and_then(|b| u8::from_str_radix(b, 16).ok())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contexts_round_trip_through_hex() {
        for bytes in [&b""[..], b"\x00\xff", b"leader-1"] {
            let hex = context_hex(bytes);
            assert_eq!(context_bytes(&hex).as_deref(), Some(bytes));
        }
        assert_eq!(context_bytes("abc"), None);
        assert_eq!(context_bytes("zz"), None);
    }
}
