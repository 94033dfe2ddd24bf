//! Copying a model file between two real nodes in their own network namespaces: the cluster-wide list
//! shows which node offers which file, `POST /api/models/copy` brings it over the cluster's
//! authenticated connection with progress and the measured rate, and the copy equals the original byte
//! for byte. A connection without the cluster secret gets no list; an unknown file or node is a 400.

mod common;

use common::cluster::{Network, TestCluster};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::time::Duration;

const REPO_DIR: &str = "HuggingFaceTB--SmolLM2-135M-Instruct-GGUF";
const FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

fn post(c: &TestCluster, i: usize, path: &str, body: Value) -> (u16, Value) {
    let url = format!("http://127.0.0.1:{}{path}", c.nodes[i].api_port);
    c.in_network(i, move || {
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        let mut response = agent.post(&url).send_json(body).expect("the API answers");
        (response.status().as_u16(), response.body_mut().read_json().unwrap_or(Value::Null))
    })
    .join()
    .unwrap()
}

fn get(c: &TestCluster, i: usize, path: &str) -> Value {
    let url = format!("http://127.0.0.1:{}{path}", c.nodes[i].api_port);
    c.in_network(i, move || ureq::get(&url).call().unwrap().into_body().read_json::<Value>().unwrap()).join().unwrap()
}

#[test]
fn a_node_copies_a_model_from_another_byte_for_byte_with_its_rate() {
    let _guard = common::cluster::exclusive();
    let mut c = TestCluster::new(2);
    let source_dir = c.nodes[0].data_dir.join("models").join(REPO_DIR);
    std::fs::create_dir_all(&source_dir).unwrap();
    std::fs::copy(common::model_path(), source_dir.join(FILE)).unwrap();
    // A damaged file beside it is not offered.
    std::fs::write(source_dir.join("damaged.gguf"), b"GGUF\x03\x00\x00\x00 cut short").unwrap();
    c.start(0, &[]);
    c.wait_ready(0);
    let join = match c.network {
        Network::Netns => c.code(0),
        Network::Loopback => format!("{}@{}", c.code(0), c.nodes[0].control_addr()),
    };
    c.start(1, &["--join", &join]);
    c.wait_for(Duration::from_secs(20), "both members alive", || {
        c.status(1).is_some_and(|s| s.nodes.len() == 2 && s.nodes.iter().all(|n| n.status.is_up()))
    });

    // Who has what: the first node offers the file (with the repository it came from), the second none.
    let files = get(&c, 1, "/api/models/cluster");
    let of = |name: &str| {
        files
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name}: {files}"))
    };
    let (first, second) = (of(&c.nodes[0].name), of(&c.nodes[1].name));
    assert_eq!(second["files"], json!([]), "{files}");
    assert_eq!(first["files"].as_array().unwrap().len(), 1, "only the intact file is offered: {files}");
    let offered = &first["files"][0];
    let size = std::fs::metadata(common::model_path()).unwrap().len();
    assert_eq!((offered["name"].clone(), offered["size"].clone()), (json!(FILE), json!(size)), "{files}");
    assert_eq!(offered["repo"], "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF");

    // Bad requests are refused with the parameter at fault.
    let (status, body) = post(&c, 1, "/api/models/copy", json!({"from": c.nodes[0].name, "file": "nope.gguf"}));
    assert_eq!((status, body["error"]["param"].clone()), (400, json!("file")), "{body}");
    let wrong_size = json!({"from": c.nodes[0].name, "file": FILE, "size": size + 1});
    let (status, body) = post(&c, 1, "/api/models/copy", wrong_size);
    assert_eq!((status, body["error"]["param"].clone()), (400, json!("file")), "another size is another file: {body}");
    let (status, body) = post(&c, 1, "/api/models/copy", json!({"from": "nobody", "file": FILE}));
    assert_eq!((status, body["error"]["param"].clone()), (400, json!("from")), "{body}");

    // The copy: events until it is done, then the file equals the original.
    let (api, from) = (c.nodes[1].api_port, c.nodes[0].name.clone());
    let finished = c
        .in_network(1, move || {
            let base = format!("http://127.0.0.1:{api}");
            let events = ureq::get(&format!("{base}/api/events")).call().unwrap();
            let started: Value = ureq::post(&format!("{base}/api/models/copy"))
                .send_json(json!({"from": from, "file": FILE, "size": size}))
                .unwrap()
                .into_body()
                .read_json()
                .unwrap();
            let mut lines = BufReader::new(events.into_body().into_reader()).lines();
            loop {
                let line = lines.next().expect("the event stream ended").unwrap();
                let Some(data) = line.strip_prefix("data:") else { continue };
                let event: Value = serde_json::from_str(data.trim()).unwrap();
                if event["type"] == "model_copy"
                    && event["id"] == started["id"]
                    && (event["done"].is_object() || event["error"].is_string())
                {
                    return (started, event);
                }
            }
        })
        .join()
        .unwrap();
    let (started, event) = finished;
    assert_eq!(event["error"], Value::Null, "{event}");
    let done = &event["done"];
    assert_eq!(done["bytes"], json!(size), "{event}");
    assert!(done["bytes_per_second"].as_u64().unwrap() > 0, "{event}");
    println!("copied {size} bytes at {:.1} MB/s", done["bytes_per_second"].as_u64().unwrap() as f64 / 1e6);
    let copied = std::path::PathBuf::from(started["path"].as_str().unwrap());
    assert!(copied.starts_with(&c.nodes[1].data_dir), "{}", copied.display());
    assert!(std::fs::read(&copied).unwrap() == std::fs::read(common::model_path()).unwrap(), "the copy differs");
    assert!(!copied.with_extension("part").exists());

    // The second node now offers it too; a second copy is refused (it is already there).
    let files = get(&c, 0, "/api/models/cluster");
    assert!(files.as_array().unwrap().iter().all(|n| n["files"][0]["name"] == FILE), "{files}");
    let (status, _) = post(&c, 1, "/api/models/copy", json!({"from": c.nodes[0].name, "file": FILE}));
    assert_eq!(status, 400);

    // Without the cluster secret, nothing.
    let control: std::net::SocketAddr = c.nodes[0].control_addr().parse().unwrap();
    let refused = c
        .in_network(1, move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime
                .block_on(shoal::model::peer_copy::list(control, &[9; 32]))
                .map(|f| f.len())
                .map_err(|e| e.to_string())
        })
        .join()
        .unwrap();
    assert!(refused.is_err(), "a stranger got the list: {refused:?}");
}
