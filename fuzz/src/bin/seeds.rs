//! Writes the seed corpora, `fuzz/corpus/<target>/`, from real messages made with the core crate's own
//! encoders, plus a small GGUF file built from the metadata of the test model when `SHOAL_SEED_MODEL`
//! names it. Run by hand when a format changes; the corpora are committed. It is built with the
//! harness's instrumentation, so it links libFuzzer and does its work in libFuzzer's init hook.
#![no_main]
#![allow(unreachable_code)]

use shoal::cluster::membership::{ClusterSecret, MemberRecord};
use shoal::cluster::messages::{self, ControlMessage, JoinMessage};
use shoal::cluster::pairing;
use shoal::engine::hidden::{HiddenStates, WireFormat};
use shoal::engine::SamplingParams;
use shoal::model::{GgufHeader, Value};
use shoal::net::{ConnectionKind, Preamble};
use shoal::node::NodeId;
use shoal::transport::frame::{Records, RingFrame, Sampled, StepRows};
use shoal::transport::ring::wire::{Backward, Forward};
use std::path::{Path, PathBuf};

libfuzzer_sys::fuzz_target!(
    init: {
        write_seeds();
        std::process::exit(0);
    },
    |_data: &[u8]| {}
);

fn write_seeds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let model = std::env::var("SHOAL_SEED_MODEL").ok();
    let mut n = 0;
    let mut put = |target: &str, name: &str, bytes: &[u8]| {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir).expect("corpus folder");
        std::fs::write(dir.join(name), bytes).expect("seed written");
        n += 1;
    };
    let with = |first: u8, rest: &[u8]| [&[first][..], rest].concat();

    let member = MemberRecord {
        id: NodeId(uuid::Uuid::from_u128(0x1234_5678_9abc_def0_1234_5678_9abc_def0)),
        name: "studio".into(),
        control: vec!["192.0.2.7:7420".parse().unwrap(), "[2001:db8::7]:7420".parse().unwrap()],
        api_port: 8080,
    };
    let controls = [
        ("hello", ControlMessage::Hello { node: member.clone() }),
        ("ping", ControlMessage::Ping { seq: 42 }),
        ("pong", ControlMessage::Pong { seq: 42, busy: true }),
        ("members", ControlMessage::Members { members: vec![member.clone(), member.clone()] }),
        ("measure", ControlMessage::MeasureLink { peer: member.id, request: 7 }),
        ("measured", ControlMessage::LinkMeasured { request: 7, bps: Some(9_400_000_000) }),
        ("leaving", ControlMessage::Leaving),
        ("stop", ControlMessage::StopInstance { instance: "inst-1".into() }),
        (
            "connect",
            ControlMessage::ConnectStage { instance: "inst-1".into(), stage: 1, next_node: member.id, next_port: 7421 },
        ),
        ("cancel", ControlMessage::CancelGenerate { call: 3 }),
    ];
    for (name, message) in &controls {
        put("control", &format!("frame-{name}"), &with(0, &messages::encode(message)));
    }
    // Records form: a length byte and a record (flags byte, chunk), the hello split in two records.
    let hello = messages::encode(&controls[0].1);
    let (a, b) = hello.split_at(hello.len() / 2);
    let mut records = vec![1];
    for (flags, chunk) in [(1u8, a), (0, b)] {
        records.push(chunk.len() as u8 + 1);
        records.push(flags);
        records.extend_from_slice(chunk);
    }
    put("control", "records-hello", &records);
    put("control", "preamble-member", &with(0, &Preamble { kind: ConnectionKind::Member }.bytes()));

    for b in 0..=4 {
        put("pairing", &format!("refusal-{b}"), &[0, b]);
    }
    put("pairing", "code", &with(1, b"abcd-2345"));
    put("pairing", "code-typo", &with(1, b"ABCD 23O5"));
    put("pairing", "spake", &with(2, &pairing::start("WXYZ6789").1));
    put("pairing", "join-request", &with(3, &messages::encode(&JoinMessage::Request { node: member.clone() })));
    let secret = ClusterSecret::from_hex(&"ab".repeat(32)).expect("hex secret");
    let accepted = JoinMessage::Accepted { secret, members: vec![member] };
    put("pairing", "join-accepted", &with(3, &messages::encode(&accepted)));

    let mut hidden32 = Vec::new();
    HiddenStates::encode(4, 2, &[0.5, -1.0, 2.25, 0.0, 1e-3, 7.0, -0.125, 3.5], WireFormat::F32, &mut hidden32);
    let mut hidden16 = Vec::new();
    HiddenStates::encode(2, 2, &[0.5, -1.0, 2.25, 0.0], WireFormat::F16, &mut hidden16);
    put("ring", "hidden-f32", &hidden32);
    put("ring", "hidden-f16", &hidden16);
    let rows = [StepRows { request: 9, slot: 1, start: 0, tokens: 2, sample: true, drafted: 1 }];
    let sampled = [Sampled { request: 9, slot: 1, token: 1234 }];
    let frames = [
        ("begin", RingFrame::Begin { request: 9, slot: 1, sampling: SamplingParams::default(), recent: vec![1, 2, 3] }),
        ("forward", RingFrame::Forward { rows: Records::Items(&rows), compute_us: 310, hidden: &hidden32 }),
        ("token", RingFrame::Tokens { tokens: Records::Items(&sampled), compute_us: 80 }),
        ("draft", RingFrame::Draft { request: 9, slot: 1, tokens: vec![17, 4, 4096] }),
        ("end", RingFrame::End { request: 9, slot: 1 }),
        ("failed", RingFrame::Failed { request: 9, slot: 1, message: "stage 2 lost its GPU".into() }),
    ];
    let mut out = Vec::new();
    let mut wired = Vec::new();
    for (name, frame) in &frames {
        frame.encode(&mut out);
        put("ring", &format!("frame-{name}"), &out);
        Forward::Frame { seq: 5, bytes: &out }.encode(&mut wired);
        put("ring", &format!("wire-{name}"), &wired);
    }
    Forward::Switch { from: 6 }.encode(&mut wired);
    put("ring", "wire-switch", &wired);
    put("ring", "wire-ack", &Backward::Ack { seq: 5 }.encode());
    put("ring", "wire-fallback", &Backward::Fallback { from: 3, reason: "slot damaged".into() }.encode());
    put("ring", "hello-tcp", br#"{"rdma":null}"#);
    put("ring", "answer-refused", br#"{"endpoint":null,"refused":"no RDMA device here"}"#);
    put("ring", "group-switch", br#"{"control":"switch","received":3,"reason":"lost"}"#);
    put("ring", "group-probe", br#"{"control":"probe","received":3}"#);
    put("ring", "group-status", br#"{"control":"status","sent":4}"#);
    put("ring", "group-connected", br#"{"failed":null}"#);

    put("peer_copy", "list", br#"{"request":"list"}"#);
    put("peer_copy", "fetch", br#"{"request":"fetch","name":"m.gguf","size":1000,"ranges":[[0,100],[500,500]]}"#);
    put("peer_copy", "header", br#"{"error":null,"file":{"name":"m.gguf","size":1000,"repo":"org/m","sha256":null}}"#);
    put("peer_copy", "header-error", br#"{"error":"no complete file m.gguf of 1000 bytes here","file":null}"#);
    put("peer_copy", "trailer", format!(r#"{{"sha256":"{}"}}"#, "0f".repeat(32)).as_bytes());
    put(
        "peer_copy",
        "files",
        br#"[{"name":"m.gguf","size":1000,"repo":null,"sha256":null},{"name":"big.gguf","size":9,"repo":null,"sha256":null,"layers":"10-19"}]"#,
    );

    let record = br#"{"source":"https://example.org/m.gguf","size":4096,"sha256":null,"header_bytes":512,"layers":[{"start":0,"end":4},{"start":6,"end":8}],"present":[{"start":0,"end":512},{"start":1024,"end":2048}]}"#;
    put("shard", "record", &with(0, record));
    put("shard", "layers-range", &with(1, b"10-19"));
    put("shard", "layers-one", &with(1, b"7"));
    put("shard", "assignment", &with(2, b"studio:0-14, mini:15-29"));

    let bodies: [(&str, &[u8]); 10] = [
        ("chat_completions", br#"{"model":"smollm2","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"Hi"}]}],"max_tokens":16,"temperature":0.7,"stop":["\n"],"stream":true,"stream_options":{"include_usage":true},"tools":[{"type":"function","function":{"name":"add","parameters":{"type":"object"}}}],"tool_choice":"auto"}"#),
        ("completions", br#"{"model":"smollm2","prompt":"Once upon a time","max_tokens":8,"top_p":0.9,"seed":1}"#),
        ("messages", br#"{"model":"smollm2","max_tokens":32,"system":"Be brief.","messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"add","input":{"a":1}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"2"}]}],"tools":[{"name":"add","input_schema":{"type":"object"}}],"top_k":40}"#),
        ("ollama_chat", br#"{"model":"smollm2:latest","messages":[{"role":"user","content":"Hi"}],"stream":false,"options":{"num_predict":16,"temperature":0.2,"stop":["."]}}"#),
        ("ollama_generate", br#"{"model":"smollm2","prompt":"Why is the sky blue?","system":"Be brief.","raw":false,"options":{"num_predict":-1}}"#),
        ("ollama_show", br#"{"name":"smollm2"}"#),
        ("launch", br#"{"model":"/models/SmolLM2-135M-Instruct.Q4_1.gguf","layers":"studio:0-14,mini:15-29"}"#),
        ("copy", br#"{"from":"studio","file":"SmolLM2-135M-Instruct.Q4_1.gguf","size":98362432}"#),
        ("pull", br#"{"repo":"bartowski/SmolLM2-135M-Instruct-GGUF:Q4_1","layers":"0-14"}"#),
        ("join", br#"{"code":"ABCD-2345@192.0.2.7:7420"}"#),
    ];
    for (endpoint, body) in bodies {
        let pick = shoal::api::CHECKED_BODIES.iter().position(|e| *e == endpoint).expect("a checked endpoint");
        put("api", endpoint, &with(pick as u8, body));
    }

    if let Some(model) = model {
        let (prefix, small) = gguf_seeds(Path::new(&model));
        put("gguf", "model-prefix", &prefix);
        put("gguf", "model-small", &small);
    }
    println!("wrote {n} seeds under {}", root.display());
}

/// From the test model: its first 4 KiB (a real header, truncated), and a small whole GGUF file with
/// its metadata less the tokenizer's and two small tensors of its own.
fn gguf_seeds(model: &Path) -> (Vec<u8>, Vec<u8>) {
    let bytes = std::fs::read(model).expect("the model file is readable");
    let header = GgufHeader::parse(&PathBuf::from(model), &bytes).expect("the model's header parses");
    let mut out = b"GGUF".to_vec();
    out.extend_from_slice(&3u32.to_le_bytes());
    let metadata: Vec<_> = header.metadata.iter().filter(|(k, _)| !k.starts_with("tokenizer.")).collect();
    let embedding =
        header.metadata.iter().find(|(k, _)| k.ends_with(".embedding_length")).and_then(|(_, v)| v.as_u64());
    let width = embedding.expect("the model names its embedding length");
    out.extend_from_slice(&2u64.to_le_bytes());
    out.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (key, value) in metadata {
        string(&mut out, key);
        value_bytes(&mut out, value, true);
    }
    for (i, name) in ["output_norm.weight", "blk.0.attn_norm.weight"].iter().enumerate() {
        string(&mut out, name);
        out.extend_from_slice(&1u32.to_le_bytes());
        out.extend_from_slice(&width.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes()); // f32
        out.extend_from_slice(&(i as u64 * width * 4).div_ceil(32).checked_mul(32).unwrap().to_le_bytes());
    }
    out.resize(out.len().div_ceil(32) * 32, 0);
    out.resize(out.len() + 2 * (width as usize * 4).div_ceil(32) * 32, 0);
    (bytes[..4096].to_vec(), out)
}

fn string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn type_id(value: &Value) -> u32 {
    match value {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

/// A metadata value in GGUF's layout (with its type id first when `typed`).
fn value_bytes(out: &mut Vec<u8>, value: &Value, typed: bool) {
    if typed {
        out.extend_from_slice(&type_id(value).to_le_bytes());
    }
    match value {
        Value::U8(v) => out.push(*v),
        Value::I8(v) => out.push(*v as u8),
        Value::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::Bool(v) => out.push(*v as u8),
        Value::String(s) => string(out, s),
        Value::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::Array(items) => {
            out.extend_from_slice(&items.first().map_or(4, type_id).to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                value_bytes(out, item, false);
            }
        }
    }
}
