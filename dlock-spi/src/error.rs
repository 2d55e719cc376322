//! One error type for every layer: backends, handlers and the user-facing API.
//!
//! Contention is never an error (see [`crate::AcquireResult::NotAcquired`]); an
//! [`Error`] means the call could not be answered or was malformed.

use std::borrow::Cow;
use std::fmt;

/// What went wrong, coarsely enough that callers can branch on it.
///
/// New kinds may be added in minor releases, so match with a wildcard arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The lock name is empty, too long, or contains characters the library refuses.
    InvalidName,
    /// An argument (lease, wait, mode, URL part, …) is out of range or malformed.
    InvalidArgument,
    /// The configuration (URL, builder options, schema) is wrong or inconsistent.
    Config,
    /// The backend cannot do what was asked (e.g. shared mode on a backend without it).
    Unsupported,
    /// The caller does not own the lock it tried to release or renew.
    NotOwner,
    /// The lock was held but has been lost (lease expired, session gone, stolen).
    LockLost,
    /// A handler (flow control, …) refused the call before it reached the backend.
    Rejected,
    /// The backend failed: connection refused, I/O error, server error, bad reply.
    Backend,
    /// The backend did not answer in time.
    Timeout,
    /// The manager or backend has been closed.
    Closed,
    /// An invariant inside dlock was broken; please report it.
    Unexpected,
}

impl ErrorKind {
    /// A short, stable, lower-case label (used by logs and metrics).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidName => "invalid_name",
            ErrorKind::InvalidArgument => "invalid_argument",
            ErrorKind::Config => "config",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::NotOwner => "not_owner",
            ErrorKind::LockLost => "lock_lost",
            ErrorKind::Rejected => "rejected",
            ErrorKind::Backend => "backend",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Closed => "closed",
            ErrorKind::Unexpected => "unexpected",
        }
    }

    /// Whether an error of this kind is worth retrying by default.
    fn default_retryable(self) -> bool {
        matches!(self, ErrorKind::Backend | ErrorKind::Timeout)
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

type Source = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The error of every dlock operation.
///
/// Carries a [`ErrorKind`], a message that says what was wrong and what to do,
/// optional key/value context (lock name, backend, operation), an optional source,
/// and whether retrying may help.
///
/// `Display` (`{}`) prints the kind, message and context, not the source, which
/// [`source()`](std::error::Error::source) returns — so reporters that walk the
/// chain (`tracing`'s `&dyn Error` fields, `anyhow`, `eyre`) print each cause once.
/// The alternate form (`{:#}`) appends the whole chain, for a one-line report:
///
/// ```
/// let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
/// let err = dlock_spi::Error::backend("cannot reach the server").with_source(io);
/// assert_eq!(err.to_string(), "backend: cannot reach the server");
/// assert_eq!(format!("{err:#}"), "backend: cannot reach the server: refused");
/// ```
pub struct Error {
    kind: ErrorKind,
    message: Cow<'static, str>,
    context: Vec<(&'static str, String)>,
    retryable: bool,
    source: Option<Source>,
}

impl Error {
    /// The error of a backend without semaphores asked for permits (called directly,
    /// past the chain's head, which refuses them first).
    pub fn no_semaphores(backend: &str) -> Self {
        Error::unsupported(format!(
            "the {backend} backend has no semaphores; use a backend that has them (memory, SQL, Redis, ZooKeeper) or a lock"
        ))
    }

    /// The error of a permit request naming another total than the semaphore's
    /// holders (`held`) while it is in use (`InvalidArgument`).
    pub fn semaphore_total_differs(held: impl std::fmt::Display, asked: u32) -> Self {
        Error::invalid_argument(format!(
            "semaphore has {held} permits while it is in use; this handle asks with {asked}: use the same total everywhere (it can change once the semaphore is idle)"
        ))
    }

    /// Creates an error of `kind` with a message. Retryability defaults by kind
    /// (`Backend` and `Timeout` are retryable; the rest are not).
    pub fn new(kind: ErrorKind, message: impl Into<Cow<'static, str>>) -> Self {
        Error {
            kind,
            message: message.into(),
            context: Vec::new(),
            retryable: kind.default_retryable(),
            source: None,
        }
    }

    /// Attaches a key/value pair that helps locate the failure (e.g. `("lock", name)`).
    pub fn with_context(mut self, key: &'static str, value: impl fmt::Display) -> Self {
        self.context.push((key, value.to_string()));
        self
    }

    /// Stamps where the error happened — the backend, the operation and the lock —
    /// as its first three context entries, keeping any of the three it names already
    /// (a backend's finer step, say `op=list`) and every other entry after them, in
    /// their order. The chain's tail stamps every error a backend returns this way,
    /// so a backend only classifies its errors; errors of calls past the chain (a
    /// backend's `connect`, its admin calls) are stamped by the backend.
    ///
    /// ```
    /// use dlock_spi::{Error, ErrorKind};
    /// let err = Error::new(ErrorKind::Backend, "the connection broke")
    ///     .with_context("node", "10.0.0.7")
    ///     .with_context("op", "list")
    ///     .locate("zookeeper", "acquire", "orders:1");
    /// assert_eq!(
    ///     err.to_string(),
    ///     "backend: the connection broke (backend=zookeeper, op=list, lock=orders:1, node=10.0.0.7)"
    /// );
    /// ```
    pub fn locate(mut self, backend: &str, op: &str, lock: impl fmt::Display) -> Self {
        let mut take = |key: &'static str| {
            let at = self.context.iter().position(|(k, _)| *k == key)?;
            Some(self.context.remove(at))
        };
        let (b, o, l) = (take("backend"), take("op"), take("lock"));
        let mut context = Vec::with_capacity(3 + self.context.len());
        context.push(b.unwrap_or_else(|| ("backend", backend.to_owned())));
        context.push(o.unwrap_or_else(|| ("op", op.to_owned())));
        context.push(l.unwrap_or_else(|| ("lock", lock.to_string())));
        context.append(&mut self.context);
        self.context = context;
        self
    }

    /// Attaches the underlying cause.
    pub fn with_source(mut self, source: impl Into<Source>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// A copy, for telling one failure to several callers: kind, message, context
    /// and retryability as they are; the source (not clonable) as its text.
    pub fn duplicate(&self) -> Error {
        Error {
            kind: self.kind,
            message: self.message.clone(),
            context: self.context.clone(),
            retryable: self.retryable,
            source: self.source.as_ref().map(|s| Source::from(format!("{s:#}"))),
        }
    }

    /// Overrides whether the error is retryable.
    pub fn set_retryable(mut self, retryable: bool) -> Self {
        self.retryable = retryable;
        self
    }

    /// The error's kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The human-readable message, without context or source.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The key/value context attached so far.
    pub fn context(&self) -> &[(&'static str, String)] {
        &self.context
    }

    /// Whether retrying the same call may succeed (connection blips, timeouts).
    pub fn is_retryable(&self) -> bool {
        self.retryable
    }

    /// Shorthand for an [`ErrorKind::InvalidArgument`] error.
    pub fn invalid_argument(message: impl Into<Cow<'static, str>>) -> Self {
        Error::new(ErrorKind::InvalidArgument, message)
    }

    /// Shorthand for an [`ErrorKind::Unsupported`] error.
    pub fn unsupported(message: impl Into<Cow<'static, str>>) -> Self {
        Error::new(ErrorKind::Unsupported, message)
    }

    /// Shorthand for an [`ErrorKind::Backend`] error (retryable).
    pub fn backend(message: impl Into<Cow<'static, str>>) -> Self {
        Error::new(ErrorKind::Backend, message)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.message)?;
        if !self.context.is_empty() {
            f.write_str(" (")?;
            for (i, (k, v)) in self.context.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "{k}={v}")?;
            }
            f.write_str(")")?;
        }
        if f.alternate() {
            // `{:#}`: the causes too, as `source()` walks them.
            let mut cause = std::error::Error::source(self);
            while let Some(c) = cause {
                write!(f, ": {c}")?;
                cause = c.source();
            }
        }
        Ok(())
    }
}

