//! GLM-5's layer (`glm-dsa`; declared in [`crate::model::arch::GlmDsa`]), as llama.cpp's
//! `src/models/glm-dsa.cpp` computes it: DeepSeek V3.2's layer, whose latent attention reads the
//! positions its own lightning indexer chooses, or, in a layer without one, those the last layer
//! before it with one chose.

use super::deepseek2::{latent_layer, Sparsity};
use super::{Bound, Graph};
use crate::engine::blocks::StepContext;
use crate::ggml::{GraphBuilder, Tensor};
use crate::model::arch::GlmDsa;

impl Graph for GlmDsa {
    fn layer<'g>(
        &self,
        g: &'g GraphBuilder,
        step: &StepContext<'_, 'g>,
        layer: usize,
        w: &Bound<Self>,
        x: Tensor<'g>,
    ) -> Tensor<'g> {
        let sparsity = match &w.indexer {
            Some(indexer) => Sparsity::Indexed(indexer),
            None => Sparsity::Reused,
        };
        let norms = [&w.attn_norm, &w.ffn_norm];
        latent_layer(g, step, layer, norms, &w.attention, sparsity, &w.feed_forward, x)
    }
}
