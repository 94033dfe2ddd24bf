//! The llama family's layer (`llama`, `qwen2`, `qwen3`; declared in [`crate::model::arch::Dense`]), as
//! llama.cpp's `src/models/llama.cpp`, `qwen2.cpp` and `qwen3.cpp` compute it: attention, then a SwiGLU
//! feed-forward (or Mixtral's experts), each behind an RMS norm and a residual.

use super::{Bound, Graph};
use crate::engine::blocks::{self, StepContext};
use crate::ggml::{GraphBuilder, Tensor};
use crate::model::arch::{Dense, DenseFeedForward};

impl Graph for Dense {
    fn layer<'g>(
        &self,
        g: &'g GraphBuilder,
        step: &StepContext<'_, 'g>,
        layer: usize,
        w: &Bound<Self>,
        x: Tensor<'g>,
    ) -> Tensor<'g> {
        let c = step.config;
        let ffn_in = blocks::attention_block(g, step, layer, &w.attn_norm, &w.attention, x);
        let h = blocks::norm(g, ffn_in, &w.ffn_norm, c.rms_epsilon);
        let h = match (&w.feed_forward, &c.moe) {
            (DenseFeedForward::Experts(experts), Some(moe)) => blocks::moe_feed_forward(g, step, experts, moe, h),
            (DenseFeedForward::Dense(ffn), _) => blocks::feed_forward(g, step, ffn.matrices(), h),
            (DenseFeedForward::Experts(_), None) => unreachable!("experts are declared only with their parameters"),
        };
        g.add(h, ffn_in)
    }
}
