//! DeepSeek V3.2's and GLM-5's layer (`deepseek32`, `glm-dsa`; declared in
//! [`crate::model::arch::SparseLatent`]), as llama.cpp's `src/models/deepseek32.cpp` and `glm-dsa.cpp`
//! compute it: DeepSeek V3's layer whose latent attention is sparse, each query attending only to the
//! positions the layer's lightning indexer chooses for it, or, in a GLM-5.2 layer without one, those
//! the last layer before it with one chose.

use super::deepseek2::{latent_layer, Sparsity};
use super::{Bound, Graph};
use crate::engine::blocks::StepContext;
use crate::ggml::{GraphBuilder, Tensor};
use crate::model::arch::SparseLatent;

impl Graph for SparseLatent {
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
