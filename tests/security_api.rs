//! The API attacks of issue 46 (trust, second round), performed against a real node on loopback and
//! each seen refused, with the node still answering: request bodies that never come or come a byte at a
//! time, a body over the limit, the dashboard framed by another page, instance names that would print
//! escape sequences, event streams without the token taking every connection, a chat template that
//! runs away, the library's paths and a remembered response's conversation shown to a reader without
//! the token.

mod common;

use common::{one_loopback_node, raw_http};
use serde_json::json;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Sends a request's headers announcing a body of `length` bytes, then `drip` bytes of it one every
/// `every`; returns the status the node answered with and how long it took.
fn stalled_body(api: &str, length: usize, drip: usize, every: Duration) -> (u16, Duration) {
    let mut stream = TcpStream::connect(api).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(90))).unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {api}\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    );
    let started = Instant::now();
    stream.write_all(head.as_bytes()).unwrap();
    for _ in 0..drip {
        std::thread::sleep(every);
        // Stop once the node has answered (writing on would reset the connection before it is read).
        stream.set_read_timeout(Some(Duration::from_millis(10))).unwrap();
        let answered = stream.peek(&mut [0u8; 1]).is_ok();
        stream.set_read_timeout(Some(Duration::from_secs(90))).unwrap();
        if answered || stream.write_all(b" ").is_err() {
            break;
        }
    }
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    (text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0), started.elapsed())
}

/// Bodies that never come (40 connections) and one that comes a byte every 5 s are each answered with
/// 408 once the body deadline (30 s) has passed, not held open; meanwhile and after, the API answers.
#[test]
fn request_bodies_that_never_come_are_cut_off_and_the_api_keeps_answering() {
    let (c, api) = one_loopback_node(&[]);
    let stalled: Vec<_> = (0..40)
        .map(|_| {
            let api = api.clone();
            std::thread::spawn(move || stalled_body(&api, 100_000, 0, Duration::ZERO))
        })
        .collect();
    let dripping = {
        let api = api.clone();
        std::thread::spawn(move || stalled_body(&api, 100_000, 20, Duration::from_secs(5)))
    };
    std::thread::sleep(Duration::from_secs(2));
    assert!(c.status(0).is_some(), "the API does not answer beside stalled bodies\n{}", c.logs());
    for handle in stalled.into_iter().chain([dripping]) {
        let (status, took) = handle.join().unwrap();
        assert_eq!(status, 408, "a body that never came");
        assert!(took < Duration::from_secs(60), "a stalled body held its connection for {took:?}");
    }
    assert!(c.status(0).is_some(), "the API does not answer after the stalled bodies\n{}", c.logs());
}

/// A body over the limit is refused with 413 (before it is read), in each API's error shape.
#[test]
fn a_body_over_the_limit_is_refused_as_too_large() {
    let (_c, api) = one_loopback_node(&[]);
    for (path, shape) in [("/v1/chat/completions", "error"), ("/v1/messages", "type"), ("/api/chat", "error")] {
        let mut stream = TcpStream::connect(&api).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {api}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            64 << 20
        );
        stream.write_all(head.as_bytes()).unwrap();
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        let text = String::from_utf8_lossy(&answer);
        assert!(text.starts_with("HTTP/1.1 413"), "{path}: {text}");
        let body: serde_json::Value = serde_json::from_str(text.split_once("\r\n\r\n").unwrap().1).unwrap();
        assert!(body.get(shape).is_some(), "{path}: {body}");
        assert!(body.to_string().contains("over the limit of 16 MiB"), "{path}: {body}");
    }
}

/// Every answer forbids framing by another page: the dashboard, the API, a refusal.
#[test]
fn no_answer_may_be_framed_by_another_page() {
    let (_c, api) = one_loopback_node(&[]);
    let evil_host = "GET /api/health HTTP/1.1\r\nHost: evil.example";
    for head in
        [format!("GET / HTTP/1.1\r\nHost: {api}"), format!("GET /api/health HTTP/1.1\r\nHost: {api}"), evil_host.into()]
    {
        let mut stream = TcpStream::connect(&api).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        stream.write_all(format!("{head}\r\nConnection: close\r\n\r\n").as_bytes()).unwrap();
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        let text = String::from_utf8_lossy(&answer).to_lowercase();
        let headers = text.split_once("\r\n\r\n").unwrap().0;
        assert!(headers.contains("x-frame-options: deny"), "{head}: {headers}");
        assert!(headers.contains("content-security-policy: frame-ancestors 'none'"), "{head}: {headers}");
    }
}

