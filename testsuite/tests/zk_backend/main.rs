//! What only the ZooKeeper backend promises, when `zk` (single server) or
//! `zk-ensemble` is in `DLOCK_TEST_BACKENDS`: Curator's node layout and mutual
//! exclusion with a real Java Curator client, finding an owner's node again, fencing
//! across the deletion of the lock's node, session loss signalled before anyone else
//! is granted the lock, and a stopped ensemble leader never losing a lock silently.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod blips;
mod clients;
mod curator;
mod feeds;
mod fixtures;
mod layout;
mod sessions;
