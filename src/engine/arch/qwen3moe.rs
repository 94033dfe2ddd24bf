//! Qwen 3 mixture-of-experts' layer (`qwen3moe`; declared in [`crate::model::arch::Qwen3Moe`]), as
//! llama.cpp's `src/models/qwen3moe.cpp` computes it: Qwen 3 attention, then the routed experts, each
//! behind an RMS norm and a residual.

use super::{Bound, Graph};
use crate::engine::blocks::{self, StepContext};
use crate::ggml::{GraphBuilder, Tensor};
use crate::model::arch::Qwen3Moe;

impl Graph for Qwen3Moe {
    fn layer<'g>(
        &self,
        g: &'g GraphBuilder,
        step: &StepContext<'_, 'g>,
        layer: usize,
        w: &Bound<Self>,
        x: Tensor<'g>,
    ) -> Tensor<'g> {
        let c = step.config;
        let moe = c.moe.as_ref().expect("qwen3moe reads its expert parameters when the model opens");
        let ffn_in = blocks::attention_block(g, step, layer, &w.attn_norm, &w.attention, x);
        let h = blocks::norm(g, ffn_in, &w.ffn_norm, c.rms_epsilon);
        g.add(blocks::moe_feed_forward(g, step, &w.experts, moe, h), ffn_in)
    }
}