/// An instance name with an escape sequence, a bell, a line break or NUL is refused with the reason,
/// and nothing is launched.
#[test]
fn instance_names_with_control_characters_are_refused() {
    let (c, api) = one_loopback_node(&[]);
    let model = common::model_path();
    for name in ["evil\u{1b}[31mred", "ring\u{7}", "two\nlines", "nul\u{0}"] {
        let body = json!({ "model": model, "name": name, "context": 256 }).to_string();
        let head = format!("POST /api/instances HTTP/1.1\r\nHost: {api}\r\nContent-Type: application/json");
        let (status, answer) = raw_http(&api, &head, &body);
        assert_eq!(status, 400, "{name:?}: {answer}");
        assert!(answer.to_string().contains("control characters"), "{name:?}: {answer}");
    }
    assert_eq!(c.get_json(0, "/api/instances"), json!([]), "nothing was launched");
}

/// Opens an event stream; the status line's code, and the stream (open while it is held).
fn event_stream(api: &str, token: Option<&str>) -> (u16, TcpStream) {
    let mut stream = TcpStream::connect(api).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    stream
        .write_all(
            format!("GET /api/events HTTP/1.1\r\nHost: {api}\r\n{auth}Origin: http://evil.example\r\n\r\n").as_bytes(),
        )
        .unwrap();
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while !line.ends_with(b"\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
        line.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&line);
    (text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0), stream)
}

/// Event streams without the token have a budget of their own (16 from one address): the next is
/// refused with 429 while a token holder's stream and requests are still served; a stream closed
/// gives its place back.
#[test]
fn event_streams_without_the_token_cannot_take_every_connection() {
    let (c, api) = one_loopback_node(&["--api-token", "s3cret"]);
    let mut held: Vec<TcpStream> = (0..16)
        .map(|i| {
            let (status, stream) = event_stream(&api, None);
            assert_eq!(status, 200, "stream {i}");
            stream
        })
        .collect();
    assert_eq!(event_stream(&api, None).0, 429, "a seventeenth stream from one address");
    let (status, _token_holders) = event_stream(&api, Some("s3cret"));
    assert_eq!(status, 200, "a stream with the token is not counted");
    assert!(c.status(0).is_some(), "the API answers beside the streams\n{}", c.logs());
    held.pop();
    // The node notices the closed stream when its next event or keep-alive fails to send (every 15 s).
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let (status, stream) = event_stream(&api, None);
        if status == 200 {
            held.push(stream);
            break;
        }
        assert!(Instant::now() < deadline, "a closed stream's place did not come back");
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// A GGUF whose chat template nests two loops of 100,000 is refused at launch with the reason, before
/// any worker starts; the node serves on.
#[test]
fn a_model_whose_template_runs_away_is_refused_at_launch() {
    let (c, api) = one_loopback_node(&[]);
    let nested = "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}";
    let model = common::random_model::qwen3moe().write_with_chat_template("runaway-template", nested);
    let body = json!({ "model": model, "context": 256 }).to_string();
    let head = format!("POST /api/instances HTTP/1.1\r\nHost: {api}\r\nContent-Type: application/json");
    let started = Instant::now();
    let (status, answer) = raw_http(&api, &head, &body);
    assert_eq!(status, 400, "{answer}");
    assert!(answer.to_string().contains("does not finish rendering"), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(15), "refusing took {:?}", started.elapsed());
    assert_eq!(c.get_json(0, "/api/instances"), json!([]), "nothing was launched");
    assert!(c.status(0).is_some(), "the node serves on\n{}", c.logs());
}

/// On a node with a token, a reader without it sees the library's files by name, not where they are on
/// the machine (its folders, its user's name) — in the list, the fit check and a damaged file's reason;
/// with the token the paths are there.
#[test]
fn a_reader_without_the_token_sees_file_names_not_paths() {
    let mut c = common::cluster::TestCluster::with_network(1, common::cluster::Network::Loopback);
    let models = c.nodes[0].data_dir.join("models");
    std::fs::create_dir_all(&models).unwrap();
    std::fs::write(models.join("broken.gguf"), b"GGUF\x03\x00\x00\x00 not a model").unwrap();
    let model = std::fs::canonicalize(common::model_path()).unwrap();
    let added = common::shoal()
        .args(["models", "add"])
        .arg(&model)
        .arg("--data-dir")
        .arg(&c.nodes[0].data_dir)
        .output()
        .unwrap();
    assert!(added.status.success(), "shoal models add: {}", String::from_utf8_lossy(&added.stderr));
    c.start(0, &["--api-token", "s3cret"]);
    c.wait_ready(0);
    let api = format!("127.0.0.1:{}", c.nodes[0].api_port);
    let folders = [models.display().to_string(), model.parent().unwrap().display().to_string()];
    for path in ["/api/models", "/api/models/fit"] {
        let head = format!("GET {path} HTTP/1.1\r\nHost: {api}");
        let (status, stranger) = raw_http(&api, &head, "");
        assert_eq!(status, 200, "{stranger}");
        assert_eq!(stranger.as_array().unwrap().len(), 2, "{stranger}");
        for folder in &folders {
            assert!(!stranger.to_string().contains(folder), "{path} shows {folder} to a reader without the token");
        }
        assert!(stranger.to_string().contains("broken.gguf"), "{stranger}");
        let (_, holder) = raw_http(&api, &format!("{head}\r\nAuthorization: Bearer s3cret"), "");
        assert!(folders.iter().all(|f| holder.to_string().contains(f)), "{path} with the token: {holder}");
    }
}

/// A remembered response holds a conversation: on a node with a token, where other reads are open,
/// reading one back (or what went into it) needs the token, as deleting it does.
#[test]
fn a_remembered_response_is_read_back_only_with_the_token() {
    let (_c, api) = one_loopback_node(&["--api-token", "s3cret"]);
    let post = |path: &str, body: serde_json::Value| {
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {api}\r\nContent-Type: application/json\r\nAuthorization: Bearer s3cret"
        );
        raw_http(&api, &head, &body.to_string())
    };
    let model = std::fs::canonicalize(common::model_path()).unwrap();
    let (status, launched) = post("/api/instances", json!({ "model": model, "context": 256, "sequences": 1 }));
    assert!(status < 300, "{status} {launched}");
    let ask = json!({ "model": "SmolLM2-135M-Instruct.Q4_1", "input": "Hi", "max_output_tokens": 2 });
    let (status, response) = post("/v1/responses", ask);
    assert_eq!(status, 200, "{response}");
    let id = response["id"].as_str().unwrap();
    for (method, path) in [
        ("GET", format!("/v1/responses/{id}")),
        ("GET", format!("/v1/responses/{id}/input_items")),
        ("DELETE", format!("/v1/responses/{id}")),
    ] {
        let head = format!("{method} {path} HTTP/1.1\r\nHost: {api}\r\nContent-Type: application/json");
        let (status, stranger) = raw_http(&api, &head, "");
        assert_eq!(status, 401, "{method} {path} without the token: {stranger}");
        assert!(!stranger.to_string().contains("Hi"), "{stranger}");
    }
    let head = format!("GET /v1/responses/{id} HTTP/1.1\r\nHost: {api}\r\nAuthorization: Bearer s3cret");
    let (status, holder) = raw_http(&api, &head, "");
    assert_eq!((status, &holder["id"]), (200, &response["id"]), "{holder}");
}

