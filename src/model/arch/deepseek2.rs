//! DeepSeek V2 and V3, Kimi K2 and the other `deepseek2` files. Attention is multi-head latent attention
//! (MLA): queries pass an optional low-rank bottleneck (`attn_q_a` → `attn_q_a_norm` → `attn_q_b`), keys
//! and values are compressed into one latent per position (`attn_kv_a_mqa` → `attn_kv_a_norm`) plus a
//! rotary part shared by all heads. Files with `attention.key_length_mla` split the expansion into
//! `attn_k_b` and `attn_v_b`, so attention can run over the cached latent itself and the cache holds
//! only `kv_lora_rank` + rotary values per position; older files carry one `attn_kv_b` that expands
//! full keys and values per head, which the cache then holds. YaRN scales the context, and its
//! magnitude correction scales attention too. The feed-forward is dense in the first
//! `leading_dense_block_count` layers and elsewhere routed experts (softmax for V2, sigmoid with a
//! selection bias and groups for V3) plus shared experts. Next-token-prediction layers are skipped.

use super::groups::SparseOrDense;
use super::tensor_group::{tensor_group, Declared};
use super::Declare;
use crate::model::config::Keys;
use crate::model::layout::Part;
use crate::model::{CacheRow, ExpertActivation, Gating, LatentAttention, ModelConfig, ModelError, MoeParams};

pub struct Deepseek2;

tensor_group! {
    /// A DeepSeek V2/V3 layer.
    pub struct Deepseek2Layer {
        attn_norm: tensor "attn_norm.weight",
        attention: group LatentLayer,
        ffn_norm: tensor "ffn_norm.weight",
        feed_forward: group SparseOrDense,
    }
}

tensor_group! {
    /// Multi-head latent attention's tensors.
    pub struct LatentLayer {
        query: group LatentQuery,
        /// The compressed latent and the shared rotary key part, side by side.
        kv_a: tensor "attn_kv_a_mqa.weight",
        kv_a_norm: tensor "attn_kv_a_norm.weight",
        values: group LatentValues,
        output: tensor "attn_output.weight",
    }
}

tensor_group! {
    /// How queries are projected.
    pub enum LatentQuery {
        Direct(DirectQuery),
        /// Through a low-rank bottleneck.
        LowRank(LowRankQuery),
    }
}

tensor_group! {
    pub struct DirectQuery {
        q: tensor "attn_q.weight",
    }
}

tensor_group! {
    pub struct LowRankQuery {
        a: tensor "attn_q_a.weight",
        a_norm: tensor "attn_q_a_norm.weight",
        b: tensor "attn_q_b.weight",
    }
}

tensor_group! {
    /// How the latent becomes each head's keys and values.
    pub enum LatentValues {
        /// Split into the keys' and the values' expansions: attention may run over the latent.
        Split(SplitExpansion),
        /// One expansion into full keys and values per head.
        Joined(JoinedExpansion),
    }
}

tensor_group! {
    pub struct SplitExpansion {
        k_b: tensor "attn_k_b.weight",
        v_b: tensor "attn_v_b.weight",
    }
}

tensor_group! {
    pub struct JoinedExpansion {
        kv_b: tensor "attn_kv_b.weight",
    }
}

/// llama.cpp's "lite" files (DeepSeek-V2-Lite and kin) have no query bottleneck whatever they say.
fn is_lite(layers: usize, vocabulary: usize) -> bool {
    layers == 27 || layers == 26 || (layers == 48 && vocabulary == 128_256)
}

