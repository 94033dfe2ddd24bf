//! Split GGUF sets move like single files. A 3-node launch of a set that one node holds (each node sees
//! only its own disk): the other two fetch, of each part, its header and the tensors their stage reads
//! from it — counted here from the parts' own GGUF headers, tensor by name — and the instance
//! generates what the single file does (also for a mixture-of-experts set); "Copy here" then brings
//! every part (and onto a node without any, copies every part; a member lacking one is refused). With
//! no member holding the set whole, each part's share comes from a loopback hub.
//! `pull --layers` of a set from the hub fetches each part's share, and a pull without `--layers`
//! completes every part.

mod common;

use common::cluster::{Network, TestCluster};
use common::hub::{start_hub_with, Faults, LoopbackHub, REPO};
use common::{random_model, split_gguf};
use serde_json::{json, Value};
use shoal::model::library::Library;
use shoal::model::pull::{self, Hub, PullRequest};
use shoal::model::{peer_copy, shard, GgufFile};
use shoal::node::DataDir;
use std::ops::Range;
use std::path::{Path, PathBuf};

const REPO_DIR: &str = "HuggingFaceTB--SmolLM2-135M-Instruct-GGUF";
const PREFIX: &str = "SmolLM2-set";
const PARTS: usize = 3;
/// SmolLM2-135M's layers.
const LAYERS: usize = 30;
/// The random GLM-4.5-style model's layers (its next-token-prediction layer, `blk.5`, is never read).
const GLM_LAYERS: usize = 5;
/// The header is read in chunks growing from 1 MiB: at most this much of a part comes over past it.
const HEADER_SLACK: u64 = 4 << 20;

/// Whether a stage of `layers` reads the tensor `name`: its layers' blocks, the embedding on the first
/// stage, the final norm and the output head on the last (the embedding when the file has no head of
/// its own, tied to it), and RoPE factors on every stage; of a model of `model_layers` layers.
fn stage_reads(name: &str, layers: &Range<usize>, model_layers: usize, own_head: bool) -> bool {
    if let Some(rest) = name.strip_prefix("blk.") {
        let layer: usize = rest.split('.').next().unwrap().parse().unwrap();
        return layers.contains(&layer);
    }
    match name {
        "token_embd.weight" => layers.start == 0 || (layers.end == model_layers && !own_head),
        "output_norm.weight" | "output.weight" => layers.end == model_layers,
        "rope_freqs.weight" => true,
        other => panic!("a tensor this test does not place: {other}"),
    }
}

/// What a stage of `layers` needs of each part at `parts`, from the parts' headers: the header's
/// bytes, the byte ranges of the tensors it reads there, and those of the tensors it does not.
struct PartShare {
    header: u64,
    reads: Vec<Range<u64>>,
    skips: Vec<Range<u64>>,
}

impl PartShare {
    fn bytes(&self) -> u64 {
        self.header + self.reads.iter().map(|r| r.end - r.start).sum::<u64>()
    }
}

fn shares(parts: &[PathBuf], layers: &Range<usize>, model_layers: usize) -> Vec<PartShare> {
    let files: Vec<GgufFile> = parts.iter().map(|p| GgufFile::open(p).unwrap()).collect();
    let own_head = files.iter().any(|f| f.tensors().iter().any(|t| t.name == "output.weight"));
    files
        .iter()
        .map(|file| {
            let (mut reads, mut skips) = (Vec::new(), Vec::new());
            for t in file.tensors() {
                let bytes = t.offset..t.offset + t.bytes;
                if stage_reads(&t.name, layers, model_layers, own_head) {
                    reads.push(bytes);
                } else {
                    skips.push(bytes);
                }
            }
            PartShare { header: file.data_offset(), reads, skips }
        })
        .collect()
}

/// The shard of one part at `path` holds the header and exactly the tensors the stage reads from it:
/// all of them, none of the others, and nothing else but the alignment padding between neighbours.
fn assert_holds_share(path: &Path, share: &PartShare, layers: &Range<usize>) {
    let record = shard::read_record(path).unwrap().unwrap_or_else(|| panic!("{} is not a shard", path.display()));
    assert_eq!(record.layers, vec![layers.clone()], "{}", path.display());
    assert_eq!(record.header_bytes, share.header, "{}", path.display());
    assert!(record.covers(&(0..share.header)), "{}: the header is missing", path.display());
    for r in &share.reads {
        assert!(record.covers(r), "{}: bytes {r:?} of the stage's tensors are missing", path.display());
    }
    for r in &share.skips {
        let overlaps = record.present.iter().any(|p| p.start < r.end && r.start < p.end);
        assert!(!overlaps, "{}: bytes {r:?} of a tensor the stage does not read were kept", path.display());
    }
    let padding = record.present_bytes() - share.bytes();
    assert!(padding < 32 * (share.reads.len() as u64 + 1), "{}: {padding} bytes besides the share", path.display());
}

