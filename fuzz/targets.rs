//! The fuzz targets: one function per decoder family that reads network or file input, each taking the
//! raw bytes a peer, a file or an HTTP client could send. Shared by the libFuzzer binaries in
//! `fuzz/src/bin/` and by `tests/fuzz_corpus.rs`, which replays the committed corpora through them in a
//! plain `cargo test`. A target returns normally on any input; a panic is a bug in the decoder.

use shoal::cluster::messages::{self, ControlMessage, JoinMessage, MAX_CONTROL_FRAME};
use shoal::cluster::pairing;
use shoal::engine::hidden::{HiddenStates, WireFormat};
use shoal::model::{config::ModelConfig, peer_copy, shard, GgufFile, GgufHeader};
use shoal::net::{Preamble, Reassembler};
use shoal::transport::frame::RingFrame;
use shoal::transport::ring::{self, wire};
use std::path::Path;

/// A fuzz target: raw input in, a panic on a bug.
pub type Target = fn(&[u8]);

/// Every target by name, as `scripts/fuzz` and the corpus test list them.
pub const TARGETS: [(&str, Target); 7] = [
    ("control", control),
    ("pairing", pairing),
    ("ring", ring),
    ("peer_copy", peer_copy),
    ("gguf", gguf),
    ("shard", shard),
    ("api", api),
];

/// The first byte picks a variant of a target; the rest is the input.
fn split(data: &[u8]) -> (u8, &[u8]) {
    data.split_first().map_or((0, &[][..]), |(&b, rest)| (b, rest))
}

/// A member's control connection: the preamble, then frames. Even first byte: the rest is one frame's
/// plaintext; odd: records (a length byte, then that many bytes of record plaintext) reassembled into
/// frames under a small cap. Every frame is decoded as a control message, which must survive a round
/// trip.
pub fn control(data: &[u8]) {
    let (mode, rest) = split(data);
    if let Some(preamble) = rest.first_chunk::<{ Preamble::LEN }>() {
        if let Ok(p) = Preamble::parse(preamble) {
            assert_eq!(&p.bytes(), preamble);
        }
    }
    if mode % 2 == 0 {
        decode_control(rest);
        return;
    }
    let mut reassembler = Reassembler::new(4096.min(MAX_CONTROL_FRAME));
    let mut records = rest;
    while let Some((&len, tail)) = records.split_first() {
        let (record, tail) = tail.split_at((len as usize).min(tail.len()));
        records = tail;
        match reassembler.push(record) {
            Ok(Some(frame)) => decode_control(&frame),
            Ok(None) => {}
            Err(_) => return,
        }
    }
}

fn decode_control(frame: &[u8]) {
    if let Ok(message) = messages::decode::<ControlMessage>(frame) {
        let again = messages::decode::<ControlMessage>(&messages::encode(&message));
        assert_eq!(again.as_ref(), Ok(&message), "a control message changed on a round trip");
        match &message {
            ControlMessage::Hello { node } => drop(node.check()),
            ControlMessage::Members { members } => members.iter().for_each(|m| drop(m.check())),
            _ => {}
        }
    }
}

/// The join exchange: the refusal byte, a typed join code, the joiner's SPAKE2 message (with the length
/// byte's bounds the member checks), and the join messages inside the secure channel.
pub fn pairing(data: &[u8]) {
    let (mode, rest) = split(data);
    match mode % 4 {
        0 => {
            if let Some(refusal) = rest.first().and_then(|&b| pairing::Refusal::from_byte(b)) {
                assert!(!refusal.explain().is_empty());
            }
        }
        1 => {
            if let Ok(code) = pairing::normalize(&String::from_utf8_lossy(rest)) {
                assert_eq!(pairing::normalize(&code).as_ref(), Ok(&code));
            }
        }
        2 => {
            if !rest.is_empty() && rest.len() <= 128 {
                let (state, _) = pairing::start("ABCD2345");
                let _ = pairing::finish(state, rest);
            }
        }
        _ => {
            if let Ok(message) = messages::decode::<JoinMessage>(rest) {
                messages::decode::<JoinMessage>(&messages::encode(&message)).expect("a join message round-trips");
            }
        }
    }
}

/// A ring link (and a group's links): the opening hello and answer, the failover wire's messages in both directions, the
/// ring frames inside them, and the hidden states a forward frame carries. What decodes must encode
/// back to the same bytes (lossy text aside).
pub fn ring(data: &[u8]) {
    let _ = ring::decode_opening(data);
    // A tensor-parallel group's links: the RDMA offer's messages and the control messages beside RDMA.
    let _ = shoal::transport::group::decode_offer(data);
    let _ = shoal::transport::group::decode_control(data);
    if let Ok(message) = wire::Forward::decode(data) {
        let mut out = Vec::new();
        message.encode(&mut out);
        // A switch carries nothing after its frame number, and what follows is ignored.
        if let wire::Forward::Frame { bytes, .. } = message {
            assert_eq!(out, data, "a forward ring frame changed on a round trip");
            ring_frame(bytes);
        }
    }
    if let Ok(message) = wire::Backward::decode(data) {
        assert_eq!(wire::Backward::decode(&message.encode()).as_ref().ok(), Some(&message));
    }
    ring_frame(data);
    hidden(data);
}

