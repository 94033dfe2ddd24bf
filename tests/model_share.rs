//! A launch moves each node only its share of the model. Three real nodes in their own network
//! namespaces, the model only on the first: the other two fetch just the header and their stages'
//! tensors from it over the cluster's authenticated connection (into sparse shard files), the instance
//! generates exactly what one process does, and a second launch fetches nothing. With the model on no
//! member whole (the owner holds a shard), the share comes from the hub (a loopback hub in its layout).

mod common;

use common::cluster::{Network, TestCluster};
use common::hub::{start_hub, Faults};
use serde_json::{json, Value};
use shoal::model::pull::{Hub, PullRequest};
use shoal::model::shard;
use std::ops::Range;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

const REPO_DIR: &str = "HuggingFaceTB--SmolLM2-135M-Instruct-GGUF";
const FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const MODEL: &str = "SmolLM2-135M-Instruct.Q4_1";

/// The file's tensor table, read by the tests' own GGUF reader (not shoal's).
fn table() -> common::tensor_table::TensorTable {
    common::tensor_table::read(&common::model_path())
}

/// Bytes of the tensors a stage of `layers` (of 30) reads.
fn tensor_bytes(layers: Range<usize>) -> u64 {
    table().stage_bytes(layers, 30)
}

/// The middle layers a stage of `layers` (of 30) does not run.
fn outside(layers: Range<usize>) -> Range<usize> {
    if layers.start > 1 {
        1..layers.start
    } else {
        layers.end..29
    }
}

/// No byte of the tensors of the middle `layers` is in the shard.
fn assert_nothing_of(record: &shard::ShardRecord, layers: Range<usize>) {
    for t in table().stage(layers, 30) {
        let bytes = t.offset..t.offset + t.bytes;
        assert!(record.present.iter().all(|p| p.end <= bytes.start || bytes.end <= p.start), "{} was fetched", t.name);
    }
}

/// Puts the model in node0's models folder, as `shoal pull` leaves it; returns its path.
fn model_on_node0(c: &TestCluster) -> PathBuf {
    let folder = c.nodes[0].data_dir.join("models").join(REPO_DIR);
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::copy(common::model_path(), folder.join(FILE)).unwrap();
    folder.join(FILE)
}

fn stop(c: &TestCluster, id: &str) {
    let url = format!("http://127.0.0.1:{}/api/instances/{id}", c.nodes[0].api_port);
    // Actions carry a JSON body or X-Shoal-Client (the API refuses what a cross-site page could send).
    let stop = move || ureq::delete(&url).header("X-Shoal-Client", "test").call().expect("stopped");
    c.in_network(0, stop).join().unwrap();
}

