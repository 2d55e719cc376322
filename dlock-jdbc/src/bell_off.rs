//! Without the `mysql` feature there are no bells (see the `mysql` build's
//! `bell` module): waiters poll, or on PostgreSQL wake on `NOTIFY`. The same
//! interface, on a type that cannot be built.
#![allow(dead_code)]

use std::time::Instant;

use crate::wakeups::Next;

/// Never built without the `mysql` feature.
pub(crate) enum Bells {}

impl Bells {
    pub(crate) fn renewed(&self, _name: &str, _holder: &str, _lease_end: Instant) {
        match *self {}
    }

    pub(crate) async fn ring(&self, _name: &str, _holder: &str) {
        match *self {}
    }

    pub(crate) fn close(&self) {
        match *self {}
    }

    pub(crate) fn taken(&self) -> u64 {
        match *self {}
    }
}

/// A waiting acquire's part in its lock's bell: none.
#[derive(Default)]
pub(crate) struct Waiter {
    _none: (),
}

impl Waiter {
    pub(crate) fn holds(&self) -> bool {
        false
    }

    pub(crate) async fn wait_turn(
        &mut self,
        bells: &Bells,
        _name: &str,
        _me: &str,
        _target: Option<&str>,
        _until: Instant,
    ) -> Next {
        match *bells {}
    }

    pub(crate) fn keep(&mut self, bells: &Bells, _name: &str, _holder: &str, _lease_end: Instant) {
        match *bells {}
    }

    pub(crate) async fn leave(&mut self, bells: &Bells) {
        match *bells {}
    }
}