/// Splits SmolLM2 into a set in node0's models folder, as `shoal pull` leaves one; returns its parts.
fn set_on_node0(c: &TestCluster) -> Vec<PathBuf> {
    let folder = c.nodes[0].data_dir.join("models").join(REPO_DIR);
    std::fs::create_dir_all(&folder).unwrap();
    split_gguf::split(&common::model_path(), &folder, PREFIX, PARTS)
}

#[test]
fn a_three_node_launch_of_a_set_on_one_node_moves_each_node_only_its_share_of_each_part() {
    let _one_at_a_time = common::cluster::exclusive();
    let mut c = TestCluster::new(3);
    c.private_disks = true;
    let parts = set_on_node0(&c);
    c.form(&[]);
    let node0 =
        c.get_json(0, "/api/cluster")["nodes"].as_array().unwrap().iter().find(|n| n["name"] == "node0").unwrap()["id"]
            .clone();

    let layers = "node0:0-9,node1:10-19,node2:20-29";
    let stages = [(1, 10..20), (2, 20..30)];
    let body = json!({ "model": parts[0], "layers": layers, "context": 256, "sequences": 2 });
    let (status, preview) = c.post_json(0, "/api/placements/preview", body);
    assert_eq!(status, 200, "{preview}");
    assert_eq!(preview["fetches"][0], Value::Null, "the owner holds the set: {preview}");
    for (i, layers) in &stages {
        let share: u64 = shares(&parts, layers, LAYERS).iter().map(PartShare::bytes).sum();
        assert_eq!(preview["fetches"][i]["bytes"], share, "every part's header and tensors: {preview}");
        assert_eq!(preview["fetches"][i]["from"], "node0", "{preview}");
    }

    let instance = c.launch_ready(&parts[0], layers);
    for (i, layers) in &stages {
        let fetch = &instance["stages"][i]["fetch"];
        assert_eq!((fetch["done"].clone(), fetch["from_node"].clone()), (json!(true), node0.clone()), "{instance:#}");
        let shares = shares(&parts, layers, LAYERS);
        let share: u64 = shares.iter().map(PartShare::bytes).sum();
        let fetched = fetch["bytes_fetched"].as_u64().unwrap();
        assert!(
            (share..share + PARTS as u64 * HEADER_SLACK).contains(&fetched),
            "node{i} fetched {fetched} bytes for a share of {share}"
        );
        let here = c.nodes[*i].data_dir.join("models").join(REPO_DIR);
        for (part, share) in parts.iter().zip(&shares) {
            let path = here.join(part.file_name().unwrap());
            assert_eq!(std::fs::metadata(&path).unwrap().len(), std::fs::metadata(part).unwrap().len());
            assert_holds_share(&path, share, layers);
        }
    }
    // The set's shards are listed with their layers and never offered for a copy.
    let files = c.get_json(1, "/api/models/cluster");
    let node1 = files.as_array().unwrap().iter().find(|n| n["name"] == "node1").unwrap()["files"].clone();
    assert_eq!(node1.as_array().unwrap().len(), PARTS, "{files:#}");
    assert!(node1.as_array().unwrap().iter().all(|f| f["layers"] == "10-19"), "{files:#}");

    let name = c.get_json(2, "/v1/models")["data"][0]["id"].as_str().unwrap().to_string();
    for case in &common::oracle_greedy()[..2] {
        let body =
            json!({ "model": name, "prompt": case.prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": true });
        let (status, answer) = c.post_json(2, "/v1/completions", body);
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["choices"][0]["text"], common::single_process(&case.prompt, 24), "{:?}", case.prompt);
    }

    // "Copy here" of the set onto node1's shards completes every part.
    let part_name = |i: usize| parts[i].file_name().unwrap().to_str().unwrap().to_string();
    let (status, refused) = c.post_json(0, "/api/models/copy", json!({ "from": "node1", "file": part_name(0) }));
    assert_eq!(status, 400, "a shard of a set cannot be copied: {refused}");
    let (status, started) = c.post_json(1, "/api/models/copy", json!({ "from": "node0", "file": part_name(0) }));
    assert_eq!(status, 200, "{started}");
    let here = c.nodes[1].data_dir.join("models").join(REPO_DIR);
    c.wait_for(std::time::Duration::from_secs(60), "every part completed", || {
        (0..PARTS).all(|i| !shard::is_shard(&here.join(part_name(i))))
    });
    for (i, part) in parts.iter().enumerate() {
        assert!(std::fs::read(here.join(part_name(i))).unwrap() == std::fs::read(part).unwrap(), "part {}", i + 1);
    }
}

/// The same with a mixture-of-experts set (GLM-4.5 style: leading dense layers, experts, a shared
/// expert, a next-token-prediction layer no stage reads): each node fetches its layers' experts from
/// whichever parts hold them, and the instance generates what the single file does.
#[test]
fn a_moe_set_on_one_node_moves_each_node_its_layers_experts() {
    let _one_at_a_time = common::cluster::exclusive();
    let source = random_model::glm4moe().write();
    let mut c = TestCluster::new(3);
    c.private_disks = true;
    let folder = c.nodes[0].data_dir.join("models");
    std::fs::create_dir_all(&folder).unwrap();
    let parts = split_gguf::split(&source, &folder, "glm-moe", PARTS);
    c.form(&[]);
    let instance = c.launch_ready(&parts[0], "node0:0-0,node1:1-2,node2:3-4");
    for (i, layers) in [(1, 1..3), (2, 3..5)] {
        let shares = shares(&parts, &layers, GLM_LAYERS);
        let share: u64 = shares.iter().map(PartShare::bytes).sum();
        let fetched = instance["stages"][i]["fetch"]["bytes_fetched"].as_u64().unwrap();
        assert!(
            (share..share + PARTS as u64 * HEADER_SLACK).contains(&fetched),
            "node{i} fetched {fetched} bytes for a share of {share}"
        );
        for (part, share) in parts.iter().zip(&shares) {
            assert_holds_share(&c.nodes[i].data_dir.join("models").join(part.file_name().unwrap()), share, &layers);
        }
    }
    let name = c.get_json(2, "/v1/models")["data"][0]["id"].as_str().unwrap().to_string();
    let prompt = "Mixture of experts";
    let body = json!({ "model": name, "prompt": prompt, "max_tokens": 16, "temperature": 0, "ignore_eos": true });
    let (status, answer) = c.post_json(2, "/v1/completions", body);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["choices"][0]["text"], common::single_process_of(&source, prompt, 16));
}

