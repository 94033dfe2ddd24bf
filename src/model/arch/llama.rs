//! The llama family: Llama 2/3, Mistral and SmolLM (`llama`), Qwen 2/2.5 (`qwen2`: NeoX RoPE, biases on
//! Q, K and V) and Qwen 3 (`qwen3`: NeoX RoPE, an RMS norm on each head of Q and K). Each layer has
//! attention and a SwiGLU feed-forward, each behind an RMS norm; a `llama` file with `expert_count`
//! (Mixtral) has softmax-routed experts of the feed-forward's width instead.

use super::groups::{Attention, Experts, FeedForward};
use super::tensor_group::{tensor_group, Declared};
use super::Declare;
use crate::model::config::Keys;
use crate::model::{ExpertActivation, Gating, ModelConfig, ModelError, MoeParams};

pub struct Dense {
    pub(super) rope_mode: i32,
    /// Whether the per-head Q/K norms are required (Qwen 3) or absent.
    pub(super) head_norms_required: bool,
    /// Whether a file may route its feed-forward to experts (Mixtral is a `llama`).
    pub(super) experts_allowed: bool,
}

tensor_group! {
    /// A llama-family layer.
    pub struct DenseLayer {
        attn_norm: tensor "attn_norm.weight",
        attention: group Attention,
        ffn_norm: tensor "ffn_norm.weight",
        feed_forward: group DenseFeedForward,
    }
}

tensor_group! {
    /// A llama layer's feed-forward: dense, or routed to experts (Mixtral).
    pub enum DenseFeedForward {
        Dense(FeedForward),
        Experts(Experts),
    }
}

impl Declare for Dense {
    type Layer = DenseLayer<Declared>;

    fn hyper_parameters(&self, keys: &Keys<'_>, config: &mut ModelConfig) -> Result<(), ModelError> {
        if !self.experts_allowed || keys.arch_optional_count("expert_count")?.is_none() {
            return Ok(());
        }
        let (experts, used) = super::expert_counts(keys)?;
        config.moe = Some(MoeParams {
            experts,
            experts_used: used,
            expert_feed_forward: config.feed_forward,
            gating: Gating::Softmax,
            activation: ExpertActivation::Silu,
            normalize: true,
            scale: keys.arch_optional_float("expert_weights_scale")?.unwrap_or(0.0) as f32,
            shared_experts: 0,
            leading_dense_layers: 0,
            groups: super::expert_groups(keys, experts)?,
        });
        Ok(())
    }

    fn rope_mode(&self) -> i32 {
        self.rope_mode
    }

    fn layer(&self, config: &ModelConfig, _layer: usize) -> Self::Layer {
        let e = config.embedding;
        DenseLayer {
            attn_norm: Declared::new(&[e]),
            attention: Attention::declare(config, self.head_norms_required.then_some(true)),
            ffn_norm: Declared::new(&[e]),
            feed_forward: match &config.moe {
                Some(moe) => DenseFeedForward::Experts(Experts::declare(config, moe)),
                None => DenseFeedForward::Dense(FeedForward::declare(config, config.feed_forward)),
            },
        }
    }
}
