//! A statement's parameter, bound ([`crate::pool`]) or written into its text
//! ([`crate::inline`]).

/// A bound parameter.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Param<'a> {
    Text(&'a str),
    Int(i64),
    Bytes(&'a [u8]),
}
