//! Qwen 3 mixture-of-experts (`qwen3moe`: Qwen3-30B-A3B, Qwen3-235B-A22B), as llama.cpp's
//! `src/models/qwen3moe.cpp` computes it: Qwen 3 attention (per-head Q/K norms, NeoX RoPE), and in every
//! layer a router choosing `expert_used_count` of `expert_count` experts by softmax, their weights
//! normalised to sum to one.

use super::ArchSpec;
use crate::engine::blocks::{self, StepContext};
use crate::engine::weights::LayerWeights;
use crate::ggml::{GraphBuilder, Tensor};
use crate::model::config::Keys;
use crate::model::layout::{self, ExpectedTensor};
use crate::model::{ExpertActivation, Gating, ModelConfig, ModelError, MoeParams};

pub struct Qwen3Moe;

pub static QWEN3MOE: Qwen3Moe = Qwen3Moe;

impl ArchSpec for Qwen3Moe {
    fn hyper_parameters(&self, keys: &Keys<'_>, config: &mut ModelConfig) -> Result<(), ModelError> {
        let width = keys.arch_optional_count("expert_feed_forward_length")?;
        // llama.cpp's fallback when a file lacks the expert width: the dense width over the experts used.
        let (experts, experts_used) = super::expert_counts(keys)?;
        let expert_feed_forward = width.unwrap_or(config.feed_forward / experts_used);
        let scale = keys.arch_optional_float("expert_weights_scale")?.unwrap_or(0.0) as f32;
        config.moe = Some(MoeParams {
            experts,
            experts_used,
            expert_feed_forward,
            gating: Gating::Softmax,
            activation: ExpertActivation::Silu,
            normalize: true,
            scale,
            shared_experts: 0,
            leading_dense_layers: 0,
            groups: super::expert_groups(keys, experts)?,
        });
        Ok(())
    }

    fn rope_mode(&self) -> i32 {
        2
    }

    fn layer_tensors(&self, config: &ModelConfig, layer: usize) -> Vec<ExpectedTensor> {
        let mut list = layout::attention_tensors(config, layer, Some(true));
        list.push(ExpectedTensor::layer(layer, "ffn_norm.weight", &[config.embedding], true));
        if let Some(moe) = &config.moe {
            list.extend(layout::expert_tensors(config, layer, moe));
        }
        list
    }

    fn layer<'g>(
        &self,
        g: &'g GraphBuilder,
        step: &StepContext<'_, 'g>,
        layer: usize,
        w: &LayerWeights,
        x: Tensor<'g>,
    ) -> Tensor<'g> {
        let c = step.config;
        let moe = c.moe.as_ref().expect("qwen3moe reads its expert parameters when the model opens");
        let ffn_in = blocks::attention_block(g, step, layer, w, x);
        let h =
            blocks::moe_feed_forward(g, step, w, moe, blocks::norm(g, ffn_in, w.req("ffn_norm.weight"), c.rms_epsilon));
        g.add(h, ffn_in)
    }
}
