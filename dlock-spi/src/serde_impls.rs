//! `serde::Serialize` for the values `inspect` returns (feature `serde`), in the shape
//! `dlock status --json` prints:
//!
//! * [`FencingToken`] — a number; [`OwnerId`] — a string; [`GrantId`] — its hex text;
//! * [`LockMode`] — `"exclusive"`, `"shared"`, or `{"permits": n}`;
//! * [`HolderInfo`] — `owner`, `grant`, `mode`, `token`, `context` (the bytes as
//!   UTF-8 text, an invalid sequence shown as U+FFFD), `remaining_lease_ms` and
//!   `remaining_ttl_ms` (whole milliseconds, `null` when the backend has none);
//! * [`LockState`] — `holders` and `waiters` (`null` when the backend cannot tell).

use std::time::Duration;

use serde::ser::{SerializeMap, SerializeStruct};
use serde::{Serialize, Serializer};

use crate::{FencingToken, GrantId, HolderInfo, LockMode, LockState, OwnerId};

#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
impl Serialize for FencingToken {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(self.get())
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
impl Serialize for OwnerId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
impl Serialize for GrantId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
impl Serialize for LockMode {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            LockMode::Exclusive | LockMode::Shared => serializer.serialize_str(self.as_str()),
            LockMode::Permits(n) => {
                let mut map = serializer.serialize_map(Some(1))?;
                map.serialize_entry("permits", n)?;
                map.end()
            }
        }
    }
}

fn millis(d: Option<Duration>) -> Option<u64> {
    d.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
impl Serialize for HolderInfo {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // Every field named: a new one does not compile until it is serialized.
        let HolderInfo {
            owner,
            grant,
            mode,
            token,
            context,
            remaining_lease,
            remaining_ttl,
        } = self;
        let mut s = serializer.serialize_struct("HolderInfo", 7)?;
        s.serialize_field("owner", owner)?;
        s.serialize_field("grant", grant)?;
        s.serialize_field("mode", mode)?;
        s.serialize_field("token", token)?;
        s.serialize_field("context", &String::from_utf8_lossy(context))?;
        s.serialize_field("remaining_lease_ms", &millis(*remaining_lease))?;
        s.serialize_field("remaining_ttl_ms", &millis(*remaining_ttl))?;
        s.end()
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
impl Serialize for LockState {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let LockState { holders, waiters } = self;
        let mut s = serializer.serialize_struct("LockState", 2)?;
        s.serialize_field("holders", holders)?;
        s.serialize_field("waiters", waiters)?;
        s.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn a_state_serializes_as_documented() {
        let holder = HolderInfo::new(
            OwnerId::new("m1:7"),
            LockMode::Permits(2),
            FencingToken::new(42),
            Bytes::from_static(b"node-a\xff"),
            Some(Duration::from_micros(1_500_900)),
        )
        .with_grant(Some(GrantId::new(255)));
        let state = LockState::new(vec![holder], None);
        assert_eq!(
            serde_json::to_string(&state).unwrap(),
            r#"{"holders":[{"owner":"m1:7","grant":"ff","mode":{"permits":2},"token":42,"context":"node-a�","remaining_lease_ms":1500,"remaining_ttl_ms":null}],"waiters":null}"#
        );
        let shared = HolderInfo::new(
            OwnerId::new("m2:1"),
            LockMode::Shared,
            FencingToken::new(7),
            Bytes::new(),
            None,
        );
        assert_eq!(
            serde_json::to_string(&LockState::new(vec![shared], Some(3))).unwrap(),
            r#"{"holders":[{"owner":"m2:1","grant":null,"mode":"shared","token":7,"context":"","remaining_lease_ms":null,"remaining_ttl_ms":null}],"waiters":3}"#
        );
    }
}
