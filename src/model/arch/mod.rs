//! The architectures shoal runs, each declared once, one file each: what it reads from the GGUF
//! metadata beyond the common keys, the tensors of each layer as a typed group (names, shapes, required
//! or optional, how a tensor-parallel group divides them), what a layer caches per position, and its
//! models' default chat template. Checking a file and placement's byte counts
//! ([`crate::model::ModelLayout`]), a stage's binding and the graph (`crate::engine::arch`, whose
//! layers read the bound group's fields) all read this one declaration. The groups several
//! architectures share are in [`groups`]; [`tensor_group`] writes such groups.

mod deepseek2;
mod deepseek32;
mod gemma3;
mod glm4moe;
mod glm_dsa;
mod gpt_oss;
pub mod groups;
mod kimi_k3;
mod llama;
mod minimax_m2;
mod minimax_m3;
mod qwen35;
mod qwen3moe;
mod qwen3next;
mod tensor_group;

pub use deepseek2::{Deepseek2, Deepseek2Layer, LatentLayer, LatentQuery, LatentValues, SplitExpansion};
pub use deepseek32::{LightningIndexer, SparseFamily, SparseLatent, SparseLatentLayer};
pub use gemma3::{Gemma3, Gemma3Layer};
pub use glm4moe::{Glm4Moe, Glm4MoeLayer};
pub use gpt_oss::{GptOss, GptOssLayer};
pub use kimi_k3::{
    GatedLatentAttention, KimiDeltaAttention, KimiFeedForward, KimiK3, KimiK3Layer, KimiMixer, LatentExperts,
    LatentProjection, ResidualScores, OUTPUT_RESIDUAL_SCORE,
};
pub use llama::{Dense, DenseFeedForward, DenseLayer};
pub use minimax_m2::{MinimaxM2, MinimaxM2Layer};
pub use minimax_m3::{BlockIndexer, MinimaxM3, MinimaxM3Layer};
pub use qwen35::{
    GatedAttention, GatedDeltaNet, GatedSharedExperts, Qwen35, Qwen35FeedForward, Qwen35Layer, Qwen35Mixer,
};
pub use qwen3moe::{Qwen3Moe, Qwen3MoeLayer};
pub use qwen3next::{DeltaNetInput, GroupedDeltaNet, Qwen3Next, Qwen3NextLayer, Qwen3NextMixer};
pub(crate) use tensor_group::tensor_group;
pub use tensor_group::{named, Binder, Declared, TensorGroup};

use super::config::Keys;
use super::layout::{self, ExpectedTensor};
use super::{Architecture, CacheRow, ExpertGroups, ModelConfig, ModelError, SlidingWindow};

/// What an architecture declares.
pub trait Declare: Sync {
    /// The tensors of one layer, as a group of declared slots.
    type Layer: TensorGroup<Declared>;

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
    fn splits_across_ranks(&self, _config: &ModelConfig) -> Result<(), String> {
        Ok(())
    }

    /// ggml's RoPE mode: 0 rotates adjacent pairs (llama GGUFs are converted for it), 2 rotates halves.
    fn rope_mode(&self) -> i32;

    /// The tensors of layer `layer`, in the order the graph uses them.
    fn layer(&self, config: &ModelConfig, layer: usize) -> Self::Layer;

    /// The tensors outside the layers.
    fn global_tensors(&self, config: &ModelConfig) -> Vec<ExpectedTensor> {
        layout::standard_globals(config)
    }
}

