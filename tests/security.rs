//! The attacks of issue 14, performed for real against real nodes on loopback or in the harness's
//! network namespaces, and each seen refused: a web page driving the API (DNS rebinding, cross-site
//! posts), idle connections piling up on the API, a rogue member naming files outside the models folder
//! or sending an instance without stages, a stranger flooding the control port or guessing join codes,
//! a served GGUF header with an absurd alignment, secrets in a worker's command line, and members that
//! never come back.

mod common;

use common::cluster::{Network, TestCluster};
use common::gguf_writer::{GgufWriter, Meta};
use common::{one_loopback_node, raw_http};
use serde_json::{json, Value};
use shoal::cluster::messages::{self, ControlMessage, MAX_CONTROL_FRAME};
use shoal::cluster::MemberRecord;
use shoal::net::{secure, ConnectionKind, SecureReader, SecureWriter};
use shoal::node::NodeId;
use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

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
fn anthropic_and_ollama_routes_are_guarded_like_the_rest() {
    let ollama_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    let (_c, api) = one_loopback_node(&["--api-token", "s3cret", "--ollama-port", &ollama_port]);
    let port = api.rsplit(':').next().unwrap().to_string();
    let message = json!({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).to_string();
    // A cross-site page: JSON from another origin, a form post, a rebound host name. Each is refused in
    // the route's own error shape.
    let anthropic_head = |extra: &str| format!("POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1:{port}{extra}");
    for head in [
        anthropic_head("\r\nOrigin: http://evil.example\r\nContent-Type: application/json\r\nx-api-key: s3cret"),
        anthropic_head("\r\nContent-Type: text/plain"),
        format!("POST /v1/messages HTTP/1.1\r\nHost: evil.example:{port}\r\nContent-Type: application/json"),
    ] {
        let (status, answer) = raw_http(&api, &head, &message);
        assert_eq!(status, 403, "{head}: {answer}");
        assert_eq!(answer["type"], "error", "{answer}");
        assert_eq!(answer["error"]["type"], "permission_error", "{answer}");
    }
    for path in ["/api/chat", "/ollama/api/chat"] {
        let head = format!("POST {path} HTTP/1.1\r\nHost: localhost:{port}\r\nContent-Type: text/plain");
        let (status, answer) = raw_http(&api, &head, &chat);
        assert_eq!(status, 403, "{head}: {answer}");
        assert!(answer["error"].as_str().unwrap().contains("Content-Type"), "Ollama's shape: {answer}");
    }
    // The token: missing is refused; Anthropic's client sends it as x-api-key, Ollama's as a bearer token.
    let (status, answer) = raw_http(&api, &anthropic_head("\r\nContent-Type: application/json"), &message);
    assert_eq!((status, answer["error"]["type"].as_str()), (401, Some("authentication_error")), "{answer}");
    let head =
        anthropic_head("\r\nContent-Type: application/json\r\nx-api-key: s3cret\r\nanthropic-version: 2023-06-01");
    let (status, answer) = raw_http(&api, &head, &message);
    assert_eq!((status, answer["error"]["type"].as_str()), (404, Some("not_found_error")), "past the guard: {answer}");
    let head = format!(
        "POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nAuthorization: Bearer s3cret"
    );
    let (status, answer) = raw_http(&api, &head, &chat);
    assert_eq!(status, 404, "past the guard: {answer}");
    assert!(answer["error"].as_str().unwrap().contains("does not exist"), "{answer}");

    // Ollama's API alone on --ollama-port, behind the same guard and token.
    let ollama = format!("127.0.0.1:{ollama_port}");
    let (status, _) = raw_http(&ollama, &format!("GET / HTTP/1.1\r\nHost: localhost:{ollama_port}"), "");
    assert_eq!(status, 200, "Ollama's root answers");
    let (status, answer) = raw_http(&ollama, &format!("GET /api/tags HTTP/1.1\r\nHost: 127.0.0.1:{ollama_port}"), "");
    assert_eq!((status, answer["models"].as_array().map(Vec::len)), (200, Some(0)), "{answer}");
    let (status, _) = raw_http(&ollama, &format!("GET /api/cluster HTTP/1.1\r\nHost: 127.0.0.1:{ollama_port}"), "");
    assert_eq!(status, 404, "only Ollama's routes there");
    for head in [
        format!("POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1:{ollama_port}\r\nContent-Type: text/plain"),
        format!("POST /api/chat HTTP/1.1\r\nHost: evil.example:{ollama_port}\r\nContent-Type: application/json"),
        format!("POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1:{ollama_port}\r\nContent-Type: application/json"),
    ] {
        let (status, answer) = raw_http(&ollama, &head, &chat);
        assert!(status == 403 || status == 401, "{head}: {status} {answer}");
        assert!(answer["error"].is_string(), "Ollama's shape: {answer}");
    }
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

/// A fake member of node 0's cluster: it read the secret from node 0's data directory (as a rogue
/// member holds it) and speaks the control protocol on its own.
struct FakeMember {
    runtime: tokio::runtime::Runtime,
    reader: SecureReader,
    writer: SecureWriter,
    record: MemberRecord,
    secret: [u8; 32],
    victim: NodeId,
}

impl FakeMember {
    fn connect(c: &TestCluster, copy_port: u16) -> FakeMember {
        let membership: Value =
            serde_json::from_slice(&std::fs::read(c.nodes[0].data_dir.join("cluster.json")).unwrap()).unwrap();
        let secret: [u8; 32] = hex::decode(membership["secret"].as_str().unwrap()).unwrap().try_into().unwrap();
        let control: SocketAddr = c.nodes[0].control_addr().parse().unwrap();
        let record = MemberRecord {
            id: NodeId::random(),
            name: "mallory".into(),
            control: vec![SocketAddr::from(([127, 0, 0, 1], copy_port))],
            api_port: copy_port,
        };
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let (mut reader, mut writer, victim) = runtime.block_on(async {
            let (mut reader, mut writer) = secure::connect(control, ConnectionKind::Member, &secret).await.unwrap();
            writer.write_frame(&messages::encode(&ControlMessage::Hello { node: record.clone() })).await.unwrap();
            let hello = messages::decode::<ControlMessage>(&reader.read_frame(MAX_CONTROL_FRAME).await.unwrap());
            let Ok(ControlMessage::Hello { node }) = hello else { panic!("no Hello: {hello:?}") };
            (reader, writer, node.id)
        });
        let _ = (&mut reader, &mut writer);
        FakeMember { runtime, reader, writer, record, secret, victim }
    }

    fn send(&mut self, message: &Value) {
        let frame = messages::encode(message);
        self.runtime.block_on(self.writer.write_frame(&frame)).unwrap();
    }

    /// The first message from the victim that `pick` accepts (pings are answered meanwhile).
    fn until<T>(&mut self, mut pick: impl FnMut(&Value) -> Option<T>) -> T {
        let (reader, writer) = (&mut self.reader, &mut self.writer);
        self.runtime.block_on(async {
            let wait = async {
                loop {
                    let frame = reader.read_frame(MAX_CONTROL_FRAME).await.expect("the victim closed the connection");
                    let message: Value = messages::decode(&frame).unwrap();
                    if message["type"] == "ping" {
                        let pong = json!({"type": "pong", "seq": message["seq"], "busy": false});
                        writer.write_frame(&messages::encode(&pong)).await.unwrap();
                    } else if let Some(found) = pick(&message) {
                        return found;
                    }
                }
            };
            tokio::time::timeout(Duration::from_secs(30), wait).await.expect("no such message within 30 s")
        })
    }
}

fn instance(id: &str, owner: NodeId, stages: Value) -> Value {
    let plan = json!({"model": "m", "context": 256, "vocabulary": 10, "stages": [], "total_bytes": 0, "ring_us": 0,
        "expected_decode_tokens_per_second": null});
    json!({"type": "instance", "info": {"id": id, "model": id, "model_path": "/m.gguf", "owner": owner,
        "state": "ready", "error": null, "context": 256, "sequences": 1, "created_at_ms": 0, "plan": plan,
        "stages": stages}})
}

fn stage_on(node: NodeId) -> Value {
    json!([{"node": node, "node_name": "victim", "layers": {"start": 0, "end": 1}, "state": "starting",
        "progress": 0.0, "data_port": null, "memory": null, "stats": null, "error": null}])
}

/// Serves one model-copy connection as the fake member: a list naming a file in repository `..`.
fn serve_evil_list(listener: std::net::TcpListener, secret: [u8; 32]) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            listener.set_nonblocking(true).unwrap();
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let Ok(Ok((mut stream, _))) = tokio::time::timeout(Duration::from_secs(30), listener.accept()).await else {
                return;
            };
            let preamble = secure::read_preamble(&mut stream).await.unwrap();
            let (mut reader, mut writer) = secure::respond(stream, preamble, &secret).await.unwrap();
            let _request = reader.read_frame(1 << 20).await.unwrap();
            let list = json!([{"name": "evil.gguf", "size": 4, "repo": "..", "sha256": null}]);
            writer.write_frame(&serde_json::to_vec(&list).unwrap()).await.unwrap();
        });
    })
}

