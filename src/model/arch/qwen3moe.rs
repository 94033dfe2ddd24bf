//! Qwen 3 mixture-of-experts (`qwen3moe`: Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen 3 attention (per-head
//! Q/K norms, NeoX RoPE), and in every layer a router choosing `expert_used_count` of `expert_count`
//! experts by softmax, their weights normalised to sum to one.

use super::groups::{Attention, Experts};
use super::tensor_group::{tensor_group, Declared};
use super::Declare;
use crate::model::config::Keys;
use crate::model::{ModelConfig, ModelError, MoeParams};

pub struct Qwen3Moe;

tensor_group! {
    /// A Qwen 3 MoE layer.
    pub struct Qwen3MoeLayer {
        attn_norm: tensor "attn_norm.weight",
        attention: group Attention,
        ffn_norm: tensor "ffn_norm.weight",
        experts: group Experts,
    }
}

impl Declare for Qwen3Moe {
    type Layer = Qwen3MoeLayer<Declared>;

    fn hyper_parameters(&self, keys: &Keys<'_>, config: &mut ModelConfig) -> Result<(), ModelError> {
        let width = keys.arch_optional_count("expert_feed_forward_length")?;
        // llama.cpp's fallback when a file lacks the expert width: the dense width over the experts used.
        let (experts, experts_used) = super::expert_counts(keys)?;
        let expert_feed_forward = width.unwrap_or(config.feed_forward / experts_used);
        let scale = keys.arch_optional_float("expert_weights_scale")?.unwrap_or(0.0) as f32;
        let groups = super::expert_groups(keys, experts)?;
        config.moe = Some(MoeParams { groups, ..MoeParams::qwen(experts, experts_used, expert_feed_forward, scale) });
        Ok(())
    }

    fn rope_mode(&self) -> i32 {
        2
    }

    fn layer(&self, config: &ModelConfig, _layer: usize) -> Self::Layer {
        let moe = config.moe.as_ref().expect("qwen3moe reads its expert parameters when the model opens");
        Qwen3MoeLayer {
            attn_norm: Declared::new(&[config.embedding]),
            attention: Attention::declare(config, Some(true)),
            ffn_norm: Declared::new(&[config.embedding]),
            experts: Experts::declare(config, moe),
        }
    }
}
