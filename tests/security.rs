//! The attacks of issue 14, performed for real against real nodes on loopback, and each seen refused:
//! a web page driving the API (DNS rebinding, cross-site posts), idle connections piling up on it, and
//! a served GGUF header with an absurd alignment.

mod common;

use common::cluster::{Network, TestCluster};
use common::gguf_writer::{GgufWriter, Meta};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

/// Sends `head` (request line and headers, without the blank line) and `body` to `addr`; returns the
/// status and the JSON body (Null when it is not JSON).
fn raw_http(addr: &str, head: &str, body: &str) -> (u16, Value) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let request = format!("{head}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

fn one_loopback_node(extra: &[&str]) -> (TestCluster, String) {
    let mut c = TestCluster::with_network(1, Network::Loopback);
    c.start(0, extra);
    c.wait_ready(0);
    let api = format!("127.0.0.1:{}", c.nodes[0].api_port);
    (c, api)
}

#[test]
fn web_pages_cannot_drive_the_api_by_rebinding_or_cross_site_posts() {
    let (c, api) = one_loopback_node(&[]);
    let cluster = c.status(0).unwrap().cluster_id;
    let port = c.nodes[0].api_port;
    let join = json!({"code": "ABCD-EFGH@127.0.0.1:9"}).to_string();

    // DNS rebinding: the page's own name in Host, reads and actions alike.
    for (head, body) in [
        ("GET /api/cluster HTTP/1.1\r\nHost: evil.example".to_string(), ""),
        (
            format!("POST /api/cluster/join HTTP/1.1\r\nHost: evil.example:{port}\r\nContent-Type: application/json"),
            join.as_str(),
        ),
    ] {
        let (status, answer) = raw_http(&api, &head, body);
        assert_eq!(status, 403, "{head}: {answer}");
        assert!(answer["error"]["message"].as_str().unwrap().contains("Host"), "{answer}");
    }
    // Cross-site form posts (text/plain, no body) and JSON from another origin.
    for head in [
        format!("POST /api/cluster/leave HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: text/plain"),
        format!("POST /api/cluster/code HTTP/1.1\r\nHost: localhost:{port}\r\nOrigin: http://evil.example"),
        format!(
            "POST /api/links/measure HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/x-www-form-urlencoded"
        ),
        format!(
            "POST /api/cluster/leave HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: http://evil.example\r\nContent-Type: application/json"
        ),
    ] {
        let (status, answer) = raw_http(&api, &head, "{}");
        assert_eq!(status, 403, "{head}: {answer}");
        assert_eq!(answer["error"]["code"], "forbidden", "{answer}");
    }
    assert_eq!(c.status(0).unwrap().cluster_id, cluster, "the node changed cluster");
    assert_eq!(c.status(0).unwrap().join_code_expires_at_ms, None, "a code was made");

    // The dashboard (same origin, its header) and clients without an Origin (curl, SDKs) still act.
    let dashboard = format!(
        "POST /api/cluster/code HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: http://127.0.0.1:{port}\r\nX-Shoal-Client: dashboard"
    );
    assert_eq!(raw_http(&api, &dashboard, "").0, 200);
    let curl = format!("POST /api/cluster/code HTTP/1.1\r\nHost: localhost:{port}\r\nContent-Type: application/json");
    assert_eq!(raw_http(&api, &curl, "{}").0, 200);
}

#[test]
fn idle_connections_are_closed_and_do_not_lock_out_the_api() {
    let (c, api) = one_loopback_node(&[]);
    // More idle connections than the API keeps open: the extra ones are closed at once, the others
    // when their headers do not come; then the API answers again.
    let idle: Vec<TcpStream> = (0..300).filter_map(|_| TcpStream::connect(&api).ok()).collect();
    for mut stream in idle {
        stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut byte = [0u8; 1];
        let read = stream.read(&mut byte);
        assert!(matches!(read, Ok(0) | Err(_)), "an idle connection got an answer: {read:?}");
        if let Err(e) = read {
            assert_ne!(e.kind(), std::io::ErrorKind::WouldBlock, "an idle connection stayed open for a minute");
        }
    }
    assert!(c.status(0).is_some(), "the API does not answer after the idle connections\n{}", c.logs());
}

#[test]
fn a_served_header_with_a_huge_alignment_is_refused_and_leaves_nothing() {
    let gguf = GgufWriter::default()
        .meta("general.architecture", Meta::Str("llama".into()))
        .meta("general.alignment", Meta::U32(1 << 30))
        .f32_tensor("token_embd.weight", &[8, 4])
        .bytes();
    let hub = common::hub::start_hub_with(vec![("evil.gguf".into(), gguf)], common::hub::Faults::default());
    let dir = tempfile::tempdir().unwrap();
    let out = common::shoal()
        .args(["pull", &format!("{}:evil.gguf", common::hub::REPO), "--layers", "0-0", "--data-dir"])
        .arg(dir.path())
        .env("HF_ENDPOINT", &hub.endpoint)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("general.alignment") && !stderr.contains("panicked"), "{stderr}");
    let left: Vec<_> = walk(&dir.path().join("models"));
    assert!(left.is_empty(), "files were left behind: {left:?}");
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries.flatten().flat_map(|e| if e.path().is_dir() { walk(&e.path()) } else { vec![e.path()] }).collect()
}
