//! Without SQLite, or off Unix, there is no local bus (see the Unix SQLite build's
//! `local_bus` module): SQLite waiters poll. The same interface, on a type that
//! cannot be built.
#![allow(dead_code)]

/// Never built here.
pub(crate) enum LocalBus {}

impl LocalBus {
    pub(crate) fn send(&self, _payload: &str) {
        match *self {}
    }
}