/// "Copy here" of a part of a set copies every part, byte for byte; a member lacking a part of the set
/// is refused, naming the part.
#[test]
fn copy_here_of_a_part_copies_the_whole_set() {
    let _one_at_a_time = common::cluster::exclusive();
    let mut c = TestCluster::new(2);
    let parts = set_on_node0(&c);
    let (third, kept) = (parts[2].clone(), parts[2].with_file_name("kept"));
    std::fs::rename(&third, &kept).unwrap();
    c.form(&[]);
    let first = parts[0].file_name().unwrap().to_str().unwrap();
    let (status, refused) = c.post_json(1, "/api/models/copy", json!({ "from": "node0", "file": first }));
    assert_eq!(status, 400, "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("-00003-of-00003.gguf, part 3"), "{refused}");

    std::fs::rename(&kept, &third).unwrap();
    let (status, started) = c.post_json(1, "/api/models/copy", json!({ "from": "node0", "file": first }));
    assert_eq!(status, 200, "{started}");
    let here = c.nodes[1].data_dir.join("models").join(REPO_DIR);
    assert_eq!(started["path"], json!(here.join(first)), "{started}");
    let copied = |part: &PathBuf| here.join(part.file_name().unwrap());
    c.wait_for(std::time::Duration::from_secs(60), "every part copied", || parts.iter().all(|p| copied(p).exists()));
    for part in &parts {
        assert!(std::fs::read(copied(part)).unwrap() == std::fs::read(part).unwrap(), "{} differs", part.display());
    }
    let (status, again) = c.post_json(1, "/api/models/copy", json!({ "from": "node0", "file": first }));
    assert_eq!(status, 400, "the set is here already: {again}");
}

/// A hub holding the set `PREFIX-0000N-of-00003.gguf` made from SmolLM2, and the parts it serves.
fn hub_with_set() -> (LoopbackHub, tempfile::TempDir, Vec<PathBuf>) {
    let dir = tempfile::tempdir().unwrap();
    let parts = split_gguf::split(&common::model_path(), dir.path(), PREFIX, PARTS);
    let hosted = parts
        .iter()
        .map(|p| (p.file_name().unwrap().to_str().unwrap().to_string(), std::fs::read(p).unwrap()))
        .collect();
    (start_hub_with(hosted, Faults::default()), dir, parts)
}

/// No member holds the set whole (the owner pulled only its own layers of each part): the other node
/// fetches each part's share from the hub, by range requests for its tensors only.
#[test]
fn with_no_member_holding_the_whole_set_each_parts_share_comes_from_the_hub() {
    let _one_at_a_time = common::cluster::exclusive();
    let (hub, _dir, parts) = hub_with_set();
    let hf_home = tempfile::tempdir().unwrap();
    let mut c = TestCluster::with_network(2, Network::Loopback);
    // The nodes get the hub's address (and an empty Hugging Face cache); this process's environment,
    // which other tests share, stays as it is.
    c.env.push(("HF_ENDPOINT".into(), hub.endpoint.clone()));
    c.env.push(("HF_HOME".into(), hf_home.path().display().to_string()));
    c.private_disks = true;
    let first = parts[0].file_name().unwrap().to_str().unwrap();
    let request = PullRequest::parse(&format!("{REPO}:{first}")).unwrap();
    let owner_models = c.nodes[0].data_dir.join("models");
    let model = shard::pull_shard(&Hub::new(&hub.endpoint, None), &owner_models, &request, 0..10, &mut |_| {}).unwrap();
    c.form(&[]);
    hub.clear();

    let instance = c.launch_ready(&model, "node0:0-9,node1:10-29");
    let fetch = &instance["stages"][1]["fetch"];
    assert_eq!((fetch["done"].clone(), fetch["from_node"].clone()), (json!(true), Value::Null), "{instance:#}");
    assert!(fetch["from"].as_str().unwrap().contains(REPO), "{fetch}");
    let served: u64 = hub.served().iter().map(|s| s.bytes).sum();
    assert_eq!(served, fetch["bytes_fetched"].as_u64().unwrap(), "the hub served exactly what node1 fetched");
    let here = c.nodes[1].data_dir.join("models").join(REPO.replace('/', "--"));
    for (part, share) in parts.iter().zip(shares(&parts, &(10..30), LAYERS)) {
        assert_holds_share(&here.join(part.file_name().unwrap()), &share, &(10..30));
    }
    let name = c.get_json(1, "/v1/models")["data"][0]["id"].as_str().unwrap().to_string();
    let prompt = &common::oracle_greedy()[0].prompt;
    let body = json!({ "model": name, "prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": true });
    let (status, answer) = c.post_json(1, "/v1/completions", body);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["choices"][0]["text"], common::single_process(prompt, 24));
}

