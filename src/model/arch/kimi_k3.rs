//! Kimi K3 (`kimi-k3`): layers of Kimi delta attention (linear attention with a recurrent state whose
//! decay is per key channel, queries, keys and values each through a short convolution of its own, the
//! output gated by a sigmoid) and, where `attention.head_count_kv` is not 0, DeepSeek's latent attention
//! without RoPE and with a sigmoid output gate (`attn_gate`). Every `attn_res.block_size`-th layer banks
//! its input as a residual checkpoint, and each layer's attention and feed-forward read a softmax mix
//! of the checkpoints and the running stream, scored per token (`attn_res_score`, `ffn_res_score`, and
//! `output_res_score` before the final norm). The leading dense layers and the shared experts use the
//! situ activation; the routed experts run in a narrower latent width (`ffn_routed_down` →
//! experts → `ffn_routed_norm` → `ffn_routed_up`) while the sigmoid router with its selection bias reads
//! the full-width input. Files carry no next-token-prediction layers.

use super::deepseek2::{latent_attention, latent_cache_row, LatentLayer};
use super::groups::{Experts, FeedForward, SharedExperts};
use super::tensor_group::{tensor_group, Declared};
use super::Declare;
use crate::model::config::Keys;
use crate::model::layout::{self, ExpectedTensor, Part};
use crate::model::{CacheRow, ExpertActivation, Gating, LinearAttention, ModelConfig, ModelError, MoeParams};

pub struct KimiK3;

/// The final mix of residual checkpoints, held with the output head.
pub const OUTPUT_RESIDUAL_SCORE: &str = "output_res_score.weight";

tensor_group! {
    /// A Kimi K3 layer.
    pub struct KimiK3Layer {
        attn_norm: tensor "attn_norm.weight",
        ffn_norm: tensor "ffn_norm.weight",
        /// The scores of the residual checkpoints before attention and before the feed-forward.
        residual_scores: optional_group ResidualScores,
        mixer: group KimiMixer,
        feed_forward: group KimiFeedForward,
    }
}

tensor_group! {
    /// Per channel, the weights that score each residual checkpoint (RMS-normed) for one token.
    pub struct ResidualScores {
        attention: tensor "attn_res_score.weight",
        feed_forward: tensor "ffn_res_score.weight",
    }
}

tensor_group! {
    /// What a layer attends with.
    pub enum KimiMixer {
        Linear(KimiDeltaAttention),
        Full(GatedLatentAttention),
    }
}

tensor_group! {
    /// Kimi delta attention: Q, K, V each projected and convolved, the decay per key channel through a
    /// low-rank projection (`ssm_f_a` → `ssm_f_b`) with `ssm_a` (-exp(A_log)) and `ssm_dt.bias`, the
    /// write strength (`ssm_beta`), the output gate (`ssm_g`), each head's output norm and projection.
    pub struct KimiDeltaAttention {
        q: tensor "attn_q.weight",
        k: tensor "attn_k.weight",
        v: tensor "attn_v.weight",
        q_conv: tensor "ssm_conv1d_q.weight",
        k_conv: tensor "ssm_conv1d_k.weight",
        v_conv: tensor "ssm_conv1d_v.weight",
        decay_a: tensor "ssm_f_a.weight",
        decay_b: tensor "ssm_f_b.weight",
        beta: tensor "ssm_beta.weight",
        a: tensor "ssm_a",
        dt_bias: tensor "ssm_dt.bias",
        gate: tensor "ssm_g.weight",
        norm: tensor "ssm_norm.weight",
        output: tensor "attn_output.weight",
    }
}

tensor_group! {
    /// Latent attention whose output is scaled by σ(`attn_gate` · x) before the output projection.
    pub struct GatedLatentAttention {
        attention: group LatentLayer,
        gate: optional "attn_gate.weight",
    }
}

tensor_group! {
    /// A dense layer's situ feed-forward, or experts.
    pub enum KimiFeedForward {
        Dense(FeedForward),
        Sparse(LatentExperts),
    }
}

tensor_group! {
    /// Routed experts in the latent width (the router reads the full width) and the shared experts.
    pub struct LatentExperts {
        routed: group Experts,
        latent: optional_group LatentProjection,
        shared: optional_group SharedExperts,
    }
}

tensor_group! {
    /// Into the experts' latent width and back, with an optional norm of the experts' sum.
    pub struct LatentProjection {
        down: tensor "ffn_routed_down.weight",
        up: tensor "ffn_routed_up.weight",
        norm: optional "ffn_routed_norm.weight",
    }
}

