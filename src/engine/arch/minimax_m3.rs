//! MiniMax M3's layer (`minimax-m3`; declared in [`crate::model::arch::MinimaxM3`]), as llama.cpp's
//! `src/models/minimax-m3.cpp` computes it: attention (block-sparse in the layers with experts), then
//! the dense or mixture-of-experts feed-forward with swigluoai, each behind an RMS norm and a residual.

use super::{Bound, Graph};
use crate::engine::blocks::{self, StepContext};
use crate::ggml::{GraphBuilder, Tensor};
use crate::model::arch::MinimaxM3;

impl Graph for MinimaxM3 {
    fn layer<'g>(
        &self,
        g: &'g GraphBuilder,
        step: &StepContext<'_, 'g>,
        layer: usize,
        w: &Bound<Self>,
        x: Tensor<'g>,
    ) -> Tensor<'g> {
        let c = step.config;
        let moe = c.moe.as_ref().expect("minimax-m3 reads its expert parameters when the model opens");
        let ffn_in = match &w.indexer {
            None => blocks::attention_block(g, step, layer, &w.attn_norm, &w.attention, x),
            Some(indexer) => {
                let normed = blocks::norm(g, x, &w.attn_norm, c.rms_epsilon);
                let h = blocks::block_sparse_attention(g, step, layer, &w.attention, indexer, normed);
                let (h, residual) = step.prune_last_layer(g, layer, h, x);
                g.add(h, residual)
            }
        };
        let h = blocks::norm(g, ffn_in, &w.ffn_norm, c.rms_epsilon);
        g.add(blocks::sparse_or_dense_feed_forward(g, step, &w.feed_forward, moe, h), ffn_in)
    }
}
