//! The llama-family forward pass over a range of layers, as a ggml graph. It mirrors llama.cpp's
//! `src/models/llama.cpp` (and its Qwen 2/3 variants) op for op, so split and unsplit runs and llama.cpp
//! itself compute the same numbers.

use super::kv_cache::KvCache;
use super::weights::{LayerWeights, StageWeights};
use crate::ggml::{DType, Graph, GraphBuilder, RopeParams, Tensor};
use crate::model::ModelConfig;
use std::ops::Range;

/// Graph inputs, set before every compute.
pub(super) mod input {
    pub const TOKENS: &str = "tokens";
    pub const HIDDEN: &str = "hidden";
    pub const POSITIONS: &str = "positions";
    pub const CACHE_ROWS: &str = "cache_rows";
    pub const MASK: &str = "mask";
    pub const LAST_ROW: &str = "last_row";
}

/// Everything that fixes a graph's shape. Two steps with equal shapes run the same graph with new inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct GraphShape {
    pub tokens: usize,
    /// Cache rows attended (a whole number of cache blocks).
    pub attended: usize,
    pub seq: usize,
}

/// The parts of a stage a graph is built from.
pub(super) struct StageParts<'a> {
    pub config: &'a ModelConfig,
    pub layers: Range<usize>,
    pub weights: &'a StageWeights,
    pub cache: &'a KvCache,
}

/// Tensors per layer is about 40; this leaves room.
const TENSORS_PER_LAYER: usize = 64;

pub(super) fn build(parts: &StageParts<'_>, shape: GraphShape) -> Graph {
    let n_layers = parts.layers.len();
    let g = GraphBuilder::new(TENSORS_PER_LAYER * n_layers + 64);
    let out = forward(&g, parts, shape);
    let out = g.output(out);
    g.finish(out)
}

fn forward<'g>(g: &'g GraphBuilder, p: &StageParts<'_>, shape: GraphShape) -> Tensor<'g> {
    let c = p.config;
    let t = shape.tokens as i64;
    let mut x = match &p.weights.embedding {
        Some(table) => {
            let ids = g.input(input::TOKENS, DType::I32, &[t]);
            g.get_rows(g.stored(table), ids)
        }
        None => g.input(input::HIDDEN, DType::F32, &[c.embedding as i64, t]),
    };
    let positions = g.input(input::POSITIONS, DType::I32, &[t]);
    let cache_rows = g.input(input::CACHE_ROWS, DType::I64, &[t]);
    let mask = g.input(input::MASK, DType::F16, &[shape.attended as i64, t]);
    let rope_factors = p.weights.rope_factors.as_ref().map(|f| g.stored(f));
    let is_last = p.weights.output.is_some();
    // Only the last token's logits are needed, so the last layer of the model drops the other rows early.
    let last_row = (is_last && t > 1).then(|| g.input(input::LAST_ROW, DType::I32, &[1]));

    for (i, layer) in p.layers.clone().enumerate() {
        let w = &p.weights.layers[i];
        let residual = x;
        let h = norm(g, x, &w.attn_norm, c.rms_epsilon);
        let mut h = attention(g, p, layer, w, h, positions, cache_rows, mask, rope_factors, shape);
        let mut residual = residual;
        if let (true, Some(rows)) = (layer + 1 == c.layers, last_row) {
            h = g.get_rows(h, rows);
            residual = g.get_rows(residual, rows);
        }
        let ffn_in = g.add(h, residual);
        let h = norm(g, ffn_in, &w.ffn_norm, c.rms_epsilon);
        let gate = g.mul_mat(g.stored(&w.ffn_gate), h);
        let up = g.mul_mat(g.stored(&w.ffn_up), h);
        let h = g.mul_mat(g.stored(&w.ffn_down), g.swiglu(gate, up));
        x = g.add(h, ffn_in);
    }

    match (&p.weights.output_norm, &p.weights.output) {
        (Some(norm_weight), Some(head)) => {
            let h = norm(g, x, norm_weight, c.rms_epsilon);
            g.mul_mat(g.stored(head), h)
        }
        _ => x,
    }
}

fn norm<'g>(g: &'g GraphBuilder, x: Tensor<'g>, weight: &crate::ggml::SetTensorRef, eps: f32) -> Tensor<'g> {
    g.mul(g.rms_norm(x, eps), g.stored(weight))
}

fn linear<'g>(
    g: &'g GraphBuilder,
    weight: &crate::ggml::SetTensorRef,
    bias: Option<&crate::ggml::SetTensorRef>,
    x: Tensor<'g>,
) -> Tensor<'g> {
    let y = g.mul_mat(g.stored(weight), x);
    match bias {
        Some(b) => g.add(y, g.stored(b)),
        None => y,
    }
}

#[allow(clippy::too_many_arguments)]
fn attention<'g>(
    g: &'g GraphBuilder,
    p: &StageParts<'_>,
    layer: usize,
    w: &LayerWeights,
    x: Tensor<'g>,
    positions: Tensor<'g>,
    cache_rows: Tensor<'g>,
    mask: Tensor<'g>,
    rope_factors: Option<Tensor<'g>>,
    shape: GraphShape,
) -> Tensor<'g> {
    let c = p.config;
    let (hd, t) = (c.head_dim as i64, shape.tokens as i64);
    let local = layer - p.layers.start;
    let mut q = g.reshape_3d(linear(g, &w.q, w.q_bias.as_ref(), x), hd, c.heads as i64, t);
    let mut k = g.reshape_3d(linear(g, &w.k, w.k_bias.as_ref(), x), hd, c.kv_heads as i64, t);
    let v = g.reshape_3d(linear(g, &w.v, w.v_bias.as_ref(), x), hd, c.kv_heads as i64, t);
    if let (Some(qn), Some(kn)) = (&w.q_norm, &w.k_norm) {
        q = norm(g, q, qn, c.rms_epsilon);
        k = norm(g, k, kn, c.rms_epsilon);
    }
    let rope = RopeParams {
        n_dims: c.rope.dimensions as i32,
        mode: c.architecture.rope_mode(),
        n_ctx_orig: c.rope.original_context as i32,
        freq_base: c.rope.freq_base,
        freq_scale: c.rope.freq_scale,
        ext_factor: 0.0,
        attn_factor: 1.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
    };
    let q = g.rope(q, positions, rope_factors, &rope);
    let k = g.rope(k, positions, rope_factors, &rope);

    let width = c.kv_width() as i64;
    let k_rows = g.view(k, &[width, t], &[k.strides()[2]], 0);
    let v_rows = g.view(v, &[width, t], &[v.strides()[2]], 0);
    p.cache.store(g, local, k_rows, v_rows, cache_rows);
    let (k_all, v_all) = p.cache.view(g, local, shape.seq, shape.attended, c.head_dim);

    let q = g.permute(q, [0, 2, 1, 3]);
    let k_all = g.permute(k_all, [0, 2, 1, 3]);
    let v_all = g.permute(v_all, [0, 2, 1, 3]);
    let attended = g.flash_attention(q, k_all, v_all, mask, c.attention_scale);
    let merged = g.reshape_2d(attended, hd * c.heads as i64, t);
    linear(g, &w.attn_output, w.attn_output_bias.as_ref(), merged)
}
