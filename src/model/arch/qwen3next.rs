//! Qwen3-Next (`qwen3next`, Qwen3-Next-80B-A3B), Qwen3.5's predecessor: the same hybrid of gated
//! delta-net layers and, every `full_attention_interval`-th layer, gated full attention, with these
//! differences: value heads grouped by the key head they share (each key head repeated for its group),
//! one projection for the delta rule's write strength and decay together (`ssm_ba`: per key head, its
//! group's betas then its alphas), queries, keys, values and gate projected by `attn_qkv` and
//! `attn_gate` (or, in files converted before llama.cpp split it, by one interleaved `ssm_in`), NeoX
//! RoPE on part of each head, and in every layer routed experts plus a shared expert behind a sigmoid
//! gate. The files' next-token-prediction layers are skipped.

use super::groups::{Experts, SharedExperts};
use super::qwen35::{GatedAttention, GatedSharedExperts};
use super::tensor_group::{tensor_group, Declared};
use super::Declare;
use crate::model::config::Keys;
use crate::model::{LinearAttention, ModelConfig, ModelError, MoeParams};

pub struct Qwen3Next;

tensor_group! {
    /// A Qwen3-Next layer.
    pub struct Qwen3NextLayer {
        attn_norm: tensor "attn_norm.weight",
        post_attention_norm: tensor "post_attention_norm.weight",
        mixer: group Qwen3NextMixer,
        experts: group GatedSharedExperts,
    }
}

tensor_group! {
    /// What a layer attends with.
    pub enum Qwen3NextMixer {
        Linear(GroupedDeltaNet),
        Full(GatedAttention),
    }
}

tensor_group! {
    /// Qwen3-Next's gated delta-net (see the module's documentation).
    pub struct GroupedDeltaNet {
        input: group DeltaNetInput,
        conv: tensor "ssm_conv1d.weight",
        dt_bias: tensor "ssm_dt.bias",
        a: tensor "ssm_a",
        beta_alpha: tensor "ssm_ba.weight",
        norm: tensor "ssm_norm.weight",
        output: tensor "ssm_out.weight",
    }
}

tensor_group! {
    /// How queries, keys, values and the output gate are projected.
    pub enum DeltaNetInput {
        Split(SplitInput),
        /// One projection, interleaved per key head: its queries, keys, values and gates.
        Fused(FusedInput),
    }
}

tensor_group! {
    pub struct SplitInput {
        qkv: tensor "attn_qkv.weight",
        gate: tensor "attn_gate.weight",
    }
}

tensor_group! {
    pub struct FusedInput {
        qkvz: tensor "ssm_in.weight",
    }
}

impl Declare for Qwen3Next {
    type Layer = Qwen3NextLayer<Declared>;

    fn hyper_parameters(&self, keys: &Keys<'_>, config: &mut ModelConfig) -> Result<(), ModelError> {
        super::skip_next_token_layers(keys, config)?;
        let mut linear = LinearAttention::read(keys, config.layers)?;
        linear.value_heads_grouped = true;
        if let Some(first) = linear.layers.iter().position(|&l| l) {
            linear.fused_input = keys.has_tensor(&format!("blk.{first}.ssm_in.weight"));
        }
        config.linear_attention = Some(linear);
        let (experts, experts_used) = super::expert_counts(keys)?;
        // llama.cpp's fallbacks: the expert width from the dense width, the shared expert's the dense.
        let expert_feed_forward = match keys.arch_optional_count("expert_feed_forward_length")? {
            Some(width) => width,
            None => config.feed_forward / experts_used,
        };
        if let Some(width) = keys.arch_optional_count("expert_shared_feed_forward_length")? {
            config.feed_forward = width;
        }
        if expert_feed_forward == 0 || config.feed_forward == 0 {
            return Err(keys.arch_invalid(
                "expert_feed_forward_length",
                "is missing, and so is feed_forward_length: the experts' widths are unknown",
            ));
        }
        let scale = keys.arch_optional_float("expert_weights_scale")?.unwrap_or(0.0) as f32;
        config.moe = Some(MoeParams::qwen(experts, experts_used, expert_feed_forward, scale));
        Ok(())
    }

    fn partial_rotary(&self) -> bool {
        true
    }

    fn rope_mode(&self) -> i32 {
        2
    }

    fn splits_across_ranks(&self, _config: &ModelConfig) -> Result<(), String> {
        Err("Qwen3-Next's linear-attention layers are not divided among tensor-parallel ranks yet; \
             use --parallel pipeline"
            .into())
    }

    fn layer(&self, config: &ModelConfig, layer: usize) -> Self::Layer {
        let e = config.embedding;
        let moe = config.moe.as_ref().expect("qwen3next reads its expert parameters when the model opens");
        let mixer = match config.linear_attention.as_ref().filter(|l| l.is_linear(layer)) {
            Some(l) => {
                let (channels, heads) = (l.conv_channels(), l.value_heads);
                let input = if l.fused_input {
                    DeltaNetInput::Fused(FusedInput { qkvz: Declared::new(&[e, channels + l.inner]) })
                } else {
                    DeltaNetInput::Split(SplitInput {
                        qkv: Declared::new(&[e, channels]),
                        gate: Declared::new(&[e, l.inner]),
                    })
                };
                Qwen3NextMixer::Linear(GroupedDeltaNet {
                    input,
                    conv: Declared::new(&[l.conv_kernel, channels]),
                    dt_bias: Declared::new(&[heads]),
                    a: Declared::new(&[heads]),
                    beta_alpha: Declared::new(&[e, 2 * heads]),
                    norm: Declared::new(&[l.head_width]),
                    output: Declared::new(&[l.inner, e]),
                })
            }
            None => Qwen3NextMixer::Full(GatedAttention::declare(config)),
        };
        Qwen3NextLayer {
            attn_norm: Declared::new(&[e]),
            post_attention_norm: Declared::new(&[e]),
            mixer,
            experts: GatedSharedExperts {
                routed: Experts::declare(config, moe),
                shared: SharedExperts::declare(config, config.feed_forward),
                shared_gate: Declared::new(&[e]),
            },
        }
    }
}