/// [`Declare`] for any architecture, its layers' tensors named.
pub trait Declaration: Sync {
    fn hyper_parameters(&self, keys: &Keys<'_>, config: &mut ModelConfig) -> Result<(), ModelError>;
    fn values_may_differ(&self) -> bool;
    fn cache_row(&self, config: &ModelConfig, layer: usize) -> CacheRow;
    fn partial_rotary(&self) -> bool;
    fn default_chat_template(&self) -> Option<&'static str>;
    fn splits_across_ranks(&self, config: &ModelConfig) -> Result<(), String>;
    fn rope_mode(&self) -> i32;
    /// The tensors of layer `layer` (`blk.N.…`), in the order the graph uses them.
    fn layer_tensors(&self, config: &ModelConfig, layer: usize) -> Vec<ExpectedTensor>;
    fn global_tensors(&self, config: &ModelConfig) -> Vec<ExpectedTensor>;
}

impl<A: Declare> Declaration for A {
    fn hyper_parameters(&self, keys: &Keys<'_>, config: &mut ModelConfig) -> Result<(), ModelError> {
        Declare::hyper_parameters(self, keys, config)
    }
    fn values_may_differ(&self) -> bool {
        Declare::values_may_differ(self)
    }
    fn cache_row(&self, config: &ModelConfig, layer: usize) -> CacheRow {
        Declare::cache_row(self, config, layer)
    }
    fn partial_rotary(&self) -> bool {
        Declare::partial_rotary(self)
    }
    fn default_chat_template(&self) -> Option<&'static str> {
        Declare::default_chat_template(self)
    }
    fn splits_across_ranks(&self, config: &ModelConfig) -> Result<(), String> {
        Declare::splits_across_ranks(self, config)
    }
    fn rope_mode(&self) -> i32 {
        Declare::rope_mode(self)
    }
    fn layer_tensors(&self, config: &ModelConfig, layer: usize) -> Vec<ExpectedTensor> {
        named(layer, &Declare::layer(self, config, layer))
    }
    fn global_tensors(&self, config: &ModelConfig) -> Vec<ExpectedTensor> {
        Declare::global_tensors(self, config)
    }
}

pub static LLAMA: Dense = Dense { rope_mode: 0, head_norms_required: false, experts_allowed: true };
pub static QWEN2: Dense = Dense { rope_mode: 2, head_norms_required: false, experts_allowed: false };
pub static QWEN3: Dense = Dense { rope_mode: 2, head_norms_required: true, experts_allowed: false };
pub static QWEN3MOE: Qwen3Moe = Qwen3Moe;
pub static GLM4MOE: Glm4Moe = Glm4Moe;
pub static GLM_DSA: SparseLatent = SparseLatent { family: SparseFamily::Glm5 };
pub static GEMMA3: Gemma3 = Gemma3;
pub static DEEPSEEK2: Deepseek2 = Deepseek2;
pub static DEEPSEEK32: SparseLatent = SparseLatent { family: SparseFamily::Deepseek32 };
pub static GPT_OSS: GptOss = GptOss;
pub static QWEN35: Qwen35 = Qwen35 { experts: false };
pub static QWEN35MOE: Qwen35 = Qwen35 { experts: true };
pub static QWEN3NEXT: Qwen3Next = Qwen3Next;
pub static KIMI_K3: KimiK3 = KimiK3;
pub static MINIMAX_M2: MinimaxM2 = MinimaxM2;
pub static MINIMAX_M3: MinimaxM3 = MinimaxM3;

/// The declaration of `architecture`.
pub fn declaration(architecture: Architecture) -> &'static dyn Declaration {
    match architecture {
        Architecture::Llama => &LLAMA,
        Architecture::Qwen2 => &QWEN2,
        Architecture::Qwen3 => &QWEN3,
        Architecture::Qwen3Moe => &QWEN3MOE,
        Architecture::Glm4Moe => &GLM4MOE,
        Architecture::GlmDsa => &GLM_DSA,
        Architecture::Gemma3 => &GEMMA3,
        Architecture::Deepseek2 => &DEEPSEEK2,
        Architecture::Deepseek32 => &DEEPSEEK32,
        Architecture::GptOss => &GPT_OSS,
        Architecture::Qwen35 => &QWEN35,
        Architecture::Qwen35Moe => &QWEN35MOE,
        Architecture::Qwen3Next => &QWEN3NEXT,
        Architecture::KimiK3 => &KIMI_K3,
        Architecture::MinimaxM2 => &MINIMAX_M2,
        Architecture::MinimaxM3 => &MINIMAX_M3,
    }
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
