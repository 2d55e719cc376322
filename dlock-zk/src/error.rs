//! The one place ZooKeeper client errors become dlock errors.

use dlock_spi::{Error, ErrorKind};
use zookeeper_client::Error as ZkError;

pub(crate) fn map_zk(err: ZkError, op: &'static str) -> Error {
    let (kind, retryable, hint) = match &err {
        ZkError::ConnectionLoss | ZkError::Timeout | ZkError::Throttled | ZkError::NoHosts => (
            ErrorKind::Backend,
            true,
            "cannot reach ZooKeeper; the client reconnects by itself — retry",
        ),
        ZkError::SessionExpired | ZkError::ClientClosed | ZkError::SessionMoved => (
            ErrorKind::Backend,
            true,
            "the ZooKeeper session ended; dlock opens a new one — retry",
        ),
        ZkError::AuthFailed | ZkError::NoAuth | ZkError::InvalidAcl => (
            ErrorKind::Config,
            false,
            "ZooKeeper refused access; check the digest credentials in the URL and the ACL of the root path",
        ),
        ZkError::NotReadOnly => (
            ErrorKind::Backend,
            true,
            "connected to a read-only ZooKeeper server (no quorum); retry when the ensemble has a quorum",
        ),
        _ => (
            ErrorKind::Backend,
            false,
            "ZooKeeper refused the request; check that the server is 3.5 or newer",
        ),
    };
    Error::new(kind, hint)
        .set_retryable(retryable)
        .with_context("backend", "zookeeper")
        .with_context("op", op)
        .with_source(err)
}
