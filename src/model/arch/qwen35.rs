//! Qwen3.5 / 3.6 (`qwen35` dense, `qwen35moe` mixture-of-experts): layers of linear attention with a
//! recurrent state (the gated delta-net) and, every `full_attention_interval`-th layer, gated full
//! attention — Q projected together with an output gate, per-head Q/K norms, interleaved M-RoPE on part
//! of each head. Every layer has an RMS norm before its attention and one before its feed-forward
//! (`post_attention_norm`). The MoE layers route each token to softmax-chosen experts and add a shared
//! expert scaled by a sigmoid gate of its own. The files' next-token-prediction layers are skipped
//! (not mapped, not counted).

use super::groups::{Experts, FeedForward, SharedExperts};
use super::tensor_group::{tensor_group, Declared};
use super::Declare;
use crate::model::config::Keys;
use crate::model::{LinearAttention, ModelConfig, ModelError, MoeParams};

pub struct Qwen35 {
    pub(super) experts: bool,
}

tensor_group! {
    /// A Qwen3.5 layer.
    pub struct Qwen35Layer {
        attn_norm: tensor "attn_norm.weight",
        post_attention_norm: tensor "post_attention_norm.weight",
        mixer: group Qwen35Mixer,
        feed_forward: group Qwen35FeedForward,
    }
}

tensor_group! {
    /// What a layer attends with.
    pub enum Qwen35Mixer {
        Linear(GatedDeltaNet),
        Full(GatedAttention),
    }
}

tensor_group! {
    /// The gated delta-net: queries, keys and values mixed in one projection, the output gate, the
    /// short convolution, the decay (`ssm_a`, `ssm_dt.bias`, `ssm_alpha`), the write strength
    /// (`ssm_beta`), the norm of each head's output and the output projection.
    pub struct GatedDeltaNet {
        qkv: tensor "attn_qkv.weight",
        gate: tensor "attn_gate.weight",
        conv: tensor "ssm_conv1d.weight",
        dt_bias: tensor "ssm_dt.bias",
        a: tensor "ssm_a",
        beta: tensor "ssm_beta.weight",
        alpha: tensor "ssm_alpha.weight",
        norm: tensor "ssm_norm.weight",
        output: tensor "ssm_out.weight",
    }
}

tensor_group! {
    /// Full attention whose query projection also yields an output gate (per head: its queries, then
    /// its gate).
    pub struct GatedAttention {
        q_and_gate: tensor "attn_q.weight",
        k: tensor "attn_k.weight",
        v: tensor "attn_v.weight",
        output: tensor "attn_output.weight",
        q_norm: tensor "attn_q_norm.weight",
        k_norm: tensor "attn_k_norm.weight",
    }
}

tensor_group! {
    /// Dense, or routed experts plus a gated shared expert.
    pub enum Qwen35FeedForward {
        Dense(FeedForward),
        Experts(GatedSharedExperts),
    }
}

tensor_group! {
    /// Routed experts and a shared expert scaled by σ(`ffn_gate_inp_shexp` · x).
    pub struct GatedSharedExperts {
        routed: group Experts,
        shared: group SharedExperts,
        shared_gate: tensor "ffn_gate_inp_shexp.weight",
    }
}

impl GatedAttention<Declared> {
    /// The gated attention of `config`'s full-attention layers.
    pub fn declare(config: &ModelConfig) -> GatedAttention<Declared> {
        let (e, hd, q) = (config.embedding, config.head_dim, config.heads * config.head_dim);
        let kv = config.kv_heads * hd;
        GatedAttention {
            q_and_gate: Declared::new(&[e, 2 * q]),
            k: Declared::new(&[e, kv]),
            v: Declared::new(&[e, kv]),
            output: Declared::new(&[q, e]),
            q_norm: Declared::new(&[hd]),
            k_norm: Declared::new(&[hd]),
        }
    }
}

impl Declare for Qwen35 {
    type Layer = Qwen35Layer<Declared>;

    fn hyper_parameters(&self, keys: &Keys<'_>, config: &mut ModelConfig) -> Result<(), ModelError> {
        super::skip_next_token_layers(keys, config)?;
        config.linear_attention = Some(LinearAttention::read(keys, config.layers)?);
        let sections = keys
            .arch_integers("rope.dimension_sections")
            .filter(|s| !s.is_empty() && s.len() <= 4 && s.iter().all(|&n| n <= 1 << 16))
            .ok_or_else(|| {
                keys.arch_invalid("rope.dimension_sections", "is missing or is not a list of up to four counts")
            })?;
        let mut four = [0i32; 4];
        sections.iter().zip(&mut four).for_each(|(&n, slot)| *slot = n as i32);
        config.rope_sections = Some(four);
        if self.experts {
            let (experts, experts_used) = super::expert_counts(keys)?;
            let expert_feed_forward = keys.arch_count("expert_feed_forward_length")?;
            let scale = keys.arch_optional_float("expert_weights_scale")?.unwrap_or(0.0) as f32;
            config.moe = Some(MoeParams::qwen(experts, experts_used, expert_feed_forward, scale));
            // The shared expert's width, when the file gives one (else the dense width, as llama.cpp).
            match keys.arch_optional_count("expert_shared_feed_forward_length")? {
                Some(width) => config.feed_forward = width,
                None if config.feed_forward == 0 => {
                    return Err(keys.arch_invalid(
                        "expert_shared_feed_forward_length",
                        "is missing, and so is feed_forward_length: the shared expert's width is unknown",
                    ))
                }
                None => {}
            }
        }
        Ok(())
    }

    fn partial_rotary(&self) -> bool {
        true
    }

    fn rope_mode(&self) -> i32 {
        ROPE_INTERLEAVED_SECTIONS
    }

    fn splits_across_ranks(&self) -> Result<(), String> {
        Err("Qwen3.5's linear-attention layers are not divided among tensor-parallel ranks yet; \
             use --parallel pipeline"
            .into())
    }

    fn layer(&self, config: &ModelConfig, layer: usize) -> Self::Layer {
        let e = config.embedding;
        let mixer = match config.linear_attention.as_ref().filter(|l| l.is_linear(layer)) {
            Some(l) => {
                let (channels, heads) = (l.conv_channels(), l.value_heads);
                Qwen35Mixer::Linear(GatedDeltaNet {
                    qkv: Declared::new(&[e, channels]),
                    gate: Declared::new(&[e, l.inner]),
                    conv: Declared::new(&[l.conv_kernel, channels]),
                    dt_bias: Declared::new(&[heads]),
                    a: Declared::new(&[heads]),
                    beta: Declared::new(&[e, heads]),
                    alpha: Declared::new(&[e, heads]),
                    norm: Declared::new(&[l.head_width]),
                    output: Declared::new(&[l.inner, e]),
                })
            }
            None => Qwen35Mixer::Full(GatedAttention::declare(config)),
        };
        let feed_forward = match &config.moe {
            Some(moe) => Qwen35FeedForward::Experts(GatedSharedExperts {
                routed: Experts::declare(config, moe),
                shared: SharedExperts::declare(config, config.feed_forward),
                shared_gate: Declared::new(&[e]),
            }),
            None => Qwen35FeedForward::Dense(FeedForward::declare(config, config.feed_forward)),
        };
        Qwen35Layer { attn_norm: Declared::new(&[e]), post_attention_norm: Declared::new(&[e]), mixer, feed_forward }
    }
}

/// ggml's interleaved multi-section RoPE (`GGML_ROPE_TYPE_IMROPE`).
const ROPE_INTERLEAVED_SECTIONS: i32 = 40;
