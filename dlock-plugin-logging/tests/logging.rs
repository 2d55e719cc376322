//! What the logging handler emits, captured from a real tracing subscriber.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_plugin_logging::LoggingHandler;
use dlock_spi::{
    async_trait, AcquireContext, AcquireRequest, AcquireResult, Capabilities, Error, HandlerChain,
    InMemoryBackend, LockAdmin, LockMode, LockName, LockRemoteResource, LockState, OwnerId,
    ReleaseContext, ReleaseRequest, ReleaseResult, RenewRequest, RenewResult, Result,
};

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Capture {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

fn subscriber(capture: &Capture) -> impl tracing::Subscriber + Send + Sync {
    let c = capture.clone();
    tracing_subscriber::fmt()
        .with_writer(move || c.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
        .finish()
}

/// A backend that fails with an error carrying a (redacted) URL and a cause, as
/// dlock's backends do.
struct Failing;

#[async_trait]
impl LockRemoteResource for Failing {
    fn backend_name(&self) -> &'static str {
        "failing"
    }
    fn capabilities(&self) -> Capabilities {
        InMemoryBackend::new().capabilities()
    }
    async fn try_acquire(&self, _: &AcquireRequest) -> Result<AcquireResult> {
        Err(Error::backend(format!(
            "cannot connect to {}",
            dlock_spi::redact_url("redis://admin:hunter2@127.0.0.1:6379")
        ))
        .with_source(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "peer-said-no",
        )))
    }
    async fn release(&self, _: &ReleaseRequest) -> Result<ReleaseResult> {
        Ok(ReleaseResult::NotOwner)
    }
    async fn renew(&self, _: &RenewRequest) -> Result<RenewResult> {
        Ok(RenewResult::NotOwner)
    }
    async fn inspect(&self, _: &LockName) -> Result<Option<LockState>> {
        Ok(None)
    }
    fn admin(&self) -> Option<&dyn LockAdmin> {
        None
    }

    fn events(&self) -> Option<&dyn dlock_spi::LockEvents> {
        None
    }

    fn batch_renew(&self) -> Option<&dyn dlock_spi::BatchRenew> {
        None
    }
}

fn request(name: &str) -> AcquireRequest {
    AcquireRequest::new(
        LockName::new(name).unwrap(),
        OwnerId::new("owner-1"),
        dlock_spi::GrantId::new(1),
    )
    .with_lease(Duration::from_secs(5))
}

/// A chain over the in-memory backend with `handler`.
fn memory_chain(handler: LoggingHandler) -> HandlerChain {
    HandlerChain::new(Arc::new(InMemoryBackend::new()), vec![Arc::new(handler)])
}

#[tokio::test(flavor = "current_thread")]
async fn spans_and_access_lines_for_acquire_and_release() {
    let capture = Capture::default();
    let _guard = tracing::subscriber::set_default(subscriber(&capture));
    let chain = memory_chain(LoggingHandler::default());
    let mut ctx = AcquireContext::new(request("orders:1"), "memory");
    let token = chain.acquire(&mut ctx).await.unwrap().token().unwrap();
    let rel = ReleaseContext::new(
        ReleaseRequest::new(
            ctx.request.name.clone(),
            ctx.request.owner.clone(),
            ctx.request.grant,
            LockMode::Exclusive,
            token,
        ),
        "memory",
        Some(ctx.started),
    );
    assert_eq!(chain.release(&rel).await.unwrap(), ReleaseResult::Released);
    let text = capture.text();
    assert!(
        text.contains("acquire|orders:1|owner-1|acquired|"),
        "{text}"
    );
    assert!(
        text.contains("release|orders:1|owner-1|released|"),
        "{text}"
    );
    assert!(text.contains("dlock::access"), "{text}");
    assert!(text.contains("dlock.acquire"), "{text}");
    assert!(
        text.contains("outcome=\"acquired\"") || text.contains("outcome=acquired"),
        "{text}"
    );
    assert!(text.contains(&format!("token={token}")), "{text}");
}