/// Reads latent attention's keys; `attention.q_lora_rank` is required when `query_bottleneck_required`
/// (DeepSeek's files, except the "lite" ones), else 0 when absent (Kimi K3).
pub(super) fn latent_attention(
    keys: &Keys<'_>,
    config: &ModelConfig,
    query_bottleneck_required: bool,
) -> Result<LatentAttention, ModelError> {
    let q_lora_rank = if !query_bottleneck_required {
        keys.arch_optional_size("attention.q_lora_rank")?.unwrap_or(0)
    } else if is_lite(config.layers, config.vocabulary) {
        0
    } else {
        keys.arch_optional_size("attention.q_lora_rank")?
            .ok_or_else(|| keys.arch_invalid("attention.q_lora_rank", "is missing"))?
    };
    let kv_lora_rank = keys.arch_count("attention.kv_lora_rank")?;
    let rope = config.rope.dimensions as usize;
    let split = (
        keys.arch_optional_count("attention.key_length_mla")?,
        keys.arch_optional_count("attention.value_length_mla")?,
    );
    let (key_head, value_head, absorbed) = match split {
        (Some(k), Some(v)) => {
            // The cache's one "head": the latent and the rotary part, of which values are the latent.
            if config.head_dim != kv_lora_rank + rope || config.value_dim != kv_lora_rank || config.kv_heads != 1 {
                return Err(keys.arch_invalid(
                    "attention.key_length",
                    &format!(
                        "is {} with value length {} and {} KV heads; latent attention needs kv_lora_rank + rotary \
                         dimensions ({}), kv_lora_rank ({kv_lora_rank}) and 1",
                        config.head_dim,
                        config.value_dim,
                        config.kv_heads,
                        kv_lora_rank + rope
                    ),
                ));
            }
            (k, v, true)
        }
        (None, None) => {
            if config.kv_heads != config.heads {
                return Err(keys.arch_invalid("attention.head_count_kv", "differs from the head count"));
            }
            (config.head_dim, config.value_dim, false)
        }
        _ => {
            return Err(keys.arch_invalid(
                "attention.key_length_mla",
                "and attention.value_length_mla must both be present or both absent",
            ))
        }
    };
    if key_head <= rope {
        return Err(keys.arch_invalid(
            "rope.dimension_count",
            &format!("is {rope}, which leaves no part without RoPE in heads of {key_head}"),
        ));
    }
    // The file stores 0.1 × mscale_all_dim; llama.cpp divides it back out.
    let yarn_log_multiplier = keys.arch_optional_float("rope.scaling.yarn_log_multiplier")?.unwrap_or(0.0) as f32 / 0.1;
    Ok(LatentAttention { q_lora_rank, kv_lora_rank, key_head, value_head, absorbed, yarn_log_multiplier })
}

/// The cache row of the split form: the latent and the rotary part per position, of which values are
/// the latent.
pub(super) fn latent_cache_row(config: &ModelConfig, mla: &LatentAttention) -> CacheRow {
    CacheRow {
        key_width: mla.kv_lora_rank + config.rope.dimensions as usize,
        value_width: mla.kv_lora_rank,
        values_in_keys: true,
        window: None,
        indexer_width: 0,
    }
}

/// How an architecture's YaRN reads `rope.scaling.yarn_log_multiplier` (mscale_all_dim), as llama.cpp
/// does for it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum LatentYarn {
    /// DeepSeek V2/V3: both magnitude scales are mscale_all_dim when it is not 1.
    DeepseekV2,
    /// DeepSeek V3.2: mscale 1, mscale_all_dim from the file.
    Deepseek32,
    /// GLM-5: the key is not read (0), so YaRN's magnitude is the generic one.
    Unread,
}

/// What every DeepSeek file reads beyond the common keys: the next-token-prediction layers it skips,
/// latent attention (into `config`, and returned) with YaRN's magnitude correction as `yarn` says, and
/// the experts.
pub(super) fn latent_hyper_parameters(
    keys: &Keys<'_>,
    config: &mut ModelConfig,
    yarn: LatentYarn,
) -> Result<LatentAttention, ModelError> {
    super::skip_next_token_layers(keys, config)?;
    if keys.arch_optional_float("attention.temperature_scale")?.is_some_and(|s| s != 0.0) {
        return Err(keys.arch_invalid(
            "attention.temperature_scale",
            "asks for attention temperature tuning (Mistral Large 3), which shoal does not run",
        ));
    }
    let mut mla = latent_attention(keys, config, true)?;
    if yarn == LatentYarn::Unread {
        mla.yarn_log_multiplier = 0.0;
    }
    if config.rope.ext_factor != 0.0 && mla.yarn_log_multiplier != 0.0 {
        let all_dims = mla.yarn_log_multiplier;
        let mscale = if yarn == LatentYarn::DeepseekV2 && all_dims != 1.0 { all_dims } else { 1.0 };
        let file_factor = keys.arch_optional_float("rope.scaling.attn_factor")?.unwrap_or(1.0) as f32;
        config.rope.attn_factor = config.rope.yarn_attn_factor(mscale, all_dims, file_factor);
    }
    config.moe = Some(experts(keys, config)?);
    config.latent_attention = Some(mla);
    Ok(mla)
}

