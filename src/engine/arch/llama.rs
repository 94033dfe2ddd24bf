//! The llama family: Llama 2/3, Mistral and SmolLM (`llama`), Qwen 2/2.5 (`qwen2`: NeoX RoPE, biases on
//! Q, K and V) and Qwen 3 (`qwen3`: NeoX RoPE, an RMS norm on each head of Q and K). One graph, as
//! llama.cpp's `src/models/llama.cpp`, `qwen2.cpp` and `qwen3.cpp` compute it: attention, then a SwiGLU
//! feed-forward, each behind an RMS norm and a residual. A `llama` file with `expert_count` (Mixtral)
//! has softmax-routed experts of the feed-forward's width instead.

use super::ArchSpec;
use crate::engine::blocks::{self, StepContext};
use crate::engine::weights::LayerWeights;
use crate::ggml::{GraphBuilder, Tensor};
use crate::model::config::Keys;
use crate::model::layout::{self, ExpectedTensor};
use crate::model::{ExpertActivation, Gating, ModelConfig, ModelError, MoeParams};

pub struct Dense {
    rope_mode: i32,
    /// Whether the per-head Q/K norms are required (Qwen 3) or absent.
    head_norms_required: bool,
    /// Whether a file may route its feed-forward to experts (Mixtral is a `llama`).
    experts_allowed: bool,
}

pub static LLAMA: Dense = Dense { rope_mode: 0, head_norms_required: false, experts_allowed: true };
pub static QWEN2: Dense = Dense { rope_mode: 2, head_norms_required: false, experts_allowed: false };
pub static QWEN3: Dense = Dense { rope_mode: 2, head_norms_required: true, experts_allowed: false };

impl ArchSpec for Dense {
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

    fn layer_tensors(&self, config: &ModelConfig, layer: usize) -> Vec<ExpectedTensor> {
        let head_norms = self.head_norms_required.then_some(true);
        let mut list = layout::attention_tensors(config, layer, head_norms);
        list.push(ExpectedTensor::layer(layer, "ffn_norm.weight", &[config.embedding], true));
        match &config.moe {
            Some(moe) => list.extend(layout::expert_tensors(config, layer, moe)),
            None => list.extend(layout::feed_forward_tensors(config, layer, "", config.feed_forward)),
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
        let eps = step.config.rms_epsilon;
        let ffn_in = blocks::attention_block(g, step, layer, w, x);
        let h = blocks::norm(g, ffn_in, w.req("ffn_norm.weight"), eps);
        let h = match &step.config.moe {
            Some(moe) => blocks::moe_feed_forward(g, step, w, moe, h),
            None => blocks::feed_forward(g, step, w, "", h),
        };
        g.add(h, ffn_in)
    }
}
