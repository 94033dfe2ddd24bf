//! shoal's core: everything that is not GUI. One folder per concern (see DESIGN.md):
//! - [`ggml`]: the safe wrapper over ggml and llama.cpp, and [`os`]: the operating-system calls that need
//!   it: the only places with `unsafe` (with the RDMA verbs shim's wrapper);
//! - [`model`]: GGUF files, hyper-parameters, tensor layout, tokenizer, chat templates;
//! - [`engine`]: stages running layer ranges, hidden-state serialisation, sampling, generation, benchmarks;
//! - [`node`], [`cluster`], [`discovery`], [`links`]: the node agent and the cluster it forms;
//! - [`placement`], [`worker`], [`transport`], [`instances`]: models split across the cluster;
//! - [`api`], [`metrics`]: the HTTP API and token rates; [`desktop`]: what the menu-bar app shows;
//! - [`rdma`]: the RDMA-over-Thunderbolt doctor and setup; [`errors`]: error chains as people read them.
#![deny(unsafe_code)]

/// The CPU this build was compiled for (rustc's `-C target-cpu`, which ggml's kernels follow):
/// `x86-64-v3`/`apple-m1` for release builds (.cargo/config.toml), `native` for local benchmarks.
pub const BUILT_FOR_CPU: &str = env!("SHOAL_TARGET_CPU");

#[allow(unsafe_code)]
pub mod ggml;
#[allow(unsafe_code)]
pub mod os;

pub mod api;
pub mod cluster;
pub mod desktop;
pub mod discovery;
pub mod engine;
pub mod errors;
pub mod instances;
pub mod links;
pub mod metrics;
pub mod model;
pub mod net;
pub mod node;
pub mod placement;
pub mod rdma;
pub mod records;
pub mod transport;
pub mod util;
pub mod worker;
