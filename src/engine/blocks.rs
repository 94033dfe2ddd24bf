//! The building blocks every architecture's graph is made of, written once: RMS norm, a linear layer
//! with an optional bias, attention over the stage's KV cache, the dense SwiGLU feed-forward and the
//! mixture-of-experts feed-forward (llama.cpp's `build_norm`, `build_attn`, `build_ffn` and
//! `build_moe_ffn`, op for op, so our numbers equal llama.cpp's).

use super::kv_cache::KvCache;
use super::weights::LayerWeights;
use crate::ggml::{DType, GraphBuilder, RopeParams, SetTensorRef, Tensor};
use crate::model::{Gating, ModelConfig, MoeParams};
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

/// What every layer of one step shares: the model's hyper-parameters, the stage's cache and the step's
/// inputs.
pub struct StepContext<'a, 'g> {
    pub config: &'a ModelConfig,
    pub(super) layers: Range<usize>,
    pub(super) cache: &'a KvCache,
    pub(super) shape: GraphShape,
    pub(super) rope_mode: i32,
    pub(super) positions: Tensor<'g>,
    pub(super) cache_rows: Tensor<'g>,
    pub(super) mask: Tensor<'g>,
    pub(super) rope_factors: Option<Tensor<'g>>,
    /// On the model's last layer with several tokens: the row whose logits are wanted.
    pub(super) last_row: Option<Tensor<'g>>,
}

impl<'g> StepContext<'_, 'g> {
    /// Tokens in this step.
    pub fn tokens(&self) -> i64 {
        self.shape.tokens as i64
    }

    /// On the model's last layer only the last token's row is needed further on: drops the others from
    /// the attention output and its residual, as llama.cpp does before the feed-forward.
    pub fn prune_last_layer(
        &self,
        g: &'g GraphBuilder,
        layer: usize,
        h: Tensor<'g>,
        residual: Tensor<'g>,
    ) -> (Tensor<'g>, Tensor<'g>) {
        match self.last_row {
            Some(rows) if layer + 1 == self.config.layers => (g.get_rows(h, rows), g.get_rows(residual, rows)),
            _ => (h, residual),
        }
    }
}

/// RMS norm of `x` times `weight`.
pub fn norm<'g>(g: &'g GraphBuilder, x: Tensor<'g>, weight: &SetTensorRef, eps: f32) -> Tensor<'g> {
    g.mul(g.rms_norm(x, eps), g.stored(weight))
}

/// `weight · x`, plus `bias` when there is one.
pub fn linear<'g>(
    g: &'g GraphBuilder,
    weight: &SetTensorRef,
    bias: Option<&SetTensorRef>,
    x: Tensor<'g>,
) -> Tensor<'g> {
    let y = g.mul_mat(g.stored(weight), x);
    match bias {
        Some(b) => g.add(y, g.stored(b)),
        None => y,
    }
}

/// Self-attention of one layer with the standard tensor names (`attn_q`, `attn_k`, `attn_v` with
/// optional biases, optional per-head `attn_q_norm`/`attn_k_norm`, `attn_output`): projections, RoPE,
/// the cache write, attention over the cached positions and the output projection.
pub fn attention<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    layer: usize,
    w: &LayerWeights,
    x: Tensor<'g>,
) -> Tensor<'g> {
    let c = step.config;
    let (hd, t) = (c.head_dim as i64, step.tokens());
    let local = layer - step.layers.start;
    let mut q = g.reshape_3d(linear(g, w.req("attn_q.weight"), w.get("attn_q.bias"), x), hd, c.heads as i64, t);
    let mut k = g.reshape_3d(linear(g, w.req("attn_k.weight"), w.get("attn_k.bias"), x), hd, c.kv_heads as i64, t);
    let v = g.reshape_3d(linear(g, w.req("attn_v.weight"), w.get("attn_v.bias"), x), hd, c.kv_heads as i64, t);
    if let (Some(qn), Some(kn)) = (w.get("attn_q_norm.weight"), w.get("attn_k_norm.weight")) {
        q = norm(g, q, qn, c.rms_epsilon);
        k = norm(g, k, kn, c.rms_epsilon);
    }
    let rope = RopeParams {
        n_dims: c.rope.dimensions as i32,
        mode: step.rope_mode,
        n_ctx_orig: c.rope.original_context as i32,
        freq_base: c.rope.freq_base,
        freq_scale: c.rope.freq_scale,
        ext_factor: 0.0,
        attn_factor: 1.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
    };
    let q = g.rope(q, step.positions, step.rope_factors, &rope);
    let k = g.rope(k, step.positions, step.rope_factors, &rope);

    let width = c.kv_width() as i64;
    let k_rows = g.view(k, &[width, t], &[k.strides()[2]], 0);
    let v_rows = g.view(v, &[width, t], &[v.strides()[2]], 0);
    step.cache.store(g, local, k_rows, v_rows, step.cache_rows);
    let (k_all, v_all) = step.cache.view(g, local, step.shape.seq, step.shape.attended, c.head_dim);

    let q = g.permute(q, [0, 2, 1, 3]);
    let k_all = g.permute(k_all, [0, 2, 1, 3]);
    let v_all = g.permute(v_all, [0, 2, 1, 3]);
    let attended = g.flash_attention(q, k_all, v_all, step.mask, c.attention_scale);
    let merged = g.reshape_2d(attended, hd * c.heads as i64, t);
    linear(g, w.req("attn_output.weight"), w.get("attn_output.bias"), merged)
}

