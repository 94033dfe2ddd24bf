//! shoal's core: everything that is not GUI. One folder per concern (see DESIGN.md):
//! - [`ggml`]: the safe wrapper over ggml and llama.cpp, the only place with `unsafe`;
//! - [`model`]: GGUF files, hyper-parameters, tensor layout, tokenizer, chat templates;
//! - [`engine`]: stages running layer ranges, hidden-state serialisation, sampling, generation, benchmarks;
//! - [`node`], [`cluster`], [`discovery`], [`links`]: the node agent and the cluster it forms;
//! - [`placement`], [`worker`], [`transport`], [`instances`]: models split across the cluster;
//! - [`api`], [`metrics`]: the HTTP API and token rates; [`desktop`]: what the menu-bar app shows;
//! - [`rdma`]: the RDMA-over-Thunderbolt doctor and setup; [`errors`]: error chains as people read them.
#![deny(unsafe_code)]

#[allow(unsafe_code)]
pub mod ggml;

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
