//! The safe wrapper over ggml and llama.cpp: the only module of shoal that uses `unsafe`.
//!
//! Everything above this module works with owned Rust values and borrow-checked handles:
//! - [`DType`]: ggml's tensor element types (F32, F16, the quantizations) and their byte sizes.
//! - [`TensorSet`]: tensors whose data lives in one buffer on a device, either mapped from a model file
//!   (weights; copied into device memory where the device cannot use the mapping) or allocated and zeroed
//!   (a KV cache). A set keeps its buffer, and the file mapping, alive.
//! - [`GraphBuilder`] / [`Graph`]: a compute graph built from ops on [`Tensor`] handles; a graph keeps alive
//!   every set whose tensors it uses, so it can be cached and re-run without dangling pointers.
//! - [`Repacking`]: the CPU's interleaved layout for quantized weights, which its kernels multiply
//!   faster, and which weights of a stage's graphs can move there.
//! - [`Device`]: the devices ggml offers (the CPU; a GPU where the build has one), their memory and kind.
//! - [`Collective`]: what a graph's all-reduce hands a tensor to, to sum it over a tensor-parallel group
//!   (custom ops run on the CPU, with the expert remapping of expert parallelism and the product of
//!   only the experts a rank holds).
//! - [`Backend`]: graph execution on a device through ggml's scheduler, the CPU taking what the device
//!   cannot run, with a persistent CPU thread pool and the compute buffers.
//! - [`Vocab`]: llama.cpp's own tokenizer, loaded from a GGUF file without its weights.
//! - Widening: Q5_0 weights copied to Q8_0 (the same values) for products over many rows, which ggml's
//!   CPU computes faster that way.
//!
//! Shapes handed to ggml ops are the caller's responsibility (ggml aborts on a mismatch); callers validate
//! every tensor's shape against the model's hyper-parameters before building a graph. Views are checked
//! here so that no view can reach outside its source tensor.

mod backend;
mod custom_ops;
mod device;
mod dtype;
mod expert_product;
mod graph;
mod layout_ops;
mod log;
mod model_ops;
mod recurrent_ops;
mod repack;
mod sparse_ops;
mod tensor_set;
mod vocab;
mod widen;

pub use backend::Backend;
pub use custom_ops::Collective;
pub use device::{Device, DeviceKind, WeightPlacement};
pub use dtype::DType;
pub use expert_product::has_cpu_dot_product;
pub use graph::{Element, Graph, GraphBuilder, GraphOutput, RopeParams, Tensor};
pub use repack::Repacking;
pub use tensor_set::{GatheredTensor, MappedTensor, SetTensor, SetTensorRef, TensorSet};
pub use vocab::{Vocab, VocabError};
pub use widen::{widened_bytes, WIDEN_FROM_ROWS};

use llama_cpp_sys_2 as sys;
use std::sync::Once;

/// Initialises ggml and llama.cpp once per process and routes their log output to `tracing`.
pub fn init() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        log::install();
        // SAFETY: called once per process before any other llama.cpp call; takes no arguments.
        unsafe { sys::llama_backend_init() };
    });
}
