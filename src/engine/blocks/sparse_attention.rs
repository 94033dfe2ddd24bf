//! DeepSeek sparse attention (DeepSeek V3.2), as llama.cpp's `src/models/deepseek32.cpp` computes it:
//! a step's lightning indexer — its heads' queries, its one key per position (cached beside the
//! position's latent: [`crate::model::CacheRow::indexer_width`]) and its heads' weights —, and for each
//! run of the step's segments the causal mask narrowed to the `top_k` positions each query scores
//! highest, through which the layer's latent attention then attends; GLM-5.2's layers without an
//! indexer narrow it to the choice of the last layer before them that has one.

use super::{AttentionRun, StepContext};
use crate::ggml::{DType, GraphBuilder, RopeParams, SetTensorRef, Tensor};
use crate::model::arch::LightningIndexer;

/// One layer's lightning indexer over a step.
pub(in crate::engine) struct Indexer<'g> {
    /// The indexer heads' queries, turned and rotated: [width, heads, tokens].
    queries: Tensor<'g>,
    /// Each position's key, turned and rotated, as the cache stores it beside the latent: [width, tokens].
    pub keys: Tensor<'g>,
    /// Each head's weight per token, scaled by 1/√(width · heads): [heads, tokens].
    weights: Tensor<'g>,
    /// The layer's index within the stage.
    layer: usize,
}

/// The lightning indexer of layer `layer` (within the stage) over the step: queries from the query
/// bottleneck's normed output `bottleneck` ([q_lora_rank, tokens]), keys and weights from the layer's
/// normed input `x`. Queries and keys are turned by RoPE (in the model's indexer mode) on their first
/// rotary dimensions and rotated by the Walsh-Hadamard matrix (a plain product, as llama.cpp's).
pub(in crate::engine) fn indexer<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    w: &LightningIndexer<SetTensorRef>,
    x: Tensor<'g>,
    bottleneck: Tensor<'g>,
    layer: usize,
) -> Indexer<'g> {
    let c = step.config;
    let sparse = c.sparse_attention.as_ref().expect("a sparse model reads its indexer parameters");
    let (width, heads, t) = (sparse.width as i64, sparse.heads as i64, step.tokens());
    let rope = RopeParams {
        n_dims: c.rope.dimensions as i32,
        mode: sparse.rope_mode,
        n_ctx_orig: c.rope.original_context as i32,
        freq_base: c.rope.freq_base,
        freq_scale: c.rope.freq_scale,
        ext_factor: c.rope.ext_factor,
        attn_factor: c.rope.attn_factor,
        beta_fast: c.rope.beta_fast,
        beta_slow: c.rope.beta_slow,
    };
    let rotation = step.rotate_indexer.expect("a stage with sparse attention has the indexer's rotation");
    let queries = g.reshape_3d(g.mul_mat(g.stored(&w.q_b), bottleneck), width, heads, t);
    let queries = g.mul_mat(rotation, g.rope(queries, step.positions, None, &rope));
    let keys = g.mul_mat(g.stored(&w.k), x);
    // llama.cpp's layer norm epsilon for this architecture.
    let keys = g.add(g.mul(g.layer_norm(keys, 1e-6), g.stored(&w.k_norm)), g.stored(&w.k_norm_bias));
    let keys = g.rope(g.reshape_3d(keys, width, 1, t), step.positions, None, &rope);
    let keys = g.reshape_2d(g.mul_mat(rotation, keys), width, t);
    let weights = g.scale(g.mul_mat(g.stored(&w.weights), x), 1.0 / ((width * heads) as f32).sqrt());
    Indexer { queries, keys, weights, layer }
}

impl<'g> Indexer<'g> {
    /// The run's part of the causal mask (`mask`: [attended, tokens, 1, sequences], F16) narrowed to
    /// the positions each query scores highest over its sequence's cached indexer keys (at most
    /// `top_k`; every position when fewer are attended); the choice is kept for the layers after this
    /// one that reuse it ([`reused_choice`]).
    pub fn narrowed(
        &self,
        g: &'g GraphBuilder,
        step: &StepContext<'_, 'g>,
        run: &AttentionRun,
        mask: Tensor<'g>,
    ) -> Tensor<'g> {
        let sparse = step.config.sparse_attention.as_ref().expect("a sparse model reads its indexer parameters");
        let first = step.shape.segments[run.segments.start];
        let (t, n, attended) = (first.tokens as i64, run.segments.len() as i64, first.attended);
        let [width, heads, ..] = self.queries.shape();
        let q_st = self.queries.strides();
        let queries =
            g.view(self.queries, &[width, heads, t, n], &[q_st[1], q_st[2], t as usize * q_st[2]], run.row * q_st[2]);
        let w_row = self.weights.strides()[1];
        let weights =
            g.view(self.weights, &[heads, t, 1, n], &[w_row, t as usize * w_row, t as usize * w_row], run.row * w_row);
        let keys = step.cache.indexer_view(g, self.layer, first.seq..first.seq + n as usize, attended);
        let scores = g.lightning_indexer(queries, keys, weights, mask); // [attended, t, 1, n]
        let chosen = g.top_k(scores, sparse.top_k.min(attended) as i64); // I32 [kept, t, 1, n]
        let mut choices = step.sparse_choices.borrow_mut();
        choices.retain(|(row, _)| *row != run.row);
        choices.push((run.row, chosen));
        narrowed_to(g, chosen, mask)
    }
}

/// The run's part of the causal mask narrowed to the positions the last layer before this one with an
/// indexer of its own chose for it (GLM-5.2's layers without one). A stage never begins at such a layer
/// ([`crate::model::ModelConfig::may_begin_stage`]), so the choice is in this step's graph.
pub(in crate::engine) fn reused_choice<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    run: &AttentionRun,
    mask: Tensor<'g>,
) -> Tensor<'g> {
    let choices = step.sparse_choices.borrow();
    let chosen = choices
        .iter()
        .find(|(row, _)| *row == run.row)
        .map(|(_, chosen)| *chosen)
        .expect("a layer that reuses a choice follows a layer of its stage that made one");
    narrowed_to(g, chosen, mask)
}

/// `mask` ([attended, tokens, 1, sequences], F16) with every position closed (-∞) but those `chosen`
/// (I32 [kept, tokens, 1, sequences]) for each row, which keep the causal mask's value.
fn narrowed_to<'g>(g: &'g GraphBuilder, chosen: Tensor<'g>, mask: Tensor<'g>) -> Tensor<'g> {
    g.add(only_chosen(g, mask, chosen), mask)
}

/// A tensor shaped and typed as `like` (contiguous, F32 or F16; each row `like.shape()[0]` long),
/// 0 at the indices `chosen` (I32, `kept` per row, the rows as `like`'s) and -∞ elsewhere.
pub(super) fn only_chosen<'g>(g: &'g GraphBuilder, like: Tensor<'g>, chosen: Tensor<'g>) -> Tensor<'g> {
    let shape = like.shape();
    let (len, kept) = (shape[0], chosen.shape()[0]);
    let rows = shape[1..].iter().product::<i64>();
    // Every value closed, then the chosen ones opened (rows of one value each).
    let closed = g.reshape_4d(g.fill(like, f32::NEG_INFINITY), [1, len, rows, 1]);
    let zeros = g.fill(g.reshape_4d(g.cast(chosen, DType::F32), [1, kept, rows, 1]), 0.0);
    let opened = g.set_rows(closed, zeros, g.reshape_4d(chosen, [kept, rows, 1, 1]));
    g.reshape_4d(opened, shape)
}