#[test]
fn pull_layers_of_a_set_fetches_each_parts_share_and_a_whole_pull_completes_them() {
    let (hub, _dir, parts) = hub_with_set();
    let data = tempfile::tempdir().unwrap();
    let library = Library::new(&DataDir::new(Some(data.path())).unwrap());
    let first = parts[0].file_name().unwrap().to_str().unwrap();
    let request = PullRequest::parse(&format!("{REPO}:{first}")).unwrap();
    let hub_client = Hub::new(&hub.endpoint, None);
    let layers = shard::parse_layers("10-19").unwrap();
    let path = shard::pull_shard(&hub_client, &library.models_dir(), &request, layers.clone(), &mut |_| {}).unwrap();
    assert_eq!(path.file_name().unwrap(), first, "the set opens from its first part");

    let shares = shares(&parts, &layers, LAYERS);
    let mut present = 0;
    for (part, share) in parts.iter().zip(&shares) {
        let path = path.with_file_name(part.file_name().unwrap());
        assert_holds_share(&path, share, &layers);
        present += shard::read_record(&path).unwrap().unwrap().present_bytes();
    }
    let served: u64 = hub.served().iter().map(|s| s.bytes).sum();
    let share: u64 = shares.iter().map(PartShare::bytes).sum();
    assert!((share..share + PARTS as u64 * HEADER_SLACK).contains(&served), "served {served} for a share of {share}");
    // The library lists the set once, as a shard of those layers, and offers none of its parts.
    let listed = library.list();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].parts.len(), PARTS);
    assert_eq!(listed[0].shard.as_ref().map(|s| s.ranges.clone()), Some(vec![layers.clone()]), "{listed:?}");
    assert!(!listed[0].runnable);
    assert!(peer_copy::offered_files(&library).is_empty(), "a shard is offered");

    // Without --layers, the pull fills every part's holes and checks each against the hub's sha256.
    hub.clear();
    let pulled = pull::pull(&hub_client, &library.models_dir(), &request, &mut |_| {}).unwrap();
    assert_eq!(pulled.len(), PARTS);
    for (part, pulled) in parts.iter().zip(&pulled) {
        assert!(!shard::is_shard(pulled), "{} is still a shard", pulled.display());
        assert!(std::fs::read(pulled).unwrap() == std::fs::read(part).unwrap(), "{} differs", pulled.display());
    }
    let completed: u64 = hub.served().iter().map(|s| s.bytes).sum();
    let total: u64 = parts.iter().map(|p| std::fs::metadata(p).unwrap().len()).sum();
    assert_eq!(completed, total - present, "only the holes came over");
    assert!(library.list()[0].runnable, "{:?}", library.list());
}
