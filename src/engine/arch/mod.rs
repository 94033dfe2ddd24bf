//! The architectures the engine runs, one file each. An architecture declares, once, what it reads from
//! the GGUF metadata beyond the common keys, which tensors each layer has (names, shapes, required or
//! optional) and how a layer computes. Placement's byte counts ([`crate::model::ModelLayout`]), a stage's
//! binding ([`super::StageWeights`]) and the graph all read that one declaration; the building blocks the
//! graphs share (norm, attention over the KV cache, dense and mixture-of-experts feed-forward) are in
//! [`super::blocks`].

mod deepseek2;
mod gemma3;
mod glm4moe;
mod gpt_oss;
mod llama;
mod qwen35;
mod qwen3moe;

use super::blocks::StepContext;
use super::weights::LayerWeights;
use crate::ggml::{GraphBuilder, Tensor};
use crate::model::config::Keys;
use crate::model::layout::{self, ExpectedTensor};
use crate::model::{Architecture, CacheRow, ExpertGroups, ModelConfig, ModelError, SlidingWindow};

/// What an architecture declares.
pub trait ArchSpec: Sync {
    /// Reads the architecture's own metadata keys into `config`, whose common keys are already read.
    fn hyper_parameters(&self, _keys: &Keys<'_>, _config: &mut ModelConfig) -> Result<(), ModelError> {
        Ok(())
    }

    /// Whether a head's values may be narrower or wider than its keys (`attention.value_length`).
    fn values_may_differ(&self) -> bool {
        false
    }

    /// What layer `layer` caches per position.
    fn cache_row(&self, config: &ModelConfig, _layer: usize) -> CacheRow {
        config.standard_cache_row()
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

    /// Whether the graph runs split across a tensor-parallel group, each rank with its share of the
    /// tensors the declarations split; the reason when it cannot.
    fn splits_across_ranks(&self) -> Result<(), String> {
        Ok(())
    }

    /// Whether a segment that begins its sequence may attend in a form of its own, whose compute buffer
    /// the stage must reserve as well (`SegmentShape::fresh`; DeepSeek's split latent form).
    fn attends_fresh_segments_apart(&self, _config: &ModelConfig) -> bool {
        false
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

/// The sliding window of the file's `attention.sliding_window` positions, when it has one: which layers
/// slide (`attention.sliding_window_pattern`, as flags per layer or as "all but every nth", else
/// `default_pattern`), and their RoPE (`rope.freq_base_swa`, else `default_freq_base`).
fn sliding_window(
    keys: &Keys<'_>,
    config: &ModelConfig,
    default_pattern: usize,
    default_freq_base: f32,
) -> Result<Option<SlidingWindow>, ModelError> {
    let Some(size) = keys.arch_optional_count("attention.sliding_window")? else { return Ok(None) };
    let layers = match keys.arch_bools("attention.sliding_window_pattern") {
        Some(flags) if flags.len() >= config.layers => flags[..config.layers].to_vec(),
        Some(_) => return Err(keys.arch_invalid("attention.sliding_window_pattern", "has fewer entries than layers")),
        None => {
            let n = keys.arch_optional_count("attention.sliding_window_pattern")?.unwrap_or(default_pattern);
            (0..config.layers).map(|l| l % n < n - 1).collect()
        }
    };
    Ok(Some(SlidingWindow {
        size,
        layers,
        freq_base: keys.arch_optional_float("rope.freq_base_swa")?.map_or(default_freq_base, |b| b as f32),
        freq_scale: 1.0,
    }))
}

/// Drops the next-token-prediction layers a file may carry after the model's own
/// (`nextn_predict_layers`, GLM-4.5 and DeepSeek V3): they are neither loaded nor counted.
fn skip_next_token_layers(keys: &Keys<'_>, config: &mut ModelConfig) -> Result<(), ModelError> {
    let skipped = keys.arch_optional_size("nextn_predict_layers")?.unwrap_or(0);
    if skipped >= config.layers {
        return Err(keys.arch_invalid("nextn_predict_layers", "leaves no layers for the model itself"));
    }
    config.layers -= skipped;
    config.skipped_layers = skipped;
    Ok(())
}

/// Group-limited routing, when the file asks for it (`expert_group_count` above 1): the groups must
/// divide the experts, hold at least the two experts a group is scored by, and `expert_group_used_count`
/// of them must be able to supply the experts each token uses.
fn expert_groups(keys: &Keys<'_>, experts: usize) -> Result<Option<ExpertGroups>, ModelError> {
    let count = keys.arch_optional_size("expert_group_count")?.unwrap_or(0);
    if count <= 1 {
        return Ok(None);
    }
    let used = keys.arch_optional_size("expert_group_used_count")?.unwrap_or(0);
    if !experts.is_multiple_of(count) || experts / count < 2 {
        return Err(keys.arch_invalid(
            "expert_group_count",
            &format!("is {count}, which does not split the {experts} experts into groups of two or more"),
        ));
    }
    if used == 0 || used > count {
        return Err(keys.arch_invalid("expert_group_used_count", &format!("is {used}, for {count} groups")));
    }
    Ok(Some(ExpertGroups { count, used }))
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
        Architecture::Deepseek2 => &deepseek2::DEEPSEEK2,
        Architecture::GptOss => &gpt_oss::GPT_OSS,
        Architecture::Qwen35 => &qwen35::QWEN35,
        Architecture::Qwen35Moe => &qwen35::QWEN35MOE,
    }
}
