//! Exit codes (sysexits.h where one fits) and the error that carries them.

use dlock_api::{Error, ErrorKind};

/// `status`: the lock is free (no holder); 0 says it is held.
pub(crate) const FREE: u8 = 1;
/// Bad usage or input (EX_USAGE).
pub(crate) const USAGE: u8 = 64;
/// The backend is unreachable (EX_UNAVAILABLE).
pub(crate) const UNAVAILABLE: u8 = 69;
/// An internal failure (EX_SOFTWARE).
pub(crate) const SOFTWARE: u8 = 70;
/// `exec`: the lock was not acquired within `--wait` (EX_TEMPFAIL).
pub(crate) const NOT_ACQUIRED: u8 = 75;
/// `exec`: the lock was lost while the command ran; the command was stopped.
pub(crate) const LOCK_LOST: u8 = 76;
/// The configuration (URL) is wrong (EX_CONFIG).
pub(crate) const CONFIG: u8 = 78;

/// A failure with its exit code and a message for the user.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) code: u8,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn new(code: u8, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
        }
    }
}

impl From<Error> for Failure {
    fn from(err: Error) -> Self {
        let code = match err.kind() {
            ErrorKind::Config => CONFIG,
            ErrorKind::InvalidName | ErrorKind::InvalidArgument | ErrorKind::Unsupported => USAGE,
            ErrorKind::Backend | ErrorKind::Timeout | ErrorKind::Closed => UNAVAILABLE,
            _ => SOFTWARE,
        };
        // The whole cause chain on one line (a refused connection says why).
        Failure::new(code, format!("{err:#}"))
    }
}
