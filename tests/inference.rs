//! Distributed inference with real processes: three `shoal node`s whose memory limits force SmolLM2 into
//! three stages (one node copying its weights into its device's memory, the others mapping them) serve
//! greedy completions identical to the single-process engine, stop a request whose
//! client hangs up, stream through the official `openai` client, refuse bad requests with 4xx, and, when a worker is killed, nodes drop
//! off the network or the instance's owner dies, end the request in flight with an error and place the
//! model again by themselves.

mod common;

use common::cluster::{Network, TestCluster};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const LIMIT: &str = "64MB";

/// Forms a cluster of `n` nodes (each offering at most `limit`) and launches the test model with `extra`
/// arguments to `shoal run`; returns the instance's model name.
fn launch(c: &mut TestCluster, limit: &str, extra: &[&str]) -> String {
    launch_with(c, limit, extra, &[])
}

/// [`launch`], node `i` also started with `own[i]`.
fn launch_with(c: &mut TestCluster, limit: &str, extra: &[&str], own: &[&[&str]]) -> String {
    c.form_with(&["--memory-limit", limit], own);
    let model = common::model_path();
    let mut args = vec!["run", model.to_str().unwrap(), "--context", "256", "--sequences", "2", "--threads", "1"];
    args.extend_from_slice(extra);
    let out = c.cli(0, &args);
    assert!(out.status.success(), "shoal run failed: {}\n{}", String::from_utf8_lossy(&out.stderr), c.logs());
    "SmolLM2-135M-Instruct.Q4_1".to_string()
}

/// POSTs JSON to node `i`'s API from inside its network; returns the status and the body.
fn post(c: &TestCluster, i: usize, path: &str, body: Value) -> (u16, Value) {
    post_raw(c, i, path, body.to_string())
}

fn post_raw(c: &TestCluster, i: usize, path: &str, body: String) -> (u16, Value) {
    let url = format!("http://127.0.0.1:{}{path}", c.nodes[i].api_port);
    c.in_network(i, move || {
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        let mut response =
            agent.post(&url).header("Content-Type", "application/json").send(body).expect("the API answers");
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    })
    .join()
    .unwrap()
}

fn get(c: &TestCluster, i: usize, path: &str) -> Value {
    let url = format!("http://127.0.0.1:{}{path}", c.nodes[i].api_port);
    c.in_network(i, move || {
        let mut response = ureq::get(&url).call().expect("the API answers");
        serde_json::from_str(&response.body_mut().read_to_string().unwrap()).unwrap()
    })
    .join()
    .unwrap()
}

