//! The one place ZooKeeper client errors become dlock errors.

use dlock_spi::{Error, ErrorKind};
use zookeeper_client::Error as ZkError;

pub(crate) fn map_zk(err: ZkError, op: &'static str) -> Error {
    let (kind, retryable, hint) = match &err {
        // A connection failing under the request (a loss, a broken socket's I/O
        // error, a silent connection given up on), or no server to ask yet.
        e if connection_failure(e)
            || matches!(e, ZkError::Timeout | ZkError::Throttled | ZkError::NoHosts) =>
        {
            (
                ErrorKind::Backend,
                true,
                "cannot reach ZooKeeper; the client reconnects by itself — retry",
            )
        }
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
        ZkError::Unimplemented => (
            ErrorKind::Backend,
            false,
            "ZooKeeper refused the request; check that the server is 3.5 or newer",
        ),
        _ => (
            ErrorKind::Backend,
            false,
            "ZooKeeper failed the request unexpectedly; see the source error",
        ),
    };
    Error::new(kind, hint)
        .set_retryable(retryable)
        .with_context("backend", "zookeeper")
        .with_context("op", op)
        .with_source(err)
}

/// Whether `err` is the connection failing under a request (the session may live
/// on): a connection loss, a broken socket's I/O error, or the client giving up on
/// a silent connection (a partition: "no response from connection in …ms") or
/// leaving a read-only server for a writable one — what the client hands the
/// requests in flight when it drops a connection.
pub(crate) fn connection_failure(err: &ZkError) -> bool {
    match err {
        ZkError::ConnectionLoss => true,
        ZkError::Custom(custom) => {
            let said = custom.to_string();
            io_failure(err)
                || said.starts_with("no response from connection")
                || said.starts_with("encounter writable server")
        }
        _ => false,
    }
}

/// How the client holds a `Custom` error's source.
type SharedSource = std::sync::Arc<dyn std::error::Error + Send + Sync>;

/// Whether an I/O error is in `err`'s chain (a connection that broke mid-request).
fn io_failure(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(err);
    while let Some(e) = cause {
        // The client keeps its source as `Arc<dyn Error + Send + Sync>`, which is
        // itself the error the chain shows (its `source()` skips the inner one).
        let shared = e.downcast_ref::<SharedSource>();
        if e.is::<std::io::Error>() || shared.is_some_and(|inner| inner.is::<std::io::Error>()) {
            return true;
        }
        cause = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The client's `Custom` error (no public constructor) holds a broken socket's
    /// I/O error as an `Arc<dyn Error>` source; an error holding one so stands in
    /// for it here.
    #[derive(Debug)]
    struct Wrapper(SharedSource);

    impl std::fmt::Display for Wrapper {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            self.0.fmt(f)
        }
    }

    impl std::error::Error for Wrapper {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_broken_socket_is_told_apart_from_an_old_server() {
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        assert!(io_failure(&Wrapper(std::sync::Arc::new(reset))));
        assert!(!io_failure(&ZkError::NoNode));
        let old = map_zk(ZkError::Unimplemented, "create");
        assert!(
            !old.is_retryable() && old.to_string().contains("3.5 or newer"),
            "{old}"
        );
        assert!(connection_failure(&ZkError::ConnectionLoss));
        assert!(!connection_failure(&ZkError::SessionExpired));
        let other = map_zk(ZkError::NotEmpty, "delete");
        assert!(!other.to_string().contains("3.5 or newer"), "{other}");
    }
}
