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
use crate::model::layout::Part;
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
        // A tensor-parallel rank holds whole heads: each one's queries and gate, its key/value heads'
        // rows, the matching inputs of the output projection.
        GatedAttention {
            q_and_gate: Declared::new(&[e, 2 * q]).split(1, Part::QueryHeads),
            k: Declared::new(&[e, kv]).split(1, Part::KvHeads),
            v: Declared::new(&[e, kv]).split(1, Part::KvHeads),
            output: Declared::new(&[q, e]).split(0, Part::QueryHeads),
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

    /// A rank holds whole attention heads and, in the linear layers, the value heads that go with them:
    /// a whole number of them per attention head.
    fn splits_across_ranks(&self, config: &ModelConfig) -> Result<(), String> {
        match &config.linear_attention {
            Some(l) if !l.value_heads.is_multiple_of(config.heads) => Err(format!(
                "its {} linear-attention value heads do not divide evenly among its {} attention heads, which \
                 is how shoal divides them among tensor-parallel ranks; use --parallel pipeline",
                l.value_heads, config.heads
            )),
            _ => Ok(()),
        }
    }

    fn layer(&self, config: &ModelConfig, layer: usize) -> Self::Layer {
        let e = config.embedding;
        let mixer = match config.linear_attention.as_ref().filter(|l| l.is_linear(layer)) {
            Some(l) => {
                // A tensor-parallel rank holds its value heads (with its attention heads' share) and
                // every key head, which value heads on either side of any cut read: the queries' and
                // keys' rows of the mixed projection and the convolution whole, then its values' rows.
                let (channels, heads) = (l.conv_channels(), l.value_heads);
                let keys = 2 * l.key_heads * l.head_width;
                let rows = |shape: &[usize]| Declared::new(shape).split(shape.len() - 1, Part::QueryHeads);
                Qwen35Mixer::Linear(GatedDeltaNet {
                    qkv: Declared::new(&[e, channels]).split_after(keys, Part::QueryHeads),
                    gate: rows(&[e, l.inner]),
                    conv: Declared::new(&[l.conv_kernel, channels]).split_after(keys, Part::QueryHeads),
                    dt_bias: rows(&[heads]),
                    a: rows(&[heads]),
                    beta: rows(&[e, heads]),
                    alpha: rows(&[e, heads]),
                    norm: Declared::new(&[l.head_width]),
                    output: Declared::new(&[l.inner, e]).split(0, Part::QueryHeads),
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