/// Kimi delta attention's shape: `heads` heads of `kda.head_dim`, keys and values alike, linear where
/// the per-layer `attention.head_count_kv` is 0.
fn delta_attention(keys: &Keys<'_>, config: &ModelConfig) -> Result<LinearAttention, ModelError> {
    let head_width = keys.arch_count("kda.head_dim")?;
    let conv_kernel = keys.arch_count("ssm.conv_kernel")?;
    if conv_kernel < 2 {
        return Err(keys.arch_invalid("ssm.conv_kernel", "is less than 2"));
    }
    let layers = match keys.arch_integers("attention.head_count_kv") {
        Some(per_layer) if per_layer.len() >= config.layers => {
            per_layer[..config.layers].iter().map(|&n| n == 0).collect()
        }
        Some(_) => return Err(keys.arch_invalid("attention.head_count_kv", "has fewer entries than layers")),
        None => vec![false; config.layers],
    };
    let bound = keys.arch_optional_float("kda.gate_lower_bound")?.map(|b| b as f32);
    Ok(LinearAttention {
        conv_kernel,
        inner: config.heads * head_width,
        head_width,
        key_heads: config.heads,
        value_heads: config.heads,
        layers,
        value_heads_grouped: false,
        fused_input: false,
        decay_lower_bound: bound.filter(|b| b.is_finite()),
        keys_divided: true,
        first_value_head: 0,
    })
}

fn experts(keys: &Keys<'_>, config: &ModelConfig) -> Result<MoeParams, ModelError> {
    let (experts, experts_used) = super::expert_counts(keys)?;
    let gating = match keys.arch_optional_size("expert_gating_func")? {
        Some(2) => Gating::Sigmoid,
        Some(1) => Gating::Softmax,
        other => {
            return Err(keys.arch_invalid(
                "expert_gating_func",
                &format!("is {other:?}; Kimi K3 routes with a sigmoid (2) or softmax (1)"),
            ))
        }
    };
    let beta = keys.arch_optional_float("activation.situ_beta")?;
    let linear_beta = keys.arch_optional_float("activation.situ_linear_beta")?;
    let (Some(beta), Some(linear_beta)) = (beta, linear_beta) else {
        return Err(keys.arch_invalid("activation.situ_beta", "and activation.situ_linear_beta are both required"));
    };
    if beta <= 0.0 {
        return Err(keys.arch_invalid("activation.situ_beta", &format!("is {beta}; it must be above 0")));
    }
    Ok(MoeParams {
        experts,
        experts_used,
        expert_feed_forward: keys.arch_count("expert_feed_forward_length")?,
        gating,
        activation: ExpertActivation::Situ { beta: beta as f32, linear_beta: linear_beta as f32 },
        normalize: keys.arch_optional_bool("expert_weights_norm")?.unwrap_or(false),
        scale: keys.arch_optional_float("expert_weights_scale")?.unwrap_or(0.0) as f32,
        shared_experts: keys.arch_optional_count("expert_shared_count")?.unwrap_or(0),
        leading_dense_layers: keys.arch_optional_count("leading_dense_block_count")?.unwrap_or(0).min(config.layers),
        groups: None,
    })
}

impl KimiK3 {
    /// The experts' latent width (the embedding when the file has none).
    pub fn latent_width(config: &ModelConfig) -> usize {
        config.expert_latent.unwrap_or(config.embedding)
    }
}

impl Declare for KimiK3 {
    type Layer = KimiK3Layer<Declared>;

    fn hyper_parameters(&self, keys: &Keys<'_>, config: &mut ModelConfig) -> Result<(), ModelError> {
        let linear = delta_attention(keys, config)?;
        if linear.layers.iter().all(|&l| l) {
            return Err(keys.arch_invalid("attention.head_count_kv", "is 0 for every layer: no attention layer"));
        }
        config.linear_attention = Some(linear);
        // llama.cpp's converter always splits the latent expansion (attn_k_b, attn_v_b) and says so.
        for key in ["attention.key_length_mla", "attention.value_length_mla"] {
            if keys.arch_optional_count(key)?.is_none() {
                return Err(keys.arch_invalid(
                    key,
                    "is missing: Kimi K3 files carry the split latent expansion (attn_k_b, attn_v_b) and its widths",
                ));
            }
        }
        config.latent_attention = Some(latent_attention(keys, config, false)?);
        let moe = experts(keys, config)?;
        if moe.leading_dense_layers > 0 && config.feed_forward == 0 {
            return Err(keys.arch_invalid("feed_forward_length", "is missing, and the leading dense layers need it"));
        }
        config.moe = Some(moe);
        config.expert_latent = keys.arch_optional_count("expert_latent_length")?;
        config.residual_block = keys.arch_optional_size("attn_res.block_size")?.filter(|&n| n > 0);
        Ok(())
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
        let mla = config.latent_attention.expect("kimi-k3 reads its attention parameters when the model opens");
        latent_cache_row(config, &mla)
    }