/// The dense SwiGLU feed-forward `down(silu(gate·x) ⊙ up·x)` over the tensors `ffn_{gate,up,down}` +
/// `suffix` (`""` for a dense layer's own, `"_shexp"` for a shared expert).
pub fn feed_forward<'g>(g: &'g GraphBuilder, w: &LayerWeights, suffix: &str, x: Tensor<'g>) -> Tensor<'g> {
    let gate = g.mul_mat(g.stored(w.req(&format!("ffn_gate{suffix}.weight"))), x);
    let up = g.mul_mat(g.stored(w.req(&format!("ffn_up{suffix}.weight"))), x);
    g.mul_mat(g.stored(w.req(&format!("ffn_down{suffix}.weight"))), g.swiglu(gate, up))
}

/// The mixture-of-experts feed-forward over `ffn_gate_inp` (the router) and the 3-D expert tensors
/// `ffn_{gate,up,down}_exps`: route each token to its top `experts_used` experts, run only those
/// experts' rows (`mul_mat_id`), and sum their outputs by weight. `exp_probs_b`, when the layer has it,
/// biases the choice of experts but not their weights (DeepSeek V3, GLM-4.5).
pub fn moe_feed_forward<'g>(g: &'g GraphBuilder, w: &LayerWeights, p: &MoeParams, x: Tensor<'g>) -> Tensor<'g> {
    let [n_embd, tokens, ..] = x.shape();
    let (n_expert, n_used) = (p.experts as i64, p.experts_used as i64);
    let logits = g.mul_mat(g.stored(w.req("ffn_gate_inp.weight")), x); // [experts, tokens]
    let probs = match p.gating {
        Gating::Softmax => g.soft_max(logits),
        Gating::Sigmoid => g.sigmoid(logits),
    };
    let selection = match w.get("exp_probs_b.bias") {
        Some(bias) => g.add(probs, g.stored(bias)),
        None => probs,
    };
    let selected = g.argsort_top_k(selection, n_used); // I32 [used, tokens]
    let mut weights = g.get_rows(g.reshape_3d(probs, 1, n_expert, tokens), selected); // [1, used, tokens]
    if p.normalize {
        let flat = g.reshape_2d(weights, n_used, tokens);
        // llama.cpp clamps the sum to F16's smallest normal number against a division by zero.
        let sum = g.clamp(g.sum_rows(flat), 6.103_515_6e-5, f32::INFINITY);
        weights = g.reshape_3d(g.div(flat, sum), 1, n_used, tokens);
    }
    if p.scale != 0.0 && p.scale != 1.0 {
        weights = g.scale(weights, p.scale);
    }
    g.expand(weights);

    let x = g.reshape_3d(x, n_embd, 1, tokens);
    let up = g.mul_mat_id(g.stored(w.req("ffn_up_exps.weight")), x, selected); // [ff, used, tokens]
    let gate = g.mul_mat_id(g.stored(w.req("ffn_gate_exps.weight")), x, selected);
    let h = g.swiglu(gate, up);
    let experts = g.mul_mat_id(g.stored(w.req("ffn_down_exps.weight")), h, selected); // [embd, used, tokens]
    let experts = g.mul(experts, weights);
    g.expand(experts);

    // Views of each chosen slot first, then the sum, in llama.cpp's order.
    let slots: Vec<Tensor<'g>> = (0..n_used as usize)
        .map(|i| {
            let s = experts.strides();
            let view = g.view(experts, &[n_embd, tokens], &[s[2]], i * s[1]);
            g.expand(view);
            view
        })
        .collect();
    let mut out = slots[0];
    for &slot in &slots[1..] {
        out = g.add(out, slot);
        g.expand(out);
    }
    out
}

/// The input of the first layer: token embeddings on the first stage, hidden states elsewhere.
pub(super) fn stage_input<'g>(
    g: &'g GraphBuilder,
    embedding: Option<&SetTensorRef>,
    width: usize,
    tokens: i64,
) -> Tensor<'g> {
    match embedding {
        Some(table) => {
            let ids = g.input(input::TOKENS, DType::I32, &[tokens]);
            g.get_rows(g.stored(table), ids)
        }
        None => g.input(input::HIDDEN, DType::F32, &[width as i64, tokens]),
    }
}