fn completes_like_one_process(c: &TestCluster, node: usize) {
    for case in &common::oracle_greedy()[..2] {
        let body =
            json!({ "model": MODEL, "prompt": case.prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": true });
        let (status, answer) = c.post_json(node, "/v1/completions", body);
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["choices"][0]["text"], common::single_process(&case.prompt, 24), "{:?}", case.prompt);
    }
}

/// The shard a node fetched: its record's layers and the bytes it takes on disk.
fn shard_on(c: &TestCluster, node: usize) -> (PathBuf, shard::ShardRecord, u64) {
    let path = c.nodes[node].data_dir.join("models").join(REPO_DIR).join(FILE);
    let record = shard::read_record(&path).unwrap().unwrap_or_else(|| panic!("{} is not a shard", path.display()));
    let on_disk = std::fs::metadata(&path).unwrap().blocks() * 512;
    (path, record, on_disk)
}

#[test]
fn a_three_node_launch_moves_each_node_only_its_share_from_the_member_that_has_it() {
    let _one_at_a_time = common::cluster::exclusive();
    let mut c = TestCluster::new(3);
    c.private_disks = true;
    let model = model_on_node0(&c);
    let size = std::fs::metadata(&model).unwrap().len();
    c.form(&[]);
    let ids: Vec<Value> = c.get_json(0, "/api/cluster")["nodes"].as_array().unwrap().clone();
    let id_of = |name: &str| ids.iter().find(|n| n["name"] == name).unwrap()["id"].clone();

    // The preview says who will fetch its share, how much and from where.
    let layers = "node0:0-9,node1:10-19,node2:20-29";
    let preview = |c: &TestCluster| {
        // Under a name of its own: a preview under the running instance's name is refused (409).
        let body = json!({ "model": model, "layers": layers, "context": 256, "sequences": 2, "name": "preview" });
        let (status, preview) = c.post_json(0, "/api/placements/preview", body);
        assert_eq!(status, 200, "{preview}");
        preview["fetches"].as_array().unwrap().clone()
    };
    let fetches = preview(&c);
    assert_eq!(fetches[0], Value::Null, "{fetches:?}");
    for (i, layers) in [(1, 10..20), (2, 20..30)] {
        assert_eq!(fetches[i]["from"], "node0", "{fetches:?}");
        let share = table().data_start + tensor_bytes(layers);
        assert_eq!(fetches[i]["bytes"], share, "{fetches:?}");
    }
    let out = c.cli(0, &["run", model.to_str().unwrap(), "--layers", layers, "--preview"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.matches("share from node0").count(), 2, "{text}");

    let instance = c.launch_ready(&model, layers);
    assert!(preview(&c).iter().all(Value::is_null), "after the launch every node holds its share");
    let stages = instance["stages"].as_array().unwrap();
    assert_eq!(stages[0]["fetch"], Value::Null, "the owner has the whole file: {instance:#}");
    for (i, layers) in [(1, 10..20), (2, 20..30)] {
        let fetch = &stages[i]["fetch"];
        assert_eq!(fetch["done"], true, "{instance:#}");
        assert_eq!(fetch["from_node"], id_of("node0"), "fetched from the member with the file: {fetch}");
        let (path, record, on_disk) = shard_on(&c, i);
        assert_eq!(record.layers, vec![layers.clone()], "{}", path.display());
        assert_eq!(record.size, size);
        // The header and the stage's tensors came over, nothing else but the alignment padding between
        // neighbours and what came with the header's last chunk (it is read in growing chunks from 1
        // MiB); the sparse file's holes take no disk.
        let share = table().data_start + tensor_bytes(layers.clone());
        let fetched = fetch["bytes_fetched"].as_u64().unwrap();
        assert!((share..share + (4 << 20)).contains(&fetched), "fetched {fetched} for a share of {share}");
        assert!(record.present_bytes() <= fetched);
        assert!(on_disk < share + (1 << 20), "{} takes {on_disk} bytes on disk for a share of {share}", path.display());
        assert_nothing_of(&record, outside(layers));
    }
    // The last stage holds the output head (the tied embedding), so the two shares differ.
    completes_like_one_process(&c, 2);
    // The cluster's file list shows who holds which layers; a shard is never offered for a copy.
    let files = c.get_json(2, "/api/models/cluster");
    let of = |name: &str| files.as_array().unwrap().iter().find(|n| n["name"] == name).unwrap()["files"].clone();
    assert_eq!(of("node0")[0]["layers"], Value::Null, "{files:#}");
    assert_eq!((of("node1")[0]["name"].clone(), of("node1")[0]["layers"].clone()), (json!(FILE), json!("10-19")));
    assert_eq!(of("node2")[0]["layers"], "20-29");
    let (status, refused) = c.post_json(0, "/api/models/copy", json!({ "from": "node1", "file": FILE }));
    assert_eq!(status, 400, "a shard cannot be copied: {refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("does not offer"), "{refused}");

    // Launched again, every node already holds its share: nothing moves.
    stop(&c, instance["id"].as_str().unwrap());
    let again = c.launch_ready(&model, "node0:0-9,node1:10-19,node2:20-29");
    assert!(again["stages"].as_array().unwrap().iter().all(|s| s["fetch"].is_null()), "{again:#}");
    completes_like_one_process(&c, 1);

    // Another placement: node1 now runs layers 5-19 and fetches layers 5-9 only (10-19 are there).
    stop(&c, again["id"].as_str().unwrap());
    let moved = c.launch_ready(&model, "node0:0-4,node1:5-19,node2:20-29");
    let fetch = &moved["stages"][1]["fetch"];
    let (_, record, _) = shard_on(&c, 1);
    assert_eq!(record.layers, vec![5..20]);
    let added = fetch["bytes_fetched"].as_u64().unwrap();
    let expected = tensor_bytes(5..10);
    assert!((expected..expected + 64 * 1024).contains(&added), "fetched {added} for layers 5-9 of {expected}");
    assert!(moved["stages"][2]["fetch"].is_null());
    completes_like_one_process(&c, 0);

    // "Copy here" onto a shard completes it: only its holes come over, and the result is the file.
    let (status, started) = c.post_json(1, "/api/models/copy", json!({ "from": "node0", "file": FILE }));
    assert_eq!(status, 200, "{started}");
    let path = c.nodes[1].data_dir.join("models").join(REPO_DIR).join(FILE);
    c.wait_for(std::time::Duration::from_secs(30), "the shard to be completed", || !shard::is_shard(&path));
    assert_eq!(std::fs::read(&path).unwrap(), std::fs::read(common::model_path()).unwrap());
}

/// No member has the whole file (the owner pulled only its own layers): the other node's share comes
/// from the hub, by range requests for its tensors only.
#[test]
fn with_no_member_holding_the_whole_file_a_share_comes_from_the_hub() {
    let _one_at_a_time = common::cluster::exclusive();
    let hub = start_hub(Faults::default());
    let hf_home = tempfile::tempdir().unwrap();
    let mut c = TestCluster::with_network(2, Network::Loopback);
    // The nodes get the hub's address (and an empty Hugging Face cache); this process's environment,
    // which other tests share, stays as it is.
    c.env.push(("HF_ENDPOINT".into(), hub.endpoint.clone()));
    c.env.push(("HF_HOME".into(), hf_home.path().display().to_string()));
    c.private_disks = true;
    let request = PullRequest::parse(&format!("{}:{}", common::hub::REPO, common::hub::FILE)).unwrap();
    let owner_models = c.nodes[0].data_dir.join("models");
    let model = shard::pull_shard(&Hub::new(&hub.endpoint, None), &owner_models, &request, 0..10, &mut |_| {}).unwrap();
    c.form(&[]);
    hub.clear();

    let body = json!({ "model": model, "layers": "node0:0-9,node1:10-29" });
    let (_, preview) = c.post_json(0, "/api/placements/preview", body);
    assert_eq!(preview["fetches"][0], Value::Null, "the owner's shard holds layers 0-9: {preview}");
    assert!(preview["fetches"][1]["from"].as_str().unwrap().contains("Hugging Face"), "{preview}");
    let instance = c.launch_ready(&model, "node0:0-9,node1:10-29");
    let fetch = &instance["stages"][1]["fetch"];
    assert_eq!((fetch["done"].clone(), fetch["from_node"].clone()), (json!(true), Value::Null), "{instance:#}");
    assert!(fetch["from"].as_str().unwrap().contains(common::hub::REPO), "{fetch}");
    let path = c.nodes[1].data_dir.join("models").join("test-org--SmolLM2-135M-Instruct-GGUF").join(FILE);
    let record = shard::read_record(&path).unwrap().expect("node1 holds a shard");
    assert_eq!(record.layers, vec![10..30]);
    let served: u64 = hub.served().iter().map(|s| s.bytes).sum();
    assert_eq!(served, fetch["bytes_fetched"].as_u64().unwrap(), "the hub served exactly what node1 fetched");
    assert_nothing_of(&record, 1..10);
    completes_like_one_process(&c, 1);
}

/// Stopping an instance while a node fetches its share ends the fetch (on a link shaped to 16 Mbit/s
/// so that it is still running): the stage never starts, and no more bytes arrive.
#[test]
fn stopping_an_instance_ends_the_fetch_of_a_share() {
    let _one_at_a_time = common::cluster::exclusive();
    let mut c = TestCluster::new(2);
    if c.network != Network::Netns {
        common::cannot_run("shaping a link needs network namespaces");
        return;
    }
    c.private_disks = true;
    let model = model_on_node0(&c);
    c.form(&[]);
    let bridge = c.bridge_namespace().unwrap().to_string();
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &bridge, "tc", "qdisc", "add", "dev", "p1", "root", "tbf"])
        .args(["rate", "16mbit", "burst", "32kbit", "latency", "50ms"])
        .output()
        .unwrap();
    assert!(out.status.success(), "tc: {}", String::from_utf8_lossy(&out.stderr));

    let body = json!({ "model": model, "layers": "node0:0-9,node1:10-29", "context": 256, "sequences": 1 });
    let (status, launched) = c.post_json(0, "/api/instances", body);
    assert_eq!(status, 200, "{launched}");
    let id = launched["id"].as_str().unwrap().to_string();
    let fetching = || {
        let info = c.get_json(0, &format!("/api/instances/{id}"));
        info["stages"][1]["state"] == "fetching" && info["stages"][1]["fetch"]["bytes_done"].as_u64() > Some(2 << 20)
    };
    c.wait_for(std::time::Duration::from_secs(30), "node1 fetching its share", fetching);
    stop(&c, &id);
    c.wait_for(std::time::Duration::from_secs(15), "the fetch to end", || {
        std::fs::read_to_string(&c.nodes[1].log).unwrap().contains("was stopped")
    });
    let (_, before, _) = shard_on(&c, 1);
    std::thread::sleep(std::time::Duration::from_secs(2));
    let (_, after, _) = shard_on(&c, 1);
    assert_eq!(before.present, after.present, "bytes still arrive after the stop");
    assert!(after.layers.is_empty(), "the share is not complete: {:?}", after.layers);
    let info = c.get_json(0, &format!("/api/instances/{id}"));
    assert_eq!(info["state"], "stopped");
    assert_ne!(info["stages"][1]["state"], "ready", "{info:#}");
}

/// Whether every byte of `range` is present in the shard (`true`) or none is (`false`); panics when
/// part of it is.
fn present(record: &shard::ShardRecord, range: Range<u64>) -> bool {
    let covered: u64 =
        record.present.iter().map(|p| p.end.min(range.end).saturating_sub(p.start.max(range.start))).sum();
    assert!(covered == 0 || covered == range.end - range.start, "{range:?} is partly present ({covered} bytes)");
    covered > 0
}

/// A tensor-parallel rank on a node without the model fetches only its slice of every layer: the
/// header, the token embeddings (every rank holds them whole), and of a tensor split by rows (Q, the
/// gate) only its rows; one split by columns (the down projection) comes whole, in one run. The group
/// answers as the same group in one process does.
#[test]
fn a_tensor_parallel_rank_fetches_only_its_slice_of_every_layer() {
    let _one_at_a_time = common::cluster::exclusive();
    let mut c = TestCluster::new(2);
    if c.network != Network::Netns {
        return common::cannot_run("tensor-parallel instances need network namespaces (root)");
    }
    c.private_disks = true;
    let model = model_on_node0(&c);
    let size = std::fs::metadata(&model).unwrap().len();
    c.form(&[]);
    let launch = ["run", model.to_str().unwrap(), "--parallel", "tensor", "--nodes", "node0,node1"];
    let settings = ["--context", "256", "--sequences", "2", "--threads", "1"];
    let preview = c.cli(0, &[&launch[..], &settings, &["--preview"]].concat());
    let text = String::from_utf8_lossy(&preview.stdout);
    assert!(text.contains("share from node0"), "the preview says node1 fetches its share: {text}");

    // What node1 would fetch, as the preview says it.
    let body = json!({ "model": model, "parallel": "tensor", "nodes": ["node0", "node1"], "context": 256,
        "sequences": 2, "threads": 1, "name": "preview" });
    let (status, previewed) = c.post_json(0, "/api/placements/preview", body);
    assert_eq!(status, 200, "{previewed}");
    let said = previewed["fetches"][1]["bytes"].as_u64().unwrap_or(0);
    let out = c.cli(0, &[&launch[..], &settings].concat());
    assert!(out.status.success(), "shoal run failed: {}\n{}", String::from_utf8_lossy(&out.stderr), c.logs());
    let instances = c.get_json(0, "/api/instances");
    let instance = instances.as_array().unwrap().iter().find(|i| i["state"] == "ready").cloned().unwrap();
    assert_eq!(instance["plan"]["parallel"], "tensor");
    assert_eq!(instance["stages"][0]["fetch"], Value::Null, "the owner has the whole file");
    let fetch = &instance["stages"][1]["fetch"];
    assert_eq!(fetch["done"], true, "{instance:#}");

    let (path, record, on_disk) = shard_on(&c, 1);
    assert_eq!(record.slices, vec!["rank 1 of 2".to_string()], "{}", path.display());
    assert!(record.layers.is_empty(), "no layer is held whole: {:?}", record.layers);
    let listed = std::process::Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args(["models", "--data-dir"])
        .arg(&c.nodes[1].data_dir)
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.contains("(shard: rank 1 of 2's slice)"), "shoal models on node1: {listed}");
    let table = table();
    let tensor = |name: &str| table.tensors.iter().find(|t| t.name == name).unwrap();
    // Every rank holds the token embeddings whole (the tied output head's rows are among them).
    let embedding = tensor("token_embd.weight");
    assert!(present(&record, embedding.offset..embedding.offset + embedding.bytes));
    // The shares follow the nodes' measured weight rates (equal nodes measure close, not equal): what
    // rank 1 holds is what the plan's shares give it.
    let shares: Vec<f64> =
        instance["plan"]["stages"].as_array().unwrap().iter().map(|s| s["share"].as_f64().unwrap()).collect();
    let slices = shoal::model::slice::plan(&shoal::model::Model::open(&model).unwrap(), &shares).unwrap();
    let (heads, columns) = (slices[1].query_heads.clone(), slices[1].feed_forward.clone());
    assert_eq!((heads.end, columns.end), (9, 1536), "rank 1 holds the last heads and columns: {shares:?}");
    eprintln!("shares {shares:?}: rank 1 holds query heads {heads:?} and feed-forward columns {columns:?}");
    for layer in [0, 17, 29] {
        // Q: 576 rows, 64 per head; rank 1 holds the rows of its heads.
        let q = tensor(&format!("blk.{layer}.attn_q.weight"));
        let (row, first) = (q.bytes / 576, heads.start as u64 * 64);
        assert!(!present(&record, q.offset..q.offset + first * row), "layer {layer}: rank 0's heads of Q");
        assert!(present(&record, q.offset + first * row..q.offset + q.bytes), "layer {layer}: rank 1's heads of Q");
        // The gate: 1536 rows; rank 1 holds the rows of its feed-forward columns.
        let gate = tensor(&format!("blk.{layer}.ffn_gate.weight"));
        let (row, first) = (gate.bytes / 1536, columns.start as u64);
        assert!(!present(&record, gate.offset..gate.offset + first * row), "layer {layer}: rank 0's rows of the gate");
        assert!(present(&record, gate.offset + first * row..gate.offset + gate.bytes), "layer {layer}: rank 1's rows");
        // The down projection is split by columns, a piece of each of its 576 rows 480 bytes apart:
        // fetched whole, in one run, rather than piece by piece.
        let down = tensor(&format!("blk.{layer}.ffn_down.weight"));
        assert!(present(&record, down.offset..down.offset + down.bytes), "layer {layer}: the down projection");
    }
    // What came over is what the preview said (the header and the merged pieces), give or take what
    // came with the header's last chunk; a fifth of this small model less than the file (its
    // embeddings, which every rank holds, are a third of it).
    let fetched = fetch["bytes_fetched"].as_u64().unwrap();
    assert!((said..said + (4 << 20)).contains(&fetched), "fetched {fetched} where the preview said {said}");
    assert!(record.present_bytes() <= fetched && fetched < size - size / 6, "fetched {fetched} of {size}");
    assert!(on_disk < fetched + (1 << 20), "{} takes {on_disk} bytes on disk", path.display());

    for case in &common::oracle_greedy()[..2] {
        let body =
            json!({ "model": MODEL, "prompt": case.prompt, "max_tokens": 16, "temperature": 0, "ignore_eos": true });
        let (status, answer) = c.post_json(1, "/v1/completions", body);
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["choices"][0]["text"], common::group_process(&case.prompt, 16, &shares), "{:?}", case.prompt);
    }
    // Launched again, node1 finds its slice in the shard: the preview says so, and nothing moves.
    stop(&c, instance["id"].as_str().unwrap());
    c.wait_for(std::time::Duration::from_secs(15), "the instance to stop", || {
        c.get_json(0, "/api/instances").as_array().unwrap().iter().all(|i| i["state"] != "ready")
    });
    let body = json!({ "model": model, "parallel": "tensor", "nodes": ["node0", "node1"], "context": 256,
        "sequences": 2, "threads": 1, "name": "preview" });
    let (status, previewed) = c.post_json(0, "/api/placements/preview", body);
    assert_eq!(status, 200, "{previewed}");
    assert_eq!(previewed["fetches"][1], Value::Null, "node1's shard holds its slice: {previewed:#}");
    let out = c.cli(0, &[&launch[..], &settings].concat());
    assert!(out.status.success(), "shoal run failed: {}\n{}", String::from_utf8_lossy(&out.stderr), c.logs());
    let instances = c.get_json(0, "/api/instances");
    let again = instances.as_array().unwrap().iter().find(|i| i["state"] == "ready").cloned().unwrap();
    assert_eq!(again["stages"][1]["fetch"], Value::Null, "{again:#}");
}
