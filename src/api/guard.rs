//! What the API trusts about a request before any handler sees it. Every web page the user opens can
//! reach the API (it listens on this machine), so:
//! - `Host` must name this node as the user does: a loopback address, `localhost`, or the address the
//!   API listens on (a page that rebinds its own domain name to 127.0.0.1 still sends that name, and is
//!   refused: DNS rebinding);
//! - a request that changes something (any method but GET, HEAD and OPTIONS) must come from the same
//!   origin (or carry no `Origin` at all: curl, the OpenAI SDKs, the CLI) and must be JSON or carry a
//!   header a page cannot send cross-site without the API's consent (`X-Shoal-Client` or
//!   `Authorization`): HTML forms can only post `text/plain`, `multipart/form-data` or URL-encoded bodies.
//!
//! The dashboard is served from the API itself, in a browser and in the desktop app's window alike (the
//! Tauri window loads `http://127.0.0.1:PORT/`, see `src-tauri/src/window.rs`), so its origin is the
//! API's own and no other origin needs to be allowed.

use axum::http::{header, HeaderMap, Method};
use std::net::{IpAddr, SocketAddr};

/// The header the dashboard sends with every action (any value); a cross-site page cannot send it.
pub const CLIENT_HEADER: &str = "x-shoal-client";

/// Why a request was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "this node answers only requests addressed to it as localhost, a loopback address or its listen address (Host: {0}); a web page that renamed itself to reach this API is refused"
    )]
    Host(String),
    #[error("the request came from another web site (Origin: {0}); only the node's own dashboard may change it")]
    Origin(String),
    #[error(
        "a request that changes this node must send a JSON body (Content-Type: application/json) or the header X-Shoal-Client"
    )]
    NotJson,
}

/// Checks `Host`, and for state-changing methods `Origin` and the content type.
pub fn check(method: &Method, headers: &HeaderMap, listen: SocketAddr) -> Result<(), Refusal> {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
    if !host_allowed(host, listen) {
        return Err(Refusal::Host(host.chars().take(100).collect()));
    }
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return Ok(());
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        if !same_origin(origin, host) {
            return Err(Refusal::Origin(origin.chars().take(100).collect()));
        }
    }
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| is_json(v.split(';').next().unwrap_or("").trim()));
    if json || headers.contains_key(CLIENT_HEADER) || headers.contains_key(header::AUTHORIZATION) {
        Ok(())
    } else {
        Err(Refusal::NotJson)
    }
}

fn is_json(media_type: &str) -> bool {
    let media_type = media_type.to_ascii_lowercase();
    media_type == "application/json" || (media_type.starts_with("application/") && media_type.ends_with("+json"))
}

/// Whether `host` (a Host header: a name or address, with or without a port) names this node.
pub fn host_allowed(host: &str, listen: SocketAddr) -> bool {
    let Some(name) = host_name(host) else { return false };
    if name.eq_ignore_ascii_case("localhost") {
        return true;
    }
    let Ok(ip) = name.parse::<IpAddr>() else { return false };
    if ip.is_loopback() || ip == listen.ip() {
        return true;
    }
    // Listening on every interface (which needs a token for actions): any of this machine's addresses
    // may be used. An address is not a rebinding attack: only a domain name can be rebound.
    listen.ip().is_unspecified() && !listen.ip().is_loopback()
}

/// The name or address part of a Host header (IPv6 without its brackets); None when malformed.
fn host_name(host: &str) -> Option<&str> {
    let host = host.trim();
    if host.is_empty() || host.len() > 255 {
        return None;
    }
    let name = if let Some(rest) = host.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        if !(after.is_empty() || after.strip_prefix(':').is_some_and(valid_port)) {
            return None;
        }
        inside
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if valid_port(port) => name,
            Some(_) => return None,
            None => host,
        }
    };
    let ok = !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-.:".contains(&b));
    ok.then_some(name)
}

fn valid_port(port: &str) -> bool {
    !port.is_empty() && port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit())
}

/// Whether `origin` is the API's own (`http://` + the Host the request was sent to).
fn same_origin(origin: &str, host: &str) -> bool {
    origin.strip_prefix("http://").is_some_and(|authority| authority.eq_ignore_ascii_case(host.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    const LOOPBACK: &str = "127.0.0.1:52520";

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn only_this_nodes_names_are_accepted_as_host() {
        let listen: SocketAddr = LOOPBACK.parse().unwrap();
        for ok in ["127.0.0.1:52520", "127.0.0.1", "localhost", "LOCALHOST:52520", "[::1]:52520", "[::1]", "127.1.2.3"]
        {
            assert!(host_allowed(ok, listen), "{ok}");
        }
        for bad in ["evil.example", "evil.example:52520", "", "localhost.evil.example", "10.0.0.1:52520", "[::1", "a:b"]
        {
            assert!(!host_allowed(bad, listen), "{bad}");
        }
        let lan: SocketAddr = "10.0.0.5:52520".parse().unwrap();
        assert!(host_allowed("10.0.0.5:52520", lan));
        assert!(!host_allowed("10.0.0.6:52520", lan));
        assert!(!host_allowed("mac.local:52520", lan));
        let all: SocketAddr = "0.0.0.0:52520".parse().unwrap();
        assert!(host_allowed("10.0.0.6:52520", all));
        assert!(!host_allowed("evil.example", all));
    }

    #[test]
    fn actions_need_the_same_origin_and_json_or_the_client_header() {
        let listen: SocketAddr = LOOPBACK.parse().unwrap();
        let host = ("host", LOOPBACK);
        let json = ("content-type", "application/json; charset=utf-8");
        let post = Method::POST;
        assert_eq!(check(&post, &headers(&[host, json]), listen), Ok(()));
        assert_eq!(check(&post, &headers(&[host, ("x-shoal-client", "dashboard")]), listen), Ok(()));
        assert_eq!(check(&post, &headers(&[host, json, ("origin", "http://127.0.0.1:52520")]), listen), Ok(()));
        assert_eq!(check(&post, &headers(&[host]), listen), Err(Refusal::NotJson));
        assert_eq!(check(&post, &headers(&[host, ("content-type", "text/plain")]), listen), Err(Refusal::NotJson));
        let cross = check(&post, &headers(&[host, json, ("origin", "http://evil.example")]), listen);
        assert!(matches!(cross, Err(Refusal::Origin(_))));
        let null = check(&Method::DELETE, &headers(&[host, json, ("origin", "null")]), listen);
        assert!(matches!(null, Err(Refusal::Origin(_))));
        assert_eq!(check(&Method::GET, &headers(&[host]), listen), Ok(()));
        assert!(matches!(check(&Method::GET, &headers(&[("host", "evil.example")]), listen), Err(Refusal::Host(_))));
    }
}
