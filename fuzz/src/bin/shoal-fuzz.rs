//! The libFuzzer binary: runs the target that `SHOAL_FUZZ_TARGET` names (see `fuzz/targets.rs`). One
//! binary for every target, so the instrumented core is linked once.
#![no_main]

#[allow(dead_code)]
#[path = "../../targets.rs"]
mod targets;

use std::sync::OnceLock;

fn target() -> targets::Target {
    static TARGET: OnceLock<targets::Target> = OnceLock::new();
    *TARGET.get_or_init(|| {
        let name = std::env::var("SHOAL_FUZZ_TARGET").unwrap_or_default();
        let found = targets::TARGETS.iter().find(|(n, _)| *n == name);
        found.map(|(_, f)| *f).unwrap_or_else(|| {
            let names: Vec<&str> = targets::TARGETS.iter().map(|(n, _)| *n).collect();
            eprintln!("set SHOAL_FUZZ_TARGET to one of: {}", names.join(", "));
            std::process::exit(2)
        })
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| target()(data));
