//! The API's HTTP server loop: HTTP/1.1 over TCP with the limits `axum::serve` lacks, so that idle or
//! slow clients cannot pile up until the node runs out of file descriptors: a cap on open connections
//! (a connection beyond it takes the place of the one idle longest, or is closed at once when every
//! one has a request in flight; unprivileged requests hold at most a share: see [`super::admission`]),
//! a deadline for a request's headers (which also closes
//! keep-alive connections that stay idle), and an idle timeout on every connection (nothing read or
//! written either way while no request is being handled: a long answer that is not streamed keeps its
//! connection; event streams send a keep-alive comment every 15 s, so they stay open too).

use super::admission::{Admission, Guarded};
use super::error::{ApiError, Dialect};
use axum::http::HeaderMap;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};

/// Most API connections open at once.
pub const MAX_CONNECTIONS: usize = 256;
/// How long a client has to send a request's headers, counted from when the connection waits for
/// them (so an idle keep-alive connection closes after this long too).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection on which nothing moves in either direction for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest request head (request line and headers).
const MAX_HEAD: usize = 64 * 1024;

/// Whether a request (its headers, the address it came from) may use the slots kept from unprivileged
/// clients: it carries the API token, or comes from this machine to a node listening beyond it.
pub type Privileged = Arc<dyn Fn(&HeaderMap, SocketAddr) -> bool + Send + Sync>;

/// Serves `app` on `listener` until the listener fails.
pub async fn run(listener: TcpListener, app: Router, privileged: Privileged) {
    let admission = Arc::new(Admission::default());
    loop {
        let (stream, from) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors, typically: back off instead of spinning.
                tracing::warn!("the API cannot accept a connection: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(slot) = admission.admit(MAX_CONNECTIONS) else {
            tracing::debug!("closed an API connection from {from}: {MAX_CONNECTIONS} are open, each with a request");
            continue;
        };
        let _ = stream.set_nodelay(true);
        // Requests being handled on this connection (the idle timeout waits while there are any).
        let busy = Arc::new(AtomicUsize::new(0));
        let router = TowerToHyperService::new(app.clone());
        let handling = busy.clone();
        let (on_connection, this_slot, may_skip_share) = (admission.clone(), slot.clone(), privileged.clone());
        let service = hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
            // Handlers that budget by address read it as axum's `ConnectInfo`.
            request.extensions_mut().insert(axum::extract::ConnectInfo(from));
            let in_flight = on_connection.start(&this_slot, may_skip_share(request.headers(), from));
            let path = request.uri().path().to_string();
            let guard = Busy::new(&handling);
            let call = in_flight.is_some().then(|| hyper::service::Service::call(&router, request));
            async move {
                let _guard = guard;
                match (call, in_flight) {
                    (Some(call), Some(in_flight)) => {
                        let answer = call.await?;
                        Ok::<_, std::convert::Infallible>(
                            answer.map(|body| axum::body::Body::new(Guarded::new(body, in_flight))),
                        )
                    }
                    _ => {
                        tracing::debug!("refused a request from {from}: unprivileged requests hold their share");
                        Ok(too_busy(&path))
                    }
                }
            }
        });
        let admission = admission.clone();
        tokio::spawn(async move {
            let io = TokioIo::new(IdleTimeout::new(stream, IDLE_TIMEOUT, busy));
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .max_buf_size(MAX_HEAD)
                .serve_connection(io, service)
                .with_upgrades();
            tokio::select! {
                ended = connection => if let Err(e) = ended {
                    tracing::debug!("an API connection from {from} ended: {e}");
                },
                () = slot.evicted() => tracing::debug!("closed an idle API connection from {from} for a newer one"),
            }
            admission.close(&slot);
        });
    }
}

/// The answer to a request refused for the unprivileged share: 503, try again shortly, on a connection
/// that then closes.
/// In the error shape of the API `path` belongs to.
fn too_busy(path: &str) -> axum::response::Response {
    use axum::http::{header, HeaderValue, StatusCode};
    let message = "this node's API connections are taken by requests without its token; try again in a \
                   few seconds (requests with the API token are still served)";
    let error = ApiError { status: StatusCode::SERVICE_UNAVAILABLE, ..ApiError::bad_request(message) };
    let mut answer = error.into_response_as(Dialect::of_path(path));
    let headers = answer.headers_mut();
    headers.insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
    headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    super::body::forbid_framing(headers);
    answer
}

/// Counts a request as being handled while alive.
struct Busy(Arc<AtomicUsize>);

impl Busy {
    fn new(count: &Arc<AtomicUsize>) -> Busy {
        count.fetch_add(1, Ordering::Relaxed);
        Busy(count.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A stream that fails with `TimedOut` once nothing was read or written for `limit` while no request
/// was being handled (`busy`).
struct IdleTimeout {
    inner: TcpStream,
    limit: Duration,
    deadline: Pin<Box<Sleep>>,
    busy: Arc<AtomicUsize>,
}

impl IdleTimeout {
    fn new(inner: TcpStream, limit: Duration, busy: Arc<AtomicUsize>) -> IdleTimeout {
        IdleTimeout { inner, limit, deadline: Box::pin(tokio::time::sleep(limit)), busy }
    }

    fn progressed(&mut self) {
        let next = Instant::now() + self.limit;
        self.deadline.as_mut().reset(next);
    }

    /// After the inner stream said Pending: whether the connection has been idle too long.
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        if self.busy.load(Ordering::Relaxed) > 0 {
            // A request is being handled: its answer may take long before its first byte.
            self.progressed();
            return false;
        }
        self.deadline.as_mut().poll(cx).is_ready()
    }
}

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "the connection was idle for too long")
}

impl AsyncRead for IdleTimeout {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(result) => {
                this.progressed();
                Poll::Ready(result)
            }
            Poll::Pending if this.expired(cx) => Poll::Ready(Err(timed_out())),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncWrite for IdleTimeout {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_write(cx, buf) {
            Poll::Ready(result) => {
                this.progressed();
                Poll::Ready(result)
            }
            Poll::Pending if this.expired(cx) => Poll::Ready(Err(timed_out())),
            Poll::Pending => Poll::Pending,
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_write_vectored(cx, bufs) {
            Poll::Ready(result) => {
                this.progressed();
                Poll::Ready(result)
            }
            Poll::Pending if this.expired(cx) => Poll::Ready(Err(timed_out())),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Raises this process's open-file limit to its hard limit (macOS starts programs with 256), so the
/// API's and the cluster's connections and the model files fit. Returns the new soft limit.
pub fn raise_open_file_limit() -> Option<u64> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    // macOS refuses more than OPEN_MAX (10240) for an unlimited hard limit.
    let cap = if cfg!(target_os = "macos") { 10240 } else { 1 << 20 };
    let target = limit.maximum.unwrap_or(cap).min(cap);
    if limit.current.is_some_and(|current| current >= target) {
        return limit.current;
    }
    match setrlimit(Resource::Nofile, Rlimit { current: Some(target), maximum: limit.maximum }) {
        Ok(()) => Some(target),
        Err(e) => {
            tracing::warn!("cannot raise the open-file limit to {target}: {e}");
            limit.current
        }
    }
}