fn ring_frame(bytes: &[u8]) {
    let Ok(frame) = RingFrame::decode(bytes) else { return };
    let mut out = Vec::new();
    frame.encode(&mut out);
    assert_eq!(RingFrame::decode(&out).as_ref(), Ok(&frame), "a ring frame changed on a round trip");
    if let RingFrame::Forward { hidden: payload, .. } = frame {
        hidden(payload);
    }
}

fn hidden(bytes: &[u8]) {
    let Ok(states) = HiddenStates::decode(bytes) else { return };
    assert_eq!(states.values.len(), states.width * states.tokens);
    if bytes[1] == 0 {
        let mut out = Vec::new();
        HiddenStates::encode(states.width, states.tokens, &states.values, WireFormat::F32, &mut out);
        assert_eq!(out, bytes, "f32 hidden states changed on a round trip");
    }
}

/// The peer-copy protocol: each JSON message (request, header, trailer, list of files) as both sides
/// decode and check it, and the layers a listed shard names.
pub fn peer_copy(data: &[u8]) {
    let _ = peer_copy::decode_messages(data);
    if let Ok(files) = serde_json::from_slice::<Vec<peer_copy::OfferedFile>>(data) {
        for layers in files.iter().filter_map(|f| f.layers.as_deref()) {
            layer_spec(layers);
        }
    }
}

/// A GGUF file's header; when it parses, the whole file as a stage opens it (the tensors' extents) and
/// the model configuration read from its metadata, with the per-layer facts the engine asks of it.
pub fn gguf(data: &[u8]) {
    let path = Path::new("fuzz.gguf");
    let Ok(header) = GgufHeader::parse(path, data) else { return };
    for value in header.metadata.values() {
        let _ = (value.as_u64(), value.as_f64(), value.as_str(), value.as_array(), value.type_name());
    }
    for t in &header.tensors {
        assert!(t.offset >= header.data_offset);
    }
    let path = scratch_file(data);
    let opened = GgufFile::open(&path);
    let _ = std::fs::remove_file(&path); // the mapping outlives the name
    let Ok(file) = opened else { return };
    let Ok(config) = ModelConfig::from_gguf(&file, &|name| file.tensor(name).is_some()) else { return };
    for layer in 0..config.layers.min(256) {
        let _ = (config.is_sliding(layer), config.cache_row(layer));
        let _ = shoal::model::layout::layer_tensors(&config, layer);
    }
}

/// Writes `data` to this process's scratch file (a GGUF file is read through a mapping of a file).
fn scratch_file(data: &[u8]) -> std::path::PathBuf {
    let dir = if Path::new("/dev/shm").is_dir() { Path::new("/dev/shm").to_path_buf() } else { std::env::temp_dir() };
    let path = dir.join(format!("shoal-fuzz-{}.gguf", std::process::id()));
    std::fs::write(&path, data).expect("the scratch file is writable");
    path
}

/// A shard's record (`<file>.shard.json`) as a stage reads it, with what is asked of it afterwards; a
/// `--layers`/`"layers"` range; a `NODE:FIRST-LAST,...` layer assignment.
pub fn shard(data: &[u8]) {
    let (mode, rest) = split(data);
    match mode % 3 {
        0 => {
            let Ok(record) = shard::parse_record(rest) else { return };
            let _ = record.layers_text();
            let present = record.present_bytes();
            assert!(present <= record.size);
            let whole = 0..record.size;
            assert!(record.missing(std::slice::from_ref(&whole)).iter().all(|r| r.start < r.end));
            assert!(record.covers(&(0..0)));
        }
        1 => layer_spec(&String::from_utf8_lossy(rest)),
        _ => {
            if let Ok(assignments) = shoal::placement::parse_layers(&String::from_utf8_lossy(rest)) {
                for a in assignments {
                    assert!(!a.layers.is_empty() && !a.node.is_empty());
                }
            }
        }
    }
}

/// A layer range as `shoal pull --layers` and the API take it, written back as the API reports it.
fn layer_spec(spec: &str) {
    if let Ok(layers) = shard::parse_layers(spec) {
        assert!(!layers.is_empty());
        let text = format!("{}-{}", layers.start, layers.end - 1);
        assert_eq!(shard::parse_layers(&text).ok(), Some(layers));
    }
}

/// An HTTP API body: the first byte picks the endpoint, the rest is the body its handler checks.
pub fn api(data: &[u8]) {
    let (pick, body) = split(data);
    let endpoints = shoal::api::CHECKED_BODIES;
    let _ = shoal::api::check_body(endpoints[pick as usize % endpoints.len()], body);
}
