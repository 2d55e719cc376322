//! The one place etcd client errors become dlock errors.

use dlock_spi::{Error, ErrorKind};
use etcd_client::Error as EtcdError;
use tonic::Code;

/// Classifies an etcd client error, stamped with the backend and `op` (the chain's
/// tail adds the lock to the errors of lock calls).
pub(crate) fn map_etcd(err: EtcdError, op: &'static str) -> Error {
    let (kind, retryable, hint) = match &err {
        EtcdError::InvalidArgs(_) | EtcdError::InvalidUri(_) | EtcdError::EndpointError(_) => (
            ErrorKind::Config,
            false,
            "etcd refused the client's settings; check the etcd:// URL",
        ),
        EtcdError::GRpcStatus(status) => match status.code() {
            Code::Unauthenticated | Code::PermissionDenied => (
                ErrorKind::Config,
                false,
                "etcd refused access; check the credentials and the key prefix's role",
            ),
            // Signing in again (a lapsed token) after the password changed.
            Code::InvalidArgument if status.message().contains("authentication failed") => (
                ErrorKind::Config,
                false,
                "etcd refused to sign in again (was the password changed?); check the user and password",
            ),
            Code::InvalidArgument if is_old_auth_revision(&err) => (
                ErrorKind::Backend,
                true,
                "etcd refused the request, unapplied, as its users or roles changed while it was in flight; retry",
            ),
            Code::InvalidArgument | Code::OutOfRange => (
                ErrorKind::InvalidArgument,
                false,
                "etcd refused the request as too large or malformed; keep contexts small (etcd's request limit is 1.5 MiB by default)",
            ),
            Code::FailedPrecondition => (
                ErrorKind::Backend,
                false,
                "etcd rejected the request; check that the server is etcd 3.4 or newer",
            ),
            _ => (
                ErrorKind::Backend,
                true,
                "etcd did not answer (no leader, member down or unreachable) — retry",
            ),
        },
        _ => (
            ErrorKind::Backend,
            true,
            "cannot reach etcd; the client reconnects by itself — retry",
        ),
    };
    Error::new(kind, hint)
        .set_retryable(retryable)
        .with_context("backend", "etcd")
        .with_context("op", op)
        .with_source(err)
}

/// Whether etcd refused `err`'s request because a user or role changed between
/// its proposal and its application (`ErrAuthOldRevision`): nothing was applied,
/// and the request may be sent again (after signing in again, as etcd's own
/// client does).
pub(crate) fn is_old_auth_revision(err: &EtcdError) -> bool {
    matches!(err, EtcdError::GRpcStatus(status)
        if status.code() == Code::InvalidArgument
            && status.message().contains("revision of auth store is old"))
}

/// A request that got no answer within the backend's request timeout.
pub(crate) fn timed_out(op: &'static str) -> Error {
    Error::new(
        ErrorKind::Timeout,
        "etcd did not answer within the request timeout (set timeout= in the URL) — retry",
    )
    .with_context("backend", "etcd")
    .with_context("op", op)
}

/// Classifies a failure to sign in with `credentials` (or, without them, to set the
/// client up): a refused user or password is a `Config` error naming the user; the
/// rest as [`map_etcd`].
pub(crate) fn map_sign_in(err: EtcdError, credentials: Option<&crate::EtcdCredentials>) -> Error {
    match (&err, credentials) {
        (EtcdError::GRpcStatus(status), Some(c))
            if matches!(
                status.code(),
                Code::InvalidArgument
                    | Code::FailedPrecondition
                    | Code::Unauthenticated
                    | Code::PermissionDenied
            ) =>
        {
            Error::new(
                ErrorKind::Config,
                format!(
                    "etcd refused to sign in user {:?} ({}); check the user and password (etcd://user:password@…) and that the cluster has authentication enabled",
                    c.user(),
                    status.message()
                ),
            )
            .set_retryable(false)
            .with_context("backend", "etcd")
            .with_context("op", "connect")
        }
        _ => map_etcd(err, "connect"),
    }
}

/// How a request that failed in the client's transport (not at a member) was left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TransportFailure {
    /// It never left: a failed connect. tonic keeps a member's failed connect from
    /// an outage and answers the next request routed there with it, unsent.
    Unsent,
    /// It may have been sent, and applied: the connection broke (or a failed
    /// HTTP/2 handshake, which the client reports alike).
    MaybeSent,
}

/// Whether, and how, `err` failed in the client's transport; `None` when a member
/// answered it (or it is not a transport error at all).
pub(crate) fn transport_failure(err: &EtcdError) -> Option<TransportFailure> {
    match err {
        EtcdError::GRpcStatus(status) => status_failure(status),
        EtcdError::TransportError(transport) => Some(
            chain_failure(std::error::Error::source(transport))
                .unwrap_or(TransportFailure::MaybeSent),
        ),
        _ => None,
    }
}

/// [`transport_failure`] of a status the client made up (a member's own status
/// has no source).
pub(crate) fn status_failure(status: &tonic::Status) -> Option<TransportFailure> {
    chain_failure(std::error::Error::source(status))
}

/// A failed connect or another transport error anywhere in a source chain.
fn chain_failure(
    mut source: Option<&(dyn std::error::Error + 'static)>,
) -> Option<TransportFailure> {
    let mut failure = None;
    while let Some(err) = source {
        if err.is::<tonic::ConnectError>() {
            return Some(TransportFailure::Unsent);
        }
        if err.is::<tonic::transport::Error>() {
            failure = Some(TransportFailure::MaybeSent);
        }
        source = err.source();
    }
    failure
}
