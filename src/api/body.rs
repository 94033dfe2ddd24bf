//! What every request and answer goes through besides the guard and the token: a request's body arrives
//! whole within [`BODY_READ_TIMEOUT`] and [`MAX_BODY`] bytes before any handler sees it, or the request
//! is answered without being handled — 408 for a body that does not come (a client that sends its
//! headers and then nothing, or a byte every few seconds, holds its connection that long at most), 413
//! for one over the limit. And no answer may be shown inside another site's frame (`X-Frame-Options`,
//! and CSP's `frame-ancestors`), so a page cannot dress the dashboard up to be clicked on.

use super::error::{ApiError, Dialect};
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use std::time::Duration;

/// Largest request body: a long agent conversation with its tools fits many times over (a million
/// tokens of text is about 4 MB).
pub const MAX_BODY: usize = 16 << 20;
/// How long a request's whole body may take to arrive once its headers have.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The extractors' own limit, set to [`MAX_BODY`] (the body is already whole when they run).
pub fn extractor_limit() -> DefaultBodyLimit {
    DefaultBodyLimit::max(MAX_BODY)
}

/// Reads the request's body whole, in time and within the limit, then hands the request on.
pub async fn read_in_time(request: Request, next: Next) -> Response {
    let dialect = Dialect::of_path(request.uri().path());
    let declared = request.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return too_large(dialect);
    }
    let (parts, body) = request.into_parts();
    let read = tokio::time::timeout(BODY_READ_TIMEOUT, Limited::new(body, MAX_BODY).collect()).await;
    match read {
        Err(_) => {
            let message = format!(
                "the request's body did not arrive within {} s of its headers; send it whole, at once",
                BODY_READ_TIMEOUT.as_secs()
            );
            let mut response = ApiError { status: StatusCode::REQUEST_TIMEOUT, ..ApiError::bad_request(message) }
                .into_response_as(dialect);
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            response
        }
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => too_large(dialect),
        Ok(Err(e)) => {
            ApiError::bad_request(format!("the request's body could not be read: {e}")).into_response_as(dialect)
        }
        Ok(Ok(collected)) => next.run(Request::from_parts(parts, Body::from(collected.to_bytes()))).await,
    }
}

fn too_large(dialect: Dialect) -> Response {
    let message = format!("the request's body is over the limit of {} MiB", MAX_BODY >> 20);
    ApiError { status: StatusCode::PAYLOAD_TOO_LARGE, ..ApiError::bad_request(message) }.into_response_as(dialect)
}

/// Forbids every answer to be framed by another page.
pub async fn refuse_framing(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    forbid_framing(response.headers_mut());
    response
}

/// The headers that forbid an answer to be framed by another page (for answers made outside the
/// router too).
pub fn forbid_framing(headers: &mut axum::http::HeaderMap) {
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static("frame-ancestors 'none'"));
}
