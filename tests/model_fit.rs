//! `GET /api/models/fit` on real nodes: the library with each runnable model's fit against the cluster's
//! memory pool, in the numbers a placement preview gives. One node too small for SmolLM2 (at the default
//! 2048-token context) says how much is missing, in the preview's own words; a second node joining makes
//! it fit on the nodes the preview would use; a damaged file has no fit.

mod common;

use common::cluster::{Network, TestCluster};
use serde_json::{json, Value};
use std::time::Duration;

const MB: u64 = 1_000_000;
/// Each node's offer: SmolLM2 with the launch defaults needs about 300 MB, so one node is too small and
/// two are enough.
const LIMIT: &str = "200MB";

fn request(c: &TestCluster, i: usize, method: &'static str, path: &str, body: Option<Value>) -> (u16, Value) {
    let url = format!("http://127.0.0.1:{}{path}", c.nodes[i].api_port);
    c.in_network(i, move || {
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        let mut response = match body {
            Some(body) => agent.post(&url).header("Content-Type", "application/json").send(body.to_string()),
            None if method == "GET" => agent.get(&url).call(),
            None => panic!("{method} without a body"),
        }
        .expect("the API answers");
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    })
    .join()
    .unwrap()
}

/// The fit endpoint's entry for the file whose path ends with `file_name`.
fn entry(c: &TestCluster, file_name: &str) -> Value {
    let (status, models) = request(c, 0, "GET", "/api/models/fit", None);
    assert_eq!(status, 200, "{models}");
    let list = models.as_array().expect("a list of models");
    list.iter()
        .find(|m| m["path"].as_str().is_some_and(|p| p.ends_with(file_name)))
        .unwrap_or_else(|| panic!("{file_name} is not listed: {models}"))
        .clone()
}

fn wait_for_members(c: &TestCluster, n: usize) {
    c.wait_for(Duration::from_secs(15), "every member alive with telemetry", || {
        c.status(0)
            .is_some_and(|s| s.nodes.len() == n && s.nodes.iter().all(|m| m.telemetry.is_some() && m.status.is_up()))
    });
}

#[test]
fn the_library_says_whether_each_model_fits_the_pool_with_the_previews_numbers() {
    let _guard = common::cluster::exclusive();
    let mut c = TestCluster::new(2);
    let model = std::fs::canonicalize(common::model_path()).unwrap();
    let models_dir = c.nodes[0].data_dir.join("models");
    std::fs::create_dir_all(&models_dir).unwrap();
    std::fs::write(models_dir.join("broken.gguf"), b"GGUF\x03\x00\x00\x00 not a model").unwrap();
    let added = common::shoal()
        .args(["models", "add"])
        .arg(&model)
        .arg("--data-dir")
        .arg(&c.nodes[0].data_dir)
        .output()
        .unwrap();
    assert!(added.status.success(), "shoal models add: {}", String::from_utf8_lossy(&added.stderr));

    c.start(0, &["--memory-limit", LIMIT]);
    c.wait_ready(0);
    wait_for_members(&c, 1);

    // A damaged file is listed with its reason and no fit.
    let broken = entry(&c, "broken.gguf");
    assert_eq!((broken["runnable"].clone(), broken["fit"].clone()), (json!(false), Value::Null), "{broken}");
    assert!(broken["problem"].is_string(), "{broken}");

    // Alone, the node is too small: the fit says by how much, and why in the preview's own words.
    let smol = entry(&c, "SmolLM2-135M-Instruct.Q4_1.gguf");
    assert_eq!(smol["runnable"], true, "{smol}");
    assert_eq!(smol["path"], model.to_str().unwrap());
    let fit = &smol["fit"];
    assert_eq!((fit["fits"].clone(), fit["nodes"].clone()), (json!(false), json!(1)), "{fit}");
    assert_eq!((fit["context"].clone(), fit["sequences"].clone()), (json!(2048), json!(4)), "{fit}");
    let (needed, pool, missing) = (
        fit["needed_bytes"].as_u64().unwrap(),
        fit["pool_bytes"].as_u64().unwrap(),
        fit["missing_bytes"].as_u64().unwrap(),
    );
    assert_eq!(pool, 200 * MB, "{fit}");
    // At least the file's tensors (read by the tests' own GGUF reader) and the KV cache by the formula:
    // K and V, F16, 3 heads of 64, in 30 layers, for 2048 positions of 4 requests.
    let table = common::tensor_table::read(&model);
    let weights: u64 = table.tensors.iter().map(|t| t.bytes).sum();
    let kv_cache = 30 * 2 * 2 * 192 * 2048 * 4;
    assert!(needed > weights + kv_cache, "{fit}: {weights} bytes of weights and {kv_cache} of cache");
    assert_eq!(missing, needed - pool, "{fit}");
    let (status, preview) = request(&c, 0, "POST", "/api/placements/preview", Some(json!({ "model": model })));
    assert_eq!(status, 422, "{preview}");
    assert_eq!(fit["reason"], preview["error"]["message"], "the fit's reason is the preview's error");
    assert!(fit["reason"].as_str().unwrap().contains(&format!("{:.1} MB missing", missing as f64 / 1e6)), "{fit}");

    // A second node joins: the model fits on the nodes, and needs the bytes, of the preview's plan.
    let code = c.code(0);
    let join = match c.network {
        Network::Netns => code,
        Network::Loopback => format!("{code}@{}", c.nodes[0].control_addr()),
    };
    c.start(1, &["--join", &join, "--memory-limit", LIMIT]);
    wait_for_members(&c, 2);
    let fit = entry(&c, "SmolLM2-135M-Instruct.Q4_1.gguf")["fit"].clone();
    let (status, preview) = request(&c, 0, "POST", "/api/placements/preview", Some(json!({ "model": model })));
    assert_eq!(status, 200, "{preview}");
    let plan = &preview["plan"];
    assert_eq!(fit["fits"], true, "{fit}");
    assert_eq!(fit["nodes"].as_u64().unwrap(), plan["stages"].as_array().unwrap().len() as u64, "{fit} {plan}");
    assert_eq!(fit["nodes"], 2, "{fit}");
    assert_eq!(fit["needed_bytes"], plan["total_bytes"], "{fit} {plan}");
    // Those bytes: every tensor once and the tied embedding again on the second stage, the cache by the
    // formula, and each stage's compute buffers (the engine's estimate: the one part with no outside truth).
    let embedding = table.tensors.iter().find(|t| t.name == "token_embd.weight").unwrap().bytes;
    let stages = plan["stages"].as_array().unwrap();
    let compute: u64 = stages.iter().map(|s| s["bytes"]["compute"].as_u64().unwrap()).sum();
    assert_eq!(plan["total_bytes"], weights + embedding + kv_cache + compute, "{plan}");
    assert_eq!(
        (fit["pool_bytes"].clone(), fit["missing_bytes"].clone(), fit["reason"].clone()),
        (json!(400 * MB), json!(0), Value::Null)
    );
}