#[test]
fn three_nodes_serve_a_split_model_exactly_like_one_process() {
    let _one_at_a_time = common::cluster::exclusive();
    let mut c = TestCluster::new(3);
    // node1 copies its weights into its device's memory, as a discrete GPU needs; node2 computes on the
    // mapped file (--no-huge-pages); node0 copies what it does not repack into huge pages (the default).
    // A pipeline: a chain (a group of two with a stage, which placement may prefer under these limits)
    // sums in another order and is compared with its own one-process run in inference_tensor_parallel.
    let pipeline = ["--parallel", "pipeline"];
    let model = launch_with(&mut c, LIMIT, &pipeline, &[&[], &["--copy-weights"], &["--no-huge-pages"]]);
    let instances = get(&c, 1, "/api/instances");
    let stages = instances[0]["stages"].as_array().unwrap();
    assert_eq!(stages.len(), 3, "the memory limits force three stages: {instances:#}");
    assert!(stages.iter().all(|s| s["device"] == "CPU"), "each stage says its device: {instances:#}");
    let copying: Vec<bool> =
        (0..3).map(|i| c.descendants(i).iter().any(|(_, cmdline)| cmdline.contains("--copy-weights"))).collect();
    assert_eq!(copying, [false, true, false], "only node1's worker copies its weights");
    let in_place: Vec<bool> =
        (0..3).map(|i| c.descendants(i).iter().any(|(_, cmdline)| cmdline.contains("--no-huge-pages"))).collect();
    assert_eq!(in_place, [false, false, true], "only node2's worker keeps its weights in the mapped file");
    let mut nodes: Vec<&str> = stages.iter().map(|s| s["node"].as_str().unwrap()).collect();
    nodes.dedup();
    assert_eq!(nodes.len(), 3, "one stage per node");
    assert_eq!(get(&c, 2, "/v1/models")["data"][0]["id"], model);

    for case in common::oracle_greedy() {
        let body =
            json!({ "model": model, "prompt": case.prompt, "max_tokens": 32, "temperature": 0, "ignore_eos": true });
        // Ask a node that does not host stage 0 (the request is forwarded).
        let (status, answer) = post(&c, 2, "/v1/completions", body);
        assert_eq!(status, 200, "{answer}");
        let text = answer["choices"][0]["text"].as_str().unwrap();
        assert_eq!(text, common::single_process(&case.prompt, 32), "prompt {:?}", case.prompt);
        assert_eq!(answer["usage"]["completion_tokens"], 32);
        assert!(answer["shoal"]["hop_p50_us"].as_u64().is_some(), "a split instance reports its hop time");
    }

    // Two requests in the ring at once (each in its own KV slot) give what each gives alone.
    let cases = common::oracle_greedy();
    let concurrent: Vec<_> = cases[..2]
        .iter()
        .map(|case| {
            let body = json!({ "model": model, "prompt": case.prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": true });
            let url = format!("http://127.0.0.1:{}/v1/completions", c.nodes[0].api_port);
            c.in_network(0, move || {
                let mut response = ureq::post(&url).send_json(body).expect("the API answers");
                let answer: Value = serde_json::from_str(&response.body_mut().read_to_string().unwrap()).unwrap();
                answer["choices"][0]["text"].as_str().unwrap().to_string()
            })
        })
        .collect();
    for (case, handle) in cases[..2].iter().zip(concurrent) {
        assert_eq!(handle.join().unwrap(), common::single_process(&case.prompt, 24), "concurrent {:?}", case.prompt);
    }

    // Clients that hang up mid-stream cancel their requests: neither runs on to the end of its context.
    let head_stats = |c: &TestCluster| get(c, 0, "/api/instances")[0]["stages"][0]["stats"].clone();
    // A stage's counters reach the API with its next report: wait until they count every request so far.
    let answered = common::oracle_greedy().len() as u64 + 2;
    let mut before = Value::Null;
    c.wait_for(Duration::from_secs(10), "stage 0 to count the requests answered so far", || {
        before = head_stats(&c);
        before["requests"].as_u64() == Some(answered) && before["active_requests"] == 0
    });
    let hang_ups: Vec<_> = (0..2)
        .map(|_| {
            let url = format!("http://127.0.0.1:{}/v1/completions", c.nodes[0].api_port);
            let body = json!({ "model": model, "prompt": "Once upon a time", "max_tokens": 100_000, "temperature": 0, "ignore_eos": true, "stream": true });
            c.in_network(0, move || {
                use std::io::BufRead;
                let response = ureq::post(&url).send_json(body).expect("the stream starts");
                let mut reader = std::io::BufReader::new(response.into_body().into_reader());
                let mut line = String::new();
                // Read up to the first piece of text, then drop the connection.
                while reader.read_line(&mut line).unwrap() > 0 && !line.contains(r#""text":"#) {
                    line.clear();
                }
            })
        })
        .collect();
    for hang_up in hang_ups {
        hang_up.join().unwrap();
    }
    let requests = before["requests"].as_u64().unwrap_or(0) + 2;
    let mut after = Value::Null;
    c.wait_for(Duration::from_secs(30), "stage 0 to end both requests", || {
        after = head_stats(&c);
        after["requests"].as_u64() == Some(requests) && after["active_requests"] == 0
    });
    let generated = after["generated_tokens"].as_u64().unwrap() - before["generated_tokens"].as_u64().unwrap_or(0);
    // Each would generate 250 tokens (a 256-token context) if its hang-up went unnoticed.
    assert!(generated < 250, "the two requests went on for {generated} tokens after their clients hung up");
    eprintln!("two requests whose clients hung up after their first text generated {generated} tokens in all");

    // Streaming through the official client, chunk by chunk.
    let script = format!(
        r#"
import openai, sys
client = openai.OpenAI(base_url="http://127.0.0.1:{port}/v1", api_key="unused")
stream = client.chat.completions.create(model="{model}", messages=[{{"role": "user", "content": "Name a colour."}}], max_tokens=16, temperature=0, stream=True)
pieces = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
whole = client.chat.completions.create(model="{model}", messages=[{{"role": "user", "content": "Name a colour."}}], max_tokens=16, temperature=0)
print(len(pieces)); print("".join(pieces) == whole.choices[0].message.content)
"#,
        port = c.nodes[1].api_port
    );
    let out = c.command_in(1, "python3").args(["-c", &script]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the openai client failed (pip install openai): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].parse::<usize>().unwrap() > 1, "streamed in more than one chunk: {stdout}");
    assert_eq!(lines[1], "True", "streamed text equals the whole reply");

    // Bad requests are refused with a 4xx and a message; nothing crashes.
    let cases = [
        (json!({ "model": model, "prompt": "x", "max_tokens": -1 }), 400, "max_tokens"),
        (json!({ "model": "no-such-model", "prompt": "x" }), 404, "does not exist"),
        (json!({ "model": model, "prompt": "word ".repeat(400), "max_tokens": 4 }), 400, "context"),
        (json!({ "model": model, "prompt": "x", "temperature": -1 }), 400, "temperature"),
        (json!({ "prompt": "x" }), 400, "model"),
    ];
    for (body, status, needle) in cases {
        let (got, answer) = post(&c, 0, "/v1/completions", body.clone());
        assert_eq!(got, status, "{body} → {answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(needle), "{body} → {message}");
    }
    // A prompt beyond the context says so in the words each API's clients look for.
    let long = json!({ "model": model, "prompt": "word ".repeat(400), "max_tokens": 4 });
    let (_, answer) = post(&c, 0, "/v1/completions", long);
    assert_eq!(answer["error"]["code"], "context_length_exceeded", "{answer}");
    let long =
        json!({ "model": model, "max_tokens": 4, "messages": [{ "role": "user", "content": "word ".repeat(400) }] });
    let (got, answer) = post(&c, 0, "/v1/messages", long);
    assert_eq!(got, 400, "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().starts_with("prompt is too long: "), "{answer}");
    let (got, answer) = post_raw(&c, 0, "/v1/chat/completions", "{not json".into());
    assert_eq!(got, 400, "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("not valid JSON"), "{answer}");
    for i in 0..3 {
        assert!(c.status(i).is_some(), "node {i} still answers");
    }
}

/// Streams a long completion from node `i`; reports the first text on `started`, and returns the text,
/// the error that ended the stream (if any) and when it ended.
fn stream_until_end(
    c: &TestCluster,
    i: usize,
    model: &str,
    started: std::sync::mpsc::Sender<()>,
) -> std::thread::JoinHandle<(String, Option<String>, Instant)> {
    let url = format!("http://127.0.0.1:{}/v1/completions", c.nodes[i].api_port);
    let body = json!({ "model": model, "prompt": "Once upon a time", "max_tokens": 10_000, "temperature": 0, "ignore_eos": true, "stream": true });
    c.in_network(i, move || {
        use std::io::BufRead;
        let response = ureq::post(&url).send_json(body).expect("the stream starts");
        let mut text = String::new();
        let mut error = None;
        let mut signalled = false;
        for line in std::io::BufReader::new(response.into_body().into_reader()).lines() {
            let Ok(line) = line else {
                error = Some("the connection broke".to_string());
                break;
            };
            let Some(data) = line.strip_prefix("data: ") else { continue };
            if data == "[DONE]" {
                break;
            }
            let chunk: Value = serde_json::from_str(data).unwrap();
            if let Some(message) = chunk["error"]["message"].as_str() {
                error = Some(message.to_string());
                continue;
            }
            text.push_str(chunk["choices"][0]["text"].as_str().unwrap_or_default());
            if !signalled && !text.is_empty() {
                let _ = started.send(());
                signalled = true;
            }
        }
        (text, error, Instant::now())
    })
}

fn completes(c: &TestCluster, i: usize, model: &str) {
    let (status, answer) = post(
        c,
        i,
        "/v1/completions",
        json!({ "model": model, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0 }),
    );
    assert_eq!(status, 200, "{answer}");
    assert!(!answer["choices"][0]["text"].as_str().unwrap().is_empty());
}

/// The workers (`shoal worker` processes) this cluster's nodes run now.
fn workers(c: &TestCluster) -> Vec<(u32, String)> {
    (0..c.nodes.len()).flat_map(|i| c.descendants(i)).filter(|(_, cmdline)| cmdline.contains(" worker ")).collect()
}

/// Waits until node `i` sees instance `old` replaced, and returns the instance that replaced it once
/// that one is ready.
fn replacement_of(c: &TestCluster, i: usize, old: &str, within: Duration) -> Value {
    let mut new = Value::Null;
    c.wait_for(within, "the instance to be placed again and ready", || {
        let old_info = get(c, i, &format!("/api/instances/{old}"));
        let Some(next) = old_info["replaced_by"].as_str() else { return false };
        assert_eq!(old_info["state"], "replaced", "{old_info:#}");
        new = get(c, i, &format!("/api/instances/{next}"));
        new["state"] == "ready"
    });
    assert_eq!(new["recovery"]["replaces"], old, "{new:#}");
    new
}

/// Streams a long completion through node `client`, applies `fault` once tokens arrive, and checks
/// that the stream then ends with an error within twice the failure detector's down time (a lost node
/// is known lost after `DOWN_AFTER` of silence; a killed worker sooner); returns when the fault happened.
fn fault_mid_stream(
    c: &mut TestCluster,
    client: usize,
    model: &str,
    what: &str,
    fault: impl FnOnce(&mut TestCluster),
) -> Instant {
    let (started_tx, started) = std::sync::mpsc::channel();
    let stream = stream_until_end(c, client, model, started_tx);
    started.recv_timeout(Duration::from_secs(20)).expect("tokens arrive");
    fault(c);
    let at = Instant::now();
    let (text, error, ended) = stream.join().unwrap();
    let took = ended.duration_since(at);
    assert!(!text.is_empty());
    let error = error.expect("the stream ends with an error, not a silent stop");
    eprintln!("the request ended {took:?} after {what}: {error}");
    let bound = 2 * shoal::cluster::health::DOWN_AFTER;
    assert!(took <= bound, "the request took {took:?} to end (bound {bound:?})");
    at
}

/// Node `i` answers a greedy completion exactly as the single-process engine does.
fn answers_as_one_process(c: &TestCluster, i: usize, model: &str) {
    let (status, answer) = post(
        c,
        i,
        "/v1/completions",
        json!({ "model": model, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0 }),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["choices"][0]["text"].as_str().unwrap(),
        common::single_process("The capital of France is", 8),
        "the instance placed again answers as one process does"
    );
}

/// The distinct nodes an instance's stages run on, sorted by name.
fn distinct_stage_nodes(info: &Value) -> Vec<String> {
    let mut nodes = stage_nodes(info);
    nodes.sort();
    nodes.dedup();
    nodes
}

/// The names of the nodes an instance's stages run on, in ring order.
fn stage_nodes(info: &Value) -> Vec<String> {
    info["stages"].as_array().unwrap().iter().map(|s| s["node_name"].as_str().unwrap().to_string()).collect()
}

fn set_link(c: &TestCluster, port: &str, state: &str) {
    let bridge = c.bridge_namespace().unwrap().to_string();
    let out = std::process::Command::new("ip").args(["-n", &bridge, "link", "set", port, state]).output().unwrap();
    assert!(out.status.success(), "ip link set {port} {state}: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_killed_worker_fails_its_request_and_the_instance_is_placed_again_by_itself() {
    let _one_at_a_time = common::cluster::exclusive();
    let mut c = TestCluster::new(3);
    let model = launch(&mut c, LIMIT, &[]);
    let first_id = get(&c, 0, "/api/instances")[0]["id"].as_str().unwrap().to_string();
    let killed = fault_mid_stream(&mut c, 0, &model, "the stage-1 worker was killed", |c| {
        // This cluster's stage-1 worker, found among its nodes' own processes (never another test's).
        let stage_1: Vec<u32> =
            workers(c).into_iter().filter(|(_, cmdline)| cmdline.contains("--stage 1 ")).map(|(pid, _)| pid).collect();
        assert_eq!(stage_1.len(), 1, "one stage-1 worker runs in this cluster: {stage_1:?}");
        let out = std::process::Command::new("kill").args(["-9", &stage_1[0].to_string()]).output().unwrap();
        assert!(out.status.success(), "the stage-1 worker was killed");
    });

    // Nobody relaunches anything: a request sent now waits for the instance placed again.
    completes(&c, 2, &model);
    eprintln!("a new request was served {:?} after the worker was killed", killed.elapsed());
    let new = replacement_of(&c, 1, &first_id, Duration::from_secs(30));
    assert!(new["recovery"]["reason"].as_str().unwrap().contains("stage 1"), "{new:#}");
    assert_eq!(stage_nodes(&new).len(), 3, "the memory limits still force three stages: {new:#}");
    for i in 0..3 {
        let s = c.status(i).unwrap();
        assert!(s.nodes.iter().all(|n| n.status.is_up()), "the cluster stays healthy: {:?}", s.nodes);
    }
    // The old instance's workers are all gone: only the new instance's three run.
    c.wait_for(Duration::from_secs(10), "only the new instance's workers to run", || workers(&c).len() == 3);
    answers_as_one_process(&c, 1, &model);
}

#[test]
fn a_lost_node_fails_its_request_and_the_instance_moves_to_the_nodes_that_remain() {
    let _one_at_a_time = common::cluster::exclusive();
    let mut c = TestCluster::new(3);
    if c.network != Network::Netns {
        common::cannot_run("taking a node off the network needs network namespaces");
        return;
    }
    // Two of these nodes could hold the model; the explicit split uses all three.
    let model = launch(&mut c, "80MB", &["--layers", "node0:0-9,node1:10-19,node2:20-29"]);
    let first_id = get(&c, 0, "/api/instances")[0]["id"].as_str().unwrap().to_string();
    let cut = fault_mid_stream(&mut c, 0, &model, "node2 dropped off", |c| set_link(c, "p2", "down"));

    // Placed again on the two nodes that remain, without a person; a request waits for it.
    completes(&c, 1, &model);
    eprintln!("a new request was served {:?} after node2 dropped off", cut.elapsed());
    let second = replacement_of(&c, 1, &first_id, Duration::from_secs(30));
    assert!(second["recovery"]["reason"].as_str().unwrap().contains("node2 is down"), "{second:#}");
    assert_eq!(distinct_stage_nodes(&second), ["node0", "node1"], "{second:#}");
    // The instance it replaced shows what its stages are now, not what they last reported: node2's is
    // down, the others are stopped.
    c.wait_for(Duration::from_secs(10), "the replaced instance's stages to settle", || {
        let first = get(&c, 0, &format!("/api/instances/{first_id}"));
        let stages = first["stages"].as_array().unwrap().clone();
        let lost = stages.iter().find(|s| s["node_name"] == "node2").unwrap();
        (lost["state"] == "failed" && lost["error"] == "node node2 is down")
            && stages.iter().all(|s| s["state"] == "stopped" || s["state"] == "failed")
    });
    for i in 0..2 {
        let s = c.status(i).unwrap();
        let alive = s.nodes.iter().filter(|n| n.status.is_up()).count();
        assert_eq!(alive, 2, "the two connected nodes stay healthy: {:?}", s.nodes);
    }

    // With node1 gone too, node0 alone cannot hold the model: the instance waits, saying why, and a
    // request waits with it.
    let second_id = second["id"].as_str().unwrap().to_string();
    set_link(&c, "p1", "down");
    c.wait_for(Duration::from_secs(15), "the instance to wait for room", || {
        let info = get(&c, 0, &format!("/api/instances/{second_id}"));
        info["state"] == "recovering"
            && info["error"].as_str().unwrap_or_default().contains("waiting to place it again")
    });
    let waiting = get(&c, 0, &format!("/api/instances/{second_id}"));
    eprintln!("while node1 and node2 are away: {}", waiting["error"]);
    let (asked_tx, asked) = std::sync::mpsc::channel::<()>();
    let request = {
        let url = format!("http://127.0.0.1:{}/v1/completions", c.nodes[0].api_port);
        let body = json!({ "model": model, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0 });
        c.in_network(0, move || {
            let _ = asked_tx.send(());
            let mut response = ureq::post(&url).send_json(body).expect("the request is served once the nodes are back");
            let answer: Value = serde_json::from_str(&response.body_mut().read_to_string().unwrap()).unwrap();
            answer["choices"][0]["text"].as_str().unwrap().to_string()
        })
    };
    asked.recv().unwrap();

    // The nodes come back: the next try uses them again.
    set_link(&c, "p1", "up");
    set_link(&c, "p2", "up");
    let third = replacement_of(&c, 0, &second_id, Duration::from_secs(60));
    assert!(stage_nodes(&third).len() >= 2, "{third:#}");
    assert_eq!(request.join().unwrap(), common::single_process("The capital of France is", 8));

    // Stopped, the first instance is launched again by hand as it was launched: the same layers on the
    // same three nodes, the same context and sequences, under the same name.
    c.wait_for(Duration::from_secs(15), "the three nodes to be up", || {
        c.status(0).is_some_and(|s| s.nodes.iter().filter(|n| n.status.is_up()).count() == 3)
    });
    let out = c.cli(0, &["stop", &model]);
    assert!(out.status.success(), "shoal stop failed: {}", String::from_utf8_lossy(&out.stderr));
    // Once the stopped workers' memory is offered again.
    let layers = "node0:0-9,node1:10-19,node2:20-29";
    let preview = json!({ "model": common::model_path(), "layers": layers, "context": 256, "sequences": 2 });
    c.wait_for(Duration::from_secs(20), "the nodes to offer their memory again", || {
        post(&c, 0, "/api/placements/preview", preview.clone()).0 == 200
    });
    let (status, again) = post(&c, 0, &format!("/api/instances/{first_id}/relaunch"), json!({}));
    assert_eq!(status, 200, "{again:#}");
    let layers: Vec<String> = again["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| format!("{}:{}-{}", s["node_name"].as_str().unwrap(), s["layers"]["start"], s["layers"]["end"]))
        .collect();
    assert_eq!(layers, ["node0:0-10", "node1:10-20", "node2:20-30"], "{again:#}");
    assert_eq!((&again["model"], &again["context"], &again["sequences"]), (&json!(model), &json!(256), &json!(2)));
    answers_as_one_process(&c, 0, &model);
    let (status, refused) = post(&c, 0, &format!("/api/instances/{first_id}/relaunch"), json!({}));
    assert_eq!(status, 409, "a second relaunch while the first serves the name is refused: {refused:#}");
}

#[test]
fn when_the_owner_dies_a_node_that_remains_takes_the_instance_over_and_places_it_again() {
    let _one_at_a_time = common::cluster::exclusive();
    let mut c = TestCluster::new(3);
    // Every node holds the whole model in its library, as the successor must.
    for node in &c.nodes {
        let models = node.data_dir.join("models");
        std::fs::create_dir_all(&models).unwrap();
        let copy = models.join(common::model_path().file_name().unwrap());
        if std::fs::hard_link(common::model_path(), &copy).is_err() {
            std::fs::copy(common::model_path(), &copy).unwrap();
        }
    }
    // node0 launches the model, so node0 owns it; two of these nodes could hold it.
    let model = launch(&mut c, "80MB", &["--layers", "node0:0-9,node1:10-19,node2:20-29"]);
    let first_id = get(&c, 1, "/api/instances")[0]["id"].as_str().unwrap().to_string();
    let killed = fault_mid_stream(&mut c, 1, &model, "the owner was killed", |c| c.kill(0));

    // Nobody relaunches anything: a request sent now waits for the instance placed again by a node
    // that remains.
    completes(&c, 2, &model);
    eprintln!("a new request was served {:?} after the owner was killed", killed.elapsed());
    let new = replacement_of(&c, 2, &first_id, Duration::from_secs(30));
    assert!(new["recovery"]["reason"].as_str().unwrap().contains("owner node0 is down"), "{new:#}");
    assert_eq!(distinct_stage_nodes(&new), ["node1", "node2"], "{new:#}");
    let owner = new["owner"].as_str().unwrap();
    let old = get(&c, 1, &format!("/api/instances/{first_id}"));
    assert_eq!(old["owner"], owner, "both nodes agree who took it over: {old:#}");
    answers_as_one_process(&c, 1, &model);
}

#[test]
fn a_node_started_with_run_serves_its_model_and_a_joining_one_does_not_launch_it_twice() {
    let _one_at_a_time = common::cluster::exclusive();
    let mut c = TestCluster::with_network(2, Network::Loopback);
    let model = common::model_path();
    let model = model.to_str().unwrap();
    c.start(0, &["--run", model]);
    c.wait_ready(0);
    let name = "SmolLM2-135M-Instruct.Q4_1";
    let listed =
        |c: &TestCluster| get(c, 0, "/v1/models")["data"].as_array().is_some_and(|d| d.iter().any(|m| m["id"] == name));
    c.wait_for(Duration::from_secs(60), "the model launched by --run to be served", || listed(&c));
    completes(&c, 0, name);

    let join = format!("{}@{}", c.code(0), c.nodes[0].control_addr());
    c.start(1, &["--join", &join, "--run", model]);
    c.wait_for(Duration::from_secs(30), "node1 to find the model served", || {
        c.logs().contains("the cluster already serves")
    });
    // The file --run was given joined node0's library: the preview sees node0 hold it, and node1
    // would fetch its share from node0.
    let library = get(&c, 0, "/api/models");
    assert!(library.as_array().unwrap().iter().any(|m| m["name"] == name), "{library:#}");
    let body = json!({ "model": model, "layers": "node0:0-14,node1:15-29", "name": "probe" });
    let (status, preview) = post(&c, 0, "/api/placements/preview", body);
    assert_eq!(status, 200, "{preview}");
    assert_eq!(preview["fetches"][0], Value::Null, "node0 holds the file: {preview}");
    assert_eq!(preview["fetches"][1]["from"], "node0", "{preview}");
    let active: Vec<Value> = get(&c, 1, "/api/instances")
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| ["launching", "ready", "recovering"].contains(&i["state"].as_str().unwrap()))
        .cloned()
        .collect();
    assert_eq!(active.len(), 1, "one instance of the model: {active:#?}");
    completes(&c, 1, name);
}