#[test]
fn a_rogue_member_cannot_write_outside_the_models_folder_or_break_the_registry() {
    let (c, api) = one_loopback_node(&[]);
    let copy_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let copy_port = copy_listener.local_addr().unwrap().port();
    let mut fake = FakeMember::connect(&c, copy_port);
    let (me, victim) = (fake.record.id, fake.victim);
    let outside = c.nodes[0].data_dir.parent().unwrap().join("x");

    // An instance without stages is dropped; requests for it and the instance list keep working.
    fake.send(&instance("empty", me, json!([])));
    // A stage whose file name climbs out of the models folder is refused, and the owner told why; so is
    // a split set one of whose parts does.
    let file = |name: &str| json!({"name": name, "size": 4, "repo": null, "sha256": null});
    let evil_set = [file("m-00001-of-00002.gguf"), file("../x/m-00002-of-00002.gguf")];
    for (id, file, parts) in
        [("evil1", file("../../x/evil.gguf"), json!([])), ("evil2", evil_set[0].clone(), json!(evil_set))]
    {
        fake.send(&instance(id, me, stage_on(victim)));
        let spec = json!({"instance": id, "stage": 0, "stages": 1, "model_path": "/elsewhere/evil.gguf",
            "layers": {"start": 0, "end": 1}, "context": 256, "sequences": 1, "batch": 512, "threads": 1,
            "file": file, "parts": parts});
        fake.send(&json!({"type": "start_stage", "spec": spec}));
        let refusal =
            fake.until(|m| (m["type"] == "stage_update" && m["instance"] == id).then(|| m["report"]["error"].clone()));
        assert!(refusal.as_str().unwrap().contains("not a plain file name"), "{id}: {refusal}");
    }

    let chat = json!({"model": "empty", "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let head = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json";
    let (status, answer) = raw_http(&api, head, &chat);
    assert_eq!(status, 404, "{answer}");
    assert_eq!(raw_http(&api, "GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1", "").0, 200);
    let instances = c.get_json(0, "/api/instances");
    assert!(instances.as_array().unwrap().iter().all(|i| i["id"] != "empty"), "{instances}");

    // Copies: a path as the file is refused at once; a member listing a file in repository `..` is
    // refused before anything is written.
    let copy = |file: &str| c.post_json(0, "/api/models/copy", json!({"from": "mallory", "file": file}));
    for file in ["/tmp/x/authorized_keys", "../x", "..", "a/b.gguf"] {
        let (status, answer) = copy(file);
        assert_eq!((status, answer["error"]["param"].clone()), (400, json!("file")), "{file}: {answer}");
    }
    let server = serve_evil_list(copy_listener, fake.secret);
    let (status, answer) = copy("evil.gguf");
    assert_eq!(status, 502, "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("will not write"), "{answer}");
    server.join().unwrap();

    assert!(!outside.exists(), "something was written at {}", outside.display());
    assert!(!c.nodes[0].data_dir.join("evil.gguf").exists());
    assert!(!c.nodes[0].data_dir.join("evil.part").exists());
    assert!(c.status(0).is_some(), "the node stopped answering\n{}", c.logs());
    assert!(!c.logs().contains("panicked"), "{}", c.logs());
}

#[test]
fn strangers_can_neither_block_joins_nor_revoke_a_valid_code() {
    let _guard = common::cluster::exclusive();
    let mut c = TestCluster::new(4);
    if c.network != Network::Netns {
        common::cannot_run("telling a stranger's address from a member's needs network namespaces");
        return;
    }
    c.start(0, &[]);
    c.wait_ready(0);
    let code = c.code(0);
    let control: SocketAddr = c.nodes[0].control_addr().parse().unwrap();

    // Two strangers guess codes, three times each (more than the five that used to revoke a code).
    for stranger in [2, 3] {
        c.in_network(stranger, move || {
            let runtime = tokio::runtime::Runtime::new().unwrap();
            for _ in 0..3 {
                let me = MemberRecord { id: NodeId::random(), name: "guess".into(), control: vec![], api_port: 1 };
                let result = runtime.block_on(shoal::cluster::join::request(control, "ABCDEFGH", me));
                let wrong = matches!(result, Err(shoal::cluster::join::JoinError::WrongCode(_)));
                assert!(wrong, "a guess was not refused as a wrong code: {result:?}");
            }
        })
        .join()
        .unwrap();
    }
    // The first stranger now has the right code, and is refused all the same: at once by the rate limit
    // (three attempts from one address in ten seconds), and once that window has passed because its
    // address gave three wrong codes for this one. Refused attempts do not count against the window.
    let right = code.clone();
    let refusals = c
        .in_network(2, move || {
            let runtime = tokio::runtime::Runtime::new().unwrap();
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut seen: Vec<String> = Vec::new();
            loop {
                let me = MemberRecord { id: NodeId::random(), name: "guess".into(), control: vec![], api_port: 1 };
                let why = match runtime.block_on(shoal::cluster::join::request(control, &right, me)) {
                    Err(shoal::cluster::join::JoinError::Refused(why)) => why.to_string(),
                    Err(e @ shoal::cluster::join::JoinError::RateLimited) => e.to_string(),
                    other => panic!("a stranger that guessed wrong three times got in with the right code: {other:?}"),
                };
                if seen.last() != Some(&why) {
                    seen.push(why.clone());
                }
                if why.contains("wrong join code too often") {
                    return seen;
                }
                assert!(Instant::now() < deadline, "the stranger was never told it guessed too often: {seen:?}");
                std::thread::sleep(Duration::from_millis(500));
            }
        })
        .join()
        .unwrap();
    assert!(refusals[0].contains("too many join attempts"), "{refusals:?}");

    // One of them floods the control port with connections that never say anything.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood = {
        let stop = stop.clone();
        c.in_network(2, move || {
            let mut held = std::collections::VecDeque::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(s) = TcpStream::connect_timeout(&control, Duration::from_millis(200)) {
                    held.push_back(s);
                }
                if held.len() > 300 {
                    held.pop_front();
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    // Meanwhile the right code still lets a new node in.
    c.start(1, &["--join", &code]);
    c.wait_for(Duration::from_secs(20), "the new node to join during the flood", || {
        c.status(1).is_some_and(|s| s.nodes.len() == 2 && s.nodes.iter().all(|n| n.status.is_up()))
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    flood.join().unwrap();
}

#[test]
fn members_down_for_long_are_forgotten() {
    let _guard = common::cluster::exclusive();
    let mut c = TestCluster::with_network(2, Network::Loopback);
    c.start_with_env(0, &[], &[("SHOAL_FORGET_DOWN_AFTER", "2")]);
    c.wait_ready(0);
    let join = format!("{}@{}", c.code(0), c.nodes[0].control_addr());
    c.start(1, &["--join", &join]);
    c.wait_for(Duration::from_secs(20), "the cluster to form", || c.status(0).is_some_and(|s| s.nodes.len() == 2));
    c.kill(1);
    c.wait_for(Duration::from_secs(30), "the dead member to be forgotten", || {
        c.status(0).is_some_and(|s| s.nodes.len() == 1)
    });
    let membership = std::fs::read_to_string(c.nodes[0].data_dir.join("cluster.json")).unwrap();
    assert!(!membership.contains("node1"), "{membership}");
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

/// A server that claims a 2 GiB file (as one serving a sparse file would) and serves `bytes`, then
/// zeros.
struct ClaimsHugeFile(Vec<u8>);

impl shoal::model::shard::RangeReader for ClaimsHugeFile {
    fn get(
        &mut self,
        range: std::ops::Range<u64>,
        size: &mut Option<u64>,
        sink: &mut shoal::model::shard::Sink<'_>,
    ) -> Result<u64, shoal::model::shard::Failure> {
        *size = Some(1 << 31);
        let end = range.end.min(range.start + (1 << 20));
        let chunk: Vec<u8> = (range.start..end).map(|i| self.0.get(i as usize).copied().unwrap_or(0)).collect();
        sink(range.start, &chunk).map_err(shoal::model::shard::Failure::Fatal)?;
        Ok(end)
    }
}

#[test]
fn a_header_claiming_a_huge_alignment_and_size_is_refused_before_any_file_is_made() {
    let gguf = GgufWriter::default()
        .meta("general.architecture", Meta::Str("llama".into()))
        .meta("general.alignment", Meta::U32(1 << 30))
        .f32_tensor("token_embd.weight", &[8, 4])
        .bytes();
    let dir = tempfile::tempdir().unwrap();
    let destination = dir.path().join("models").join("evil.gguf");
    let source = shoal::model::shard::ShardSource { url: "peer://mallory/evil.gguf".into(), size: None, sha256: None };
    let fetched = shoal::model::shard::fetch_from(&mut ClaimsHugeFile(gguf), &source, &destination, 0..1, &mut |_| {});
    let Err(error) = fetched else { panic!("the header was accepted") };
    let error = error.to_string();
    assert!(error.contains("general.alignment"), "{error}");
    assert!(walk(dir.path()).is_empty(), "files were left behind: {:?}", walk(dir.path()));
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries.flatten().flat_map(|e| if e.path().is_dir() { walk(&e.path()) } else { vec![e.path()] }).collect()
}

#[test]
fn workers_bind_where_the_agent_binds_and_get_no_secret_in_argv() {
    let (c, _api) = one_loopback_node(&[]);
    c.wait_for(Duration::from_secs(10), "the node's telemetry", || {
        c.status(0).is_some_and(|s| s.nodes.iter().all(|n| n.telemetry.is_some()))
    });
    let models = c.nodes[0].data_dir.join("models");
    std::fs::create_dir_all(&models).unwrap();
    let model = models.join("security-test.gguf");
    std::fs::copy(common::model_path(), &model).unwrap();
    let (status, answer) =
        c.post_json(0, "/api/instances", json!({"model": model, "context": 256, "sequences": 1, "threads": 1}));
    assert_eq!(status, 200, "{answer}");
    let id = answer["id"].as_str().unwrap().to_string();
    c.wait_for(Duration::from_secs(60), "the instance to be ready", || {
        c.get_json(0, &format!("/api/instances/{id}"))["state"] == "ready"
    });
    let model_text = model.display().to_string();
    let workers: Vec<(String, Vec<String>)> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|p| {
            let cmdline = std::fs::read(p.path().join("cmdline")).ok()?;
            let args: Vec<String> =
                cmdline.split(|&b| b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
            (args.iter().any(|a| a == "worker") && args.contains(&model_text))
                .then(|| (p.file_name().to_string_lossy().into_owned(), args))
        })
        .collect();
    assert_eq!(workers.len(), 1, "{workers:?}");
    let (pid, args) = &workers[0];
    let secret = serde_json::from_slice::<Value>(&std::fs::read(c.nodes[0].data_dir.join("cluster.json")).unwrap())
        .unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(!args.join(" ").contains(&secret), "the cluster secret is in the worker's argv: {args:?}");
    let listen = args.iter().position(|a| a == "--listen").map(|i| args[i + 1].clone());
    assert_eq!(listen.as_deref(), Some("127.0.0.1"), "{args:?}");
    // Its data port listens on loopback only (the node runs with --bind 127.0.0.1).
    let sockets = std::process::Command::new("ss").args(["-ltnpH"]).output().unwrap();
    let sockets = String::from_utf8_lossy(&sockets.stdout);
    let mine: Vec<&str> = sockets.lines().filter(|l| l.contains(&format!("pid={pid},"))).collect();
    assert!(!mine.is_empty(), "no listening socket of worker {pid}: {sockets}");
    assert!(mine.iter().all(|l| l.contains("127.0.0.1:")), "{mine:?}");
}