/// Opens a connection and sends a chat request's head announcing a body that never comes; the
/// connection, held open (its request in flight until the node's 30 s body deadline).
fn hold_a_request_open(api: &str) -> TcpStream {
    let mut stream = TcpStream::connect(api).unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {api}\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream
}

/// Sockets that connect and send nothing (300, more than the API's 256 connections) do not keep a new
/// client out: each newcomer takes the place of the connection idle longest, and is answered.
#[test]
fn connections_that_send_nothing_cannot_keep_a_client_out() {
    let (c, api) = one_loopback_node(&[]);
    let silent: Vec<TcpStream> = (0..300).map(|_| TcpStream::connect(&api).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    let (status, _) = raw_http(&api, &format!("GET /api/health HTTP/1.1\r\nHost: {api}"), "");
    assert_eq!(status, 200, "a client beside 300 silent sockets\n{}", c.logs());
    assert!(started.elapsed() < Duration::from_secs(5), "answered after {:?}", started.elapsed());
    drop(silent);
}

/// Requests whose bodies never come (240 at once, on a node without a token, where every client is
/// unprivileged) hold at most 7/8 of the connections: those beyond, and any request while they are
/// held, are answered 503 at once instead of waiting unanswered; once the body deadline has cut the
/// stalled ones off, requests are served again. (With a token, requests without it are refused before
/// their bodies are read, and those with it may use every connection: see `src/api/admission.rs`.)
#[test]
fn stalled_requests_hold_at_most_their_share_and_the_rest_are_told_at_once() {
    let (c, api) = one_loopback_node(&[]);
    let held: Vec<TcpStream> = (0..240).map(|_| hold_a_request_open(&api)).collect();
    std::thread::sleep(Duration::from_secs(1));
    let started = Instant::now();
    let (status, _) = raw_http(&api, &format!("GET /v1/models HTTP/1.1\r\nHost: {api}"), "");
    assert_eq!(status, 503, "a request beside 240 stalled ones");
    assert!(started.elapsed() < Duration::from_secs(5), "told after {:?}", started.elapsed());
    let refused = held
        .iter()
        .filter(|stream| {
            let mut stream = *stream;
            stream.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
            let mut head = [0u8; 12];
            stream.read_exact(&mut head).is_ok() && String::from_utf8_lossy(&head).contains("503")
        })
        .count();
    assert_eq!(refused, 240 - 224, "stalled requests beyond the share refused at once");
    // The body deadline (30 s) frees the share.
    let deadline = Instant::now() + Duration::from_secs(45);
    while raw_http(&api, &format!("GET /v1/models HTTP/1.1\r\nHost: {api}"), "").0 != 200 {
        assert!(Instant::now() < deadline, "the API did not serve again after the body deadline\n{}", c.logs());
        std::thread::sleep(Duration::from_secs(1));
    }
    drop(held);
}