/// A failed call is logged without secrets, with the error as a `&dyn Error` field:
/// the subscriber sees its cause chain, and each cause is printed once.
#[tokio::test(flavor = "current_thread")]
async fn errors_are_logged_with_their_causes_once_and_without_secrets() {
    let capture = Capture::default();
    let _guard = tracing::subscriber::set_default(subscriber(&capture));
    let chain = HandlerChain::new(Arc::new(Failing), vec![Arc::new(LoggingHandler::default())]);
    let mut ctx = AcquireContext::new(request("a"), "failing");
    assert!(chain.acquire(&mut ctx).await.is_err());
    let text = capture.text();
    assert!(
        text.contains("ERROR") && text.contains("acquire failed"),
        "{text}"
    );
    assert!(text.contains("acquire|a|owner-1|backend|"), "{text}");
    assert!(text.contains("admin:***@"), "{text}");
    let line = text
        .lines()
        .find(|l| l.contains("acquire failed"))
        .unwrap_or_else(|| panic!("no error event:\n{text}"));
    assert!(
        line.contains("error.sources=["),
        "not recorded as an error: {line}"
    );
    assert_eq!(line.matches("peer-said-no").count(), 1, "{line}");
    assert!(
        !text.contains("hunter2"),
        "a password reached the log:\n{text}"
    );
    // Debug and Display of the handler carry no secret either.
    let handler = LoggingHandler::default();
    assert!(!format!("{handler:?}").contains("hunter2"));
}

#[tokio::test(flavor = "current_thread")]
async fn the_access_log_can_be_turned_off() {
    let capture = Capture::default();
    let _guard = tracing::subscriber::set_default(subscriber(&capture));
    let chain = memory_chain(LoggingHandler::default().with_access_log(false));
    let mut ctx = AcquireContext::new(request("quiet"), "memory");
    chain.acquire(&mut ctx).await.unwrap();
    let text = capture.text();
    assert!(!text.contains("acquire|quiet"), "{text}");
    assert!(text.contains("dlock.acquire"), "{text}");
}

/// The access log's events carry structured fields (not only the pipe-joined line),
/// a try-once that found the lock held says `busy` and a wait that gave up `timeout`.
#[tokio::test(flavor = "current_thread")]
async fn access_events_have_fields_and_tell_busy_from_timeout() {
    let capture = Capture::default();
    let _guard = tracing::subscriber::set_default(subscriber(&capture));
    let chain = memory_chain(LoggingHandler::default());
    let mut held = AcquireContext::new(request("orders:2"), "memory");
    chain.acquire(&mut held).await.unwrap();
    let other = |wait: Option<Duration>| {
        AcquireRequest::new(
            LockName::new("orders:2").unwrap(),
            OwnerId::new("owner-2"),
            dlock_spi::GrantId::new(1),
        )
        .with_lease(Duration::from_secs(5))
        .with_deadline(wait.map(|w| std::time::Instant::now() + w))
    };
    let mut once = AcquireContext::new(other(None), "memory");
    assert!(!chain.acquire(&mut once).await.unwrap().is_acquired());
    let mut waiting = AcquireContext::new(other(Some(Duration::from_millis(30))), "memory");
    assert!(!chain.acquire(&mut waiting).await.unwrap().is_acquired());
    let text = capture.text();
    let access: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("dlock::access"))
        .collect();
    assert_eq!(access.len(), 3, "{text}");
    for (line, outcome) in access.iter().zip(["acquired", "busy", "timeout"]) {
        for field in [
            "op=\"acquire\"".to_owned(),
            "lock=orders:2".to_owned(),
            "backend=\"memory\"".to_owned(),
            "mode=\"exclusive\"".to_owned(),
            format!("outcome=\"{outcome}\""),
            "elapsed_ms=".to_owned(),
        ] {
            assert!(line.contains(&field), "{field} missing in {line}");
        }
    }
}
