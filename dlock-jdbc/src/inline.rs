//! Statements with their parameters written into their text, for PostgreSQL behind
//! a transaction pooler ([`crate::JdbcPooler::Transaction`]).
//!
//! A pooler in transaction mode (PgBouncer's `pool_mode = transaction`, the default
//! of most managed PostgreSQL poolers) hands a client's statements to whichever
//! server session is free at each transaction's start. sqlx's extended protocol
//! does not survive that: it prepares a named statement once per connection and
//! binds it later (another server session, where the name is unknown or another
//! client's), and even an unnamed one is parsed and bound in two exchanges, each
//! ended by a `Sync` after which the pooler may switch sessions. A simple-protocol
//! query is one message and one answer, so it runs on one session whatever the
//! pooler does. There it cannot carry parameters: they are written into the text as
//! typed literals, each cast to the type sqlx binds it as (`text`, `int8`,
//! `bytea`), so the statement means what its bound form means.
//!
//! Only the values of [`Param`] are written, and each is escaped whole: a text as
//! an escape string (`E'…'`, its backslashes and quotes doubled — the same
//! whatever `standard_conforming_strings` says), an integer quoted, bytes as hex.
//! No text of the caller's reaches the statement outside such a literal.

use std::fmt::Write;

use crate::param::Param;

/// `sql` (PostgreSQL placeholders `$1…$n`) with each `$k` replaced by the literal
/// of `params[k - 1]`. A placeholder without a parameter (a bug) is left as it is:
/// the database refuses it ("there is no parameter $k"), as it refuses a bind that
/// is missing.
pub(crate) fn render(sql: &str, params: &[Param<'_>]) -> String {
    let mut out = String::with_capacity(sql.len() + 16 * params.len());
    let mut rest = sql;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        let param = after[..digits]
            .parse::<usize>()
            .ok()
            .and_then(|k| k.checked_sub(1))
            .and_then(|i| params.get(i));
        match param {
            Some(p) => literal(&mut out, *p),
            None => {
                out.push('$');
                out.push_str(&after[..digits]);
            }
        }
        rest = &after[digits..];
    }
    out.push_str(rest);
    out
}

/// Appends `param` as a typed PostgreSQL literal.
fn literal(out: &mut String, param: Param<'_>) {
    match param {
        Param::Text(v) => {
            out.push_str("E'");
            for c in v.chars() {
                match c {
                    '\'' => out.push_str("''"),
                    '\\' => out.push_str("\\\\"),
                    // The query message ends at a NUL byte: written as an escape, it
                    // reaches the server, which refuses it in text (as it refuses a
                    // bound one), instead of cutting the statement short.
                    '\0' => out.push_str("\\x00"),
                    c => out.push(c),
                }
            }
            out.push_str("'::text");
        }
        // Quoted: `-9223372036854775808::int8` would negate an out-of-range literal.
        Param::Int(v) => {
            let _ = write!(out, "'{v}'::int8");
        }
        Param::Bytes(v) => {
            out.push_str("E'\\\\x");
            for b in v {
                let _ = write!(out, "{b:02x}");
            }
            out.push_str("'::bytea");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_placeholder_becomes_its_typed_literal() {
        let sql = "SELECT $1, $2 WHERE a = $1 AND b = $10 AND c = $3";
        let out = render(
            sql,
            &[
                Param::Text("x"),
                Param::Int(-9_223_372_036_854_775_808),
                Param::Bytes(&[0, 0xab]),
            ],
        );
        assert_eq!(
            out,
            "SELECT E'x'::text, '-9223372036854775808'::int8 WHERE a = E'x'::text AND b = $10 AND c = E'\\\\x00ab'::bytea"
        );
    }

    #[test]
    fn quotes_backslashes_and_nul_stay_inside_the_literal() {
        let out = render(
            "WHERE name = $1",
            &[Param::Text("a'b\\'; DROP TABLE t; --\0")],
        );
        assert_eq!(
            out,
            "WHERE name = E'a''b\\\\''; DROP TABLE t; --\\x00'::text"
        );
        // Every quote of the value is doubled: the literal ends only at its own end.
        let inner = &out["WHERE name = E'".len()..out.len() - "'::text".len()];
        assert_eq!(inner.replace("''", "").matches('\'').count(), 0);
    }

    #[test]
    fn text_without_placeholders_is_unchanged() {
        assert_eq!(render("SELECT 1", &[Param::Int(1)]), "SELECT 1");
        assert_eq!(render("SELECT $", &[]), "SELECT $");
    }
}
