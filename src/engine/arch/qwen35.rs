//! Qwen3.5 / 3.6's layer (`qwen35`, `qwen35moe`; declared in [`crate::model::arch::Qwen35`]), as
//! llama.cpp's `src/models/qwen35.cpp` and `qwen35moe.cpp` compute it: the gated delta-net
//! ([`blocks::gated_delta_net`]) or gated full attention, then a dense feed-forward or routed experts
//! plus a sigmoid-gated shared expert, each behind an RMS norm and a residual.

use super::{Bound, Graph};
use crate::engine::blocks::{self, attend, linear, norm, CachedKeys, StepContext};
use crate::ggml::{GraphBuilder, RopeParams, SetTensorRef, Tensor};
use crate::model::arch::{GatedAttention, GatedSharedExperts, Qwen35, Qwen35FeedForward, Qwen35Mixer};
use crate::model::MoeParams;

impl Graph for Qwen35 {
    fn layer<'g>(
        &self,
        g: &'g GraphBuilder,
        step: &StepContext<'_, 'g>,
        layer: usize,
        w: &Bound<Self>,
        x: Tensor<'g>,
    ) -> Tensor<'g> {
        let c = step.config;
        let normed = norm(g, x, &w.attn_norm, c.rms_epsilon);
        let h = match &w.mixer {
            Qwen35Mixer::Linear(net) => blocks::gated_delta_net(g, step, layer, net, normed),
            Qwen35Mixer::Full(attention) => gated_attention(g, step, layer, attention, normed),
        };
        let (h, residual) = step.prune_last_layer(g, layer, h, x);
        let ffn_in = g.add(h, residual);
        let h = norm(g, ffn_in, &w.post_attention_norm, c.rms_epsilon);
        let out = match (&w.feed_forward, &c.moe) {
            (Qwen35FeedForward::Experts(experts), Some(moe)) => gated_shared_experts(g, step, experts, moe, h),
            (Qwen35FeedForward::Dense(ffn), _) => blocks::feed_forward(g, step, ffn.matrices(), h),
            (Qwen35FeedForward::Experts(_), None) => {
                unreachable!("experts are declared only with their parameters")
            }
        };
        g.add(out, ffn_in)
    }
}

/// Routed experts plus the shared expert scaled by σ(`ffn_gate_inp_shexp` · x).
pub(super) fn gated_shared_experts<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    experts: &GatedSharedExperts<SetTensorRef>,
    moe: &MoeParams,
    h: Tensor<'g>,
) -> Tensor<'g> {
    let routed = blocks::moe_feed_forward(g, step, &experts.routed, moe, h);
    let shared = blocks::feed_forward(g, step, experts.shared.matrices(), h);
    let gate = g.sigmoid(g.mul_mat(g.stored(&experts.shared_gate), h));
    g.add(routed, g.mul(shared, gate))
}

/// Qwen3.5's (and Qwen3-Next's) full attention: queries and an output gate from one projection (per
/// head: its queries, then its gate), per-head RMS norms of Q and K, interleaved M-RoPE (Qwen3-Next:
/// NeoX RoPE), attention over the KV cache, the result scaled by σ(gate) before the output projection.
pub(super) fn gated_attention<'g>(
    g: &'g GraphBuilder,
    step: &StepContext<'_, 'g>,
    layer: usize,
    w: &GatedAttention<SetTensorRef>,
    x: Tensor<'g>,
) -> Tensor<'g> {
    let c = step.config;
    let (hd, t) = (c.head_dim as i64, step.tokens());
    let (heads, kv_heads) = (step.heads() as i64, step.kv_heads() as i64);
    let both = g.reshape_3d(linear(g, &w.q_and_gate, None, x), 2 * hd, heads, t);
    let half = |offset: usize| g.view(both, &[hd, heads, t], &[both.strides()[1], both.strides()[2]], offset);
    let q = norm(g, half(0), &w.q_norm, c.rms_epsilon);
    let gate = g.reshape_2d(g.cont(half(hd as usize * 4)), hd * heads, t);
    let k = g.reshape_3d(linear(g, &w.k, None, x), hd, kv_heads, t);
    let k = norm(g, k, &w.k_norm, c.rms_epsilon);
    let v = g.reshape_3d(linear(g, &w.v, None, x), hd, kv_heads, t);
    let rope = RopeParams {
        n_dims: c.rope.dimensions as i32,
        mode: step.rope_mode,
        n_ctx_orig: c.rope.original_context as i32,
        freq_base: c.rope.freq_base,
        freq_scale: c.rope.freq_scale,
        ext_factor: c.rope.ext_factor,
        attn_factor: c.rope.attn_factor,
        beta_fast: c.rope.beta_fast,
        beta_slow: c.rope.beta_slow,
    };
    // Qwen3.5's interleaved M-RoPE by sections, or (Qwen3-Next) plain RoPE on part of each head.
    let (q, k) = match c.rope_sections {
        Some(sections) => {
            let positions = step.position_sections.expect("a stage with full-attention layers has their positions");
            (g.rope_multi(q, positions, sections, &rope), g.rope_multi(k, positions, sections, &rope))
        }
        None => (g.rope(q, step.positions, None, &rope), g.rope(k, step.positions, None, &rope)),
    };
    let (q, k, v) = step.rotated_for_cache(g, q, k, v);
    let width = kv_heads * hd;
    let k_rows = g.view(k, &[width, t], &[k.strides()[2]], 0);
    let v_rows = g.view(v, &[width, t], &[v.strides()[2]], 0);
    let rows = step.cache_rows.expect("a stage with full-attention layers has their cache rows");
    let local = layer - step.layers.start;
    step.cache.store(g, local, k_rows, Some(v_rows), rows);
    let keys = CachedKeys { layer: local, key_head: c.head_dim, value_head: c.head_dim, sliding: false };
    let attended = step.unrotated_values(g, attend(g, step, q, keys, c.attention_scale, None));
    let attended = g.reshape_2d(attended, hd * heads, t);
    let gated = g.mul(attended, g.sigmoid(gate));
    step.complete(g, g.mul_mat(g.stored(&w.output), gated))
}
