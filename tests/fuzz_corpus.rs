//! Replays every committed fuzz seed (`fuzz/corpus/TARGET/`) through its target in `fuzz/targets.rs`,
//! uninstrumented, so the corpora and the targets keep up with the decoders without the fuzzer; and
//! checks the seeds are what they claim (the API bodies are accepted, the control frames decode).

#[allow(dead_code)]
#[path = "../fuzz/targets.rs"]
mod targets;

use std::path::{Path, PathBuf};

fn seeds(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus").join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a corpus entry").path())
        .collect();
    files.sort();
    files.into_iter().map(|path| (path.clone(), std::fs::read(&path).expect("a corpus file"))).collect()
}

#[test]
fn every_seed_replays_through_its_target() {
    for (name, target) in targets::TARGETS {
        let seeds = seeds(name);
        assert!(!seeds.is_empty(), "fuzz/corpus/{name} has no seeds");
        for (path, bytes) in seeds {
            if let Err(panic) = std::panic::catch_unwind(|| target(&bytes)) {
                std::panic::resume_unwind(Box::new(format!("{} panicked: {panic:?}", path.display())));
            }
        }
    }
}

#[test]
fn the_seeds_are_real_inputs() {
    for (path, bytes) in seeds("api") {
        let endpoint = shoal::api::CHECKED_BODIES[bytes[0] as usize];
        let result = shoal::api::check_body(endpoint, &bytes[1..]);
        assert!(result.is_ok(), "{} is refused by {endpoint}: {:?}", path.display(), result.err().map(|e| e.message));
    }
    for (path, bytes) in seeds("control").into_iter().filter(|(p, _)| p.to_string_lossy().contains("frame-")) {
        let decoded = shoal::cluster::messages::decode::<shoal::cluster::messages::ControlMessage>(&bytes[1..]);
        assert!(decoded.is_ok(), "{} does not decode: {decoded:?}", path.display());
    }
    let small = seeds("gguf").into_iter().find(|(p, _)| p.ends_with("model-small")).expect("the small GGUF seed");
    shoal::model::GgufHeader::parse(&small.0, &small.1).expect("the small GGUF seed parses");
}
