//! GLM-4.5's layer (`glm4moe`; declared in [`crate::model::arch::Glm4Moe`]), as llama.cpp's
//! `src/models/glm4-moe.cpp` computes it: attention, then a dense feed-forward or routed and shared
//! experts behind a `post_attention_norm`.

use super::{Bound, Graph};
use crate::engine::blocks::{self, StepContext};
use crate::ggml::{GraphBuilder, Tensor};
use crate::model::arch::Glm4Moe;

impl Graph for Glm4Moe {
    fn layer<'g>(
        &self,
        g: &'g GraphBuilder,
        step: &StepContext<'_, 'g>,
        layer: usize,
        w: &Bound<Self>,
        x: Tensor<'g>,
    ) -> Tensor<'g> {
        let c = step.config;
        let moe = c.moe.as_ref().expect("glm4moe reads its expert parameters when the model opens");
        let ffn_in = blocks::attention_block(g, step, layer, &w.attn_norm, &w.attention, x);
        let h = blocks::norm(g, ffn_in, &w.post_attention_norm, c.rms_epsilon);
        g.add(blocks::sparse_or_dense_feed_forward(g, step, &w.feed_forward, moe, h), ffn_in)
    }
}
