//! The architectures the engine runs, one file each. An architecture declares, once, what it reads from
//! the GGUF metadata beyond the common keys, which tensors each layer has (names, shapes, required or
//! optional) and how a layer computes. Placement's byte counts ([`crate::model::ModelLayout`]), a stage's
//! binding ([`super::StageWeights`]) and the graph all read that one declaration; the building blocks the
//! graphs share (norm, attention over the KV cache, dense and mixture-of-experts feed-forward) are in
//! [`super::blocks`].

mod gemma3;
mod glm4moe;
mod llama;
mod qwen3moe;

use super::blocks::StepContext;
use super::weights::LayerWeights;
use crate::ggml::{GraphBuilder, Tensor};
use crate::model::config::Keys;
use crate::model::layout::{self, ExpectedTensor};
use crate::model::{Architecture, ModelConfig, ModelError};

/// What an architecture declares.
pub trait ArchSpec: Sync {
    /// Reads the architecture's own metadata keys into `config`, whose common keys are already read.
    fn hyper_parameters(&self, _keys: &Keys<'_>, _config: &mut ModelConfig) -> Result<(), ModelError> {
        Ok(())
    }

    /// Whether RoPE may turn only the first `rope.dimension_count` values of each head (GLM).
    fn partial_rotary(&self) -> bool {
        false
    }

    /// The chat template of the architecture's models, for files that carry none (Jinja, as
    /// `tokenizer.chat_template`); ChatML when this is `None` too.
    fn default_chat_template(&self) -> Option<&'static str> {
        None
    }

    /// ggml's RoPE mode: 0 rotates adjacent pairs (llama GGUFs are converted for it), 2 rotates halves.
    fn rope_mode(&self) -> i32;

    /// The tensors of layer `layer` (their short names after `blk.N.`), in the order the graph uses them.
    fn layer_tensors(&self, config: &ModelConfig, layer: usize) -> Vec<ExpectedTensor>;

    /// The tensors outside the layers.
    fn global_tensors(&self, config: &ModelConfig) -> Vec<ExpectedTensor> {
        layout::standard_globals(config)
    }

    /// Adds layer `layer` to the graph: `x` is its input, the result its output.
    fn layer<'g>(
        &self,
        g: &'g GraphBuilder,
        step: &StepContext<'_, 'g>,
        layer: usize,
        w: &LayerWeights,
        x: Tensor<'g>,
    ) -> Tensor<'g>;
}

/// The expert counts every mixture-of-experts architecture reads: experts per layer and experts used
/// per token (at least one, at most all).
fn expert_counts(keys: &Keys<'_>) -> Result<(usize, usize), ModelError> {
    let experts = keys.arch_count("expert_count")?;
    let used = keys.arch_count("expert_used_count")?;
    if used > experts {
        return Err(keys.arch_invalid("expert_used_count", &format!("is {used}, more than the {experts} experts")));
    }
    Ok((experts, used))
}

/// The declaration of `architecture`.
pub fn spec(architecture: Architecture) -> &'static dyn ArchSpec {
    match architecture {
        Architecture::Llama => &llama::LLAMA,
        Architecture::Qwen2 => &llama::QWEN2,
        Architecture::Qwen3 => &llama::QWEN3,
        Architecture::Qwen3Moe => &qwen3moe::QWEN3MOE,
        Architecture::Glm4Moe => &glm4moe::GLM4MOE,
        Architecture::Gemma3 => &gemma3::GEMMA3,
    }
}