    fn layer(&self, config: &ModelConfig, layer: usize) -> Self::Layer {
        let e = config.embedding;
        let moe = config.moe.as_ref().expect("kimi-k3 reads its expert parameters when the model opens");
        let mixer = match config.linear_attention.as_ref().filter(|l| l.is_linear(layer)) {
            Some(l) => {
                // A tensor-parallel rank holds whole heads (its keys are per head, like its values):
                // their rows of every projection, convolution and gate, its inputs of the output
                // projection, and their recurrent state. The decay's first projection, to one head's
                // width, and the per-head norm are held whole.
                let (inner, head, heads) = (l.inner, l.head_width, l.value_heads);
                let rows = |shape: &[usize]| Declared::new(shape).split(shape.len() - 1, Part::QueryHeads);
                let conv = || rows(&[l.conv_kernel, 1, inner]);
                KimiMixer::Linear(KimiDeltaAttention {
                    q: rows(&[e, inner]),
                    k: rows(&[e, inner]),
                    v: rows(&[e, inner]),
                    q_conv: conv(),
                    k_conv: conv(),
                    v_conv: conv(),
                    decay_a: Declared::new(&[e, head]),
                    decay_b: rows(&[head, inner]),
                    beta: rows(&[e, heads]),
                    a: rows(&[heads]),
                    dt_bias: rows(&[inner]),
                    gate: rows(&[e, inner]),
                    norm: Declared::new(&[head]),
                    output: Declared::new(&[inner, e]).split(0, Part::QueryHeads),
                })
            }
            None => KimiMixer::Full(gated_latent_attention(config)),
        };
        let feed_forward = if moe.is_sparse(layer) {
            let latent = Self::latent_width(config);
            let f = moe.expert_feed_forward;
            let routed = Experts {
                gate: Declared::new(&[latent, f, moe.experts]).split(2, Part::Experts),
                up: Declared::new(&[latent, f, moe.experts]).split(2, Part::Experts),
                down: Declared::new(&[f, latent, moe.experts]).split(2, Part::Experts),
                selection_bias: Some(Declared::new(&[moe.experts])),
                ..Experts::declare(config, moe)
            };
            KimiFeedForward::Sparse(LatentExperts {
                routed,
                latent: config.expert_latent.map(|latent| LatentProjection {
                    down: Declared::new(&[e, latent]),
                    up: Declared::new(&[latent, e]),
                    norm: Some(Declared::optional(&[latent])),
                }),
                shared: (moe.shared_experts > 0).then(|| SharedExperts::declare(config, f * moe.shared_experts)),
            })
        } else {
            KimiFeedForward::Dense(FeedForward::declare(config, config.feed_forward))
        };
        KimiK3Layer {
            attn_norm: Declared::new(&[e]),
            ffn_norm: Declared::new(&[e]),
            residual_scores: config
                .residual_block
                .map(|_| ResidualScores { attention: Declared::new(&[e]), feed_forward: Declared::new(&[e]) }),
            mixer,
            feed_forward,
        }
    }

    fn global_tensors(&self, config: &ModelConfig) -> Vec<ExpectedTensor> {
        let mut globals = layout::standard_globals(config);
        if config.residual_block.is_some() {
            globals.push(layout::global(OUTPUT_RESIDUAL_SCORE, &[config.embedding], true));
        }
        globals
    }
}

/// Kimi K3's latent attention: DeepSeek's (whose rotary part is never rotated here; always in the split
/// form, the only one the model opens with), gated.
fn gated_latent_attention(config: &ModelConfig) -> GatedLatentAttention<Declared> {
    let mla = config.latent_attention.expect("kimi-k3 reads its attention parameters when the model opens");
    GatedLatentAttention {
        attention: LatentLayer::declare(config),
        gate: Some(Declared::optional(&[config.embedding, config.heads * mla.value_head]).split(1, Part::QueryHeads)),
    }
}
