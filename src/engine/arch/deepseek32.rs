//! DeepSeek V3.2's layer (`deepseek32`; declared in [`crate::model::arch::Deepseek32`]), as llama.cpp's
//! `src/models/deepseek32.cpp` computes it: DeepSeek V3's layer whose latent attention is sparse, each
//! query attending only to the positions the layer's lightning indexer chooses for it.

use super::deepseek2::attention;
use super::{Bound, Graph};
use crate::engine::blocks::{self, StepContext};
use crate::ggml::{GraphBuilder, Tensor};
use crate::model::arch::Deepseek32;

impl Graph for Deepseek32 {
    fn layer<'g>(
        &self,
        g: &'g GraphBuilder,
        step: &StepContext<'_, 'g>,
        layer: usize,
        w: &Bound<Self>,
        x: Tensor<'g>,
    ) -> Tensor<'g> {
        let c = step.config;
        let moe = c.moe.as_ref().expect("deepseek32 reads its expert parameters when the model opens");
        let normed = blocks::norm(g, x, &w.attn_norm, c.rms_epsilon);
        let h = attention(g, step, layer, &w.attention, Some(&w.indexer), normed);
        let (h, residual) = step.prune_last_layer(g, layer, h, x);
        let ffn_in = g.add(h, residual);
        let h = blocks::norm(g, ffn_in, &w.ffn_norm, c.rms_epsilon);
        g.add(blocks::sparse_or_dense_feed_forward(g, step, &w.feed_forward, moe, h), ffn_in)
    }
}
