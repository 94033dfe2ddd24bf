//! The dense llama family: Llama 2/3, Mistral and SmolLM (`llama`), Qwen 2/2.5 (`qwen2`: NeoX RoPE,
//! biases on Q, K and V) and Qwen 3 (`qwen3`: NeoX RoPE, an RMS norm on each head of Q and K). One graph,
//! as llama.cpp's `src/models/llama.cpp`, `qwen2.cpp` and `qwen3.cpp` compute it: attention, then a
//! SwiGLU feed-forward, each behind an RMS norm and a residual.

use super::ArchSpec;
use crate::engine::blocks::{self, StepContext};
use crate::engine::weights::LayerWeights;
use crate::ggml::{GraphBuilder, Tensor};
use crate::model::layout::{self, ExpectedTensor};
use crate::model::ModelConfig;

pub struct Dense {
    rope_mode: i32,
    /// Whether the per-head Q/K norms are required (Qwen 3) or may be present.
    head_norms_required: bool,
}

pub static LLAMA: Dense = Dense { rope_mode: 0, head_norms_required: false };
pub static QWEN2: Dense = Dense { rope_mode: 2, head_norms_required: false };
pub static QWEN3: Dense = Dense { rope_mode: 2, head_norms_required: true };

impl ArchSpec for Dense {
    fn rope_mode(&self) -> i32 {
        self.rope_mode
    }

    fn layer_tensors(&self, config: &ModelConfig, layer: usize) -> Vec<ExpectedTensor> {
        let head_norms = self.head_norms_required.then_some(true);
        let mut list = layout::attention_tensors(config, layer, head_norms);
        list.push(ExpectedTensor::layer(layer, "ffn_norm.weight", &[config.embedding], true));
        list.extend(layout::feed_forward_tensors(config, layer, "", config.feed_forward));
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
        let h = blocks::attention(g, step, layer, w, blocks::norm(g, x, w.req("attn_norm.weight"), eps));
        let (h, residual) = step.prune_last_layer(g, layer, h, x);
        let ffn_in = g.add(h, residual);
        let h = blocks::feed_forward(g, w, "", blocks::norm(g, ffn_in, w.req("ffn_norm.weight"), eps));
        g.add(h, ffn_in)
    }
}