fn experts(keys: &Keys<'_>, config: &ModelConfig) -> Result<MoeParams, ModelError> {
    let (experts, experts_used) = super::expert_counts(keys)?;
    let gating = match keys.arch_optional_size("expert_gating_func")? {
        Some(1) => Gating::Softmax,
        Some(2) => Gating::Sigmoid,
        // Older V2 files say nothing: softmax, except GLM-4.7-Flash, which llama.cpp recognises by shape.
        None | Some(0) if matches!(config.layers, 47 | 48) && config.vocabulary == 154_880 => Gating::Sigmoid,
        None | Some(0) => Gating::Softmax,
        Some(other) => {
            return Err(keys.arch_invalid("expert_gating_func", &format!("is {other}, a gating shoal does not run")))
        }
    };
    Ok(MoeParams {
        experts,
        experts_used,
        expert_feed_forward: keys.arch_count("expert_feed_forward_length")?,
        gating,
        activation: ExpertActivation::Silu,
        normalize: keys.arch_optional_bool("expert_weights_norm")?.unwrap_or(false),
        scale: keys.arch_optional_float("expert_weights_scale")?.unwrap_or(0.0) as f32,
        shared_experts: keys.arch_count("expert_shared_count")?,
        leading_dense_layers: keys.arch_optional_count("leading_dense_block_count")?.unwrap_or(0).min(config.layers),
        groups: super::expert_groups(keys, experts)?,
    })
}

impl Declare for Deepseek2 {
    type Layer = Deepseek2Layer<Declared>;

    fn hyper_parameters(&self, keys: &Keys<'_>, config: &mut ModelConfig) -> Result<(), ModelError> {
        latent_hyper_parameters(keys, config, LatentYarn::DeepseekV2).map(|_| ())
    }

    fn values_may_differ(&self) -> bool {
        true
    }

    fn partial_rotary(&self) -> bool {
        true
    }

    fn rope_mode(&self) -> i32 {
        0
    }

    fn cache_row(&self, config: &ModelConfig, _layer: usize) -> CacheRow {
        match config.latent_attention {
            Some(mla) if mla.absorbed => latent_cache_row(config, &mla),
            _ => config.standard_cache_row(),
        }
    }

    fn layer(&self, config: &ModelConfig, layer: usize) -> Self::Layer {
        let moe = config.moe.as_ref().expect("deepseek2 reads its expert parameters when the model opens");
        Deepseek2Layer {
            attn_norm: Declared::new(&[config.embedding]),
            attention: LatentLayer::declare(config),
            ffn_norm: Declared::new(&[config.embedding]),
            feed_forward: SparseOrDense::declare(config, moe, layer, false),
        }
    }
}

impl LatentLayer<Declared> {
    /// Latent attention's tensors as `config` shapes them.
    pub fn declare(config: &ModelConfig) -> LatentLayer<Declared> {
        let mla = config.latent_attention.expect("deepseek2 reads its attention parameters when the model opens");
        let (e, heads, rope) = (config.embedding, config.heads, config.rope.dimensions as usize);
        let (rank, nope) = (mla.kv_lora_rank, mla.key_head - rope);
        // A tensor-parallel rank holds whole heads: their rows of the query projection and of the
        // per-head expansions, the matching inputs of the output projection. Every rank computes the
        // shared latent (and the query bottleneck) whole, so the latent cache is held by every rank:
        // it is one "head" that every query head reads.
        let query = if mla.q_lora_rank > 0 {
            LatentQuery::LowRank(LowRankQuery {
                a: Declared::new(&[e, mla.q_lora_rank]),
                a_norm: Declared::new(&[mla.q_lora_rank]),
                b: Declared::new(&[mla.q_lora_rank, heads * mla.key_head]).split(1, Part::QueryHeads),
            })
        } else {
            LatentQuery::Direct(DirectQuery { q: Declared::new(&[e, heads * mla.key_head]).split(1, Part::QueryHeads) })
        };
        let values = if mla.absorbed {
            LatentValues::Split(SplitExpansion {
                k_b: Declared::new(&[nope, rank, heads]).split(2, Part::QueryHeads),
                v_b: Declared::new(&[rank, mla.value_head, heads]).split(2, Part::QueryHeads),
            })
        } else {
            // Keys and values per head, cached per head: a rank caches its own heads'.
            let kv_b = Declared::new(&[rank, heads * (nope + mla.value_head)]).split(1, Part::KvHeads);
            LatentValues::Joined(JoinedExpansion { kv_b })
        };
        LatentLayer {
            query,
            kv_a: Declared::new(&[e, rank + rope]),
            kv_a_norm: Declared::new(&[rank]),
            values,
            output: Declared::new(&[heads * mla.value_head, e]).split(0, Part::QueryHeads),
        }
    }
}
