//! Embeds the built dashboard (`ui/dist`, made by `scripts/build-ui`) into the binary so every node
//! serves it at `/`. When `ui/dist` is missing and npm is there, it builds the dashboard first; without
//! npm the node serves a page that says how to build it.
//! With the `rdma` feature it also compiles the RDMA verbs shim.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let dist = manifest.join("ui").join("dist");
    println!("cargo:rerun-if-changed={}", dist.display());
    println!("cargo:rerun-if-changed=build.rs");

    if !dist.join("index.html").is_file() {
        build_dashboard(&manifest);
    }
    let mut files = Vec::new();
    if dist.join("index.html").is_file() {
        collect(&dist, &dist, &mut files);
    }
    files.sort();
    let mut table = String::from("&[\n");
    for (route, path) in &files {
        writeln!(table, "    ({route:?}, include_bytes!({:?}) as &[u8]),", path.display().to_string()).unwrap();
    }
    table.push(']');
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("ui_assets.rs");
    std::fs::write(out, format!("pub static ASSETS: &[(&str, &[u8])] = {table};\n")).expect("write ui_assets.rs");
    build_rdma_shim();
    report_target_cpu();
}

/// Tells the crate (`BUILT_FOR_CPU`) which CPU rustc compiles for, as `-C target-cpu` says; ggml's
/// kernels are compiled for the same one (llama-cpp-sys-2 passes it on to cmake).
fn report_target_cpu() {
    let flags = std::env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    let cpu = flags.split('\x1f').filter_map(|f| f.split("target-cpu=").nth(1)).next_back();
    println!("cargo:rustc-env=SHOAL_TARGET_CPU={}", cpu.unwrap_or("default (the target's baseline)"));
    println!("cargo:rerun-if-env-changed=CARGO_ENCODED_RUSTFLAGS");
}

/// Builds `ui/dist` with `scripts/build-ui` when npm is on the PATH (a warning says why when it cannot).
fn build_dashboard(manifest: &Path) {
    if std::env::var_os("SHOAL_NO_UI_BUILD").is_some() {
        return;
    }
    let npm = std::process::Command::new("npm").arg("--version").output();
    if !npm.is_ok_and(|o| o.status.success()) {
        println!("cargo:warning=ui/dist is missing and npm is not installed: the node will serve a page saying how to build the dashboard");
        return;
    }
    let status = std::process::Command::new("bash").arg(manifest.join("scripts").join("build-ui")).status();
    if !status.is_ok_and(|s| s.success()) {
        println!("cargo:warning=building the dashboard (scripts/build-ui) failed: the node will serve a page saying how to build it");
    }
}

/// With the `rdma` feature: compiles the verbs shim (src/transport/rdma/shim.c) against the platform's
/// `<infiniband/verbs.h>`. It does not link the verbs library (the shim opens it at run time), only the
/// system's dlopen.
#[cfg(feature = "rdma")]
fn build_rdma_shim() {
    if std::env::var_os("CARGO_FEATURE_RDMA").is_none() {
        return;
    }
    let shim = "src/transport/rdma/shim.c";
    println!("cargo:rerun-if-changed={shim}");
    cc::Build::new().file(shim).warnings(true).compile("shoal_rdma_shim");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-link-lib=dl");
    }
}

#[cfg(not(feature = "rdma"))]
fn build_rdma_shim() {}

fn collect(root: &Path, dir: &Path, files: &mut Vec<(String, PathBuf)>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect(root, &path, files);
        } else if let Ok(relative) = path.strip_prefix(root) {
            let route = relative.components().map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/");
            files.push((route, path));
        }
    }
}
