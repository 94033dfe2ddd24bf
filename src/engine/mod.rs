//! The layer-range executor: a [`Stage`] runs layers [a, b) of a model on ggml with its own KV cache,
//! through the graph its architecture declares ([`arch`], one file each, over the shared [`blocks`]);
//! hidden states cross stage boundaries in the byte form of [`hidden`]; [`LocalPipeline`] chains stages
//! in one process; [`generate`] samples a continuation; [`speculation`] drafts tokens from the
//! history for the sampler to verify; [`bench`] measures prefill and decode rates.

pub mod arch;
pub mod bench;
mod blocks;
pub mod constraint;
pub mod cores;
mod forward;
mod generate;
pub mod hidden;
mod kv_cache;
pub mod parallel;
mod pipeline;
mod recurrent_state;
mod sampler;
mod snapshot;
mod speculation;
mod stage;
mod stage_options;
mod stop;
pub mod tool_calls;
pub mod weight_rate;
mod weights;

pub use constraint::{Constraint, Grammars, OutputFormat};
pub use generate::{generate, rate, FinishReason, GenerateRequest, GenerationStats, TokenStream};
pub use hidden::{HiddenStates, WireFormat};
pub use kv_cache::{
    bytes_per_position as kv_bytes_per_position, positions_held as kv_cache_positions, ring_positions, KvType,
    CACHE_BLOCK,
};
pub use pipeline::{split_ranges, LocalPipeline};
pub use sampler::{argmax, Sampler, SamplingParams};
pub use speculation::{
    estimated_speedup, prompt_lookup, DraftCost, Speculation, SpeculationPolicy, DEFAULT_DRAFT_TOKENS, MAX_DRAFT_TOKENS,
};
pub use stage::{Segment, Stage, StageInput, StageMemory, StageOptions, STATE_CHECKPOINTS};
pub use stage_options::default_threads;
pub use stop::StopStrings;
pub use tool_calls::{CallStyle, CallableTool};
pub use weights::StageWeights;

use crate::model::ModelError;
use std::ops::Range;

/// Why a stage could not load or run a step.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("layers {}..{} are not a range inside the model's {model_layers} layers", layers.start, layers.end)]
    InvalidLayers { layers: Range<usize>, model_layers: usize },
    #[error(
        "a stage cannot begin at layer {layer}: it has no lightning indexer of its own and attends to the \
         positions an earlier layer's indexer chose; begin the stage at a layer with one"
    )]
    StageStart { layer: usize },
    #[error(
        "the model's sparse attention works in blocks of {block} positions (attention.indexer.block_size); \
         shoal runs blocks that divide its cache's runs of {} positions",
        kv_cache::CACHE_BLOCK
    )]
    BlockSize { block: usize },
    #[error("split points {splits:?} must rise strictly between 0 and the model's {layers} layers (for example --split 10,20)")]
    InvalidSplit { splits: Vec<usize>, layers: usize },
    #[error(
        "the prompt needs {needed} positions but the context holds {context}; shorten the prompt or raise --ctx-size"
    )]
    ContextFull { needed: usize, context: usize },
    #[error("not enough memory: {0}")]
    OutOfMemory(String),
    #[error("{0}; use a model in a quantization the CPU kernels support (Q4_0, Q4_K_M, Q8_0, F16, …)")]
    Unsupported(String),
    #[error("ggml failed: {0}")]
    Backend(String),
    #[error("invalid input: {0}")]
    BadInput(String),
    #[error("layers {}..{} produced a non-finite value (at output index {index}); the model file is probably damaged: download it again", layers.start, layers.end)]
    NonFinite { layers: Range<usize>, index: usize },
    #[error("the tensor-parallel group lost a rank: {0}")]
    GroupLost(String),
    #[error("internal error: {0}")]
    Internal(String),
}