/// `{:?}` reads as the error with its causes (as `{:#}`) and whether a retry may
/// help — what `fn main() -> Result<()>` prints on a failure; `{:#?}` shows the
/// fields.
impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !f.alternate() {
            write!(f, "{self:#}")?;
            if self.retryable {
                f.write_str(" (retryable)")?;
            }
            return Ok(());
        }
        let mut d = f.debug_struct("Error");
        d.field("kind", &self.kind)
            .field("message", &self.message)
            .field("retryable", &self.retryable);
        if !self.context.is_empty() {
            d.field("context", &self.context);
        }
        if let Some(source) = &self.source {
            d.field("source", source);
        }
        d.finish()
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_ref()
            .map(|s| s.as_ref() as &(dyn std::error::Error + 'static))
    }
}

/// `Result` with dlock's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_shows_the_source_once_through_source_or_the_alternate_form() {
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl fmt::Display for Outer {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("handshake failed")
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let err = Error::backend("cannot reach the server; is it running?")
            .with_context("backend", "redis")
            .with_context("lock", "orders:1")
            .with_source(Outer(io));
        assert_eq!(
            err.to_string(),
            "backend: cannot reach the server; is it running? (backend=redis, lock=orders:1)"
        );
        assert_eq!(
            format!("{err:#}"),
            "backend: cannot reach the server; is it running? (backend=redis, lock=orders:1): handshake failed: refused"
        );
        // A reporter that prints the Display and then walks source() prints each once.
        let mut report = err.to_string();
        let mut cause = std::error::Error::source(&err);
        while let Some(c) = cause {
            report.push_str(&format!(": {c}"));
            cause = c.source();
        }
        assert_eq!(report, format!("{err:#}"));
        assert!(err.is_retryable());
    }

    /// `fn main() -> dlock_api::Result<()>` prints a failure with `Debug`: it reads as
    /// the error and its causes (as `{:#}`), whether it is worth retrying, and
    /// `{:#?}` keeps the fields. (It printed `Error { kind: Config, message: …`.)
    #[test]
    fn debug_reads_as_the_error_and_its_causes() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let err = Error::backend("cannot reach the server; is it running?")
            .with_context("backend", "redis")
            .with_source(io);
        assert_eq!(
            format!("{err:?}"),
            "backend: cannot reach the server; is it running? (backend=redis): refused (retryable)"
        );
        let fixed = Error::new(ErrorKind::Config, "bad URL");
        assert_eq!(format!("{fixed:?}"), "config: bad URL");
        let fields = format!("{err:#?}");
        assert!(
            fields.starts_with("Error {") && fields.contains("kind: Backend"),
            "{fields}"
        );
    }

    #[test]
    fn retryable_defaults_by_kind_and_can_be_overridden() {
        assert!(!Error::new(ErrorKind::NotOwner, "x").is_retryable());
        assert!(Error::new(ErrorKind::Timeout, "x").is_retryable());
        assert!(!Error::backend("x").set_retryable(false).is_retryable());
    }
}
