//! The dashboard: the built front end (`ui/dist`, embedded at compile time by build.rs) served at `/`.
//! Paths that are not files get `index.html`, so the dashboard's own routes survive a reload.

use axum::http::{header, StatusCode, Uri};
use axum::response::{Html, IntoResponse, Response};

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/ui_assets.rs"));
}

/// The page served when the binary was built without the dashboard.
const NOT_BUILT: &str = "<!doctype html><meta charset=utf-8><title>shoal</title>\
<body style=\"font-family:system-ui;max-width:40em;margin:4em auto\"><h1>shoal</h1>\
<p>This node runs, but its dashboard was not built into it. Build it with \
<code>npm --prefix ui ci &amp;&amp; npm --prefix ui run build</code>, then rebuild shoal \
(<code>cargo build --release</code>).</p><p>The API is here: <a href=\"/api/cluster\">/api/cluster</a>.</p>";

pub fn asset(path: &str) -> Option<&'static [u8]> {
    embedded::ASSETS.iter().find(|(name, _)| *name == path).map(|(_, bytes)| *bytes)
}

/// Whether the dashboard is built into this binary.
pub fn is_built() -> bool {
    asset("index.html").is_some()
}

pub async fn serve(uri: Uri) -> Response {
    let path = uri.path().trim_start_matches('/');
    if path.starts_with("api/") || path.starts_with("v1/") {
        return (StatusCode::NOT_FOUND, "no such endpoint").into_response();
    }
    if let Some(bytes) = asset(path).filter(|_| !path.is_empty()) {
        let cache = if path.starts_with("assets/") { "public, max-age=31536000, immutable" } else { "no-cache" };
        return ([(header::CONTENT_TYPE, content_type(path)), (header::CACHE_CONTROL, cache)], bytes).into_response();
    }
    match asset("index.html") {
        Some(index) => {
            ([(header::CONTENT_TYPE, "text/html; charset=utf-8"), (header::CACHE_CONTROL, "no-cache")], index)
                .into_response()
        }
        None => Html(NOT_BUILT).into_response(),
    }
}

fn content_type(path: &str) -> &'static str {
    match path.rsplit('.').next().unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "json" | "map" => "application/json",
        "woff2" => "font/woff2",
        "txt" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}
